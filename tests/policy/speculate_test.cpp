// Speculative selection (config speculate, speculate_cosine): a select step
// reuses its layer's last selection while the query stays close to the one
// that made it, attends the tokens appended since, and selects anew (saving
// the new query) when the query moves; the config rule.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/policy/decode_policy.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

constexpr int kKv = 2, kGroup = 2, kQ = kKv * kGroup, kD = 64;

struct Fixture {
  kvstore::MemoryBudget budget{uint64_t{1} << 30};
  LongContextConfig config;
  std::unique_ptr<kvstore::KVStore> store;
  std::mt19937 rng{test_seed(41)};

  Fixture() {
    config.block_size = 16;
    config.initial_len = 4;
    config.local_windows_len = 16;
    config.max_seq_len = 600;
    config.second_select_num = 3;
    config.dense_layer_num = 0;
    config.speculate = true;
    config.speculate_cosine = 0.9;
    store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, kKv, kD}, config, budget,
                                               cpu::testing::topology());
    append(400);
  }
  void append(int64_t n) {
    const std::vector<float> k = cpu::testing::normal_values(size_t(n) * kKv * kD, rng);
    const std::vector<float> v = cpu::testing::normal_values(k.size(), rng);
    cpu::testing::append(*store, 0, k, v, n);
  }
};

// One decode step; checks the output is the attention over the reported selection.
DecodePolicy::Stats step(DecodePolicy& p, kvstore::KVStore& store, int64_t token_idx, const std::vector<float>& q) {
  const TensorView qv = make_view(q.data(), DType::kF32, {kQ, kD});
  std::vector<float> out(kQ * kD), lse(kQ), want(out.size()), want_lse(lse.size());
  p.decode(0, token_idx, qv, true, make_mutable_view(out.data(), DType::kF32, {kQ, kD}),
           make_mutable_view(lse.data(), DType::kF32, {kQ}));
  cpu::decode_attention(store, 0, qv, p.last_selection(), {}, make_mutable_view(want.data(), DType::kF32, {kQ, kD}),
                        make_mutable_view(want_lse.data(), DType::kF32, {kQ}));
  EXPECT_EQ(out, want);
  EXPECT_EQ(lse, want_lse);
  return p.last_stats();
}

TEST(Speculate, ReusesWhileTheQueryStaysCloseAndSelectsWhenItMoves) {
  Fixture f;
  DecodePolicy policy(f.config, *f.store, 0.f);
  const std::vector<float> q = cpu::testing::normal_values(kQ * kD, f.rng);
  DecodePolicy::Stats st = step(policy, *f.store, 0, q);
  EXPECT_TRUE(st.reselected);
  EXPECT_FALSE(st.speculated);
  const cpu::Selection first = policy.last_selection();

  // A close query (cosine ~0.995) after one more token: the same blocks, the new token attended.
  std::vector<float> close = q;
  const std::vector<float> noise = cpu::testing::normal_values(kQ * kD, f.rng);
  for (size_t i = 0; i < close.size(); ++i) close[i] += 0.1f * noise[i];
  f.append(1);
  st = step(policy, *f.store, 1, close);
  EXPECT_TRUE(st.speculated);
  EXPECT_FALSE(st.reselected);
  for (int h = 0; h < kKv; ++h) {
    EXPECT_EQ(policy.last_selection().spans[size_t(h)].front().begin, first.spans[size_t(h)].front().begin);
    EXPECT_EQ(policy.last_selection().spans[size_t(h)].back().end, 401) << "the new token is attended";
  }

  // A query that moved (an unrelated one): selects anew and saves it.
  const std::vector<float> other = cpu::testing::normal_values(kQ * kD, f.rng);
  st = step(policy, *f.store, 2, other);
  EXPECT_TRUE(st.reselected);
  EXPECT_FALSE(st.speculated);
  st = step(policy, *f.store, 3, other);  // the same query again: reused
  EXPECT_TRUE(st.speculated);

  // A threshold no perturbed query reaches: every step selects.
  LongContextConfig strict = f.config;
  strict.speculate_cosine = 1.0;
  DecodePolicy exact(strict, *f.store, 0.f);
  step(exact, *f.store, 0, q);
  EXPECT_TRUE(step(exact, *f.store, 1, close).reselected);
  // Speculation off: every select step selects.
  LongContextConfig off = f.config;
  off.speculate = false;
  DecodePolicy plain(off, *f.store, 0.f);
  step(plain, *f.store, 0, q);
  EXPECT_TRUE(step(plain, *f.store, 1, q).reselected);
}

TEST(Speculate, NeedsTheSelectPolicy) {
  LongContextConfig c;
  c.speculate = true;
  EXPECT_NO_THROW(validate_config(c));
  c.policy = SelectionPolicy::kStreaming;
  try {
    validate_config(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'speculate': speculate reuses a select step's blocks, but policy is "
                                         "streaming"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace longctx::policy
