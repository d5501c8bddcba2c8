// BackendTensor helpers and the one RoPE frequency definition (backend.h).
#include "longctx/core/backend.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "longctx/core/error.h"

namespace longctx {

BackendTensor::BackendTensor(DType dtype, std::vector<int64_t> shape)
    : type_(ggml_type_of(dtype)), shape_(std::move(shape)) {}

DType BackendTensor::dtype() const {
  const std::optional<DType> dtype = dtype_of(type_);
  if (!dtype) fail(ErrorCode::kInvalidArgument, "tensor ", describe(), " is quantized: it has no element dtype");
  return *dtype;
}

GgmlType ggml_type_of(DType dtype) {
  switch (dtype) {
    case DType::kF32: return GgmlType::kF32;
    case DType::kF16: return GgmlType::kF16;
    case DType::kBF16: return GgmlType::kBF16;
    case DType::kQ8_0: break;  // the KV store's layout, not ggml's Q8_0 blocks
  }
  fail(ErrorCode::kInvalidArgument, "invalid dtype value ", int(dtype));
}

std::optional<DType> dtype_of(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

HostWeight::HostWeight(const TensorView& view) {
  check_host_view(view, "load_weight", "host");
  if (!view.is_contiguous()) fail(ErrorCode::kInvalidArgument, "load_weight: host ", view.describe(), " is not contiguous");
  type = ggml_type_of(view.dtype);
  shape.assign(view.shape.begin(), view.shape.begin() + view.rank);
  bytes = {static_cast<const uint8_t*>(view.data), size_t(view.numel()) * dtype_size(view.dtype)};
}

int64_t HostWeight::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;  // check_host_weight rejects overflow first
  return count;
}

void convert_weight(const HostWeight& w, DType dtype, void* dst) {
  const int64_t row = w.shape.empty() ? 1 : w.shape.back();
  const int64_t rows = row == 0 ? 0 : w.numel() / row;
  const size_t in_row = size_t(*ggml_bytes(w.type, row)), out_row = size_t(row) * dtype_size(dtype);
  std::vector<float> values(static_cast<size_t>(row));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize(w.type, w.bytes.subspan(size_t(r) * in_row, in_row), values);
    convert(values.data(), DType::kF32, static_cast<uint8_t*>(dst) + size_t(r) * out_row, dtype, size_t(row));
  }
}

const char* weight_storage_name(WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kNative: return "native";
    case WeightStorage::kBF16: return "bf16";
    case WeightStorage::kF32: return "f32";
  }
  return "?";
}

std::optional<WeightStorage> parse_weight_storage(std::string_view text) {
  for (WeightStorage s : {WeightStorage::kNative, WeightStorage::kBF16, WeightStorage::kF32})
    if (text == weight_storage_name(s)) return s;
  return std::nullopt;
}

int64_t BackendTensor::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape_) count *= extent;  // backends reject overflowing shapes at alloc
  return count;
}

std::string BackendTensor::describe() const { return ggml_type_info(type_).name + format_shape(shape_); }

std::string format_shape(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(shape[d]);
  }
  return text + "]";
}

namespace {

bool positive_finite(double value) { return std::isfinite(value) && value > 0.0; }

void check_rope_params(const RopeParams& p) {
  if (p.n_rot <= 0 || p.n_rot % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "rope: n_rot must be positive and even, got ", p.n_rot);
  }
  if (!positive_finite(p.theta)) fail(ErrorCode::kInvalidArgument, "rope: theta must be positive, got ", p.theta);
  if (p.scaling != RopeScaling::kNone && !positive_finite(p.factor)) {
    fail(ErrorCode::kInvalidArgument, "rope: scaling factor must be positive, got ", p.factor);
  }
  if (p.scaling == RopeScaling::kLlama3) {
    if (!positive_finite(p.low_freq_factor) || !positive_finite(p.high_freq_factor) ||
        !(p.high_freq_factor > p.low_freq_factor)) {
      fail(ErrorCode::kInvalidArgument, "rope: llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got ",
           p.low_freq_factor, " and ", p.high_freq_factor);
    }
    if (p.original_context <= 0) {
      fail(ErrorCode::kInvalidArgument, "rope: llama3 original_context must be positive, got ", p.original_context);
    }
  }
  if (p.scaling == RopeScaling::kYarn) {
    if (!(p.factor >= 1.0f)) fail(ErrorCode::kInvalidArgument, "rope: yarn factor must be >= 1, got ", p.factor);
    if (!(p.theta > 1.0f)) fail(ErrorCode::kInvalidArgument, "rope: yarn needs theta > 1, got ", p.theta);
    if (p.original_context <= 0) {
      fail(ErrorCode::kInvalidArgument, "rope: yarn original_context must be positive, got ", p.original_context);
    }
    if (!positive_finite(p.beta_slow) || !positive_finite(p.beta_fast) || !(p.beta_fast > p.beta_slow)) {
      fail(ErrorCode::kInvalidArgument, "rope: yarn needs 0 < beta_slow < beta_fast, got ", p.beta_slow, " and ",
           p.beta_fast);
    }
  }
  if (!positive_finite(p.attn_factor)) {
    fail(ErrorCode::kInvalidArgument, "rope: attn_factor must be positive, got ", p.attn_factor);
  }
  if (!p.freq_factors.empty()) {
    if (p.scaling != RopeScaling::kNone) {
      fail(ErrorCode::kInvalidArgument, "rope: freq_factors and a scaling type cannot be combined");
    }
    if (p.freq_factors.size() != static_cast<size_t>(p.n_rot / 2)) {
      fail(ErrorCode::kInvalidArgument, "rope: freq_factors has ", p.freq_factors.size(),
           " values, expected n_rot/2 = ", p.n_rot / 2);
    }
    for (size_t i = 0; i < p.freq_factors.size(); ++i) {
      if (!positive_finite(p.freq_factors[i])) {
        fail(ErrorCode::kInvalidArgument, "rope: freq_factors[", i, "] must be positive, got ", p.freq_factors[i]);
      }
    }
  }
}

// YaRN's correction range: the pair indices [low, high] between which the
// frequencies blend, from the pair that turns beta_fast times over the
// original context (below: kept) to the one that turns beta_slow times
// (above: divided by factor). Pair i turns original_context * theta^(-2i/n_rot)
// / (2 pi) times, so the pair turning beta times is n_rot ln(original_context /
// (2 pi beta)) / (2 ln theta). Rounded outwards and clamped as llama.cpp's
// ggml_rope_yarn_corr_dims and transformers' find_correction_range do.
std::pair<double, double> yarn_correction_range(const RopeParams& p) {
  const auto pair_turning = [&](double beta) {
    return p.n_rot * std::log(double(p.original_context) / (2.0 * std::numbers::pi * beta)) /
           (2.0 * std::log(double(p.theta)));
  };
  const double low = std::max(0.0, std::floor(pair_turning(p.beta_fast)));
  const double high = std::min(double(p.n_rot - 1), std::ceil(pair_turning(p.beta_slow)));
  return {low, high};
}

}  // namespace

// Computed in fp64 and rounded once, so every backend starts from the same floats.
std::vector<float> rope_inv_freq(const RopeParams& p) {
  check_rope_params(p);
  const int half = p.n_rot / 2;
  std::vector<float> result(static_cast<size_t>(half));
  const auto [yarn_low, yarn_high] = p.scaling == RopeScaling::kYarn ? yarn_correction_range(p) : std::pair{0.0, 0.0};
  for (int i = 0; i < half; ++i) {
    double inv = std::pow(double(p.theta), -2.0 * i / p.n_rot);
    if (p.scaling == RopeScaling::kLinear) {
      inv /= p.factor;
    } else if (p.scaling == RopeScaling::kLlama3) {
      // Llama-3.1: long wavelengths are divided by factor, short ones kept,
      // the band between blends the two linearly in context/wavelength.
      const double context = double(p.original_context);
      const double wavelen = 2.0 * std::numbers::pi / inv;
      if (wavelen > context / p.low_freq_factor) {
        inv /= p.factor;
      } else if (wavelen >= context / p.high_freq_factor) {
        const double smooth =
            (context / wavelen - p.low_freq_factor) / (double(p.high_freq_factor) - double(p.low_freq_factor));
        inv = (1.0 - smooth) * inv / p.factor + smooth * inv;
      }
    } else if (p.scaling == RopeScaling::kYarn) {
      // 0 up to low (fast pairs keep inv), 1 from high (slow pairs take inv / factor).
      const double ramp = std::clamp((i - yarn_low) / std::max(0.001, yarn_high - yarn_low), 0.0, 1.0);
      inv = ramp * inv / p.factor + (1.0 - ramp) * inv;
    }
    if (!p.freq_factors.empty()) inv /= p.freq_factors[static_cast<size_t>(i)];
    result[static_cast<size_t>(i)] = static_cast<float>(inv);
    // Each parameter passed its check, yet together they can leave f32 (a
    // tiny factor or frequency factor divides by nearly 0): the angles would be inf, the rotations NaN.
    if (!positive_finite(result[static_cast<size_t>(i)]))
      fail(ErrorCode::kInvalidArgument, "rope: the inverse frequency of pair ", i, " is ", inv,
           ", outside f32's positive range (theta ", p.theta, ", scaling factor ", p.factor,
           p.freq_factors.empty() ? "" : str_cat(", frequency factor ", p.freq_factors[size_t(i)]), ")");
  }
  return result;
}

const char* rope_scaling_name(RopeScaling scaling) {
  switch (scaling) {
    case RopeScaling::kNone: return "none";
    case RopeScaling::kLinear: return "linear";
    case RopeScaling::kLlama3: return "llama3";
    case RopeScaling::kYarn: return "yarn";
  }
  return "?";
}

float rope_magnitude(const RopeParams& p) {
  check_rope_params(p);
  const double temperature = p.scaling == RopeScaling::kYarn ? 1.0 + 0.1 * std::log(double(p.factor)) : 1.0;
  return static_cast<float>(double(p.attn_factor) * temperature);
}

}  // namespace longctx
