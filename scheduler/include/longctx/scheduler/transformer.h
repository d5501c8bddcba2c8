// A Llama-family decoder as the scheduler sees it: hyperparameters and the
// weights of every layer as BackendTensor handles on one Backend. model/
// builds this from a GGUF file; tests build it from random host data.
//
// Per layer (x: hidden states [n, n_embd]):
//   h  = x + Wo · attention(rope(Wq·norm(x) + bq), rope(Wk·norm(x) + bk), Wv·norm(x) + bv)
//   x' = h + W_down · (silu(W_gate·norm(h)) * (W_up·norm(h)))
// norm = RMSNorm with the layer's attn_norm / ffn_norm weight; logits =
// output · rms_norm(x_last, output_norm). Weight shapes are [out, in]
// (matmul computes x · w^T), as GGUF stores them row-major.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::scheduler {

struct TransformerSpec {
  std::string arch = "llama";  // informational ("llama", "qwen2", "internlm2")
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // divides n_heads (GQA)
  int head_dim = 0;
  int n_embd = 0;      // may differ from n_heads * head_dim
  int n_ff = 0;
  int64_t n_vocab = 0;
  float rms_eps = 1e-5f;
  float attn_scale = 0.0f;  // scores are q.k * attn_scale; 0 = 1/sqrt(head_dim)
  RopeParams rope;
  bool qkv_bias = false;
  int64_t context_length = 0;  // trained context, informational

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  kvstore::KVShape kv_shape() const { return {n_layers, n_kv_heads, head_dim}; }
  // Throws Error(kInvalidArgument) naming the field: counts < 1, n_heads not a
  // multiple of n_kv_heads, rope.n_rot odd or > head_dim, rms_eps <= 0,
  // freq_factors not n_rot/2 values, attn_scale negative or not finite.
  void validate() const;
};

struct LayerWeights {
  std::unique_ptr<BackendTensor> attn_norm;  // [n_embd]
  std::unique_ptr<BackendTensor> wq;         // [n_heads*head_dim, n_embd]
  std::unique_ptr<BackendTensor> wk;         // [n_kv_heads*head_dim, n_embd]
  std::unique_ptr<BackendTensor> wv;         // [n_kv_heads*head_dim, n_embd]
  std::unique_ptr<BackendTensor> bq, bk, bv; // [out] each, only when spec.qkv_bias
  std::unique_ptr<BackendTensor> wo;         // [n_embd, n_heads*head_dim]
  std::unique_ptr<BackendTensor> ffn_norm;   // [n_embd]
  std::unique_ptr<BackendTensor> w_gate;     // [n_ff, n_embd]
  std::unique_ptr<BackendTensor> w_up;       // [n_ff, n_embd]
  std::unique_ptr<BackendTensor> w_down;     // [n_embd, n_ff]
};

struct TransformerWeights {
  std::unique_ptr<BackendTensor> token_embd;   // [n_vocab, n_embd]
  std::unique_ptr<BackendTensor> output_norm;  // [n_embd]
  std::unique_ptr<BackendTensor> output;       // [n_vocab, n_embd]; null: tied to token_embd
  std::vector<LayerWeights> layers;

  const BackendTensor& output_weight() const { return output ? *output : *token_embd; }
};

struct Transformer {
  TransformerSpec spec;
  TransformerWeights weights;

  // spec.validate(), then every weight present with the shape above (biases
  // present exactly when spec.qkv_bias); Error(kInvalidArgument) naming the
  // weight ("layer 3 wq: expected [512, 256], got f32[256, 256]").
  void validate() const;
};

}  // namespace longctx::scheduler
