// SentencePiece-style tokenizer on hand-built vocabularies: cases derived by
// hand, a plain O(n^2) reference of the merge rule on random vocabularies and
// texts, byte fallback, special tokens, validation, and decode(encode(s)) == s
// on random UTF-8 (and invalid) strings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/tokenizer.h"
#include "model/tokenizer_fixture.h"
#include "test_seed.h"

namespace longctx::model {
namespace {

const std::string kSp = "\xE2\x96\x81";  // "▁"

// ids: 0 <unk>, 1 <s>, 2 </s>, then 256 byte tokens when `bytes`, then `pieces`.
Vocab spm_vocab(const std::vector<std::pair<std::string, float>>& pieces, bool bytes = true,
                bool space_prefix = false) {
  Vocab v;
  v.kind = TokenizerKind::kSpm;
  const auto add = [&v](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0.f, TokenType::kUnknown);
  add("<s>", 0.f, TokenType::kControl);
  add("</s>", 0.f, TokenType::kControl);
  if (bytes) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      add(name, 0.f, TokenType::kByte);
    }
  }
  for (const auto& [text, score] : pieces) add(text, score, TokenType::kNormal);
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  v.add_space_prefix = space_prefix;
  return v;
}

int32_t id_of(const Vocab& v, const std::string& text) {
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i] == text) return int32_t(i);
  ADD_FAILURE() << "no token " << text;
  return -1;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    for (size_t k = 1; k < n; ++k)
      if (i + k >= s.size() || (uint8_t(s[i + k]) & 0xC0) != 0x80) n = 1;  // invalid: one byte
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The SentencePiece BPE rule, written plainly: merge the adjacent pair whose
// concatenation is a normal token with the highest score, the leftmost on
// ties, until no pair is a token; a leftover character becomes its byte
// tokens (or one <unk> without them).
std::vector<int32_t> spm_reference(const Vocab& v, const std::string& text) {
  std::map<std::string, int32_t> normal;
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.types[i] == TokenType::kNormal) normal.emplace(v.tokens[i], int32_t(i));
  std::string s = v.add_space_prefix && !text.empty() ? kSp : "";
  for (const char c : text) s += c == ' ' ? kSp : std::string(1, c);
  std::vector<std::string> sym = utf8_chars(s);
  for (;;) {
    int best = -1;
    float best_score = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = normal.find(sym[i] + sym[i + 1]);
      if (it != normal.end() && (best < 0 || v.scores[size_t(it->second)] > best_score)) {
        best = int(i);
        best_score = v.scores[size_t(it->second)];
      }
    }
    if (best < 0) break;
    sym[size_t(best)] += sym[size_t(best) + 1];
    sym.erase(sym.begin() + best + 1);
  }
  std::vector<int32_t> ids;
  for (const std::string& p : sym) {
    const auto it = normal.find(p);
    if (it != normal.end()) {
      ids.push_back(it->second);
      continue;
    }
    bool have_bytes = true;
    for (const char c : p) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", uint8_t(c));
      have_bytes = have_bytes && std::find(v.tokens.begin(), v.tokens.end(), name) != v.tokens.end();
    }
    if (!have_bytes) {
      ids.push_back(v.unk);
      continue;
    }
    for (const char c : p) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", uint8_t(c));
      ids.push_back(id_of(v, name));
    }
  }
  return ids;
}

TEST(TokenizerSpm, HandDerivedMerges) {
  const Vocab v = spm_vocab({{kSp, -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -2}, {"bc", -1.5f}, {"abc", -3},
                             {kSp + "a", -5}});
  const Tokenizer tok(v);
  // bc (-1.5) beats ab (-2); then a + bc = abc.
  EXPECT_EQ(tok.encode("abc", false, false), std::vector<int32_t>{id_of(v, "abc")});
  // Equal pairs: the leftmost first, then the second ab.
  EXPECT_EQ(tok.encode("abab", false, false), (std::vector<int32_t>{id_of(v, "ab"), id_of(v, "ab")}));
  EXPECT_EQ(tok.encode("cab", false, false), (std::vector<int32_t>{id_of(v, "c"), id_of(v, "ab")}));
  // Unknown character: its UTF-8 bytes as byte tokens (ids 3 + byte).
  EXPECT_EQ(tok.encode("\xC3\xA9", false, false), (std::vector<int32_t>{3 + 0xC3, 3 + 0xA9}));

  // Same scores for ab and bc: the leftmost pair wins, abc never forms.
  const Vocab tie = spm_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", -2}, {"bc", -2}});
  EXPECT_EQ(Tokenizer(tie).encode("abc", false, false), (std::vector<int32_t>{id_of(tie, "ab"), id_of(tie, "c")}));
}

TEST(TokenizerSpm, SpacePrefixAndSpecialTokens) {
  Vocab v = spm_vocab({{kSp, -1}, {"a", -1}, {"b", -1}, {kSp + "a", -5}, {"<", -1}}, true, /*space_prefix=*/true);
  v.tokens.push_back("<tool>");
  v.scores.push_back(0);
  v.types.push_back(TokenType::kUserDefined);
  const int32_t tool = int32_t(v.tokens.size()) - 1;
  const Tokenizer tok(v);
  const int32_t sp = id_of(v, kSp), sa = id_of(v, kSp + "a"), a = id_of(v, "a"), b = id_of(v, "b");
  // "▁a▁b": ▁a merges, "▁b" is no token.
  EXPECT_EQ(tok.encode("a b", false, false), (std::vector<int32_t>{sa, sp, b}));
  EXPECT_EQ(tok.encode("a b", true, false), (std::vector<int32_t>{1, sa, sp, b}));
  // A space prefix also follows each special token.
  EXPECT_EQ(tok.encode("a<s>b", false, true), (std::vector<int32_t>{sa, 1, sp, b}));
  EXPECT_EQ(tok.encode("<s>a", false, true), (std::vector<int32_t>{1, sa}));
  // Without parse_special "<s>" is text: '<' is a token, 's' and '>' bytes.
  EXPECT_EQ(tok.encode("a<s>b", false, false),
            (std::vector<int32_t>{sa, id_of(v, "<"), 3 + 's', 3 + '>', b}));
  // User-defined tokens are matched whole either way.
  EXPECT_EQ(tok.encode("a<tool>a", false, false), (std::vector<int32_t>{sa, tool, sa}));
  EXPECT_EQ(tok.encode("<tool>", false, true), (std::vector<int32_t>{tool}));
  EXPECT_EQ(tok.encode("", true, true), std::vector<int32_t>{1});
  EXPECT_EQ(tok.encode("", false, true), std::vector<int32_t>{});
  // Decode drops the prefix space once; control tokens print nothing.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, sa, sp, b, 2}), "a b");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{sp, sp, a}), " a");
  EXPECT_EQ(tok.token_to_piece(sa), " a");
  EXPECT_EQ(tok.token_to_piece(3 + 0x41), "A");
  EXPECT_EQ(tok.token_to_piece(1), "");
}

TEST(TokenizerSpm, LongestSpecialWins) {
  Vocab v = spm_vocab({{"x", 0}});
  for (const char* s : {"<x>", "<x>>", "<x"}) {
    v.tokens.push_back(s);
    v.scores.push_back(0);
    v.types.push_back(TokenType::kControl);
  }
  const Tokenizer tok(v);
  const int32_t n = int32_t(v.tokens.size());
  EXPECT_EQ(tok.encode("<x>>x<x>", false, true), (std::vector<int32_t>{n - 2, id_of(v, "x"), n - 3}));
  EXPECT_EQ(tok.encode("<x<x>", false, true), (std::vector<int32_t>{n - 1, n - 3}));
}

TEST(TokenizerSpm, UnknownWithoutByteTokens) {
  Vocab v = spm_vocab({{"a", 0}}, /*bytes=*/false);
  EXPECT_EQ(Tokenizer(v).encode("a\xC3\xA9" "a", false, false), (std::vector<int32_t>{3, 0, 3}));
  v.unk = -1;
  try {
    Tokenizer(v).encode("\xC3\xA9", false, false);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("0xc3"), std::string::npos) << e.what();
  }
}

TEST(TokenizerSpm, AddEosAndFlags) {
  Vocab v = spm_vocab({{"a", 0}});
  v.add_eos = true;
  EXPECT_EQ(Tokenizer(v).encode("a", true, false), (std::vector<int32_t>{1, id_of(v, "a"), 2}));
  EXPECT_EQ(Tokenizer(v).encode("a", false, false), (std::vector<int32_t>{id_of(v, "a")}));
  v.add_bos = false;
  EXPECT_EQ(Tokenizer(v).encode("a", true, false), (std::vector<int32_t>{id_of(v, "a"), 2}));
}

// Random vocabularies over a small alphabet (many score ties) against the
// plain reference.
TEST(TokenizerSpm, MatchesReferenceOnRandomVocabularies) {
  std::mt19937 rng(test_seed(1234));
  const std::vector<std::string> alphabet = {kSp, "a", "b", "c", "\xC3\xA9", "\xF0\x9F\x98\x80"};
  const std::vector<std::string> text_chars = {"a", "b", "c", " ", "\xC3\xA9", "\xF0\x9F\x98\x80", "d", "\xDC", "\x80"};
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<std::pair<std::string, float>> pieces = {{kSp, -1}, {"a", -1}, {"b", -1}};
    std::set<std::string> seen = {kSp, "a", "b"};
    const int n_pieces = 5 + int(rng() % 40);
    for (int i = 0; i < n_pieces; ++i) {
      std::string p;
      const int len = 2 + int(rng() % 3);
      for (int k = 0; k < len; ++k) p += alphabet[rng() % alphabet.size()];
      if (seen.insert(p).second) pieces.push_back({p, -float(rng() % 5)});
    }
    const Vocab v = spm_vocab(pieces, /*bytes=*/trial % 3 != 0, /*space_prefix=*/trial % 2 == 0);
    const Tokenizer tok(v);
    for (int t = 0; t < 40; ++t) {
      std::string text;
      const int len = t % 10 == 0 ? 300 : int(rng() % 30);
      for (int k = 0; k < len; ++k) text += text_chars[rng() % text_chars.size()];
      const std::vector<int32_t> ids = tok.encode(text, false, false);
      ASSERT_EQ(ids, spm_reference(v, text)) << "trial " << trial << " text '" << text << "'";
      if (trial % 3 != 0) {
        ASSERT_EQ(tok.decode(ids), text);
      }
    }
  }
}

// Random code points (1 to 4 UTF-8 bytes) and raw bytes, never U+2581 (which
// SentencePiece reads as a space).
std::string random_text(std::mt19937& rng, int len, bool invalid_bytes) {
  std::string s;
  for (int i = 0; i < len; ++i) {
    const int kind = int(rng() % 6);
    uint32_t cp = 0;
    if (kind == 0 && invalid_bytes) {
      s += char(rng() % 256);
      continue;
    }
    if (kind <= 2) cp = 0x20 + rng() % 0x5F;
    else if (kind == 3) cp = 0x80 + rng() % 0x780;
    else if (kind == 4) cp = 0x800 + rng() % 0xF800;
    else cp = 0x10000 + rng() % 0x100000;
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0x2581) cp = ' ';
    if (rng() % 8 == 0) cp = rng() % 2 ? ' ' : '\n';
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += char(0xE0 | (cp >> 12));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    } else {
      s += char(0xF0 | (cp >> 18));
      s += char(0x80 | ((cp >> 12) & 0x3F));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

TEST(TokenizerSpm, RoundTripRandomText) {
  std::mt19937 rng(test_seed(99));
  const Tokenizer hand(spm_vocab({{kSp, -1}, {"a", -1}, {"e", -1}, {kSp + "a", -2}, {"ae", -3}}, true, true));
  const Tokenizer mistral(testing::load_tokenizer_fixture("tokenizer_mistral_spm.txt").vocab);
  for (const Tokenizer* tok : {&hand, &mistral}) {
    for (int t = 0; t < 300; ++t) {
      const std::string s = random_text(rng, int(rng() % 40), /*invalid_bytes=*/t % 2 == 1);
      const std::vector<int32_t> ids = tok->encode(s, /*add_bos=*/true, /*parse_special=*/false);
      ASSERT_EQ(tok->decode(ids), s) << "case " << t;
    }
  }
  // A long prompt (the merge queue keeps this fast).
  const std::string big = random_text(rng, 100000, false);
  EXPECT_EQ(mistral.decode(mistral.encode(big, false, false)), big);
}

TEST(TokenizerSpm, RejectsBadVocabularies) {
  const auto expect_corrupt = [](const Vocab& v, const std::string& what) {
    try {
      const Tokenizer tok(v);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const Vocab good = spm_vocab({{"a", 0}});
  Vocab v = good;
  v.tokens.clear();
  v.scores.clear();
  v.types.clear();
  expect_corrupt(v, "tokenizer.ggml.tokens is empty");
  v = good;
  v.scores.pop_back();
  expect_corrupt(v, "tokenizer.ggml.scores");
  v = good;
  v.types.push_back(TokenType::kNormal);
  expect_corrupt(v, "tokenizer.ggml.token_type");
  v = good;
  v.types[5] = TokenType(7);
  expect_corrupt(v, "tokenizer.ggml.token_type[5]");
  v = good;  // a repeated text, even of another type (llama.cpp aborts on it): both ids named
  v.tokens.push_back(v.tokens[1]);
  v.scores.push_back(0);
  v.types.push_back(TokenType::kControl);
  expect_corrupt(v, "tokenizer.ggml.tokens: token " + std::to_string(v.tokens.size() - 1) + " '" + v.tokens[1] +
                        "' repeats token 1");
  v = good;
  v.types[5] = TokenType(0);
  expect_corrupt(v, "tokenizer.ggml.token_type[5]");
  v = good;
  v.scores[4] = std::nanf("");
  expect_corrupt(v, "tokenizer.ggml.scores[4]");
  v = good;
  v.bos = int32_t(v.tokens.size());
  expect_corrupt(v, "bos_token_id");
  v = good;
  v.eos = -2;
  expect_corrupt(v, "eos_token_id");
  v = good;
  v.unk = 1 << 30;
  expect_corrupt(v, "unknown_token_id");
  v = good;
  v.eot = int32_t(v.tokens.size());
  expect_corrupt(v, "eot_token_id");
  v = good;
  v.pad = int32_t(v.tokens.size()) + 5;
  expect_corrupt(v, "padding_token_id");
  v = good;
  v.types.back() = TokenType::kByte;  // "a" is not <0xXX>
  expect_corrupt(v, "byte token type");
}

TEST(TokenizerSpm, RejectsBadIds) {
  const Tokenizer tok(spm_vocab({{"a", 0}}));
  for (const int32_t id : {-1, int32_t(tok.n_vocab()), std::numeric_limits<int32_t>::max()}) {
    EXPECT_THROW(tok.token_to_piece(id), Error);
    EXPECT_THROW(tok.decode(std::vector<int32_t>{0, id}), Error);
  }
  try {
    tok.token_to_piece(-5);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(TokenizerSpm, MoveKeepsTables) {
  Tokenizer a(spm_vocab({{"a", 0}, {"aa", -1}}));
  const std::vector<int32_t> before = a.encode("aaa", false, false);
  Tokenizer b(std::move(a));
  EXPECT_EQ(b.encode("aaa", false, false), before);
  Tokenizer c(spm_vocab({{"b", 0}}));
  c = std::move(b);
  EXPECT_EQ(c.encode("aaa", false, false), before);
  EXPECT_EQ(c.n_vocab(), 3 + 256 + 2);
  EXPECT_EQ(c.bos(), 1);
  EXPECT_EQ(c.eos(), 2);
}

}  // namespace
}  // namespace longctx::model
