// Llama-family GGUF -> scheduler::Transformer (llama.h).
#include "longctx/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "longctx/core/crc32c.h"
#include "longctx/core/error.h"

namespace longctx::model {
namespace {

using scheduler::TransformerSpec;

// A count key as int, checked against [lo, hi] (Error kCorrupt naming the key).
int count_key(const GgufFile& f, const std::string& key, uint64_t lo, uint64_t hi) {
  const uint64_t v = f.get_uint(key);
  if (v < lo || v > hi)
    fail(ErrorCode::kCorrupt, f.name(), ": key '", key, "' is ", v, ", expected ", lo, "..", hi);
  return static_cast<int>(v);
}

int count_key_or(const GgufFile& f, const std::string& key, uint64_t fallback, uint64_t lo, uint64_t hi) {
  return f.has(key) ? count_key(f, key, lo, hi) : static_cast<int>(fallback);
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// The tensor `name` with GGUF dims `dims` (dims[0] contiguous) and a weight type.
const GgufTensorInfo& expect_tensor(const GgufFile& f, const std::string& name, const std::vector<int64_t>& dims) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) fail(ErrorCode::kCorrupt, f.name(), ": tensor '", name, "' is missing");
  switch (t->type) {
    case GgmlType::kI8:
    case GgmlType::kI16:
    case GgmlType::kI32:
    case GgmlType::kI64:
      fail(ErrorCode::kCorrupt, f.name(), ": tensor '", name, "' has type ", ggml_type_info(t->type).name,
           ", not a weight type");
    default:
      break;
  }
  if (!ggml_type_info(t->type).dequantizable)
    fail(ErrorCode::kUnsupported, f.name(), ": tensor '", name, "' has type ", ggml_type_info(t->type).name,
         ", which longctx cannot dequantize");
  if (t->dims != dims)
    fail(ErrorCode::kCorrupt, f.name(), ": tensor '", name, "': expected ", dims_text(dims), ", got ",
         t->describe());
  return *t;
}

std::string layer_name(int layer, const char* suffix) { return "blk." + std::to_string(layer) + "." + suffix; }

}  // namespace

TransformerSpec read_llama_spec(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  // internlm2: llama.cpp's converter splits InternLM2's fused wqkv into the
  // Llama tensors, permuted as Llama's, so the graph is Llama's.
  if (arch != "llama" && arch != "qwen2" && arch != "internlm2")
    fail(ErrorCode::kUnsupported, f.name(), ": architecture '", arch,
         "' is not supported (longctx runs \"llama\", \"qwen2\" and \"internlm2\")");
  const std::string p = arch + ".";
  constexpr uint64_t kMaxDim = 1 << 20, kMaxLayers = 4096;
  TransformerSpec s;
  s.arch = arch;
  s.n_layers = count_key(f, p + "block_count", 1, kMaxLayers);
  s.n_embd = count_key(f, p + "embedding_length", 1, kMaxDim);
  s.n_ff = count_key(f, p + "feed_forward_length", 1, kMaxDim);
  s.n_heads = count_key(f, p + "attention.head_count", 1, 4096);
  s.n_kv_heads = count_key_or(f, p + "attention.head_count_kv", uint64_t(s.n_heads), 1, 4096);
  if (s.n_heads % s.n_kv_heads != 0)
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "attention.head_count' (", s.n_heads,
         ") is not a multiple of '", p, "attention.head_count_kv' (", s.n_kv_heads, ")");
  if (!f.has(p + "attention.key_length") && s.n_embd % s.n_heads != 0)
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "embedding_length' (", s.n_embd,
         ") is not a multiple of the head count and '", p, "attention.key_length' is absent");
  s.head_dim = count_key_or(f, p + "attention.key_length", uint64_t(s.n_embd / s.n_heads), 1, 4096);
  const int value_length = count_key_or(f, p + "attention.value_length", uint64_t(s.head_dim), 1, 4096);
  if (value_length != s.head_dim)
    fail(ErrorCode::kUnsupported, f.name(), ": key '", p, "attention.value_length' (", value_length,
         ") differs from the key length (", s.head_dim, ")");
  s.rms_eps = static_cast<float>(f.get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5));
  if (!(s.rms_eps > 0.0f) || !(s.rms_eps < 1.0f))
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "attention.layer_norm_rms_epsilon' is ", s.rms_eps,
         ", expected a value in (0, 1)");
  s.context_length = static_cast<int64_t>(f.get_uint_or(p + "context_length", 0));
  if (f.has(p + "attention.scale")) {  // absent: attn_scale 0 = 1/sqrt(head_dim)
    const double scale = f.get_float(p + "attention.scale");
    s.attn_scale = static_cast<float>(scale);
    if (!(s.attn_scale > 0.0f) || std::isinf(s.attn_scale))
      fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "attention.scale' is ", scale,
           ", expected a finite f32 value > 0");
  }

  RopeParams& rope = s.rope;
  rope.style = arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kNormal;
  rope.theta = static_cast<float>(f.get_float_or(p + "rope.freq_base", 10000.0));
  if (!(rope.theta > 1.0f) || !(rope.theta < std::numeric_limits<float>::infinity()))
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "rope.freq_base' is ", rope.theta, ", expected > 1");
  rope.n_rot = count_key_or(f, p + "rope.dimension_count", uint64_t(s.head_dim), 0, uint64_t(s.head_dim));
  if (rope.n_rot % 2 != 0)
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "rope.dimension_count' is ", rope.n_rot, ", expected even");
  // As llama.cpp b4747 reads the type: absent means linear, by
  // rope.scaling.factor or the older rope.scale_linear (neither: no scaling),
  // and "none" never scales, whatever factor the file gives.
  const std::string scaling = f.get_string_or(p + "rope.scaling.type", "linear");
  if (scaling == "linear") {
    const std::string factor_key =
        f.has(p + "rope.scaling.factor") ? p + "rope.scaling.factor" : p + "rope.scale_linear";
    const double factor = f.get_float_or(factor_key, 1.0);
    if (!(factor > 0.0) || !(factor < 1e6))
      fail(ErrorCode::kCorrupt, f.name(), ": key '", factor_key, "' is ", factor,
           ", expected a linear RoPE scaling factor in (0, 1e6)");
    if (factor != 1.0) {
      rope.scaling = RopeScaling::kLinear;
      rope.factor = static_cast<float>(factor);
    }
  } else if (scaling == "yarn") {
    // As llama.cpp b4747 reads them: the factor may be absent (1: the
    // frequencies stay), the original context falls back to the trained one.
    const double factor = f.get_float_or(p + "rope.scaling.factor", 1.0);
    if (!(factor >= 1.0) || !(factor < 1e6))
      fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "rope.scaling.factor' is ", factor,
           ", expected a YaRN factor in [1, 1e6)");
    const std::string original_key = f.has(p + "rope.scaling.original_context_length")
                                         ? p + "rope.scaling.original_context_length"
                                         : p + "context_length";
    if (!f.has(original_key))
      fail(ErrorCode::kCorrupt, f.name(), ": YaRN RoPE scaling needs '", p,
           "rope.scaling.original_context_length' or '", p, "context_length'");
    const uint64_t original = f.get_uint(original_key);
    if (original < 1 || original > (uint64_t(1) << 40))
      fail(ErrorCode::kCorrupt, f.name(), ": key '", original_key, "' is ", original,
           ", expected an original context in [1, 2^40]");
    rope.scaling = RopeScaling::kYarn;
    rope.factor = static_cast<float>(factor);
    rope.original_context = static_cast<int64_t>(original);
  } else if (scaling != "none") {
    fail(ErrorCode::kUnsupported, f.name(), ": key '", p, "rope.scaling.type' is '", scaling,
         "'; longctx supports none, linear and yarn (Llama-3.1 scaling comes as rope_freqs.weight)");
  }
  // Whatever the scaling type, as llama.cpp multiplies cos and sin by it.
  const double attn_factor = f.get_float_or(p + "rope.scaling.attn_factor", 1.0);
  if (!(attn_factor > 0.0) || !(attn_factor < 1e6))
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "rope.scaling.attn_factor' is ", attn_factor,
         ", expected a value in (0, 1e6)");
  rope.attn_factor = static_cast<float>(attn_factor);
  // The vocabulary size is the embedding's row count (checked in check_llama_tensors).
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(ErrorCode::kCorrupt, f.name(), ": tensor 'token_embd.weight' is missing");
  if (embd->dims.size() != 2)
    fail(ErrorCode::kCorrupt, f.name(), ": tensor 'token_embd.weight': expected 2 dims, got ", embd->describe());
  s.n_vocab = embd->dims[1];
  if (f.has(p + "vocab_size") && f.get_uint(p + "vocab_size") != uint64_t(s.n_vocab))
    fail(ErrorCode::kCorrupt, f.name(), ": key '", p, "vocab_size' is ", f.get_uint(p + "vocab_size"),
         " but token_embd.weight has ", s.n_vocab, " rows");
  return s;
}

void check_llama_tensors(const GgufFile& f, TransformerSpec& s) {
  const int64_t d = s.n_embd, q = s.q_dim(), kv = s.kv_dim(), ff = s.n_ff, v = s.n_vocab;
  expect_tensor(f, "token_embd.weight", {d, v});
  expect_tensor(f, "output_norm.weight", {d});
  if (f.find_tensor("output.weight")) expect_tensor(f, "output.weight", {d, v});
  s.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  for (int l = 0; l < s.n_layers; ++l) {
    expect_tensor(f, layer_name(l, "attn_norm.weight"), {d});
    expect_tensor(f, layer_name(l, "attn_q.weight"), {d, q});
    expect_tensor(f, layer_name(l, "attn_k.weight"), {d, kv});
    expect_tensor(f, layer_name(l, "attn_v.weight"), {d, kv});
    if (s.qkv_bias) {
      expect_tensor(f, layer_name(l, "attn_q.bias"), {q});
      expect_tensor(f, layer_name(l, "attn_k.bias"), {kv});
      expect_tensor(f, layer_name(l, "attn_v.bias"), {kv});
    }
    expect_tensor(f, layer_name(l, "attn_output.weight"), {q, d});
    expect_tensor(f, layer_name(l, "ffn_norm.weight"), {d});
    expect_tensor(f, layer_name(l, "ffn_gate.weight"), {d, ff});
    expect_tensor(f, layer_name(l, "ffn_up.weight"), {d, ff});
    expect_tensor(f, layer_name(l, "ffn_down.weight"), {ff, d});
  }
  s.rope.freq_factors.clear();
  if (f.find_tensor("rope_freqs.weight")) {
    const GgufTensorInfo& t = expect_tensor(f, "rope_freqs.weight", {s.rope.n_rot / 2});
    if (s.rope.scaling != RopeScaling::kNone)
      fail(ErrorCode::kCorrupt, f.name(), ": tensor 'rope_freqs.weight' given together with '", s.arch,
           ".rope.scaling.type' (", rope_scaling_name(s.rope.scaling), ")");
    s.rope.freq_factors = f.tensor_f32(t);
    for (size_t i = 0; i < s.rope.freq_factors.size(); ++i)
      if (!(s.rope.freq_factors[i] > 0.0f) || !(s.rope.freq_factors[i] < std::numeric_limits<float>::infinity()))
        fail(ErrorCode::kCorrupt, f.name(), ": tensor 'rope_freqs.weight': value ", i, " is ",
             s.rope.freq_factors[i], ", expected a positive finite divisor");
  }
  // Keys each in range can still give parameters the backend refuses, or
  // frequencies past f32 (a factor of 1e-45): refused here, naming the file,
  // rather than when the model first runs.
  try {
    (void)rope_inv_freq(s.rope);
  } catch (const Error& e) {
    fail(ErrorCode::kCorrupt, f.name(), ": the RoPE keys of '", s.arch, ".rope.*' (and rope_freqs.weight) give ",
         "parameters longctx cannot run: ", e.what());
  }
  s.validate();
}

namespace {

// The weights of `f` onto `backend`, for a spec read_llama_spec and
// check_llama_tensors have already passed.
scheduler::Transformer load_checked(const GgufFile& f, TransformerSpec spec, Backend& backend) {
  scheduler::Transformer t;
  t.spec = std::move(spec);
  // GGUF dims [in, out] are the row-major [out, in] the Transformer wants.
  // The backend gets the file's bytes in the file's type and stores them as
  // its WeightStorage says; then the mapped pages are let go, so the weights
  // are resident once.
  auto load = [&](const std::string& name) {
    const GgufTensorInfo& info = *f.find_tensor(name);
    std::unique_ptr<BackendTensor> weight;
    try {
      weight = backend.load_weight(
          HostWeight(info.type, std::vector<int64_t>(info.dims.rbegin(), info.dims.rend()), f.tensor_data(info), name));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      fail(ErrorCode::kCorrupt, f.name(), ": ", e.what());  // the file's bytes, not the caller, are wrong
    }
    f.release_tensor_pages(info);
    return weight;
  };
  t.weights.token_embd = load("token_embd.weight");
  t.weights.output_norm = load("output_norm.weight");
  if (f.find_tensor("output.weight")) t.weights.output = load("output.weight");
  for (int l = 0; l < t.spec.n_layers; ++l) {
    scheduler::LayerWeights w;
    w.attn_norm = load(layer_name(l, "attn_norm.weight"));
    w.wq = load(layer_name(l, "attn_q.weight"));
    w.wk = load(layer_name(l, "attn_k.weight"));
    w.wv = load(layer_name(l, "attn_v.weight"));
    if (t.spec.qkv_bias) {
      w.bq = load(layer_name(l, "attn_q.bias"));
      w.bk = load(layer_name(l, "attn_k.bias"));
      w.bv = load(layer_name(l, "attn_v.bias"));
    }
    w.wo = load(layer_name(l, "attn_output.weight"));
    w.ffn_norm = load(layer_name(l, "ffn_norm.weight"));
    w.w_gate = load(layer_name(l, "ffn_gate.weight"));
    w.w_up = load(layer_name(l, "ffn_up.weight"));
    w.w_down = load(layer_name(l, "ffn_down.weight"));
    t.weights.layers.push_back(std::move(w));
  }
  t.validate();
  return t;
}

}  // namespace

scheduler::Transformer load_llama(const GgufFile& f, Backend& backend) {
  TransformerSpec spec = read_llama_spec(f);
  check_llama_tensors(f, spec);
  return load_checked(f, std::move(spec), backend);
}

std::string model_fingerprint(const GgufFile& f) {
  // The tensor table and the first KiB of each tensor: cheap on a 100 GB
  // file and different for any two models one would confuse.
  uint32_t crc = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    crc = crc32c(t.name.data(), t.name.size(), crc);
    crc = crc32c(t.dims.data(), t.dims.size() * sizeof(int64_t), crc);
    const uint32_t type = static_cast<uint32_t>(t.type);
    crc = crc32c(&type, sizeof(type), crc);
    const std::span<const uint8_t> bytes = f.tensor_data(t);
    crc = crc32c(bytes.data(), std::min<size_t>(bytes.size(), 1024), crc);
  }
  const std::string arch = f.get_string_or("general.architecture", "?");
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08" PRIx32, crc);
  return str_cat(arch, " ", f.get_string_or("general.name", ""), " ", f.tensors().size(), " tensors crc32c ", hex);
}

Model::Model(GgufFile gguf, Tokenizer tokenizer, scheduler::Transformer transformer, std::string fingerprint)
    : gguf_(std::move(gguf)),
      tokenizer_(std::move(tokenizer)),
      transformer_(std::move(transformer)),
      fingerprint_(std::move(fingerprint)) {}

TransformerSpec check_model_file(const GgufFile& f, const Tokenizer& tokenizer) {
  TransformerSpec spec = read_llama_spec(f);
  check_llama_tensors(f, spec);
  // Real models may pad the embedding beyond the vocabulary, never the reverse.
  if (tokenizer.n_vocab() > spec.n_vocab)
    fail(ErrorCode::kCorrupt, f.name(), ": the tokenizer has ", tokenizer.n_vocab(), " tokens but token_embd.weight only ",
         spec.n_vocab, " rows");
  return spec;
}

std::unique_ptr<Model> Model::open(const std::string& path, Backend& backend) {
  GgufFile gguf = GgufFile::open(path);
  Tokenizer tokenizer = tokenizer_from_gguf(gguf);
  // Every check before any weight is loaded.
  scheduler::Transformer transformer = load_checked(gguf, check_model_file(gguf, tokenizer), backend);
  std::string fingerprint = model_fingerprint(gguf);
  return std::unique_ptr<Model>(
      new Model(std::move(gguf), std::move(tokenizer), std::move(transformer), std::move(fingerprint)));
}

}  // namespace longctx::model
