// Known tokenizations from an independent implementation: the Hugging Face
// tokenizers of Mistral-7B and InternLM2 (SentencePiece), Llama-3 and Qwen2.5
// (byte-level BPE), run by transformers.js over a corpus of tricky strings
// (make_tokenizer_fixtures.js). The vocabularies are the real ones, trimmed
// to what the corpus can reach.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "longctx/model/tokenizer.h"
#include "model/tokenizer_fixture.h"

namespace longctx::model {
namespace {

using testing::load_tokenizer_fixture;

class TokenizerReference : public ::testing::TestWithParam<const char*> {};

void expect_matches(const testing::TokenizerFixture& f) {
  const Tokenizer tok(f.vocab);
  const Vocab& v = tok.vocab();
  const auto is_special = [&](int32_t id) {
    return v.types[size_t(id)] == TokenType::kControl || v.types[size_t(id)] == TokenType::kUnknown;
  };
  for (const testing::TokenizerCase& c : f.cases) {
    SCOPED_TRACE("text: '" + c.text + "'");
    EXPECT_EQ(tok.encode(c.text, /*add_bos=*/false, /*parse_special=*/true), c.ids);

    std::vector<int32_t> with_bos = c.ids;
    if (v.add_bos && v.bos >= 0) with_bos.insert(with_bos.begin(), v.bos);
    EXPECT_EQ(tok.encode(c.text, /*add_bos=*/true, /*parse_special=*/true), with_bos);

    if (std::none_of(c.ids.begin(), c.ids.end(), is_special)) {
      // No control token in the text: parsing specials changes nothing, and
      // the ids decode back to the text.
      EXPECT_EQ(tok.encode(c.text, false, false), c.ids);
      EXPECT_EQ(tok.decode(c.ids), c.text);
    } else {
      // The control tokens' texts stay plain text without parse_special.
      const std::vector<int32_t> plain = tok.encode(c.text, false, false);
      EXPECT_TRUE(std::none_of(plain.begin(), plain.end(), is_special));
      EXPECT_EQ(tok.decode(plain), c.text);
    }
  }
}

TEST_P(TokenizerReference, MatchesTransformersJs) {
  const testing::TokenizerFixture f = load_tokenizer_fixture(GetParam());
  ASSERT_GE(f.cases.size(), 20u);
  expect_matches(f);
}

// The whole vocabularies with 1500 random strings more, which are too large
// for the repository: written by
//   FIXTURE_FULL=1 NODE_PATH=... node tests/model/data/make_tokenizer_fixtures.js DIR
// and checked when LONGCTX_TOKENIZER_FULL_DIR=DIR is set.
TEST_P(TokenizerReference, FullVocabularies) {
  const char* dir = std::getenv("LONGCTX_TOKENIZER_FULL_DIR");
  if (dir == nullptr) GTEST_SKIP() << "LONGCTX_TOKENIZER_FULL_DIR is not set";
  const testing::TokenizerFixture f = testing::load_tokenizer_fixture_file(std::string(dir) + "/" + GetParam());
  ASSERT_GE(f.cases.size(), 800u);
  expect_matches(f);
}

TEST_P(TokenizerReference, EndOfGeneration) {
  const Tokenizer tok(load_tokenizer_fixture(GetParam()).vocab);
  const Vocab& v = tok.vocab();
  EXPECT_TRUE(tok.is_end_of_generation(v.eos));
  if (v.eot >= 0) {
    EXPECT_TRUE(tok.is_end_of_generation(v.eot));
  }
  if (v.bos >= 0) {
    EXPECT_FALSE(tok.is_end_of_generation(v.bos));
  }
  EXPECT_FALSE(tok.is_end_of_generation(-1));
  EXPECT_FALSE(tok.is_end_of_generation(int32_t(tok.n_vocab())));
  for (const char* text : {"Hello", "a"}) {
    for (const int32_t id : tok.encode(text, false, false)) EXPECT_FALSE(tok.is_end_of_generation(id));
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenizerReference,
                         ::testing::Values("tokenizer_mistral_spm.txt", "tokenizer_internlm2_spm.txt",
                                           "tokenizer_llama3_bpe.txt", "tokenizer_qwen25_bpe.txt"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           const std::string file = param.param;
                           return file.substr(10, file.size() - 14);  // tokenizer_X.txt -> X
                         });

// Spot checks that the fixtures hold the real vocabularies (ids anyone can
// look up in the models' tokenizer.json).
TEST(TokenizerReference, RealIds) {
  const Tokenizer llama3(load_tokenizer_fixture("tokenizer_llama3_bpe.txt").vocab);
  EXPECT_EQ(llama3.encode("<|begin_of_text|>", false, true), std::vector<int32_t>{128000});
  EXPECT_EQ(llama3.encode("<|eot_id|>", false, true), std::vector<int32_t>{128009});
  EXPECT_EQ(llama3.encode("Hello world", true, false), (std::vector<int32_t>{128000, 9906, 1917}));
  const Tokenizer qwen(load_tokenizer_fixture("tokenizer_qwen25_bpe.txt").vocab);
  EXPECT_EQ(qwen.encode("<|im_start|>", true, true), std::vector<int32_t>{151644});  // Qwen adds no BOS
  EXPECT_TRUE(qwen.is_end_of_generation(151645));                                   // <|im_end|>
  EXPECT_TRUE(qwen.is_end_of_generation(151643));                                   // <|endoftext|>
  const Tokenizer mistral(load_tokenizer_fixture("tokenizer_mistral_spm.txt").vocab);
  EXPECT_EQ(mistral.encode("", true, true), std::vector<int32_t>{1});
  EXPECT_EQ(mistral.token_to_piece(1), "");                                         // <s> prints nothing
  EXPECT_EQ(mistral.token_to_piece(3 + 0x0A), "\n");                                // <0x0A>
}

}  // namespace
}  // namespace longctx::model
