// gpu/device_memory.h in a build without CUDA: every call refuses clearly.
#include "longctx/core/error.h"
#include "longctx/gpu/device_memory.h"

namespace longctx::gpu {
namespace {
[[noreturn]] void unsupported(const char* what) {
  fail(ErrorCode::kUnsupported, what, ": this longctx was built without CUDA");
}
}  // namespace

DeviceMemory::DeviceMemory(size_t) { unsupported("DeviceMemory"); }
DeviceMemory::~DeviceMemory() = default;
void DeviceMemory::upload(const void*, size_t) { unsupported("DeviceMemory::upload"); }
void DeviceMemory::fill_bytes(int) { unsupported("DeviceMemory::fill_bytes"); }
void copy_device_to_device(void*, const void*, size_t) { unsupported("copy_device_to_device"); }
void synchronize_device() { unsupported("synchronize_device"); }
std::vector<double> time_device(int, int, const std::function<void()>&) { unsupported("time_device"); }

}  // namespace longctx::gpu
