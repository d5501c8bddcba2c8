// Turns CUDA runtime errors into longctx::Error (private to gpu/).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "longctx/core/error.h"

namespace longctx::gpu {

inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(ErrorCode::kInternal, what, ": ", cudaGetErrorString(status));
}

// The current device (a cheap runtime query; no driver call).
inline int current_device(const char* what) {
  int device = 0;
  cuda_check(cudaGetDevice(&device), what);
  return device;
}

// A value per device, computed by the first caller on each device (make()
// runs with that device current; if it throws, the next caller tries again)
// and kept: attribute queries and kernel attributes done once rather than on
// every launch. Devices beyond the first 64 are asked every time.
template <typename T>
class PerDevice {
 public:
  template <typename Make>
  T get(int device, Make make) {
    if (device < 0 || device >= int(kDevices)) return make();
    Slot& slot = slots_[size_t(device)];
    std::call_once(slot.once, [&] { slot.value = make(); });
    return slot.value;
  }

 private:
  static constexpr size_t kDevices = 64;
  struct Slot {
    std::once_flag once;
    T value{};
  };
  std::array<Slot, kDevices> slots_;
};

}  // namespace longctx::gpu
