// Elementwise ops of CpuBackend: plain loops the compiler vectorizes, split
// over rows (or element ranges) with oneTBB. Arguments are checked by the caller.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_backend_internal.h"

namespace longctx::cpu::detail {
namespace {

// Work per task of at least ~16K elements, so small (decode) ops run inline.
constexpr int64_t kGrainElems = 1 << 14;

int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, row_len)); }

template <typename Fn>
void parallel_rows(int64_t rows, int64_t row_len, Fn fn) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, row_grain(row_len)),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      for (int64_t r = range.begin(); r < range.end(); ++r) fn(r);
                    });
}

template <typename Fn>
void parallel_elems(int64_t count, Fn fn) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, kGrainElems),
                    [&](const tbb::blocked_range<int64_t>& range) { fn(range.begin(), range.end()); });
}

std::vector<float> to_f32(const void* data, DType dtype, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  convert(data, dtype, values.data(), DType::kF32, values.size());
  return values;
}

}  // namespace

void rms_norm_rows(const float* x, const void* weight, DType weight_dtype, float eps, float* y, int64_t rows,
                   int64_t d) {
  const std::vector<float> w = to_f32(weight, weight_dtype, d);
  parallel_rows(rows, d, [&](int64_t r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    float sum = 0.f;
    for (int64_t i = 0; i < d; ++i) sum += xr[i] * xr[i];
    const float scale = 1.f / std::sqrt(sum / float(d) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * scale * w[size_t(i)];
  });
}

void rope_rows(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t first_pos,
               const std::vector<float>& inv_freq, float magnitude, RopeStyle style) {
  const int64_t half = int64_t(inv_freq.size());
  parallel_rows(n, n_heads * head_dim, [&](int64_t t) {
    // One angle table per token, shared by its heads; the angle is formed in
    // fp64 so that large positions do not lose the fraction, and its cosine
    // and sine take the magnitude before they round.
    std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
    const double pos = double(first_pos + t);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * double(inv_freq[size_t(i)]);
      cos_t[size_t(i)] = float(std::cos(angle) * magnitude);
      sin_t[size_t(i)] = float(std::sin(angle) * magnitude);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      // kNormal pairs (2i, 2i+1); kNeox pairs (i, i + half).
      const int64_t step = style == RopeStyle::kNormal ? 2 : 1;
      const int64_t other = style == RopeStyle::kNormal ? 1 : half;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i * step], b = v[i * step + other];
        v[i * step] = a * cos_t[size_t(i)] - b * sin_t[size_t(i)];
        v[i * step + other] = a * sin_t[size_t(i)] + b * cos_t[size_t(i)];
      }
    }
  });
}

void swiglu_elems(const float* gate, const float* up, float* out, int64_t count) {
  parallel_elems(count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.f + std::exp(-g)) * up[i];  // exp overflow gives g/inf = -0, the limit
    }
  });
}

void add_elems(const float* a, const float* b, float* out, int64_t count) {
  parallel_elems(count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

void add_bias_rows(float* y, const void* bias, DType bias_dtype, int64_t rows, int64_t n) {
  const std::vector<float> b = to_f32(bias, bias_dtype, n);
  parallel_rows(rows, n, [&](int64_t r) {
    float* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] += b[size_t(i)];
  });
}

std::span<const uint8_t> weight_row(const void* w, GgmlType type, QuantLayout layout, int64_t k, int64_t o,
                                    std::vector<uint8_t>& scratch) {
  const size_t row_bytes = size_t(*ggml_bytes(type, k));
  if (layout == QuantLayout::kRows) return {static_cast<const uint8_t*>(w) + size_t(o) * row_bytes, row_bytes};
  scratch.resize(row_bytes);
  unpack_group_row(type, layout, static_cast<const uint8_t*>(w), k, o, scratch.data());
  return scratch;
}

void embed_rows(const void* table, GgmlType table_type, QuantLayout table_layout, int64_t d,
                std::span<const int32_t> tokens, float* out) {
  parallel_rows(int64_t(tokens.size()), d, [&](int64_t t) {
    std::vector<uint8_t> scratch;
    dequantize(table_type, weight_row(table, table_type, table_layout, d, tokens[size_t(t)], scratch),
               {out + t * d, size_t(d)});
  });
}

}  // namespace longctx::cpu::detail
