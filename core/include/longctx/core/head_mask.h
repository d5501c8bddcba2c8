#pragma once
// A set of kv heads given as a mask: empty = every head, else one entry per
// kv head, nonzero = the head is in the set. The heads that choose blocks
// (RazorAttention's retrieval heads, SelectSpec::choosing_heads) and the
// heads to score or sum for are passed this way.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "longctx/core/error.h"

namespace longctx {

inline bool head_in_mask(const std::vector<uint8_t>& mask, int kv_head) {
  return mask.empty() || mask[size_t(kv_head)] != 0;
}

// Throws Error(kInvalidArgument) "<who>: <what> has N entries, the store has
// M kv heads" unless the mask is empty or has one entry per kv head.
inline void check_head_mask(const std::vector<uint8_t>& mask, int n_kv_heads, const char* who, const char* what) {
  if (!mask.empty() && mask.size() != size_t(n_kv_heads))
    fail(ErrorCode::kInvalidArgument, who, ": ", what, " has ", mask.size(), " entries, the store has ", n_kv_heads,
         " kv heads");
}

}  // namespace longctx
