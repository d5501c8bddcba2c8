#include "longctx/core/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>

namespace longctx {

void* allocate_on_huge_pages(size_t bytes) {
  void* data = nullptr;
  if (posix_memalign(&data, kHugePageBytes, bytes) != 0) return nullptr;
  (void)madvise(data, bytes, MADV_HUGEPAGE);
  return data;
}

}  // namespace longctx
