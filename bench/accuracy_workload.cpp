// Question workloads of longctx-bench accuracy (construction in accuracy.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <utility>

#include "accuracy.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/random.h"
#include "longctx/workloads/synthetic.h"

namespace longctx::bench::accuracy {
namespace {

// Standard normals from SplitMix64 by Box-Muller: the same numbers on every platform.
class Normal {
 public:
  explicit Normal(uint64_t seed) : engine_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  double operator()() {
    const double u1 = engine_.uniform_open();
    const double u2 = engine_.uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  uint64_t next() { return engine_.next(); }

 private:
  SplitMix64 engine_;
};

// The generator's sink pairs: the d/16 lowest-frequency RoPE pairs (synthetic.cpp).
bool on_sink_pair(int c, int d) {
  const int half = d / 2;
  return c % half >= half - std::max(1, half / 8);
}

// Scales the non-sink channels of one query head x [d] (kv head g) so that
// its logit std over ordinary keys, sqrt(sum_c s_c^2 x_c^2), is sigma again.
void rescale_nonsink(const Workload& w, int g, double* x) {
  const int d = w.shape.head_dim;
  const double* e = w.pair_energy.data() + size_t(g) * size_t(d);
  double sink = 0, rest = 0;
  for (int c = 0; c < d; ++c) (on_sink_pair(c, d) ? sink : rest) += e[c] * x[c] * x[c];
  const double f = rest > 0 ? std::sqrt(std::max(0.0, w.sigma * w.sigma - sink) / rest) : 0.0;
  for (int c = 0; c < d; ++c)
    if (!on_sink_pair(c, d)) x[c] *= f;
}

// A new question's query: the generator's recipe (group direction + head
// noise 0.2) on the non-sink channels, question 0's sink channels (every
// question attends the sinks the same way).
std::vector<float> fresh_query(const Workload& w, const std::vector<float>& q0, Normal& rng) {
  const int d = w.shape.head_dim, g = w.shape.q_heads / w.shape.kv_heads;
  std::vector<float> q(q0.size());
  std::vector<double> shared(static_cast<size_t>(d)), x(static_cast<size_t>(d));
  for (int kv = 0; kv < w.shape.kv_heads; ++kv) {
    for (int c = 0; c < d; ++c) shared[size_t(c)] = on_sink_pair(c, d) ? 0.0 : rng();
    for (int h = kv * g; h < (kv + 1) * g; ++h) {
      for (int c = 0; c < d; ++c)
        x[size_t(c)] = on_sink_pair(c, d) ? double(q0[size_t(h * d + c)]) : shared[size_t(c)] + 0.2 * rng();
      rescale_nonsink(w, kv, x.data());
      for (int c = 0; c < d; ++c) q[size_t(h * d + c)] = float(x[size_t(c)]);
    }
  }
  return q;
}

// Pushes the keys of `tokens` in the needle heads along the question's group
// direction (non-sink channels of the group's mean query) until the group's
// mean q.k / sigma is the needle strength.
void add_needles(Workload& w, const std::vector<float>& q, const std::vector<int64_t>& tokens) {
  const int d = w.shape.head_dim, g = w.shape.q_heads / w.shape.kv_heads;
  for (int kv : w.shape.needle_heads) {
    std::vector<double> mean(size_t(d), 0.0), u(size_t(d), 0.0);
    for (int h = kv * g; h < (kv + 1) * g; ++h)
      for (int c = 0; c < d; ++c) mean[size_t(c)] += double(q[size_t(h * d + c)]) / g;
    double norm = 0;
    for (int c = 0; c < d; ++c) {
      if (!on_sink_pair(c, d)) u[size_t(c)] = mean[size_t(c)];
      norm += u[size_t(c)] * u[size_t(c)];
    }
    norm = std::sqrt(norm);
    for (double& x : u) x /= norm;
    double gain = 0;  // q.k gain (in sigma) of adding 1 * u
    for (int c = 0; c < d; ++c) gain += mean[size_t(c)] * u[size_t(c)] / w.sigma;
    for (int64_t t : tokens) {
      float* k = w.k.data() + (size_t(t) * size_t(w.shape.kv_heads) + size_t(kv)) * size_t(d);
      double now = 0;
      for (int c = 0; c < d; ++c) now += mean[size_t(c)] * double(k[c]) / w.sigma;
      const double amount = (double(w.shape.needle_strength) - now) / gain;
      for (int c = 0; c < d; ++c) k[c] = float(double(k[c]) + amount * u[size_t(c)]);
    }
  }
}

}  // namespace

Workload make_workload(const Shape& shape, int64_t n_tokens, const std::vector<int>& spans, int64_t needle_free_tail,
                       uint64_t seed) {
  for (int kv : shape.needle_heads)
    if (kv < 0 || kv >= shape.kv_heads)
      fail(ErrorCode::kInvalidArgument, "accuracy: needle head ", kv, " outside [0, ", shape.kv_heads, ")");
  int total_spans = 0;
  for (int s : spans) total_spans += s;
  workloads::SyntheticSpec spec;
  spec.n_tokens = n_tokens;
  spec.n_q_heads = shape.q_heads;
  spec.n_kv_heads = shape.kv_heads;
  spec.head_dim = shape.head_dim;
  spec.block_size = shape.block_size;
  spec.n_sinks = shape.n_sinks;
  spec.recent_tokens = int(std::max<int64_t>(shape.local_len, needle_free_tail));
  spec.n_needles = total_spans;
  spec.needle_len = 4;
  spec.needle_strength = 0.f;  // placed, values 4x, keys neutral: the questions make them needles
  spec.rope_theta = shape.rope_theta;
  spec.seed = seed;
  workloads::SyntheticWorkload s = workloads::make_synthetic(spec);

  Workload w;
  w.shape = shape;
  w.n_tokens = n_tokens;
  w.k = std::move(s.k);
  w.v = std::move(s.v);
  w.sigma = double(spec.logit_std) * std::sqrt(double(shape.head_dim));

  // Channel energies s_c^2 from up to 8192 ordinary keys; a RoPE pair shares
  // its scale and rotation keeps the pair's energy, so average within pairs.
  const int d = shape.head_dim, half = d / 2;
  const int64_t first = shape.block_size, last = n_tokens - spec.recent_tokens;
  const int64_t stride = std::max<int64_t>(1, (last - first) / 8192);
  w.pair_energy.assign(size_t(shape.kv_heads) * size_t(d), 0.0);
  for (int kv = 0; kv < shape.kv_heads; ++kv) {
    double* e = w.pair_energy.data() + size_t(kv) * size_t(d);
    int64_t count = 0;
    for (int64_t t = first; t < last; t += stride) {
      if (std::binary_search(s.needle_tokens.begin(), s.needle_tokens.end(), t)) continue;
      const float* k = w.k.data() + (size_t(t) * size_t(shape.kv_heads) + size_t(kv)) * size_t(d);
      for (int i = 0; i < half; ++i) e[i] += 0.5 * (double(k[i]) * k[i] + double(k[i + half]) * k[i + half]);
      ++count;
    }
    for (int i = 0; i < half; ++i) e[i + half] = (e[i] /= double(std::max<int64_t>(count, 1)));
  }

  // Spans (needle_len consecutive tokens each) shuffled, then dealt to the questions in order.
  Normal rng(seed ^ 0xA5A5A5A5ull);
  std::vector<int> order(static_cast<size_t>(total_spans));
  for (int i = 0; i < total_spans; ++i) order[size_t(i)] = i;
  for (int i = total_spans - 1; i > 0; --i) std::swap(order[size_t(i)], order[rng.next() % uint64_t(i + 1)]);
  size_t next_span = 0;
  for (size_t j = 0; j < spans.size(); ++j) {
    Question question;
    question.q = j == 0 ? s.q : fresh_query(w, s.q, rng);
    for (int i = 0; i < spans[j]; ++i, ++next_span) {
      const int span = order[next_span];
      for (int t = 0; t < spec.needle_len; ++t) question.needle_tokens.push_back(s.needle_tokens[size_t(span * 4 + t)]);
      question.needle_blocks.push_back(s.needle_tokens[size_t(span * 4)] / shape.block_size);
    }
    std::sort(question.needle_tokens.begin(), question.needle_tokens.end());
    std::sort(question.needle_blocks.begin(), question.needle_blocks.end());
    add_needles(w, question.q, question.needle_tokens);
    w.questions.push_back(std::move(question));
  }

  // Round the keys to f16 once: the store keeps exactly these, so the fp64
  // dense probabilities describe what it holds.
  std::vector<uint16_t> half_keys(w.k.size());
  convert(w.k.data(), DType::kF32, half_keys.data(), DType::kF16, w.k.size());
  convert(half_keys.data(), DType::kF16, w.k.data(), DType::kF32, w.k.size());

  // The prompt ends with question 0: its last tokens' queries are variations of q_0.
  for (int i = 0; i < shape.window; ++i) {
    const std::vector<float> q = vary_query(w, w.questions[0].q, 0.5, seed * 7919 + uint64_t(i));
    w.window_q.insert(w.window_q.end(), q.begin(), q.end());
  }
  return w;
}

std::vector<float> vary_query(const Workload& w, const std::vector<float>& q, double eps, uint64_t seed) {
  const int d = w.shape.head_dim, g = w.shape.q_heads / w.shape.kv_heads;
  Normal rng(seed + 0x1234567ull);
  std::vector<float> out(q.size());
  std::vector<double> x(static_cast<size_t>(d));
  for (int h = 0; h < w.shape.q_heads; ++h) {
    double square = 0;
    int count = 0;
    for (int c = 0; c < d; ++c)
      if (!on_sink_pair(c, d)) square += double(q[size_t(h * d + c)]) * q[size_t(h * d + c)], ++count;
    const double noise = eps * std::sqrt(square / std::max(count, 1));
    for (int c = 0; c < d; ++c)
      x[size_t(c)] = double(q[size_t(h * d + c)]) + (on_sink_pair(c, d) ? 0.0 : noise * rng());
    rescale_nonsink(w, h / g, x.data());
    for (int c = 0; c < d; ++c) out[size_t(h * d + c)] = float(x[size_t(c)]);
  }
  return out;
}

namespace {
bool attends(const std::vector<cpu::TokenSpan>& spans, int64_t token) {
  auto after = std::upper_bound(spans.begin(), spans.end(), token,
                                [](int64_t t, const cpu::TokenSpan& s) { return t < s.begin; });
  return after != spans.begin() && token < std::prev(after)->end;
}
}  // namespace

double needle_recall(const cpu::Selection& selection, const std::vector<int>& heads,
                     const std::vector<int64_t>& tokens) {
  if (heads.empty() || tokens.empty()) return 1.0;
  int64_t hit = 0;
  for (int kv : heads)
    for (int64_t t : tokens) hit += attends(selection.spans.at(size_t(kv)), t) ? 1 : 0;
  return double(hit) / double(heads.size() * tokens.size());
}

cpu::Selection heads_only(const cpu::Selection& selection, const std::vector<int>& heads) {
  cpu::Selection out;
  for (int kv : heads) out.spans.push_back(selection.spans.at(size_t(kv)));
  return out;
}

double missed_mass(const std::vector<double>& probs, int q_heads, int64_t n_tokens, const cpu::Selection& selection) {
  const int g = q_heads / int(selection.spans.size());
  double missed = 0;
  for (int h = 0; h < q_heads; ++h) {
    double kept = 0;
    for (const cpu::TokenSpan& span : selection.spans[size_t(h / g)])
      for (int64_t t = span.begin; t < span.end; ++t) kept += probs[size_t(h) * size_t(n_tokens) + size_t(t)];
    missed += std::max(0.0, 1.0 - kept);
  }
  return missed / q_heads;
}

double mean_tokens(const cpu::Selection& selection) {
  double total = 0;
  for (size_t h = 0; h < selection.spans.size(); ++h) total += double(selection.tokens(int(h)));
  return selection.spans.empty() ? 0.0 : total / double(selection.spans.size());
}

double sig4(double x) {
  if (!std::isfinite(x) || x == 0) return x;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return std::strtod(buf, nullptr);
}

std::string pct_name(double pct) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", pct);
  return buf;
}

}  // namespace longctx::bench::accuracy
