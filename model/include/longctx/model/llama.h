// Llama-family models from GGUF: general.architecture "llama" (Llama 2/3,
// Mistral, InternLM3), "qwen2" (QKV bias) and "internlm2" (InternLM2 and 2.5,
// 1M-token chat models among them, which llama.cpp's converter writes in
// the Llama layout under their own name).
// Hyperparameters come from the <arch>.* metadata keys, weights from the
// standard llama.cpp tensor names (see tools/test_model.h for the layout),
// handed to Backend::load_weight in their GGUF type (the backend keeps or
// converts them as its WeightStorage says).
//
// RoPE: llama and internlm2 -> RopeStyle::kNormal (adjacent pairs: llama.cpp's
// converter permutes Q/K into that order), qwen2 -> kNeox (halves); theta from
// <arch>.rope.freq_base (default 10000), rotated channels from
// <arch>.rope.dimension_count (default head_dim); rope_freqs.weight (Llama-3.1)
// -> RopeParams::freq_factors; <arch>.rope.scaling.type "linear" (also when
// the key is absent, as llama.cpp reads it) with <arch>.rope.scaling.factor
// (or the older <arch>.rope.scale_linear) -> RopeScaling::kLinear; "none" ->
// no scaling whatever the factor; "yarn" (Qwen2.5's converter writes it for
// 128K) with <arch>.rope.scaling.factor (default 1) and .original_context_length
// (default <arch>.context_length) -> RopeScaling::kYarn, beta_fast 32 and
// beta_slow 1 as llama.cpp; other scaling types are Error(kUnsupported).
// <arch>.rope.scaling.attn_factor (default 1) -> RopeParams::attn_factor,
// whatever the type, as llama.cpp applies it.
// Attention scores are q.k * <arch>.attention.scale when the key is present
// (f32, finite and > 0; Granite's attention multiplier, for one) ->
// TransformerSpec::attn_scale, else q.k / sqrt(head_dim).
#pragma once

#include <memory>
#include <string>

#include "longctx/core/backend.h"
#include "longctx/model/gguf.h"
#include "longctx/model/tokenizer.h"
#include "longctx/scheduler/transformer.h"

namespace longctx::model {

// The hyperparameters of a Llama-family GGUF. Throws Error(kUnsupported) for
// another architecture or RoPE scaling, Error(kCorrupt) naming the key for a
// missing or inconsistent value (head_count not a multiple of head_count_kv,
// value_length != key_length, dimension_count odd or > head_dim,
// attention.scale not finite and > 0, ...).
scheduler::TransformerSpec read_llama_spec(const GgufFile& file);

// Checks every tensor the spec needs before loading any: present, a weight
// type (Error(kUnsupported) for a quantization longctx cannot dequantize,
// Error(kCorrupt) for a non-weight type such as i32), and its GGUF shape
// (Error(kCorrupt): "tensor 'blk.3.attn_k.weight': expected [256, 128], got
// f32[256, 256]"). qkv_bias is set from the presence of blk.0.attn_q.bias
// (then every layer needs all three biases); output.weight absent = tied to
// token_embd.weight. rope_freqs.weight, when present, must hold n_rot/2
// values. Updates spec.qkv_bias and spec.rope.freq_factors.
void check_llama_tensors(const GgufFile& file, scheduler::TransformerSpec& spec);

// read_llama_spec + check_llama_tensors, then every weight stored with
// backend.load_weight from the file's bytes (whose mapped pages are then
// released). A tensor whose rows are not whole blocks of its type or whose
// quantized blocks hold a NaN / Inf scale is Error(kCorrupt) naming it.
scheduler::Transformer load_llama(const GgufFile& file, Backend& backend);

// Everything Model::open checks before it loads a weight: read_llama_spec,
// check_llama_tensors, and the tokenizer against token_embd.weight (the
// embedding may pad the vocabulary, never the reverse). longctx-info runs it,
// so a file it reports loadable is one Model::open loads, except for
// quantized blocks with a NaN / Inf scale, which only reading every weight
// finds. Returns the checked spec.
scheduler::TransformerSpec check_model_file(const GgufFile& file, const Tokenizer& tokenizer);

// A model file opened for inference: the GGUF mapping, its tokenizer and its
// weights on a backend.
class Model {
 public:
  // Opens and validates `path`, builds the tokenizer from its metadata and
  // loads the weights onto `backend` (which must outlive the Model).
  static std::unique_ptr<Model> open(const std::string& path, Backend& backend);

  const GgufFile& gguf() const { return gguf_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const scheduler::Transformer& transformer() const { return transformer_; }
  const scheduler::TransformerSpec& spec() const { return transformer_.spec; }
  // Identifies the model for KV snapshots: architecture, shape, and a CRC32C
  // of the tensor table and of the first bytes of each tensor.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Model(GgufFile gguf, Tokenizer tokenizer, scheduler::Transformer transformer, std::string fingerprint);
  GgufFile gguf_;
  Tokenizer tokenizer_;
  scheduler::Transformer transformer_;
  std::string fingerprint_;
};

// The fingerprint Model::fingerprint() reports for `file`.
std::string model_fingerprint(const GgufFile& file);

}  // namespace longctx::model
