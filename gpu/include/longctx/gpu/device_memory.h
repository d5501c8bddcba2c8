// Plain device memory and event timing for tools and benchmarks that drive
// the kernels of gpu/attention.h directly (the CUDA backend has its own
// budgeted pools). Work is on the default stream. No CUDA header: in a build
// without CUDA every function throws Error(kUnsupported).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace longctx::gpu {

class DeviceMemory {
 public:
  // Error(kOutOfMemory) when cudaMalloc fails.
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // Synchronous copy of `bytes` host bytes to the start of this memory.
  void upload(const void* host, size_t bytes);
  // Sets every byte to `value`.
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Synchronous device-to-device copy.
void copy_device_to_device(void* dst, const void* src, size_t bytes);
// Waits for all work on the device.
void synchronize_device();
// Seconds of each of `reps` runs of fn (each run = `inner` calls), measured
// with CUDA events on the default stream after one warm-up call.
std::vector<double> time_device(int reps, int inner, const std::function<void()>& fn);

}  // namespace longctx::gpu
