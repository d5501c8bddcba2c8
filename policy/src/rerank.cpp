// Token rerank (rerank.h).
#include "longctx/policy/rerank.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/kvstore/node_executor.h"
#include "token_scores.h"

namespace longctx::policy {

cpu::Selection rerank_tokens(const kvstore::KVStore& store, int layer, const TensorView& q,
                             const cpu::Selection& candidates, int64_t keep, Reduce gqa_reduce) {
  cpu::check_decode_query(store, layer, q, "rerank_tokens");
  const kvstore::StoreLayout& L = store.layout();
  const int n_kv = L.shape.n_kv_heads, bs = L.block_size;
  if (int(candidates.spans.size()) != n_kv)
    fail(ErrorCode::kInvalidArgument, "rerank_tokens: a selection for ", candidates.spans.size(),
         " kv heads, the store has ", n_kv);
  if (keep < 0) fail(ErrorCode::kInvalidArgument, "rerank_tokens: keep ", keep, " < 0");
  if (gqa_reduce != Reduce::kSum && gqa_reduce != Reduce::kMax)
    fail(ErrorCode::kInvalidArgument, "rerank_tokens: gqa_reduce is ", reduce_name(gqa_reduce),
         ", must be sum or max");
  const int group = int(q.shape[0]) / n_kv;
  const kvstore::Partition part = store.partition(layer);
  // Only the tokens of ranked blocks are candidates; the others are always attended (build_selection).
  const int64_t ranked_begin = part.ranked_begin(bs), ranked_end = part.ranked_end(bs);
  cpu::Selection out;
  out.spans.resize(size_t(n_kv));
  kvstore::parallel_for_heads(store, n_kv, [](int64_t h) { return int(h); }, [&](int64_t item) {
    const int h = int(item);
    const detail::GroupQuery gq = detail::group_query(q, h, group, gqa_reduce);
    // Candidate tokens [ranked_begin, ranked_end) of the spans, scored block by block.
    std::vector<std::pair<float, int64_t>> scored;  // (-score, token): sorting ascending puts the best first
    std::vector<float> keys, scores;
    for (const cpu::TokenSpan& span : candidates.spans[size_t(h)]) {
      const int64_t begin = std::max(span.begin, ranked_begin), end = std::min(span.end, ranked_end);
      scores.clear();
      detail::score_token_range(store, layer, h, gq, begin, end, keys, scores);
      for (size_t i = 0; i < scores.size(); ++i) scored.emplace_back(-scores[i], begin + int64_t(i));
    }
    if (int64_t(scored.size()) > keep) {
      std::nth_element(scored.begin(), scored.begin() + keep, scored.end());
      scored.resize(size_t(keep));
    }
    std::vector<int64_t> kept;
    kept.reserve(scored.size());
    for (const auto& [neg_score, t] : scored) kept.push_back(t);
    std::sort(kept.begin(), kept.end());

    // The spans: the tokens before the ranked blocks, the kept tokens, the tokens after them.
    std::vector<cpu::TokenSpan>& spans = out.spans[size_t(h)];
    const auto add = [&spans](int64_t b, int64_t e) {
      if (b >= e) return;
      if (!spans.empty() && spans.back().end == b) spans.back().end = e;
      else spans.push_back({b, e});
    };
    for (const cpu::TokenSpan& span : candidates.spans[size_t(h)]) add(span.begin, std::min(span.end, ranked_begin));
    for (int64_t t : kept) add(t, t + 1);
    for (const cpu::TokenSpan& span : candidates.spans[size_t(h)])
      add(std::max(span.begin, ranked_end), span.end);
  });
  return out;
}

}  // namespace longctx::policy
