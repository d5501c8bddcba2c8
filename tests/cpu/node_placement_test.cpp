// The kernels on a store spread over several NUMA nodes (synthetic
// topologies: work runs in per-node arenas, kvstore/node_executor.h) give the
// same bits as on a one-node store (plain tbb::parallel_for), whose results
// the other tests check against the fp64 references. The kernels' results do
// not depend on which thread runs an item, so any lost, repeated or misplaced
// item shows up as a difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

constexpr int kKvHeads = 8;
constexpr int kGroup = 2;
constexpr int kDim = 64;
constexpr int64_t kTokens = 613;  // prime: a partial last block
constexpr int64_t kChunk = 100;   // appended in chunks; the last one is also the prefill chunk

struct PlacedStore {
  kvstore::NumaTopology topology;
  kvstore::MemoryBudget budget{uint64_t{1} << 30};
  std::unique_ptr<kvstore::KVStore> store;

  PlacedStore(const std::string& description, RepresentativeType rep, const std::vector<float>& k,
              const std::vector<float>& v, const std::vector<float>& importance)
      : topology(kvstore::NumaTopology::synthetic(description)) {
    LongContextConfig config;
    config.max_seq_len = kTokens;
    config.block_size = 16;
    config.kv_type = DType::kBF16;
    config.initial_len = 4;
    config.local_windows_len = 32;
    config.representative_type = rep;
    config.representative_num = 3;
    store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, kKvHeads, kDim}, config, budget, topology);
    const int64_t row = int64_t(kKvHeads) * kDim;
    for (int64_t t = 0; t < kTokens; t += kChunk) {
      const int64_t n = std::min(kChunk, kTokens - t);
      store->append(0, make_view(k.data() + t * row, DType::kF32, {n, kKvHeads, kDim}),
                    make_view(v.data() + t * row, DType::kF32, {n, kKvHeads, kDim}),
                    make_view(importance.data() + t * kKvHeads, DType::kF32, {n, kKvHeads}));
    }
    if (rep == RepresentativeType::kDynamic) {
      store->add_importance(0, 50, make_view(importance.data(), DType::kF32, {300, kKvHeads}));
    }
  }
};

// Everything the kernels produce for one store, as raw floats.
struct Results {
  std::vector<std::byte> pages, records;
  std::vector<float> scores, out, lse, prefill_out, prefill_lse;
};

Results run_kernels(const kvstore::KVStore& store, const std::vector<float>& q, const std::vector<float>& q_chunk) {
  Results r;
  const kvstore::StoreLayout& layout = store.layout();
  for (int h = 0; h < kKvHeads; ++h) {
    for (int64_t b = 0; b < store.n_blocks(0); ++b) {
      const std::byte* page = store.block(0, h, b).k_t;
      r.pages.insert(r.pages.end(), page, page + layout.page_bytes);
      const std::byte* record = store.rep_record(0, h, b);
      r.records.insert(r.records.end(), record, record + layout.record_bytes);
    }
  }
  const int n_q = kKvHeads * kGroup;
  const TensorView q_view = make_view(q.data(), DType::kF32, {n_q, kDim});
  const kvstore::Partition part = store.partition(0);
  const int64_t n_context = part.end_context_block - part.first_context_block;
  r.scores.resize(size_t(kKvHeads * n_context));
  score_blocks(store, 0, q_view, ScoreParams{}, make_mutable_view(r.scores.data(), DType::kF32, {kKvHeads, n_context}));

  std::vector<std::vector<int64_t>> chosen;  // the 6 best blocks of each kv head
  for (int h = 0; h < kKvHeads; ++h) {
    chosen.push_back(top_k(r.scores.data() + size_t(h * n_context), n_context, 6));
    for (int64_t& b : chosen.back()) b += part.first_context_block;
  }
  const Selection selection = build_selection(part, layout.block_size, kKvHeads, chosen, true);
  DecodeAttentionParams params;
  params.split_tokens = 16;  // many pieces per kv head
  r.out.resize(size_t(2 * n_q * kDim));
  r.lse.resize(size_t(2 * n_q));
  decode_attention(store, 0, q_view, selection, params, make_mutable_view(r.out.data(), DType::kF32, {n_q, kDim}),
                   make_mutable_view(r.lse.data(), DType::kF32, {n_q}));
  dense_decode_attention(store, 0, q_view, params,
                         make_mutable_view(r.out.data() + n_q * kDim, DType::kF32, {n_q, kDim}),
                         make_mutable_view(r.lse.data() + n_q, DType::kF32, {n_q}));

  const int64_t n = int64_t(q_chunk.size()) / (n_q * kDim);
  r.prefill_out.resize(q_chunk.size());
  r.prefill_lse.resize(size_t(n * n_q));
  prefill_attention(store, 0, kTokens - n, make_view(q_chunk.data(), DType::kF32, {n, n_q, kDim}), 0.f,
                    make_mutable_view(r.prefill_out.data(), DType::kF32, {n, n_q, kDim}),
                    make_mutable_view(r.prefill_lse.data(), DType::kF32, {n, n_q}));
  return r;
}

std::vector<float> normal_values(size_t n, std::mt19937& rng, float mean = 0.f) {
  std::normal_distribution<float> normal(mean, 1.f);
  std::vector<float> values(n);
  for (float& x : values) x = normal(rng);
  return values;
}

TEST(NodePlacement, KernelsOnSeveralNodesMatchOneNode) {
  std::mt19937 rng(test_seed(2024));
  const std::vector<float> k = normal_values(size_t(kTokens * kKvHeads * kDim), rng);
  const std::vector<float> v = normal_values(size_t(kTokens * kKvHeads * kDim), rng);
  const std::vector<float> importance = normal_values(size_t(kTokens * kKvHeads), rng, 2.f);
  const std::vector<float> q = normal_values(size_t(kKvHeads * kGroup * kDim), rng);
  const std::vector<float> q_chunk = normal_values(size_t(kTokens % kChunk * kKvHeads * kGroup * kDim), rng);

  for (const RepresentativeType rep : {RepresentativeType::kQuest, RepresentativeType::kDynamic}) {
    const PlacedStore one("core:2 pu:1", rep, k, v, importance);
    ASSERT_EQ(one.store->head_nodes(), std::vector<int>(kKvHeads, 0));
    const Results expected = run_kernels(*one.store, q, q_chunk);
    for (const std::string topology : {"pack:2 numa:1 core:2 pu:1", "numa:4 core:2 pu:1", "numa:3 core:1 pu:1"}) {
      SCOPED_TRACE(topology + ", " + representative_type_name(rep));
      const PlacedStore placed(topology, rep, k, v, importance);
      ASSERT_GT(placed.topology.node_count(), 1);
      const Results got = run_kernels(*placed.store, q, q_chunk);
      EXPECT_TRUE(got.pages == expected.pages);
      EXPECT_TRUE(got.records == expected.records);
      EXPECT_EQ(got.scores, expected.scores);
      EXPECT_EQ(got.out, expected.out);
      EXPECT_EQ(got.lse, expected.lse);
      EXPECT_EQ(got.prefill_out, expected.prefill_out);
      EXPECT_EQ(got.prefill_lse, expected.prefill_lse);
    }
  }
}

}  // namespace
}  // namespace longctx::cpu
