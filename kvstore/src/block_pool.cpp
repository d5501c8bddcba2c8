#include "longctx/kvstore/block_pool.h"

#include <hwloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>

#include "longctx/core/error.h"

namespace longctx::kvstore {

namespace {

constexpr size_t kPageAlign = 64;  // a cache line: vector loads never split a line

size_t rounded_page_bytes(size_t page_bytes) {
  if (page_bytes == 0) fail(ErrorCode::kInvalidArgument, "BlockPool: page_bytes is 0");
  // Leaves room to round up to a multiple of kSlabBytes below without wrapping.
  if (page_bytes > (size_t{1} << 48)) {
    fail(ErrorCode::kInvalidArgument, "BlockPool: page_bytes ", page_bytes, " is absurdly large");
  }
  return (page_bytes + kPageAlign - 1) / kPageAlign * kPageAlign;
}

// A page never straddles two slabs: a slab holds at least one whole page.
size_t slab_bytes_of(size_t rounded_page) {
  const size_t whole = (rounded_page + kSlabBytes - 1) / kSlabBytes * kSlabBytes;
  return whole > kSlabBytes ? whole : kSlabBytes;
}

size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

BlockPool::BlockPool(const NumaTopology& topology, int node, size_t page_bytes, MemoryBudget& budget,
                     bool bind_memory)
    : topology_(topology),
      node_(node),
      page_bytes_(rounded_page_bytes(page_bytes)),
      slab_bytes_(slab_bytes_of(page_bytes_)),
      pages_per_slab_(slab_bytes_ / page_bytes_),
      // One node: nothing to choose between. Synthetic: hwloc cannot bind.
      bind_(bind_memory && topology.is_this_system() && topology.node_count() > 1),
      budget_(budget) {
  if (node < 0 || node >= topology.node_count()) {
    fail(ErrorCode::kInvalidArgument, "BlockPool: NUMA node ", node, " does not exist (the topology has ",
         topology.node_count(), " nodes)");
  }
}

BlockPool::~BlockPool() {
  for (const Slab& slab : slabs_) munmap(slab.base, slab.bytes);
  try {
    budget_.release(uint64_t{slabs_.size()} * slab_bytes_);
  } catch (const Error& error) {
    // A destructor must not throw; this only happens if someone else broke the budget.
    std::fprintf(stderr, "longctx: BlockPool on NUMA node %d: %s\n", node_, error.what());
  }
}

uint64_t BlockPool::slab_bytes_for(size_t n_pages, size_t page_bytes) {
  const size_t page = rounded_page_bytes(page_bytes);
  const size_t slab = slab_bytes_of(page);
  const uint64_t slabs = ceil_div(n_pages, slab / page);
  if (slabs > std::numeric_limits<uint64_t>::max() / slab) {
    fail(ErrorCode::kInvalidArgument, "BlockPool: ", n_pages, " pages of ", page_bytes,
         " bytes do not fit in 64-bit memory");
  }
  return slabs * slab;
}

BlockPool::Slab BlockPool::map_slab() {
  // Map 2 MiB more than needed so that a 2 MiB-aligned start exists inside,
  // then give back the unaligned head and the tail.
  const size_t map_bytes = slab_bytes_ + kSlabBytes;
  void* raw = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    fail(ErrorCode::kOutOfMemory, "BlockPool on NUMA node ", node_, ": mmap of ",
         format_bytes(map_bytes), " (", map_bytes, " bytes) failed: ", std::strerror(errno));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kSlabBytes - 1) / kSlabBytes * kSlabBytes;
  const size_t head = aligned - start;
  const size_t tail = map_bytes - head - slab_bytes_;
  if (head != 0) munmap(raw, head);
  if (tail != 0) munmap(reinterpret_cast<void*>(aligned + slab_bytes_), tail);

  auto* base = reinterpret_cast<std::byte*>(aligned);
  // Transparent huge pages halve TLB misses of the scans; a kernel without them is fine.
  (void)madvise(base, slab_bytes_, MADV_HUGEPAGE);

  bool bound = false;
  if (bind_) {
    auto topology = static_cast<hwloc_topology_t>(topology_.hwloc_handle());
    const hwloc_obj_t numa = hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(node_));
    // Nothing is touched yet, so the first fault of every page lands on the node.
    bound = numa != nullptr &&
            hwloc_set_area_membind(topology, base, slab_bytes_, numa->nodeset, HWLOC_MEMBIND_BIND,
                                   HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) == 0;
    if (!bound && !bind_failure_logged_) {
      bind_failure_logged_ = true;
      std::fprintf(stderr,
                   "longctx: warning: could not bind KV memory to NUMA node %d (%s); the OS "
                   "places it instead, which may cost bandwidth\n",
                   node_, std::strerror(errno));
    }
  }
  return Slab{base, slab_bytes_, bound};
}

void BlockPool::grow(size_t count, size_t pages_wanted) {
  if (count > std::numeric_limits<uint64_t>::max() / slab_bytes_) {
    fail(ErrorCode::kOutOfMemory, "KV pool on NUMA node ", node_, ": ", pages_wanted, " pages of ",
         page_bytes_, " bytes do not fit in 64-bit memory");
  }
  const uint64_t bytes = uint64_t{count} * slab_bytes_;
  budget_.reserve(bytes, str_cat("KV pool on NUMA node ", node_, ": ", count,
                                 count == 1 ? " new slab of " : " new slabs of ",
                                 format_bytes(slab_bytes_), " for ", pages_wanted, " pages of ",
                                 page_bytes_, " bytes"));
  const size_t old_slabs = slabs_.size();
  try {
    slabs_.reserve(old_slabs + count);
    for (size_t i = 0; i < count; ++i) {
      slabs_.push_back(map_slab());  // no reallocation: capacity reserved
      slab_of_base_.emplace(reinterpret_cast<uintptr_t>(slabs_.back().base), slabs_.size() - 1);
    }
    page_in_use_.resize(slabs_.size() * pages_per_slab_, 0);
  } catch (...) {
    // Back to exactly the state before: no new slab, no new budget.
    const size_t never_mapped = old_slabs + count - slabs_.size();
    drop_slabs_from(old_slabs);
    budget_.release(uint64_t{never_mapped} * slab_bytes_);
    throw;
  }
}

void BlockPool::drop_slabs_from(size_t first) {
  for (size_t i = first; i < slabs_.size(); ++i) {
    slab_of_base_.erase(reinterpret_cast<uintptr_t>(slabs_[i].base));
    munmap(slabs_[i].base, slabs_[i].bytes);
  }
  budget_.release(uint64_t{slabs_.size() - first} * slab_bytes_);
  slabs_.resize(first);
  page_in_use_.resize(first * pages_per_slab_);
}

std::byte* BlockPool::page_address(size_t index) const {
  return slabs_[index / pages_per_slab_].base + (index % pages_per_slab_) * page_bytes_;
}

size_t BlockPool::page_index_of(const std::byte* page) const {
  const uintptr_t address = reinterpret_cast<uintptr_t>(page);
  auto next = slab_of_base_.upper_bound(address);
  const size_t usable = pages_per_slab_ * page_bytes_;
  if (next == slab_of_base_.begin() || address - std::prev(next)->first >= usable) {
    fail(ErrorCode::kInvalidArgument, "BlockPool on NUMA node ", node_, ": pointer ",
         static_cast<const void*>(page), " is not a page of this pool");
  }
  const auto& [base, slab] = *std::prev(next);
  const size_t offset = address - base;
  if (offset % page_bytes_ != 0) {
    fail(ErrorCode::kInvalidArgument, "BlockPool on NUMA node ", node_, ": pointer ",
         static_cast<const void*>(page), " is ", offset % page_bytes_, " bytes into a page of ",
         page_bytes_, " bytes, not at its start");
  }
  return slab * pages_per_slab_ + offset / page_bytes_;
}

std::vector<std::byte*> BlockPool::allocate(size_t n, bool zero) {
  std::vector<std::byte*> pages;
  size_t reused = 0;  // pages[0, reused) come from the free list and need zeroing
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t fresh_left = slabs_.size() * pages_per_slab_ - next_fresh_page_;
    const size_t have = free_pages_.size() + fresh_left;
    const size_t old_slabs = slabs_.size();
    // The budget check comes first: it turns an absurd n into a clear error.
    if (n > have) grow(ceil_div(n - have, pages_per_slab_), n);
    try {
      pages.reserve(n);
    } catch (...) {
      drop_slabs_from(old_slabs);
      throw;
    }
    // From here on nothing can throw.
    reused = n < free_pages_.size() ? n : free_pages_.size();
    for (size_t i = 0; i < reused; ++i) {
      const size_t index = free_pages_.back();
      free_pages_.pop_back();
      page_in_use_[index] = 1;
      pages.push_back(page_address(index));
    }
    for (size_t i = reused; i < n; ++i) {
      const size_t index = next_fresh_page_++;
      page_in_use_[index] = 1;
      pages.push_back(page_address(index));
    }
    pages_in_use_ += n;
  }
  // The pages are the caller's now; zero them without holding the lock.
  // Fresh pages come straight from mmap and are already zero.
  if (zero)
    for (size_t i = 0; i < reused; ++i) std::memset(pages[i], 0, page_bytes_);
  return pages;
}

void BlockPool::release(const std::vector<std::byte*>& pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_pages_.reserve(free_pages_.size() + pages.size());
  std::vector<size_t> indices;
  indices.reserve(pages.size());
  try {
    for (const std::byte* page : pages) {
      const size_t index = page_index_of(page);
      if (page_in_use_[index] == 0) {
        fail(ErrorCode::kInvalidArgument, "BlockPool on NUMA node ", node_, ": page ",
             static_cast<const void*>(page), " is not in use (released twice?)");
      }
      page_in_use_[index] = 0;  // also catches a page listed twice in `pages`
      indices.push_back(index);
    }
  } catch (...) {
    for (const size_t index : indices) page_in_use_[index] = 1;
    throw;
  }
  free_pages_.insert(free_pages_.end(), indices.begin(), indices.end());
  pages_in_use_ -= indices.size();
}

size_t BlockPool::slab_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slabs_.size();
}

size_t BlockPool::pages_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pages_in_use_;
}

uint64_t BlockPool::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return uint64_t{slabs_.size()} * slab_bytes_;
}

bool BlockPool::memory_bound() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bind_ && std::all_of(slabs_.begin(), slabs_.end(), [](const Slab& slab) { return slab.bound; });
}

}  // namespace longctx::kvstore
