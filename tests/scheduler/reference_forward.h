// A plain fp64 forward pass of a Llama-family decoder over host weights, the
// reference the scheduler and model tests compare longctx's logits with; and
// the tolerance of an fp32 implementation against it.
//
// Written for clarity: every token at once, causal attention (full, or the
// keys a sparse decode step keeps), fp64 everywhere. Scores are q.k *
// spec.attn_scale (0: 1/sqrt(head_dim)). Weights are given as f32 host arrays in the [out, in] layout of
// scheduler::Transformer. RoPE angles are position * theta^(-2i/n_rot)
// (divided by freq_factors[i] when given, by `factor` for linear scaling;
// YaRN as transformers' Qwen2 computes it, below).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/core/error.h"
#include "longctx/scheduler/transformer.h"
#include "test_seed.h"

namespace longctx::testing {

struct HostLayer {
  std::vector<float> attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w_gate, w_up, w_down;
};

struct HostModel {
  scheduler::TransformerSpec spec;
  std::vector<float> token_embd, output_norm, output;  // output empty: tied to token_embd
  std::vector<HostLayer> layers;
};

// n tokens uniform in [0, n_vocab), reproducible from seed.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(test_seed(seed));
  std::uniform_int_distribution<int32_t> dist(0, int32_t(n_vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

// Random weights of the given spec: matrices uniform in +-1/sqrt(in) (unit
// output variance for unit inputs), norm weights around 1, biases +-0.5.
inline HostModel random_host_model(const scheduler::TransformerSpec& spec, uint32_t seed, bool tied = false) {
  std::mt19937 rng(test_seed(seed));
  auto uniform = [&](int64_t n, double lo, double hi) {
    std::uniform_real_distribution<float> dist{float(lo), float(hi)};
    std::vector<float> x(static_cast<size_t>(n), 0.0f);
    for (float& e : x) e = dist(rng);
    return x;
  };
  auto matrix = [&](int64_t out, int64_t in) {
    const double a = 1.0 / std::sqrt(double(in));
    return uniform(out * in, -a, a);
  };
  const int64_t d = spec.n_embd, q = spec.q_dim(), kv = spec.kv_dim(), ff = spec.n_ff;
  HostModel m;
  m.spec = spec;
  m.token_embd = uniform(spec.n_vocab * d, -1, 1);
  m.output_norm = uniform(d, 0.5, 1.5);
  if (!tied) m.output = matrix(spec.n_vocab, d);
  for (int l = 0; l < spec.n_layers; ++l) {
    HostLayer L;
    L.attn_norm = uniform(d, 0.5, 1.5);
    // Larger q/k weights make attention peaked enough that wrong positions show.
    L.wq = uniform(q * d, -2.0 / std::sqrt(double(d)), 2.0 / std::sqrt(double(d)));
    L.wk = uniform(kv * d, -2.0 / std::sqrt(double(d)), 2.0 / std::sqrt(double(d)));
    L.wv = matrix(kv, d);
    if (spec.qkv_bias) {
      L.bq = uniform(q, -0.5, 0.5);
      L.bk = uniform(kv, -0.5, 0.5);
      L.bv = uniform(kv, -0.5, 0.5);
    }
    L.wo = matrix(d, q);
    L.ffn_norm = uniform(d, 0.5, 1.5);
    L.w_gate = matrix(ff, d);
    L.w_up = matrix(ff, d);
    L.w_down = matrix(d, ff);
    m.layers.push_back(std::move(L));
  }
  return m;
}

// The host model's weights on `backend` (load_weight of each array).
inline scheduler::Transformer upload_model(const HostModel& m, Backend& backend) {
  auto load = [&](const std::vector<float>& data, std::vector<int64_t> shape) {
    TensorView view = shape.size() == 1 ? make_view(data.data(), DType::kF32, {shape[0]})
                                        : make_view(data.data(), DType::kF32, {shape[0], shape[1]});
    return backend.load_weight(view);
  };
  const scheduler::TransformerSpec& s = m.spec;
  const int64_t d = s.n_embd, q = s.q_dim(), kv = s.kv_dim(), ff = s.n_ff;
  scheduler::Transformer t;
  t.spec = s;
  t.weights.token_embd = load(m.token_embd, {s.n_vocab, d});
  t.weights.output_norm = load(m.output_norm, {d});
  if (!m.output.empty()) t.weights.output = load(m.output, {s.n_vocab, d});
  for (const HostLayer& L : m.layers) {
    scheduler::LayerWeights w;
    w.attn_norm = load(L.attn_norm, {d});
    w.wq = load(L.wq, {q, d});
    w.wk = load(L.wk, {kv, d});
    w.wv = load(L.wv, {kv, d});
    if (s.qkv_bias) {
      w.bq = load(L.bq, {q});
      w.bk = load(L.bk, {kv});
      w.bv = load(L.bv, {kv});
    }
    w.wo = load(L.wo, {d, q});
    w.ffn_norm = load(L.ffn_norm, {d});
    w.w_gate = load(L.w_gate, {ff, d});
    w.w_up = load(L.w_up, {ff, d});
    w.w_down = load(L.w_down, {d, ff});
    t.weights.layers.push_back(std::move(w));
  }
  return t;
}

namespace detail {

// y[n][out] = x[n][in] . w[out][in]^T + b
inline std::vector<double> linear(const std::vector<double>& x, int64_t n, int64_t in, const std::vector<float>& w,
                                  int64_t out, const std::vector<float>& b) {
  std::vector<double> y(size_t(n * out));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double sum = b.empty() ? 0.0 : double(b[size_t(o)]);
      for (int64_t i = 0; i < in; ++i) sum += x[size_t(t * in + i)] * double(w[size_t(o * in + i)]);
      y[size_t(t * out + o)] = sum;
    }
  return y;
}

inline std::vector<double> rms_norm(const std::vector<double>& x, int64_t n, int64_t d, const std::vector<float>& w,
                                    double eps) {
  std::vector<double> y(x.size());
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += x[size_t(t * d + i)] * x[size_t(t * d + i)];
    const double r = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t i = 0; i < d; ++i) y[size_t(t * d + i)] = x[size_t(t * d + i)] * r * double(w[size_t(i)]);
  }
  return y;
}

// In place on x[n][heads][head_dim], row t at position first_pos + t.
inline void rope(std::vector<double>& x, int64_t n, int heads, int head_dim, int64_t first_pos, const RopeParams& p) {
  const int half = p.n_rot / 2;
  // YaRN (transformers' _compute_yarn_parameters): the dimension whose
  // wavelength fits `turns` times into the original context is
  // n_rot ln(L / (2 pi turns)) / (2 ln theta); below the floor of the one for
  // beta_fast frequencies stay, above the ceiling of the one for beta_slow
  // they are interpolated, a linear ramp between; cos and sin grow by
  // 0.1 ln s + 1, and for every scaling by attn_factor.
  const bool yarn = p.scaling == RopeScaling::kYarn;
  const auto dim_of = [&](double turns) {
    return p.n_rot * std::log(double(p.original_context) / (turns * 2.0 * 3.14159265358979323846)) /
           (2.0 * std::log(double(p.theta)));
  };
  const double low = yarn ? std::max(std::floor(dim_of(p.beta_fast)), 0.0) : 0.0;
  const double high = yarn ? std::min(std::ceil(dim_of(p.beta_slow)), double(p.n_rot - 1)) : 0.0;
  const double mscale = double(p.attn_factor) * (yarn ? 0.1 * std::log(double(p.factor)) + 1.0 : 1.0);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h) {
      double* v = &x[size_t((t * heads + h) * head_dim)];
      for (int i = 0; i < half; ++i) {
        double inv_freq = std::pow(double(p.theta), -2.0 * i / double(p.n_rot));
        if (!p.freq_factors.empty()) inv_freq /= double(p.freq_factors[size_t(i)]);
        if (p.scaling == RopeScaling::kLinear) inv_freq /= double(p.factor);
        if (yarn) {
          const double interpolated = std::min(std::max((i - low) / std::max(high - low, 0.001), 0.0), 1.0);
          inv_freq = inv_freq / double(p.factor) * interpolated + inv_freq * (1.0 - interpolated);
        }
        const double angle = double(first_pos + t) * inv_freq;
        const double c = std::cos(angle) * mscale, s = std::sin(angle) * mscale;
        const int a = p.style == RopeStyle::kNormal ? 2 * i : i;
        const int b = p.style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
}

}  // namespace detail

// Whether the query at position `query` attends the key at `key` <= query.
using KeyFilter = std::function<bool(int64_t query, int64_t key)>;

// The keys of StreamingLLM (policy streaming): prompt positions [0,
// n_prompt) attend every earlier key (prefill); a decode step at position p
// attends the first initial_len keys and the last `window` of the p + 1 the
// layer then holds (kvstore::Partition's ranges).
inline KeyFilter streaming_keys(int64_t n_prompt, int64_t initial_len, int64_t window) {
  return [=](int64_t query, int64_t key) {
    if (query < n_prompt) return true;
    const int64_t n = query + 1;
    const int64_t initial_end = std::min(initial_len, n);
    return key < initial_end || key >= std::max(initial_end, n - window);
  };
}

// fp64 logits [n, n_vocab] of every position of `tokens` (positions 0..n-1);
// each query attends the keys up to its position that `attends` keeps (every
// one when empty).
inline std::vector<double> reference_logits(const HostModel& m, std::span<const int32_t> tokens,
                                            const KeyFilter& attends = {}) {
  using namespace detail;
  const scheduler::TransformerSpec& s = m.spec;
  if (s.rope.scaling == RopeScaling::kLlama3) fail(ErrorCode::kUnsupported, "reference: llama3 scaling");
  const int64_t n = int64_t(tokens.size()), d = s.n_embd, hd = s.head_dim, ff = s.n_ff;
  const int g = s.n_heads / s.n_kv_heads;
  const double scale = s.attn_scale > 0 ? double(s.attn_scale) : 1.0 / std::sqrt(double(hd));
  std::vector<double> x(size_t(n * d));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) x[size_t(t * d + i)] = m.token_embd[size_t(tokens[size_t(t)] * d + i)];
  for (const HostLayer& L : m.layers) {
    const std::vector<double> xn = rms_norm(x, n, d, L.attn_norm, s.rms_eps);
    std::vector<double> q = linear(xn, n, d, L.wq, s.q_dim(), L.bq);
    std::vector<double> k = linear(xn, n, d, L.wk, s.kv_dim(), L.bk);
    const std::vector<double> v = linear(xn, n, d, L.wv, s.kv_dim(), L.bv);
    rope(q, n, s.n_heads, s.head_dim, 0, s.rope);
    rope(k, n, s.n_kv_heads, s.head_dim, 0, s.rope);
    std::vector<double> attn(size_t(n * s.q_dim()), 0.0);
    std::vector<double> p(static_cast<size_t>(n), 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < s.n_heads; ++h) {
        const int kvh = h / g;
        const double* qv = &q[size_t((t * s.n_heads + h) * hd)];
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          const double* kv = &k[size_t((u * s.n_kv_heads + kvh) * hd)];
          double dot = 0.0;
          for (int64_t c = 0; c < hd; ++c) dot += qv[c] * kv[c];
          p[size_t(u)] = !attends || attends(t, u) ? dot * scale : -INFINITY;  // exp(-inf) = 0: left out
          mx = std::max(mx, p[size_t(u)]);
        }
        double sum = 0.0;
        for (int64_t u = 0; u <= t; ++u) sum += (p[size_t(u)] = std::exp(p[size_t(u)] - mx));
        double* o = &attn[size_t((t * s.n_heads + h) * hd)];
        for (int64_t u = 0; u <= t; ++u) {
          const double* vv = &v[size_t((u * s.n_kv_heads + kvh) * hd)];
          for (int64_t c = 0; c < hd; ++c) o[c] += p[size_t(u)] / sum * vv[c];
        }
      }
    const std::vector<double> o = linear(attn, n, s.q_dim(), L.wo, d, {});
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const std::vector<double> hn = rms_norm(x, n, d, L.ffn_norm, s.rms_eps);
    const std::vector<double> gate = linear(hn, n, d, L.w_gate, ff, {});
    const std::vector<double> up = linear(hn, n, d, L.w_up, ff, {});
    std::vector<double> act(gate.size());
    for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    const std::vector<double> down = linear(act, n, ff, L.w_down, d, {});
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  const std::vector<double> xn = rms_norm(x, n, d, m.output_norm, s.rms_eps);
  return linear(xn, n, d, m.output.empty() ? m.token_embd : m.output, s.n_vocab, {});
}

// Tolerance of fp32 logits against reference_logits, per logit. An fp32 dot
// product of length K has an error of at most gamma_K ~= K u (u = 2^-24;
// Higham, Accuracy and Stability of Numerical Algorithms, 3.1) relative to
// the sum of |terms|. A layer has five chains of such sums: q/k/v, attention
// (scores and the weighted sum over <= n tokens), o, the MLP's gate/up, and
// its down projection; RMSNorm rescales its input, and the weights here keep
// activations of unit scale, so each layer adds about 5 K_max u of relative
// error and the output head K_max u more, relative to the scale of the
// logits (their largest magnitude). kv_u adds the KV store's rounding (its
// unit roundoff, 0 for f32) once per layer. A worst-case bound: observed
// errors are ~100x smaller, while a wrong position, weight or mask moves the
// logits by 1e-2 or more.
inline double logits_tolerance(const scheduler::TransformerSpec& s, int64_t n_tokens, double max_abs_logit,
                               double kv_u = 0.0) {
  const double u = std::ldexp(1.0, -24);
  const double k_max = double(std::max<int64_t>({s.n_embd, s.n_ff, s.q_dim(), n_tokens}));
  const double per_layer = 5.0 * k_max * u + kv_u;
  return (double(s.n_layers) * per_layer + k_max * u) * std::max(1.0, max_abs_logit);
}

}  // namespace longctx::testing
