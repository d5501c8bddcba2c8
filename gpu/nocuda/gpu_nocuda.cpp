// gpu/ in a build without CUDA: reports no device, refuses GPU work clearly.
#include "longctx/core/error.h"
#include "longctx/gpu/device.h"
#include "longctx/gpu/merge.h"

namespace longctx::gpu {

bool built_with_cuda() { return false; }

std::vector<DeviceInfo> list_devices(std::string* why_none) {
  if (why_none) *why_none = "built without CUDA (LONGCTX_CUDA=OFF or nvcc not found)";
  return {};
}

void merge_attention_states(const MergeParams&, void*) {
  fail(ErrorCode::kUnsupported, "merge_attention_states: this longctx was built without CUDA");
}

void merge_attention_states_host(const MergeParams&) {
  fail(ErrorCode::kUnsupported, "merge_attention_states_host: this longctx was built without CUDA");
}

}  // namespace longctx::gpu
