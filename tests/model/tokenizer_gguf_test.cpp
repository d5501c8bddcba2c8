// vocab_from_gguf: the real vocabularies of the fixtures written as GGUF
// metadata (GgufWriter) read back field for field and tokenizing the corpus
// as before; defaults of absent keys; and every kind of bad metadata rejected
// with the file and key named.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "error_message.h"
#include "longctx/core/error.h"
#include "longctx/model/gguf.h"
#include "longctx/model/gguf_writer.h"
#include "longctx/model/tokenizer.h"
#include "model/tokenizer_fixture.h"

namespace longctx::model {
namespace {

using Edit = std::function<void(GgufWriter&)>;

// The GGUF metadata of `v`, less the keys in `skip`, plus what `edit` sets.
std::vector<uint8_t> gguf_of(const Vocab& v, const std::set<std::string>& skip = {}, const Edit& edit = {}) {
  GgufWriter w;
  const auto want = [&](const char* key) { return skip.count(key) == 0; };
  if (want("tokenizer.ggml.model"))
    w.set_string("tokenizer.ggml.model", v.kind == TokenizerKind::kSpm ? "llama" : "gpt2");
  if (v.kind == TokenizerKind::kBpe && want("tokenizer.ggml.pre"))
    w.set_string("tokenizer.ggml.pre", pre_tokenizer_info(v.pre).name);
  if (want("tokenizer.ggml.tokens")) w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty() && want("tokenizer.ggml.scores")) w.set_f32_array("tokenizer.ggml.scores", v.scores);
  if (!v.types.empty() && want("tokenizer.ggml.token_type")) {
    std::vector<int32_t> types;
    for (const TokenType t : v.types) types.push_back(int32_t(t));
    w.set_i32_array("tokenizer.ggml.token_type", types);
  }
  if (!v.merges.empty() && want("tokenizer.ggml.merges")) w.set_string_array("tokenizer.ggml.merges", v.merges);
  const std::pair<const char*, int32_t> ids[] = {{"tokenizer.ggml.bos_token_id", v.bos},
                                                 {"tokenizer.ggml.eos_token_id", v.eos},
                                                 {"tokenizer.ggml.eot_token_id", v.eot},
                                                 {"tokenizer.ggml.unknown_token_id", v.unk},
                                                 {"tokenizer.ggml.padding_token_id", v.pad}};
  for (const auto& [key, id] : ids)
    if (id >= 0 && want(key)) w.set_u32(key, uint32_t(id));
  if (want("tokenizer.ggml.add_bos_token")) w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  if (want("tokenizer.ggml.add_eos_token")) w.set_bool("tokenizer.ggml.add_eos_token", v.add_eos);
  if (want("tokenizer.ggml.add_space_prefix")) w.set_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  if (!v.chat_template.empty() && want("tokenizer.chat_template"))
    w.set_string("tokenizer.chat_template", v.chat_template);
  if (edit) edit(w);
  return w.to_bytes();
}

Vocab read_back(const std::vector<uint8_t>& bytes) {
  const GgufFile file = GgufFile::from_bytes(bytes, "vocab.gguf");
  return vocab_from_gguf(file);
}

class VocabFromGguf : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabFromGguf, RoundTripsRealVocabularies) {
  const testing::TokenizerFixture f = testing::load_tokenizer_fixture(GetParam());
  Vocab written = f.vocab;
  written.chat_template = "{{ bos_token }}{% for m in messages %}<|im_start|>{% endfor %}";
  const Vocab v = read_back(gguf_of(written));
  EXPECT_EQ(v.kind, written.kind);
  EXPECT_EQ(v.pre, written.pre);
  EXPECT_EQ(v.tokens, written.tokens);
  EXPECT_EQ(v.scores, written.scores);
  EXPECT_EQ(v.types, written.types);
  EXPECT_EQ(v.merges, written.merges);
  EXPECT_EQ(v.bos, written.bos);
  EXPECT_EQ(v.eos, written.eos);
  EXPECT_EQ(v.eot, written.eot);
  EXPECT_EQ(v.unk, written.unk);
  EXPECT_EQ(v.pad, written.pad);
  EXPECT_EQ(v.add_bos, written.add_bos);
  EXPECT_EQ(v.add_eos, written.add_eos);
  EXPECT_EQ(v.add_space_prefix, written.add_space_prefix);
  EXPECT_EQ(v.chat_template, written.chat_template);
  const Tokenizer tok(v);
  for (const testing::TokenizerCase& c : f.cases) EXPECT_EQ(tok.encode(c.text, false, true), c.ids) << c.text;
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, VocabFromGguf,
                         ::testing::Values("tokenizer_mistral_spm.txt", "tokenizer_internlm2_spm.txt",
                                           "tokenizer_llama3_bpe.txt", "tokenizer_qwen25_bpe.txt"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           const std::string file = param.param;
                           return file.substr(10, file.size() - 14);
                         });

// A small vocabulary of each kind: SPM with byte tokens, BPE with one merge.
Vocab small_spm() {
  Vocab v;
  v.kind = TokenizerKind::kSpm;
  v.tokens = {"<unk>", "<s>", "</s>", "<0x41>", "\xE2\x96\x81", "a", "\xE2\x96\x81" "a"};
  v.scores = {0, 0, 0, 0, -1, -2, -3};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl, TokenType::kByte,
             TokenType::kNormal,  TokenType::kNormal,  TokenType::kNormal};
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  return v;
}

Vocab small_bpe() {
  Vocab v;
  v.kind = TokenizerKind::kBpe;
  v.pre = PreTokenizer::kQwen2;
  v.tokens = {"a", "b", "ab", "<|endoftext|>"};
  v.types = {TokenType::kNormal, TokenType::kNormal, TokenType::kNormal, TokenType::kControl};
  v.merges = {"a b"};
  v.eos = 3;
  v.add_bos = false;
  return v;
}

TEST(VocabFromGguf, Defaults) {
  // Only the model and the tokens: no scores, types, merges or special ids.
  const std::set<std::string> all = {"tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                                     "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                     "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
                                     "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
                                     "tokenizer.ggml.merges", "tokenizer.ggml.pre"};
  const Vocab spm = read_back(gguf_of(small_spm(), all));
  EXPECT_EQ(spm.kind, TokenizerKind::kSpm);
  EXPECT_TRUE(spm.scores.empty());
  EXPECT_TRUE(spm.types.empty());
  EXPECT_EQ(spm.bos, -1);
  EXPECT_EQ(spm.eos, -1);
  EXPECT_EQ(spm.unk, -1);
  EXPECT_TRUE(spm.add_bos);
  EXPECT_FALSE(spm.add_eos);
  EXPECT_TRUE(spm.add_space_prefix);
  EXPECT_TRUE(spm.chat_template.empty());

  Vocab bpe_in = small_bpe();
  bpe_in.merges.clear();
  const Vocab bpe = read_back(gguf_of(bpe_in, all));
  EXPECT_EQ(bpe.kind, TokenizerKind::kBpe);
  EXPECT_EQ(bpe.pre, PreTokenizer::kDefault);  // absent: llama.cpp's "default"
  EXPECT_FALSE(bpe.add_bos);
  EXPECT_FALSE(bpe.add_space_prefix);
  // Llama-3, Tekken and Chameleon add BOS unless the file says otherwise; every
  // name llama.cpp b4747 knows reads back as its type.
  for (const auto& [name, pre] : pre_tokenizer_names()) {
    const Edit set_pre = [name = std::string(name)](GgufWriter& w) { w.set_string("tokenizer.ggml.pre", name); };
    const Vocab v = read_back(gguf_of(bpe_in, all, set_pre));
    EXPECT_EQ(v.pre, pre) << name;
    EXPECT_EQ(v.add_bos, pre == PreTokenizer::kLlama3 || pre == PreTokenizer::kTekken ||
                             pre == PreTokenizer::kChameleon)
        << name;
  }
  // Token type 0 ("undefined" in converters) reads as normal.
  const Vocab zero = read_back(gguf_of(small_bpe(), {"tokenizer.ggml.token_type"}, [](GgufWriter& w) {
    w.set_i32_array("tokenizer.ggml.token_type", {0, 0, 1, 3});
  }));
  EXPECT_EQ(zero.types, (std::vector<TokenType>{TokenType::kNormal, TokenType::kNormal, TokenType::kNormal,
                                                TokenType::kControl}));
}

void expect_rejected(const std::vector<uint8_t>& bytes, ErrorCode code, const std::vector<std::string>& parts) {
  expect_error([&] { read_back(bytes); }, code, parts);
}

TEST(VocabFromGguf, RejectsBadMetadata) {
  const Vocab spm = small_spm(), bpe = small_bpe();
  const auto set_u32 = [](const char* key, uint32_t value) { return [=](GgufWriter& w) { w.set_u32(key, value); }; };
  const ErrorCode corrupt = ErrorCode::kCorrupt;

  expect_rejected(gguf_of(spm, {"tokenizer.ggml.model"}), corrupt, {"vocab.gguf", "tokenizer.ggml.model"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.model"},
                          [](GgufWriter& w) { w.set_string("tokenizer.ggml.model", "bert"); }),
                  ErrorCode::kUnsupported, {"vocab.gguf", "tokenizer.ggml.model", "bert"});
  // llama.cpp never writes "gpt2" (GPT-2 is "gpt-2") and refuses it, as any name it does not know.
  for (const char* name : {"gpt2", "llama4-bpe", "Qwen2"})
    expect_rejected(gguf_of(bpe, {"tokenizer.ggml.pre"},
                            [name](GgufWriter& w) { w.set_string("tokenizer.ggml.pre", name); }),
                    ErrorCode::kUnsupported, {"vocab.gguf", "tokenizer.ggml.pre", std::string("'") + name + "'"});
  // An SPM vocabulary's pre-tokenizer is not read (llama.cpp ignores it too).
  EXPECT_NO_THROW(read_back(gguf_of(spm, {}, [](GgufWriter& w) { w.set_string("tokenizer.ggml.pre", "whatever"); })));
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.model"}, set_u32("tokenizer.ggml.model", 1)), corrupt,
                  {"tokenizer.ggml.model"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.tokens"}), corrupt, {"tokenizer.ggml.tokens"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.tokens"},
                          [](GgufWriter& w) { w.set_i32_array("tokenizer.ggml.tokens", {1, 2, 3, 4, 5, 6, 7}); }),
                  corrupt, {"tokenizer.ggml.tokens"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                "tokenizer.ggml.unknown_token_id"},
                          [](GgufWriter& w) { w.set_string_array("tokenizer.ggml.tokens", {}); }),
                  corrupt, {"vocab.gguf", "tokenizer.ggml.tokens is empty"});

  // Arrays of other lengths than the tokens.
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.scores"},
                          [](GgufWriter& w) { w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0}); }),
                  corrupt, {"vocab.gguf", "tokenizer.ggml.scores", "3"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.token_type"},
                          [](GgufWriter& w) { w.set_i32_array("tokenizer.ggml.token_type", std::vector(8, 1)); }),
                  corrupt, {"tokenizer.ggml.token_type", "8"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.scores"},
                          [](GgufWriter& w) { w.set_i32_array("tokenizer.ggml.scores", {0, 0, 0, 0, 0, 0, 0}); }),
                  corrupt, {"tokenizer.ggml.scores"});
  // A token type outside 0..6; a byte token that is not <0xXX>.
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.token_type"},
                          [](GgufWriter& w) { w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 6, 1, 1, 9}); }),
                  corrupt, {"tokenizer.ggml.token_type[6]", "9"});
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.token_type"},
                          [](GgufWriter& w) { w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 6, 1, 6, 1}); }),
                  corrupt, {"vocab.gguf", "tokenizer.ggml.tokens[5]"});

  // Special ids outside the vocabulary, whatever their integer type.
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}) {
    expect_rejected(gguf_of(spm, {key}, set_u32(key, 7)), corrupt, {"vocab.gguf", key, "7"});
    expect_rejected(gguf_of(spm, {key}, set_u32(key, 0xFFFFFFFFu)), corrupt, {key});
    expect_rejected(gguf_of(spm, {key}, [key](GgufWriter& w) { w.set_i32(key, -1); }), corrupt, {key});
    expect_rejected(gguf_of(spm, {key}, [key](GgufWriter& w) { w.set_u64(key, uint64_t(1) << 40); }), corrupt, {key});
    expect_rejected(gguf_of(spm, {key}, [key](GgufWriter& w) { w.set_string(key, "1"); }), corrupt, {key});
  }
  EXPECT_NO_THROW(read_back(gguf_of(spm, {"tokenizer.ggml.bos_token_id"}, set_u32("tokenizer.ggml.bos_token_id", 6))));

  // Merges: unknown tokens, no separator, a result that is no token, wrong type.
  for (const auto& [merge, part] : std::vector<std::pair<std::string, std::string>>{
           {"a c", "'c'"}, {"ab", "not two tokens"}, {"b a", "'ba'"}, {"a  b", "' b'"}}) {
    expect_rejected(gguf_of(bpe, {"tokenizer.ggml.merges"},
                            [&merge](GgufWriter& w) { w.set_string_array("tokenizer.ggml.merges", {"a b", merge}); }),
                    corrupt, {"vocab.gguf", "tokenizer.ggml.merges[1]", part});
  }
  expect_rejected(gguf_of(bpe, {"tokenizer.ggml.merges"},
                          [](GgufWriter& w) { w.set_i32_array("tokenizer.ggml.merges", {1}); }),
                  corrupt, {"tokenizer.ggml.merges"});
  // Flags and the template of the wrong type.
  expect_rejected(gguf_of(spm, {"tokenizer.ggml.add_bos_token"}, set_u32("tokenizer.ggml.add_bos_token", 1)), corrupt,
                  {"tokenizer.ggml.add_bos_token"});
  expect_rejected(gguf_of(spm, {}, [](GgufWriter& w) { w.set_u32("tokenizer.chat_template", 1); }), corrupt,
                  {"tokenizer.chat_template"});
}

}  // namespace
}  // namespace longctx::model
