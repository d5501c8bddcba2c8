// Memory for data streamed in bulk (weights, the read-bandwidth probe): a
// 2 MiB boundary and transparent huge pages, since streaming gigabytes
// through 4 KiB pages costs a TLB miss every 4 KiB.
#pragma once

#include <cstddef>

namespace longctx {

constexpr size_t kHugePageBytes = size_t(2) << 20;

// `bytes` from a 2 MiB boundary, advised MADV_HUGEPAGE (advice only: without
// transparent huge pages they stay on 4 KiB pages); nullptr when no memory is
// left. Freed with std::free.
void* allocate_on_huge_pages(size_t bytes);

}  // namespace longctx
