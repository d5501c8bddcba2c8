#include "longctx/gpu/device_memory.h"

#include <algorithm>

#include "cuda_check.h"

namespace longctx::gpu {

DeviceMemory::DeviceMemory(size_t bytes) : bytes_(bytes) {
  if (cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError();  // reset the error state: later calls must not report this failure
    fail(ErrorCode::kOutOfMemory, "DeviceMemory: cudaMalloc of ", bytes, " bytes failed");
  }
}

DeviceMemory::~DeviceMemory() { cudaFree(ptr_); }

void DeviceMemory::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) fail(ErrorCode::kInvalidArgument, "DeviceMemory::upload: ", bytes, " bytes into ", bytes_);
  cuda_check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "DeviceMemory::upload: cudaMemcpy");
}

void DeviceMemory::fill_bytes(int value) {
  cuda_check(cudaMemset(ptr_, value, bytes_), "DeviceMemory::fill_bytes: cudaMemset");
}

void copy_device_to_device(void* dst, const void* src, size_t bytes) {
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy_device_to_device: cudaMemcpy");
}

void synchronize_device() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

std::vector<double> time_device(int reps, int inner, const std::function<void()>& fn) {
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda_check(cudaEventCreate(&start), "time_device: cudaEventCreate");
  std::vector<double> seconds;
  try {
    cuda_check(cudaEventCreate(&stop), "time_device: cudaEventCreate");
    fn();  // warm-up
    synchronize_device();
    for (int r = 0; r < reps; ++r) {
      cuda_check(cudaEventRecord(start), "time_device: cudaEventRecord");
      for (int i = 0; i < inner; ++i) fn();
      cuda_check(cudaEventRecord(stop), "time_device: cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop), "time_device: cudaEventSynchronize");
      float ms = 0.f;
      cuda_check(cudaEventElapsedTime(&ms, start, stop), "time_device: cudaEventElapsedTime");
      seconds.push_back(1e-3 * ms / inner);
    }
  } catch (...) {
    cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return seconds;
}

}  // namespace longctx::gpu
