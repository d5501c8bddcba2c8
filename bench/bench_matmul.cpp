// longctx-bench matmul: CpuBackend::matmul on the weight types of GGUF files,
// on the matrix shapes of an 8B-class layer, as a model runs them:
//   rows <= 4 (decode): memory-bound; weight bytes per second against the
//            read bandwidth measured in the same run;
//   more rows (prefill): compute-bound; GFLOP/s (2 m n k per call) against
//            the fp32 FMA peak and, for quantized types, the int8 peak of the
//            kernels' instructions, both measured in the same run; quantized
//            weights also on f32 tiles and, where oneDNN has a bf16 kernel
//            for the CPU, on bf16 tiles (QuantPrefill), to pick the fastest.
//   Each quantized row says the layout its weight was kept in ("layout":
//   groups of 8 or 16 rows where load_weight packs them, else rows); where
//   that is groups, GEMV runs are timed on GGML's rows too, so that a CPU
//   whose group kernels lose in decode shows it.
//
//   longctx-bench matmul [--types q4_0,q8_0,q2_k,q3_k,q4_k,q5_k,q6_k,f16,bf16,f32]
//                        [--shapes 4096x4096,14336x4096,4096x14336]
//                        [--rows 1,4,512] [--reps 5] [--quick]
#include <tbb/info.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "longctx/core/backend.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/quant_matmul.h"

namespace longctx::bench {
namespace {

constexpr int64_t kGemvRows = 4;  // CpuBackend::matmul takes its GEMV path up to 4 rows of x

struct MatmulArgs {
  std::vector<GgmlType> types{GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF16,
                              GgmlType::kF32};
  std::vector<std::pair<int64_t, int64_t>> shapes{{4096, 4096}, {14336, 4096}, {4096, 14336}};  // n x k
  std::vector<int64_t> rows{1, 4, 512};
  int reps = 5;
};

GgmlType parse_type(const std::string& name) {
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
                     GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                     GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K})
    if (name == ggml_type_info(t).name) return t;
  fail(ErrorCode::kInvalidArgument, "matmul: unknown weight type '", name, "'");
}

// Random bytes with small finite f16 scales where the block type has them (the
// kernels' speed does not depend on the values).
std::vector<uint8_t> random_weight(GgmlType type, int64_t n, int64_t k) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  std::vector<uint8_t> bytes(*ggml_bytes(type, n * k));
  std::mt19937 rng(7);
  for (auto& b : bytes) b = uint8_t(rng());
  const uint16_t small = f32_to_f16_bits(0.01f);
  std::vector<size_t> fields;
  switch (type) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: {
      std::vector<float> values(size_t(n * k));
      for (auto& v : values) v = float(int(rng() % 2001) - 1000) * 1e-4f;
      convert(values.data(), DType::kF32, bytes.data(), *dtype_of(type), values.size());
      return bytes;
    }
    case GgmlType::kQ2_K: fields = {80, 82}; break;
    case GgmlType::kQ3_K: fields = {108}; break;
    case GgmlType::kQ6_K: fields = {208}; break;
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: case GgmlType::kQ5_K: fields = {0, 2}; break;
    default: fields = {0}; break;
  }
  for (size_t b = 0; b < bytes.size(); b += size_t(info.block_bytes))
    for (size_t f : fields) std::memcpy(bytes.data() + b + f, &small, 2);
  return bytes;
}

}  // namespace

int run_matmul(const std::vector<std::string>& args) {
  MatmulArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, "matmul: ", args[i], " needs a value");
      return args[++i];
    };
    // The option's value as an integer in [min, kMaxInt], named with the option.
    auto int_value = [&](int64_t min) {
      const std::string flag = "matmul: " + args[i];
      return parse_int_flag(flag, next(), min, kMaxInt);
    };
    auto words = [](const std::string& list) {
      std::vector<std::string> out;
      for (size_t pos = 0; pos <= list.size();) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        out.push_back(list.substr(pos, comma - pos));
        pos = comma + 1;
      }
      return out;
    };
    if (args[i] == "--types") {
      a.types.clear();
      for (const std::string& w : words(next())) a.types.push_back(parse_type(w));
    } else if (args[i] == "--shapes") {
      a.shapes.clear();
      for (const std::string& w : words(next())) {
        const size_t x = w.find('x');
        if (x == std::string::npos) fail(ErrorCode::kInvalidArgument, "matmul: --shapes wants NxK, got '", w, "'");
        a.shapes.emplace_back(parse_int_flag("matmul: --shapes N", w.substr(0, x), 1, kMaxInt),
                              parse_int_flag("matmul: --shapes K", w.substr(x + 1), 1, kMaxInt));
      }
    } else if (args[i] == "--rows") a.rows = parse_list(next(), "matmul: --rows", 1);
    else if (args[i] == "--reps") a.reps = int(int_value(1));
    else if (args[i] == "--quick") a.shapes = {{4096, 4096}}, a.rows = {1, 128}, a.reps = 3;
    else fail(ErrorCode::kInvalidArgument, "matmul: unknown argument '", args[i], "'");
  }
  const int threads = tbb::info::default_concurrency();
  const double read_gbps = measure_read_gbps(size_t(1) << 30, threads, 5);
  const double fma_gflops = measure_fma_gflops(threads);
  const double int8_gops = measure_int8_gops(threads);
  const double bf16_gflops = measure_bf16_gflops(threads);
  {
    Record r;
    r.set("bench", "matmul").set("kernel", "peaks").set("threads", threads).set("read_gbps", read_gbps);
    r.set("fma_gflops", fma_gflops).set("int8_gops", int8_gops).set("bf16_gflops", bf16_gflops);
    r.set("int8_isa", cpu::quant_isa_name(cpu::best_quant_isa()));
    std::printf("%s\n", r.json().c_str());
  }
  // Quantized prefill computes on the int8 kernels, on f32 tiles for
  // oneDNN, or on bf16 tiles where oneDNN has a bf16 kernel for this CPU:
  // time each that runs here (auto's choice is in the table's title).
  cpu::CpuBackend backend({.quant_prefill = cpu::QuantPrefill::kInt8});
  cpu::CpuBackend rows_layout({.quant_prefill = cpu::QuantPrefill::kInt8, .weight_groups = false});
  cpu::CpuBackend f32_tiles({.quant_prefill = cpu::QuantPrefill::kF32Tiles});
  std::unique_ptr<cpu::CpuBackend> bf16_tiles;
  try {
    bf16_tiles = std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.quant_prefill = cpu::QuantPrefill::kBf16Tiles});
  } catch (const Error& e) {
    std::printf("{\"bench\": \"matmul\", \"prefill_path\": \"bf16_tiles\", \"skipped\": \"%s\"}\n", e.what());
  }
  std::vector<Record> records;
  auto time_matmul = [&](cpu::CpuBackend& be, GgmlType type, const std::vector<uint8_t>& bytes, int64_t n, int64_t k,
                         int64_t m, const char* path, cpu::QuantLayout layout) {
    auto w = be.load_weight(HostWeight(type, {n, k}, bytes, "w"));
    std::vector<float> x(size_t(m * k));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
    auto xt = be.alloc({m, k});
    be.upload(make_view(x.data(), DType::kF32, {m, k}), *xt);
    auto yt = be.alloc({m, n});
    be.matmul(*xt, *w, nullptr, *yt);  // warm-up: caches, primitives
    // A decode step finds each weight in DRAM (the model's other layers ran
    // since); a CPU's last-level cache may hold a whole matrix (260 MB on a
    // Xeon EMR here), so GEMV runs start with the caches evicted.
    const bool gemv = m <= kGemvRows;
    std::vector<double> seconds;
    for (int r = 0; r < a.reps; ++r) {
      if (gemv) evict_caches();
      seconds.push_back(time_runs(1, [&] { be.matmul(*xt, *w, nullptr, *yt); })[0]);
    }
    const double ms = 1e3 * median(seconds);
    const double gflops = 2.0 * double(m * n * k) / (ms * 1e-3) / 1e9;
    const double gbps = double(bytes.size()) / (ms * 1e-3) / 1e9;
    Record r;
    r.set("bench", "matmul").set("type", ggml_type_info(type).name).set("path", path).set("n", n).set("k", k);
    if (!dtype_of(type)) {
      const int64_t group = cpu::quant_group_rows(layout);
      r.set("layout", group == 1 ? std::string("rows") : "groups of " + std::to_string(group));
    }
    r.set("rows", m).set("threads", threads).set("ms", ms).set("weight_bytes", int64_t(bytes.size()));
    r.set("gbps", gbps).set("of_bandwidth", gbps / read_gbps);
    r.set("gflops", gflops).set("of_fma_peak", gflops / fma_gflops);
    const bool int8_kernels = &be == &backend || &be == &rows_layout;
    if (!dtype_of(type) && int8_kernels && int8_gops > 0) r.set("of_int8_peak", gflops / int8_gops);
    if (&be == bf16_tiles.get() && bf16_gflops > 0) r.set("of_bf16_peak", gflops / bf16_gflops);
    std::printf("%s\n", r.json().c_str());
    std::fflush(stdout);
    records.push_back(r);
  };
  for (const auto& [n, k] : a.shapes)
    for (GgmlType type : a.types) {
      const std::vector<uint8_t> bytes = random_weight(type, n, k);
      const bool quantized = !dtype_of(type);
      const cpu::QuantLayout layout = quantized ? cpu::preferred_quant_layout(type, n) : cpu::QuantLayout::kRows;
      for (int64_t m : a.rows) {
        const bool gemv = m <= kGemvRows;
        time_matmul(backend, type, bytes, n, k, m, quantized ? (gemv ? "int8 gemv" : "int8") : "float", layout);
        if (quantized && gemv && layout != cpu::QuantLayout::kRows)
          time_matmul(rows_layout, type, bytes, n, k, m, "int8 gemv", cpu::QuantLayout::kRows);
        if (quantized && !gemv) time_matmul(f32_tiles, type, bytes, n, k, m, "f32 tiles", layout);
        if (quantized && !gemv && bf16_tiles)
          time_matmul(*bf16_tiles, type, bytes, n, k, m, "bf16 tiles", layout);
      }
    }
  std::printf("\nCpuBackend::matmul y[rows, n] = x[rows, k] w[n, k]^T, %d threads, int8 kernels on %s, quantized "
              "prefill on %s by default; read bandwidth "
              "%.1f GB/s, fp32 FMA peak %.0f GFLOP/s, int8 peak %.0f GOP/s, bf16 (vdpbf16ps) peak %.0f GFLOP/s "
              "(measured in this run; 0 = not on this CPU); runs of up to %d rows (GEMV) start with the caches "
              "evicted\n",
              threads, cpu::quant_isa_name(cpu::best_quant_isa()),
              cpu::quant_prefill_name(cpu::CpuBackend().quant_prefill()), read_gbps, fma_gflops, int8_gops,
              bf16_gflops, int(kGemvRows));
  print_table(records, {"type", "path", "layout", "n", "k", "rows", "ms", "gbps", "of_bandwidth", "gflops",
                        "of_fma_peak", "of_int8_peak", "of_bf16_peak"});
  return 0;
}

}  // namespace longctx::bench
