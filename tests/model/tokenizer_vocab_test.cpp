// Conformance with data no one here wrote: llama.cpp b4747's tokenizer test
// files (LONGCTX_VOCAB_DIR, by default ../shared/vocab beside the checkout).
// ggml-vocab-NAME.gguf holds only the tokenizer.* keys of a model family;
// NAME.gguf.inp its test inputs, separated by "\n__ggml_vocab_test__\n";
// NAME.gguf.out the ids the family's Hugging Face tokenizer gives each input,
// one line per input. Tokenized as llama.cpp's test-tokenizer-0 does: no BOS,
// no parsing of special-token text. Every case of every file must pass.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "longctx/model/tokenizer.h"

namespace longctx::model {
namespace {

namespace fs = std::filesystem;

// The families of llama.cpp b4747's models/ that the vocab directory holds.
// The last four come with inputs and ids but without their vocabulary: they
// are skipped by name while their .gguf is missing, and run once it is there.
constexpr const char* kFamilies[] = {"deepseek-llm", "falcon",    "gpt-2", "llama-spm",        "mpt",      "phi-3",
                                     "refact",       "llama-bpe", "qwen2", "deepseek-r1-qwen", "command-r"};
const std::set<std::string> kWithoutVocab = {"llama-bpe", "qwen2", "deepseek-r1-qwen", "command-r"};

fs::path vocab_dir() {
  if (const char* env = std::getenv("LONGCTX_VOCAB_DIR"); env != nullptr && *env != '\0') return env;
  return LONGCTX_VOCAB_DIR;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The inputs of a .inp file: the text between separators, the newline before
// each separator not included (llama.cpp's test splits on "\n" + separator + "\n").
std::vector<std::string> read_inputs(const fs::path& path) {
  const std::string text = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < text.size();) {
    const size_t next = text.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(text.substr(pos));
      break;
    }
    inputs.push_back(text.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return inputs;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& path) {
  std::istringstream in(read_file(path));
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<int32_t>& ids = out.emplace_back();
    for (int64_t id; words >> id;) ids.push_back(int32_t(id));
  }
  return out;
}

// Bytes outside printable ASCII as \xHH, for failure messages.
std::string escaped(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto b = uint8_t(c);
    if (b >= 0x20 && b < 0x7F && b != '\\') {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", b);
      out += hex;
    }
  }
  return out;
}

std::string joined(const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class TokenizerVocab : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!fs::is_directory(vocab_dir()))
      GTEST_SKIP() << "no vocab directory " << vocab_dir() << " (set LONGCTX_VOCAB_DIR)";
  }
};

TEST_P(TokenizerVocab, MatchesLlamaCppTestIds) {
  const std::string family = GetParam();
  const fs::path base = vocab_dir() / ("ggml-vocab-" + family + ".gguf");
  const fs::path inp = base.string() + ".inp", out = base.string() + ".out";
  ASSERT_TRUE(fs::exists(inp) && fs::exists(out)) << "missing " << inp << " or " << out;
  if (!fs::exists(base)) {
    if (kWithoutVocab.count(family) != 0)
      GTEST_SKIP() << family << ": llama.cpp's ids without the vocabulary (" << base << " is not in the directory)";
    FAIL() << "missing " << base;
  }
  const std::vector<std::string> inputs = read_inputs(inp);
  const std::vector<std::vector<int32_t>> expected = read_ids(out);
  ASSERT_EQ(inputs.size(), expected.size()) << inp << " and " << out << " hold different numbers of cases";
  ASSERT_GE(inputs.size(), 30u) << inp;

  const Tokenizer tok = open_tokenizer(base.string());
  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(inputs[i], /*add_bos=*/false, /*parse_special=*/false);
    if (ids == expected[i]) {
      ++passed;
      continue;
    }
    ADD_FAILURE() << family << " case " << i << " '" << escaped(inputs[i]) << "'\n  expected " << joined(expected[i])
                  << "\n  got      " << joined(ids);
  }
  std::printf("[ vocab    ] %s: %zu of %zu cases\n", family.c_str(), passed, inputs.size());
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerVocab, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           std::string name = param.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// A file of the directory that no family above runs would go unchecked.
TEST(TokenizerVocabFiles, EveryFileHasAFamily) {
  if (!fs::is_directory(vocab_dir())) GTEST_SKIP() << "no vocab directory " << vocab_dir();
  const std::set<std::string> known(std::begin(kFamilies), std::end(kFamilies));
  size_t seen = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(vocab_dir())) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("ggml-vocab-")) continue;
    const size_t end = name.find(".gguf");
    ASSERT_NE(end, std::string::npos) << name;
    EXPECT_TRUE(known.count(name.substr(11, end - 11))) << name << " belongs to no family of kFamilies";
    ++seen;
  }
  EXPECT_GT(seen, 0u) << "no ggml-vocab-* file in " << vocab_dir();
}

}  // namespace
}  // namespace longctx::model
