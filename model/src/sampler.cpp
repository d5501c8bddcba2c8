#include "longctx/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "longctx/core/error.h"

namespace longctx::model {

namespace {

void check_params(const SamplerParams& p) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature))
    fail(ErrorCode::kInvalidArgument, "sampler: temperature must be a finite number >= 0, got ", p.temperature);
  if (p.top_k < 0) fail(ErrorCode::kInvalidArgument, "sampler: top_k must be >= 0, got ", p.top_k);
  if (!(p.top_p >= 0.0 && p.top_p <= 1.0))
    fail(ErrorCode::kInvalidArgument, "sampler: top_p must be in [0, 1], got ", p.top_p);
}

void check_logits(std::span<const float> logits) {
  if (logits.empty()) fail(ErrorCode::kInvalidArgument, "sampler: empty logits");
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isnan(logits[i])) fail(ErrorCode::kInvalidArgument, "sampler: logit ", i, " is NaN");
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  check_logits(logits);
  // max_element returns the first of equal maxima.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<std::pair<int32_t, double>> sampling_distribution(std::span<const float> logits,
                                                              const SamplerParams& params) {
  check_params(params);
  if (params.temperature == 0.0)
    fail(ErrorCode::kInvalidArgument, "sampling_distribution: temperature 0 is greedy, not a distribution");
  check_logits(logits);
  const size_t n = logits.size();
  // Token order: larger logit first, then lower id (same order as probability).
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  };
  const size_t k = params.top_k > 0 ? std::min(n, size_t(params.top_k)) : n;
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), before);
  order.resize(k);

  // Softmax over the kept tokens (renormalizing after top-k is the same as
  // taking the softmax of what is kept). -inf logits get probability 0.
  const double max = logits[size_t(order[0])];
  std::vector<std::pair<int32_t, double>> dist;
  dist.reserve(k);
  double sum = 0.0;
  for (const int32_t id : order) {
    const double w = std::isinf(max) ? (logits[size_t(id)] == max ? 1.0 : 0.0)
                                     : std::exp((double(logits[size_t(id)]) - max) / params.temperature);
    dist.emplace_back(id, w);
    sum += w;
  }
  for (auto& [id, p] : dist) p /= sum;

  if (params.top_p < 1.0) {
    double cumulative = 0.0;
    size_t keep = 0;
    while (keep < dist.size()) {
      cumulative += dist[keep].second;
      ++keep;
      if (cumulative >= params.top_p) break;
    }
    dist.resize(keep);
    for (auto& [id, p] : dist) p /= cumulative;
  }
  // Tokens of probability 0 (-inf logits) are never drawn.
  while (dist.size() > 1 && dist.back().second == 0.0) dist.pop_back();
  return dist;
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) { check_params(params); }

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0) return argmax(logits);
  const auto dist = sampling_distribution(logits, params_);
  // u in [0, 1) from the top 53 bits: the same on every standard library.
  const double u = double(rng_() >> 11) * 0x1.0p-53;
  double cumulative = 0.0;
  for (const auto& [id, p] : dist) {
    cumulative += p;
    if (u < cumulative) return id;
  }
  return dist.back().first;  // rounding left u >= the sum
}

}  // namespace longctx::model
