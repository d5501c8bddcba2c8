// StreamingLLM baseline: sinks + recent window (policy/streaming.h).
#include "longctx/policy/streaming.h"

#include <algorithm>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::policy {

using cpu::Selection;
using cpu::TokenSpan;

namespace {

// Two ranges as sorted, merged, non-empty spans.
std::vector<TokenSpan> two_ranges(TokenSpan first, TokenSpan second) {
  std::vector<TokenSpan> spans;
  for (const TokenSpan& span : {first, second}) {
    if (span.begin >= span.end) continue;
    if (!spans.empty() && span.begin <= spans.back().end) {
      spans.back().end = std::max(spans.back().end, span.end);
    } else {
      spans.push_back(span);
    }
  }
  return spans;
}

}  // namespace

Selection streaming_selection(int64_t n_tokens, int64_t n_sinks, int64_t n_recent, int n_kv_heads) {
  if (n_tokens < 0 || n_sinks < 0 || n_recent < 0 || n_kv_heads < 1) {
    fail(ErrorCode::kInvalidArgument, "streaming_selection: need n_tokens, n_sinks, n_recent >= 0 and n_kv_heads >= 1; got ",
         n_tokens, ", ", n_sinks, ", ", n_recent, ", ", n_kv_heads);
  }
  const TokenSpan sinks{0, std::min(n_sinks, n_tokens)};
  const TokenSpan recent{std::max<int64_t>(0, n_tokens - n_recent), n_tokens};
  Selection selection;
  selection.spans.assign(size_t(n_kv_heads), two_ranges(sinks, recent));
  return selection;
}

Selection streaming_selection(const kvstore::KVStore& store, int layer, bool include_local) {
  const kvstore::Partition p = store.partition(layer);
  const TokenSpan sinks{0, p.initial_end};
  const TokenSpan recent = include_local ? TokenSpan{p.local_begin, p.n_tokens} : TokenSpan{};
  Selection selection;
  selection.spans.assign(size_t(store.layout().shape.n_kv_heads), two_ranges(sinks, recent));
  return selection;
}

}  // namespace longctx::policy
