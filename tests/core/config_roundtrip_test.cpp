// Tests of the YAML configuration loader (core/src/config*.cpp): the
// config_to_yaml round trip and the names of the enums.
#include "longctx/core/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "config_fixture.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx {
namespace {

using RT = RepresentativeType;
using namespace config_testing;

// ---- config_to_yaml round trip -------------------------------------------------------

double alphas_for_h2o(int64_t i) {
  const double values[] = {0.0, 1.0, 0.5, 1.0 / 3.0};
  return values[i];
}

// A random config that passes validation, with values across each key's whole range.
LongContextConfig random_valid_config(std::mt19937_64& rng) {
  const auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  // Small and huge values alike: a log-uniform magnitude.
  const auto spread = [&](int64_t lo, int64_t hi) {
    const int64_t top = std::min<int64_t>(hi, lo + (int64_t{1} << uniform(0, 31)));
    return uniform(lo, top);
  };
  const auto coin = [&] { return uniform(0, 1) == 1; };
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();

  LongContextConfig c;
  c.max_seq_len = spread(1, kIntMax);
  c.block_size = static_cast<int>(uniform(1, 1024));
  c.chunk_size = static_cast<int>(spread(1, 1048576));
  c.local_windows_len = static_cast<int>(uniform(0, c.max_seq_len));
  c.initial_len = static_cast<int>(uniform(0, c.max_seq_len - c.local_windows_len));
  c.second_select_num = static_cast<int>(uniform(0, c.max_seq_len / c.block_size));
  c.threads_num = static_cast<int>(uniform(0, 4096));
  c.representative_type = static_cast<RT>(uniform(0, 4));
  switch (c.representative_type) {
    case RT::kMax:
    case RT::kMean: c.representative_num = 1; break;
    case RT::kQuest: c.representative_num = 2; break;
    default: c.representative_num = static_cast<int>(uniform(1, c.block_size)); break;
  }
  c.kv_type = static_cast<DType>(uniform(0, 2));
  c.dense_layer_num = static_cast<int>(spread(0, kIntMax));
  c.preselect_block = coin();
  c.preselect_block_count =
      static_cast<int>(c.preselect_block ? uniform(1, std::max<int64_t>(1, c.max_seq_len / c.block_size))
                                         : spread(1, kIntMax));
  if (c.preselect_block && int64_t{c.preselect_block_count} * c.block_size > c.max_seq_len) {
    c.preselect_block = false;  // max_seq_len < block_size: no block fits
  }
  c.head_select_mode = coin() ? HeadSelectMode::kShared : HeadSelectMode::kSeparate;
  c.layer_step = static_cast<int>(spread(1, kIntMax));
  c.token_step = static_cast<int>(spread(1, kIntMax));
  c.gqa_reduce = coin() ? Reduce::kSum : Reduce::kMax;
  c.dynamic_reduce = coin() ? Reduce::kMax : Reduce::kMean;
  c.policy = static_cast<SelectionPolicy>(uniform(0, 3));
  if (c.policy == SelectionPolicy::kStreaming || c.policy == SelectionPolicy::kH2O) c.preselect_block = false;
  c.preselect.window = static_cast<int>(spread(1, kIntMax));
  c.preselect.pool_kernel = static_cast<int>(spread(0, kIntMax / 2 - 1) * 2 + 1);
  c.preselect.pool = coin() ? PoolType::kMax : PoolType::kAvg;
  c.preselect.gqa_reduce = coin() ? Reduce::kSum : Reduce::kMax;
  c.h2o.heavy_ratio = coin() ? alphas_for_h2o(uniform(0, 3)) : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  c.h2o.budget_tokens = static_cast<int>(c.policy == SelectionPolicy::kH2O ? uniform(1, c.max_seq_len)
                                                                             : spread(0, kIntMax));
  switch (uniform(0, 2)) {
    case 0: c.numa.kind = NumaPolicy::Kind::kAuto; break;
    case 1: c.numa.kind = NumaPolicy::Kind::kNone; break;
    default: {
      c.numa.kind = NumaPolicy::Kind::kNodes;
      std::set<int> used;
      for (int64_t i = 0, n = uniform(1, 6); i < n; ++i) {
        const int node = static_cast<int>(spread(0, kIntMax));
        if (used.insert(node).second) c.numa.nodes.push_back(node);
      }
    }
  }
  switch (uniform(0, 3)) {
    case 0: c.dram_budget = 0; break;
    case 1: c.dram_budget = static_cast<uint64_t>(uniform(1, 1000)) << (10 * uniform(0, 4)); break;
    case 2: c.dram_budget = static_cast<uint64_t>(uniform(1, 1000)) * 1000000; break;
    default: c.dram_budget = std::uniform_int_distribution<uint64_t>()(rng); break;
  }
  c.budget.policy = coin() ? BudgetConfig::Policy::kUniform : BudgetConfig::Policy::kAdaptive;
  const double alphas[] = {0.0, 1.0, 0.2, 5e-324, std::nextafter(1.0, 0.0), 1.0 / 3.0};
  c.budget.alpha = coin() ? alphas[uniform(0, 5)] : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  static const char* const pieces[] = {"heads", ".txt", "/", " ", "'", "\"", "\\", ":", "# x", "\n", "\t",
                                       "é",     "中",   "~", "null", "true", "-", "[", "{", "%", "\x01"};
  c.razor.retrieval_heads.clear();
  for (int64_t i = 0, n = uniform(0, 6); i < n; ++i) c.razor.retrieval_heads += pieces[uniform(0, 20)];
  c.razor.sinks = static_cast<int>(spread(0, kIntMax));
  c.razor.buffer_min = static_cast<int>(spread(0, kIntMax));
  c.razor.buffer_ratio = static_cast<int>(spread(1, kIntMax));
  c.quoka.enabled = coin();
  c.quoka.n_q = static_cast<int>(spread(1, kIntMax));
  c.quoka.b_sa = static_cast<int>(c.quoka.enabled ? uniform(1, c.max_seq_len) : spread(1, kIntMax));
  c.quoka.b_cp = static_cast<int>(spread(0, kIntMax));
  c.quoka.query_reduce = coin() ? Reduce::kMax : Reduce::kMean;
  c.quoka.head_reduce = coin() ? Reduce::kMax : Reduce::kMean;
  for (int64_t i = 0, n = uniform(0, 6); i < n; ++i) c.model.path += pieces[uniform(0, 20)];
  static const char* const templates[] = {"auto", "raw", "llama2", "llama3", "chatml", "internlm2"};
  c.model.chat_template = templates[uniform(0, 5)];
  for (int64_t i = 0, n = uniform(0, 6); i < n; ++i) c.model.system_prompt += pieces[uniform(0, 20)];
  c.sampling.temperature = coin() ? 0.0 : std::uniform_real_distribution<double>(0.0, 100.0)(rng);
  c.sampling.top_k = static_cast<int>(spread(0, kIntMax));
  c.sampling.top_p = coin() ? 1.0 : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  c.sampling.seed = static_cast<int64_t>(rng() >> 1);
  c.sampling.max_tokens = static_cast<int>(spread(1, kIntMax));
  return c;
}

TEST(ConfigRoundTrip, RandomValidConfigs) {
  std::mt19937_64 rng(test_seed(20240611));
  for (int i = 0; i < 400; ++i) {
    const LongContextConfig config = random_valid_config(rng);
    ASSERT_NO_THROW(validate_config(config)) << "generator made an invalid config, iteration " << i;
    const std::string yaml = config_to_yaml(config);
    SCOPED_TRACE(yaml);
    const LongContextConfig back = parse_config(yaml, "<round trip>");
    expect_same(back, config);
    EXPECT_EQ(config_to_yaml(back), yaml);
    if (testing::Test::HasFailure()) break;
  }
  expect_same(parse_config(config_to_yaml(LongContextConfig{}), "<defaults>"), LongContextConfig{});
}

// ---- names -----------------------------------------------------------------------------

TEST(ConfigNames, KTransformersSpellings) {
  EXPECT_STREQ(representative_type_name(RT::kMax), "MAX");
  EXPECT_STREQ(representative_type_name(RT::kMean), "MEAN");
  EXPECT_STREQ(representative_type_name(RT::kQuest), "QUEST");
  EXPECT_STREQ(representative_type_name(RT::kFix), "FIX");
  EXPECT_STREQ(representative_type_name(RT::kDynamic), "DYNAMIC");
  EXPECT_STREQ(head_select_mode_name(HeadSelectMode::kShared), "SHARED");
  EXPECT_STREQ(head_select_mode_name(HeadSelectMode::kSeparate), "SEPARATE");
  EXPECT_STREQ(reduce_name(Reduce::kSum), "sum");
  EXPECT_STREQ(reduce_name(Reduce::kMax), "max");
  EXPECT_STREQ(reduce_name(Reduce::kMean), "mean");
  EXPECT_STREQ(selection_policy_name(SelectionPolicy::kSelect), "select");
  EXPECT_STREQ(selection_policy_name(SelectionPolicy::kDense), "dense");
  EXPECT_STREQ(selection_policy_name(SelectionPolicy::kStreaming), "streaming");
  EXPECT_STREQ(selection_policy_name(SelectionPolicy::kH2O), "h2o");
  EXPECT_STREQ(pool_type_name(PoolType::kMax), "max");
  EXPECT_STREQ(pool_type_name(PoolType::kAvg), "avg");
}

}  // namespace
}  // namespace longctx
