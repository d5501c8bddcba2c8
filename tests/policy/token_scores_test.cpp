// The token scores behind rerank_tokens and fixed_part_logsums
// (policy/src/token_scores.h): a block's q.k for a kv head's group, and the
// sum of exponentials, against fp64 on every Highway target this CPU runs.
#include "../../policy/src/token_scores.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hwy/targets.h"
#include "hwy_target.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"
#include "test_seed.h"

namespace longctx::policy::detail {
namespace {

const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

// Transposed keys of n tokens, kt[c * ld + i], and q rows of a group,
// against fp64: the sum of the group's products (kSum) or their largest
// (kMax), within head_dim + group + 2 roundings of sum |q k|. Token counts
// around whole vectors of every target, head_dim 64/128/256, groups 1-8.
TEST(TokenScores, MatchFp64OnEveryTarget) {
  std::mt19937 rng(test_seed(41));
  std::normal_distribution<float> normal;
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const longctx::testing::ForcedHighwayTarget forced(target);
    for (const int d : {64, 128, 256}) {
      for (const int n : {1, 5, 15, 16, 17, 31, 32, 33, 100, 128}) {
        for (const int group : {1, 3, 8}) {
          for (const Reduce reduce : {Reduce::kSum, Reduce::kMax}) {
            SCOPED_TRACE(str_cat("d ", d, ", n ", n, ", group ", group, ", ", reduce_name(reduce)));
            std::vector<float> q(size_t(2 * group * d));  // two kv heads' groups: kv head 1 is scored
            for (float& x : q) x = normal(rng);
            const TensorView qv = make_view(q.data(), DType::kF32, {2 * group, d});
            const GroupQuery gq = group_query(qv, 1, group, reduce);
            ASSERT_EQ(gq.n_rows, reduce == Reduce::kSum ? 1 : group);
            const int ld = padded_tokens(n) + (n % 2 == 0 ? kTokenPad : 0);  // a block's rows past n too
            const float scale = n % 3 == 0 ? 1.f : 0.125f;
            std::vector<float> kt(size_t(d) * size_t(ld), NAN);  // padding: its lanes score, unused
            for (int c = 0; c < d; ++c)
              for (int i = 0; i < n; ++i) kt[size_t(c * ld + i)] = normal(rng);
            std::vector<float> out(static_cast<size_t>(padded_tokens(n)));
            score_tokens_t(gq.rows.data(), gq.n_rows, gq.d, kt.data(), size_t(ld), n, scale, out.data());
            for (int i = 0; i < n; ++i) {
              double sum = 0.0, best = -INFINITY, terms = 0.0;
              for (int g = 0; g < group; ++g) {
                double dot = 0.0;
                for (int c = 0; c < d; ++c) {
                  const double p = double(q[size_t((group + g) * d + c)]) * kt[size_t(c * ld + i)];
                  dot += p;
                  terms += std::abs(p);
                }
                sum += dot;
                best = std::max(best, dot);
              }
              const double want = scale * (reduce == Reduce::kSum ? sum : best);
              ASSERT_NEAR(out[size_t(i)], want, scale * double(d + group + 3) * kU * terms) << "token " << i;
            }
          }
        }
      }
    }
  }
}

// A block page's keys of one kv head in `type` (K^T rows of kBlock; q8_0:
// codes in quads of channels and f16 scales per 32 channels), random, and
// the same keys as read_keys_t gives them, widened or dequantized to f32.
struct TestPage {
  static constexpr int kBlock = 128;
  std::vector<std::byte> keys;
  std::vector<uint16_t> scales;
  std::vector<float> wide;  // [d][kBlock]
  kvstore::BlockView view() const {
    kvstore::BlockView v;
    v.k_t = keys.data();
    v.k_scales = scales.empty() ? nullptr : scales.data();
    v.n_filled = kBlock;
    return v;
  }
};

TestPage random_page(DType type, int d, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  TestPage page;
  page.wide.resize(size_t(d) * TestPage::kBlock);
  if (type != DType::kQ8_0) {
    for (float& x : page.wide) x = normal(rng);
    page.keys.resize(page.wide.size() * dtype_size(type));
    convert(page.wide.data(), DType::kF32, page.keys.data(), type, page.wide.size());
    convert(page.keys.data(), type, page.wide.data(), DType::kF32, page.wide.size());  // the stored values
    return page;
  }
  std::uniform_int_distribution<int> code(-127, 127);
  page.keys.resize(page.wide.size());
  for (std::byte& b : page.keys) b = std::byte(uint8_t(int8_t(code(rng))));
  std::vector<float> scales(size_t(d / kvstore::kQ8Group) * TestPage::kBlock);
  for (float& x : scales) x = std::abs(normal(rng)) / 64 + 1e-4f;
  page.scales.resize(scales.size());
  convert(scales.data(), DType::kF32, page.scales.data(), DType::kF16, scales.size());
  for (int c = 0; c < d; ++c) {
    for (int t = 0; t < TestPage::kBlock; ++t) {
      const auto codes = reinterpret_cast<const int8_t*>(page.keys.data());
      const float scale = f16_bits_to_f32(page.scales[size_t(c / kvstore::kQ8Group) * TestPage::kBlock + size_t(t)]);
      page.wide[size_t(c) * TestPage::kBlock + size_t(t)] =
          float(codes[kvstore::q8_key_code_offset(TestPage::kBlock, c, t)]) * scale;
    }
  }
  return page;
}

// Keys scored in their page (score_page_tokens: f32, f16, bf16 and q8_0 as
// stored) give exactly the scores of score_tokens_t over the same keys as
// read_keys_t gives them in f32, at scale 1, for runs of whole vectors from
// any first token of a block up to its end (the kernel takes 128 tokens, 64,
// then single vectors); other counts are refused.
TEST(TokenScores, PageScoresEqualStagedScoresOnEveryTarget) {
  std::mt19937 rng(test_seed(47));
  std::normal_distribution<float> normal;
  constexpr int kBlock = TestPage::kBlock;
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const longctx::testing::ForcedHighwayTarget forced(target);
    for (const DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      for (const int d : {64, 128, 256}) {
        const TestPage page = random_page(type, d, rng);
        for (const int group : {1, 3, 8}) {
          for (const Reduce reduce : {Reduce::kSum, Reduce::kMax}) {
            std::vector<float> q(size_t(group * d));
            for (float& x : q) x = normal(rng);
            const GroupQuery gq = group_query(make_view(q.data(), DType::kF32, {group, d}), 0, group, reduce);
            for (const int first : {0, 16, 48, 112}) {
              for (int n = kTokenPad; first + n <= kBlock; n += kTokenPad) {
                SCOPED_TRACE(str_cat(dtype_name(type), ", d ", d, ", group ", group, ", ", reduce_name(reduce),
                                     ", tokens [", first, ", ", first + n, ")"));
                std::vector<float> in_page(static_cast<size_t>(n)), staged(static_cast<size_t>(n));
                score_page_tokens(gq.rows.data(), gq.n_rows, d, page.view(), type, kBlock, first, n, in_page.data());
                score_tokens_t(gq.rows.data(), gq.n_rows, d, page.wide.data() + first, kBlock, n, 1.f, staged.data());
                for (int i = 0; i < n; ++i) ASSERT_EQ(in_page[size_t(i)], staged[size_t(i)]) << "token " << first + i;
              }
            }
          }
        }
      }
    }
  }
  const TestPage page = random_page(DType::kF16, 64, rng);
  std::vector<float> rows(64, 1.f), out(32);
  try {
    score_page_tokens(rows.data(), 1, 64, page.view(), DType::kF16, kBlock, 0, 17, out.data());
    ADD_FAILURE() << "17 tokens accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  }
}

// Each row's scores alone (row_scores_t, SnapKV's logits): rows in fours
// and the rest, against fp64 within head_dim + 2 roundings of sum |q k|;
// nothing written past padded_tokens(n) in a row of ld.
TEST(TokenScores, RowScoresMatchFp64OnEveryTarget) {
  std::mt19937 rng(test_seed(44));
  std::normal_distribution<float> normal;
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const longctx::testing::ForcedHighwayTarget forced(target);
    for (const int d : {64, 128}) {
      for (const int n : {1, 16, 17, 100, 128}) {
        for (const int n_rows : {1, 3, 4, 9}) {
          SCOPED_TRACE(str_cat("d ", d, ", n ", n, ", rows ", n_rows));
          const int ld = padded_tokens(n) + kTokenPad;
          std::vector<float> rows(size_t(n_rows) * size_t(d)), kt(size_t(d) * size_t(ld), NAN);
          for (float& x : rows) x = normal(rng);
          for (int c = 0; c < d; ++c)
            for (int i = 0; i < n; ++i) kt[size_t(c * ld + i)] = normal(rng);
          std::vector<float> out(size_t(n_rows) * size_t(ld), -7.f);
          const float scale = 0.125f;
          row_scores_t(rows.data(), n_rows, d, kt.data(), size_t(ld), n, scale, out.data());
          for (int r = 0; r < n_rows; ++r) {
            for (int i = 0; i < n; ++i) {
              double dot = 0.0, terms = 0.0;
              for (int c = 0; c < d; ++c) {
                const double p = double(rows[size_t(r * d + c)]) * kt[size_t(c * ld + i)];
                dot += p;
                terms += std::abs(p);
              }
              ASSERT_NEAR(out[size_t(r * ld + i)], scale * dot, scale * double(d + 2) * kU * terms)
                  << "row " << r << ", token " << i;
            }
            for (int i = padded_tokens(n); i < ld; ++i) ASSERT_EQ(out[size_t(r * ld + i)], -7.f) << "row " << r;
          }
        }
      }
    }
  }
}

// acc += exp(x - s) * f against fp64, within a few ulp of each term and one
// rounding of the sum, for lengths around whole vectors.
TEST(TokenScores, AddExpMatchesFp64OnEveryTarget) {
  std::mt19937 rng(test_seed(43));
  std::uniform_real_distribution<float> uniform(-30.f, 5.f);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const longctx::testing::ForcedHighwayTarget forced(target);
    for (const int64_t n : {0, 1, 7, 16, 17, 100}) {
      std::vector<float> x(static_cast<size_t>(n)), acc(x.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = uniform(rng), acc[i] = uniform(rng) + 30.f;
      const std::vector<float> before = acc;
      const float shift = 0.5f, factor = 0.3f;
      add_exp(x.data(), n, shift, factor, acc.data());
      for (size_t i = 0; i < x.size(); ++i) {
        const double term = std::exp(double(x[i]) - shift) * factor;
        const double want = double(before[i]) + term;
        EXPECT_NEAR(acc[i], want, term * 8 * kU * (1.0 + std::abs(double(x[i]) - shift)) + kU * want) << "i " << i;
      }
    }
  }
}

// sum exp(x f - s) against fp64, for lengths around whole vectors, within a
// few ulp of each exponential and of the rounding of its argument.
TEST(TokenScores, SumExpMatchesFp64OnEveryTarget) {
  std::mt19937 rng(test_seed(42));
  std::uniform_real_distribution<float> uniform(-30.f, 5.f);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const longctx::testing::ForcedHighwayTarget forced(target);
    for (const int64_t n : {0, 1, 7, 16, 17, 1000}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = uniform(rng);
      const float factor = 0.125f, shift = 0.5f;
      double want = 0.0, bound = 0.0;
      for (const float v : x) {
        const double arg = double(v) * factor - shift;
        want += std::exp(arg);
        bound += std::exp(arg) * 8 * kU * (1.0 + std::abs(arg));
      }
      EXPECT_NEAR(sum_exp(x.data(), n, factor, shift), want, bound + 1e-300) << "n " << n;
    }
    // A NaN anywhere (in whole vectors or the tail) makes the sum NaN, as in
    // fp64; -inf and arguments far below -104 add nothing.
    for (const size_t at : {size_t(0), size_t(5), size_t(16), size_t(40)}) {
      std::vector<float> x(41, -1.f);
      x[at] = std::nanf("");
      EXPECT_TRUE(std::isnan(sum_exp(x.data(), int64_t(x.size()), 1.f, 0.f))) << "NaN at " << at;
      std::vector<float> acc(x.size(), 1.f);
      add_exp(x.data(), int64_t(x.size()), 0.f, 1.f, acc.data());
      EXPECT_TRUE(std::isnan(acc[at])) << "NaN at " << at;
      x[at] = -INFINITY;
      x[(at + 1) % x.size()] = -500.f;
      EXPECT_NEAR(sum_exp(x.data(), int64_t(x.size()), 1.f, 0.f), 39 * std::exp(-1.0), 1e-5) << "-inf at " << at;
    }
  }
}

}  // namespace
}  // namespace longctx::policy::detail
