// Synthetic attention workloads with the structure real attention has, for
// tests and the accuracy/kernels benchmarks: large-norm sink keys at the
// start, a recency bias, "needle" keys aligned with the query hidden in random
// blocks, RoPE applied to q and k, everything reproducible from a seed.
//
// Construction (d = head_dim, pairs (i, i + d/2) are RoPE's rotation pairs,
// sigma = logit_std * sqrt(d), everything per kv head g unless said otherwise):
//   Channel scales  s_i = exp(channel_spread * z_i), shared by the two channels
//                   of a RoPE pair, normalized so mean(s^2) = 1 (an ordinary key
//                   has rms 1 per channel). Real keys are low-rank / heavy-tailed
//                   per channel; with the default spread 1 the top quarter of the
//                   channels holds ~90% of the key variance, about what Loki
//                   (Singhania et al. 2024) measured on real models. Equal scales
//                   within a pair make post-RoPE keys' statistics independent of
//                   the position.
//   Ordinary keys   pre-RoPE k~_t,c = s_c * z, then k_t = RoPE(k~_t, t).
//   Sink direction  w_g: a random unit vector on the d/16 lowest-frequency pairs
//                   (at least one), the only channels whose alignment survives a
//                   long distance under RoPE, as real sinks use them.
//   Query           group direction u~_g,c = z on every other channel (queries are
//                   not low-rank the way keys are, Loki) and exactly
//                   sigma(u~_g)/sqrt(d) * w_g on the sink pairs; per query head
//                   q~_h = u~_g + head_noise * z (off the sink pairs: the heads
//                   agree on the sinks), RoPE'd at position n_tokens and scaled
//                   so that the std of q_h.k over ordinary keys,
//                   sqrt(sum_c s_c^2 q_h,c^2) (exact under RoPE thanks to the
//                   pair-shared scales), is sigma: the scaled logit has std
//                   logit_std for every head. u_g = unit(RoPE(u~_g, n_tokens)) is
//                   the group's shared direction.
//   Sinks           tokens [0, n_sinks): k~ = sink_norm * sqrt(d) * w_g + ordinary
//                   content, so a sink's q.k is about sink_norm * sigma (within
//                   a few sigma: the content and the rotation over the distance).
//                   Sink values are small (0.1x), as real sinks' are.
//   Recency         the key at distance delta = n_tokens-1-t < recent_tokens gets
//                   + a_t u_g, a_t set so that its q.k gains (mean over the
//                   group's heads, in units of sigma) recency_bias * (1 - delta / recent_tokens).
//   Needles         n_needles spans of needle_len tokens, each in its own random
//                   block of block_size tokens that lies entirely after the sinks
//                   and before the recent region; random offset inside the block.
//                   Needle keys are k_t = (ordinary key) + a_t u_g in the post-RoPE
//                   domain (pre-RoPE: k~_t + a_t RoPE(u_g, -t)), a_t set so that
//                   the mean over the group's heads of q_h.k_t / sigma equals
//                   needle_strength exactly; every head of the group sees about
//                   that (the heads differ only by head_noise). Needles sit at the
//                   same tokens for every kv head. Needle values are 4x ordinary
//                   ones, so the output shows whether needles were attended.
//                   Scale of a needle: at n tokens the largest ordinary q.k is
//                   already about sqrt(2 ln n) sigma (4.6 at 32K), so a needle
//                   that dense attention actually retrieves needs more than that.
//   Values          v_t,c = z (rms 1), except sinks and needles as above.
// z is a fresh standard normal each time (ziggurat over SplitMix64: the group
// setup and needle placement from one stream seeded with `seed`, each chunk of
// 1024 tokens from its own stream derived from `seed`, chunks generated in
// parallel): the same spec gives the same bytes on every run and any thread
// count, and the draws do not depend on the strengths (sink_norm,
// recency_bias, needle_strength), so two specs that differ only there differ
// only by the additions above.
#pragma once

#include <cstdint>
#include <vector>

namespace longctx::workloads {

struct SyntheticSpec {
  int64_t n_tokens = 4096;
  int n_q_heads = 8;
  int n_kv_heads = 2;
  int head_dim = 128;           // even, >= 8
  int n_sinks = 4;              // first tokens, keys of large norm
  float sink_norm = 8.f;        // their key norm relative to ordinary keys (q.k about sink_norm sigma)
  int recent_tokens = 64;       // last tokens, biased towards the query
  float recency_bias = 2.f;     // q.k gain of the last token, in units of sigma (linear decay)
  int n_needles = 4;            // needle spans, each in its own random block
  int needle_len = 4;           // tokens per needle span (<= block_size)
  float needle_strength = 7.f;  // q.k of a needle in units of sigma (see Needles above) sigma
  int block_size = 128;         // needles are placed so each span stays in one block
  double rope_theta = 500000.0;
  float logit_std = 1.5f;       // std of q.k/sqrt(head_dim) over ordinary keys, every query head
  float channel_spread = 1.f;   // std of log(channel scale): 0 = isotropic keys
  float head_noise = 0.2f;      // query heads' deviation from the group direction, in [0, 1]
  uint64_t seed = 1;
};

struct SyntheticWorkload {
  SyntheticSpec spec;
  std::vector<float> k;  // [n_tokens][n_kv_heads][head_dim], RoPE applied
  std::vector<float> v;  // [n_tokens][n_kv_heads][head_dim]
  std::vector<float> q;  // [n_q_heads][head_dim], RoPE applied at position n_tokens
  std::vector<int64_t> needle_tokens;  // positions of every needle token, sorted
  std::vector<int64_t> needle_blocks;  // blocks holding needles, sorted, unique
};

// Throws Error(kInvalidArgument) naming the field for a spec it cannot build:
// sizes < 1 (n_tokens, heads, head_dim, block_size, needle_len when needles
// are asked), head_dim odd or < 8, n_q_heads not a multiple of n_kv_heads, n_sinks or
// recent_tokens outside [0, n_tokens], needle_len > block_size, fewer blocks
// free of sinks and recent tokens than n_needles, non-positive rope_theta or
// logit_std, negative or non-finite strengths, head_noise outside [0, 1].
SyntheticWorkload make_synthetic(const SyntheticSpec& spec);

// Applies RoPE (rotate-half / NeoX pairing: channel i with i + d/2) in place to
// x [head_dim] at `position`: angle_i = position * theta^(-2i/d),
// (x_i, x_{i+d/2}) <- (x_i cos - x_{i+d/2} sin, x_i sin + x_{i+d/2} cos), in
// fp64, rounded once. Negative positions rotate backwards. Throws
// Error(kInvalidArgument) for an odd or non-positive head_dim or theta <= 0.
void apply_rope(float* x, int head_dim, int64_t position, double theta);

}  // namespace longctx::workloads
