// Budgeted memory pools of the CUDA backend (private to gpu/src): device
// memory (cudaMalloc) and pinned host memory (cudaHostAlloc). Every byte a
// pool holds, handed out or kept for reuse, counts against its budget.
//
// Freed blocks are kept in a free list and handed out again for a request of
// about the same size (within 1/4), so the per-call tensors of a forward pass
// do not cudaMalloc/cudaFree (which synchronize) every step. Stream-aware: a
// freed block carries an event recorded at the free on each of the streams
// the pool was made with (the backend's compute and copy streams), and is
// handed out again only once they completed (the host waits when needed), so
// work queued on any of them before the free is done with it, whichever
// stream or host code the next user writes from. When a request does not fit the budget (or
// cudaMalloc fails), the free list is released (after a device
// synchronization) and the request is tried once more; then it throws
// Error(kOutOfMemory) naming the bytes asked and available, and the pool is
// as it was (apart from the released free list).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace longctx::gpu::detail {

class MemoryPool;

// One allocation; returns its bytes to the pool when destroyed. Move-only.
class PoolBlock {
 public:
  PoolBlock() = default;
  ~PoolBlock() { reset(); }
  PoolBlock(PoolBlock&& other) noexcept { *this = std::move(other); }
  PoolBlock& operator=(PoolBlock&& other) noexcept;
  PoolBlock(const PoolBlock&) = delete;
  PoolBlock& operator=(const PoolBlock&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }  // as asked (the block may be larger)
  void reset();

 private:
  friend class MemoryPool;
  std::shared_ptr<MemoryPool> pool_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;     // as asked
  size_t capacity_ = 0;  // as allocated
};

class MemoryPool : public std::enable_shared_from_this<MemoryPool> {
 public:
  enum class Kind : uint8_t { kDevice, kPinned };

  // `device` is made current around every CUDA call; budget 0 = nothing fits;
  // `streams`: where queued work may use the blocks (they outlive the pool).
  static std::shared_ptr<MemoryPool> create(Kind kind, int device, uint64_t budget,
                                            std::vector<cudaStream_t> streams);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of at least `bytes` (256-byte aligned; bytes 0 = an empty block).
  // `what` names the request in the error ("CudaBackend::alloc: f32[4, 8]").
  PoolBlock alloc(size_t bytes, const std::string& what);

  uint64_t budget() const { return budget_; }
  uint64_t in_use() const;  // bytes of blocks handed out
  uint64_t cached() const;  // bytes kept in the free list
  // Frees the free list (synchronizes the device first).
  void release_cached();

 private:
  MemoryPool(Kind kind, int device, uint64_t budget, std::vector<cudaStream_t> streams)
      : kind_(kind), device_(device), budget_(budget), streams_(std::move(streams)) {}
  // A free block: its memory and one event per stream, recorded when it was freed.
  struct Freed {
    void* ptr = nullptr;
    std::vector<cudaEvent_t> fences;
  };
  void give_back(void* ptr, size_t capacity);
  void release_cached_locked();
  void* raw_alloc(size_t bytes);  // nullptr on failure
  void raw_free(void* ptr);
  const char* name() const { return kind_ == Kind::kDevice ? "device" : "pinned host"; }

  friend class PoolBlock;
  const Kind kind_;
  const int device_;
  const uint64_t budget_;
  const std::vector<cudaStream_t> streams_;
  mutable std::mutex mutex_;
  std::multimap<size_t, Freed> free_;  // capacity -> block
  std::vector<cudaEvent_t> spare_events_;  // fences of blocks handed out again, for reuse
  uint64_t in_use_ = 0;
  uint64_t cached_ = 0;
};

}  // namespace longctx::gpu::detail
