// Byte-level BPE on hand-built vocabularies: the pre-tokenizer splits of
// GPT-2, Llama-3 and Qwen2 derived by hand from their regexes, merges by rank
// derived by hand and checked against a plain O(n^2) reference on random
// merge tables, special tokens, validation, and decode(encode(s)) == s for
// arbitrary bytes.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/tokenizer.h"
#include "model/tokenizer_fixture.h"
#include "test_seed.h"

namespace longctx::model {
namespace {

using Words = std::vector<std::string>;

// GPT-2's bytes_to_unicode(), as its Python source defines it.
const std::vector<std::string>& byte_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<int> cps(256, -1);
    for (int b = '!'; b <= '~'; ++b) cps[size_t(b)] = b;
    for (int b = 0xA1; b <= 0xAC; ++b) cps[size_t(b)] = b;
    for (int b = 0xAE; b <= 0xFF; ++b) cps[size_t(b)] = b;
    int n = 0;
    for (int b = 0; b < 256; ++b)
      if (cps[size_t(b)] < 0) cps[size_t(b)] = 256 + n++;
    std::vector<std::string> out;
    for (const int cp : cps) {
      std::string s;
      if (cp < 0x80) {
        s += char(cp);
      } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
      }
      out.push_back(s);
    }
    return out;
  }();
  return table;
}

std::string mapped(const std::string& raw) {
  std::string s;
  for (const char c : raw) s += byte_chars()[uint8_t(c)];
  return s;
}

// ids 0..255: the byte characters in byte order; then one token per merge
// result (raw text), in merge order; merges are given as raw byte strings.
Vocab bpe_vocab(const std::vector<std::pair<std::string, std::string>>& merges, PreTokenizer pre = PreTokenizer::kGpt2,
                const std::vector<std::string>& extra_tokens = {}) {
  Vocab v;
  v.kind = TokenizerKind::kBpe;
  v.pre = pre;
  v.add_bos = false;
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_chars()[size_t(b)]);
    seen.insert(v.tokens.back());
  }
  for (const auto& [a, b] : merges) {
    v.merges.push_back(mapped(a) + " " + mapped(b));
    if (seen.insert(mapped(a + b)).second) v.tokens.push_back(mapped(a + b));
  }
  for (const std::string& t : extra_tokens)
    if (seen.insert(mapped(t)).second) v.tokens.push_back(mapped(t));
  return v;
}

int32_t id_of(const Vocab& v, const std::string& raw) {
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i] == mapped(raw)) return int32_t(i);
  ADD_FAILURE() << "no token " << raw;
  return -1;
}

TEST(TokenizerBpe, PreTokenizerGpt2) {
  const auto split = [](const std::string& s) { return pre_tokenize(PreTokenizer::kGpt2, s); };
  EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
  // Contractions are case-sensitive: 'T is "'" then "T".
  EXPECT_EQ(split("I'm DON'T"), (Words{"I", "'m", " DON", "'", "T"}));
  EXPECT_EQ(split("1234567 abc"), (Words{"1234567", " abc"}));
  // \s+(?!\S) leaves the last space to the next word.
  EXPECT_EQ(split("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split("x\n\ny"), (Words{"x", "\n", "\n", "y"}));
  EXPECT_EQ(split("x   "), (Words{"x", "   "}));
  EXPECT_EQ(split("hello!world"), (Words{"hello", "!", "world"}));
  EXPECT_EQ(split(""), Words{});
}

TEST(TokenizerBpe, PreTokenizerLlama3AndQwen2) {
  for (const PreTokenizer pre : {PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    const auto split = [pre](const std::string& s) { return pre_tokenize(pre, s); };
    EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
    // Case-insensitive contractions.
    EXPECT_EQ(split("I'm DON'T"), (Words{"I", "'m", " DON", "'T"}));
    EXPECT_EQ(split("a  b"), (Words{"a", " ", " b"}));
    // Newline runs stay together, and punctuation takes the newlines after it.
    EXPECT_EQ(split("x\n\ny"), (Words{"x", "\n\n", "y"}));
    EXPECT_EQ(split("a,\n\nb"), (Words{"a", ",\n\n", "b"}));
    EXPECT_EQ(split("x   "), (Words{"x", "   "}));
    // One non-letter may lead a word.
    EXPECT_EQ(split("hello!world"), (Words{"hello", "!world"}));
    EXPECT_EQ(split("$100"), pre == PreTokenizer::kLlama3 ? (Words{"$", "100"}) : (Words{"$", "1", "0", "0"}));
    // Unicode classes: CJK letters, a no-break space (\s under UCP).
    EXPECT_EQ(split("\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86"), (Words{"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86"}));
    EXPECT_EQ(split("x\xC2\xA0y"), (Words{"x", "\xC2\xA0y"}));
  }
  EXPECT_EQ(pre_tokenize(PreTokenizer::kLlama3, "1234567 abc"), (Words{"123", "456", "7", " abc"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::kQwen2, "1234567 abc"), (Words{"1", "2", "3", "4", "5", "6", "7", " abc"}));
}

// The types that run several regexes in turn, each splitting the pieces of
// the one before, derived by hand from llama.cpp's lists.
TEST(TokenizerBpe, PreTokenizerSequences) {
  // Falcon: punctuation runs, then GPT-2, then runs of three ASCII digits.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kFalcon, "Hello, world!!! 12345"),
            (Words{"Hello", ",", " world", "!!!", " ", "123", "45"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::kGpt2, "Hello, world!!! 12345"),
            (Words{"Hello", ",", " world", "!!!", " 12345"}));
  // Default: punctuation (and $+<=>^~|), GPT-2, digit runs, three digits.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kDefault, "a+b 12345"), (Words{"a", "+", "b", " ", "123", "45"}));
  // StarCoder, Refact, Command-R, ...: each digit alone, then GPT-2.
  for (const PreTokenizer pre : {PreTokenizer::kStarcoder, PreTokenizer::kRefact, PreTokenizer::kCommandR})
    EXPECT_EQ(pre_tokenize(pre, "abc 123"), (Words{"abc", " ", "1", "2", "3"}));
  // DeepSeek LLM: newlines alone; letters of cased scripts with one space
  // before; ASCII punctuation (whose range holds the letters too); CJK runs;
  // digit runs. The spaces before digits are left on their own.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kDeepseekLlm, "Hello, world!\n  12 \xE4\xB8\xAD\xE6\x96\x87"),
            (Words{"Hello", ",", " world", "!", "\n", "  ", "12", " ", "\xE4\xB8\xAD\xE6\x96\x87"}));
  // DeepSeek Coder: one digit at a time.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kDeepseekCoder, "x=42;"), (Words{"x", "=", "4", "2", ";"}));
  // BLOOM: everything up to a space or a listed punctuation mark.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kBloom, "Hello, world... ok?"),
            (Words{"Hello", ",", " world", "...", " ok", "?"}));
  // Tekken: a word breaks before an upper-case letter that follows lower case.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kTekken, "HelloWorld ABC"), (Words{"Hello", "World", " ABC"}));
  // By Unicode case, as tokenizer.json says (llama.cpp's ASCII approximation
  // keeps "s\u00c9" whole): lower-case s, then upper-case \u00c9 starts a word.
  EXPECT_EQ(pre_tokenize(PreTokenizer::kTekken, "s\xC3\x89t\xC3\xA9"), (Words{"s", "\xC3\x89t\xC3\xA9"}));
  // Chameleon: image tokens whole, runs of two spaces, digits and marks alone;
  // a later regex splits what an earlier one matched (a sentinel's digits and
  // marks: special tokens are matched before pre-tokenization anyway).
  EXPECT_EQ(pre_tokenize(PreTokenizer::kChameleon, "IMGIMGABZ  x1!"), (Words{"IMGIMGABZ", "  ", "x", "1", "!"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::kChameleon, "<sentinel:12>"),
            (Words{"<", "sentinel", ":", "1", "2", ">"}));
}

TEST(TokenizerBpe, PreTokenizerNames) {
  for (int i = 0; i < kPreTokenizerCount; ++i) {
    const auto pre = PreTokenizer(i);
    EXPECT_EQ(parse_pre_tokenizer(pre_tokenizer_info(pre).name), pre) << pre_tokenizer_info(pre).name;
  }
  EXPECT_EQ(parse_pre_tokenizer(""), PreTokenizer::kDefault);
  EXPECT_EQ(parse_pre_tokenizer("deepseek-r1-qwen"), PreTokenizer::kQwen2);
  EXPECT_EQ(parse_pre_tokenizer("falcon3"), PreTokenizer::kLlama3);
  EXPECT_EQ(parse_pre_tokenizer("phi-2"), PreTokenizer::kGpt2);
  EXPECT_EQ(pre_tokenizer_names().size(), 42u);  // llama.cpp b4747's list
  try {
    parse_pre_tokenizer("gpt2");
    ADD_FAILURE() << "accepted gpt2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'gpt2'"), std::string::npos) << e.what();
  }
}

TEST(TokenizerBpe, PreTokenizerCoversEveryByte) {
  std::mt19937 rng(test_seed(5));
  for (int type = 0; type < kPreTokenizerCount; ++type) {
    const auto pre = PreTokenizer(type);
    for (int t = 0; t < 200; ++t) {
      std::string s;
      const int len = int(rng() % 40);
      for (int i = 0; i < len; ++i) s += char(rng() % 4 == 0 ? rng() % 256 : " a1\n'.\xC3\xA9"[rng() % 9]);
      std::string joined;
      for (const std::string& w : pre_tokenize(pre, s)) {
        EXPECT_FALSE(w.empty());
        joined += w;
      }
      ASSERT_EQ(joined, s);
    }
  }
}

TEST(TokenizerBpe, HandDerivedMerges) {
  const Vocab v = bpe_vocab({{"h", "e"}, {" ", "t"}, {"t", "he"}, {" t", "he"}, {"a", "a"}});
  const Tokenizer tok(v);
  // "the" -> t|he (rank 0) -> the (rank 2); " the" -> " "|t|he -> " t"|he -> " the".
  EXPECT_EQ(tok.encode("the the", false, false), (std::vector<int32_t>{id_of(v, "the"), id_of(v, " the")}));
  // "thee" -> t|he|e -> the|e.
  EXPECT_EQ(tok.encode("thee", false, false), (std::vector<int32_t>{id_of(v, "the"), 'e'}));
  // Overlapping equal pairs: the leftmost merges first.
  EXPECT_EQ(tok.encode("aaa", false, false), (std::vector<int32_t>{id_of(v, "aa"), 'a'}));
  // Bytes map through the table: a space is the token of U+0120.
  EXPECT_EQ(v.tokens[' '], "\xC4\xA0");
  EXPECT_EQ(tok.encode(" ", false, false), std::vector<int32_t>{' '});
  EXPECT_EQ(tok.token_to_piece(id_of(v, " the")), " the");
  EXPECT_EQ(tok.token_to_piece(0xFF), "\xFF");
  EXPECT_EQ(tok.decode(tok.encode("the the", false, false)), "the the");
}

// Llama-3 takes a word whole when it is a token, whatever the merges say.
TEST(TokenizerBpe, IgnoreMergesForLlama3) {
  for (const PreTokenizer pre : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
    const Vocab v = bpe_vocab({{"a", "b"}}, pre, {"abc"});
    const std::vector<int32_t> ids = Tokenizer(v).encode("abc", false, false);
    if (pre == PreTokenizer::kLlama3)
      EXPECT_EQ(ids, std::vector<int32_t>{id_of(v, "abc")});
    else
      EXPECT_EQ(ids, (std::vector<int32_t>{id_of(v, "ab"), 'c'}));
  }
}

// Plain BPE: merge the adjacent pair with the lowest rank, the leftmost on
// ties, until no pair has a merge. Words come from pre_tokenize (tested above).
std::vector<int32_t> bpe_reference(const Vocab& v, const std::string& text) {
  std::map<std::string, int32_t> rank, id;
  for (size_t r = 0; r < v.merges.size(); ++r) rank.emplace(v.merges[r], int32_t(r));
  for (size_t i = 0; i < v.tokens.size(); ++i) id.emplace(v.tokens[i], int32_t(i));
  std::vector<int32_t> out;
  for (const std::string& word : pre_tokenize(v.pre, text)) {
    if (v.pre == PreTokenizer::kLlama3 && id.count(mapped(word))) {
      out.push_back(id[mapped(word)]);
      continue;
    }
    std::vector<std::string> sym;
    for (const char c : word) sym.push_back(byte_chars()[uint8_t(c)]);
    for (;;) {
      int best = -1, best_rank = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = rank.find(sym[i] + " " + sym[i + 1]);
        if (it != rank.end() && (best < 0 || it->second < best_rank)) {
          best = int(i);
          best_rank = it->second;
        }
      }
      if (best < 0) break;
      sym[size_t(best)] += sym[size_t(best) + 1];
      sym.erase(sym.begin() + best + 1);
    }
    for (const std::string& s : sym) out.push_back(id.at(s));
  }
  return out;
}

TEST(TokenizerBpe, MatchesReferenceOnRandomMerges) {
  std::mt19937 rng(test_seed(77));
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "\n", "1", "'", "\xC3\xA9"};
  for (int trial = 0; trial < 60; ++trial) {
    // Merges over growing pieces, each joining two pieces that exist already.
    std::vector<std::string> pieces;
    for (const std::string& a : alphabet)
      for (const char c : a) pieces.push_back(std::string(1, c));
    std::vector<std::pair<std::string, std::string>> merges;
    std::set<std::string> merged;
    const int n_merges = 5 + int(rng() % 60);
    for (int i = 0; i < n_merges; ++i) {
      const std::string& a = pieces[rng() % pieces.size()];
      const std::string& b = pieces[rng() % pieces.size()];
      if (a.size() + b.size() > 6 || !merged.insert(a + "|" + b).second) continue;
      merges.push_back({a, b});
      pieces.push_back(a + b);
    }
    const PreTokenizer pre = PreTokenizer(trial % 3);
    const Vocab v = bpe_vocab(merges, pre);
    const Tokenizer tok(v);
    for (int t = 0; t < 40; ++t) {
      std::string text;
      const int len = t % 10 == 0 ? 300 : int(rng() % 30);
      for (int k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
      const std::vector<int32_t> ids = tok.encode(text, false, false);
      ASSERT_EQ(ids, bpe_reference(v, text)) << "trial " << trial << " text '" << text << "'";
      ASSERT_EQ(tok.decode(ids), text);
    }
  }
}

TEST(TokenizerBpe, RoundTripArbitraryBytes) {
  std::mt19937 rng(test_seed(3));
  std::vector<Tokenizer> toks;
  toks.emplace_back(bpe_vocab({{"a", "b"}, {" ", "a"}}, PreTokenizer::kGpt2));
  toks.emplace_back(testing::load_tokenizer_fixture("tokenizer_llama3_bpe.txt").vocab);
  toks.emplace_back(testing::load_tokenizer_fixture("tokenizer_qwen25_bpe.txt").vocab);
  for (const Tokenizer& tok : toks) {
    for (int t = 0; t < 300; ++t) {
      std::string s;
      const int len = int(rng() % 50);
      for (int i = 0; i < len; ++i) s += char(rng() % 3 == 0 ? rng() % 256 : "ab 1\n\xE4\xB8\xAD"[rng() % 8]);
      ASSERT_EQ(tok.decode(tok.encode(s, true, false)), s) << "case " << t;
    }
    std::string big;
    for (int i = 0; i < 200000; ++i) big += "ab 12\n\xC3\xA9."[rng() % 9];
    EXPECT_EQ(tok.decode(tok.encode(big, false, false)), big);
  }
}

TEST(TokenizerBpe, SpecialTokens) {
  Vocab v = bpe_vocab({{"h", "i"}});
  v.tokens.push_back("<|im_start|>");
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types.back() = TokenType::kControl;
  v.tokens.push_back("<tool_call>");
  v.types.push_back(TokenType::kUserDefined);
  v.bos = int32_t(v.tokens.size()) - 2;
  v.add_bos = true;
  const int32_t start = v.bos, call = v.bos + 1, hi = id_of(v, "hi");
  const Tokenizer tok(v);
  EXPECT_EQ(tok.encode("<|im_start|>hi", false, true), (std::vector<int32_t>{start, hi}));
  std::vector<int32_t> plain = {'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|', '>', hi};
  EXPECT_EQ(tok.encode("<|im_start|>hi", false, false), plain);
  plain.insert(plain.begin(), start);
  EXPECT_EQ(tok.encode("<|im_start|>hi", true, false), plain);
  // User-defined tokens are matched either way, and print as they are.
  EXPECT_EQ(tok.encode("hi<tool_call>hi", false, false), (std::vector<int32_t>{hi, call, hi}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{start, hi, call}), "hi<tool_call>");
}

TEST(TokenizerBpe, MissingByteToken) {
  Vocab v = bpe_vocab({});
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types[1] = TokenType::kUnused;  // no token for byte 0x01
  v.tokens.push_back("<unk>");
  v.types.push_back(TokenType::kUnknown);
  EXPECT_THROW(Tokenizer(v).encode("a\x01", false, false), Error);
  v.unk = int32_t(v.tokens.size()) - 1;
  EXPECT_EQ(Tokenizer(v).encode("a\x01", false, false), (std::vector<int32_t>{'a', v.unk}));
}

TEST(TokenizerBpe, RejectsBadMerges) {
  const auto expect_corrupt = [](std::vector<std::string> merges, const std::string& what) {
    Vocab v = bpe_vocab({{"a", "b"}});
    v.merges = std::move(merges);
    try {
      const Tokenizer tok(v);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_corrupt({"a b", "ab"}, "tokenizer.ggml.merges[1] 'ab' is not two tokens");
  expect_corrupt({"a "}, "tokenizer.ggml.merges[0]");
  expect_corrupt({""}, "tokenizer.ggml.merges[0]");
  expect_corrupt({"a b", "a zz"}, "names 'zz'");
  expect_corrupt({"a c"}, "names 'ac'");  // the result is no token
  // A left side that is the space character itself (not mapped) still parses.
  Vocab v = bpe_vocab({});
  v.tokens.push_back(" ");
  v.tokens.push_back(" a");
  v.merges = {"  a"};
  EXPECT_NO_THROW(Tokenizer{v});
}

TEST(TokenizerBpe, ConcurrentEncode) {
  const Tokenizer tok(testing::load_tokenizer_fixture("tokenizer_llama3_bpe.txt").vocab);
  const std::string text = "Hello world, 1234567 it's\n\n  done \xF0\x9F\x98\x80";
  const std::vector<int32_t> expected = tok.encode(text, true, true);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (size_t t = 0; t < ok.size(); ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) ok[t] += tok.encode(text, true, true) == expected;
    });
  for (std::thread& th : threads) th.join();
  for (const int n : ok) EXPECT_EQ(n, 200);
}

}  // namespace
}  // namespace longctx::model
