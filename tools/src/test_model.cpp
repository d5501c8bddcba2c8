// Random-weight Llama-architecture GGUF models (see test_model.h).
//
// Weights: each tensor draws from its own splitmix64 stream (Steele, Lea and
// Flood 2014) seeded with splitmix64(seed) ^ fnv1a64(tensor name), so a
// tensor's values depend only on (seed, name) and not on which other tensors
// exist. Normal deviates come from Box-Muller over 53-bit uniforms in (0, 1).
// Scales keep activations O(1): a matrix with fan-in K has entries
// N(0, 1/K) (std 1/sqrt(K)), so W x has unit-size entries when x does; norm
// weights are 1 + N(0, 0.1^2); QKV biases N(0, 0.2^2). Output logits get std
// ~2 so that the next-token distribution is peaked but not one-hot.
#include "longctx/tools/test_model.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <set>
#include <string_view>

#include "longctx/core/error.h"
#include "longctx/core/random.h"

namespace longctx::tools {
namespace {

using longctx::GgmlType;

// The first ids of the vocabulary: <unk> <s> </s> then <0x00>..<0xFF>.
constexpr int kUnkId = 0, kBosId = 1, kEosId = 2, kFirstByteId = 3, kFirstPieceId = 3 + 256;
// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeByte = 6;

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

// `n` values mean + std * N(0, 1) from the stream of (seed, name).
std::vector<float> draw(uint64_t seed, const std::string& name, int64_t n, double mean, double std) {
  SplitMix64 rng(SplitMix64(seed).next() ^ fnv1a64(name));
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = static_cast<float>(mean + std * normal(rng));
  return values;
}

// Text pieces in descending score. Single characters come first so that any
// text is covered without byte fallback for [a-z ] (a newline, as in Llama's
// vocabulary, falls back to <0x0A>), then merges, each the
// concatenation of two earlier pieces (SentencePiece BPE reaches a piece only
// through such a pair), then generated letter n-grams to fill any size.
std::vector<std::string> text_pieces(size_t count) {
  static const char* const kMerges[] = {
      "▁t", "he", "▁the", "▁a", "in", "er", "an", "on", "re", "▁s", "▁w", "at", "en", "nd", "▁o", "▁of",
      "▁i", "is", "it", "ou", "▁and", "▁to", "ing", "▁c", "es", "ed", "▁b", "or", "▁in", "▁h", "ar", "▁f",
      "▁m", "▁p", "le", "al", "as", "▁is", "▁th", "▁d", "ll", "ic", "▁l", "om", "ion", "▁that", "▁e", "st",
      "ve", "▁n", "ro", "ent", "▁be", "▁it", "ly", "▁wh", "▁was", "▁for", "▁re", "▁he", "▁on", "ith",
      "▁with", "▁st", "ter", "▁con", "ation", "▁y", "▁you", "▁we", "▁are", "▁as", "▁his", "▁her", "ot",
      "▁not", "ave", "▁have", "▁this", "▁by", "▁at", "rom", "▁from", "▁one", "▁g", "▁u", "▁r", "▁v"};
  static const char* const kSymbols[] = {".", ",", "'", "\"", "!", "?", "-", ":", ";", "(", ")"};
  const std::string lower = "etaoinshrdlcumwfgypbvkjxqz";
  const std::string space = "▁";

  std::vector<std::string> pieces;
  std::set<std::string> seen;
  auto add = [&](const std::string& piece) {
    if (pieces.size() < count && seen.insert(piece).second) pieces.push_back(piece);
  };
  add(space);
  for (const char c : lower) add(std::string(1, c));
  for (const char* m : kMerges) add(m);
  for (char c = 'A'; c <= 'Z'; ++c) add(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) add(std::string(1, c));
  for (const char* s : kSymbols) add(s);
  for (const char c : lower) add(space + c);
  for (char c = 'A'; c <= 'Z'; ++c) add(space + c);
  // Bigrams "xy", then "▁xy", then trigrams "xyz": enough for 17k+ pieces.
  for (const char a : lower)
    for (const char b : lower) add(std::string{a, b});
  for (const char a : lower)
    for (const char b : lower) add(space + std::string{a, b});
  for (const char a : lower)
    for (const char b : lower)
      for (const char c : lower) add(std::string{a, b, c});
  if (pieces.size() < count)
    fail(ErrorCode::kInvalidArgument, "test model: n_vocab too large, the generator has ",
         pieces.size() + kFirstPieceId, " tokens");
  return pieces;
}

void add_tokenizer(model::GgufWriter& w, int n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores(3, 0.0f);
  std::vector<int32_t> types = {kTypeUnknown, kTypeControl, kTypeControl};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.emplace_back(name);
    scores.push_back(0.0f);
    types.push_back(kTypeByte);
  }
  const auto pieces = text_pieces(static_cast<size_t>(n_vocab - kFirstPieceId));
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens.push_back(pieces[i]);
    scores.push_back(-static_cast<float>(i + 1));  // -1, -2, ...: earlier pieces merge first
    types.push_back(kTypeNormal);
  }
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  w.set_f32_array("tokenizer.ggml.scores", std::move(scores));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(types));
  w.set_u32("tokenizer.ggml.bos_token_id", kBosId);
  w.set_u32("tokenizer.ggml.eos_token_id", kEosId);
  w.set_u32("tokenizer.ggml.unknown_token_id", kUnkId);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_string("tokenizer.chat_template", kLlama2ChatTemplate);
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

void check_spec(const TestModelSpec& s) {
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail(ErrorCode::kInvalidArgument, "test model '", s.name, "': ", what);
  };
  need(s.arch == "llama" || s.arch == "qwen2", "arch must be \"llama\" or \"qwen2\"");
  need(s.n_layers >= 1 && s.n_heads >= 1 && s.n_kv_heads >= 1 && s.n_embd >= 1 && s.n_ff >= 1,
       "sizes must be positive");
  need(s.n_heads % s.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
  need(s.head_dim >= 2 && s.head_dim % 2 == 0, "head_dim must be even");
  need(s.n_vocab >= kFirstPieceId, "n_vocab must be at least 259 (3 specials + 256 bytes)");
  need(s.rope_theta > 0 && s.rms_eps > 0, "rope_theta and rms_eps must be positive");
  need(s.context_length >= 1 && s.context_length <= std::numeric_limits<uint32_t>::max(),
       "context_length must fit a u32");
  need(s.weight_type == GgmlType::kF32 || s.weight_type == GgmlType::kF16 || s.weight_type == GgmlType::kBF16 ||
           s.weight_type == GgmlType::kQ8_0 || s.weight_type == GgmlType::kQ4_0,
       "weight_type must be f32, f16, bf16, q8_0 or q4_0 (the types quantize writes)");
  const int64_t block = ggml_type_info(s.weight_type).block_elems;
  need(s.n_embd % block == 0 && s.n_ff % block == 0 && int64_t{s.n_heads} * s.head_dim % block == 0,
       "n_embd, n_ff and n_heads*head_dim must be multiples of the weight type's block size");
  // Large models would overflow the writer's buffers long before this.
  need(int64_t{s.n_vocab} * s.n_embd < (int64_t{1} << 32) && int64_t{s.n_ff} * s.n_embd < (int64_t{1} << 32),
       "tensors too large");
}

}  // namespace

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
  s = {};
  s.name = "qwen2-bias";  // Qwen2: QKV bias, halves RoPE, tied embeddings
  s.arch = "qwen2", s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.n_embd = 256, s.n_ff = 512;
  s.qkv_bias = true, s.tie_embeddings = true, s.rope_theta = 1000000.0f, s.rms_eps = 1e-6f;
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
  s = {};
  s.name = "bench";  // attention like Llama-3-8B (32 q, 8 kv heads, d 128); 2 layers, small MLP: ~160 MB f32
  s.n_layers = 2, s.n_heads = 32, s.n_kv_heads = 8, s.head_dim = 128, s.n_embd = 1024, s.n_ff = 2048;
  s.n_vocab = 4096, s.rope_theta = 500000.0f;
  add(s);
  return specs;
}

TestModelSpec test_model_by_name(const std::string& name) {
  std::string names;
  for (const auto& spec : standard_test_models()) {
    if (spec.name == name) return spec;
    names += (names.empty() ? "" : ", ") + spec.name;
  }
  fail(ErrorCode::kInvalidArgument, "unknown test model '", name, "' (known: ", names, ")");
}

model::GgufWriter make_test_model(const TestModelSpec& s) {
  check_spec(s);
  model::GgufWriter w;
  const std::string& a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", "longctx test model " + s.name);
  w.set_u32(a + ".context_length", static_cast<uint32_t>(s.context_length));
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layers);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_heads);
  w.set_u32(a + ".attention.head_count_kv", s.n_kv_heads);
  w.set_u32(a + ".attention.key_length", s.head_dim);
  w.set_u32(a + ".attention.value_length", s.head_dim);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.set_f32(a + ".rope.freq_base", s.rope_theta);
  w.set_u32(a + ".rope.dimension_count", s.head_dim);
  w.set_u32(a + ".vocab_size", s.n_vocab);
  add_tokenizer(w, s.n_vocab);

  const int64_t embd = s.n_embd, ff = s.n_ff, vocab = s.n_vocab;
  const int64_t q_dim = int64_t{s.n_heads} * s.head_dim, kv_dim = int64_t{s.n_kv_heads} * s.head_dim;
  // A 2-D weight [fan_in, fan_out] (GGUF order), entries N(0, 1/fan_in) * gain.
  auto matrix = [&](const std::string& name, int64_t fan_in, int64_t fan_out, double gain = 1.0) {
    const auto v = draw(s.seed, name, fan_in * fan_out, 0.0, gain / std::sqrt(static_cast<double>(fan_in)));
    w.add_tensor_f32(name, {fan_in, fan_out}, s.weight_type, v);
  };
  auto vector = [&](const std::string& name, int64_t n, double mean, double std) {
    const auto v = draw(s.seed, name, n, mean, std);
    w.add_tensor_f32(name, {n}, GgmlType::kF32, v);
  };

  // Tied: the embedding is also the output matrix, so it gets the output scale.
  const double embd_std = s.tie_embeddings ? 2.0 / std::sqrt(static_cast<double>(embd)) : 1.0;
  w.add_tensor_f32("token_embd.weight", {embd, vocab}, s.weight_type,
                   draw(s.seed, "token_embd.weight", embd * vocab, 0.0, embd_std));
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

}  // namespace longctx::tools
