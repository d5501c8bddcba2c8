// The Backend an application runs on, as config key model.backend says:
// cpu, cuda, or auto (cuda when this build has CUDA and a GPU is present,
// else cpu); a CPU backend keeps the weights as model.weights says.
#pragma once

#include <memory>
#include <string>

#include "longctx/core/backend.h"
#include "longctx/core/config.h"

namespace longctx::apps {

struct ChosenBackend {
  std::unique_ptr<Backend> backend;
  std::string description;  // "cpu" or "cuda (NVIDIA H100, device 0)"; with auto, why cpu
};

// Throws Error(kUnsupported) for "cuda" without CUDA or a GPU (the reason
// from gpu::list_devices), Error(kConfig) for another name.
ChosenBackend choose_backend(const ModelConfig& model);

}  // namespace longctx::apps
