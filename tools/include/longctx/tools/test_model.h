// Random-weight Llama-architecture GGUF models for tests and benchmarks,
// deterministic from a seed, from small test shapes to a full Llama-3.1-8B
// layout. The files use the standard GGUF Llama layout (llama.cpp names and
// metadata keys) so other readers accept them;
// tools/reference/llama_ref.py is an independent NumPy forward pass over the
// same files.
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
// Metadata: general.architecture ("llama", "qwen2" or "internlm2"), general.name,
// general.file_type (llama.cpp's llama_ftype of the weight format, as
// llama.cpp itself would guess it), general.quantization_version (2),
// <arch>.{context_length, embedding_length, block_count, feed_forward_length,
// attention.head_count, attention.head_count_kv,
// attention.key_length, attention.value_length (= head_dim),
// attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
// vocab_size, attention.scale when attn_scale > 0, and rope.scaling.type
// "yarn", rope.scaling.factor and rope.scaling.original_context_length when
// yarn_factor > 0}, and a tokenizer: by default SentencePiece
// (tokenizer.ggml.model = "llama": <unk> <s> </s>, the 256 byte tokens
// <0x00>..<0xFF>, then scored pieces of English text) with the llama2 chat
// template; with llama3_vocab Llama-3's byte-level BPE layout (128256 tokens,
// "gpt2" / "llama-bpe", merges, the Llama 3.1 special tokens, BOS 128000,
// EOS <|eot_id|> 128009) with the Llama-3 chat template. RoPE style: llama
// and internlm2 -> adjacent pairs, qwen2 -> halves.
//
// Weight formats (--weight-type of longctx-make-model): f32, f16, bf16,
// q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k store every 2-D weight in
// that type; norms, biases and rope_freqs stay f32. Every such weight's rows
// (dims[0]) must be a multiple of the type's block, or the spec is refused
// naming the tensor. q4_k_m and q5_k_m mix types per tensor as llama.cpp's
// llama-quantize does for LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M (b4747,
// llama_tensor_get_type, dense model, no imatrix): base type Q4_K / Q5_K,
// except
//   output.weight (token_embd.weight when tied): Q6_K (Q8_0 if its rows are
//     not a multiple of 256);
//   attn_v.weight and ffn_down.weight of layer i: Q6_K when use_more_bits(i)
//     = i < n_layers/8 || i >= 7*n_layers/8 || (i - n_layers/8) % 3 == 2;
//     an 80-layer GQA model (llama.cpp's 70B) also moves the other attn_v
//     from Q4_K to Q5_K;
//   token_embd.weight (untied), attn_q, attn_k, attn_output, ffn_gate,
//     ffn_up: the base type.
// q3_k_m and q2_k mix as llama.cpp's LLAMA_FTYPE_MOSTLY_Q3_K_M / Q2_K: base
// type Q3_K / Q2_K, output (tied token_embd) as above, and
//   q3_k_m: attn_v Q5_K in layers 0 and 1, Q4_K after; ffn_down Q5_K in
//     layers below n_layers/16, Q4_K after; attn_output Q4_K;
//   q2_k: attn_v Q4_K with GQA 4 or more, else Q3_K; ffn_down and
//     attn_output Q3_K;
//   and an 80-layer GQA model's attn_v Q5_K where it would be Q3_K or Q4_K.
// A tensor of the mix whose rows are not a multiple of 256 falls back as
// llama.cpp does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 if the
// rows are not a multiple of 32 either (Q8_0 output rows that are not a
// multiple of 32 are refused, as llama.cpp does). Q2_K and Q3_K rows that
// are not whole blocks are refused: llama.cpp stores them as IQ4_NL.
//
// Weights are generated and quantized row by row in parallel (oneTBB) while
// the file is written, so a model of any size is written with bounded memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/ggml_types.h"
#include "longctx/model/gguf_writer.h"

namespace longctx::tools {

struct TestModelSpec {
  std::string name = "tiny";
  std::string arch = "llama";  // "llama", "qwen2" or "internlm2" (Llama's layout under its own name)
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int head_dim = 64;
  int n_embd = 256;            // may differ from n_heads * head_dim
  int n_ff = 512;
  int n_vocab = 320;           // SPM: >= 259 (specials + bytes), extra ids are text pieces; llama3_vocab: 128256
  bool qkv_bias = false;
  bool tie_embeddings = false;
  bool llama3_rope = false;    // write rope_freqs.weight (factor 8, low 1, high 4, original 8192)
  bool llama3_vocab = false;   // Llama-3 byte-level BPE tokenizer instead of the SPM one
  GgmlType weight_type = GgmlType::kF32;  // 2-D weights (the base type of a mix)
  bool k_mix = false;  // llama.cpp's mix over weight_type Q2_K .. Q5_K: q2_k, q3_k_m, q4_k_m, q5_k_m
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  float attn_scale = 0.0f;     // > 0: written as <arch>.attention.scale; 0: absent (1/sqrt(head_dim))
  float yarn_factor = 0.0f;    // >= 1: YaRN RoPE scaling by this factor (Qwen2.5's 128K setting); 0: none
  int64_t yarn_original_context = 32768;  // with yarn_factor: rope.scaling.original_context_length
  int64_t context_length = 1 << 20;
  uint64_t seed = 1;
};

// The named shapes the tests use (2 layers, f32 weights, SPM vocab of 320
// unless said): "mha-64" (4 heads = 4 kv heads, head_dim 64), "gqa-128"
// (8:2 heads, head_dim 128, n_embd 512 != 8*128, n_ff 768, vocab 384),
// "qwen2-bias" (QKV bias, arch qwen2: halves RoPE; tied embeddings),
// "qwen2-yarn" (qwen2-bias with YaRN x4 from 32768, as Qwen2.5 at 128K), "q8"
// (Q8_0 weights, 3 layers), "f16" (F16 weights), "llama3-rope" (4:1 heads,
// theta 500000, rope_freqs), the quantized shapes of gqa-128 (rows multiples
// of 256) "q4_0" (2 layers), "q6_k" (2 layers), "q4_k_m" and "q5_k_m" (3
// layers: layer 2 takes Q6_K), and "bench" (32 q heads, 8 kv heads, d 128,
// n_embd 1024, n_ff 2048, vocab 4096: ~160 MB in f32) for longctx-bench
// decode.
std::vector<TestModelSpec> standard_test_models();
// Full-size presets, never generated by unit tests: "llama3-8b" (the layout
// of Llama-3.1-8B: 32 layers, n_embd 4096, 32:8 heads x 128, n_ff 14336,
// Llama-3 vocabulary of 128256, theta 500000 with Llama-3.1 rope_freqs,
// context 131072; q4_k_m: 4.92 GB, as llama.cpp's Q4_K_M of the real model)
// and "llama3-8b-4l" (the same with 4 layers: 1.25 GB); "qwen2.5-7b" (the
// layout of Qwen2.5-7B-Instruct: 28 layers, n_embd 3584, 28:4 heads x 128,
// n_ff 18944, QKV bias, vocabulary of 152064 (SentencePiece pieces here:
// the sizes are Qwen's, the tokenizer is not), theta 1e6, context 32768 with
// YaRN x4 from 32768 as Qwen documents for 128K; q4_k_m) and "qwen2.5-7b-4l"
// (4 layers).
std::vector<TestModelSpec> full_size_models();
// A preset of either list by name; Error(kInvalidArgument) listing the names.
TestModelSpec test_model_by_name(const std::string& name);

// Sets weight_type and k_mix from a weight format name (the list above);
// Error(kInvalidArgument) listing the names.
void set_weight_format(TestModelSpec& spec, const std::string& name);
// "q4_k_m", "f16", ...
std::string weight_format_name(const TestModelSpec& spec);
// Every weight format name, comma-separated, in the order above.
std::string weight_format_names();
// The type `tensor` (a name of the layout above) is stored in under `spec`'s
// weight format; Error(kInvalidArgument) naming the tensor when its rows do
// not fit the format.
GgmlType tensor_type(const TestModelSpec& spec, const std::string& tensor);

// The Jinja text of the chat templates written as tokenizer.chat_template:
// Llama-2-chat, and Meta-Llama-3-Instruct's.
extern const char* const kLlama2ChatTemplate;
extern const char* const kLlama3ChatTemplate;

// The model as a GGUF writer (call .write(path) or .to_bytes()); the
// weights are generated when it writes. Error(kInvalidArgument) for a bad
// spec.
model::GgufWriter make_test_model(const TestModelSpec& spec);

}  // namespace longctx::tools
