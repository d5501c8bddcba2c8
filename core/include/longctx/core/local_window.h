// The local window of a layer holding n tokens: its last `window` tokens
// except the first `initial_len` (the sinks, attended with the context):
// [local_window_begin(n, initial_len, window), n), empty while n <= initial_len.
// The one definition of the range the KV store's Partition leaves to the
// window, the device ring attends and the scheduler checks them against.
#pragma once

#include <algorithm>
#include <cstdint>

namespace longctx {

inline int64_t local_window_begin(int64_t n_tokens, int64_t initial_len, int64_t window) {
  return std::max(std::min(initial_len, n_tokens), n_tokens - window);
}

}  // namespace longctx
