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

namespace detail {
struct DecodePiece;
}

// Decode attention of one query, kv head by kv head, for a caller that learns
// each head's selection at a different time: policy::DecodePolicy's select
// step attends a kv head from the task that chose its blocks while other
// heads are still being scored, so the attention needs no parallel pass of
// its own. The constructor checks q, out, lse and params as decode_attention
// does and prepares q once (times the scale; on q8_0 quantized); attend_head
// runs one head's pieces in parallel and writes that head's g rows of out and
// lse. Heads may be attended in any order or concurrently (each writes only
// its own rows): the bits are those of decode_attention over the same spans,
// since a head's pieces depend on its own spans alone. q, out and lse must
// outlive the object; q is read only by the constructor.
class HeadwiseDecodeAttention {
 public:
  HeadwiseDecodeAttention(const kvstore::KVStore& store, int layer, const TensorView& q,
                          const DecodeAttentionParams& params, const MutableTensorView& out,
                          const MutableTensorView& lse);
  // Throws Error(kInvalidArgument) naming the head and span, writing nothing,
  // for a head out of range or spans decode_attention refuses.
  void attend_head(int kv_head, const std::vector<TokenSpan>& spans) const;
  // Every head at once (one parallel run over all heads' pieces): what
  // decode_attention does. The whole selection is checked before any write.
  void attend(const Selection& selection) const;

 private:
  void attend_piece(const std::vector<TokenSpan>& spans, const detail::DecodePiece& piece,
                    const std::vector<TokenSpan>* following_spans, const detail::DecodePiece* following,
                    float* piece_out, float* piece_lse) const;

  const kvstore::KVStore& store_;
  int layer_;
  DecodeAttentionParams params_;
  MutableTensorView out_, lse_;
  int g_ = 0, dim_ = 0;
  std::vector<float> q_scaled_;        // [n_q_heads][head_dim] q * scale; q8_0: its codes as floats
  std::vector<int8_t> q_codes_;        // q8_0 only: [n_q_heads][head_dim]
  std::vector<float> q_scales_;        // q8_0 only: [n_q_heads][head_dim / 32]
  std::vector<int32_t> q_code_sums_;   // q8_0 only: [n_q_heads][head_dim / 32]
};

// How decode attention computes over a q8_0 store on this CPU, for logs:
// integer dot products on AVX512-VNNI, or codes widened to f32.
const char* q8_decode_kernel_description();

// Dense baseline: decode_attention over every token of the layer.
void dense_decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q,
                            const DecodeAttentionParams& params, const MutableTensorView& out,
                            const MutableTensorView& lse);

}  // namespace longctx::cpu
