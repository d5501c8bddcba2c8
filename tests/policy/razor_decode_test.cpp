// RazorAttention (policy/razor.h): razor decode attention against one dense
// fp64 softmax over the kept tokens plus the compensation token weighted by
// N_d (razor_fixture.h); in DecodePolicy, non-retrieval heads that steer no
// block choice.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/razor.h"
#include "razor_fixture.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using namespace razor_testing;

// ---- razor decode attention -------------------------------------------------------------

// Mixed retrieval and non-retrieval heads in one layer, local window attended
// here or elsewhere, against one dense fp64 softmax per query head.
TEST(RazorDecodeAttention, MatchesDenseReference) {
  std::mt19937 rng(test_seed(99));
  for (int trial = 0; trial < 60; ++trial) {
    Case c = random_case(rng);
    SCOPED_TRACE(c.describe());
    RazorStore s(c, uint32_t(1000 + trial));
    s.append(RazorStore::kLayer, int64_t(rng() % 160));
    const RetrievalHeads heads = random_heads(c, rng);
    RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
    comp.update(s.store());
    const Selection retrieval = random_selection(c.n_kv_heads, s.n_tokens(), rng);
    const std::vector<float> q = s.random_q();
    for (bool include_local : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "tokens " << s.n_tokens() << " include_local " << include_local);
      const Result r = run_razor(s, c, q, retrieval, heads, comp, include_local);
      ASSERT_NO_FATAL_FAILURE(expect_razor_matches_reference(s, c, q, retrieval, heads, include_local, r));
      // out may alias q.
      std::vector<float> q_out = q, lse(size_t(c.n_q_heads()));
      RazorDecodeParams params;
      params.include_local = include_local;
      razor_decode_attention(s.store(), RazorStore::kLayer,
                             make_view(q_out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}), retrieval, heads,
                             comp, params, make_mutable_view(q_out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                             make_mutable_view(lse.data(), DType::kF32, {c.n_q_heads()}));
      EXPECT_EQ(q_out, r.out);
      EXPECT_EQ(lse, r.lse);
    }
  }
}

// Few tokens: nothing dropped, the compensation part is empty and razor
// attention is plain attention over every token.
TEST(RazorDecodeAttention, NothingDroppedIsDense) {
  Case c;
  c.g = 2;
  c.razor = RazorConfig{"", 4, 50, 5};
  RazorStore s(c, 5);
  s.append(RazorStore::kLayer, 50);
  const RetrievalHeads heads(2, c.n_kv_heads);  // no retrieval head
  RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
  comp.update(s.store());
  EXPECT_EQ(comp.n_dropped(), 0);
  const std::vector<float> q = s.random_q();
  Selection none;
  none.spans.resize(size_t(c.n_kv_heads));
  const Result r = run_razor(s, c, q, none, heads, comp, true);
  Result dense;
  dense.out.resize(q.size());
  dense.lse.resize(size_t(c.n_q_heads()));
  dense_decode_attention(s.store(), RazorStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         {}, make_mutable_view(dense.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         make_mutable_view(dense.lse.data(), DType::kF32, {c.n_q_heads()}));
  EXPECT_EQ(r.out, dense.out);
  EXPECT_EQ(r.lse, dense.lse);
}

// Every head a retrieval head (RazorAttention off): decode_attention over
// the retrieval selection as is; an empty layer gives empty results.
TEST(RazorDecodeAttention, AllRetrievalHeadsAndEmptyLayer) {
  Case c;
  c.g = 4;
  RazorStore s(c, 8);
  const RetrievalHeads all = RetrievalHeads::all(2, c.n_kv_heads);
  RazorCompensation comp(s.store(), RazorStore::kLayer, all, s.params());
  comp.update(s.store());
  const std::vector<float> q = s.random_q();
  Selection none;
  none.spans.resize(size_t(c.n_kv_heads));
  Result r = run_razor(s, c, q, none, all, comp, true);
  for (float l : r.lse) EXPECT_EQ(l, -kInf);
  for (float o : r.out) EXPECT_EQ(o, 0.f);

  s.append(RazorStore::kLayer, 70);
  comp.update(s.store());
  const Selection sel = random_selection(c.n_kv_heads, s.n_tokens(), s.rng());
  r = run_razor(s, c, q, sel, all, comp, true);
  Result plain;
  plain.out.resize(q.size());
  plain.lse.resize(size_t(c.n_q_heads()));
  decode_attention(s.store(), RazorStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}), sel,
                   {}, make_mutable_view(plain.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                   make_mutable_view(plain.lse.data(), DType::kF32, {c.n_q_heads()}));
  EXPECT_EQ(r.out, plain.out);
  EXPECT_EQ(r.lse, plain.lse);
}

TEST(RazorDecodeAttention, RejectsStaleOrForeignCompensation) {
  Case c;
  c.razor = RazorConfig{"", 2, 4, 5};
  RazorStore s(c, 4);
  s.append(RazorStore::kLayer, 30);
  const RetrievalHeads none(2, c.n_kv_heads);
  RazorCompensation comp(s.store(), RazorStore::kLayer, none, s.params());
  const std::vector<float> q = s.random_q();
  Selection sel;
  sel.spans.resize(size_t(c.n_kv_heads));
  EXPECT_THROW(run_razor(s, c, q, sel, none, comp, true), Error);  // not updated
  comp.update(s.store());
  EXPECT_NO_THROW(run_razor(s, c, q, sel, none, comp, true));
  // A compensation that tracks only some heads, used with a list where more are compressed.
  RetrievalHeads some(2, c.n_kv_heads);
  some.set(RazorStore::kLayer, 0, true);
  RazorCompensation partial(s.store(), RazorStore::kLayer, some, s.params());
  partial.update(s.store());
  EXPECT_THROW(run_razor(s, c, q, sel, none, partial, true), Error);
  RazorCompensation layer0(s.store(), 0, none, s.params());
  layer0.update(s.store());
  EXPECT_THROW(run_razor(s, c, q, sel, none, layer0, true), Error);
  Selection short_sel;
  EXPECT_THROW(run_razor(s, c, q, short_sel, none, comp, true), Error);
}

// ---- RazorAttention in DecodePolicy --------------------------------------------------------

// RazorAttention's non-retrieval heads skip block selection: they neither
// steer the retrieval heads' blocks nor take their budget. Two kv heads of
// blocks of 4 (0..3 context, 4 the local window), kv head 0 the retrieval
// head with its best block 1, kv head 1 with much larger scores elsewhere.
class RazorSteering : public ::testing::Test {
 protected:
  static constexpr int kDim = 32, kHeads = 2, kBlock = 4;

  static LongContextConfig config() {
    LongContextConfig c = cpu::testing::kernel_store_config(DType::kF32, kBlock, 64);  // MAX, one representative
    c.local_windows_len = kBlock;
    c.second_select_num = 1;
    c.dense_layer_num = 0;
    c.razor.sinks = 0;
    c.razor.buffer_min = kBlock;
    c.razor.buffer_ratio = 1000;
    return c;
  }

  // Retrieval head 0's context blocks attended by `c`'s policy for a query along channel 0.
  static std::set<int64_t> retrieval_blocks(const LongContextConfig& c) {
    kvstore::MemoryBudget budget(uint64_t{1} << 26);
    kvstore::KVStore store({1, kHeads, kDim}, c, budget, topology());
    const int n = 5 * kBlock;
    std::vector<float> k(size_t(n * kHeads * kDim), 0.f), v(k.size(), 0.f);
    const auto key = [&](int t, int h) { return k.data() + (t * kHeads + h) * kDim; };
    for (int t = 0; t < kBlock; ++t) {
      key(1 * kBlock + t, 0)[0] = 2.f;  // head 0 (retrieval): block 1
      for (const int b : {0, 2, 3}) key(b * kBlock + t, 1)[0] = b == 2 ? 100.f : 50.f;  // head 1: not block 1
    }
    store.append(0, make_view(k.data(), DType::kF32, {n, kHeads, kDim}),
                 make_view(v.data(), DType::kF32, {n, kHeads, kDim}));
    RetrievalHeads heads(1, kHeads);
    heads.set(0, 0, true);
    DecodePolicy policy(c, store, /*attn_scale: 1/sqrt(head_dim)*/ 0.f, heads);
    std::vector<float> q(size_t(kHeads * kDim), 0.f), out(q.size()), lse(static_cast<size_t>(kHeads));
    for (int h = 0; h < kHeads; ++h) q[size_t(h * kDim)] = 1.f;
    if (c.preselect_block) {  // the prompt's last 4 queries, as the decode query
      std::vector<float> window;
      for (int i = 0; i < 4; ++i) window.insert(window.end(), q.begin(), q.end());
      policy.on_prefill_end(0, make_view(window.data(), DType::kF32, {4, kHeads, kDim}));
    }
    policy.decode(0, 0, make_view(q.data(), DType::kF32, {kHeads, kDim}), true,
                  make_mutable_view(out.data(), DType::kF32, {kHeads, kDim}),
                  make_mutable_view(lse.data(), DType::kF32, {kHeads}));
    std::set<int64_t> blocks;
    for (const TokenSpan& span : policy.last_selection().spans[0])
      for (int64_t t = span.begin; t < span.end; ++t)
        if (t < 4 * kBlock) blocks.insert(t / kBlock);
    return blocks;
  }
};

// SHARED summed every head's scores: kv head 1's block 2 was chosen for all.
TEST_F(RazorSteering, SharedSumsRetrievalHeadsOnly) {
  LongContextConfig c = config();
  c.head_select_mode = HeadSelectMode::kShared;
  EXPECT_EQ(retrieval_blocks(c), std::set<int64_t>{1});
}

// SEPARATE with Ada-KV shared the two heads' budget (2 blocks) by score, and
// with no floor (alpha 0) kv head 1 took both: the retrieval head had none.
TEST_F(RazorSteering, AdaKvSharesRetrievalHeadsBudgetOnly) {
  LongContextConfig c = config();
  c.head_select_mode = HeadSelectMode::kSeparate;
  c.budget.policy = BudgetConfig::Policy::kAdaptive;
  c.budget.alpha = 0.0;
  EXPECT_EQ(retrieval_blocks(c), std::set<int64_t>{1});
}

// SnapKV preselection summed every head's votes in SHARED mode: kv head 1's
// block 2 was the one block left to choose from.
TEST_F(RazorSteering, PreselectionCountsRetrievalHeadsVotesOnly) {
  LongContextConfig c = config();
  c.head_select_mode = HeadSelectMode::kShared;
  c.preselect_block = true;
  c.preselect_block_count = 1;
  EXPECT_EQ(retrieval_blocks(c), std::set<int64_t>{1});
  c.head_select_mode = HeadSelectMode::kSeparate;
  EXPECT_EQ(retrieval_blocks(c), std::set<int64_t>{1});
}

// top_p in SHARED mode ranked blocks by the mean of every head's masses.
TEST_F(RazorSteering, TopPSharedWeighsRetrievalHeadsOnly) {
  LongContextConfig c = config();
  c.head_select_mode = HeadSelectMode::kShared;
  c.budget.mode = BudgetConfig::Mode::kTopP;
  c.budget.p = 0.5;
  c.budget.max_blocks = 1;
  EXPECT_EQ(retrieval_blocks(c), std::set<int64_t>{1});
}

}  // namespace
}  // namespace longctx::policy
