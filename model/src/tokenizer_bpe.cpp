// Byte-level BPE (tokenizer.ggml.model = gpt2): the pre-tokenizer
// (pre_tokenizer.cpp) splits a fragment into words; each word's bytes become
// the GPT-2 byte-to-unicode characters' tokens, and the adjacent pair with the
// lowest merge rank is merged, again and again (ties: the leftmost pair).
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/error.h"
#include "merge_queue.h"
#include "tokenizer_internal.h"

namespace longctx::model {
namespace detail {
namespace {

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {  // the table stays below U+0800
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

struct Symbol {
  int32_t id = -1;  // -1: a byte with no token
  int prev = -1, next = -1;
  bool alive = true;
};

struct Candidate {
  int left = 0, right = 0;
  int32_t left_id = 0, right_id = 0;  // what the pair held when it was queued
  int32_t result = 0;
};

struct LowerRank {
  bool operator()(int32_t a, int32_t b) const { return a < b; }
};

}  // namespace

const ByteUnicode& byte_unicode() {
  static const ByteUnicode table = [] {
    ByteUnicode t;
    t.cp_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
      t.byte_to_utf8[size_t(b)] = utf8_of(cp);
      t.cp_to_byte[cp] = int16_t(b);
    }
    return t;
  }();
  return table;
}

void bpe_encode_word(const Vocab& vocab, const Tables& tables, std::string_view word, std::vector<int32_t>& out) {
  if (word.empty()) return;
  if (tables.ignore_merges) {
    std::string mapped;
    for (const char c : word) mapped += byte_unicode().byte_to_utf8[uint8_t(c)];
    const auto it = tables.text_to_id.find(std::string_view(mapped));
    if (it != tables.text_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    symbols[i].id = tables.byte_token[uint8_t(word[i])];
    symbols[i].prev = int(i) - 1;
    symbols[i].next = i + 1 < word.size() ? int(i) + 1 : -1;
  }
  MergeQueue<int32_t, LowerRank, Candidate> queue;  // lowest rank first, then the leftmost pair
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const int32_t a = symbols[size_t(left)].id, b = symbols[size_t(right)].id;
    if (a < 0 || b < 0) return;
    const auto it = tables.merges.find(pair_key(a, b));
    if (it == tables.merges.end()) return;
    queue.push(it->second.rank, {left, right, a, b, it->second.result});
  };
  for (int i = 1; i < int(symbols.size()); ++i) try_add(i - 1, i);

  for (Candidate c; queue.pop(c);) {
    Symbol& left = symbols[size_t(c.left)];
    Symbol& right = symbols[size_t(c.right)];
    // Stale: a side was merged since. A symbol's start never moves, so the same
    // ids on the same neighbours mean the same pair.
    if (!left.alive || !right.alive || left.next != c.right || left.id != c.left_id || right.id != c.right_id) continue;
    left.id = c.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = c.left;
    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }
  for (int i = 0; i >= 0; i = symbols[size_t(i)].next) {
    const int32_t id = symbols[size_t(i)].id;
    out.push_back(id >= 0 ? id : byte_fallback(vocab, tables, uint8_t(word[size_t(i)])));
  }
}

}  // namespace detail

}  // namespace longctx::model
