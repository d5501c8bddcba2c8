// Decode attention over the KV store on the CPU, and the LSE merge.
//
// Numerical contract (docs/architecture.md): scores are q.k * scale, accumulation fp32
// whatever the storage dtype; every kernel returns out [n_q_heads][head_dim]
// (normalized) and lse [n_q_heads] (natural log of the sum of exp(score) over
// the keys it saw). A kernel that saw no key returns lse = -inf and out = 0.
// No NaN ever leaves a kernel. GQA: query head h reads kv head h / g, with
// g = n_q_heads / n_kv_heads; the g query heads of a kv head are processed
// together so each K/V byte is read once per group.
//
// q8_0 stores: q (times the scale) is quantized per 32 channels as
// quant_matmul.h quantizes activations, so each group's q.k is an exact
// integer dot product of codes (as ggml's q8_0 x q8_0 dot), then times both
// scales. Where the CPU has AVX512-VNNI, P.V's weights p * v_scale are also
// rounded to 16 bits per 128-token chunk (vpdpbusd on their high and low
// bytes); the output moves by at most 128 / 131070 of the largest |v|
// (attention_kernel.h).
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::cpu {

// Merges partial results b into a (out/lse may alias a or b):
// m = max(l1, l2); w_i = exp(l_i - m); o = (w1 o1 + w2 o2)/(w1 + w2); l = m + log(w1 + w2).
// Empty parts (lse = -inf) leave the other part unchanged; two empty parts stay empty.
void merge_attention(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b, float* out,
                     float* lse, int n_heads, int head_dim);

struct DecodeAttentionParams {
  float scale = 0.f;      // 0 = 1/sqrt(head_dim)
  int64_t split_tokens = 0;  // flash-decoding: a kv head's selection is cut into pieces of about
                             // this many tokens run on different threads and merged by LSE;
                             // 0 = chosen from the selection's size alone (not the
                             // thread count), so the result is the same bits for
                             // any number of threads
};

// Attention of one decode query per query head over the tokens `selection`
// lists for each kv head of `layer`.
// q: f32 [n_q_heads, head_dim] (innermost contiguous); out: f32 [n_q_heads,
// head_dim]; lse: f32 [n_q_heads]. n_q_heads must be a multiple of n_kv_heads.
// Throws Error(kInvalidArgument) naming the argument on any shape mismatch or
// a span outside the layer's tokens.
void decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q, const Selection& selection,
                      const DecodeAttentionParams& params, const MutableTensorView& out,
                      const MutableTensorView& lse);

// How decode attention computes over a q8_0 store on this CPU, for logs:
// integer dot products on AVX512-VNNI, or codes widened to f32.
const char* q8_decode_kernel_description();

// Dense baseline: decode_attention over every token of the layer.
void dense_decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q,
                            const DecodeAttentionParams& params, const MutableTensorView& out,
                            const MutableTensorView& lse);

}  // namespace longctx::cpu
