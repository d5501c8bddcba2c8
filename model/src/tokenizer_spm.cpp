// SentencePiece-style BPE (tokenizer.ggml.model = llama): the fragment is
// split into UTF-8 characters, then the adjacent pair whose concatenation is
// a token with the highest score is merged, again and again (ties: the
// leftmost pair). A symbol no token covers falls back to its bytes' <0xXX>
// tokens, or to one unknown token when the vocabulary lacks byte tokens. The
// candidate pairs wait in a MergeQueue, which keeps long prompts fast.
#include <algorithm>
#include <string_view>
#include <vector>

#include "longctx/core/error.h"
#include "merge_queue.h"
#include "tokenizer_internal.h"

namespace longctx::model::detail {
namespace {

struct Symbol {
  size_t begin = 0;
  size_t len = 0;  // 0: merged into its left neighbour
  int prev = -1, next = -1;
};

struct Bigram {
  int left = 0, right = 0;
  size_t len = 0;  // bytes of the pair when it was queued
};

struct HigherScore {
  bool operator()(float a, float b) const { return a > b; }
};

}  // namespace

int32_t byte_fallback(const Vocab& vocab, const Tables& tables, uint8_t byte) {
  if (tables.byte_token[byte] >= 0) return tables.byte_token[byte];
  if (vocab.unk >= 0) return vocab.unk;
  fail(ErrorCode::kInvalidArgument, "tokenizer: the vocabulary has no token for byte 0x", std::hex, int(byte),
       " and no unknown token");
}

void spm_encode(const Vocab& vocab, const Tables& tables, std::string_view text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char_len(text, i);
    const int index = int(symbols.size());
    symbols.push_back({i, n, index - 1, index + 1});
    i += n;
  }
  symbols.back().next = -1;

  MergeQueue<float, HigherScore, Bigram> queue;  // highest score first, then the leftmost pair
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[size_t(left)];
    const std::string_view pair = text.substr(a.begin, a.len + symbols[size_t(right)].len);
    const auto it = tables.text_to_id.find(pair);
    if (it == tables.text_to_id.end()) return;
    const float score = vocab.scores.empty() ? 0.f : vocab.scores[size_t(it->second)];
    queue.push(score, {left, right, pair.size()});
  };
  for (int i = 1; i < int(symbols.size()); ++i) try_add(i - 1, i);

  for (Bigram bigram; queue.pop(bigram);) {
    Symbol& left = symbols[size_t(bigram.left)];
    Symbol& right = symbols[size_t(bigram.right)];
    // Stale: one side was merged away or grew since the pair was queued. A
    // symbol's start never moves, so equal length means the same text.
    if (left.len == 0 || right.len == 0 || left.next != bigram.right || left.len + right.len != bigram.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  // Symbol 0 is never merged away (it is never a right side).
  for (int i = 0; i >= 0; i = symbols[size_t(i)].next) {
    const std::string_view piece = text.substr(symbols[size_t(i)].begin, symbols[size_t(i)].len);
    const auto it = tables.text_to_id.find(piece);
    if (it != tables.text_to_id.end()) {
      out.push_back(it->second);
      continue;
    }
    // A character no token covers: its <0xXX> byte tokens, or one unk.
    const bool bytes =
        std::all_of(piece.begin(), piece.end(), [&](char c) { return tables.byte_token[uint8_t(c)] >= 0; });
    if (bytes || vocab.unk < 0) {
      for (const char c : piece) out.push_back(byte_fallback(vocab, tables, uint8_t(c)));
    } else {
      out.push_back(vocab.unk);
    }
  }
}

}  // namespace longctx::model::detail
