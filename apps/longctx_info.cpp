// longctx-info: what this machine offers longctx (CPU features, SIMD target,
// NUMA nodes, GPUs), and, given a config and a model shape, whether the KV
// store fits the DRAM budget.
//
//   longctx-info
//   longctx-info --config configs/default.yaml [--layers 32 --kv-heads 8 --head-dim 128] [--set key=value]...
//   longctx-info --config-reference
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/error.h"
#include "longctx/gpu/device.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"

namespace {

using namespace longctx;

constexpr const char* kUsage =
    "usage: longctx-info [--config FILE.yaml [--layers N] [--kv-heads N] [--head-dim N] [--set KEY=VALUE]...]\n"
    "       longctx-info --config-reference\n";

struct Args {
  std::string config_path;
  std::vector<std::string> overrides;
  kvstore::KVShape shape{32, 8, 128};  // Llama-3-8B-like attention
  bool reference = false;
};

int parse_int(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value <= 0 || value > 1 << 20)
    fail(ErrorCode::kInvalidArgument, flag, ": expected a positive integer, got '", text, "'");
  return static_cast<int>(value);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--config") args.config_path = value();
    else if (flag == "--set") args.overrides.push_back(value());
    else if (flag == "--layers") args.shape.n_layers = parse_int(flag, value());
    else if (flag == "--kv-heads") args.shape.n_kv_heads = parse_int(flag, value());
    else if (flag == "--head-dim") args.shape.head_dim = parse_int(flag, value());
    else if (flag == "--config-reference") args.reference = true;
    else if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "'\n", kUsage);
  }
  return args;
}

void print_system(const kvstore::NumaTopology& topology) {
  const CpuFeatures& cpu = cpu_features();
  std::printf("longctx %s\n", LONGCTX_VERSION);
  std::printf("cpu:      %s\n", cpu.brand.c_str());
  std::printf("features: %s\n", describe_cpu_features(cpu).c_str());
  std::printf("simd:     %s (Highway runtime dispatch)%s\n", highway_target_name().c_str(),
              cpu.avx512f ? "" : "; no AVX-512 on this CPU");
  std::string nodes = topology.describe();
  if (!nodes.empty() && nodes.back() != '\n') nodes += '\n';
  std::printf("numa:     %d node(s)%s\n%s", topology.node_count(),
              topology.is_this_system() ? "" : " (not this system)", nodes.c_str());
  std::string why;
  const auto gpus = gpu::list_devices(&why);
  if (gpus.empty()) std::printf("gpu:      none (%s)\n", why.c_str());
  for (const auto& d : gpus)
    std::printf("gpu %d:    %s, sm_%d%d, %d SMs, %s\n", d.index, d.name.c_str(), d.sm_major, d.sm_minor,
                d.multiprocessors, format_bytes(d.memory_bytes).c_str());
}

// Returns false when the store would not fit the DRAM budget.
bool print_preflight(const Args& args, const LongContextConfig& config, const kvstore::NumaTopology& topology) {
  const auto layout = kvstore::StoreLayout::make(args.shape, config);
  const auto nodes = kvstore::resolve_numa_nodes(config.numa, topology);
  const auto head_nodes = kvstore::place_kv_heads(args.shape.n_kv_heads, nodes);
  const auto plan = kvstore::preflight(layout, config.max_seq_len, head_nodes);
  const uint64_t budget = config.dram_budget ? config.dram_budget : kvstore::default_dram_budget();
  std::printf("\nconfig %s: valid\n", args.config_path.c_str());
  std::printf("model:    %d layers x %d kv heads x %d dims\n", args.shape.n_layers, args.shape.n_kv_heads,
              args.shape.head_dim);
  std::printf("store:    %s\n", plan.describe().c_str());
  const bool fits = plan.total_bytes <= budget;
  std::printf("budget:   %s (%s)\n", format_bytes(budget).c_str(), fits ? "fits" : "does not fit");
  if (!fits)
    std::fprintf(stderr, "longctx-info: the KV store needs %s but dram_budget is %s: lower max_seq_len, choose a "
                 "smaller kv_type, or raise dram_budget\n", format_bytes(plan.total_bytes).c_str(),
                 format_bytes(budget).c_str());
  return fits;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    if (args.reference) {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return 0;
    }
    // Load the config first so that a bad file fails before any report is printed.
    LongContextConfig config;
    if (!args.config_path.empty()) config = load_config_file(args.config_path, args.overrides);
    const auto topology = kvstore::NumaTopology::detect();
    print_system(topology);
    if (!args.config_path.empty() && !print_preflight(args, config, topology)) return 1;
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-info: %s: %s\n", error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-info: %s\n", e.what());
    return 1;
  }
}
