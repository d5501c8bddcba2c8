// Fixed-size pages carved from large slabs of DRAM on one NUMA node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"

namespace longctx::kvstore {

constexpr size_t kSlabBytes = size_t{2} << 20;  // 2 MiB: one transparent huge page

// A pool of pages of `page_bytes` (rounded up to 64 bytes) for one NUMA node.
// Slabs are 2 MiB-aligned multiples of 2 MiB, advised MADV_HUGEPAGE, bound to
// the node with hwloc when the topology is this system, and counted against
// the budget from the moment they are mapped until the pool is destroyed.
// Pages are zero-filled when handed out, unless the caller will overwrite
// every byte and says so (zero = false). Thread-safe.
class BlockPool {
 public:
  // bind_memory = false leaves placement to the OS (numa policy 'none'). Binding
  // is only attempted on this system with more than one NUMA node.
  // Throws Error(kInvalidArgument) for a node that does not exist or page_bytes 0.
  BlockPool(const NumaTopology& topology, int node, size_t page_bytes, MemoryBudget& budget,
            bool bind_memory = true);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();

  // Hands out n pages, or throws (Error kOutOfMemory) leaving pool and budget unchanged.
  std::vector<std::byte*> allocate(size_t n, bool zero = true);
  // Returns pages to the free list (the slab stays mapped and counted). A
  // pointer that is not a page of this pool in use throws Error(kInvalidArgument)
  // and nothing is released.
  void release(const std::vector<std::byte*>& pages);

  // Bytes of slabs needed to hold n pages of `page_bytes` (for preflight).
  static uint64_t slab_bytes_for(size_t n_pages, size_t page_bytes);

  int node() const { return node_; }
  size_t page_bytes() const { return page_bytes_; }
  size_t pages_per_slab() const { return pages_per_slab_; }
  size_t slab_count() const;
  size_t pages_in_use() const;
  uint64_t reserved_bytes() const;  // slabs mapped, as counted in the budget
  // Binding is attempted (see the constructor) and took effect for every slab
  // so far; false when binding is not attempted. A failed bind is no error: it
  // is logged to stderr once per pool and the memory stays where the OS put it.
  bool memory_bound() const;

 private:
  struct Slab {
    std::byte* base;
    size_t bytes;
    bool bound;  // hwloc binding took effect
  };
  // Maps one slab (2 MiB-aligned, advised, bound if wanted); its budget is
  // already reserved by the caller. Throws Error(kOutOfMemory) if mmap fails.
  Slab map_slab();
  // Adds `count` slabs, all or none (budget reserved first). Caller holds mutex_.
  void grow(size_t count, size_t pages_wanted);
  // Unmaps slabs [first, end) and releases their budget (undoing grow). Caller holds mutex_.
  void drop_slabs_from(size_t first);
  // Global index (slab * pages_per_slab + i) of a page start of this pool;
  // throws Error(kInvalidArgument) for any other pointer.
  size_t page_index_of(const std::byte* page) const;
  std::byte* page_address(size_t index) const;

  const NumaTopology& topology_;
  const int node_;
  const size_t page_bytes_;
  const size_t slab_bytes_;
  const size_t pages_per_slab_;
  const bool bind_;  // binding is attempted
  MemoryBudget& budget_;
  mutable std::mutex mutex_;
  std::vector<Slab> slabs_;
  std::map<uintptr_t, size_t> slab_of_base_;  // slab start address -> index in slabs_
  std::vector<uint8_t> page_in_use_;          // by global page index
  std::vector<size_t> free_pages_;            // released pages: dirty, zeroed when handed out
  size_t next_fresh_page_ = 0;                // pages from here on were never handed out (zero)
  size_t pages_in_use_ = 0;
  bool bind_failure_logged_ = false;
};

}  // namespace longctx::kvstore
