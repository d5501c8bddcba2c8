// Shared pieces of the tokenizer sources (tokenizer.cpp, tokenizer_spm.cpp,
// tokenizer_bpe.cpp, pre_tokenizer.cpp): the lookup tables built from a Vocab and the two merge
// algorithms. Not a public header.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "longctx/model/tokenizer.h"

namespace longctx::model::detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
// Keys are views into Vocab::tokens (owned by the same Impl, never resized).
using TokenMap = std::unordered_map<std::string_view, int32_t, StringHash, std::equal_to<>>;

// Length of the UTF-8 sequence a byte starts, from its high bits: 1 for ASCII
// and for stray continuation bytes, so that any byte string splits.
inline size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Bytes of the character at s[i]: utf8_len of its lead byte when that many
// continuation bytes follow, else 1 (an invalid byte never swallows the
// start of the next character).
inline size_t utf8_char_len(std::string_view s, size_t i) {
  const size_t n = utf8_len(uint8_t(s[i]));
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

// GPT-2's byte-to-unicode table: printable bytes map to themselves, the 68
// others to U+0100.. in byte order, so that every byte is a visible character.
struct ByteUnicode {
  std::array<std::string, 256> byte_to_utf8;  // the character of each byte, UTF-8 encoded
  std::array<int16_t, 324> cp_to_byte;        // inverse over U+0000..U+0143, -1 elsewhere
};
const ByteUnicode& byte_unicode();

// One BPE merge, keyed by the (left id, right id) pair.
struct Merge {
  int32_t rank = 0;
  int32_t result = 0;
};
inline uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// The compiled regexes of a pre-tokenizer type (PCRE2; pre_tokenizer.cpp).
// Thread-safe: matching allocates its own match data.
class PreTokenizerRegex {
 public:
  explicit PreTokenizerRegex(PreTokenizer pre);
  ~PreTokenizerRegex();
  PreTokenizerRegex(const PreTokenizerRegex&) = delete;
  PreTokenizerRegex& operator=(const PreTokenizerRegex&) = delete;
  // Splits `text` into consecutive pieces that cover it exactly: the first
  // regex splits the text into its matches and the text between them, each
  // next regex splits those pieces again; text no match covers (invalid
  // UTF-8, say) stays a piece of its own.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

 private:
  struct Code;
  std::vector<std::unique_ptr<Code>> codes_;  // at least one
};

// Lookup tables of a validated vocabulary.
struct Tables {
  // Tokens that ordinary text may become (normal and user-defined): control,
  // unknown, byte and unused tokens are reachable only through their ids.
  TokenMap text_to_id;
  // SPM: the <0xXX> byte tokens; BPE: the token of each byte's character.
  std::array<int32_t, 256> byte_token{};
  std::unordered_map<uint64_t, Merge> merges;  // BPE
  bool ignore_merges = false;                   // BPE: a word that is a token is not split (Llama-3, Tekken)
};

// Appends the ids of one SPM text fragment (already space-replaced) to `out`.
void spm_encode(const Vocab& vocab, const Tables& tables, std::string_view text, std::vector<int32_t>& out);
// Appends the ids of one BPE pre-token (raw bytes) to `out`.
void bpe_encode_word(const Vocab& vocab, const Tables& tables, std::string_view word, std::vector<int32_t>& out);
// The id for a byte that no token covers: unk, or Error(kInvalidArgument).
int32_t byte_fallback(const Vocab& vocab, const Tables& tables, uint8_t byte);

}  // namespace longctx::model::detail
