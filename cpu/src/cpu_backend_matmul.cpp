// Matmul of CpuBackend: y[m, n] = x[m, k] · w[n, k]^T with f32 accumulation.
// Paths, best first:
// - quantized weights: x quantized per block (quant_matmul.h), then the
//   integer kernels of the CPU's best ISA on panels of weight rows split over
//   the cores with oneTBB (whole groups for weights in groups); each panel
//   meets every row of x while it sits in the core's cache. With
//   QuantPrefill::kBf16Tiles (the default where bf16 products outrun f32
//   ones: AMX tiles, vdpbf16ps on Zen 4; for weights in groups AMX only) and more
//   than kGemvMaxM rows: tiles of w dequantized to bf16, x rounded to bf16,
//   oneDNN bf16; with kF32Tiles (the default for kRows weights on CPUs with
//   AVX512-BF16 whose bf16 products are slow, where oneDNN's f32 kernels
//   outrun their int8 kernels): tiles of w dequantized to f32, oneDNN f32.
// - m <= kGemvMaxM (decode): the gemv kernel (cpu_backend_gemv_hwy.cpp)
//   streams the weight rows once, f32, f16 or bf16, split over rows with oneTBB.
// - f32 weights: oneDNN f32 x f32 -> f32.
// - bf16 weights, native: x rounded to bf16, oneDNN bf16 x bf16 -> f32, when
//   oneDNN has an optimized (non-reference) bf16 kernel for this CPU and
//   bf16 products outrun f32 ones.
// - f16 weights, and bf16 weights without a native kernel: tiles of w
//   widened to f32 in a scratch buffer, oneDNN f32 x f32 into the matching
//   columns of y.
// oneDNN reads the weight in place as a k x n matrix with strides {1, k}
// (its "ba" layout), so no packed copy is kept; primitives are cached per shape.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_backend_internal.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/error.h"
#include "longctx/cpu/peak_loops.h"
#include "longctx/cpu/quant_matmul.h"

namespace longctx::cpu::detail {
namespace {

using dt = dnnl::memory::data_type;

struct ShapeKey {
  int64_t m, k, n, ldy;
  dt src;
  auto tie() const { return std::tie(m, k, n, ldy, src); }
  bool operator<(const ShapeKey& other) const { return tie() < other.tie(); }
};

// A shape cache beyond this many entries is dropped whole (odd chunk sizes
// in a long run would otherwise grow it without end).
constexpr size_t kMaxCachedPrimitives = 256;
// Up to this many rows of x go to the gemv kernel instead of oneDNN.
constexpr int64_t kGemvMaxM = 4;
constexpr int64_t kGemvGrainRows = 32;
// Rows of a weight converted at once for oneDNN (16-bit weights widened to
// f32, quantized ones dequantized to f32 or bf16): each tile is one oneDNN
// call that re-packs x, so tiles are wide. A 4096-token chunk's x is 64 MB:
// 256-row f32 tiles re-packed it 56 times per 14336-row weight, and 1024
// made the prefill of 4-layer Q4_0 / Q4_K_M models 1.2-1.4x faster (Xeon EMR,
// 2 cores) for 16-56 MB of f32 scratch (k 4096-14336).
constexpr int64_t kDequantTileRows = 1024;
// Weight bytes per task of a quantized matmul with more than kGemvMaxM rows:
// a panel that stays in a core's L2 cache while every row of x passes it.
constexpr int64_t kQuantPanelBytes = 192 << 10;
// Weight rows per task of a quantized matmul for decode (memory-bound: small
// tasks balance the cores).
constexpr int64_t kQuantGemvGrainRows = 16;

}  // namespace

struct MatmulEngine::State {
  bool native_bf16 = false;
  QuantPrefill quant_prefill = QuantPrefill::kInt8;  // kRows weights
  QuantPrefill grouped_prefill = QuantPrefill::kInt8;  // kRows8 and kRows16 weights
  QuantIsa quant_isa = best_quant_isa();
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;  // guards the caches and the scratch buffers
  std::map<ShapeKey, dnnl::matmul> primitives;
  std::vector<uint16_t> x_bf16;
  std::vector<float> w_tile;
  std::vector<uint16_t> w_tile_bf16;
  QuantizedActs acts;

  // src and weights of dtype `src`, dst f32 with row stride ldy. Throws
  // dnnl::error when oneDNN has no implementation.
  dnnl::matmul::primitive_desc describe(const ShapeKey& s) const {
    const dnnl::memory::desc src_md({s.m, s.k}, s.src, dnnl::memory::dims{s.k, 1});
    const dnnl::memory::desc wei_md({s.k, s.n}, s.src, dnnl::memory::dims{1, s.k});
    const dnnl::memory::desc dst_md({s.m, s.n}, dt::f32, dnnl::memory::dims{s.ldy, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_md, dst_md), engine);
  }

  dnnl::matmul& primitive(const ShapeKey& s) {
    auto it = primitives.find(s);
    if (it != primitives.end()) return it->second;
    if (primitives.size() >= kMaxCachedPrimitives) primitives.clear();
    try {
      return primitives.emplace(s, dnnl::matmul(describe(s))).first->second;
    } catch (const dnnl::error& e) {
      fail(ErrorCode::kUnsupported, "matmul: oneDNN has no ", s.src == dt::bf16 ? "bf16" : "f32", " kernel for [", s.m,
           ", ", s.k, "] x [", s.k, ", ", s.n, "]: ", e.what());
    }
  }

  void execute(const ShapeKey& s, const void* x, const void* w, float* y) {
    dnnl::matmul& prim = primitive(s);
    const auto md = [](dnnl::memory::dims dims, dt type, dnnl::memory::dims strides) {
      return dnnl::memory::desc(std::move(dims), type, std::move(strides));
    };
    dnnl::memory src(md({s.m, s.k}, s.src, {s.k, 1}), engine, const_cast<void*>(x));
    dnnl::memory wei(md({s.k, s.n}, s.src, {1, s.k}), engine, const_cast<void*>(w));
    dnnl::memory dst(md({s.m, s.n}, dt::f32, {s.ldy, 1}), engine, y);
    prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
};

MatmulEngine::MatmulEngine(Bf16Matmul bf16_mode, QuantPrefill quant_mode) : state_(std::make_unique<State>()) {
  // oneDNN's bf16 kernels count only when they are real ones: its reference
  // implementation would be far slower than widening the weights.
  bool onednn_bf16 = false;
  try {
    const std::string impl = state_->describe({64, 64, 64, 64, dt::bf16}).impl_info_str();
    onednn_bf16 = impl.find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    onednn_bf16 = false;  // no bf16 support on this CPU (e.g. AVX2 only)
  }
  // Where bf16 products do not outrun f32 ones (a Xeon whose VM hides AMX
  // runs vdpbf16ps at half the FMA rate), oneDNN's bf16 kernels lose to f32.
  const bool fast_bf16 = onednn_bf16 && bf16_outruns_fma();
  state_->native_bf16 = fast_bf16 && bf16_mode == Bf16Matmul::kAuto;
  if (quant_mode == QuantPrefill::kBf16Tiles && !onednn_bf16)
    fail(ErrorCode::kUnsupported, "CpuBackend: QuantPrefill::kBf16Tiles needs oneDNN bf16 kernels, which this CPU (",
         describe_cpu_features(cpu_features()), ") does not have");
  // Prefill with quantized weights (longctx-bench matmul, 512 rows, 2
  // cores): on Zen 4 bf16 tiles ran 1.24x the int8 kernels; on a Xeon
  // (Emerald Rapids) whose VM hides AMX, f32 tiles ran 1.15x (Q6_K) to 3.0x
  // (Q4_0) the int8 kernels, which use 256-bit vectors, and 1.36-1.45x bf16
  // tiles. AVX-512 CPUs without BF16 (Skylake to Ice Lake; some have one
  // 512-bit FMA unit) keep the int8 kernels: f32 tiles were not measured there.
  // Weights in groups have faster int8 kernels (on that Xeon, in groups of 8
  // on 256-bit vectors, Q4_0 and Q8_0 at 290-330 GFLOP/s, 3.5-4x the row
  // kernels, Q4_K at 230, against 155-220 on f32 tiles and 110-125 on bf16
  // tiles; in groups of 16 on 512-bit vectors 1.2-1.6x that, and Q5_K and
  // Q6_K at 350-410 and 255-350 against 170-220 and 145-235 on f32 tiles),
  // so they keep them except where bf16 runs on AMX tiles (Q8_0 on bf16
  // tiles: 676 GFLOP/s on 2 cores of a Sapphire Rapids).
  const bool amx = cpu_features().amx_bf16;
  if (quant_mode != QuantPrefill::kAuto) {
    state_->quant_prefill = state_->grouped_prefill = quant_mode;
  } else {
    if (fast_bf16) state_->quant_prefill = QuantPrefill::kBf16Tiles;
    else if (cpu_features().avx512bf16) state_->quant_prefill = QuantPrefill::kF32Tiles;
    else state_->quant_prefill = QuantPrefill::kInt8;
    state_->grouped_prefill = fast_bf16 && amx ? QuantPrefill::kBf16Tiles : QuantPrefill::kInt8;
  }
}

MatmulEngine::~MatmulEngine() = default;

bool MatmulEngine::bf16_native() const { return state_->native_bf16; }
QuantPrefill MatmulEngine::quant_prefill(QuantLayout layout) const {
  return layout == QuantLayout::kRows ? state_->quant_prefill : state_->grouped_prefill;
}

void MatmulEngine::run(const float* x, const void* w, GgmlType w_type, QuantLayout w_layout, float* y, int64_t m,
                       int64_t k, int64_t n) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (k == 0) {  // an empty sum; oneDNN rejects zero-sized reductions
    std::fill(y, y + m * n, 0.f);
    return;
  }
  const std::optional<DType> dense = dtype_of(w_type);
  const QuantPrefill prefill = quant_prefill(w_layout);
  if (!dense && m > kGemvMaxM && prefill != QuantPrefill::kInt8) {
    // Tiles of weight rows dequantized to f32 for oneDNN, or rounded on to
    // bf16 (x too) for its bf16 kernels.
    const bool bf16 = prefill == QuantPrefill::kBf16Tiles;
    const void* src = x;
    if (bf16) {
      s.x_bf16.resize(size_t(m * k));
      convert(x, DType::kF32, s.x_bf16.data(), DType::kBF16, s.x_bf16.size());
      src = s.x_bf16.data();
    }
    const int64_t tile = std::min(n, kDequantTileRows);
    if (bf16) s.w_tile_bf16.resize(size_t(tile * k));
    else s.w_tile.resize(size_t(tile * k));
    for (int64_t o = 0; o < n; o += tile) {
      const int64_t rows = std::min(tile, n - o);
      tbb::parallel_for(int64_t{0}, rows, [&](int64_t r) {
        std::vector<uint8_t> scratch;
        const std::span<const uint8_t> row = weight_row(w, w_type, w_layout, k, o + r, scratch);
        if (bf16) {
          std::vector<float> values(static_cast<size_t>(k));
          dequantize(w_type, row, values);
          convert(values.data(), DType::kF32, s.w_tile_bf16.data() + r * k, DType::kBF16, size_t(k));
        } else {
          dequantize(w_type, row, {s.w_tile.data() + r * k, size_t(k)});
        }
      });
      const void* w_tile = bf16 ? static_cast<const void*>(s.w_tile_bf16.data()) : s.w_tile.data();
      s.execute({m, k, rows, n, bf16 ? dt::bf16 : dt::f32}, src, w_tile, y + o);
    }
  } else if (!dense) {
    quantize_acts(x, m, k, k, quant_act_block(w_type), s.acts);
    const auto* wq = static_cast<const uint8_t*>(w);
    // Tasks take whole groups.
    const int64_t unit = quant_group_rows(w_layout);
    const int64_t grain_rows =
        m <= kGemvMaxM ? kQuantGemvGrainRows : std::max<int64_t>(1, kQuantPanelBytes / int64_t(*ggml_bytes(w_type, k)));
    const int64_t grain = std::max<int64_t>(1, grain_rows / unit);
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n / unit, grain), [&](const tbb::blocked_range<int64_t>& range) {
      quant_matmul_tile(s.quant_isa, w_type, w_layout, wq, s.acts, 0, m, range.begin() * unit, range.end() * unit, y,
                        n);
    });
  } else if (m <= kGemvMaxM) {
    // Parallel over weight rows; each task streams its rows once.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGemvGrainRows), [&](const tbb::blocked_range<int64_t>& range) {
      gemv({x, m, k, w, *dense, y, n, range.begin(), range.end()});
    });
  } else if (*dense == DType::kF32) {
    s.execute({m, k, n, n, dt::f32}, x, w, y);
  } else if (*dense == DType::kBF16 && s.native_bf16) {
    s.x_bf16.resize(size_t(m * k));
    convert(x, DType::kF32, s.x_bf16.data(), DType::kBF16, s.x_bf16.size());
    s.execute({m, k, n, n, dt::bf16}, s.x_bf16.data(), w, y);
  } else {
    const int64_t tile = std::min(n, kDequantTileRows);
    s.w_tile.resize(size_t(tile * k));
    const auto* w16 = static_cast<const uint16_t*>(w);
    for (int64_t o = 0; o < n; o += tile) {
      const int64_t rows = std::min(tile, n - o);
      convert(w16 + o * k, *dense, s.w_tile.data(), DType::kF32, size_t(rows * k));
      s.execute({m, k, rows, n, dt::f32}, x, s.w_tile.data(), y + o);
    }
  }
}

}  // namespace longctx::cpu::detail
