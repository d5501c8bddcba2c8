// `longctx-info FILE.gguf` end to end: the report of a valid file, and exit
// code 1 with a message (never a signal) for invalid ones; the tokenizer of a
// vocabulary-only file and `--tokenize`. Runs the binary built next to this
// test; skipped when it was not built.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gguf_test_util.h"
#include "longctx/model/gguf_writer.h"
#include "longctx/tools/test_model.h"

namespace longctx::model {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int status = -1;  // raw wait status
  std::string output;  // stdout and stderr
};

class GgufInfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    binary_ = fs::read_symlink("/proc/self/exe").parent_path() / "longctx-info";
    if (!fs::exists(binary_)) GTEST_SKIP() << binary_ << " was not built";
    std::string pattern = (fs::temp_directory_path() / "longctx-info-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return path;
  }

  // `extra`: more arguments, each without a single quote.
  RunResult run(const std::string& path, const std::vector<std::string>& extra = {}) {
    RunResult r;
    std::vector<std::string> args = {binary_.string(), path};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string command;
    for (const std::string& arg : args) {
      command += command.empty() ? "'" : " '";
      command += arg;
      command += '\'';
    }
    command += " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return r;
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.output.append(buffer.data(), n);
    r.status = ::pclose(pipe);
    return r;
  }

  fs::path binary_, dir_;
};

GgufWriter llama_like() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 32);
  w.set_u32("llama.embedding_length", 4096);
  w.set_u32("llama.attention.head_count", 32);
  w.set_u32("llama.attention.head_count_kv", 8);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "c", "d"});
  std::vector<float> v(64 * 2, 0.25f);
  w.add_tensor_f32("token_embd.weight", {64, 2}, GgmlType::kQ8_0, v);
  w.add_tensor_f32("output_norm.weight", {64}, GgmlType::kF32, std::span(v).first(64));
  return w;
}

// llama_like() is a valid GGUF whose model the loader refuses (no
// feed_forward_length, most tensors missing): the whole report, then the
// loader's reason, exit 1.
TEST_F(GgufInfoTest, ReportThenTheLoadersVerdict) {
  const RunResult r = run(write("ok.gguf", llama_like().to_bytes()));
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.output;
  EXPECT_NE(r.output.find("ok.gguf: missing key 'llama.feed_forward_length'"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("loader:"), std::string::npos) << r.output;
  for (const char* part : {"GGUF v3", "llama.attention.head_count_kv", "[7 x string]", "\"<unk>\"",
                           "token_embd.weight", "q8_0", "[64, 2]", "136",
                           "gpt2, vocabulary of 7 tokens, pre-tokenizer default (tokenizer.ggml.pre absent)",
                           // 2 (K and V) * 32 layers * 8 kv heads * 128 dims * 2 bytes
                           "131072 bytes per token"})
    EXPECT_NE(r.output.find(part), std::string::npos) << "missing '" << part << "' in\n" << r.output;
  EXPECT_EQ(r.output.find("attention:"), std::string::npos) << "no llama.attention.scale, no line\n" << r.output;
}

// Only tokenizer.* keys, no tensors: byte-level BPE over "a".."d" with merges
// a+b and ab+c, DeepSeek-R1-Qwen's pre-tokenizer name.
GgufWriter vocab_only(const std::string& model = "gpt2", const std::string& pre = "deepseek-r1-qwen",
                      const std::vector<std::string>& merges = {"a b", "ab c"}) {
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", model);
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "c", "d", "ab", "abc", "<|endoftext|>"});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1, 3});
  w.set_string_array("tokenizer.ggml.merges", merges);
  w.set_u32("tokenizer.ggml.bos_token_id", 6);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  return w;
}

TEST_F(GgufInfoTest, VocabularyOnlyFileTokenizes) {
  const std::string path = write("vocab.gguf", vocab_only().to_bytes());
  const RunResult report = run(path);
  ASSERT_TRUE(WIFEXITED(report.status)) << report.output;
  EXPECT_EQ(WEXITSTATUS(report.status), 0) << report.output;
  EXPECT_NE(report.output.find("tensors:    0"), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("tokenizer:  gpt2, vocabulary of 7 tokens, pre-tokenizer deepseek-r1-qwen (the qwen2 "
                               "rules), BOS 6 added"),
            std::string::npos)
      << report.output;
  EXPECT_NE(report.output.find("kv cache:   unknown (no general.architecture)"), std::string::npos) << report.output;

  // Qwen2 rules: "abcd" is one word -> abc + d; BOS first; <|endoftext|> parsed.
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--tokenize", "abcd"}, "6 5 3\n"},
      {{"--tokenize", "abcd", "--no-bos"}, "5 3\n"},
      {{"--tokenize", "ab<|endoftext|>", "--no-bos"}, "4 6\n"},
      {{"--tokenize", "ab<|endoftext|>", "--no-bos", "--no-special"}, ""},  // no tokens for < | ...: an error
      {{"--tokenize", ""}, "6\n"},
  };
  for (const auto& [args, want] : cases) {
    const RunResult r = run(path, args);
    ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
    if (want.empty()) {
      EXPECT_NE(WEXITSTATUS(r.status), 0) << args[1] << "\n" << r.output;
      EXPECT_NE(r.output.find("no token for byte"), std::string::npos) << r.output;
    } else {
      EXPECT_EQ(WEXITSTATUS(r.status), 0) << args[1] << "\n" << r.output;
      EXPECT_EQ(r.output, want) << args[1];
    }
  }
}

// A tokenizer the loader could not build fails the report, which still shows
// the metadata, with the reason.
TEST_F(GgufInfoTest, UnbuildableTokenizerExitsWithOne) {
  const std::pair<const char*, GgufWriter> cases[] = {
      {"tokenizer.ggml.pre 'gpt2'", vocab_only("gpt2", "gpt2")},
      {"names 'zz'", vocab_only("gpt2", "qwen2", {"a b", "zz c"})},
      {"tokenizer.ggml.model 'bert'", vocab_only("bert")},
  };
  for (const auto& [reason, w] : cases) {
    const std::string path = write("bad.gguf", w.to_bytes());
    for (const std::vector<std::string>& args : {std::vector<std::string>{}, {"--tokenize", "ab"}}) {
      const RunResult r = run(path, args);
      ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
      EXPECT_EQ(WEXITSTATUS(r.status), 1) << reason << "\n" << r.output;
      EXPECT_NE(r.output.find(reason), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("bad.gguf"), std::string::npos) << r.output;
      if (args.empty()) {
        EXPECT_NE(r.output.find("tokenizer:  cannot be built"), std::string::npos) << r.output;
      }
    }
  }
}

// A model the loader takes: it says so, with the shape it will run.
TEST_F(GgufInfoTest, LoadableModelSaysItLoads) {
  const RunResult r = run(write("mha.gguf", tools::make_test_model(tools::test_model_by_name("mha-64")).to_bytes()));
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.output;
  EXPECT_NE(r.output.find("loader:     loads: llama, 2 layers, 4 q / 4 kv heads x 64, n_embd 256, n_ff 512, vocab 320"),
            std::string::npos)
      << r.output;
}

TEST_F(GgufInfoTest, RopeIsShown) {
  RunResult r = run(write("mha.gguf", tools::make_test_model(tools::test_model_by_name("mha-64")).to_bytes()));
  EXPECT_NE(r.output.find("rope:       adjacent pairs, theta 10000, 64 of 64 channels\n"), std::string::npos)
      << r.output;
  r = run(write("yarn.gguf", tools::make_test_model(tools::test_model_by_name("qwen2-yarn")).to_bytes()));
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.output;
  EXPECT_NE(r.output.find("rope:       halves, theta 1e+06, 64 of 64 channels, yarn scaling x4 from 32768 tokens, "
                          "rotated pairs times 1.13863\n"),
            std::string::npos)
      << r.output;
}

TEST_F(GgufInfoTest, AttentionScaleIsShown) {
  tools::TestModelSpec spec = tools::test_model_by_name("mha-64");
  spec.attn_scale = 0.0625f;
  const RunResult r = run(write("scaled.gguf", tools::make_test_model(spec).to_bytes()));
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.output;
  EXPECT_NE(r.output.find("attention:  scores q.k * 0.0625 (llama.attention.scale)"), std::string::npos) << r.output;
}

// The store plan names where its model shape comes from: assumed (no model),
// the flags, or the GGUF file.
TEST_F(GgufInfoTest, ConfigPlanSaysWhereTheShapeComesFrom) {
  const std::string yaml = "block_size: 16\n";
  const std::string config = write("small.yaml", std::vector<uint8_t>(yaml.begin(), yaml.end()));
  RunResult r = run("--config", {config});
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_NE(r.output.find("model:    32 layers x 8 kv heads x 128 dims (assumed"), std::string::npos) << r.output;
  r = run("--config", {config, "--layers", "4"});
  EXPECT_NE(r.output.find("model:    4 layers x 8 kv heads x 128 dims (--layers"), std::string::npos) << r.output;
  const std::string model = write("model.gguf", tools::make_test_model(tools::test_model_by_name("mha-64")).to_bytes());
  r = run(model, {"--config", config});
  EXPECT_NE(r.output.find("model:    2 layers x 4 kv heads x 64 dims (from " + model + ")"), std::string::npos)
      << r.output;
}

TEST_F(GgufInfoTest, InvalidFilesExitWithOne) {
  const auto good = llama_like().to_bytes();
  std::vector<std::pair<std::string, std::vector<uint8_t>>> cases;
  cases.push_back({"truncated.gguf", std::vector<uint8_t>(good.begin(), good.begin() + 100)});
  auto huge = good;
  testing::patch<uint64_t>(huge, 16, ~uint64_t{0});
  cases.push_back({"huge_count.gguf", huge});
  cases.push_back({"empty.gguf", {}});
  for (const auto& [name, bytes] : cases) {
    const RunResult r = run(write(name, bytes));
    ASSERT_TRUE(WIFEXITED(r.status)) << name << " ended by a signal\n" << r.output;
    EXPECT_EQ(WEXITSTATUS(r.status), 1) << name << "\n" << r.output;
    EXPECT_NE(r.output.find(name), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("corrupt"), std::string::npos) << r.output;
  }
  const RunResult missing = run((dir_ / "absent.gguf").string());
  ASSERT_TRUE(WIFEXITED(missing.status));
  EXPECT_EQ(WEXITSTATUS(missing.status), 1) << missing.output;
}

}  // namespace
}  // namespace longctx::model
