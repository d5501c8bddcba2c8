// Small random-weight Llama-architecture GGUF models for tests and
// benchmarks, deterministic from a seed. The files use the standard GGUF
// Llama layout (llama.cpp names and metadata keys) so other readers accept
// them; tools/reference/llama_ref.py is an independent NumPy forward pass
// over the same files.
//
// Layout written (GGUF dims order, dims[0] contiguous):
//   token_embd.weight [n_embd, n_vocab]      output_norm.weight [n_embd]
//   output.weight     [n_embd, n_vocab] (omitted when tie_embeddings)
//   blk.N.attn_norm.weight [n_embd]          blk.N.ffn_norm.weight [n_embd]
//   blk.N.attn_q.weight [n_embd, n_heads*head_dim]   (+ .bias when qkv_bias)
//   blk.N.attn_k.weight [n_embd, n_kv_heads*head_dim] (+ .bias)
//   blk.N.attn_v.weight [n_embd, n_kv_heads*head_dim] (+ .bias)
//   blk.N.attn_output.weight [n_heads*head_dim, n_embd]
//   blk.N.ffn_gate.weight [n_embd, n_ff]  blk.N.ffn_up.weight [n_embd, n_ff]
//   blk.N.ffn_down.weight [n_ff, n_embd]
//   rope_freqs.weight [head_dim/2] when llama3_rope (Llama-3.1 factors)
// Metadata: general.architecture ("llama" or "qwen2"), general.name,
// <arch>.{context_length, embedding_length, block_count, feed_forward_length,
// attention.head_count, attention.head_count_kv,
// attention.key_length, attention.value_length (= head_dim),
// attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
// vocab_size},
// and an SPM tokenizer (tokenizer.ggml.model = "llama": <unk> <s> </s>, the
// 256 byte tokens <0x00>..<0xFF>, then scored pieces of English text) with
// the llama2 chat template. RoPE style: llama -> adjacent pairs, qwen2 -> halves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/ggml_types.h"
#include "longctx/model/gguf_writer.h"

namespace longctx::tools {

struct TestModelSpec {
  std::string name = "tiny";
  std::string arch = "llama";  // "llama" or "qwen2"
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int head_dim = 64;
  int n_embd = 256;            // may differ from n_heads * head_dim
  int n_ff = 512;
  int n_vocab = 320;           // >= 259 (specials + bytes) ; extra ids are text pieces
  bool qkv_bias = false;
  bool tie_embeddings = false;
  bool llama3_rope = false;    // write rope_freqs.weight (factor 8, low 1, high 4, original 8192)
  GgmlType weight_type = GgmlType::kF32;  // 2-D weights; norms and biases stay f32
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  int64_t context_length = 1 << 20;
  uint64_t seed = 1;
};

// The named shapes the tests use (2 layers, f32 weights, SPM vocab of 320
// unless said): "mha-64" (4 heads = 4 kv heads, head_dim 64), "gqa-128"
// (8:2 heads, head_dim 128, n_embd 512 != 8*128, vocab 384), "qwen2-bias" (QKV
// bias, arch qwen2: halves RoPE; tied embeddings), "q8" (Q8_0 weights, 3 layers), "f16"
// (F16 weights), "llama3-rope" (4:1 heads, theta 500000, rope_freqs), and
// "bench" (32 q heads, 8 kv heads, d 128, n_embd 1024, n_ff 2048, vocab
// 4096: ~160 MB in f32) for longctx-bench decode.
std::vector<TestModelSpec> standard_test_models();
// One of standard_test_models() by name; Error(kInvalidArgument) listing the names.
TestModelSpec test_model_by_name(const std::string& name);

// The Jinja text of the Llama-2 chat template written as tokenizer.chat_template.
extern const char* const kLlama2ChatTemplate;

// The model as a GGUF writer (call .write(path) or .to_bytes()).
model::GgufWriter make_test_model(const TestModelSpec& spec);

}  // namespace longctx::tools
