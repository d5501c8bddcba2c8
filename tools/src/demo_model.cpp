// The analytically constructed pass-key model (see demo_model.h and
// tools/DEMO_MODEL.md for the derivation and the margins).
#include "longctx/tools/demo_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "longctx/core/backend.h"
#include "longctx/core/error.h"
#include "longctx/tools/test_model.h"

namespace longctx::tools {
namespace {

using longctx::GgmlType;
using S = DemoModelShape;

constexpr int kBosId = 1, kEosId = 2;
constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeByte = 6;
const std::string kSpace = "\xE2\x96\x81";  // "▁"

// Scores of the construction (DEMO_MODEL.md): per fast RoPE pair the offset
// detector adds kPairAmplitude * cos(omega * (distance - s)); the match lands
// near kSlotMatch and every other distance at least 0.489 * 11 pairs... below.
constexpr double kPairAmplitude = 66.0;  // A: score per fast pair at the match
constexpr double kSlotMatch = 26.0;      // layer-0 score of the marker at the right offset
constexpr double kRetrievalScore = 40.0; // layer-1 score of the digit with the wanted tag
constexpr float kDigitLogit = 10.0f, kEndLogit = 5.0f, kStartLogit = 2.5f;

// Rounds to the nearest bf16 value (ties to even), kept as f32: the file's
// weights are then the same for an f32 and a bf16 backend.
float bf16_exact(double value) {
  float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A weight [out, in] (row-major, GGUF dims {in, out}).
struct Matrix {
  int64_t out, in;
  std::vector<float> v;
  Matrix(int64_t o, int64_t i) : out(o), in(i), v(static_cast<size_t>(o * i), 0.0f) {}
  void set(int64_t o, int64_t i, double value) { v[static_cast<size_t>(o * in + i)] = bf16_exact(value); }
  float get(int64_t o, int64_t i) const { return v[static_cast<size_t>(o * in + i)]; }
};

void add(model::GgufWriter& w, const std::string& name, const Matrix& m) {
  w.add_tensor_f32(name, {m.in, m.out}, GgmlType::kF32, m.v);
}

// Words that get whole-word tokens (besides the sentences' own words).
const char* const kExtraWords[] = {"the", "a", "is", "what", "key", "pass", "passkey", "answer", "number",
                                   "question", "document", "find", "hidden", "in", "of", "and", "to"};

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (const char c : text + " ") {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) word += c;
    else if (!word.empty()) words.push_back(std::move(word)), word.clear();
  }
  return words;
}

}  // namespace

const std::vector<std::string>& demo_filler_sentences() {
  static const std::vector<std::string> sentences = {
      "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.",
      "The river runs to the sea.", "Birds sing in the morning.", "The wind moves the tall trees.",
      "A cat sleeps by the warm fire.", "The road winds over the hills.", "Rain falls on the quiet town.",
      "The old bridge crosses the river."};
  return sentences;
}

std::string demo_key_sentence(const std::string& key) {
  return "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
}

const std::string& demo_question() {
  static const std::string question = "What is the pass key? The pass key is";
  return question;
}

model::Vocab demo_vocab() {
  model::Vocab v;
  v.kind = model::TokenizerKind::kSpm;
  auto push = [&](std::string text, model::TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(type == model::TokenType::kNormal ? -static_cast<float>(v.tokens.size()) : 0.0f);
    v.types.push_back(type);
  };
  push("<unk>", model::TokenType::kUnknown);
  push("<s>", model::TokenType::kControl);
  push("</s>", model::TokenType::kControl);
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    push(name, model::TokenType::kByte);
  }
  std::set<std::string> seen;
  auto piece = [&](const std::string& text) {
    if (seen.insert(text).second) push(text, model::TokenType::kNormal);
  };
  piece(kSpace);
  for (char c = '!'; c <= '~'; ++c) piece(std::string(1, c));
  // "▁x" for every printable non-digit: a bare "▁" then only precedes digits
  // (or a second space), which makes it the number marker of the construction.
  for (char c = '!'; c <= '~'; ++c)
    if (c < '0' || c > '9') piece(kSpace + c);
  // Whole words through their prefix chains: SPM merges "▁w" + "o" -> "▁wo"...
  std::vector<std::string> words;
  for (const auto& s : demo_filler_sentences())
    for (auto& w : words_of(s)) words.push_back(w);
  for (auto& w : words_of(demo_key_sentence("0") + " " + demo_question())) words.push_back(w);
  for (const char* w : kExtraWords) words.push_back(w);
  for (const auto& w : words)
    for (size_t k = 2; k <= w.size(); ++k) piece(kSpace + w.substr(0, k));
  v.bos = kBosId;
  v.eos = kEosId;
  v.unk = 0;
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = true;
  v.chat_template = kLlama2ChatTemplate;
  return v;
}

model::GgufWriter make_demo_model() {
  const model::Vocab vocab = demo_vocab();
  const auto n_vocab = static_cast<int64_t>(vocab.tokens.size());
  const int64_t embd = S::kEmbd, hd = S::kHeadDim, q_dim = int64_t{S::kHeads} * S::kHeadDim;

  model::GgufWriter w;
  const std::string a = "llama";
  w.set_string("general.architecture", a);
  w.set_string("general.name", "longctx demo pass-key model");
  w.set_string("general.description",
               "Analytically constructed pass-key retrieval model (longctx tools/DEMO_MODEL.md); not trained.");
  w.set_u32(a + ".context_length", static_cast<uint32_t>(S::kContextLength));
  w.set_u32(a + ".embedding_length", S::kEmbd);
  w.set_u32(a + ".block_count", S::kLayers);
  w.set_u32(a + ".feed_forward_length", S::kFf);
  w.set_u32(a + ".attention.head_count", S::kHeads);
  w.set_u32(a + ".attention.head_count_kv", S::kHeads);
  w.set_u32(a + ".attention.key_length", S::kHeadDim);
  w.set_u32(a + ".attention.value_length", S::kHeadDim);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_f32(a + ".rope.freq_base", S::kRopeTheta);
  w.set_u32(a + ".rope.dimension_count", S::kHeadDim);
  w.set_u32(a + ".vocab_size", static_cast<uint32_t>(n_vocab));

  std::vector<std::string> tokens = vocab.tokens;
  std::vector<int32_t> types;
  for (const auto t : vocab.types) types.push_back(static_cast<int32_t>(t));
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  w.set_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.set_i32_array("tokenizer.ggml.token_type", std::move(types));
  w.set_u32("tokenizer.ggml.bos_token_id", kBosId);
  w.set_u32("tokenizer.ggml.eos_token_id", kEosId);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_string("tokenizer.chat_template", vocab.chat_template);

  // Token ids of the marker and the digits.
  int32_t marker = -1, digit0 = -1;
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (vocab.tokens[size_t(id)] == kSpace) marker = id;
    if (vocab.tokens[size_t(id)] == "0") digit0 = id;
  }
  if (marker < 0 || digit0 < 0) fail(ErrorCode::kInternal, "demo model: vocabulary lacks the marker or digits");
  // Digits '0'..'9' were added consecutively.
  for (int d = 0; d < 10; ++d)
    if (vocab.tokens[size_t(digit0 + d)] != std::string(1, char('0' + d)))
      fail(ErrorCode::kInternal, "demo model: digit tokens are not consecutive");

  // Embedding: the constant bias dimension, then the token's features.
  Matrix embed(n_vocab, embd);
  for (int64_t id = 0; id < n_vocab; ++id) embed.set(id, S::kBiasDim, S::kBias);
  embed.set(marker, S::kMarkerDim, 1.0);
  for (int d = 0; d < 10; ++d) embed.set(digit0 + d, S::kDigitDim + d, 1.0);
  add(w, "token_embd.weight", embed);

  // RMSNorm weight B/sqrt(n): the normalized stream is x * B/|x|, i.e. x
  // itself up to a factor in [0.99, 1] since |x|^2 = B^2 + (a few units).
  const float norm = bf16_exact(S::kBias / std::sqrt(double(embd)));
  const std::vector<float> norm_w(static_cast<size_t>(embd), norm);
  w.add_tensor_f32("output_norm.weight", {embd}, GgmlType::kF32, norm_w);

  // Output: digit d <- retrieved d; </s> <- any slot tag (marker, tag 1..5);
  // "▁" <- the bias (a constant, the default).
  Matrix out(n_vocab, embd);
  for (int d = 0; d < 10; ++d) out.set(digit0 + d, S::kRetrievedDim + d, kDigitLogit);
  out.set(kEosId, S::kMarkerDim, kEndLogit);
  for (int s = 0; s < S::kKeyDigits; ++s) out.set(kEosId, S::kTagDim + s, kEndLogit);
  out.set(marker, S::kBiasDim, kStartLogit / S::kBias);
  add(w, "output.weight", out);

  RopeParams rope;
  rope.n_rot = S::kHeadDim;
  rope.theta = S::kRopeTheta;
  const std::vector<float> omega = rope_inv_freq(rope);  // what the runtime rotates by
  const double score_scale = std::sqrt(double(hd));      // scores are q.k / sqrt(head_dim)
  const int offset_dim = 2 * (S::kHeadDim / 2 - 1);      // first channel of the slowest pair

  for (int layer = 0; layer < S::kLayers; ++layer) {
    const std::string p = "blk." + std::to_string(layer) + ".";
    Matrix wq(q_dim, embd), wk(q_dim, embd), wv(q_dim, embd), wo(embd, q_dim);
    if (layer == 0) {
      // Head h detects the marker s = h+1 positions back. Key (marker only):
      // 16 on channel 2i of each fast pair and on the offset channel. Query
      // (from the bias, the same for every token): alpha (cos w_i s, -sin w_i s)
      // per fast pair, so that after RoPE q.k = 16 alpha sum_i cos(w_i (dist - s)),
      // minus an offset that brings the match to kSlotMatch.
      const double k_amp = 16.0, q_amp = kPairAmplitude * score_scale / k_amp;
      for (int h = 0; h < S::kHeads; ++h) {
        const int s = h + 1;
        const int64_t r = int64_t{h} * hd;
        double match = 0.0;  // q.k at distance s with the rounded weights
        for (int i = 0; i < S::kFastPairs; ++i) {
          const double phase = double(omega[size_t(i)]) * s;
          wq.set(r + 2 * i, S::kBiasDim, q_amp * std::cos(phase) / S::kBias);
          wq.set(r + 2 * i + 1, S::kBiasDim, -q_amp * std::sin(phase) / S::kBias);
          wk.set(r + 2 * i, S::kMarkerDim, k_amp);
          match += double(wq.get(r + 2 * i, S::kBiasDim)) * S::kBias * k_amp * std::cos(phase) -
                   double(wq.get(r + 2 * i + 1, S::kBiasDim)) * S::kBias * k_amp * std::sin(phase);
        }
        wk.set(r + offset_dim, S::kMarkerDim, k_amp);
        wq.set(r + offset_dim, S::kBiasDim, (kSlotMatch * score_scale - match) / (k_amp * S::kBias));
        wv.set(r, S::kMarkerDim, 1.0);     // value: 1 for the marker
        wo.set(S::kTagDim + h, r, 1.0);    // -> slot tag s
      }
    } else {
      // Head 0 retrieves. Slot tag t lives on channel 2*(11 + t - 1) (pairs
      // 11..15, nearly still). A token with tag s asks for tag s+1.
      const double k_amp = 16.0, q_amp = kRetrievalScore * score_scale / k_amp;
      auto slot_channel = [&](int t) { return 2 * (S::kFirstSlowPair + t - 1); };
      for (int t = 1; t <= S::kKeyDigits; ++t) wk.set(slot_channel(t), S::kTagDim + t - 1, k_amp);
      wq.set(slot_channel(1), S::kMarkerDim, q_amp);
      for (int t = 1; t < S::kKeyDigits; ++t) wq.set(slot_channel(t + 1), S::kTagDim + t - 1, q_amp);
      for (int d = 0; d < 10; ++d) {
        wv.set(d, S::kDigitDim + d, 1.0);
        wo.set(S::kRetrievedDim + d, d, 1.0);
      }
    }
    w.add_tensor_f32(p + "attn_norm.weight", {embd}, GgmlType::kF32, norm_w);
    add(w, p + "attn_q.weight", wq);
    add(w, p + "attn_k.weight", wk);
    add(w, p + "attn_v.weight", wv);
    add(w, p + "attn_output.weight", wo);
    w.add_tensor_f32(p + "ffn_norm.weight", {embd}, GgmlType::kF32, norm_w);
    add(w, p + "ffn_gate.weight", Matrix(S::kFf, embd));
    add(w, p + "ffn_up.weight", Matrix(S::kFf, embd));
    add(w, p + "ffn_down.weight", Matrix(embd, S::kFf));
  }
  return w;
}

}  // namespace longctx::tools
