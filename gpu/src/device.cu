#include "longctx/gpu/device.h"

#include <cuda_runtime.h>

namespace longctx::gpu {

bool built_with_cuda() { return true; }

std::vector<DeviceInfo> list_devices(std::string* why_none) {
  std::vector<DeviceInfo> devices;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    // Without a driver the runtime says "driver version is insufficient",
    // which reads like an outdated driver: a driver version of 0 means none.
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (why_none) {
      if (driver == 0 || status == cudaErrorNoDevice)
        *why_none = "no NVIDIA driver/GPU found";
      else if (status == cudaErrorInsufficientDriver)
        *why_none = "the NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
                    std::to_string(driver % 1000 / 10) + ", older than this build's runtime " +
                    std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
      else
        *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    }
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.sm_major = prop.major;
    info.sm_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.memory_bytes = prop.totalGlobalMem;
    devices.push_back(info);
  }
  if (devices.empty() && why_none) *why_none = "no NVIDIA driver/GPU found";
  return devices;
}

}  // namespace longctx::gpu
