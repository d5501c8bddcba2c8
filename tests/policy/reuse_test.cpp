// Reuse schedule (policy/reuse.h) against a literal reading of ALGORITHMS.md
// over grids of (dense_layer_num, layer_step, token_step, layers, steps), and
// the extension of saved selections against brute-force token sets.
#include "longctx/policy/reuse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using cpu::testing::spans_of;

// A selection that names who made it: one head, one token span at layer * 1000 + step.
Selection tag(int layer, int64_t step) {
  Selection s;
  s.spans = {{TokenSpan{layer * 1000 + step, layer * 1000 + step + 1}}};
  return s;
}

struct Source {
  int layer;
  int64_t step;
  bool operator==(const Source&) const = default;
};

// The literal rule: a layer re-selects at token_idx % token_step == 0 when
// layer % layer_step == dense_layer_num % layer_step; otherwise it uses the
// selection saved for its group, made by the closest such layer at or below
// it at the closest such step at or before now.
Source expected_source(int dense, int layer_step, int token_step, int layer, int64_t step) {
  int leader = layer;
  while (leader % layer_step != dense % layer_step) --leader;
  int64_t made = step;
  while (made % token_step != 0) --made;
  return {leader, made};
}

TEST(PolicyReuse, ScheduleMatchesTheLiteralRuleOnGrids) {
  for (int dense = 0; dense <= 4; ++dense)
    for (int layer_step = 1; layer_step <= 4; ++layer_step)
      for (int token_step = 1; token_step <= 4; ++token_step)
        for (int n_layers = 1; n_layers <= 9; ++n_layers) {
          SCOPED_TRACE(::testing::Message() << "dense=" << dense << " layer_step=" << layer_step
                                            << " token_step=" << token_step << " n_layers=" << n_layers);
          const ReuseSchedule schedule(dense, layer_step, token_step);
          SelectionCache cache(n_layers);
          for (int64_t step = 0; step < 11; ++step) {
            for (int layer = 0; layer < n_layers; ++layer) {
              const bool literal_reselects =
                  layer >= dense && layer % layer_step == dense % layer_step && step % token_step == 0;
              ASSERT_EQ(schedule.reselects(layer, step), literal_reselects) << layer << " " << step;
              ASSERT_EQ(schedule.is_dense(layer), layer < dense);
              const ReuseAction action = decide(schedule, cache, layer, step);
              if (layer < dense) {
                ASSERT_EQ(action, ReuseAction::kDense);
                EXPECT_THROW(schedule.group_of(layer), Error);
                continue;
              }
              const int group = schedule.group_of(layer);
              ASSERT_LE(group, layer);
              ASSERT_GE(group, dense);  // a group's leader is never dense
              ASSERT_TRUE(schedule.is_leader(group));
              // Starting at step 0 in layer order, a saved selection always exists when needed.
              ASSERT_EQ(action, literal_reselects ? ReuseAction::kSelect : ReuseAction::kReuse);
              if (action == ReuseAction::kSelect) cache.put(group, {tag(layer, step), {}, true});
              const SavedSelection* saved = cache.get(group);
              ASSERT_NE(saved, nullptr);
              const Source want = expected_source(dense, layer_step, token_step, layer, step);
              ASSERT_EQ(saved->selection.spans, tag(want.layer, want.step).spans) << layer << " " << step;
            }
          }
        }
}

TEST(PolicyReuse, ReadsTheConfig) {
  LongContextConfig config;
  config.dense_layer_num = 3;
  config.layer_step = 2;
  config.token_step = 5;
  const ReuseSchedule schedule(config);
  EXPECT_TRUE(schedule.is_dense(2));
  EXPECT_EQ(schedule.group_of(3), 3);
  EXPECT_EQ(schedule.group_of(4), 3);
  EXPECT_EQ(schedule.group_of(5), 5);
  EXPECT_TRUE(schedule.reselects(5, 10));
  EXPECT_FALSE(schedule.reselects(5, 11));
  EXPECT_FALSE(schedule.reselects(4, 10));
  EXPECT_THROW(ReuseSchedule(0, 0, 1), Error);
  EXPECT_THROW(ReuseSchedule(0, 1, 0), Error);
  EXPECT_THROW(ReuseSchedule(-1, 1, 1), Error);
}

TEST(PolicyReuse, MissingSavedSelectionMakesTheLayerSelect) {
  // Decode resumed at a step that is not a re-select step: the first layer of
  // each group selects for the group, the others reuse it.
  const ReuseSchedule schedule(1, 3, 4);
  SelectionCache cache(8);
  EXPECT_EQ(decide(schedule, cache, 0, 5), ReuseAction::kDense);
  EXPECT_EQ(decide(schedule, cache, 2, 5), ReuseAction::kSelect);  // group 1 empty; layer 2 selects for it
  cache.put(schedule.group_of(2), {tag(2, 5), {}, true});
  EXPECT_EQ(decide(schedule, cache, 3, 5), ReuseAction::kReuse);
  EXPECT_EQ(cache.get(1)->selection.spans, tag(2, 5).spans);
  EXPECT_EQ(decide(schedule, cache, 4, 5), ReuseAction::kSelect);  // group 4 empty
  cache.clear();
  EXPECT_EQ(cache.get(1), nullptr);
  EXPECT_EQ(decide(schedule, cache, 3, 6), ReuseAction::kSelect);
  EXPECT_THROW(cache.get(8), Error);
  EXPECT_THROW(cache.put(-1, {}), Error);
}

// ---- extension of saved selections -----------------------------------------------

std::vector<bool> members(const std::vector<TokenSpan>& spans, int64_t n) {
  std::vector<bool> in(size_t(n), false);
  for (const TokenSpan& s : spans)
    for (int64_t t = s.begin; t < s.end; ++t) in[size_t(t)] = true;
  return in;
}

std::vector<TokenSpan> random_spans(std::mt19937& rng, int64_t n) {
  std::vector<bool> in(static_cast<size_t>(n));
  std::bernoulli_distribution density(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
  for (int64_t t = 0; t < n; ++t) in[size_t(t)] = density(rng);
  return spans_of(in);
}

TEST(PolicyReuse, ExtendWithNewTokensMatchesTokenSets) {
  std::mt19937 rng(test_seed(41));
  for (int iter = 0; iter < 500; ++iter) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 80)(rng);
    const int64_t old_end = std::uniform_int_distribution<int64_t>(0, n)(rng);
    const int64_t new_end = std::uniform_int_distribution<int64_t>(old_end, n + 20)(rng);
    Selection s;
    const int heads = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int h = 0; h < heads; ++h) s.spans.push_back(random_spans(rng, old_end));
    const Selection extended = extend_with_new_tokens(s, old_end, new_end);
    ASSERT_EQ(extended.spans.size(), s.spans.size());
    for (int h = 0; h < heads; ++h) {
      std::vector<bool> want = members(s.spans[size_t(h)], new_end);
      for (int64_t t = old_end; t < new_end; ++t) want[size_t(t)] = true;
      ASSERT_EQ(extended.spans[size_t(h)], spans_of(want)) << "iter " << iter << " head " << h;
    }
  }
  EXPECT_THROW(extend_with_new_tokens(Selection{}, 5, 4), Error);
}

// Partition of a layer of n tokens (kv_store.h's definition; blocks unused here).
kvstore::Partition partition_of(int64_t n, int64_t initial_len, int64_t local_len) {
  kvstore::Partition p;
  p.n_tokens = n;
  p.initial_end = std::min(initial_len, n);
  p.local_begin = std::max(p.initial_end, n - local_len);
  return p;
}

TEST(PolicyReuse, ReusedSelectionCoversEveryTokenOnce) {
  std::mt19937 rng(test_seed(42));
  for (int iter = 0; iter < 400; ++iter) {
    const int64_t initial = std::uniform_int_distribution<int64_t>(0, 8)(rng);
    const int64_t local = std::uniform_int_distribution<int64_t>(0, 20)(rng);
    const int64_t old_n = std::uniform_int_distribution<int64_t>(0, 60)(rng);
    const int64_t new_n = old_n + std::uniform_int_distribution<int64_t>(0, 30)(rng);
    const bool include_local = iter % 2 == 0;
    SavedSelection saved;
    saved.partition = partition_of(old_n, initial, local);
    saved.include_local = include_local;
    const int64_t old_cpu_end = include_local ? old_n : saved.partition.local_begin;
    saved.selection.spans = {random_spans(rng, old_cpu_end), random_spans(rng, old_cpu_end)};
    const kvstore::Partition now = partition_of(new_n, initial, local);
    const Selection reused = reused_selection(saved, now);
    for (size_t h = 0; h < 2; ++h) {
      const std::vector<bool> before = members(saved.selection.spans[h], new_n);
      const std::vector<bool> cpu = members(reused.spans[h], new_n);
      for (int64_t t = 0; t < new_n; ++t) {
        const bool gpu = !include_local && t >= now.local_begin;
        SCOPED_TRACE(::testing::Message() << "iter " << iter << " token " << t);
        // Tokens that were not the CPU's at selection time are attended now, exactly once.
        if (t >= old_cpu_end) {
          ASSERT_TRUE(cpu[size_t(t)] || gpu);
        } else {
          ASSERT_EQ(cpu[size_t(t)], before[size_t(t)]);  // nothing the selection left out comes back
        }
        ASSERT_FALSE(cpu[size_t(t)] && gpu);
      }
    }
  }
  SavedSelection later;
  later.partition = partition_of(10, 0, 0);
  later.selection.spans = {{}};
  EXPECT_THROW(reused_selection(later, partition_of(9, 0, 0)), Error);
}

}  // namespace
}  // namespace longctx::policy
