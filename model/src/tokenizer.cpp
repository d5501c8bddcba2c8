// Tokenizer: validates a Vocab, builds its lookup tables, splits special
// tokens out of the text, and hands the text between them to the SPM or BPE
// algorithm (tokenizer_spm.cpp, tokenizer_bpe.cpp); the inverse per token.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/tokenizer.h"
#include "tokenizer_internal.h"

namespace longctx::model {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

TokenType type_of(const Vocab& vocab, size_t id) {
  return vocab.types.empty() ? TokenType::kNormal : vocab.types[id];
}

// "<0xAB>" -> 0xAB; -1 for anything else.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  int value = 0;
  for (const char c : text.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') value += c - '0';
    else if (c >= 'A' && c <= 'F') value += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') value += c - 'a' + 10;
    else return -1;
  }
  return value;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i).starts_with(from)) {
      out += to;
      i += from.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// A BPE token's bytes: each byte-unicode character back to its byte; any
// other character (not produced by the mapping) is kept as it is.
std::string unmap_bytes(std::string_view text) {
  const detail::ByteUnicode& table = detail::byte_unicode();
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = detail::utf8_char_len(text, i);
    uint32_t cp = n == 1 ? uint8_t(text[i]) : uint8_t(text[i]) & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(text[i + k]) & 0x3F);
    const int byte = cp < table.cp_to_byte.size() ? table.cp_to_byte[cp] : -1;
    if (byte >= 0 && text.substr(i, n) == table.byte_to_utf8[size_t(byte)])
      out += char(byte);
    else
      out += text.substr(i, n);
    i += n;
  }
  return out;
}

void check_special_id(int32_t id, const char* key, size_t n_vocab) {
  if (id < -1 || int64_t(id) >= int64_t(n_vocab))
    fail(ErrorCode::kCorrupt, "tokenizer.ggml.", key, " is ", id, ", outside [0, ", n_vocab, ")");
}

}  // namespace

struct Tokenizer::Impl {
  Vocab vocab;
  detail::Tables tables;
  std::unique_ptr<detail::PreTokenizerRegex> regex;  // BPE
  // Tokens matched whole in the text: user-defined always, control and
  // unknown with parse_special. Per first byte, the distinct lengths of those
  // texts, longest first (leftmost-longest match).
  detail::TokenMap specials;
  std::array<std::vector<size_t>, 256> special_lengths;
  std::vector<std::string> pieces;  // token_to_piece of every id
  std::vector<bool> end_of_generation;

  explicit Impl(Vocab v);
  void validate() const;
  void build_tables();
  void build_specials();
  void build_pieces();
  // Length of the special token at text[pos], 0 if none; its id in *id.
  size_t match_special(std::string_view text, size_t pos, bool parse_special, int32_t* id) const;
  void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const;
};

Tokenizer::Impl::Impl(Vocab v) : vocab(std::move(v)) {
  validate();
  build_tables();
  build_specials();
  build_pieces();
}

void Tokenizer::Impl::validate() const {
  const size_t n = vocab.tokens.size();
  if (n == 0) fail(ErrorCode::kCorrupt, "tokenizer.ggml.tokens is empty");
  if (n > size_t(std::numeric_limits<int32_t>::max()))
    fail(ErrorCode::kCorrupt, "tokenizer.ggml.tokens has ", n, " tokens, more than ids can address");
  if (!vocab.scores.empty() && vocab.scores.size() != n)
    fail(ErrorCode::kCorrupt, "tokenizer.ggml.scores has ", vocab.scores.size(), " entries for ", n, " tokens");
  if (!vocab.types.empty() && vocab.types.size() != n)
    fail(ErrorCode::kCorrupt, "tokenizer.ggml.token_type has ", vocab.types.size(), " entries for ", n, " tokens");
  for (size_t i = 0; i < vocab.scores.size(); ++i)
    if (std::isnan(vocab.scores[i])) fail(ErrorCode::kCorrupt, "tokenizer.ggml.scores[", i, "] is NaN");
  for (size_t i = 0; i < vocab.types.size(); ++i) {
    const auto t = int32_t(vocab.types[i]);
    if (t < int32_t(TokenType::kNormal) || t > int32_t(TokenType::kByte))
      fail(ErrorCode::kCorrupt, "tokenizer.ggml.token_type[", i, "] is ", t, ", not a token type (1..6)");
  }
  check_special_id(vocab.bos, "bos_token_id", n);
  check_special_id(vocab.eos, "eos_token_id", n);
  check_special_id(vocab.eot, "eot_token_id", n);
  check_special_id(vocab.unk, "unknown_token_id", n);
  check_special_id(vocab.pad, "padding_token_id", n);
  if (vocab.kind == TokenizerKind::kBpe && vocab.merges.size() > size_t(std::numeric_limits<int32_t>::max()))
    fail(ErrorCode::kCorrupt, "tokenizer.ggml.merges has ", vocab.merges.size(), " entries");
  // One id per text, whatever the type (llama.cpp aborts on a repeat): a
  // repeated text would make encoding pick one id and decoding accept both.
  detail::TokenMap first_id;
  first_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto [at, inserted] = first_id.emplace(vocab.tokens[i], int32_t(i));
    if (!inserted)
      fail(ErrorCode::kCorrupt, "tokenizer.ggml.tokens: token ", i, " '", vocab.tokens[i], "' repeats token ",
           at->second);
  }
}

void Tokenizer::Impl::build_tables() {
  const size_t n = vocab.tokens.size();
  tables.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const TokenType type = type_of(vocab, i);
    if (type == TokenType::kNormal || type == TokenType::kUserDefined)
      tables.text_to_id.emplace(vocab.tokens[i], int32_t(i));  // unique: validate() refuses repeats
  }
  tables.byte_token.fill(-1);
  if (vocab.kind == TokenizerKind::kSpm) {
    for (size_t i = 0; i < n; ++i) {
      if (type_of(vocab, i) != TokenType::kByte) continue;
      const int byte = parse_byte_token(vocab.tokens[i]);
      if (byte < 0)
        fail(ErrorCode::kCorrupt, "tokenizer.ggml.tokens[", i, "] '", vocab.tokens[i],
             "' has the byte token type but is not <0xXX>");
      if (tables.byte_token[size_t(byte)] < 0) tables.byte_token[size_t(byte)] = int32_t(i);
    }
    return;
  }

  const detail::ByteUnicode& table = detail::byte_unicode();
  for (size_t b = 0; b < 256; ++b) {
    const auto it = tables.text_to_id.find(std::string_view(table.byte_to_utf8[b]));
    if (it != tables.text_to_id.end()) tables.byte_token[b] = it->second;
  }
  tables.merges.reserve(vocab.merges.size());
  const auto lookup = [&](std::string_view text, size_t rank, std::string_view merge) {
    const auto it = tables.text_to_id.find(text);
    if (it == tables.text_to_id.end())
      fail(ErrorCode::kCorrupt, "tokenizer.ggml.merges[", rank, "] '", merge, "' names '", text,
           "', which is not a token of the vocabulary");
    return it->second;
  };
  std::string joined;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string_view merge = vocab.merges[rank];
    // The first space after the first byte separates the two sides, so that a
    // left side may itself be a space.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos || space + 1 >= merge.size())
      fail(ErrorCode::kCorrupt, "tokenizer.ggml.merges[", rank, "] '", merge,
           "' is not two tokens separated by a space");
    const std::string_view left = merge.substr(0, space), right = merge.substr(space + 1);
    const int32_t left_id = lookup(left, rank, merge), right_id = lookup(right, rank, merge);
    joined.assign(left);
    joined += right;
    const detail::Merge m{int32_t(rank), lookup(joined, rank, merge)};
    tables.merges.emplace(detail::pair_key(left_id, right_id), m);
  }
  tables.ignore_merges = pre_tokenizer_info(vocab.pre).ignore_merges;
  regex = std::make_unique<detail::PreTokenizerRegex>(vocab.pre);
}

void Tokenizer::Impl::build_specials() {
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    const TokenType type = type_of(vocab, i);
    const std::string& text = vocab.tokens[i];
    if (text.empty() ||
        (type != TokenType::kControl && type != TokenType::kUnknown && type != TokenType::kUserDefined))
      continue;
    if (!specials.emplace(text, int32_t(i)).second) continue;
    std::vector<size_t>& lengths = special_lengths[uint8_t(text[0])];
    if (std::find(lengths.begin(), lengths.end(), text.size()) == lengths.end()) lengths.push_back(text.size());
  }
  for (auto& lengths : special_lengths) std::sort(lengths.rbegin(), lengths.rend());
}

void Tokenizer::Impl::build_pieces() {
  const size_t n = vocab.tokens.size();
  pieces.resize(n);
  end_of_generation.assign(n, false);
  static constexpr std::string_view kEndTexts[] = {"<|im_end|>", "<|eot_id|>",    "<|end_of_text|>", "<|endoftext|>",
                                                   "<|eom_id|>", "<end_of_turn>", "<|end|>",         "</s>"};
  for (size_t i = 0; i < n; ++i) {
    const TokenType type = type_of(vocab, i);
    const std::string& text = vocab.tokens[i];
    if (type == TokenType::kControl) {
      end_of_generation[i] = std::find(std::begin(kEndTexts), std::end(kEndTexts), text) != std::end(kEndTexts);
      continue;  // a control token prints nothing
    }
    if (vocab.kind == TokenizerKind::kSpm) {
      const int byte = type == TokenType::kByte ? parse_byte_token(text) : -1;
      pieces[i] = byte >= 0 ? std::string(1, char(byte)) : replace_all(text, kSpace, " ");
    } else {
      pieces[i] = type == TokenType::kUserDefined || type == TokenType::kUnknown ? text : unmap_bytes(text);
    }
  }
  for (const int32_t id : {vocab.eos, vocab.eot})
    if (id >= 0) end_of_generation[size_t(id)] = true;
}

size_t Tokenizer::Impl::match_special(std::string_view text, size_t pos, bool parse_special, int32_t* id) const {
  for (const size_t len : special_lengths[uint8_t(text[pos])]) {
    if (len > text.size() - pos) continue;
    const auto it = specials.find(text.substr(pos, len));
    if (it == specials.end()) continue;
    if (!parse_special && type_of(vocab, size_t(it->second)) != TokenType::kUserDefined) continue;
    *id = it->second;
    return len;
  }
  return 0;
}

void Tokenizer::Impl::encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  if (vocab.kind == TokenizerKind::kSpm) {
    // Like SentencePiece with a dummy prefix: a space starts the text and
    // follows every special token.
    std::string normalized = vocab.add_space_prefix && after_special ? std::string(kSpace) : std::string();
    normalized += replace_all(text, " ", kSpace);
    detail::spm_encode(vocab, tables, normalized, out);
    return;
  }
  regex->split(text, [&](std::string_view word) { detail::bpe_encode_word(vocab, tables, word, out); });
}

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_unique<Impl>(std::move(vocab))) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Vocab& vocab = impl_->vocab;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && vocab.add_bos && vocab.bos >= 0) out.push_back(vocab.bos);
  bool after_special = true;
  const auto fragment = [&](std::string_view part) {
    if (part.empty()) return;
    impl_->encode_fragment(part, after_special, out);
    after_special = false;
  };
  size_t start = 0;  // of the text not yet encoded
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = -1;
    const size_t len = impl_->match_special(text, pos, parse_special, &id);
    if (len == 0) {
      ++pos;
      continue;
    }
    fragment(text.substr(start, pos - start));
    out.push_back(id);
    after_special = true;
    pos += len;
    start = pos;
  }
  fragment(text.substr(start));
  if (add_bos && vocab.add_eos && vocab.eos >= 0) out.push_back(vocab.eos);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->pieces.size())
    fail(ErrorCode::kInvalidArgument, "tokenizer: token id ", id, " outside [0, ", impl_->pieces.size(), ")");
  return impl_->pieces[size_t(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) text += token_to_piece(id);
  // The inverse of the dummy prefix that encode() adds.
  if (impl_->vocab.kind == TokenizerKind::kSpm && impl_->vocab.add_space_prefix && text.starts_with(' '))
    text.erase(0, 1);
  return text;
}

int64_t Tokenizer::n_vocab() const { return int64_t(impl_->vocab.tokens.size()); }
const Vocab& Tokenizer::vocab() const { return impl_->vocab; }
int32_t Tokenizer::bos() const { return impl_->vocab.bos; }
int32_t Tokenizer::eos() const { return impl_->vocab.eos; }

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->end_of_generation.size() && impl_->end_of_generation[size_t(id)];
}

}  // namespace longctx::model
