// The CUDA backend in a build without CUDA: refuses clearly.
#include "longctx/core/error.h"
#include "longctx/gpu/cuda_backend.h"

namespace longctx::gpu {

namespace {
constexpr const char* kWithoutCuda =
    ": this longctx was built without CUDA (LONGCTX_CUDA=OFF or nvcc not found); rebuild with -DLONGCTX_CUDA=ON "
    "or use the CPU backend";
}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  fail(ErrorCode::kUnsupported, "make_cuda_backend", kWithoutCuda);
}

std::unique_ptr<BackendTensor> wrap_device_memory(Backend&, void*, std::vector<int64_t>, DType, const char*) {
  fail(ErrorCode::kUnsupported, "wrap_device_memory", kWithoutCuda);
}

void wait_for_stream(Backend&, uintptr_t) { fail(ErrorCode::kUnsupported, "wait_for_stream", kWithoutCuda); }

void join_stream(Backend&, uintptr_t) { fail(ErrorCode::kUnsupported, "join_stream", kWithoutCuda); }

}  // namespace longctx::gpu
