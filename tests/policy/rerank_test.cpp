// Token rerank (policy/rerank.h): on random stores (f16 and q8_0, GQA sum and
// max, partial last block, sinks and local window), the kept tokens are the
// best by an fp64 score of the stored keys, the fixed parts stay, the spans
// are sorted and merged; a large keep keeps every candidate; DecodePolicy
// with rerank: tokens attends the reranked selection; the config rules.
#include "longctx/policy/rerank.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/policy/decode_policy.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

struct Store {
  kvstore::MemoryBudget budget{uint64_t{1} << 30};
  LongContextConfig config;
  std::unique_ptr<kvstore::KVStore> store;
};

std::unique_ptr<Store> make_store(DType kv, int n_kv, int d, int64_t n_tokens, std::mt19937& rng) {
  auto s = std::make_unique<Store>();
  s->config.block_size = 16;
  s->config.kv_type = kv;
  s->config.initial_len = 4;
  s->config.local_windows_len = 16;
  s->config.max_seq_len = n_tokens + 8;
  s->config.second_select_num = 3;
  s->config.dense_layer_num = 0;
  s->store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, n_kv, d}, s->config, s->budget,
                                                cpu::testing::topology());
  const std::vector<float> k = cpu::testing::normal_values(size_t(n_tokens) * n_kv * d, rng);
  const std::vector<float> v = cpu::testing::normal_values(k.size(), rng);
  cpu::testing::append(*s->store, 0, k, v, n_tokens);
  return s;
}

std::set<int64_t> tokens_of(const std::vector<cpu::TokenSpan>& spans) {
  std::set<int64_t> t;
  for (const cpu::TokenSpan& s : spans)
    for (int64_t i = s.begin; i < s.end; ++i) t.insert(i);
  return t;
}

TEST(Rerank, KeepsTheBestTokensByTheirStoredKeys) {
  std::mt19937 rng(test_seed(31));
  for (DType kv : {DType::kF16, DType::kQ8_0})
    for (Reduce reduce : {Reduce::kSum, Reduce::kMax})
      for (int d : {64, 128}) {
        SCOPED_TRACE(str_cat(dtype_name(kv), " ", reduce_name(reduce), " d=", d));
        const int n_kv = 2, group = 4, n_q = n_kv * group;
        const int64_t n_tokens = 300, keep = 40;  // 300 % 16 != 0: a partial last block
        auto s = make_store(kv, n_kv, d, n_tokens, rng);
        const kvstore::KVStore& store = *s->store;
        const std::vector<float> q = cpu::testing::normal_values(size_t(n_q) * d, rng);
        const TensorView qv = make_view(q.data(), DType::kF32, {n_q, d});
        const cpu::Selection candidates = cpu::select_all(store, 0, true);
        const cpu::Selection got = rerank_tokens(store, 0, qv, candidates, keep, reduce);
        const kvstore::Partition p = store.partition(0);
        // Candidates: the context tokens of blocks wholly inside the context.
        // Every other token is attended: the sinks, the window and the blocks
        // they reach into, the partial last block.
        const auto candidate = [&](int64_t t) {
          const int64_t b = t / 16;
          return t >= p.initial_end && b * 16 >= p.initial_end && (b + 1) * 16 <= p.local_begin;
        };
        for (int h = 0; h < n_kv; ++h) {
          const auto& spans = got.spans[size_t(h)];
          for (size_t i = 0; i < spans.size(); ++i) {
            ASSERT_LT(spans[i].begin, spans[i].end);
            if (i > 0) {
              ASSERT_LT(spans[i - 1].end, spans[i].begin) << "sorted, non-overlapping and merged";
            }
          }
          const std::set<int64_t> t = tokens_of(spans);
          for (int64_t i = 0; i < n_tokens; ++i)
            if (!candidate(i)) {
              EXPECT_TRUE(t.count(i)) << "fixed " << i;
            }
          // fp64 scores of the candidate tokens from the stored keys.
          std::vector<std::pair<double, int64_t>> scores;
          std::vector<float> kt(size_t(d) * 16);
          for (int64_t tok = 0; tok < n_tokens; ++tok) {
            if (!candidate(tok)) continue;
            const int64_t b = tok / 16;
            kvstore::read_keys_t(store.layout(), store.block(0, h, b), int(tok - b * 16), 1, kt.data(), 1);
            double best = -std::numeric_limits<double>::infinity(), sum = 0;
            for (int j = 0; j < group; ++j) {
              double dot = 0;
              for (int c = 0; c < d; ++c) dot += double(q[size_t(h * group + j) * d + c]) * kt[size_t(c)];
              best = std::max(best, dot);
              sum += dot;
            }
            scores.push_back({reduce == Reduce::kSum ? sum : best, tok});
          }
          int64_t kept = 0;
          double worst_kept = std::numeric_limits<double>::infinity(), best_dropped = -worst_kept;
          for (const auto& [score, tok] : scores) {
            if (t.count(tok)) ++kept, worst_kept = std::min(worst_kept, score);
            else best_dropped = std::max(best_dropped, score);
          }
          EXPECT_EQ(kept, keep) << "head " << h;
          EXPECT_GE(worst_kept, best_dropped - 1e-3) << "head " << h << ": a dropped token outscores a kept one";
        }
        // keep beyond the candidates: every candidate stays.
        const cpu::Selection all = rerank_tokens(store, 0, qv, candidates, n_tokens, reduce);
        for (int h = 0; h < n_kv; ++h) EXPECT_EQ(tokens_of(all.spans[size_t(h)]), tokens_of(candidates.spans[size_t(h)]));
      }
}

TEST(Rerank, RefusesBadArguments) {
  std::mt19937 rng(test_seed(33));
  auto s = make_store(DType::kF16, 2, 64, 400, rng);
  const std::vector<float> q = cpu::testing::normal_values(size_t(8) * 64, rng);
  const TensorView qv = make_view(q.data(), DType::kF32, {8, 64});
  const cpu::Selection all = cpu::select_all(*s->store, 0, true);
  cpu::testing::expect_invalid([&] { rerank_tokens(*s->store, 0, qv, all, 10, Reduce::kMean); },
                               {"rerank_tokens: gqa_reduce is", "must be sum or max"});
  cpu::testing::expect_invalid([&] { rerank_tokens(*s->store, 0, qv, all, -1, Reduce::kSum); }, {"keep -1"});
  cpu::Selection one_head = all;
  one_head.spans.pop_back();
  cpu::testing::expect_invalid([&] { rerank_tokens(*s->store, 0, qv, one_head, 10, Reduce::kSum); },
                               {"a selection for 1 kv heads"});
}

TEST(Rerank, DecodePolicyAttendsTheRerankedTokens) {
  std::mt19937 rng(test_seed(32));
  auto s = make_store(DType::kF16, 2, 64, 400, rng);
  const std::vector<float> q = cpu::testing::normal_values(size_t(8) * 64, rng);
  const TensorView qv = make_view(q.data(), DType::kF32, {8, 64});
  LongContextConfig config = s->config;
  config.rerank = RerankMode::kTokens;
  config.rerank_candidates = 4;
  DecodePolicy policy(config, *s->store, 0.f);
  std::vector<float> out(8 * 64), lse(8), want(out.size()), want_lse(lse.size());
  policy.decode(0, 0, qv, true, make_mutable_view(out.data(), DType::kF32, {8, 64}),
                make_mutable_view(lse.data(), DType::kF32, {8}));
  const cpu::Selection& sel = policy.last_selection();
  const kvstore::Partition p = s->store->partition(0);
  // Block 0 (it holds the 4 sinks) + 3 x 16 reranked tokens + the local window (400 % 16 == 0).
  ASSERT_EQ(p.ranked_begin(16), 16);
  ASSERT_EQ(p.ranked_end(16), p.local_begin);
  for (int h = 0; h < 2; ++h)
    EXPECT_EQ(int64_t(tokens_of(sel.spans[size_t(h)]).size()), 16 + 3 * 16 + (p.n_tokens - p.local_begin));
  cpu::decode_attention(*s->store, 0, qv, sel, {}, make_mutable_view(want.data(), DType::kF32, {8, 64}),
                        make_mutable_view(want_lse.data(), DType::kF32, {8}));
  EXPECT_EQ(out, want);
  EXPECT_EQ(lse, want_lse);
}

// The message of validate_config's error ("" when none).
std::string config_error(const LongContextConfig& c) {
  try {
    validate_config(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Rerank, ConfigRulesNameTheKeys) {
  LongContextConfig c;
  c.rerank = RerankMode::kTokens;
  EXPECT_NO_THROW(validate_config(c));
  c.budget.mode = BudgetConfig::Mode::kTopP;
  EXPECT_NE(config_error(c).find("key 'rerank': rerank: tokens keeps second_select_num x block_size tokens"),
            std::string::npos)
      << config_error(c);
  c.budget.mode = BudgetConfig::Mode::kTopK;
  c.policy = SelectionPolicy::kH2O;
  EXPECT_NE(config_error(c).find("but policy is h2o"), std::string::npos) << config_error(c);
  c.policy = SelectionPolicy::kSelect;
  c.rerank_candidates = 0;
  EXPECT_NE(config_error(c).find("key 'rerank_candidates'"), std::string::npos) << config_error(c);
}

}  // namespace
}  // namespace longctx::policy
