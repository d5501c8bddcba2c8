// score_blocks against the fp64 reference of tests/cpu/reference.h, on every
// Highway target, every representative type, storage dtype and GQA setting.
//
// Tolerance of one block score: the kernel accumulates in fp32 dot products of
// length L (head_dim, or 2*head_dim for QUEST's max|min pair), may first sum
// the g query heads of a group (fp32), and reduces over R slots; each step
// adds at most eps32 relative error of the magnitudes involved, so
//   |kernel - reference| <= (L + g + R + 4) * eps32 * sum_h,j,c |q_hc| |rep_jc|.
// MEAN's stored representative is itself an fp32 running sum divided by n and
// rounded to kv_type, which adds per channel (n + 2) * eps32 * mean_t(|k_tc|) +
// u_kv * |mean_c| (n <= block_size tokens; u_kv: unit roundoff of kv_type)
// to what the reference, built from the stored keys, sees. q8_0 stores keep
// their representatives in q8_0, quantized from the dequantized keys the
// reference sees: each value is off by less than its group's scale (max |x|
// of the group / 127, rounded up to f16), so sum |q_hc| * scale more. They
// are scored in integers against the prepared query in 16-bit codes per 32
// (quantize_act_blocks, quant_dot.h), each off by at most 2^-16 of its
// group's largest |x|, so 2^-15 * sum over groups of (sum_h max_group |q_h|)
// * sum_c |rep_c| more (twice the bound: the roundings of the scale and of
// x / scale too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include <tbb/task_arena.h>

#include "error_message.h"
#include "hwy/targets.h"
#include "longctx/core/error.h"
#include "longctx/cpu/selection.h"
#include "reference.h"
#include "store_fixture.h"
#include "../../cpu/src/quant_dot.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

using testing::ForcedHighwayTarget;
using testing::StoreCase;
using testing::TestStore;
using RT = RepresentativeType;

constexpr double kEps32 = 0x1p-23;

// Unit roundoff of the representatives' dtype (kv_type; q8_0's codes are bounded apart).
double rep_unit_roundoff(DType kv_type) {
  switch (kv_type) {
    case DType::kF32: return 0x1p-24;
    case DType::kF16: return 0x1p-11;
    case DType::kBF16: return 0x1p-8;
    case DType::kQ8_0: return 0;  // the codes' error is added in expected_scores
  }
  return 1;
}

// What scoring a q8_0 record's slot in integers can add to the error (see
// the top): the prepared query of the group is the sum, or one, of the
// group's heads, each element with a 16-bit code off by at most 2^-16 of its
// group of 32's largest; the slot's values are the reference's, each within
// `slot_scale(group)` of the stored one.
double query_code_error(const std::vector<std::vector<double>>& q_group, const std::vector<double>& slot,
                        const std::function<double(int)>& slot_scale) {
  double error = 0.0;
  for (int g0 = 0; g0 < int(slot.size()); g0 += 32) {
    double q_max = 0.0;  // bounds the largest |prepared query| of the group
    for (const auto& qh : q_group) {
      double head_max = 0.0;
      for (int ch = g0; ch < g0 + 32; ++ch) head_max = std::max(head_max, std::abs(qh[size_t(ch)]));
      q_max += head_max;
    }
    double slot_sum = 0.0;
    for (int ch = g0; ch < g0 + 32; ++ch) slot_sum += std::abs(slot[size_t(ch)]) + slot_scale(g0);
    error += 0x1p-15 * q_max * slot_sum;
  }
  return error;
}

// The largest |x| of slot[g0, g0 + 32) / 127, rounded up to f16 (a bound on the q8_0 scale).
double q8_group_scale(const std::vector<double>& slot, int g0) {
  double amax = 0.0;
  for (int ch = g0; ch < g0 + 32; ++ch) amax = std::max(amax, std::abs(slot[size_t(ch)]));
  return amax / 127.0 * (1.0 + 0x1p-10);
}

// Forces each Highway target in turn (those this CPU runs), then Highway's own choice (0).
std::vector<int64_t> targets_to_test() {
  std::vector<int64_t> targets;
  for (const int64_t target : {int64_t{HWY_AVX3}, int64_t{HWY_AVX2}, int64_t{HWY_SSE4}, int64_t{HWY_SCALAR}}) {
    const std::vector<int64_t> available = hwy::SupportedAndGeneratedTargets();
    if (std::find(available.begin(), available.end(), target) != available.end()) {
      targets.push_back(target);
    } else {
      std::printf("[ note ] Highway target %s not supported here, not tested\n", hwy::TargetName(target));
    }
  }
  targets.push_back(0);
  return targets;
}

// A random case of `type` and `dtype`: lengths 1, block_size +- 1, primes,
// many blocks; partitions with and without initial tokens and local window.
StoreCase random_case(RT type, DType dtype, std::mt19937& rng) {
  const auto pick = [&rng](std::initializer_list<int> values) {
    return *(values.begin() + rng() % values.size());
  };
  StoreCase c;
  c.type = type;
  c.kv_type = dtype;
  c.n_kv_heads = pick({1, 2, 3});
  c.head_dim = dtype == DType::kQ8_0 ? pick({32, 64, 128, 256})  // q8_0: multiples of 32
                                     : pick({40, 64, 128, 256}); // 40: a tail on 16-lane targets
  c.block_size = pick({4, 16, 32, 128});
  c.rep_num = type == RT::kFix || type == RT::kDynamic ? std::min(c.block_size, pick({1, 3, 4, 6})) : 2;
  const int bs = c.block_size;
  c.n_tokens = pick({1, bs - 1, bs, bs + 1, 2 * bs + 1, 211, 257, 37 * bs + 5});
  if (c.block_size == 4 && rng() % 2 == 0) c.n_tokens = 1500 + rng() % 300;  // crosses rep pages
  c.n_tokens = std::max<int64_t>(c.n_tokens, 1);
  c.initial_len = pick({0, 0, 1, bs / 2, bs, 3 * bs / 2 + 1});
  c.local_windows_len = pick({0, 0, 1, bs - 1, 2 * bs});
  return c;
}

// Random f32 query [n_q_heads, head_dim] with rows `row_stride` apart (> head_dim: strided rows).
struct Query {
  std::vector<float> data;
  TensorView view;
  std::vector<std::vector<double>> rows;
};

Query random_query(int n_q_heads, int head_dim, std::mt19937& rng) {
  const int64_t row_stride = head_dim + (rng() % 2 == 0 ? 0 : 8);
  std::normal_distribution<float> normal(0.f, 1.f);
  Query q;
  q.data.assign(size_t(n_q_heads) * size_t(row_stride), std::nanf(""));  // the gaps must not be read
  q.rows.assign(size_t(n_q_heads), std::vector<double>(size_t(head_dim)));
  for (int h = 0; h < n_q_heads; ++h)
    for (int c = 0; c < head_dim; ++c) q.rows[size_t(h)][size_t(c)] = q.data[size_t(h * row_stride + c)] = normal(rng);
  q.view = make_view(q.data.data(), DType::kF32, {n_q_heads, head_dim});
  q.view.strides = {row_stride, 1};
  return q;
}

// The rows of kv head h's `group` query heads.
std::vector<std::vector<double>> group_rows(const Query& q, int h, int group) {
  return {q.rows.begin() + h * group, q.rows.begin() + (h + 1) * group};
}

// Representatives of every (kv head, context block) of the test store, from the stored keys.
struct StoreReference {
  std::vector<std::vector<std::vector<std::vector<double>>>> reps;  // [head][block - first][slot][channel]
  std::vector<std::vector<std::vector<double>>> mean_abs;           // MEAN: [head][block - first][channel]
};

StoreReference reference_of(const TestStore& ts) {
  const kvstore::KVStore& store = ts.store();
  const StoreCase& c = ts.config();
  const kvstore::Partition part = store.partition(TestStore::kLayer);
  StoreReference ref;
  ref.reps.resize(size_t(c.n_kv_heads));
  ref.mean_abs.resize(size_t(c.n_kv_heads));
  for (int h = 0; h < c.n_kv_heads; ++h) {
    for (int64_t b = part.first_context_block; b < part.end_context_block; ++b) {
      const auto keys = score_ref::stored_block_keys(store, TestStore::kLayer, h, b);
      ref.reps[size_t(h)].push_back(
          score_ref::representatives(c.type, keys, c.block_size, c.rep_num, ts.block_importance(h, b)));
      std::vector<double> mean_abs(size_t(c.head_dim), 0.0);
      for (const auto& k : keys)
        for (size_t i = 0; i < k.size(); ++i) mean_abs[i] += std::abs(k[i]) / double(keys.size());
      ref.mean_abs[size_t(h)].push_back(mean_abs);
    }
  }
  return ref;
}

struct Expected {
  std::vector<double> score;      // [head][block]
  std::vector<double> tolerance;  // [head][block]
};

Expected expected_scores(const TestStore& ts, const StoreReference& ref, const Query& q, const ScoreParams& params) {
  const StoreCase& c = ts.config();
  const int group = int(q.rows.size()) / c.n_kv_heads;
  const int slot_len = c.type == RT::kQuest ? 2 * c.head_dim : c.head_dim;
  Expected e;
  for (int h = 0; h < c.n_kv_heads; ++h) {
    const std::vector<std::vector<double>> q_group = group_rows(q, h, group);
    for (size_t i = 0; i < ref.reps[size_t(h)].size(); ++i) {
      const auto& reps = ref.reps[size_t(h)][i];
      const score_ref::BlockScore s =
          score_ref::block_score(c.type, reps, q_group, params.gqa_reduce, params.dynamic_reduce);
      double tolerance = double(slot_len + group + int(reps.size()) + 4) * kEps32 * s.magnitude;
      if (c.kv_type == DType::kQ8_0) {
        // q8_0 records (kv_store.h): each slot value is off by less than its
        // group's scale, at most max |x| of the group / 127 rounded up to f16.
        for (const auto& slot : reps) {
          const auto scale = [&slot](int g0) { return q8_group_scale(slot, g0); };
          for (int g0 = 0; g0 < c.head_dim; g0 += 32)
            for (const auto& qh : q_group)
              for (int ch = g0; ch < g0 + 32; ++ch) tolerance += std::abs(qh[size_t(ch)]) * scale(g0);
          tolerance += query_code_error(q_group, slot, scale);
        }
      }
      if (c.type == RT::kMean) {
        for (const auto& qh : q_group)
          for (int ch = 0; ch < c.head_dim; ++ch)
            tolerance += std::abs(qh[size_t(ch)]) *
                         ((double(c.block_size) + 2) * kEps32 * ref.mean_abs[size_t(h)][i][size_t(ch)] +
                          rep_unit_roundoff(c.kv_type) * std::abs(reps[0][size_t(ch)]));
      }
      e.score.push_back(s.score);
      e.tolerance.push_back(tolerance);
    }
  }
  return e;
}

TEST(ScoreBlocks, MatchesFp64ReferenceForEveryTypeDtypeGqaAndTarget) {
  std::mt19937 rng(test_seed(20240611));
  const std::vector<int64_t> targets = targets_to_test();
  std::vector<StoreCase> cases;
  // Partial last blocks in the context: FIX with 2 of 4 slots valid, DYNAMIC with 3 of 6.
  cases.push_back({RT::kFix, DType::kF16, 2, 64, 16, 4, 0, 0, 16 * 5 + 5});
  cases.push_back({RT::kDynamic, DType::kBF16, 2, 128, 16, 6, 16, 0, 16 * 3 + 3});
  // Pieces crossing rep pages (2 KiB and 4 KiB records: 32 and 15 per page),
  // the second ending in a partial block with 3 of 4 FIX slots valid.
  cases.push_back({RT::kQuest, DType::kF32, 2, 256, 16, 2, 0, 0, 16 * 70 + 7});
  cases.push_back({RT::kFix, DType::kF32, 1, 256, 8, 4, 0, 0, 8 * 40 + 3});
  for (const RT type : {RT::kMax, RT::kMean, RT::kQuest, RT::kFix, RT::kDynamic})
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0})
      for (int i = 0; i < 2; ++i) cases.push_back(random_case(type, dtype, rng));

  int blocks_checked = 0;
  for (const StoreCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const TestStore ts(c, rng);
    const kvstore::Partition part = ts.store().partition(TestStore::kLayer);
    const int64_t n_context = part.end_context_block - part.first_context_block;
    const StoreReference ref = reference_of(ts);
    const bool slotted = c.type == RT::kFix || c.type == RT::kDynamic;

    for (const int group : {1 << (rng() % 2), 4 << (rng() % 2)}) {
      const Query q = random_query(c.n_kv_heads * group, c.head_dim, rng);
      for (const Reduce gqa : {Reduce::kSum, Reduce::kMax}) {
        for (const Reduce dynamic : {Reduce::kMax, Reduce::kMean}) {
          if (!slotted && dynamic == Reduce::kMean) continue;
          SCOPED_TRACE(str_cat("g=", group, " gqa=", reduce_name(gqa), " dynamic=", reduce_name(dynamic)));
          const ScoreParams params{gqa, dynamic};
          const Expected e = expected_scores(ts, ref, q, params);
          for (const int64_t target : targets) {
            SCOPED_TRACE(target == 0 ? "default dispatch" : hwy::TargetName(target));
            const ForcedHighwayTarget forced(target);
            std::vector<float> scores(size_t(c.n_kv_heads * n_context), std::nanf(""));
            score_blocks(ts.store(), TestStore::kLayer, q.view, params,
                         make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}));
            for (size_t i = 0; i < scores.size(); ++i) {
              ASSERT_NEAR(scores[i], e.score[i], e.tolerance[i])
                  << "kv head " << i / size_t(n_context) << ", block " << part.first_context_block + int64_t(i % size_t(n_context));
            }
            blocks_checked += int(scores.size());
          }
        }
      }
    }
  }
  EXPECT_GT(blocks_checked, 10000);  // the cases do reach the context blocks
}

// QUEST's score of a block is at least q.k of every key it holds (summed over
// the query heads of the group), up to the fp32 accumulation error; on q8_0
// too, whose records round the extremes outward for that.
TEST(ScoreBlocks, QuestBoundsEveryKeyOfTheBlock) {
  std::mt19937 rng(test_seed(77));
  int bounded = 0;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    for (int i = 0; i < 4; ++i) {
      StoreCase c = random_case(RT::kQuest, dtype, rng);
      // One case of one-token blocks, where the bound is q.k itself and a
      // slot rounded inward would break it.
      if (i == 3) c.block_size = 1, c.n_tokens = 300;
      c.initial_len = 0;
      c.local_windows_len = 0;
      SCOPED_TRACE(c.describe());
      const TestStore ts(c, rng);
      const int group = 1 << (rng() % 4);
      const Query q = random_query(c.n_kv_heads * group, c.head_dim, rng);
      const int64_t n_blocks = ts.store().n_blocks(TestStore::kLayer);
      std::vector<float> scores(size_t(c.n_kv_heads * n_blocks));
      score_blocks(ts.store(), TestStore::kLayer, q.view, ScoreParams{},
                   make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_blocks}));
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int64_t b = 0; b < n_blocks; ++b) {
          const auto keys = score_ref::stored_block_keys(ts.store(), TestStore::kLayer, h, b);
          const auto reps = score_ref::representatives(RT::kQuest, keys, c.block_size, c.rep_num, {});
          double magnitude = 0;  // of the kernel's sums: sum_g,c |q_gc| (|max_c| + |min_c|)
          for (int g = 0; g < group; ++g)
            for (int ch = 0; ch < c.head_dim; ++ch)
              magnitude += std::abs(q.rows[size_t(h * group + g)][size_t(ch)]) *
                           (std::abs(reps[0][size_t(ch)]) + std::abs(reps[1][size_t(ch)]));
          double slack = double(2 * c.head_dim + group + 5) * kEps32 * magnitude;
          if (dtype == DType::kQ8_0) {
            const std::vector<std::vector<double>> q_group = group_rows(q, h, group);
            for (const auto& slot : reps)
              slack += query_code_error(q_group, slot, [&slot](int g0) { return q8_group_scale(slot, g0); });
          }
          for (const auto& key : keys) {
            double dot = 0;
            for (int g = 0; g < group; ++g)
              for (int ch = 0; ch < c.head_dim; ++ch) dot += q.rows[size_t(h * group + g)][size_t(ch)] * key[size_t(ch)];
            ASSERT_GE(double(scores[size_t(h * n_blocks + b)]), dot - slack) << "kv head " << h << " block " << b;
            ++bounded;
          }
        }
      }
    }
  }
  EXPECT_GT(bounded, 1000);
}

// A q8_0 block of a key A and 0.5 A: its channel-wise max is A's value where
// A > 0 and its min A's where A < 0, so for q = A the bound is exactly q.A,
// and the slots mix the two keys' scales: only extremes rounded outward keep
// the score at or above q.A (rounded to nearest, about half the blocks fall below).
TEST(ScoreBlocks, Q8QuestBoundHoldsWhereItIsTight) {
  constexpr int kDim = 64, kBlocks = 200;
  LongContextConfig config;
  config.block_size = 2;
  config.kv_type = DType::kQ8_0;
  config.representative_type = RT::kQuest;
  config.max_seq_len = 2 * kBlocks;
  config.initial_len = 0;
  config.local_windows_len = 0;
  const auto topology = kvstore::NumaTopology::detect();
  kvstore::MemoryBudget budget(uint64_t{1} << 30);
  kvstore::KVStore store({1, 1, kDim}, config, budget, topology);
  std::mt19937 rng(test_seed(31));
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t(2 * kBlocks) * kDim), v(k.size());
  for (int b = 0; b < kBlocks; ++b)
    for (int c = 0; c < kDim; ++c) {
      const float a = normal(rng) * (c % 7 == 0 ? 8.f : 1.f);  // a few larger channels: groups of other scales
      k[size_t(2 * b) * kDim + c] = a;
      k[size_t(2 * b + 1) * kDim + c] = 0.5f * a;
    }
  for (float& x : v) x = normal(rng);
  store.append(0, make_view(k.data(), DType::kF32, {2 * kBlocks, 1, kDim}),
               make_view(v.data(), DType::kF32, {2 * kBlocks, 1, kDim}));
  int at_or_above = 0;
  for (int b = 0; b < kBlocks; ++b) {
    std::vector<float> a(kDim);  // A as stored, the query
    kvstore::read_keys_t(store.layout(), store.block(0, 0, b), 0, 1, a.data(), 1);
    std::vector<float> scores(kBlocks);
    score_blocks(store, 0, make_view(a.data(), DType::kF32, {1, kDim}), ScoreParams{},
                 make_mutable_view(scores.data(), DType::kF32, {1, kBlocks}));
    const float score = scores[size_t(b)];
    double dot = 0.0, magnitude = 0.0;
    for (const float x : a) dot += double(x) * x, magnitude += double(x) * x;
    const std::vector<double> slot(a.begin(), a.end());  // the block's max and min, up to its scale
    const auto scale = [&slot](int g0) { return q8_group_scale(slot, g0); };
    const double slack = double(2 * kDim + 6) * kEps32 * 2.0 * magnitude + 2.0 * query_code_error({slot}, slot, scale);
    ASSERT_GE(double(score), dot - slack) << "block " << b;
    at_or_above += score >= dot;
  }
  EXPECT_GT(at_or_above, kBlocks / 2);
}

// q8_0 scores against the values the records hold (codes times f16 scales,
// read from the record bytes): the fp64 test above allows for the keys'
// rounding to 8 bits, about 1/254 of each group's largest, which would hide
// an error of the integer kernel far larger than its query codes' 2^-16; here
// only the fp32 accumulation and those codes are allowed for.
TEST(ScoreBlocks, Q8ScoresMatchTheStoredCodes) {
  std::mt19937 rng(test_seed(9));
  const std::vector<int64_t> targets = targets_to_test();
  int blocks_checked = 0;
  for (const RT type : {RT::kQuest, RT::kMax, RT::kMean, RT::kFix, RT::kDynamic}) {
    for (int i = 0; i < 2; ++i) {
      const StoreCase c = random_case(type, DType::kQ8_0, rng);
      SCOPED_TRACE(c.describe());
      const TestStore ts(c, rng);
      const kvstore::KVStore& store = ts.store();
      const kvstore::Partition part = store.partition(TestStore::kLayer);
      const int64_t n_context = part.end_context_block - part.first_context_block;
      const int dim = c.head_dim;
      const int stored_slots = store.layout().rep_slots;
      // stored[h][block - first][slot][channel]
      std::vector<std::vector<std::vector<std::vector<double>>>> stored(size_t(c.n_kv_heads));
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int64_t b = part.first_context_block; b < part.end_context_block; ++b) {
          const std::byte* record = store.rep_record(TestStore::kLayer, h, b);
          const auto* codes = reinterpret_cast<const int8_t*>(record);
          const auto* scales = reinterpret_cast<const uint16_t*>(record + size_t(stored_slots) * size_t(dim));
          const int valid = type == RT::kQuest ? 2 : store.valid_rep_slots(TestStore::kLayer, h, b);
          std::vector<std::vector<double>> slots(size_t(valid), std::vector<double>(size_t(dim), 0.0));
          for (int j = 0; j < valid; ++j)
            for (int ch = 0; ch < dim; ++ch)
              slots[size_t(j)][size_t(ch)] = double(codes[j * dim + ch]) * f16_bits_to_f32(scales[(j * dim + ch) / 32]);
          stored[size_t(h)].push_back(std::move(slots));
        }
      }
      const bool slotted = type == RT::kFix || type == RT::kDynamic;
      for (const int group : {1, 4}) {
        const Query q = random_query(c.n_kv_heads * group, dim, rng);
        for (const Reduce gqa : {Reduce::kSum, Reduce::kMax}) {
          for (const Reduce dynamic : {Reduce::kMax, Reduce::kMean}) {
            if (!slotted && dynamic == Reduce::kMean) continue;
            SCOPED_TRACE(str_cat("g=", group, " gqa=", reduce_name(gqa), " dynamic=", reduce_name(dynamic)));
            std::vector<double> expected, tolerance;
            for (int h = 0; h < c.n_kv_heads; ++h) {
              const std::vector<std::vector<double>> q_group = group_rows(q, h, group);
              for (const auto& slots : stored[size_t(h)]) {
                const score_ref::BlockScore e = score_ref::block_score(type, slots, q_group, gqa, dynamic);
                double allowed = double(2 * dim + group + int(slots.size()) + 4) * kEps32 * e.magnitude;
                for (const auto& slot : slots) allowed += query_code_error(q_group, slot, [](int) { return 0.0; });
                expected.push_back(e.score);
                tolerance.push_back(allowed);
              }
            }
            for (const int64_t target : targets) {
              SCOPED_TRACE(target == 0 ? "default dispatch" : hwy::TargetName(target));
              const ForcedHighwayTarget forced(target);
              std::vector<float> scores(size_t(c.n_kv_heads * n_context), std::nanf(""));
              score_blocks(store, TestStore::kLayer, q.view, ScoreParams{gqa, dynamic},
                           make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}));
              for (size_t k = 0; k < scores.size(); ++k) {
                const int64_t block = part.first_context_block + int64_t(k % size_t(n_context));
                ASSERT_NEAR(scores[k], expected[k], tolerance[k]) << "kv head " << k / size_t(n_context) << ", block "
                                                                  << block;
              }
              blocks_checked += int(scores.size());
            }
          }
        }
      }
    }
  }
  EXPECT_GT(blocks_checked, 1000);
}

// The 16-bit query codes of q8_0 scoring: per 32 values the largest |x|
// gets code +-32767, every value is within half a scale of code * scale (up
// to the f32 roundings of the scale and of x / scale), a zero group is all
// zero codes, and a group holding NaN or Inf gets a NaN scale, its
// neighbours unchanged.
TEST(ScoreBlocks, Q8QueryCodesAreWithinHalfAScale) {
  std::mt19937 rng(test_seed(404));
  std::normal_distribution<float> normal;
  constexpr int kLen = 256, kRows = 3, kGroups = kRows * kLen / 32;
  // One group's codes and scale against its values.
  const auto check_group = [](const float* x, const int16_t* codes, float scale) {
    float amax = 0.f;
    int largest_code = 0;
    for (int i = 0; i < 32; ++i) {
      amax = std::max(amax, std::abs(x[i]));
      largest_code = std::max(largest_code, std::abs(int(codes[i])));
    }
    ASSERT_FLOAT_EQ(scale, amax / 32767.f);
    if (amax < std::numeric_limits<float>::min()) {  // zero or subnormal: zero codes
      ASSERT_EQ(largest_code, 0);
      return;
    }
    ASSERT_EQ(largest_code, 32767);
    // x * (32767 / amax) and the scale are f32: each adds up to 32767 * 2^-24 codes.
    for (int i = 0; i < 32; ++i)
      ASSERT_LE(std::abs(double(codes[i]) * scale - x[i]), (0.5 + 0x1p-7) * double(scale)) << "value " << i;
  };
  const std::vector<int64_t> targets = targets_to_test();
  for (int round = 0; round < 50; ++round) {
    std::vector<float> x(size_t(kRows) * kLen);
    const float magnitude = std::ldexp(1.f, int(rng() % 60) - 30);
    for (float& v : x) v = normal(rng) * magnitude;
    std::fill_n(x.begin() + 32, 32, 0.f);  // group 1: zeros
    std::fill_n(x.begin() + 64, 32, 0.f);  // group 2: one value
    x[64 + rng() % 32] = -magnitude;
    std::fill_n(x.begin() + 96, 32, 0.f);  // group 3: subnormal, zero codes
    x[96 + rng() % 32] = 0x1p-140f;
    const int bad_group = round % 2 == 1 ? 4 + int(rng() % (kGroups - 4)) : -1;
    if (bad_group >= 0) x[size_t(bad_group) * 32 + rng() % 32] = round % 4 == 1 ? std::nanf("") : -INFINITY;
    for (const int64_t target : targets) {
      const ForcedHighwayTarget forced(target);
      std::vector<int16_t> codes(x.size(), 7);
      std::vector<float> scales(kGroups, -1.f);
      detail::quantize_act_blocks(x.data(), kGroups, 32, codes.data(), scales.data());
      for (int g = 0; g < kGroups; ++g) {
        SCOPED_TRACE(str_cat(target == 0 ? "default dispatch" : hwy::TargetName(target), ", round ", round,
                             ", group ", g));
        if (g == bad_group) {
          EXPECT_TRUE(std::isnan(scales[size_t(g)]));
        } else {
          check_group(x.data() + 32 * g, codes.data() + 32 * g, scales[size_t(g)]);
        }
      }
    }
  }
}

TEST(ScoreBlocks, EmptyContextWritesNothing) {
  std::mt19937 rng(test_seed(5));
  StoreCase c;
  c.n_tokens = 20;
  c.initial_len = 8;
  c.local_windows_len = 16;  // everything is initial or local
  const TestStore ts(c, rng);
  ASSERT_EQ(ts.store().partition(TestStore::kLayer).end_context_block,
            ts.store().partition(TestStore::kLayer).first_context_block);
  const Query q = random_query(c.n_kv_heads, c.head_dim, rng);
  int calls = 0;
  score_blocks(ts.store(), TestStore::kLayer, q.view, ScoreParams{},
               make_mutable_view(nullptr, DType::kF32, {c.n_kv_heads, 0}), [&](int) { ++calls; });
  EXPECT_EQ(calls, 0);  // no row, no head_scored
}

// head_scored runs once per kv head, after the head's whole row is written:
// the row it sees is the final one. Arenas of 1, 2 and 4 threads cut each
// head's 600 blocks into 1 to 4 pieces.
TEST(ScoreBlocks, HeadScoredSeesEachCompleteRowOnce) {
  std::mt19937 rng(test_seed(8));
  StoreCase c;
  c.n_kv_heads = 4;
  c.n_tokens = 16 * 600 + 5;
  const TestStore ts(c, rng);
  const kvstore::Partition part = ts.store().partition(TestStore::kLayer);
  const int64_t n_context = part.end_context_block - part.first_context_block;
  const Query q = random_query(c.n_kv_heads * 2, c.head_dim, rng);
  for (const int threads : {1, 2, 4}) {
    SCOPED_TRACE(str_cat(threads, " threads"));
    std::vector<float> scores(size_t(c.n_kv_heads * n_context), std::nanf(""));
    std::vector<std::vector<float>> seen(size_t(c.n_kv_heads));
    std::vector<int> calls(size_t(c.n_kv_heads), 0);
    std::mutex mutex;
    tbb::task_arena(threads).execute([&] {
      score_blocks(ts.store(), TestStore::kLayer, q.view, ScoreParams{},
                   make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}), [&](int h) {
                     const float* row = scores.data() + size_t(h) * size_t(n_context);
                     const std::lock_guard<std::mutex> lock(mutex);
                     ++calls[size_t(h)];
                     seen[size_t(h)].assign(row, row + n_context);
                   });
    });
    for (int h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_EQ(calls[size_t(h)], 1) << "kv head " << h;
      const std::vector<float> row(scores.begin() + h * n_context, scores.begin() + (h + 1) * n_context);
      EXPECT_EQ(seen[size_t(h)], row) << "kv head " << h;  // no NaN left: every score written
    }
  }
}

// With `heads`, only the named rows are scored: each as the unmasked call
// scores it, head_scored for those heads alone, every other row untouched
// (the NaN it was filled with). Every subset of 4 heads, on 1 and 2 threads.
TEST(ScoreBlocks, ScoresOnlyTheNamedHeads) {
  std::mt19937 rng(test_seed(9));
  StoreCase c;
  c.n_kv_heads = 4;
  c.n_tokens = 16 * 300 + 7;
  const TestStore ts(c, rng);
  const kvstore::Partition part = ts.store().partition(TestStore::kLayer);
  const int64_t n_context = part.end_context_block - part.first_context_block;
  const Query q = random_query(c.n_kv_heads * 2, c.head_dim, rng);
  std::vector<float> all(size_t(c.n_kv_heads * n_context));
  score_blocks(ts.store(), TestStore::kLayer, q.view, ScoreParams{},
               make_mutable_view(all.data(), DType::kF32, {c.n_kv_heads, n_context}));
  for (const int threads : {1, 2}) {
    for (int mask = 0; mask < 1 << c.n_kv_heads; ++mask) {
      SCOPED_TRACE(str_cat(threads, " threads, heads mask ", mask));
      std::vector<uint8_t> heads(size_t(c.n_kv_heads));
      for (int h = 0; h < c.n_kv_heads; ++h) heads[size_t(h)] = uint8_t(mask >> h & 1);
      std::vector<float> scores(all.size(), std::nanf(""));
      std::vector<int> calls(size_t(c.n_kv_heads), 0);
      std::mutex mutex;
      tbb::task_arena(threads).execute([&] {
        score_blocks(ts.store(), TestStore::kLayer, q.view, ScoreParams{},
                     make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}), [&](int h) {
                       const std::lock_guard<std::mutex> lock(mutex);
                       ++calls[size_t(h)];
                     }, heads);
      });
      for (int h = 0; h < c.n_kv_heads; ++h) {
        EXPECT_EQ(calls[size_t(h)], heads[size_t(h)]) << "kv head " << h;
        for (int64_t i = 0; i < n_context; ++i) {
          const float got = scores[size_t(h * n_context + i)];
          if (heads[size_t(h)] != 0) {
            ASSERT_EQ(got, all[size_t(h * n_context + i)]) << "kv head " << h << ", block " << i;
          } else {
            ASSERT_TRUE(std::isnan(got)) << "kv head " << h << " was not to be scored, block " << i;
          }
        }
      }
    }
  }
  std::vector<float> scores(all.size());
  expect_error([&] {
    score_blocks(ts.store(), TestStore::kLayer, q.view, ScoreParams{},
                 make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n_context}), {}, {1, 0, 1});
  }, ErrorCode::kInvalidArgument, {"heads has 3 entries", "4 kv heads"});
}

TEST(ScoreBlocks, RejectsBadArguments) {
  std::mt19937 rng(test_seed(6));
  StoreCase c;
  c.n_tokens = 100;
  const TestStore ts(c, rng);
  const kvstore::Partition part = ts.store().partition(TestStore::kLayer);
  const int64_t n = part.end_context_block - part.first_context_block;
  std::vector<float> scores(size_t(c.n_kv_heads * n));
  const MutableTensorView out = make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n});
  const Query q = random_query(2 * c.n_kv_heads, c.head_dim, rng);
  const auto expect_invalid = [&](const TensorView& query, const MutableTensorView& result, const ScoreParams& params,
                                  int layer, const char* says = "score_blocks") {
    expect_error([&] { score_blocks(ts.store(), layer, query, params, result); }, ErrorCode::kInvalidArgument, {says});
  };
  expect_invalid(q.view, out, ScoreParams{}, 2);   // no layer 2
  expect_invalid(q.view, out, ScoreParams{}, -1);
  std::vector<float> q3(size_t(3 * c.head_dim), 1.f);  // 3 query heads for 2 kv heads
  expect_invalid(make_view(q3.data(), DType::kF32, {3, c.head_dim}), out, ScoreParams{}, 1);
  expect_invalid(make_view(q3.data(), DType::kF32, {1, c.head_dim}), out, ScoreParams{}, 1);  // fewer than kv heads
  expect_invalid(make_view(q3.data(), DType::kF32, {1, 3 * c.head_dim}), out, ScoreParams{}, 1,
                 "score_blocks: q: expected shape");
  expect_invalid(make_view(q3.data(), DType::kF16, {2, c.head_dim}), out, ScoreParams{}, 1,
                 "score_blocks: q: expected dtype f32");
  TensorView strided_inner = q.view;
  strided_inner.strides[1] = 2;
  expect_invalid(strided_inner, out, ScoreParams{}, 1, "score_blocks: q: innermost dimension");
  expect_invalid(q.view, make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads, n - 1}), ScoreParams{}, 1);
  expect_invalid(q.view, make_mutable_view(scores.data(), DType::kF16, {c.n_kv_heads, n}), ScoreParams{}, 1);
  expect_invalid(q.view, make_mutable_view(scores.data(), DType::kF32, {c.n_kv_heads * n}), ScoreParams{}, 1);
  expect_invalid(q.view, out, ScoreParams{Reduce::kMean, Reduce::kMax}, 1);
  expect_invalid(q.view, out, ScoreParams{Reduce::kSum, Reduce::kSum}, 1);
}

}  // namespace
}  // namespace longctx::cpu
