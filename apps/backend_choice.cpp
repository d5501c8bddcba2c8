#include "backend_choice.h"

#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/gpu/cuda_backend.h"
#include "longctx/gpu/device.h"

namespace longctx::apps {

ChosenBackend choose_backend(const ModelConfig& model) {
  const std::string& choice = model.backend;
  if (choice != "auto" && choice != "cpu" && choice != "cuda")
    fail(ErrorCode::kConfig, "key 'model.backend': expected one of auto, cpu, cuda, got '", choice, "'");
  const std::optional<WeightStorage> weights = parse_weight_storage(model.weights);
  if (!weights)
    fail(ErrorCode::kConfig, "key 'model.weights': expected one of native, bf16, f32, got '", model.weights, "'");
  const auto cpu_backend = [&] { return std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.weights = *weights}); };
  if (choice != "cpu") {
    std::string why_none;
    const std::vector<gpu::DeviceInfo> devices = gpu::list_devices(&why_none);
    if (!devices.empty()) {
      const gpu::DeviceInfo& d = devices.front();
      return {gpu::make_cuda_backend({}), "cuda (" + d.name + ", device " + std::to_string(d.index) + ")"};
    }
    if (choice == "cuda") fail(ErrorCode::kUnsupported, "model.backend is cuda but there is no CUDA device: ", why_none);
    return {cpu_backend(), "cpu (" + why_none + ", using the CPU)"};
  }
  return {cpu_backend(), "cpu"};
}

}  // namespace longctx::apps
