// Which blocks a selection ranks (kvstore::Partition::first_ranked_block):
// only those wholly inside the context range. The partial last block and the
// blocks the sinks or the local window reach into are attended without
// taking a slot, and blocks that became ranked after a preselection compete
// with the preselected ones.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/select.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using cpu::TokenSpan;
using cpu::testing::topology;

constexpr int kDim = 32;

LongContextConfig config_of(int block_size, int initial_len, int local_len, int blocks) {
  LongContextConfig c;
  c.max_seq_len = 4096;
  c.block_size = block_size;
  c.initial_len = initial_len;
  c.local_windows_len = local_len;
  c.second_select_num = blocks;
  c.representative_type = RepresentativeType::kQuest;
  c.representative_num = 2;
  c.kv_type = DType::kF32;
  c.dense_layer_num = 0;
  c.head_select_mode = HeadSelectMode::kShared;
  return c;
}

// One layer, one kv head; key t is e0 * magnitude[t], values 0.
struct OneHeadStore {
  kvstore::MemoryBudget budget{uint64_t{1} << 28};
  kvstore::KVStore store;
  explicit OneHeadStore(const LongContextConfig& config) : store({1, 1, kDim}, config, budget, topology()) {}
  void append(const std::vector<float>& magnitude) {
    const int64_t n = int64_t(magnitude.size());
    std::vector<float> k(size_t(n) * kDim, 0.f), v(k.size(), 0.f);
    for (int64_t t = 0; t < n; ++t) k[size_t(t) * kDim] = magnitude[size_t(t)];
    store.append(0, make_view(k.data(), DType::kF32, {n, 1, kDim}), make_view(v.data(), DType::kF32, {n, 1, kDim}));
  }
};

const std::vector<float> kQuery = [] {
  std::vector<float> q(kDim, 0.f);
  q[0] = 1.f;
  return q;
}();

std::vector<TokenSpan> selected(const OneHeadStore& s, const LongContextConfig& config) {
  return select_blocks(s.store, 0, make_view(kQuery.data(), DType::kF32, {1, kDim}),
                       SelectSpec::from_config(config, true))
      .spans[0];
}

// Quest: "The current (partial) page is always attended; top-k picks the
// rest." Whatever the partial block's keys, the 2 best full blocks are chosen.
TEST(RankedBlocks, ThePartialLastBlockTakesNoSlot) {
  const LongContextConfig config = config_of(4, 0, 0, 2);
  for (const float partial : {-5.f, 5.f}) {
    SCOPED_TRACE(partial);
    OneHeadStore s(config);
    const float block[5] = {1, 2, 3, 4, 0.5f};  // blocks 0-4 full, block 5 holds 2 tokens
    std::vector<float> magnitude;
    for (int t = 0; t < 22; ++t) magnitude.push_back(t < 20 ? block[t / 4] : partial);
    s.append(magnitude);
    EXPECT_EQ(selected(s, config), (std::vector<TokenSpan>{{8, 16}, {20, 22}}));
  }
}

// With a budget that covers every full block, every token is attended.
TEST(RankedBlocks, ABudgetOfEveryFullBlockAttendsEverything) {
  const LongContextConfig config = config_of(4, 0, 0, 5);
  OneHeadStore s(config);
  std::vector<float> magnitude(22);
  std::mt19937 rng(test_seed(4));
  for (float& x : magnitude) x = float(int(rng() % 11) - 5);
  s.append(magnitude);
  EXPECT_EQ(selected(s, config), (std::vector<TokenSpan>{{0, 22}}));
}

// demo.yaml's shape: 4 sinks in blocks of 16. The first context block holds
// the sinks, the last the start of the local window; a whole-block
// representative would rank them by those keys (here the largest), which are
// attended anyway. Their context tokens are attended, and the one slot goes
// to block 2, the best context block.
TEST(RankedBlocks, BlocksTheSinksOrTheWindowReachIntoAreAttendedNotRanked) {
  const LongContextConfig config = config_of(16, 4, 20, 1);
  OneHeadStore s(config);
  std::vector<float> magnitude(88, 0.f);  // context [4, 68): blocks 0 (from 4) to 4 (to 68)
  magnitude[0] = 50.f;                    // a sink
  magnitude[70] = 50.f;                   // in the local window, inside block 4
  for (int t = 32; t < 48; ++t) magnitude[size_t(t)] = 5.f;
  s.append(magnitude);
  const kvstore::Partition p = s.store.partition(0);
  EXPECT_EQ(p.first_ranked_block, 1);
  EXPECT_EQ(p.end_ranked_block, 4);
  EXPECT_EQ(selected(s, config), (std::vector<TokenSpan>{{0, 16}, {32, 48}, {64, 88}}));
}

// A prompt of 12 tokens fills the sinks and the window: the preselection at
// its end has no block to choose. The blocks that leave the window during
// decode still compete: with a budget of every block, every token is attended
// at every step, re-selecting or reusing.
TEST(RankedBlocks, BlocksRankedAfterThePreselectionAreChosen) {
  for (const int token_step : {1, 4}) {
    SCOPED_TRACE(token_step);
    LongContextConfig config = config_of(4, 4, 8, 4);
    config.preselect_block = true;
    config.preselect_block_count = 2;
    config.preselect.window = 4;
    config.token_step = token_step;
    OneHeadStore s(config);
    std::mt19937 rng(test_seed(3));
    std::normal_distribution<float> normal;
    const auto random = [&](int64_t n) {
      std::vector<float> x(size_t(n) * kDim);
      for (float& e : x) e = normal(rng);
      return x;
    };
    const auto append_random = [&](int64_t n) {
      const std::vector<float> k = random(n), v = random(n);
      s.store.append(0, make_view(k.data(), DType::kF32, {n, 1, kDim}), make_view(v.data(), DType::kF32, {n, 1, kDim}));
    };
    append_random(12);
    DecodePolicy policy(config, s.store, 0.f);
    const std::vector<float> window = random(4);
    policy.on_prefill_end(0, make_view(window.data(), DType::kF32, {4, 1, kDim}));
    std::vector<float> out(kDim), lse(1);
    for (int64_t step = 0; step < 12; ++step) {
      append_random(1);
      const std::vector<float> q = random(1);
      policy.decode(0, step, make_view(q.data(), DType::kF32, {1, kDim}), true,
                    make_mutable_view(out.data(), DType::kF32, {1, kDim}),
                    make_mutable_view(lse.data(), DType::kF32, {1}));
      EXPECT_EQ(policy.last_selection().spans[0], (std::vector<TokenSpan>{{0, 13 + step}})) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace longctx::policy
