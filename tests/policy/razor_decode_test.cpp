// RazorAttention (policy/razor.h): razor decode attention against one dense
// fp64 softmax over the kept tokens plus the compensation token weighted by
// N_d (razor_fixture.h).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/policy/razor.h"
#include "razor_fixture.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using namespace razor_testing;

// ---- razor decode attention -------------------------------------------------------------

// Mixed retrieval and non-retrieval heads in one layer, local window attended
// here or elsewhere, against one dense fp64 softmax per query head.
TEST(RazorDecodeAttention, MatchesDenseReference) {
  std::mt19937 rng(99);
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

}  // namespace
}  // namespace longctx::policy
