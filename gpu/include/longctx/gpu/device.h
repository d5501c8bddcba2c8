// CUDA devices as seen by longctx. Safe to call in any build: without CUDA
// (LONGCTX_CUDA=OFF or no nvcc) or without a GPU it reports none and says why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace longctx::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int multiprocessors = 0;
  uint64_t memory_bytes = 0;
};

// True when this build contains the CUDA sources of gpu/.
bool built_with_cuda();

// The usable CUDA devices; empty when there are none. `why_none` (optional)
// receives the reason when the list is empty ("built without CUDA ...",
// "no NVIDIA driver/GPU found", a driver older than the runtime, ...).
std::vector<DeviceInfo> list_devices(std::string* why_none = nullptr);

}  // namespace longctx::gpu
