// The test models' tokenizers (test_vocab.h).
#include "test_vocab.h"

#include <array>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/tools/test_model.h"

namespace longctx::tools::detail {
namespace {

// The first ids of the vocabulary: <unk> <s> </s> then <0x00>..<0xFF>.
constexpr int kUnkId = 0, kBosId = 1, kEosId = 2, kFirstPieceId = kSpmMinVocab;
// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeByte = 6;


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
  // Bigrams "xy", then "▁xy", then trigrams "xyz" (17k+ pieces), then
  // "▁xyz" and four-letter pieces "wxyz" (Qwen's 152064 tokens), each the
  // concatenation of an earlier piece and a letter.
  for (const char a : lower)
    for (const char b : lower) add(std::string{a, b});
  for (const char a : lower)
    for (const char b : lower) add(space + std::string{a, b});
  for (const char a : lower)
    for (const char b : lower)
      for (const char c : lower) add(std::string{a, b, c});
  for (const char a : lower)
    for (const char b : lower)
      for (const char c : lower) add(space + std::string{a, b, c});
  for (const char a : lower)
    for (const char b : lower)
      for (const char c : lower)
        for (const char d : lower) {
          if (pieces.size() >= count) return pieces;  // 457k candidates: stop once full
          add(std::string{a, b, c, d});
        }
  if (pieces.size() < count)
    fail(ErrorCode::kInvalidArgument, "test model: n_vocab too large, the generator has ",
         pieces.size() + kFirstPieceId, " tokens");
  return pieces;
}

}  // namespace

void add_spm_tokenizer(model::GgufWriter& w, int n_vocab) {
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

namespace {

// GPT-2's byte-to-unicode characters, as byte-level BPE vocabularies spell
// bytes: printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) stand for
// themselves, the others for U+0100, U+0101, ... in byte order. The byte
// tokens take ids in that order: printable ones first.
struct ByteChars {
  std::array<std::string, 256> of_byte;
  std::vector<int> order;
};

std::string utf8(uint32_t cp) {  // cp < 0x800
  if (cp < 0x80) return std::string(1, char(cp));
  return {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
}

ByteChars byte_chars() {
  ByteChars t;
  std::vector<int> others;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) {
      t.of_byte[size_t(b)] = utf8(uint32_t(b));
      t.order.push_back(b);
    } else {
      t.of_byte[size_t(b)] = utf8(uint32_t(256 + others.size()));
      others.push_back(b);
    }
  }
  t.order.insert(t.order.end(), others.begin(), others.end());
  return t;
}

constexpr int kLlama3Regular = 128000;  // byte and merged tokens; the specials follow
constexpr int32_t kLlama3Bos = 128000, kLlama3Eot = 128009;

// The special tokens of Llama 3.1 from id 128000.
std::vector<std::string> llama3_specials() {
  std::vector<std::string> s = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                                "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                                "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  for (int k = 3; s.size() < size_t(kLlama3VocabSize - kLlama3Regular); ++k)
    s.push_back("<|reserved_special_token_" + std::to_string(k) + "|>");
  return s;
}

}  // namespace

void add_llama3_tokenizer(model::GgufWriter& w) {
  const ByteChars bytes = byte_chars();
  auto spell = [&](std::string_view text) {
    std::string out;
    for (const char c : text) out += bytes.of_byte[uint8_t(c)];
    return out;
  };
  std::vector<std::string> tokens, merges;
  std::unordered_set<std::string> seen;
  tokens.reserve(kLlama3VocabSize);
  for (const int b : bytes.order) tokens.push_back(bytes.of_byte[size_t(b)]);
  // `text` (raw bytes, two or more) as the merge of its prefix, added before
  // it in the order below, and its last byte.
  auto add = [&](const std::string& text) {
    if (tokens.size() >= size_t(kLlama3Regular) || !seen.insert(text).second) return;
    merges.push_back(spell(text.substr(0, text.size() - 1)) + " " + spell(text.substr(text.size() - 1)));
    tokens.push_back(spell(text));
  };
  const std::string lower = "etaoinshrdlcumwfgypbvkjxqz", upper = "ETAOINSHRDLCUMWFGYPBVKJXQZ";
  const std::string digits = "0123456789";
  for (const char* s : {"  ", "   ", "    ", "\n\n", " \n", ".\n", ",\n"}) add(s);
  for (const char a : digits)  // the Llama-3 pre-tokenizer splits numbers into groups of up to 3 digits
    for (const char b : digits) add(std::string{a, b});
  for (const char a : digits)
    for (const char b : digits)
      for (const char c : digits) add(std::string{a, b, c});
  for (const char c : lower + upper) add(std::string{' ', c});
  for (const std::string& first : {lower, upper})
    for (const char a : first)
      for (const char b : lower) add(std::string{a, b}), add(std::string{' ', a, b});
  for (const std::string& first : {lower, upper})
    for (const char a : first)
      for (const char b : lower)
        for (const char c : lower) add(std::string{a, b, c}), add(std::string{' ', a, b, c});
  for (const char a : lower)
    for (const char b : lower)
      for (const char c : lower)
        for (const char d : lower) add(std::string{a, b, c, d}), add(std::string{' ', a, b, c, d});
  if (tokens.size() != size_t(kLlama3Regular))
    fail(ErrorCode::kInternal, "llama3 test vocabulary: ", tokens.size(), " regular tokens");
  std::vector<int32_t> types(tokens.size(), kTypeNormal);
  for (std::string& special : llama3_specials()) {
    tokens.push_back(std::move(special));
    types.push_back(kTypeControl);
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "llama-bpe");
  w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(types));
  w.set_string_array("tokenizer.ggml.merges", std::move(merges));
  w.set_u32("tokenizer.ggml.bos_token_id", kLlama3Bos);
  w.set_u32("tokenizer.ggml.eos_token_id", kLlama3Eot);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_string("tokenizer.chat_template", kLlama3ChatTemplate);
}

}  // namespace longctx::tools::detail
