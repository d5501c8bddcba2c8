// Synthetic attention workloads (construction documented in synthetic.h).
#include "longctx/workloads/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "longctx/core/error.h"
#include "longctx/core/random.h"
#include "tbb/parallel_for.h"

namespace longctx::workloads {

namespace {

constexpr double kSinkValueScale = 0.1;    // sinks absorb attention but carry little
constexpr double kNeedleValueScale = 4.0;  // needle values stand out in the output
constexpr size_t kChunkTokens = 1024;      // tokens per random stream (and per task)

// Start of the stream of token chunk `chunk`: a scrambled state per (seed,
// chunk). A chunk draws < 2^20 numbers, so streams that start at unrelated
// points of the 2^64-long sequence do not overlap in practice.
uint64_t chunk_seed(uint64_t seed, size_t chunk) {
  return splitmix64_finalize(seed ^ splitmix64_finalize(uint64_t(chunk) + 1));
}

// Standard normals by the ziggurat method (Marsaglia & Tsang, in Doornik's
// form: 128 layers, layer index and uniform from independent bits of one
// draw): fast, and independent of the standard library's distributions.
class ZigguratTables {
 public:
  static constexpr int kLayers = 128;
  static constexpr double kR = 3.442619855899;       // start of the tail
  static constexpr double kV = 9.91256303526217e-3;  // area of each layer

  ZigguratTables() {
    double f = std::exp(-0.5 * kR * kR);
    x[0] = kV / f;
    x[1] = kR;
    x[kLayers] = 0;
    for (int i = 2; i < kLayers; ++i) {
      x[i] = std::sqrt(-2.0 * std::log(kV / x[i - 1] + f));
      f = std::exp(-0.5 * x[i] * x[i]);
    }
    for (int i = 0; i < kLayers; ++i) ratio[i] = x[i + 1] / x[i];
  }

  double x[kLayers + 1];
  double ratio[kLayers];  // x[i+1] / x[i]: |u| below it lies inside layer i's rectangle
};

const ZigguratTables& ziggurat() {
  static const ZigguratTables tables;
  return tables;
}

class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : engine_(seed), zig_(ziggurat()) {}

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return engine_.uniform(); }

  // Uniform integer in [0, n), n >= 1.
  int64_t below(int64_t n) { return std::min(n - 1, int64_t(uniform() * double(n))); }

  double normal() {
    for (;;) {
      const uint64_t bits = engine_();
      const int i = int(bits & (ZigguratTables::kLayers - 1));
      const double u = double(bits >> 11) * 0x1p-52 - 1.0;  // [-1, 1)
      if (std::fabs(u) < zig_.ratio[i]) return u * zig_.x[i];
      if (i == 0) return tail(u < 0);
      const double x = u * zig_.x[i];
      const double f0 = std::exp(-0.5 * (zig_.x[i] * zig_.x[i] - x * x));
      const double f1 = std::exp(-0.5 * (zig_.x[i + 1] * zig_.x[i + 1] - x * x));
      if (f1 + uniform() * (f0 - f1) < 1.0) return x;
    }
  }

 private:
  // Beyond kR (Marsaglia's exponential rejection).
  double tail(bool negative) {
    double x;
    double y;
    do {
      x = std::log(open_uniform()) / ZigguratTables::kR;
      y = std::log(open_uniform());
    } while (-2.0 * y < x * x);
    return negative ? x - ZigguratTables::kR : ZigguratTables::kR - x;
  }
  double open_uniform() { return engine_.uniform_open(); }  // (0, 1)

  SplitMix64 engine_;
  const ZigguratTables& zig_;
};

// cos/sin of RoPE's angles at one position, shared by every vector rotated there.
class RopeAngles {
 public:
  RopeAngles(int head_dim, double theta)
      : inv_freq_(size_t(head_dim / 2)), cos_(inv_freq_.size()), sin_(inv_freq_.size()),
        step_cos_(inv_freq_.size()), step_sin_(inv_freq_.size()) {
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      inv_freq_[i] = std::pow(theta, -2.0 * double(i) / double(head_dim));
      step_cos_[i] = std::cos(inv_freq_[i]);
      step_sin_[i] = std::sin(inv_freq_[i]);
    }
  }

  void set_position(int64_t position) {
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      const double angle = double(position) * inv_freq_[i];
      cos_[i] = std::cos(angle);
      sin_[i] = std::sin(angle);
    }
  }

  // To position + 1 by one rotation step per pair (no sin/cos); over the
  // ~1000 steps of a chunk the angles drift by ~1e-13 rad, far below f32.
  void advance() {
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      const double c = cos_[i];
      cos_[i] = c * step_cos_[i] - sin_[i] * step_sin_[i];
      sin_[i] = sin_[i] * step_cos_[i] + c * step_sin_[i];
    }
  }

  // x [2 * half] rotated in place (fp64).
  void rotate(double* x) const {
    const size_t half = inv_freq_.size();
    for (size_t i = 0; i < half; ++i) {
      const double x0 = x[i];
      const double x1 = x[i + half];
      x[i] = x0 * cos_[i] - x1 * sin_[i];
      x[i + half] = x0 * sin_[i] + x1 * cos_[i];
    }
  }

 private:
  std::vector<double> inv_freq_;
  std::vector<double> cos_;
  std::vector<double> sin_;
  std::vector<double> step_cos_;  // rotation by one position
  std::vector<double> step_sin_;
};

void check_spec(const SyntheticSpec& s) {
  auto require = [](bool ok, const char* field, auto value, const char* rule) {
    if (!ok) fail(ErrorCode::kInvalidArgument, "SyntheticSpec.", field, " = ", value, ": ", rule);
  };
  require(s.n_tokens >= 1, "n_tokens", s.n_tokens, "must be >= 1");
  require(s.n_kv_heads >= 1, "n_kv_heads", s.n_kv_heads, "must be >= 1");
  require(s.n_q_heads >= 1 && s.n_q_heads % s.n_kv_heads == 0, "n_q_heads", s.n_q_heads,
          "must be a positive multiple of n_kv_heads");
  require(s.head_dim >= 8 && s.head_dim % 2 == 0, "head_dim", s.head_dim, "must be even and >= 8");
  require(s.block_size >= 1, "block_size", s.block_size, "must be >= 1");
  require(s.n_sinks >= 0 && s.n_sinks <= s.n_tokens, "n_sinks", s.n_sinks, "must be in [0, n_tokens]");
  require(s.recent_tokens >= 0 && s.recent_tokens <= s.n_tokens, "recent_tokens", s.recent_tokens,
          "must be in [0, n_tokens]");
  require(s.n_needles >= 0, "n_needles", s.n_needles, "must be >= 0");
  if (s.n_needles > 0) {
    require(s.needle_len >= 1 && s.needle_len <= s.block_size, "needle_len", s.needle_len,
            "must be in [1, block_size]");
  }
  require(std::isfinite(s.sink_norm) && s.sink_norm >= 0, "sink_norm", s.sink_norm, "must be finite and >= 0");
  require(std::isfinite(s.recency_bias) && s.recency_bias >= 0, "recency_bias", s.recency_bias,
          "must be finite and >= 0");
  require(std::isfinite(s.needle_strength) && s.needle_strength >= 0, "needle_strength", s.needle_strength,
          "must be finite and >= 0");
  require(std::isfinite(s.rope_theta) && s.rope_theta > 0, "rope_theta", s.rope_theta, "must be > 0");
  require(std::isfinite(s.logit_std) && s.logit_std > 0, "logit_std", s.logit_std, "must be finite and > 0");
  require(std::isfinite(s.channel_spread) && s.channel_spread >= 0 && s.channel_spread <= 4, "channel_spread",
          s.channel_spread, "must be in [0, 4]");
  require(s.head_noise >= 0 && s.head_noise <= 1, "head_noise", s.head_noise, "must be in [0, 1]");
}

// Blocks entirely inside [n_sinks, n_tokens - recent_tokens).
std::vector<int64_t> needle_eligible_blocks(const SyntheticSpec& s) {
  std::vector<int64_t> blocks;
  const int64_t end = s.n_tokens - s.recent_tokens;
  for (int64_t b = 0; (b + 1) * s.block_size <= end; ++b) {
    if (b * s.block_size >= s.n_sinks) blocks.push_back(b);
  }
  return blocks;
}

double dot(const double* a, const double* b, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Everything about one kv head's group that keys are built from.
struct Group {
  std::vector<double> scale;     // [d] channel scales s_c
  std::vector<double> sink_dir;  // [d] unit, pre-RoPE
  std::vector<double> direction; // [d] u_g: unit, post-RoPE at n_tokens
  std::vector<double> q;         // [g][d] post-RoPE query heads, each with sigma_h = sigma
  double sigma = 0;              // std of q_h.k over ordinary keys, every head
  double gain_per_unit = 0;      // mean_h q_h.u_g / sigma: q.k gain (in sigmas) of adding 1 * u_g

  // Mean over the group's heads of q_h.k / sigma.
  double mean_sigmas(const double* k) const {
    const size_t d = direction.size();
    const size_t g = q.size() / d;
    double sum = 0;
    for (size_t h = 0; h < g; ++h) sum += dot(q.data() + h * d, k, d);
    return sum / (double(g) * sigma);
  }
};

Group make_group(const SyntheticSpec& s, NormalSource& rng) {
  const size_t d = size_t(s.head_dim);
  const size_t half = d / 2;
  const size_t g = size_t(s.n_q_heads / s.n_kv_heads);
  Group group;

  group.scale.resize(d);
  double mean_square = 0;
  for (size_t i = 0; i < half; ++i) {
    const double scale = std::exp(double(s.channel_spread) * rng.normal());
    group.scale[i] = group.scale[i + half] = scale;
    mean_square += scale * scale / double(half);
  }
  for (double& scale : group.scale) scale /= std::sqrt(mean_square);

  // Sink direction on the lowest-frequency pairs (the last ones).
  const size_t sink_pairs = std::max<size_t>(1, half / 8);
  group.sink_dir.assign(d, 0.0);
  for (size_t i = half - sink_pairs; i < half; ++i) {
    group.sink_dir[i] = rng.normal();
    group.sink_dir[i + half] = rng.normal();
  }
  auto on_sink_pairs = [&](size_t c) { return c % half >= half - sink_pairs; };
  const double sink_length = std::sqrt(dot(group.sink_dir.data(), group.sink_dir.data(), d));
  for (double& x : group.sink_dir) x /= sink_length;

  auto sigma_of = [&](const double* q) {  // std of q.k over ordinary keys (rotation invariant)
    double sum = 0;
    for (size_t c = 0; c < d; ++c) sum += group.scale[c] * group.scale[c] * q[c] * q[c];
    return std::sqrt(sum);
  };

  // On the sink pairs the query is exactly sink_component * w_g (set, not
  // drawn): any other component there would rotate into w_g with the distance
  // and blur the sinks' scores at long range.
  std::vector<double> shared(d);
  for (size_t c = 0; c < d; ++c) shared[c] = on_sink_pairs(c) ? 0.0 : rng.normal();
  const double sink_component = sigma_of(shared.data()) / std::sqrt(double(d));
  for (size_t c = 0; c < d; ++c) shared[c] += sink_component * group.sink_dir[c];

  RopeAngles rope(s.head_dim, s.rope_theta);
  rope.set_position(s.n_tokens);
  group.direction = shared;
  rope.rotate(group.direction.data());
  const double norm = std::sqrt(dot(group.direction.data(), group.direction.data(), d));
  for (double& x : group.direction) x /= norm;

  group.sigma = double(s.logit_std) * std::sqrt(double(d));
  group.q.resize(g * d);
  for (size_t h = 0; h < g; ++h) {
    double* q = group.q.data() + h * d;
    for (size_t c = 0; c < d; ++c) {  // heads agree on the sinks
      const double noise = double(s.head_noise) * rng.normal();
      q[c] = shared[c] + (on_sink_pairs(c) ? 0.0 : noise);
    }
    rope.rotate(q);
    const double factor = group.sigma / sigma_of(q);
    for (size_t c = 0; c < d; ++c) q[c] *= factor;
  }
  group.gain_per_unit = group.mean_sigmas(group.direction.data());
  if (!(group.gain_per_unit > 0)) {
    fail(ErrorCode::kInvalidArgument, "SyntheticSpec.head_noise = ", s.head_noise, ": with seed ", s.seed,
         " the query heads of a group share no direction (mean alignment ", group.gain_per_unit,
         "); use a smaller head_noise");
  }
  return group;
}

}  // namespace

void apply_rope(float* x, int head_dim, int64_t position, double theta) {
  if (head_dim < 2 || head_dim % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "apply_rope: head_dim ", head_dim, " must be even and >= 2");
  }
  if (!(theta > 0) || !std::isfinite(theta)) fail(ErrorCode::kInvalidArgument, "apply_rope: theta ", theta, " must be > 0");
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = double(position) * std::pow(theta, -2.0 * double(i) / double(head_dim));
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    const double x0 = x[i];
    const double x1 = x[i + half];
    x[i] = float(x0 * c - x1 * s);
    x[i + half] = float(x0 * s + x1 * c);
  }
}

SyntheticWorkload make_synthetic(const SyntheticSpec& spec) {
  check_spec(spec);
  const std::vector<int64_t> eligible = needle_eligible_blocks(spec);
  if (int64_t(eligible.size()) < spec.n_needles) {
    fail(ErrorCode::kInvalidArgument, "SyntheticSpec.n_needles = ", spec.n_needles, ": only ", eligible.size(),
         " blocks of ", spec.block_size, " tokens lie between the ", spec.n_sinks, " sinks and the ",
         spec.recent_tokens, " recent tokens of ", spec.n_tokens);
  }

  NormalSource rng(spec.seed);
  const size_t d = size_t(spec.head_dim);
  const size_t n_kv = size_t(spec.n_kv_heads);
  const size_t g = size_t(spec.n_q_heads / spec.n_kv_heads);

  std::vector<Group> groups;
  for (size_t h = 0; h < n_kv; ++h) groups.push_back(make_group(spec, rng));

  SyntheticWorkload w;
  w.spec = spec;

  // Needles: distinct blocks by a partial Fisher-Yates shuffle, a random offset in each.
  std::vector<int64_t> pool = eligible;
  for (int i = 0; i < spec.n_needles; ++i) {
    const size_t j = size_t(i) + size_t(rng.below(int64_t(pool.size()) - i));
    std::swap(pool[size_t(i)], pool[j]);
    const int64_t block = pool[size_t(i)];
    const int64_t first = block * spec.block_size + rng.below(spec.block_size - spec.needle_len + 1);
    w.needle_blocks.push_back(block);
    for (int t = 0; t < spec.needle_len; ++t) w.needle_tokens.push_back(first + t);
  }
  std::sort(w.needle_blocks.begin(), w.needle_blocks.end());
  std::sort(w.needle_tokens.begin(), w.needle_tokens.end());

  w.q.resize(size_t(spec.n_q_heads) * d);
  for (size_t h = 0; h < n_kv; ++h) {
    for (size_t i = 0; i < g * d; ++i) w.q[h * g * d + i] = float(groups[h].q[i]);
  }

  // Tokens in chunks, each drawn from its own stream: the bytes do not depend
  // on the number of threads.
  const size_t n = size_t(spec.n_tokens);
  w.k.resize(n * n_kv * d);
  w.v.resize(n * n_kv * d);
  const size_t n_chunks = (n + kChunkTokens - 1) / kChunkTokens;
  tbb::parallel_for(size_t{0}, n_chunks, [&](size_t chunk) {
    NormalSource chunk_rng(chunk_seed(spec.seed, chunk));
    RopeAngles rope(spec.head_dim, spec.rope_theta);
    std::vector<double> key(d);
    rope.set_position(int64_t(chunk * kChunkTokens));
    for (size_t t = chunk * kChunkTokens; t < std::min(n, (chunk + 1) * kChunkTokens); ++t, rope.advance()) {
      const bool is_sink = t < size_t(spec.n_sinks);
      const bool is_needle = std::binary_search(w.needle_tokens.begin(), w.needle_tokens.end(), int64_t(t));
      const size_t distance = n - 1 - t;
      const bool is_recent = distance < size_t(spec.recent_tokens);
      for (size_t h = 0; h < n_kv; ++h) {
        const Group& group = groups[h];
        for (size_t c = 0; c < d; ++c) key[c] = group.scale[c] * chunk_rng.normal();
        if (is_sink) {
          const double length = double(spec.sink_norm) * std::sqrt(double(d));
          for (size_t c = 0; c < d; ++c) key[c] += length * group.sink_dir[c];
        }
        rope.rotate(key.data());
        // Post-RoPE additions along the group direction, sized in sigmas of q.k.
        double extra = 0;
        if (is_recent) extra += double(spec.recency_bias) * (1.0 - double(distance) / double(spec.recent_tokens));
        if (is_needle) extra += double(spec.needle_strength) - group.mean_sigmas(key.data());
        const double amount = extra / group.gain_per_unit;
        float* k_out = w.k.data() + (t * n_kv + h) * d;
        for (size_t c = 0; c < d; ++c) k_out[c] = float(key[c] + amount * group.direction[c]);

        const double value_scale = is_sink ? kSinkValueScale : is_needle ? kNeedleValueScale : 1.0;
        float* v_out = w.v.data() + (t * n_kv + h) * d;
        for (size_t c = 0; c < d; ++c) v_out[c] = float(value_scale * chunk_rng.normal());
      }
    }
  });
  return w;
}

}  // namespace longctx::workloads
