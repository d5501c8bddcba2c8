// The test that shows the method works, not just that it runs: on the
// synthetic needle workload (synthetic.h) at 32K tokens, QUEST selection with
// 2% of the tokens finds the needle blocks, in SHARED and SEPARATE mode, while
// the always-attended part alone (sinks + local window) does not.
//
// Setup: 32768 tokens, block 128, 2 kv heads, 8 query heads (g = 4), head_dim
// 128, f16 store, QUEST. initial_len = 128 = one block (the sinks' block is
// always attended and is no candidate: were it shorter, block 0 would be a
// context block whose QUEST record holds the large sink keys, and it would
// take a slot at every step), local_windows_len = 128 = the generator's
// recent tokens. Budget: 2% of 32768 = 655 tokens -> blocks_for_token_budget
// = 5 blocks, of which initial + local take 2: second_select_num = 3 context
// blocks (640 tokens attended in all).
//
// Workload: one needle span of 4 tokens per context (a passkey) of strength
// 7 sigma of q.k (synthetic.h). Why 7, measured with this generator and an
// fp64 QUEST on the same keys, 100 seeds (300 at 7 sigma), 3 blocks:
//
//   strength (sigma)           4      5      6      6.5    7      8
//   QUEST SHARED               0.90   0.98   1.00   1.00   1.00   1.00
//   QUEST SEPARATE             0.43   0.80   0.96   1.00   0.997  1.00
//   oracle (true max q.k)      0.78   1.00   1.00   1.00   1.00   1.00
//   dense mass on the needle   0.2%   1%     4%     9%     16%    44%
//
// At 32K tokens the largest of the ~32K ordinary q.k is itself about
// sqrt(2 ln 32768) = 4.6 sigma, so a 4-sigma needle is not even the top token:
// dense attention gives it 0.2%, i.e. it is not something attention
// retrieves, and ranking blocks by their exact max q.k (the oracle) misses 22%
// of them (QUEST SHARED misses fewer only because needle keys stick out in
// channels where ordinary keys are quiet, which its per-channel bounds see).
// A needle that a retrieval head retrieves needs more; at 7 sigma dense attention puts ~16%
// of each head's attention on the 4 needle tokens (the sinks take ~70%): a
// modest retrieval head, not an absurd needle. SEPARATE is the harder mode:
// each kv head must rank the needle block alone, with the evidence of one
// kv head instead of two; it needs ~6.5 sigma where SHARED needs ~5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/select.h"
#include "longctx/workloads/metrics.h"
#include "longctx/workloads/synthetic.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // the kernels the selection is attended with

using workloads::block_recall;
using workloads::dense_probabilities;
using workloads::make_synthetic;
using workloads::relative_l2_error;
using workloads::SyntheticSpec;
using workloads::SyntheticWorkload;
using workloads::topk_token_recall;

constexpr int64_t kTokens = 32768;
constexpr int kBlock = 128;
constexpr int kKvHeads = 2;
constexpr int kQHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kInitial = 128;
constexpr int kLocal = 128;
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSeeds = 6;  // same check, fewer seeds under the ~10x slower sanitizers
#else
constexpr int kSeeds = 50;
#endif

SyntheticSpec needle_spec(uint64_t seed) {
  SyntheticSpec s;
  s.n_tokens = kTokens;
  s.n_q_heads = kQHeads;
  s.n_kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  s.block_size = kBlock;
  s.n_sinks = 4;
  s.recent_tokens = kLocal;
  s.n_needles = 1;
  s.needle_len = 4;
  s.needle_strength = 7.f;
  s.seed = seed;
  return s;
}

LongContextConfig store_config() {
  LongContextConfig c;
  c.max_seq_len = kTokens;
  c.block_size = kBlock;
  c.initial_len = kInitial;
  c.local_windows_len = kLocal;
  c.representative_type = RepresentativeType::kQuest;
  c.representative_num = 2;
  c.kv_type = DType::kF16;
  return c;
}

// Context blocks the 2% budget leaves once initial + local are paid for.
int64_t context_blocks_for_budget() {
  const int64_t total = blocks_for_token_budget(int64_t(0.02 * double(kTokens)), kBlock);
  const int64_t always = (kInitial + kLocal + kBlock - 1) / kBlock;
  return total - always;
}

// What one selection achieved on one workload; top-10 recall only on the
// first kReportSeeds seeds (it needs the fp64 dense probabilities, the most
// expensive part, and is reported, not asserted).
struct Quality {
  double block_recall = 0;
  double top10_recall = -1;  // -1: not computed
  double l2_error = 0;
};

struct Totals {
  double block_recall = 0;
  double top10_recall = 0;
  double l2_error = 0;
  int count = 0;
  int top10_count = 0;
  void add(const Quality& q) {
    block_recall += q.block_recall;
    l2_error += q.l2_error;
    ++count;
    if (q.top10_recall >= 0) top10_recall += q.top10_recall, ++top10_count;
  }
  double mean_block_recall() const { return block_recall / count; }
  double mean_l2_error() const { return l2_error / count; }
};

constexpr int kReportSeeds = 10;

TEST(NeedleRecall, QuestAtTwoPercentFindsNeedlesLocalOnlyDoesNot) {
  ASSERT_EQ(context_blocks_for_budget(), 3);
  kvstore::MemoryBudget budget(uint64_t{2} << 30);
  const kvstore::NumaTopology topology = kvstore::NumaTopology::detect();
  kvstore::KVStore store(kvstore::KVShape{1, kKvHeads, kHeadDim}, store_config(), budget, topology);

  Totals shared, separate, local_only;
  std::vector<uint16_t> k_f16;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    SyntheticWorkload w = make_synthetic(needle_spec(uint64_t(seed)));
    // Keys as the f16 store holds them (rounding is idempotent: the store
    // keeps exactly these), so the dense probabilities describe what it holds.
    k_f16.resize(w.k.size());
    convert(w.k.data(), DType::kF32, k_f16.data(), DType::kF16, w.k.size());
    convert(k_f16.data(), DType::kF16, w.k.data(), DType::kF32, w.k.size());
    store.clear();
    store.append(0, make_view(w.k.data(), DType::kF32, {kTokens, kKvHeads, kHeadDim}),
                 make_view(w.v.data(), DType::kF32, {kTokens, kKvHeads, kHeadDim}));
    const TensorView q = make_view(w.q.data(), DType::kF32, {kQHeads, kHeadDim});

    // Dense references: fp64 probabilities, and the kernel's dense output.
    const std::vector<double> probs = seed <= kReportSeeds ? dense_probabilities(w) : std::vector<double>{};
    std::vector<float> dense_out(size_t(kQHeads) * kHeadDim), dense_lse(kQHeads);
    dense_decode_attention(store, 0, q, DecodeAttentionParams{},
                           make_mutable_view(dense_out.data(), DType::kF32, {kQHeads, kHeadDim}),
                           make_mutable_view(dense_lse.data(), DType::kF32, {kQHeads}));

    auto evaluate = [&](int64_t blocks, HeadSelectMode mode) {
      SelectSpec params;
      params.blocks = blocks;
      params.mode = mode;
      const Selection selection = select_blocks(store, 0, q, params);
      std::vector<float> out(size_t(kQHeads) * kHeadDim), lse(kQHeads);
      decode_attention(store, 0, q, selection, DecodeAttentionParams{},
                       make_mutable_view(out.data(), DType::kF32, {kQHeads, kHeadDim}),
                       make_mutable_view(lse.data(), DType::kF32, {kQHeads}));
      Quality quality;
      quality.block_recall = block_recall(selection, w.needle_blocks, kBlock, kTokens);
      if (!probs.empty()) quality.top10_recall = topk_token_recall(probs, kQHeads, kTokens, selection, 10);
      quality.l2_error = relative_l2_error(out.data(), dense_out.data(), int64_t(out.size()));
      return quality;
    };
    const Quality s = evaluate(context_blocks_for_budget(), HeadSelectMode::kShared);
    const Quality p = evaluate(context_blocks_for_budget(), HeadSelectMode::kSeparate);
    const Quality l = evaluate(0, HeadSelectMode::kShared);
    if (s.block_recall < 1) std::printf("  seed %d: SHARED missed the needle block\n", seed);
    if (p.block_recall < 1) std::printf("  seed %d: SEPARATE missed the needle block\n", seed);
    shared.add(s);
    separate.add(p);
    local_only.add(l);
  }

  auto report = [](const char* name, const Totals& t) {
    std::printf("  %-20s needle block recall %.3f  output rel. L2 error %.3f  top-10 token recall %.3f\n", name,
                t.mean_block_recall(), t.mean_l2_error(), t.top10_recall / t.top10_count);
  };
  std::printf("needle workload: %d seeds (top-10 recall: first %d), %lld tokens, 2%% budget = %lld context blocks"
              " + initial + local\n",
              kSeeds, std::min(kSeeds, kReportSeeds), static_cast<long long>(kTokens),
              static_cast<long long>(context_blocks_for_budget()));
  report("QUEST SHARED", shared);
  report("QUEST SEPARATE", separate);
  report("sinks + local only", local_only);

  EXPECT_GE(shared.mean_block_recall(), 0.99);
  EXPECT_GE(separate.mean_block_recall(), 0.99);
  EXPECT_LT(local_only.mean_block_recall(), 0.1);
  // Finding the needle is what lowers the output error: the needle values
  // are distinctive, so missing them leaves a large error.
  EXPECT_LT(shared.mean_l2_error(), 0.5 * local_only.mean_l2_error());
  EXPECT_LT(separate.mean_l2_error(), 0.5 * local_only.mean_l2_error());
}

}  // namespace
}  // namespace longctx::policy
