// Picks the next token from a row of logits (longctx-chat).
//
// temperature == 0: greedy, the argmax (the lowest index among equal maxima);
// no random numbers are drawn. Otherwise, in this order:
//   1. p_i = softmax(logits / temperature), in double;
//   2. top_k > 0: keep the top_k most probable tokens;
//   3. top_p < 1: of those, keep the smallest most-probable prefix whose
//      probability (renormalized over what step 2 kept) reaches top_p — at
//      least one token;
//   4. draw from what is kept, renormalized, with a std::mt19937_64 seeded
//      by `seed` (same seed and logits -> same tokens, on every platform:
//      the draw uses the generator's raw 64-bit output, not a std::
//      distribution whose algorithm is implementation-defined).
// Ties in probability are ordered by token id, so truncation is deterministic.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace longctx::model {

struct SamplerParams {
  double temperature = 0.0;  // 0 = greedy; must be >= 0 and finite
  int top_k = 0;             // 0 = every token
  double top_p = 1.0;        // in [0, 1]; 1 = off
  uint64_t seed = 0;
};

// The index of the largest logit (lowest index among ties). Error
// (kInvalidArgument) for an empty row or a NaN.
int32_t argmax(std::span<const float> logits);

// The distribution step 4 draws from: (token, probability) pairs, most probable
// first (ties by token id), probabilities summing to 1. temperature must be > 0.
// Error(kInvalidArgument) for an empty row, a NaN, or parameters out of range.
std::vector<std::pair<int32_t, double>> sampling_distribution(std::span<const float> logits,
                                                              const SamplerParams& params);

class Sampler {
 public:
  // Error(kInvalidArgument) for parameters out of range.
  explicit Sampler(const SamplerParams& params);
  // The next token.
  int32_t sample(std::span<const float> logits);
  const SamplerParams& params() const { return params_; }

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
};

}  // namespace longctx::model
