// policy::select_blocks, the one selection of the select policy: against
// fp64 reference block scores (the k best blocks are kept), the tie and
// full-budget rules, the preselection restriction, and equal to what
// DecodePolicy attends on random stores for every select configuration
// (SHARED, SEPARATE uniform and Ada-KV, with and without preselection).
#include "longctx/policy/select.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "cpu/reference.h"
#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/preselect.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using cpu::build_selection;
using cpu::select_all;
using cpu::Selection;
using cpu::TokenSpan;
using cpu::testing::expect_invalid_argument;
using cpu::testing::reference_mask;
using cpu::testing::spans_of;
using cpu::testing::StoreCase;
using cpu::testing::TestStore;
using kvstore::Partition;
namespace score_ref = cpu::score_ref;
using RT = RepresentativeType;

constexpr double kEps32 = 0x1p-23;

std::vector<float> random_query(int n_q_heads, int head_dim, std::mt19937& rng, std::vector<std::vector<double>>* rows) {
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(n_q_heads) * size_t(head_dim));
  for (float& x : q) x = normal(rng);
  rows->assign(size_t(n_q_heads), std::vector<double>(size_t(head_dim)));
  for (size_t i = 0; i < q.size(); ++i) (*rows)[i / size_t(head_dim)][i % size_t(head_dim)] = q[i];
  return q;
}

// Context blocks whose context tokens all appear in `spans`.
std::vector<int64_t> covered_blocks(const Partition& p, int block_size, const std::vector<TokenSpan>& spans) {
  std::vector<int64_t> blocks;
  for (int64_t b = p.first_context_block; b < p.end_context_block; ++b) {
    const int64_t begin = p.context_begin_of(b, block_size), end = p.context_end_of(b, block_size);
    for (const TokenSpan& s : spans)
      if (s.begin <= begin && end <= s.end) blocks.push_back(b);
  }
  return blocks;
}

// select_blocks keeps the k blocks of highest fp64 reference score (summed
// over kv heads in SHARED mode): blocks clearly above the k-th score are
// selected, blocks clearly below are not, and the spans hold nothing else
// than initial, those blocks, the blocks not wholly inside the context (the
// partial last block, those the sinks or the window reach into: attended
// without being ranked) and the local window. "Clearly": beyond the fp32 error bound of the scores (see
// score_test.cpp).
TEST(SelectBlocks, KeepsTheBlocksOfHighestReferenceScore) {
  std::mt19937 rng(test_seed(13));
  int decided = 0;
  for (const RT type : {RT::kMax, RT::kQuest, RT::kFix, RT::kDynamic}) {
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      StoreCase c;
      c.type = type;
      c.kv_type = dtype;
      c.n_kv_heads = 1 + int(rng() % 3);
      c.head_dim = 64;
      c.block_size = 16;
      c.rep_num = 3;
      c.initial_len = int(rng() % 40);
      c.local_windows_len = rng() % 2 == 0 ? 0 : int(rng() % 60);
      c.n_tokens = 400 + rng() % 300;
      SCOPED_TRACE(c.describe());
      const TestStore ts(c, rng);
      const kvstore::KVStore& store = ts.store();
      const Partition p = store.partition(TestStore::kLayer);
      const int64_t n_context = p.end_context_block - p.first_context_block;
      const int group = 1 << (rng() % 3);
      std::vector<std::vector<double>> q_rows;
      const std::vector<float> q = random_query(c.n_kv_heads * group, c.head_dim, rng, &q_rows);
      const TensorView q_view = make_view(q.data(), DType::kF32, {c.n_kv_heads * group, c.head_dim});

      // Reference scores and error bounds [head][block - first].
      std::vector<std::vector<double>> score(size_t(c.n_kv_heads)), bound(size_t(c.n_kv_heads));
      const int slot_len = type == RT::kQuest ? 2 * c.head_dim : c.head_dim;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const std::vector<std::vector<double>> q_group(q_rows.begin() + h * group, q_rows.begin() + (h + 1) * group);
        for (int64_t b = p.first_context_block; b < p.end_context_block; ++b) {
          const auto reps = score_ref::representatives(
              type, score_ref::stored_block_keys(store, TestStore::kLayer, h, b), c.block_size, c.rep_num,
              ts.block_importance(h, b));
          const auto s = score_ref::block_score(type, reps, q_group, Reduce::kSum, Reduce::kMax);
          score[size_t(h)].push_back(s.score);
          bound[size_t(h)].push_back(double(slot_len + group + c.rep_num + 4) * kEps32 * s.magnitude);
        }
      }
      const auto whole = [&](int64_t b) {
        return b * c.block_size >= p.initial_end && (b + 1) * c.block_size <= p.local_begin;
      };
      int64_t n_ranked = 0;
      for (int64_t b = p.first_context_block; b < p.end_context_block; ++b) n_ranked += whole(b);

      for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
        for (const int64_t k : {int64_t{0}, int64_t{1}, n_ranked / 4, n_ranked - 1}) {
          const bool include_local = rng() % 2 == 0;
          SCOPED_TRACE(str_cat(head_select_mode_name(mode), " k=", k, " include_local=", include_local));
          SelectSpec params;
          params.blocks = k;
          params.mode = mode;
          params.include_local = include_local;
          const Selection selection = select_blocks(store, TestStore::kLayer, q_view, params);
          ASSERT_EQ(selection.spans.size(), size_t(c.n_kv_heads));
          for (int h = 0; h < c.n_kv_heads; ++h) {
            // The ranking this head's blocks follow.
            std::vector<double> ranked(size_t(n_context), 0.0), tolerance(size_t(n_context), 0.0);
            for (int r = 0; r < c.n_kv_heads; ++r) {
              if (mode == HeadSelectMode::kSeparate && r != h) continue;
              for (int64_t i = 0; i < n_context; ++i) {
                ranked[size_t(i)] += score[size_t(r)][size_t(i)];
                tolerance[size_t(i)] += bound[size_t(r)][size_t(i)] +
                                        double(c.n_kv_heads) * kEps32 * std::abs(score[size_t(r)][size_t(i)]);
              }
            }
            const std::vector<int64_t> covered = covered_blocks(p, c.block_size, selection.spans[size_t(h)]);
            const int64_t covered_whole = std::count_if(covered.begin(), covered.end(), whole);
            EXPECT_EQ(int64_t(covered.size()) - covered_whole, n_context - n_ranked)
                << "the blocks not wholly inside the context are always attended";
            EXPECT_EQ(covered_whole, k) << covered.size() << " blocks selected";
            if (k > 0) {
              std::vector<double> sorted;
              for (int64_t i = 0; i < n_context; ++i)
                if (whole(p.first_context_block + i)) sorted.push_back(ranked[size_t(i)]);
              std::sort(sorted.begin(), sorted.end(), std::greater<>());
              const double kth = sorted[size_t(k - 1)];
              const double kth_tolerance = *std::max_element(tolerance.begin(), tolerance.end());
              for (int64_t i = 0; i < n_context; ++i) {
                const int64_t b = p.first_context_block + i;
                const bool selected = std::count(covered.begin(), covered.end(), b) > 0;
                const double margin = tolerance[size_t(i)] + kth_tolerance;
                if (ranked[size_t(i)] > kth + margin) {
                  EXPECT_TRUE(selected) << "block " << b << " scores above the k-th";
                  ++decided;
                } else if (ranked[size_t(i)] < kth - margin && whole(b)) {
                  EXPECT_FALSE(selected) << "block " << b << " scores below the k-th";
                  ++decided;
                }
              }
            }
            // Nothing else than initial + covered blocks + local.
            const std::vector<bool> mask = reference_mask(p, c.block_size, covered, include_local);
            EXPECT_EQ(selection.spans[size_t(h)], spans_of(mask)) << "kv head " << h;
          }
          if (mode == HeadSelectMode::kShared) {
            for (int h = 1; h < c.n_kv_heads; ++h) EXPECT_EQ(selection.spans[size_t(h)], selection.spans[0]);
          }
        }
      }
    }
  }
  EXPECT_GT(decided, 2000);
}

// With a zero query every score is exactly 0 (every type, every reduction):
// ties go to the lowest ranked blocks, in both modes (block 0 holds the 5
// sinks: attended, not ranked).
TEST(SelectBlocks, TiesPickTheLowestBlocks) {
  std::mt19937 rng(test_seed(14));
  for (const RT type : {RT::kMax, RT::kMean, RT::kQuest, RT::kFix, RT::kDynamic}) {
    StoreCase c;
    c.type = type;
    c.rep_num = 2;
    c.n_tokens = 16 * 20 + 3;
    c.initial_len = 5;
    c.local_windows_len = 40;
    const TestStore ts(c, rng);
    const Partition p = ts.store().partition(TestStore::kLayer);
    const std::vector<float> q(size_t(4 * c.n_kv_heads * c.head_dim), 0.f);
    const TensorView q_view = make_view(q.data(), DType::kF32, {4 * c.n_kv_heads, c.head_dim});
    for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
      for (const Reduce gqa : {Reduce::kSum, Reduce::kMax}) {
        SelectSpec params;
        params.blocks = 4;
        params.mode = mode;
        params.score.gqa_reduce = gqa;
        std::vector<int64_t> first_four(4);
        std::iota(first_four.begin(), first_four.end(), p.first_ranked_block);
        EXPECT_EQ(p.first_ranked_block, 1);
        EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, params).spans,
                  build_selection(p, c.block_size, c.n_kv_heads, {first_four}, true).spans)
            << representative_type_name(type) << " " << head_select_mode_name(mode) << " " << reduce_name(gqa);
      }
    }
  }
}

// A budget of every context block (or more) selects everything: select_all.
TEST(SelectBlocks, FullBudgetEqualsSelectAll) {
  std::mt19937 rng(test_seed(15));
  for (int trial = 0; trial < 12; ++trial) {
    StoreCase c;
    c.type = trial % 2 == 0 ? RT::kQuest : RT::kFix;
    c.block_size = 8 + int(rng() % 24);
    c.initial_len = int(rng() % 30);
    c.local_windows_len = int(rng() % 50);
    c.n_tokens = 1 + int64_t(rng() % 300);
    SCOPED_TRACE(c.describe());
    const TestStore ts(c, rng);
    const Partition p = ts.store().partition(TestStore::kLayer);
    const int64_t n_context = p.end_context_block - p.first_context_block;
    std::vector<std::vector<double>> rows;
    const std::vector<float> q = random_query(2 * c.n_kv_heads, c.head_dim, rng, &rows);
    const TensorView q_view = make_view(q.data(), DType::kF32, {2 * c.n_kv_heads, c.head_dim});
    for (const bool include_local : {true, false}) {
      for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
        for (const int64_t k : {n_context, n_context + 7}) {
          SelectSpec params;
          params.blocks = k;
          params.mode = mode;
          params.include_local = include_local;
          const Selection all = select_all(ts.store(), TestStore::kLayer, include_local);
          EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, params).spans, all.spans);
          // select_all: [0, n_tokens) or [0, local_begin), one span per head.
          const int64_t end = include_local ? p.n_tokens : p.local_begin;
          const std::vector<TokenSpan> expected = end > 0 ? std::vector<TokenSpan>{{0, end}} : std::vector<TokenSpan>{};
          for (const auto& spans : all.spans) EXPECT_EQ(spans, expected);
        }
      }
    }
  }
}

TEST(SelectBlocks, RejectsBadArguments) {
  std::mt19937 rng(test_seed(17));
  StoreCase c;
  c.n_tokens = 300;
  const TestStore ts(c, rng);
  std::vector<std::vector<double>> rows;
  const std::vector<float> q = random_query(c.n_kv_heads, c.head_dim, rng, &rows);
  SelectSpec params;
  params.blocks = 3;
  expect_invalid_argument([&] { select_blocks(ts.store(), TestStore::kLayer, make_view(q.data(), DType::kF32, {1, c.head_dim}), params); },
                          "1 query head for 2 kv heads");
  expect_invalid_argument([&] { select_blocks(ts.store(), 5, make_view(q.data(), DType::kF32, {2, c.head_dim}), params); },
                          "layer 5");
  params.blocks = -1;
  expect_invalid_argument([&] { select_blocks(ts.store(), TestStore::kLayer, make_view(q.data(), DType::kF32, {2, c.head_dim}), params); },
                          "negative budget");
}


// SelectSpec::choosing_heads: only the marked heads' scores choose (SHARED:
// their sum; SEPARATE uniform and Ada-KV: their rows and budget), the others
// get no context block; no head marked: nothing chosen; a wrong size refused.
TEST(SelectBlocks, ChoosingHeadsAloneChoose) {
  std::mt19937 rng(test_seed(23));
  StoreCase c;
  c.n_kv_heads = 3;
  c.block_size = 8;
  c.initial_len = 4;
  c.local_windows_len = 8;
  c.n_tokens = 250;
  const TestStore ts(c, rng);
  const Partition p = ts.store().partition(TestStore::kLayer);
  const int64_t n_context = p.end_context_block - p.first_context_block;
  std::vector<std::vector<double>> rows;
  const std::vector<float> q = random_query(c.n_kv_heads, c.head_dim, rng, &rows);
  const TensorView q_view = make_view(q.data(), DType::kF32, {c.n_kv_heads, c.head_dim});
  std::vector<float> scores(size_t(c.n_kv_heads * n_context));
  cpu::score_blocks(ts.store(), TestStore::kLayer, q_view, {},
                    make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}));
  std::vector<float> chooser_scores(scores.begin(), scores.begin() + n_context);  // heads 0 and 2
  chooser_scores.insert(chooser_scores.end(), scores.begin() + 2 * n_context, scores.end());
  // Ada-KV compares attention shares: each row's log softmax over its ranked
  // blocks at 1/sqrt(head_dim). Logs, as select_blocks ranks them: this
  // store's scores span some 2000, so most shares underflow f32 to 0 and
  // would tie.
  std::vector<float> chooser_shares = chooser_scores;
  for (int r = 0; r < 2; ++r) {
    float* row = chooser_shares.data() + r * n_context;
    const int64_t lo = p.first_ranked_block - p.first_context_block, hi = p.end_ranked_block - p.first_context_block;
    const double scale = 1.0 / std::sqrt(double(c.head_dim));
    double m = -INFINITY, total = 0.0;
    for (int64_t i = lo; i < hi; ++i) m = std::max(m, row[i] * scale);
    for (int64_t i = lo; i < hi; ++i) total += std::exp(row[i] * scale - m);
    for (int64_t i = lo; i < hi; ++i) row[i] = float(row[i] * scale - m - std::log(total));
  }

  SelectSpec spec;
  spec.blocks = 4;
  spec.choosing_heads = {1, 0, 1};
  for (const auto& [mode, policy] : {std::pair{HeadSelectMode::kShared, BudgetConfig::Policy::kUniform},
                                    std::pair{HeadSelectMode::kSeparate, BudgetConfig::Policy::kUniform},
                                    std::pair{HeadSelectMode::kSeparate, BudgetConfig::Policy::kAdaptive}}) {
    spec.mode = mode;
    spec.budget.policy = policy;
    spec.budget.alpha = 0.0;
    SCOPED_TRACE(str_cat(head_select_mode_name(mode), policy == BudgetConfig::Policy::kAdaptive ? " Ada-KV" : ""));
    const bool adakv = policy == BudgetConfig::Policy::kAdaptive;
    std::vector<std::vector<int64_t>> want =
        choose_blocks(adakv ? chooser_shares : chooser_scores, 2, p, spec.blocks, mode, spec.budget);
    if (mode == HeadSelectMode::kSeparate) want = {want[0], {}, want[1]};
    EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, spec).spans,
              build_selection(p, c.block_size, c.n_kv_heads, want, true).spans);
  }
  // Where heads are attended as they are chosen (SEPARATE uniform),
  // head_selected still comes once for every kv head, the unscored one too.
  spec.mode = HeadSelectMode::kSeparate;
  spec.budget.policy = BudgetConfig::Policy::kUniform;
  std::vector<std::vector<cpu::TokenSpan>> seen(size_t(c.n_kv_heads));
  std::vector<int> calls(size_t(c.n_kv_heads), 0);
  std::mutex mutex;
  const cpu::Selection got =
      select_blocks(ts.store(), TestStore::kLayer, q_view, spec, nullptr, nullptr,
                    [&](int h, const std::vector<cpu::TokenSpan>& spans) {
                      const std::lock_guard<std::mutex> lock(mutex);
                      ++calls[size_t(h)];
                      seen[size_t(h)] = spans;
                    });
  EXPECT_EQ(calls, std::vector<int>(size_t(c.n_kv_heads), 1));
  EXPECT_EQ(seen, got.spans);
  // top_p in SEPARATE mode: each choosing head keeps what it keeps when every
  // head chooses, with the same estimated mass; the other none, and NaN.
  spec.budget.mode = BudgetConfig::Mode::kTopP;
  spec.budget.p = 0.6;
  std::vector<double> mass_all, mass_some;
  spec.choosing_heads = {};
  const cpu::Selection every = select_blocks(ts.store(), TestStore::kLayer, q_view, spec, nullptr, &mass_all);
  spec.choosing_heads = {1, 0, 1};
  const cpu::Selection some = select_blocks(ts.store(), TestStore::kLayer, q_view, spec, nullptr, &mass_some);
  const std::vector<std::vector<int64_t>> none(1);
  EXPECT_EQ(some.spans[0], every.spans[0]);
  EXPECT_EQ(some.spans[1], build_selection(p, c.block_size, 1, none, true).spans[0]);
  EXPECT_EQ(some.spans[2], every.spans[2]);
  EXPECT_GT(every.tokens(1), some.tokens(1)) << "the unmasked head 1 keeps some block";
  ASSERT_EQ(mass_some.size(), size_t(3));
  EXPECT_EQ(mass_some[0], mass_all[0]);
  EXPECT_TRUE(std::isnan(mass_some[1]));
  EXPECT_EQ(mass_some[2], mass_all[2]);
  spec.budget = BudgetConfig{};

  spec.choosing_heads = {0, 0, 0};
  EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, spec).spans,
            build_selection(p, c.block_size, c.n_kv_heads, std::vector<std::vector<int64_t>>(1), true).spans);
  spec.choosing_heads = {1, 0};
  expect_error([&] { select_blocks(ts.store(), TestStore::kLayer, q_view, spec); }, ErrorCode::kInvalidArgument,
               {"choosing_heads has 2 entries", "3 kv heads"});
}

// With preselected blocks, the choice stays inside them: the set as is
// (not scored) when the budget covers it, else the best `blocks` of the
// preselected ones, by the same scores the unrestricted choice ranks.
TEST(SelectBlocks, PreselectedBlocksBoundTheChoice) {
  std::mt19937 rng(test_seed(18));
  for (int trial = 0; trial < 40; ++trial) {
    StoreCase c;
    c.type = trial % 2 == 0 ? RT::kQuest : RT::kMax;
    c.n_kv_heads = 1 + int(rng() % 3);
    c.block_size = 8;
    c.initial_len = int(rng() % 12);
    c.local_windows_len = int(rng() % 20);
    c.n_tokens = 200 + int64_t(rng() % 200);
    SCOPED_TRACE(c.describe());
    const TestStore ts(c, rng);
    const Partition p = ts.store().partition(TestStore::kLayer);
    const int64_t n_context = p.end_context_block - p.first_context_block;
    std::vector<std::vector<double>> rows;
    const std::vector<float> q = random_query(2 * c.n_kv_heads, c.head_dim, rng, &rows);
    const TensorView q_view = make_view(q.data(), DType::kF32, {2 * c.n_kv_heads, c.head_dim});

    const HeadSelectMode mode = rng() % 2 == 0 ? HeadSelectMode::kShared : HeadSelectMode::kSeparate;
    Preselected pre;  // of the ranked blocks, as preselect_blocks makes
    const int64_t n_ranked = p.end_ranked_block - p.first_ranked_block;
    pre.count = 2 + int64_t(rng() % (n_ranked - 2));
    pre.first_unranked_block = p.end_ranked_block;
    for (size_t l = 0; l < (mode == HeadSelectMode::kShared ? 1 : size_t(c.n_kv_heads)); ++l) {
      std::vector<int64_t> all(static_cast<size_t>(n_ranked));
      std::iota(all.begin(), all.end(), p.first_ranked_block);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(size_t(pre.count));
      std::sort(all.begin(), all.end());
      pre.blocks.push_back(all);
    }
    SelectSpec spec;
    spec.mode = mode;
    spec.include_local = rng() % 2 == 0;
    SCOPED_TRACE(str_cat(head_select_mode_name(mode), " preselected ", pre.count));

    spec.blocks = pre.count + int64_t(rng() % 3);  // covers the set: kept as is
    EXPECT_EQ(select_blocks(ts.store(), TestStore::kLayer, q_view, spec, &pre).spans,
              cpu::build_selection(p, c.block_size, c.n_kv_heads, pre.blocks, spec.include_local).spans);

    spec.blocks = int64_t(rng() % pre.count);  // fewer: chosen among the preselected by their scores
    const Selection got = select_blocks(ts.store(), TestStore::kLayer, q_view, spec, &pre);
    std::vector<float> scores(size_t(c.n_kv_heads * n_context));
    cpu::score_blocks(ts.store(), TestStore::kLayer, q_view, spec.score,
                      make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const std::vector<int64_t>& allowed = pre.blocks[pre.blocks.size() == 1 ? 0 : size_t(h)];
      // The ranking among allowed blocks: this head's scores, or the sum over heads (SHARED).
      std::vector<std::pair<float, int64_t>> ranked;
      for (const int64_t b : allowed) {
        float s = 0.f;
        for (int r = 0; r < c.n_kv_heads; ++r)
          if (mode == HeadSelectMode::kShared || r == h) s += scores[size_t(r * n_context + b - p.first_context_block)];
        ranked.emplace_back(-s, b);
      }
      std::sort(ranked.begin(), ranked.end());
      std::vector<int64_t> expected;
      for (int64_t i = 0; i < spec.blocks; ++i) expected.push_back(ranked[size_t(i)].second);
      const std::vector<bool> mask = reference_mask(p, c.block_size, expected, spec.include_local);
      EXPECT_EQ(got.spans[size_t(h)], spans_of(mask)) << "kv head " << h;
    }
  }
}

// A store of whole blocks (no sinks, no window) whose blocks Ada-KV shares
// among the kv heads: SEPARATE, MEAN representatives, f32.
LongContextConfig adakv_config(int block_size, double alpha, int blocks) {
  LongContextConfig config;
  config.max_seq_len = 1024;
  config.block_size = block_size;
  config.initial_len = 0;
  config.local_windows_len = 0;
  config.kv_type = DType::kF32;
  config.representative_type = RT::kMean;
  config.representative_num = 1;
  config.head_select_mode = HeadSelectMode::kSeparate;
  config.budget.policy = BudgetConfig::Policy::kAdaptive;
  config.budget.alpha = alpha;
  config.second_select_num = blocks;
  return config;
}

// Ada-KV shares the budget by comparing the heads' scores (adakv.h: "they
// must be on one scale (e.g. attention mass)"). Adding u to every key of
// head 1 shifts its logits by q.u and leaves its attention as it was, so the
// budget each head gets must not move: on raw scores a shift of +-3 gave one
// head every block.
TEST(SelectBlocks, AdaKvBudgetsDoNotMoveWhenAHeadsLogitsShift) {
  const int bs = 4, d = 32, n_kv = 2, n_blocks = 8;
  const LongContextConfig config = adakv_config(bs, 0.2, 4);
  std::mt19937 rng(test_seed(2));
  std::normal_distribution<float> normal;
  std::vector<float> keys(size_t(n_blocks * bs * n_kv * d)), q(size_t(n_kv * d));
  for (float& x : keys) x = normal(rng);
  for (float& x : q) x = normal(rng);
  double q1_norm = 0.0;
  for (int c = 0; c < d; ++c) q1_norm += double(q[size_t(d + c)]) * q[size_t(d + c)];
  q1_norm = std::sqrt(q1_norm);
  std::vector<int64_t> unshifted;
  for (const float shift : {0.f, 3.f, -3.f}) {
    SCOPED_TRACE(shift);
    std::vector<float> k = keys, v(keys.size(), 0.f);
    for (int t = 0; t < n_blocks * bs; ++t)  // u = shift q_1 / |q_1|
      for (int c = 0; c < d; ++c) k[size_t((t * n_kv + 1) * d + c)] += float(shift * q[size_t(d + c)] / q1_norm);
    kvstore::MemoryBudget budget(uint64_t{1} << 28);
    kvstore::KVStore store({1, n_kv, d}, config, budget, cpu::testing::topology());
    store.append(0, make_view(k.data(), DType::kF32, {n_blocks * bs, n_kv, d}),
                 make_view(v.data(), DType::kF32, {n_blocks * bs, n_kv, d}));
    const Selection got = select_blocks(store, 0, make_view(q.data(), DType::kF32, {n_kv, d}),
                                        SelectSpec::from_config(config, true));
    const std::vector<int64_t> tokens = {got.tokens(0), got.tokens(1)};
    EXPECT_GT(tokens[0], 0);
    EXPECT_GT(tokens[1], 0);
    EXPECT_EQ(tokens[0] + tokens[1], 2 * 4 * bs);
    if (unshifted.empty()) unshifted = tokens;
    EXPECT_EQ(tokens, unshifted);
  }
}

// The shares Ada-KV compares keep a head's order where they would underflow:
// blocks 150 and 120 logits below the best one are still ranked by their
// scores (as shares in f32 both were 0, and the tie went to the lower block).
TEST(SelectBlocks, AdaKvKeepsTheOrderOfFarApartScores) {
  const int bs = 4, d = 32;
  const LongContextConfig config = adakv_config(bs, 0.0, 2);
  const double to_key = std::sqrt(double(d));  // key e0 * logit * sqrt(d): q = e0 gives that logit
  const float logit[3] = {0.f, -150.f, -120.f};
  std::vector<float> k(size_t(3 * bs * d), 0.f), v(k.size(), 0.f), q(size_t(d), 0.f);
  for (int t = 0; t < 3 * bs; ++t) k[size_t(t * d)] = float(logit[t / bs] * to_key);
  q[0] = 1.f;
  kvstore::MemoryBudget budget(uint64_t{1} << 28);
  kvstore::KVStore store({1, 1, d}, config, budget, cpu::testing::topology());
  store.append(0, make_view(k.data(), DType::kF32, {3 * bs, 1, d}), make_view(v.data(), DType::kF32, {3 * bs, 1, d}));
  EXPECT_EQ(select_blocks(store, 0, make_view(q.data(), DType::kF32, {1, d}), SelectSpec::from_config(config, true))
                .spans[0],
            (std::vector<TokenSpan>{{0, 4}, {8, 12}}));
}

// What DecodePolicy attends when a layer re-selects is select_blocks with
// the config's spec (and the layer's preselected blocks), on random stores,
// for every select configuration: the benchmark's select row times the
// production choice. select_blocks tells each head's spans once from the
// scoring in SEPARATE uniform mode (and never in the others), and the
// policy's output, attended head by head as they are chosen there, is
// decode_attention's over the selection, bit for bit.
TEST(SelectBlocks, IsWhatDecodePolicyAttends) {
  struct Variant {
    HeadSelectMode mode;
    BudgetConfig::Policy budget;
    bool preselect;
  };
  std::mt19937 rng(test_seed(19));
  for (const Variant v : {Variant{HeadSelectMode::kShared, BudgetConfig::Policy::kUniform, false},
                          Variant{HeadSelectMode::kSeparate, BudgetConfig::Policy::kUniform, false},
                          Variant{HeadSelectMode::kSeparate, BudgetConfig::Policy::kAdaptive, false},
                          Variant{HeadSelectMode::kShared, BudgetConfig::Policy::kUniform, true},
                          Variant{HeadSelectMode::kSeparate, BudgetConfig::Policy::kAdaptive, true}}) {
    for (const RT rep : {RT::kQuest, RT::kMax}) {
      for (const bool include_local : {true, false}) {
        SCOPED_TRACE(str_cat(head_select_mode_name(v.mode), v.budget == BudgetConfig::Policy::kAdaptive ? " ada-kv" : "",
                             v.preselect ? " preselect" : "", " ", representative_type_name(rep),
                             include_local ? " local" : ""));
        LongContextConfig config;
        config.chunk_size = 64;
        config.max_seq_len = 1024;
        config.block_size = 8;
        config.initial_len = 8;
        config.local_windows_len = 16;
        config.kv_type = DType::kF32;
        config.representative_type = rep;
        config.representative_num = rep == RT::kQuest ? 2 : 1;
        config.dense_layer_num = 0;
        config.head_select_mode = v.mode;
        config.budget.policy = v.budget;
        config.second_select_num = 5;
        config.preselect_block = v.preselect;
        config.preselect_block_count = 12;
        config.preselect.window = 8;
        const kvstore::KVShape shape{1, 3, 32};
        kvstore::MemoryBudget budget(uint64_t{1} << 28);
        kvstore::KVStore store(shape, config, budget, cpu::testing::topology());
        std::normal_distribution<float> normal;
        const auto random = [&](int64_t n) {
          std::vector<float> x(static_cast<size_t>(n));
          for (float& e : x) e = normal(rng);
          return x;
        };
        const int64_t n_prompt = 300 + int64_t(rng() % 100);
        const std::vector<float> k = random(n_prompt * 3 * 32), val = random(n_prompt * 3 * 32);
        store.append(0, make_view(k.data(), DType::kF32, {n_prompt, 3, 32}),
                     make_view(val.data(), DType::kF32, {n_prompt, 3, 32}));
        const float scale = 0.07f;  // the model's, not 1/sqrt(head_dim)
        DecodePolicy policy(config, store, scale);
        std::optional<Preselected> pre;
        if (v.preselect) {
          const std::vector<float> window = random(8 * 6 * 32);
          const TensorView wq = make_view(window.data(), DType::kF32, {8, 6, 32});
          policy.on_prefill_end(0, wq);
          SnapKVParams params;  // the config's preselect defaults, the model's scale
          params.scale = scale;
          const Partition part = store.partition(0);
          pre = Preselected{preselect_blocks(block_votes(snapkv_token_votes(store, 0, wq, params), 3, part, 8), 3,
                                             part, 12, v.mode, config.budget),
                            12, part.end_ranked_block};
        }
        for (int64_t step = 0; step < 3; ++step) {
          const std::vector<float> kt = random(3 * 32), vt = random(3 * 32);
          store.append(0, make_view(kt.data(), DType::kF32, {1, 3, 32}), make_view(vt.data(), DType::kF32, {1, 3, 32}));
          const std::vector<float> q = random(6 * 32);
          const TensorView qv = make_view(q.data(), DType::kF32, {6, 32});
          std::vector<float> out(6 * 32), lse(6);
          {
            // 1 or 3 threads: heads attended from the scoring tasks or not, the same bits.
            const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, step % 2 == 0 ? 3 : 1);
            policy.decode(0, step, qv, include_local, make_mutable_view(out.data(), DType::kF32, {6, 32}),
                          make_mutable_view(lse.data(), DType::kF32, {6}));
          }
          ASSERT_TRUE(policy.last_stats().reselected);
          std::mutex told_mutex;
          std::vector<int> calls(3, 0);
          std::vector<std::vector<TokenSpan>> told(3);
          const Selection expected =
              select_blocks(store, 0, qv, SelectSpec::from_config(config, include_local, scale),
                            pre ? &*pre : nullptr, nullptr, [&](int h, const std::vector<TokenSpan>& spans) {
                              const std::lock_guard<std::mutex> lock(told_mutex);
                              ++calls.at(size_t(h));
                              told.at(size_t(h)) = spans;
                            });
          EXPECT_EQ(policy.last_selection().spans, expected.spans) << "step " << step;
          // head_selected: once per head with the spans returned where each
          // head chooses from its own scores, never otherwise.
          const bool per_head = v.mode == HeadSelectMode::kSeparate &&
                                v.budget == BudgetConfig::Policy::kUniform && !v.preselect;
          for (int h = 0; h < 3; ++h) {
            EXPECT_EQ(calls[size_t(h)], per_head ? 1 : 0) << "kv head " << h;
            if (per_head) {
              EXPECT_EQ(told[size_t(h)], expected.spans[size_t(h)]) << "kv head " << h;
            }
          }
          // The policy's attention is decode_attention's over that selection, bit for bit.
          std::vector<float> want_out(6 * 32), want_lse(6);
          cpu::DecodeAttentionParams params;
          params.scale = scale;
          cpu::decode_attention(store, 0, qv, expected, params,
                                make_mutable_view(want_out.data(), DType::kF32, {6, 32}),
                                make_mutable_view(want_lse.data(), DType::kF32, {6}));
          EXPECT_EQ(std::memcmp(out.data(), want_out.data(), out.size() * sizeof(float)), 0) << "step " << step;
          EXPECT_EQ(std::memcmp(lse.data(), want_lse.data(), lse.size() * sizeof(float)), 0) << "step " << step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace longctx::policy
