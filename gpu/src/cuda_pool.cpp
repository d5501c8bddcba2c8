// MemoryPool: budgeted device / pinned host allocations with a free list (cuda_pool.h).
#include "cuda_pool.h"

#include <cuda_runtime.h>

#include "longctx/core/error.h"

namespace longctx::gpu::detail {
namespace {

constexpr size_t kGranule = 512;  // allocation sizes are rounded up to this

size_t round_up(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

}  // namespace

PoolBlock& PoolBlock::operator=(PoolBlock&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    capacity_ = other.capacity_;
    other.ptr_ = nullptr;
    other.bytes_ = other.capacity_ = 0;
  }
  return *this;
}

void PoolBlock::reset() {
  if (pool_ && ptr_ != nullptr) pool_->give_back(ptr_, capacity_);
  pool_.reset();
  ptr_ = nullptr;
  bytes_ = capacity_ = 0;
}

std::shared_ptr<MemoryPool> MemoryPool::create(Kind kind, int device, uint64_t budget,
                                               std::vector<cudaStream_t> streams) {
  return std::shared_ptr<MemoryPool>(new MemoryPool(kind, device, budget, std::move(streams)));
}

MemoryPool::~MemoryPool() {
  // Every block is back (each holds a reference); free the list. Errors are
  // ignored: at process exit the CUDA runtime may already be gone.
  for (auto& [capacity, freed] : free_) {
    raw_free(freed.ptr);
    for (cudaEvent_t e : freed.fences) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
}

uint64_t MemoryPool::in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

uint64_t MemoryPool::cached() const {
  std::lock_guard lock(mutex_);
  return cached_;
}

void* MemoryPool::raw_alloc(size_t bytes) {
  if (cudaSetDevice(device_) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  void* ptr = nullptr;
  const cudaError_t status =
      kind_ == Kind::kDevice ? cudaMalloc(&ptr, bytes) : cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for the next call
    return nullptr;
  }
  return ptr;
}

void MemoryPool::raw_free(void* ptr) {
  cudaSetDevice(device_);
  if (kind_ == Kind::kDevice)
    cudaFree(ptr);
  else
    cudaFreeHost(ptr);
  cudaGetLastError();
}

void MemoryPool::release_cached_locked() {
  if (free_.empty()) return;
  // Blocks in the free list may still be read by queued work (see the header).
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (auto& [capacity, freed] : free_) {
    raw_free(freed.ptr);
    spare_events_.insert(spare_events_.end(), freed.fences.begin(), freed.fences.end());
  }
  free_.clear();
  cached_ = 0;
}

void MemoryPool::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

PoolBlock MemoryPool::alloc(size_t bytes, const std::string& what) {
  PoolBlock block;
  if (bytes == 0) return block;
  if (bytes > SIZE_MAX - kGranule)
    fail(ErrorCode::kOutOfMemory, what, ": ", bytes, " bytes overflow the address space");
  const size_t capacity = round_up(bytes);
  std::lock_guard lock(mutex_);
  // A free block of about this size (at most 1/4 larger).
  auto it = free_.lower_bound(capacity);
  if (it != free_.end() && it->first - capacity <= capacity / 4) {
    // Work queued before the free may still use it: wait for it (usually long done).
    cudaSetDevice(device_);
    for (cudaEvent_t e : it->second.fences) {
      const cudaError_t status = cudaEventSynchronize(e);
      if (status != cudaSuccess)
        fail(ErrorCode::kInternal, what, ": waiting for earlier work on a reused ", name(),
             " block: ", cudaGetErrorString(status));
    }
    block.capacity_ = it->first;
    block.ptr_ = it->second.ptr;
    spare_events_.insert(spare_events_.end(), it->second.fences.begin(), it->second.fences.end());
    free_.erase(it);
    cached_ -= block.capacity_;
  } else {
    const auto fits = [&] { return capacity <= budget_ && in_use_ + cached_ <= budget_ - capacity; };
    if (!fits()) release_cached_locked();
    if (!fits()) {
      const uint64_t available = budget_ > in_use_ ? budget_ - in_use_ : 0;
      fail(ErrorCode::kOutOfMemory, what, ": needs ", format_bytes(bytes), " (", bytes, " bytes) of ", name(),
           " memory but only ", format_bytes(available), " (", available, " bytes) of the budget of ",
           format_bytes(budget_), " are available");
    }
    void* ptr = raw_alloc(capacity);
    if (ptr == nullptr && !free_.empty()) {
      release_cached_locked();
      ptr = raw_alloc(capacity);
    }
    if (ptr == nullptr) {
      fail(ErrorCode::kOutOfMemory, what, ": CUDA refused ", format_bytes(capacity), " (", capacity, " bytes) of ",
           name(), " memory (", format_bytes(in_use_), " of the budget of ", format_bytes(budget_),
           " in use by longctx)");
    }
    block.ptr_ = ptr;
    block.capacity_ = capacity;
  }
  in_use_ += block.capacity_;
  block.bytes_ = bytes;
  block.pool_ = shared_from_this();
  return block;
}

void MemoryPool::give_back(void* ptr, size_t capacity) {
  std::lock_guard lock(mutex_);
  in_use_ -= capacity;
  Freed freed{ptr, {}};
  cudaSetDevice(device_);
  for (cudaStream_t stream : streams_) {
    cudaEvent_t e = nullptr;
    if (!spare_events_.empty()) {
      e = spare_events_.back();
      spare_events_.pop_back();
    } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      e = nullptr;
    }
    if (e == nullptr || cudaEventRecord(e, stream) != cudaSuccess) {
      // No fence (a broken context): do not reuse this block, free it after the device is idle.
      cudaGetLastError();
      if (e != nullptr) spare_events_.push_back(e);
      for (cudaEvent_t f : freed.fences) spare_events_.push_back(f);
      cudaDeviceSynchronize();
      raw_free(ptr);
      return;
    }
    freed.fences.push_back(e);
  }
  free_.emplace(capacity, std::move(freed));
  cached_ += capacity;
}

}  // namespace longctx::gpu::detail
