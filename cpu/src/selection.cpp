// Top-k of block scores and the token spans a decode step attends
// (selection.h): initial tokens + chosen context blocks + the context blocks
// that are not ranked + the local window, merged so that no token appears twice.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/selection.h"

namespace longctx::cpu {
namespace {

using kvstore::KVStore;
using kvstore::Partition;

// A 32-bit key whose increasing order is the rank order of scores:
// decreasing value, -0 equal to +0, NaN after everything. No branch, so that
// top_k's pass over every score runs without mispredictions.
uint32_t rank_key(float score) {
  const auto bits = std::bit_cast<uint32_t>(score + 0.f);  // -0 + 0 = +0: -0 ties with +0
  // Negative: larger magnitude -> larger bits -> later. Non-negative: larger
  // value -> larger bits -> smaller key, all below every negative's key.
  const uint32_t key = (bits & 0x80000000u) != 0 ? bits : (~bits & 0x7FFFFFFFu);
  return std::isnan(score) ? std::numeric_limits<uint32_t>::max() : key;
}

void check_partition(const Partition& p, int block_size, const char* what) {
  if (block_size < 1) fail(ErrorCode::kInvalidArgument, what, ": block_size is ", block_size, ", must be >= 1");
  if (p.initial_end < 0 || p.initial_end > p.local_begin || p.local_begin > p.n_tokens ||
      p.first_context_block < 0 || p.first_context_block > p.end_context_block ||
      p.first_ranked_block < p.first_context_block || p.first_ranked_block > p.end_ranked_block ||
      p.end_ranked_block > p.end_context_block)
    fail(ErrorCode::kInvalidArgument, what, ": inconsistent partition (n_tokens ", p.n_tokens, ", initial_end ",
         p.initial_end, ", local_begin ", p.local_begin, ", context blocks [", p.first_context_block, ", ",
         p.end_context_block, "), ranked blocks [", p.first_ranked_block, ", ", p.end_ranked_block, "))");
}

// Sorts spans by begin and merges overlapping or adjacent ones.
std::vector<TokenSpan> merge_spans(std::vector<TokenSpan> spans) {
  std::sort(spans.begin(), spans.end(), [](const TokenSpan& a, const TokenSpan& b) { return a.begin < b.begin; });
  std::vector<TokenSpan> merged;
  merged.reserve(spans.size());
  for (const TokenSpan& span : spans) {
    if (!merged.empty() && span.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, span.end);
    } else {
      merged.push_back(span);
    }
  }
  return merged;
}

std::vector<TokenSpan> spans_of_head(const Partition& p, int block_size, const std::vector<int64_t>& blocks,
                                     size_t list_index, bool include_local) {
  std::vector<TokenSpan> spans;
  spans.reserve(blocks.size() + 3);
  const auto add = [&spans](int64_t begin, int64_t end) {
    if (begin < end) spans.push_back({begin, end});
  };
  add(0, p.initial_end);
  for (const int64_t b : blocks) {
    if (b < p.first_context_block || b >= p.end_context_block)
      fail(ErrorCode::kInvalidArgument, "build_selection: chosen block ", b, " (list ", list_index,
           ") outside the context blocks [", p.first_context_block, ", ", p.end_context_block, ")");
    add(p.context_begin_of(b, block_size), p.context_end_of(b, block_size));
  }
  // The context blocks that are not ranked (Partition::first_ranked_block).
  for (int64_t b = p.first_context_block; b < p.first_ranked_block; ++b)
    add(p.context_begin_of(b, block_size), p.context_end_of(b, block_size));
  for (int64_t b = p.end_ranked_block; b < p.end_context_block; ++b)
    add(p.context_begin_of(b, block_size), p.context_end_of(b, block_size));
  if (include_local) add(p.local_begin, p.n_tokens);
  return merge_spans(std::move(spans));
}

}  // namespace

int64_t Selection::tokens(int kv_head) const {
  if (kv_head < 0 || size_t(kv_head) >= spans.size())
    fail(ErrorCode::kInvalidArgument, "Selection::tokens: kv head ", kv_head, " out of range [0, ", spans.size(), ")");
  return span_tokens(spans[size_t(kv_head)]);
}

int64_t span_tokens(const std::vector<TokenSpan>& spans) {
  int64_t total = 0;
  for (const TokenSpan& span : spans) total += span.end - span.begin;
  return total;
}

// top_k ranks only the keys that can be among the k best where every chunk
// of the first k * (n / k) keys has at least kMinChunk of them: the worst of
// the k chunk bests is at least as good as the k-th best (k distinct keys
// reach it), so a key worse than that bound is not among the k best. The
// passes over all n keys have no data-dependent branch, where a bounded heap
// or nth_element over all keys mispredicts about half of theirs. On a Xeon
// EMR, 200 arrays of normal scores cycled (medians of 20 passes, one thread):
// k = 32 of 1024 (128K tokens, blocks of 128) 3.7-4.0 us against 15.7-33 for
// nth_element over all; k = 32 of 8192 (1M tokens) 17-19 us against 64-76
// for the heap; k = 128 of 1024 10-11 us against 20-21.
constexpr int64_t kMinChunk = 8;

std::vector<int64_t> top_k(const float* scores, int64_t n, int64_t k) {
  if (n < 0 || n > int64_t{std::numeric_limits<uint32_t>::max()})
    fail(ErrorCode::kInvalidArgument, "top_k: n is ", n, ", must be in [0, 2^32)");
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0) return {};
  if (scores == nullptr) fail(ErrorCode::kInvalidArgument, "top_k: scores is null for n = ", n);

  std::vector<uint32_t> ranks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ranks[size_t(i)] = rank_key(scores[i]);
  uint32_t bound = std::numeric_limits<uint32_t>::max();  // every key passes
  const int64_t chunk = n / k;
  if (chunk >= kMinChunk) {
    bound = 0;
    for (int64_t c = 0; c < k; ++c) {
      uint32_t best = std::numeric_limits<uint32_t>::max();
      for (int64_t i = c * chunk; i < (c + 1) * chunk; ++i) best = std::min(best, ranks[size_t(i)]);
      bound = std::max(bound, best);
    }
  }
  // (rank key, index) packed in 64 bits: distinct, and their order is the
  // rank order with ties broken by the lower index. The k smallest are kept.
  std::vector<uint64_t> kept(static_cast<size_t>(n));
  size_t passed = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept[passed] = (uint64_t{ranks[size_t(i)]} << 32) | uint64_t(i);
    passed += ranks[size_t(i)] <= bound ? 1 : 0;
  }
  kept.resize(passed);  // >= k: each chunk's best passes
  if (size_t(k) < passed) std::nth_element(kept.begin(), kept.begin() + (k - 1), kept.end());
  kept.resize(size_t(k));
  std::sort(kept.begin(), kept.end());

  std::vector<int64_t> indices(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) indices[size_t(i)] = int64_t(kept[size_t(i)] & 0xFFFFFFFFu);
  return indices;
}

int64_t blocks_for_token_budget(int64_t token_budget, int block_size) {
  if (block_size < 1)
    fail(ErrorCode::kInvalidArgument, "blocks_for_token_budget: block_size is ", block_size, ", must be >= 1");
  if (token_budget < 0)
    fail(ErrorCode::kInvalidArgument, "blocks_for_token_budget: token budget is ", token_budget, ", must be >= 0");
  return token_budget / block_size;
}

Selection build_selection(const Partition& partition, int block_size, int n_kv_heads,
                          const std::vector<std::vector<int64_t>>& chosen, bool include_local) {
  check_partition(partition, block_size, "build_selection");
  if (n_kv_heads < 1) fail(ErrorCode::kInvalidArgument, "build_selection: n_kv_heads is ", n_kv_heads, ", must be >= 1");
  if (chosen.size() != 1 && chosen.size() != size_t(n_kv_heads))
    fail(ErrorCode::kInvalidArgument, "build_selection: ", chosen.size(), " lists of chosen blocks for ", n_kv_heads,
         " kv heads (need 1, shared by all heads, or one per head)");
  Selection selection;
  if (chosen.size() == 1) {
    selection.spans.assign(size_t(n_kv_heads), spans_of_head(partition, block_size, chosen[0], 0, include_local));
  } else {
    selection.spans.reserve(size_t(n_kv_heads));
    for (size_t h = 0; h < chosen.size(); ++h)
      selection.spans.push_back(spans_of_head(partition, block_size, chosen[h], h, include_local));
  }
  return selection;
}

Selection select_all(const KVStore& store, int layer, bool include_local) {
  const int n_kv_heads = store.layout().shape.n_kv_heads;
  if (layer < 0 || layer >= store.layout().shape.n_layers)
    fail(ErrorCode::kInvalidArgument, "select_all: layer ", layer, " out of range [0, ", store.layout().shape.n_layers,
         ")");
  const Partition part = store.partition(layer);
  // initial + context is [0, local_begin); the local window continues it.
  const int64_t end = include_local ? part.n_tokens : part.local_begin;
  Selection selection;
  selection.spans.assign(size_t(n_kv_heads), {});
  if (end > 0) {
    for (auto& spans : selection.spans) spans.push_back({0, end});
  }
  return selection;
}

}  // namespace longctx::cpu
