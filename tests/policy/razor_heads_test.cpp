// RazorAttention (policy/razor.h): the retrieval-head list file, the probe,
// and echo/induction scores from token equality (not position arithmetic)
// on synthetic probability rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/policy/razor.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on

// ---- head-list file ---------------------------------------------------------------------

class RazorHeadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("longctx_razor_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "heads.txt").string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The message of the Error load_retrieval_heads throws ("" when none).
  std::string load_error(const std::string& text, ErrorCode* code = nullptr) {
    try {
      load_retrieval_heads(write(text), 4, 8);
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
};

TEST_F(RazorHeadFile, ParsesCommentsBlanksAndCrlf) {
  const RetrievalHeads heads = load_retrieval_heads(write("# header\n\n0 0\n  3\t7  # tail\r\n2 5\r\n\n#1 1\n1 2"), 4, 8);
  RetrievalHeads expected(4, 8);
  expected.set(0, 0, true);
  expected.set(3, 7, true);
  expected.set(2, 5, true);
  expected.set(1, 2, true);
  EXPECT_EQ(heads, expected);
  EXPECT_EQ(heads.count(), 4);
  EXPECT_EQ(load_retrieval_heads(write(""), 4, 8), RetrievalHeads(4, 8));
  EXPECT_EQ(load_retrieval_heads("", 4, 8), RetrievalHeads::all(4, 8));
  EXPECT_EQ(RetrievalHeads::all(4, 8).count(), 32);
}

TEST_F(RazorHeadFile, ErrorsNameFileAndLine) {
  struct Bad {
    std::string text, fragment;
  };
  const std::vector<Bad> cases = {
      {"0 0\n4 0\n", ":2: layer 4 out of range [0, 4)"},
      {"0 8\n", ":1: kv_head 8 out of range [0, 8)"},
      {"# c\n-1 0\n", ":2: layer -1 out of range"},
      {"0 0 0\n", ":1: expected '<layer> <kv_head>', got 3 fields"},
      {"\n\n3\n", ":3: expected '<layer> <kv_head>', got 1 fields"},
      {"0 x\n", ":1: kv_head 'x' is not a decimal integer"},
      {"1.5 0\n", ":1: layer '1.5' is not a decimal integer"},
      {"0 99999999999999999999999\n", ":1: kv_head 99999999999999999999999 out of range"},
      {"1 1\n2 2\n1 1\n", ":3: layer 1 kv_head 1 is listed twice"},
  };
  for (const Bad& bad : cases) {
    ErrorCode code = ErrorCode::kInternal;
    const std::string message = load_error(bad.text, &code);
    EXPECT_NE(message.find("heads.txt" + bad.fragment), std::string::npos) << bad.text << " -> " << message;
    EXPECT_EQ(code, ErrorCode::kConfig) << message;
  }
  try {
    load_retrieval_heads((dir_ / "missing.txt").string(), 4, 8);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
}

TEST_F(RazorHeadFile, SaveLoadRoundTrip) {
  std::mt19937 rng(test_seed(5));
  for (int trial = 0; trial < 20; ++trial) {
    const int n_layers = 1 + int(rng() % 6), n_kv = 1 + int(rng() % 9);
    RetrievalHeads heads(n_layers, n_kv);
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < n_kv; ++h) heads.set(l, h, rng() % 3 == 0);
    const std::string path = (dir_ / "saved.txt").string();
    save_retrieval_heads(path, heads, trial % 2 ? "probe: seed 1\nmodel: test" : "");
    EXPECT_EQ(load_retrieval_heads(path, n_layers, n_kv), heads);
  }
}

TEST(RazorHeadFileExample, ParsesForItsModelShape) {
  const std::string path = std::string(LONGCTX_SOURCE_DIR) + "/configs/retrieval_heads.example.txt";
  const RetrievalHeads heads = load_retrieval_heads(path, 32, 8);
  EXPECT_EQ(heads.count(), 10);
  EXPECT_TRUE(heads.is_retrieval(15, 7));
  EXPECT_THROW(load_retrieval_heads(path, 16, 8), Error);
}

// ---- probe ------------------------------------------------------------------------------

TEST(RazorProbe, RepeatedDistinctTokens) {
  const Probe p = make_probe_tokens(50, 4, 60, 123, 1);
  ASSERT_EQ(p.tokens.size(), size_t(1 + 50 * 4));
  EXPECT_EQ(p.tokens[0], 1);
  EXPECT_EQ(p.first, 1);
  EXPECT_EQ(p.period, 50);
  EXPECT_EQ(p.repeats, 4);
  const std::set<int32_t> ids(p.tokens.begin() + 1, p.tokens.begin() + 51);
  EXPECT_EQ(ids.size(), 50u);
  EXPECT_EQ(ids.count(1), 0u);
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 60);
  for (size_t i = 51; i < p.tokens.size(); ++i) EXPECT_EQ(p.tokens[i], p.tokens[i - 50]);
  EXPECT_EQ(make_probe_tokens(50, 4, 60, 123, 1).tokens, p.tokens);
  EXPECT_NE(make_probe_tokens(50, 4, 60, 124, 1).tokens, p.tokens);
  // Exactly as many ids as the vocabulary has besides BOS; no BOS.
  EXPECT_NO_THROW(make_probe_tokens(59, 2, 60, 1, 0));
  const Probe no_bos = make_probe_tokens(10, 2, 100, 1, -1);
  EXPECT_EQ(no_bos.first, 0);
  EXPECT_EQ(no_bos.tokens.size(), 20u);
  EXPECT_THROW(make_probe_tokens(60, 2, 60, 1, 0), Error);
  EXPECT_THROW(make_probe_tokens(0, 2, 60, 1, 0), Error);
  EXPECT_THROW(make_probe_tokens(10, 1, 60, 1, 0), Error);
}

// ---- search -----------------------------------------------------------------------------

// Echo and induction of a row by token equality: keys m < i holding the
// query's token (m >= first, so not the BOS) for echo, keys m + 1 for induction.
struct RowScores {
  double echo = 0, induction = 0;
  bool scored = false;
};

RowScores reference_row(const Probe& p, int64_t i, const std::vector<float>& row) {
  RowScores s;
  for (int64_t m = p.first; m < i; ++m) {
    if (p.tokens[size_t(m)] != p.tokens[size_t(i)]) continue;
    s.scored = true;
    s.echo += row[size_t(m)];
    s.induction += row[size_t(m + 1)];
  }
  return s;
}

// A causal probability row of query i: random positive weights, normalized;
// kind 1 puts all mass on the previous copy (echo head), kind 2 on the token
// after it (induction head), kind 3 on the BOS / first token (sink head).
std::vector<float> probability_row(const Probe& p, int64_t i, int kind, std::mt19937& rng) {
  std::vector<float> row(size_t(i + 1), 0.f);
  if (kind != 0 && i >= p.first + p.period) {
    const int64_t target = kind == 1 ? i - p.period : kind == 2 ? i - p.period + 1 : 0;
    row[size_t(target)] = 1.f;
    return row;
  }
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  float sum = 0;
  for (float& x : row) sum += (x = uniform(rng));
  for (float& x : row) x /= sum;
  return row;
}

TEST(RazorSearch, ScoresMatchTokenEqualityReference) {
  std::mt19937 rng(test_seed(77));
  for (int trial = 0; trial < 10; ++trial) {
    const int n_random = 3 + int(rng() % 8), repeats = 2 + int(rng() % 3);
    const Probe p = make_probe_tokens(n_random, repeats, 1000, uint64_t(trial), trial % 2 ? 0 : -1);
    const int n_layers = 2, n_kv = 2, g = 1 + int(rng() % 3);
    RetrievalHeadSearch search(n_layers, n_kv * g, n_kv, p);
    const int64_t t_len = int64_t(p.tokens.size());
    std::vector<double> echo(size_t(n_layers * n_kv * g)), induction(echo.size());
    std::vector<int64_t> rows(echo.size());
    for (int l = 0; l < n_layers; ++l)
      for (int qh = 0; qh < n_kv * g; ++qh) {
        const size_t k = size_t(l * n_kv * g + qh);
        const int kind = int(rng() % 4);
        for (int64_t i = 0; i < t_len; ++i) {
          const std::vector<float> row = probability_row(p, i, kind, rng);
          search.accumulate_row(l, qh, i, row.data());
          const RowScores r = reference_row(p, i, row);
          if (!r.scored) continue;
          echo[k] += r.echo, induction[k] += r.induction, ++rows[k];
        }
      }
    const HeadScores scores = search.kv_head_scores();
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < n_kv; ++h) {
        double echo_max = -1, induction_max = -1;
        for (int qh = h * g; qh < (h + 1) * g; ++qh) {
          const size_t k = size_t(l * n_kv * g + qh);
          ASSERT_EQ(search.scoring_rows(l, qh), rows[k]);
          ASSERT_EQ(rows[k], t_len - p.first - p.period);
          // Sums of at most `repeats` f32 probabilities in fp64, in another order.
          EXPECT_NEAR(search.echo_score(l, qh), echo[k] / double(rows[k]), 1e-12);
          EXPECT_NEAR(search.induction_score(l, qh), induction[k] / double(rows[k]), 1e-12);
          echo_max = std::max(echo_max, echo[k] / double(rows[k]));
          induction_max = std::max(induction_max, induction[k] / double(rows[k]));
        }
        EXPECT_NEAR(scores.echo[size_t(l * n_kv + h)], echo_max, 1e-12);
        EXPECT_NEAR(scores.induction[size_t(l * n_kv + h)], induction_max, 1e-12);
      }
  }
}

// Pure heads score 1 on their kind, and the group's max carries a pure head
// sharing its kv head with noise.
TEST(RazorSearch, EchoInductionHeadsAndGqaMax) {
  const Probe p = make_probe_tokens(20, 4, 500, 9, 0);
  const int64_t t_len = int64_t(p.tokens.size());
  RetrievalHeadSearch search(1, 6, 3, p);  // g = 2
  std::mt19937 rng(test_seed(1));
  const int kinds[6] = {1, 0, 0, 2, 3, 0};  // kv 0: echo + noise; kv 1: noise + induction; kv 2: sink + noise
  std::vector<float> matrix(size_t(t_len * t_len), 0.f);
  for (int qh = 0; qh < 6; ++qh) {
    for (int64_t i = 0; i < t_len; ++i) {
      const std::vector<float> row = probability_row(p, i, kinds[qh], rng);
      std::copy(row.begin(), row.end(), matrix.begin() + i * t_len);
      std::fill(matrix.begin() + i * t_len + i + 1, matrix.begin() + (i + 1) * t_len, 99.f);  // ignored
    }
    search.accumulate_matrix(0, qh, matrix.data());
  }
  EXPECT_DOUBLE_EQ(search.echo_score(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(search.induction_score(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(search.echo_score(0, 3), 0.0);
  EXPECT_DOUBLE_EQ(search.induction_score(0, 3), 1.0);
  EXPECT_DOUBLE_EQ(search.echo_score(0, 4), 0.0);
  const HeadScores s = search.kv_head_scores();
  EXPECT_DOUBLE_EQ(s.echo[0], 1.0);
  EXPECT_DOUBLE_EQ(s.induction[1], 1.0);
  EXPECT_LT(s.echo[2], 0.5);
  EXPECT_LT(s.induction[2], 0.5);
  const RetrievalHeads heads = select_retrieval_heads(s, 0.34, 0.34);  // one each
  EXPECT_TRUE(heads.is_retrieval(0, 0));
  EXPECT_TRUE(heads.is_retrieval(0, 1));
  EXPECT_FALSE(heads.is_retrieval(0, 2));
}

TEST(RazorSearch, RejectsBadRows) {
  const Probe p = make_probe_tokens(5, 2, 100, 1, 0);
  RetrievalHeadSearch search(1, 2, 1, p);
  std::vector<float> row(p.tokens.size(), 0.1f);
  EXPECT_THROW(search.accumulate_row(1, 0, 7, row.data()), Error);
  EXPECT_THROW(search.accumulate_row(0, 2, 7, row.data()), Error);
  EXPECT_THROW(search.accumulate_row(0, 0, int64_t(p.tokens.size()), row.data()), Error);
  EXPECT_THROW(search.kv_head_scores(), Error);  // no scoring row yet
  search.accumulate_row(0, 0, 7, row.data());
  EXPECT_THROW(search.accumulate_row(0, 0, 7, row.data()), Error);
  search.accumulate_row(0, 0, 2, row.data());  // no earlier copy: ignored
  search.accumulate_row(0, 0, 2, row.data());
  EXPECT_EQ(search.scoring_rows(0, 0), 1);
  row[2] = std::numeric_limits<float>::quiet_NaN();  // the copy of row 7
  EXPECT_THROW(search.accumulate_row(0, 1, 7, row.data()), Error);
  EXPECT_EQ(search.scoring_rows(0, 1), 0);
  EXPECT_THROW(search.kv_head_scores(), Error);  // query head 1 has no row
  EXPECT_THROW(RetrievalHeadSearch(1, 3, 2, p), Error);
}

// Reference selection: sort every head by score (stable), take the counts.
std::set<std::pair<int, int>> reference_select(const HeadScores& s, int64_t n_induction, int64_t n_echo) {
  std::set<std::pair<int, int>> chosen;
  for (const auto* scores : {&s.induction, &s.echo}) {
    std::vector<std::pair<double, int>> order;  // (-score, index): ascending = best first, ties low index
    for (size_t i = 0; i < scores->size(); ++i) order.push_back({-(*scores)[i], int(i)});
    std::sort(order.begin(), order.end());
    const int64_t count = scores == &s.induction ? n_induction : n_echo;
    for (int64_t j = 0; j < count; ++j)
      chosen.insert({order[size_t(j)].second / s.n_kv_heads, order[size_t(j)].second % s.n_kv_heads});
  }
  return chosen;
}

std::set<std::pair<int, int>> as_set(const RetrievalHeads& heads) {
  std::set<std::pair<int, int>> s;
  for (int l = 0; l < heads.n_layers(); ++l)
    for (int h = 0; h < heads.n_kv_heads(); ++h)
      if (heads.is_retrieval(l, h)) s.insert({l, h});
  return s;
}

TEST(RazorSearch, TopFractionsUnion) {
  std::mt19937 rng(test_seed(31));
  for (int trial = 0; trial < 30; ++trial) {
    HeadScores s;
    s.n_layers = 1 + int(rng() % 32);
    s.n_kv_heads = 1 + int(rng() % 8);
    const size_t n = size_t(s.n_layers * s.n_kv_heads);
    for (size_t i = 0; i < n; ++i) {
      // Coarse values so that ties occur.
      s.echo.push_back(double(rng() % 7) / 7);
      s.induction.push_back(double(rng() % 7) / 7);
    }
    // round(0.14 n), round(0.01 n), halves up, at least 1: computed by hand.
    const int64_t n_ind = std::max<int64_t>(1, (int64_t(n) * 14 + 50) / 100);
    const int64_t n_echo = std::max<int64_t>(1, (int64_t(n) + 50) / 100);
    EXPECT_EQ(as_set(select_retrieval_heads(s)), reference_select(s, n_ind, n_echo)) << "n " << n;
    EXPECT_EQ(select_retrieval_heads(s, 0, 0).count(), 0);
    EXPECT_EQ(select_retrieval_heads(s, 1, 0).count(), int64_t(n));
  }
  // 256 heads (32 layers x 8): 36 by induction, 3 by echo.
  HeadScores s{32, 8, std::vector<double>(256), std::vector<double>(256)};
  for (size_t i = 0; i < 256; ++i) s.induction[i] = double(i), s.echo[i] = double(i);  // same order: union = 36
  EXPECT_EQ(select_retrieval_heads(s).count(), 36);
  for (size_t i = 0; i < 256; ++i) s.echo[i] = -double(i);  // disjoint: 36 + 3
  EXPECT_EQ(select_retrieval_heads(s).count(), 39);
  EXPECT_THROW(select_retrieval_heads(s, 1.5, 0.01), Error);
  EXPECT_THROW(select_retrieval_heads(s, 0.14, -0.1), Error);
  s.echo.pop_back();
  EXPECT_THROW(select_retrieval_heads(s), Error);
}

// Search -> selection -> file -> load gives the same heads.
TEST_F(RazorHeadFile, SearchResultRoundTrip) {
  const Probe p = make_probe_tokens(6, 3, 50, 4, 0);
  RetrievalHeadSearch search(3, 4, 2, p);
  std::mt19937 rng(test_seed(6));
  for (int l = 0; l < 3; ++l)
    for (int qh = 0; qh < 4; ++qh)
      for (int64_t i = 0; i < int64_t(p.tokens.size()); ++i) {
        const std::vector<float> row = probability_row(p, i, int(rng() % 4), rng);
        search.accumulate_row(l, qh, i, row.data());
      }
  const RetrievalHeads heads = select_retrieval_heads(search.kv_head_scores());
  const std::string path = (dir_ / "found.txt").string();
  save_retrieval_heads(path, heads, "probe 6 x 3, seed 4");
  EXPECT_EQ(load_retrieval_heads(path, 3, 2), heads);
  EXPECT_GE(heads.count(), 1);
}

}  // namespace
}  // namespace longctx::policy
