// Random-weight Llama-architecture GGUF models (see test_model.h).
//
// Weights: each tensor draws from its own splitmix64 stream (Steele, Lea and
// Flood 2014) seeded with splitmix64(seed) ^ fnv1a64(tensor name), so a
// tensor's values depend only on (seed, name) and not on which other tensors
// exist. Normal deviates come from Box-Muller over 53-bit uniforms in (0, 1);
// element i uses outputs 2i and 2i + 1, so any row can be generated on its own
// (SplitMix64::discard) and the bytes do not depend on the thread count.
// Scales keep activations O(1): a matrix with fan-in K has entries
// N(0, 1/K) (std 1/sqrt(K)), so W x has unit-size entries when x does; norm
// weights are 1 + N(0, 0.1^2); QKV biases N(0, 0.2^2). Output logits get std
// ~2 so that the next-token distribution is peaked but not one-hot.
#include "longctx/tools/test_model.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <string_view>

#include "longctx/core/error.h"
#include "longctx/core/random.h"
#include "test_vocab.h"

namespace longctx::tools {
namespace {

using longctx::GgmlType;

// Standard normal by Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 and u2 in (0, 1).
double normal(SplitMix64& rng) {
  const double u1 = rng.uniform_open(), u2 = rng.uniform_open();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const char c : text) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ULL;
  return h;
}

// Values generated per chunk of rows (about 16 MiB as f32): the memory a
// tensor's data needs while it is written, whatever its size.
constexpr int64_t kChunkValues = int64_t{4} << 20;

// The data of tensor `name` of rows x `row` values mean + std * N(0, 1),
// stored as `type`: each chunk of rows generated and quantized by TBB tasks,
// row by row, then written.
model::GgufWriter::TensorData random_tensor(uint64_t seed, std::string name, int64_t row, int64_t rows,
                                            GgmlType type, double mean, double std) {
  return [=](FileSink& sink) {
    const uint64_t stream = SplitMix64(seed).next() ^ fnv1a64(name);
    const size_t row_bytes = static_cast<size_t>(*ggml_bytes(type, row));
    const int64_t chunk = std::clamp<int64_t>(kChunkValues / row, 1, rows);
    std::vector<uint8_t> out(static_cast<size_t>(chunk) * row_bytes);
    for (int64_t first = 0; first < rows; first += chunk) {
      const int64_t n = std::min(chunk, rows - first);
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n), [&](const tbb::blocked_range<int64_t>& range) {
        std::vector<float> values(static_cast<size_t>(row));
        for (int64_t r = range.begin(); r < range.end(); ++r) {
          SplitMix64 rng(stream);
          rng.discard(2 * static_cast<uint64_t>((first + r) * row));
          for (float& v : values) v = static_cast<float>(mean + std * normal(rng));
          try {
            quantize(type, values, std::span(out).subspan(static_cast<size_t>(r) * row_bytes, row_bytes));
          } catch (const Error& e) {
            fail(e.code(), "tensor '", name, "' row ", first + r, ": ", e.what());
          }
        }
      });
      sink.write(out.data(), static_cast<size_t>(n) * row_bytes);
    }
  };
}

// Llama-3.1 rope scaling (factor 8, low_freq_factor 1, high_freq_factor 4,
// original context 8192): wavelength 2 pi / theta_i below original/high keeps
// factor 1, above original/low gets `factor`, and in between
// 1 / ((1 - s) / factor + s) with s = (original / wavelength - low) / (high - low).
// RoPE divides theta_i by these factors.
std::vector<float> llama31_rope_factors(int head_dim, double rope_theta) {
  constexpr double kFactor = 8.0, kLow = 1.0, kHigh = 4.0, kOriginal = 8192.0;
  std::vector<float> factors;
  for (int i = 0; i < head_dim; i += 2) {
    const double freq = std::pow(rope_theta, -static_cast<double>(i) / head_dim);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f;
    if (wavelen < kOriginal / kHigh) f = 1.0;
    else if (wavelen > kOriginal / kLow) f = kFactor;
    else {
      const double smooth = (kOriginal / wavelen - kLow) / (kHigh - kLow);
      f = 1.0 / ((1.0 - smooth) / kFactor + smooth);
    }
    factors.push_back(static_cast<float>(f));
  }
  return factors;
}

// The weight formats: name, type of the 2-D weights (the base of a mix),
// llama.cpp's _M mix, and the llama_ftype written as general.file_type
// (for a plain k-quant, the one llama.cpp guesses from its main type).
struct WeightFormat {
  const char* name;
  GgmlType type;
  bool k_mix;
  uint32_t file_type;
};
constexpr WeightFormat kWeightFormats[] = {
    {"f32", GgmlType::kF32, false, 0},     {"f16", GgmlType::kF16, false, 1},
    {"bf16", GgmlType::kBF16, false, 32},  {"q8_0", GgmlType::kQ8_0, false, 7},
    {"q4_0", GgmlType::kQ4_0, false, 2},   {"q4_1", GgmlType::kQ4_1, false, 3},
    {"q5_0", GgmlType::kQ5_0, false, 8},   {"q5_1", GgmlType::kQ5_1, false, 9},
    {"q4_k", GgmlType::kQ4_K, false, 15},  {"q5_k", GgmlType::kQ5_K, false, 17},
    {"q6_k", GgmlType::kQ6_K, false, 18},  {"q4_k_m", GgmlType::kQ4_K, true, 15},
    {"q5_k_m", GgmlType::kQ5_K, true, 17}, {"q3_k_m", GgmlType::kQ3_K, true, 12},
    {"q2_k", GgmlType::kQ2_K, true, 10},
};

const WeightFormat* find_format(const TestModelSpec& s) {
  for (const WeightFormat& f : kWeightFormats)
    if (f.type == s.weight_type && f.k_mix == s.k_mix) return &f;
  return nullptr;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// The row length (dims[0]) of 2-D weight `tensor` and its layer (-1 outside
// the blocks); row 0 for the tensors that stay f32.
std::pair<int64_t, int> weight_rows(const TestModelSpec& s, const std::string& tensor) {
  if (tensor == "token_embd.weight" || tensor == "output.weight") return {s.n_embd, -1};
  if (tensor == "output_norm.weight" || tensor == "rope_freqs.weight") return {0, -1};
  int layer = -1, consumed = 0;
  if (std::sscanf(tensor.c_str(), "blk.%d.%n", &layer, &consumed) == 1 && layer >= 0 && layer < s.n_layers) {
    const std::string_view rest = std::string_view(tensor).substr(static_cast<size_t>(consumed));
    if (rest == "attn_q.weight" || rest == "attn_k.weight" || rest == "attn_v.weight" || rest == "ffn_gate.weight" ||
        rest == "ffn_up.weight")
      return {s.n_embd, layer};
    if (rest == "attn_output.weight") return {int64_t{s.n_heads} * s.head_dim, layer};
    if (rest == "ffn_down.weight") return {s.n_ff, layer};
    if (ends_with(rest, "_norm.weight") || ends_with(rest, ".bias")) return {0, layer};
  }
  fail(ErrorCode::kInvalidArgument, "test model '", s.name, "': no tensor '", tensor, "' in the layout");
}

// llama.cpp's choice for LLAMA_FTYPE_MOSTLY_Q2_K, Q3_K_M, Q4_K_M and Q5_K_M
// (test_model.h).
GgmlType k_mix_type(const TestModelSpec& s, const std::string& tensor, int layer, int64_t row) {
  if (tensor == "output.weight" || (s.tie_embeddings && tensor == "token_embd.weight"))
    return row % 256 != 0 ? GgmlType::kQ8_0 : GgmlType::kQ6_K;
  const int n = s.n_layers;
  const bool attn_v = ends_with(tensor, ".attn_v.weight"), ffn_down = ends_with(tensor, ".ffn_down.weight");
  const bool attn_output = ends_with(tensor, ".attn_output.weight");
  const bool is_70b = n == 80 && (s.arch == "qwen2" || s.n_heads != s.n_kv_heads);
  GgmlType type = s.weight_type;
  switch (s.weight_type) {
    case GgmlType::kQ2_K:
      if (attn_v) type = s.n_heads / s.n_kv_heads >= 4 ? GgmlType::kQ4_K : GgmlType::kQ3_K;
      if (ffn_down || attn_output) type = GgmlType::kQ3_K;
      break;
    case GgmlType::kQ3_K:
      if (attn_v) type = layer < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      if (ffn_down) type = layer < n / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      if (attn_output) type = GgmlType::kQ4_K;
      break;
    default: {
      const bool more_bits = layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
      if ((attn_v || ffn_down) && more_bits) return GgmlType::kQ6_K;
      break;
    }
  }
  if (attn_v && is_70b && (type == GgmlType::kQ3_K || type == GgmlType::kQ4_K)) type = GgmlType::kQ5_K;
  return type;
}

void check_spec(const TestModelSpec& s) {
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail(ErrorCode::kInvalidArgument, "test model '", s.name, "': ", what);
  };
  need(s.arch == "llama" || s.arch == "qwen2" || s.arch == "internlm2",
       "arch must be \"llama\", \"qwen2\" or \"internlm2\"");
  need(s.n_layers >= 1 && s.n_heads >= 1 && s.n_kv_heads >= 1 && s.n_embd >= 1 && s.n_ff >= 1,
       "sizes must be positive");
  need(s.n_heads % s.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  need(s.head_dim >= 2 && s.head_dim % 2 == 0, "head_dim must be even");
  if (s.llama3_vocab) need(s.n_vocab == detail::kLlama3VocabSize, "the Llama-3 vocabulary has 128256 tokens");
  else need(s.n_vocab >= detail::kSpmMinVocab, "n_vocab must be at least 259 (3 specials + 256 bytes)");
  need(s.rope_theta > 0 && s.rms_eps > 0, "rope_theta and rms_eps must be positive");
  need(s.attn_scale >= 0 && std::isfinite(s.attn_scale), "attn_scale must be finite and >= 0");
  need(s.yarn_factor == 0 || (s.yarn_factor >= 1 && std::isfinite(s.yarn_factor)), "yarn_factor must be 0 or >= 1");
  need(s.yarn_original_context >= 1 && s.yarn_original_context <= std::numeric_limits<uint32_t>::max(),
       "yarn_original_context must fit a u32");
  need(s.yarn_factor == 0 || !s.llama3_rope, "yarn_factor and llama3_rope cannot be combined");
  need(s.context_length >= 1 && s.context_length <= std::numeric_limits<uint32_t>::max(),
       "context_length must fit a u32");
  if (find_format(s) == nullptr)
    fail(ErrorCode::kInvalidArgument, "test model '", s.name, "': weight type ", ggml_type_info(s.weight_type).name,
         s.k_mix ? " with the k-quant mix" : "", " is not a weight format (", weight_format_names(), ")");
}

}  // namespace

std::string weight_format_names() {
  std::string names;
  for (const WeightFormat& f : kWeightFormats) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

void set_weight_format(TestModelSpec& spec, const std::string& name) {
  for (const WeightFormat& f : kWeightFormats) {
    if (name != f.name) continue;
    spec.weight_type = f.type;
    spec.k_mix = f.k_mix;
    return;
  }
  fail(ErrorCode::kInvalidArgument, "unknown weight format '", name, "' (", weight_format_names(), ")");
}

std::string weight_format_name(const TestModelSpec& spec) {
  const WeightFormat* f = find_format(spec);
  return f ? f->name : ggml_type_info(spec.weight_type).name + std::string(spec.k_mix ? " (mixed)" : "");
}

GgmlType tensor_type(const TestModelSpec& s, const std::string& tensor) {
  const auto [row, layer] = weight_rows(s, tensor);
  if (row == 0) return GgmlType::kF32;
  GgmlType type = s.k_mix ? k_mix_type(s, tensor, layer, row) : s.weight_type;
  if (row % ggml_type_info(type).block_elems == 0) return type;
  if (!s.k_mix || type == GgmlType::kQ8_0)
    fail(ErrorCode::kInvalidArgument, "test model '", s.name, "': tensor '", tensor, "' has rows of ", row,
         ", not a multiple of the ", ggml_type_info(type).name, " block size ", ggml_type_info(type).block_elems);
  // llama.cpp's fallback for rows that k-quants cannot hold (IQ4_NL for Q2_K and Q3_K, which longctx lacks).
  if (type == GgmlType::kQ2_K || type == GgmlType::kQ3_K)
    fail(ErrorCode::kInvalidArgument, "test model '", s.name, "': tensor '", tensor, "' has rows of ", row,
         ", not a multiple of 256; llama.cpp stores such ", ggml_type_info(type).name,
         " rows as IQ4_NL, which longctx does not read");
  type = type == GgmlType::kQ4_K ? GgmlType::kQ5_0 : type == GgmlType::kQ5_K ? GgmlType::kQ5_1 : GgmlType::kQ8_0;
  return row % 32 == 0 ? type : GgmlType::kF16;
}

std::vector<TestModelSpec> standard_test_models() {
  std::vector<TestModelSpec> specs;
  auto add = [&](TestModelSpec s) { specs.push_back(std::move(s)); };
  TestModelSpec s;
  s.name = "mha-64";  // plain multi-head attention, n_embd == n_heads * head_dim
  s.n_heads = 4, s.n_kv_heads = 4, s.head_dim = 64, s.n_embd = 256, s.n_ff = 512, s.n_vocab = 320;
  add(s);
  s = {};
  s.name = "gqa-128";  // GQA 4:1, head_dim 128, n_embd != n_heads * head_dim
  s.n_heads = 8, s.n_kv_heads = 2, s.head_dim = 128, s.n_embd = 512, s.n_ff = 768, s.n_vocab = 384;
  add(s);
  const TestModelSpec gqa = s;
  s = {};
  s.name = "qwen2-bias";  // Qwen2: QKV bias, halves RoPE, tied embeddings
  s.arch = "qwen2", s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.n_embd = 256, s.n_ff = 512;
  s.qkv_bias = true, s.tie_embeddings = true, s.rope_theta = 1000000.0f, s.rms_eps = 1e-6f;
  add(s);
  s.name = "qwen2-yarn";  // the same with Qwen2.5's YaRN setting for 128K
  s.yarn_factor = 4.0f, s.yarn_original_context = 32768, s.context_length = 131072;
  add(s);
  s = {};
  s.name = "q8";  // Q8_0 weights, 3 layers
  s.n_layers = 3, s.weight_type = GgmlType::kQ8_0;
  add(s);
  s = {};
  s.name = "f16";  // F16 weights
  s.weight_type = GgmlType::kF16;
  add(s);
  s = {};
  s.name = "llama3-rope";  // Llama-3.1 rope_freqs, theta 500000, GQA 4:1
  s.n_heads = 4, s.n_kv_heads = 1, s.llama3_rope = true, s.rope_theta = 500000.0f;
  add(s);
  // Quantized gqa-128 (rows of 512, 768, 1024).
  for (const char* format : {"q4_0", "q6_k", "q4_k_m", "q5_k_m", "q3_k_m", "q2_k"}) {
    s = gqa;
    s.name = format;
    set_weight_format(s, format);
    s.n_layers = s.k_mix ? 3 : 2;
    add(s);
  }
  s = {};
  s.name = "bench";  // attention like Llama-3-8B (32 q, 8 kv heads, d 128); 2 layers, small MLP: ~160 MB f32
  s.n_layers = 2, s.n_heads = 32, s.n_kv_heads = 8, s.head_dim = 128, s.n_embd = 1024, s.n_ff = 2048;
  s.n_vocab = 4096, s.rope_theta = 500000.0f;
  add(s);
  return specs;
}

std::vector<TestModelSpec> full_size_models() {
  TestModelSpec s;
  s.name = "llama3-8b";  // Llama-3.1-8B's layout
  s.n_layers = 32, s.n_heads = 32, s.n_kv_heads = 8, s.head_dim = 128, s.n_embd = 4096, s.n_ff = 14336;
  s.n_vocab = detail::kLlama3VocabSize, s.llama3_vocab = true;
  s.rope_theta = 500000.0f, s.llama3_rope = true, s.context_length = 131072;
  set_weight_format(s, "q4_k_m");
  TestModelSpec four = s;
  four.name = "llama3-8b-4l";
  four.n_layers = 4;
  TestModelSpec qwen;
  qwen.name = "qwen2.5-7b";  // Qwen2.5-7B-Instruct's layout, with Qwen's YaRN setting for 128K
  qwen.arch = "qwen2", qwen.n_layers = 28, qwen.n_heads = 28, qwen.n_kv_heads = 4, qwen.head_dim = 128;
  qwen.n_embd = 3584, qwen.n_ff = 18944, qwen.n_vocab = 152064, qwen.qkv_bias = true;
  qwen.rope_theta = 1000000.0f, qwen.rms_eps = 1e-6f, qwen.context_length = 32768;
  qwen.yarn_factor = 4.0f, qwen.yarn_original_context = 32768;
  set_weight_format(qwen, "q4_k_m");
  TestModelSpec qwen_four = qwen;
  qwen_four.name = "qwen2.5-7b-4l";
  qwen_four.n_layers = 4;
  return {s, four, qwen, qwen_four};
}

TestModelSpec test_model_by_name(const std::string& name) {
  std::string names;
  for (const auto& list : {standard_test_models(), full_size_models()}) {
    for (const auto& spec : list) {
      if (spec.name == name) return spec;
      names += (names.empty() ? "" : ", ") + spec.name;
    }
  }
  fail(ErrorCode::kInvalidArgument, "unknown test model '", name, "' (known: ", names, ")");
}

model::GgufWriter make_test_model(const TestModelSpec& s) {
  check_spec(s);
  model::GgufWriter w;
  const std::string& a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", "longctx test model " + s.name);
  w.set_u32("general.file_type", find_format(s)->file_type);
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + ".context_length", static_cast<uint32_t>(s.context_length));
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layers);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_heads);
  w.set_u32(a + ".attention.head_count_kv", s.n_kv_heads);
  w.set_u32(a + ".attention.key_length", s.head_dim);
  w.set_u32(a + ".attention.value_length", s.head_dim);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  if (s.attn_scale > 0) w.set_f32(a + ".attention.scale", s.attn_scale);
  w.set_f32(a + ".rope.freq_base", s.rope_theta);
  w.set_u32(a + ".rope.dimension_count", s.head_dim);
  if (s.yarn_factor > 0) {
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_f32(a + ".rope.scaling.factor", s.yarn_factor);
    w.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_original_context));
  }
  w.set_u32(a + ".vocab_size", s.n_vocab);
  if (s.llama3_vocab) detail::add_llama3_tokenizer(w);
  else detail::add_spm_tokenizer(w, s.n_vocab);

  const int64_t embd = s.n_embd, ff = s.n_ff, vocab = s.n_vocab;
  const int64_t q_dim = int64_t{s.n_heads} * s.head_dim, kv_dim = int64_t{s.n_kv_heads} * s.head_dim;
  // A tensor [n, rows] (GGUF order) of mean + std * N(0, 1), stored as tensor_type() says.
  auto tensor = [&](const std::string& name, int64_t n, int64_t rows, double mean, double std) {
    const GgmlType type = tensor_type(s, name);
    std::vector<int64_t> dims = rows == 1 ? std::vector<int64_t>{n} : std::vector<int64_t>{n, rows};
    w.add_tensor_stream(name, std::move(dims), type, random_tensor(s.seed, name, n, rows, type, mean, std));
  };
  // A 2-D weight [fan_in, fan_out], entries N(0, 1/fan_in) * gain.
  auto matrix = [&](const std::string& name, int64_t fan_in, int64_t fan_out, double gain = 1.0) {
    tensor(name, fan_in, fan_out, 0.0, gain / std::sqrt(static_cast<double>(fan_in)));
  };
  auto vector = [&](const std::string& name, int64_t n, double mean, double std) { tensor(name, n, 1, mean, std); };

  // Tied: the embedding is also the output matrix, so it gets the output scale.
  tensor("token_embd.weight", embd, vocab, 0.0, s.tie_embeddings ? 2.0 / std::sqrt(static_cast<double>(embd)) : 1.0);
  vector("output_norm.weight", embd, 1.0, 0.1);
  if (!s.tie_embeddings) matrix("output.weight", embd, vocab, 2.0);
  if (s.llama3_rope) {
    const auto factors = llama31_rope_factors(s.head_dim, s.rope_theta);
    w.add_tensor_f32("rope_freqs.weight", {static_cast<int64_t>(factors.size())}, GgmlType::kF32, factors);
  }
  for (int layer = 0; layer < s.n_layers; ++layer) {
    const std::string p = "blk." + std::to_string(layer) + ".";
    vector(p + "attn_norm.weight", embd, 1.0, 0.1);
    matrix(p + "attn_q.weight", embd, q_dim);
    matrix(p + "attn_k.weight", embd, kv_dim);
    matrix(p + "attn_v.weight", embd, kv_dim);
    if (s.qkv_bias) {
      vector(p + "attn_q.bias", q_dim, 0.0, 0.2);
      vector(p + "attn_k.bias", kv_dim, 0.0, 0.2);
      vector(p + "attn_v.bias", kv_dim, 0.0, 0.2);
    }
    matrix(p + "attn_output.weight", q_dim, embd);
    vector(p + "ffn_norm.weight", embd, 1.0, 0.1);
    matrix(p + "ffn_gate.weight", embd, ff);
    matrix(p + "ffn_up.weight", embd, ff);
    matrix(p + "ffn_down.weight", ff, embd);
  }
  return w;
}

// Llama-2 chat format: "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>".
const char* const kLlama2ChatTemplate =
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system_message = '<<SYS>>\\n' + messages[0]['content'] | trim + '\\n<</SYS>>\\n\\n' %}"
    "{% set messages = messages[1:] %}"
    "{% else %}{% set system_message = '' %}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (system_message if loop.first else '') + message['content'] | trim + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] | trim + ' ' + eos_token }}"
    "{% endif %}"
    "{% endfor %}";

// Meta-Llama-3-Instruct's template: "<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
// per message, then the assistant header when a generation prompt is asked.
const char* const kLlama3ChatTemplate =
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim "
    "+ '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

}  // namespace longctx::tools
