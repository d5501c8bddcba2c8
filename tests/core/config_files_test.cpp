// Tests of the YAML configuration loader (core/src/config*.cpp): loading files,
// the shipped configs, the generated reference docs/config.md and
// configs/default.yaml.
#include "longctx/core/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "config_fixture.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

namespace fs = std::filesystem;
using RT = RepresentativeType;
using namespace config_testing;

// ---- files ---------------------------------------------------------------------

TEST(ConfigFiles, LoadErrorsNameThePath) {
  const fs::path dir = fs::path(testing::TempDir()) / "longctx_config_test";
  fs::create_directories(dir);
  const std::string missing = (dir / "missing.yaml").string();
  try {
    load_config_file(missing);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  try {
    load_config_file(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
  const fs::path bad = dir / "bad.yaml";
  write_text(bad, "# a comment\nblock_size: 0\n");
  try {
    load_config_file(bad.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    EXPECT_EQ(std::string(e.what()), bad.string() + ":2:13: key 'block_size': must be in 1..1024, got 0");
  }
  EXPECT_EQ(load_config_file(bad.string(), {"block_size=8"}).block_size, 8);
  // A file far larger than any config (a model given as --config) is refused before it is read whole.
  const fs::path huge = dir / "model.gguf";
  write_text(huge, std::string((size_t(1) << 20) + 1, '#'));
  try {
    load_config_file(huge.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_EQ(std::string(e.what()), "cannot read config file: '" + huge.string() +
                                         "' is larger than 1.00 MiB, the most its reader takes");
  }
  fs::remove_all(dir);
}

std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(fs::path(LONGCTX_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() == ".yaml") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

TEST(ConfigFiles, EveryShippedConfigLoads) {
  const std::vector<fs::path> paths = shipped_configs();
  EXPECT_GE(paths.size(), 5u);
  for (const fs::path& path : paths) {
    SCOPED_TRACE(path.string());
    EXPECT_NO_THROW(load_config_file(path.string()));
    // Each file says what it reproduces before its first key.
    EXPECT_TRUE(starts_with(read_text(path), "# "));
  }
}

std::string config_path(const char* name) { return std::string(LONGCTX_SOURCE_DIR) + "/configs/" + name; }

TEST(ConfigFiles, ShippedConfigsSayWhatTheyReproduce) {
  expect_same(load_config_file(config_path("default.yaml")), LongContextConfig{});

  const LongContextConfig quest = load_config_file(config_path("quest.yaml"));
  EXPECT_EQ(quest.representative_type, RT::kQuest);
  EXPECT_EQ(quest.representative_num, 2);
  EXPECT_EQ(quest.head_select_mode, HeadSelectMode::kSeparate);
  EXPECT_FALSE(quest.preselect_block);
  EXPECT_EQ(quest.block_size, 16);
  EXPECT_EQ(quest.dense_layer_num, 2);

  const LongContextConfig infllm = load_config_file(config_path("infllm.yaml"));
  EXPECT_EQ(infllm.representative_type, RT::kDynamic);
  EXPECT_EQ(infllm.head_select_mode, HeadSelectMode::kShared);
  EXPECT_EQ(infllm.representative_num, 4);
  EXPECT_EQ(infllm.block_size, 128);
  EXPECT_EQ(infllm.initial_len, 128);
  EXPECT_EQ(infllm.local_windows_len, 4096);

  const LongContextConfig streaming = load_config_file(config_path("streamingllm.yaml"));
  EXPECT_EQ(streaming.policy, SelectionPolicy::kStreaming);
  EXPECT_EQ(streaming.initial_len, 4);
  EXPECT_FALSE(streaming.preselect_block);

  const LongContextConfig h2o = load_config_file(config_path("h2o.yaml"));
  EXPECT_EQ(h2o.policy, SelectionPolicy::kH2O);
  EXPECT_EQ(h2o.h2o.heavy_ratio, 0.5);
  EXPECT_LE(h2o_budget_tokens(h2o), h2o.max_seq_len);

  const LongContextConfig snapkv = load_config_file(config_path("snapkv.yaml"));
  EXPECT_TRUE(snapkv.preselect_block);
  EXPECT_EQ(snapkv.block_size, 1);

  const LongContextConfig small = load_config_file(std::string(LONGCTX_SOURCE_DIR) + "/tests/configs/small.yaml");
  EXPECT_EQ(small.max_seq_len, 8192);
  EXPECT_EQ(small.block_size, 16);
  EXPECT_EQ(small.local_windows_len, 64);
  EXPECT_EQ(small.initial_len, 16);
  EXPECT_EQ(small.chunk_size, 256);
  EXPECT_EQ(small.second_select_num, 8);
  EXPECT_EQ(small.kv_type, DType::kF32);
  EXPECT_EQ(small.dram_budget, uint64_t{256} << 20);
}

// ---- generated text: docs/config.md and configs/default.yaml -------------------------

const char* const kRegenerate =
    "regenerate it with: LONGCTX_REGENERATE_DOCS=1 build/bin/longctx_core_tests --gtest_filter='ConfigDocs.*'";

TEST(ConfigDocs, ReferenceMatchesDocsFile) {
  const fs::path path = fs::path(LONGCTX_SOURCE_DIR) / "docs" / "config.md";
  const std::string reference = config_reference_markdown();
  if (regenerating()) {
    write_text(path, reference);
    return;
  }
  EXPECT_TRUE(read_text(path) == reference) << path.string() << " is out of date with core/src/config.cpp; "
                                            << kRegenerate;
}

// The keys of config_to_yaml's text: "block_size", "budget.alpha", ...
std::vector<std::string> keys_of_yaml(const std::string& yaml) {
  std::vector<std::string> keys;
  std::string section;
  std::istringstream lines(yaml);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(':');
    if (line.empty() || line[0] == '#' || colon == std::string::npos) continue;
    const bool nested = line[0] == ' ';
    const std::string name = line.substr(line.find_first_not_of(' '), colon - line.find_first_not_of(' '));
    if (!nested && colon + 1 == line.size()) {
      section = name;  // "budget:" opens a section
    } else {
      keys.push_back(nested ? section + "." + name : name);
    }
  }
  return keys;
}

TEST(ConfigDocs, ReferenceDescribesEveryKey) {
  const std::string reference = config_reference_markdown();
  const std::vector<std::string> keys = keys_of_yaml(config_to_yaml(LongContextConfig{}));
  EXPECT_EQ(keys.size(), 59u);  // every field of LongContextConfig
  for (const std::string& key : keys) {
    EXPECT_NE(reference.find("| `" + key + "`"), std::string::npos) << key;
  }
  for (const char* alias : {"anchor_type", "anchor_num"}) {
    EXPECT_NE(reference.find(std::string("(alias `") + alias + "`)"), std::string::npos) << alias;
  }
}

// default.yaml is a comment header followed by config_to_yaml of the defaults.
TEST(ConfigDocs, DefaultYamlListsEveryKey) {
  const fs::path path = fs::path(LONGCTX_SOURCE_DIR) / "configs" / "default.yaml";
  const std::string text = read_text(path);
  std::string header;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line) && !line.empty() && line[0] == '#';) header += line + "\n";
  const std::string body = config_to_yaml(LongContextConfig{});
  if (regenerating()) {
    write_text(path, header + body);
    return;
  }
  EXPECT_FALSE(header.empty());
  EXPECT_TRUE(text == header + body) << path.string() << " does not list every key with its default; "
                                     << kRegenerate;
}

}  // namespace
}  // namespace longctx
