// The CUDA backend in a build without CUDA: refuses clearly.
#include "longctx/core/error.h"
#include "longctx/gpu/cuda_backend.h"

namespace longctx::gpu {

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  fail(ErrorCode::kUnsupported,
       "make_cuda_backend: this longctx was built without CUDA (LONGCTX_CUDA=OFF or nvcc not found); "
       "rebuild with -DLONGCTX_CUDA=ON or use the CPU backend");
}

}  // namespace longctx::gpu
