// Turns CUDA runtime errors into longctx::Error (private to gpu/).
#pragma once

#include <cuda_runtime.h>

#include "longctx/core/error.h"

namespace longctx::gpu {

inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(ErrorCode::kInternal, what, ": ", cudaGetErrorString(status));
}

}  // namespace longctx::gpu
