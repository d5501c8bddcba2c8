// Helpers of the config tests (config_*_test.cpp): field-by-field equality,
// the message of the error parsing or validation must raise, files, and
// whether the generated docs are being regenerated.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/error.h"

namespace longctx::config_testing {

// Every field, so a test names the one that differs.
inline void expect_same(const LongContextConfig& a, const LongContextConfig& b) {
  EXPECT_EQ(a.chunk_size, b.chunk_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.local_windows_len, b.local_windows_len);
  EXPECT_EQ(a.initial_len, b.initial_len);
  EXPECT_EQ(a.second_select_num, b.second_select_num);
  EXPECT_EQ(a.threads_num, b.threads_num);
  EXPECT_EQ(a.representative_type, b.representative_type);
  EXPECT_EQ(a.representative_num, b.representative_num);
  EXPECT_EQ(a.kv_type, b.kv_type);
  EXPECT_EQ(a.dense_layer_num, b.dense_layer_num);
  EXPECT_EQ(a.preselect_block, b.preselect_block);
  EXPECT_EQ(a.preselect_block_count, b.preselect_block_count);
  EXPECT_EQ(a.head_select_mode, b.head_select_mode);
  EXPECT_EQ(a.layer_step, b.layer_step);
  EXPECT_EQ(a.token_step, b.token_step);
  EXPECT_EQ(a.policy, b.policy);
  EXPECT_EQ(a.gqa_reduce, b.gqa_reduce);
  EXPECT_EQ(a.dynamic_reduce, b.dynamic_reduce);
  EXPECT_EQ(a.preselect.window, b.preselect.window);
  EXPECT_EQ(a.preselect.pool_kernel, b.preselect.pool_kernel);
  EXPECT_EQ(a.preselect.pool, b.preselect.pool);
  EXPECT_EQ(a.preselect.gqa_reduce, b.preselect.gqa_reduce);
  EXPECT_EQ(std::memcmp(&a.h2o.heavy_ratio, &b.h2o.heavy_ratio, sizeof(double)), 0)
      << a.h2o.heavy_ratio << " vs " << b.h2o.heavy_ratio;
  EXPECT_EQ(a.h2o.budget_tokens, b.h2o.budget_tokens);
  EXPECT_EQ(a.numa.kind, b.numa.kind);
  EXPECT_EQ(a.numa.nodes, b.numa.nodes);
  EXPECT_EQ(a.dram_budget, b.dram_budget);
  EXPECT_EQ(a.budget.policy, b.budget.policy);
  // Exact: the round trip must give the very same double.
  EXPECT_EQ(std::memcmp(&a.budget.alpha, &b.budget.alpha, sizeof(double)), 0)
      << a.budget.alpha << " vs " << b.budget.alpha;
  EXPECT_EQ(a.razor.retrieval_heads, b.razor.retrieval_heads);
  EXPECT_EQ(a.razor.sinks, b.razor.sinks);
  EXPECT_EQ(a.razor.buffer_min, b.razor.buffer_min);
  EXPECT_EQ(a.razor.buffer_ratio, b.razor.buffer_ratio);
  EXPECT_EQ(a.quoka.enabled, b.quoka.enabled);
  EXPECT_EQ(a.quoka.n_q, b.quoka.n_q);
  EXPECT_EQ(a.quoka.b_sa, b.quoka.b_sa);
  EXPECT_EQ(a.quoka.b_cp, b.quoka.b_cp);
  EXPECT_EQ(a.quoka.query_reduce, b.quoka.query_reduce);
  EXPECT_EQ(a.quoka.head_reduce, b.quoka.head_reduce);
  EXPECT_EQ(a.model.path, b.model.path);
  EXPECT_EQ(a.model.chat_template, b.model.chat_template);
  EXPECT_EQ(a.model.backend, b.model.backend);
  EXPECT_EQ(a.model.system_prompt, b.model.system_prompt);
  EXPECT_EQ(std::memcmp(&a.sampling.temperature, &b.sampling.temperature, sizeof(double)), 0)
      << a.sampling.temperature << " vs " << b.sampling.temperature;
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(std::memcmp(&a.sampling.top_p, &b.sampling.top_p, sizeof(double)), 0)
      << a.sampling.top_p << " vs " << b.sampling.top_p;
  EXPECT_EQ(a.sampling.seed, b.sampling.seed);
  EXPECT_EQ(a.sampling.max_tokens, b.sampling.max_tokens);
}

// The message of the kConfig error that parsing must raise ("" if none).
inline std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {},
                                const std::string& source = "x.yaml") {
  try {
    parse_config(yaml, source, overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return "";
}

inline std::string validation_error(const LongContextConfig& config) {
  try {
    validate_config(config);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

inline bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

inline bool regenerating() {
  const char* flag = std::getenv("LONGCTX_REGENERATE_DOCS");
  return flag != nullptr && std::string(flag) == "1";
}

}  // namespace longctx::config_testing
