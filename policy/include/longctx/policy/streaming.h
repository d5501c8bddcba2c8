// StreamingLLM baseline (Xiao et al., 2024): every head attends the first
// n_sinks tokens (attention sinks) and the last n_recent tokens, nothing in
// between. Keys are stored after RoPE and keep their positions (no
// re-indexing), so this is the attention pattern of the paper's variant
// that caches keys after rotation.
#pragma once

#include <cstdint>

#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

// [0, min(n_sinks, n_tokens)) and [max(0, n_tokens - n_recent), n_tokens),
// merged when they touch; the same spans for every kv head. Throws
// Error(kInvalidArgument) for a negative count or n_kv_heads < 1.
cpu::Selection streaming_selection(int64_t n_tokens, int64_t n_sinks, int64_t n_recent, int n_kv_heads);

// The same for `layer` of the store, with the config's initial_len sinks and
// local_windows_len recent tokens (the store's partition). include_local =
// false leaves the recent window out (the device attends it): sinks only.
cpu::Selection streaming_selection(const kvstore::KVStore& store, int layer, bool include_local);

}  // namespace longctx::policy
