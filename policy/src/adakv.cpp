// Ada-KV adaptive budgets, kvpress form (policy/adakv.h): per-head floors
// first, then the global top of what remains.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/policy/adakv.h"

namespace longctx::policy {
namespace {

// The rank order of adakv.h as one unsigned key, smaller first: the score
// (larger first, -0 == +0, NaN last) in the high half, then the entry's
// place h * n_per_head + index (lower head, then lower index). Selecting on
// it is an nth_element over integers, not a sort by a comparison of three fields.
uint64_t rank_key(float score, uint64_t place) {
  uint32_t order = 0xFFFFFFFFu;  // NaN
  if (!std::isnan(score)) {
    const uint32_t bits = std::bit_cast<uint32_t>(score == 0.f ? 0.f : score);
    const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;  // as the float grows
    order = ~ascending;  // larger first; below NaN's, as -inf's order is 0xFF800000
  }
  return uint64_t(order) << 32 | place;
}

bool eligible(float score) { return !(std::isinf(score) && score < 0.f); }

// Moves the `k` first keys in rank order to the front of `keys` (in any order).
void take_best(std::vector<uint64_t>& keys, int64_t k) {
  if (k > 0 && k < int64_t(keys.size())) std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end());
}

}  // namespace

std::vector<std::vector<int64_t>> adakv_select(const float* scores, int n_heads, int64_t n_per_head,
                                               int64_t per_head_budget, double alpha, int64_t total_budget) {
  if (n_heads < 1) fail(ErrorCode::kInvalidArgument, "adakv_select: n_heads is ", n_heads, ", must be >= 1");
  if (n_per_head < 0)
    fail(ErrorCode::kInvalidArgument, "adakv_select: n_per_head is ", n_per_head, ", must be >= 0");
  if (per_head_budget < 0)
    fail(ErrorCode::kInvalidArgument, "adakv_select: per-head budget is ", per_head_budget, ", must be >= 0");
  if (!(alpha >= 0.0 && alpha <= 1.0))
    fail(ErrorCode::kInvalidArgument, "adakv_select: alpha (budget.alpha) is ", alpha, ", must be in [0, 1]");
  if (scores == nullptr && n_per_head > 0)
    fail(ErrorCode::kInvalidArgument, "adakv_select: scores is null for ", n_heads, " x ", n_per_head, " entries");
  if (uint64_t(n_heads) * uint64_t(n_per_head) > 0xFFFFFFFFu)
    fail(ErrorCode::kInvalidArgument, "adakv_select: ", n_heads, " x ", n_per_head, " entries, more than 2^32 - 1");

  const int64_t budget = std::min(per_head_budget, n_per_head);
  // With a total, the floors are at most alpha of its share per head: their sum stays within it.
  double floor_share = alpha * double(budget);
  if (total_budget >= 0) floor_share = std::min(floor_share, alpha * double(total_budget) / n_heads);
  const auto floor_budget = static_cast<int64_t>(std::floor(floor_share));

  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(n_heads));
  const auto choose = [&](uint64_t key) {
    const uint64_t place = key & 0xFFFFFFFFu;
    chosen[size_t(place / uint64_t(n_per_head))].push_back(int64_t(place % uint64_t(n_per_head)));
  };
  std::vector<uint64_t> remaining;  // eligible entries not taken by a floor, all heads
  remaining.reserve(size_t(n_heads) * size_t(n_per_head));
  int64_t n_eligible = 0;
  std::vector<uint64_t> head_keys;
  for (int h = 0; h < n_heads; ++h) {
    head_keys.clear();
    const float* row = scores + size_t(h) * size_t(n_per_head);
    for (int64_t i = 0; i < n_per_head; ++i)
      if (eligible(row[i])) head_keys.push_back(rank_key(row[i], uint64_t(h) * uint64_t(n_per_head) + uint64_t(i)));
    n_eligible += int64_t(head_keys.size());
    const int64_t floor_h = std::min<int64_t>(floor_budget, int64_t(head_keys.size()));
    take_best(head_keys, floor_h);
    for (int64_t j = 0; j < floor_h; ++j) choose(head_keys[size_t(j)]);
    remaining.insert(remaining.end(), head_keys.begin() + floor_h, head_keys.end());
  }

  int64_t total = std::min(int64_t(n_heads) * budget, n_eligible);
  if (total_budget >= 0) total = std::min(total, total_budget);
  int64_t taken = 0;
  for (const auto& c : chosen) taken += int64_t(c.size());
  const int64_t rest = total - taken;  // >= 0: each floor_h <= budget, and their sum <= total_budget
  take_best(remaining, rest);
  for (int64_t j = 0; j < rest; ++j) choose(remaining[size_t(j)]);

  for (auto& c : chosen) std::sort(c.begin(), c.end());
  return chosen;
}

std::vector<int64_t> adakv_budgets(const float* scores, int n_heads, int64_t n_per_head, int64_t per_head_budget,
                                   double alpha) {
  const auto chosen = adakv_select(scores, n_heads, n_per_head, per_head_budget, alpha);
  std::vector<int64_t> counts;
  counts.reserve(chosen.size());
  for (const auto& c : chosen) counts.push_back(int64_t(c.size()));
  return counts;
}

}  // namespace longctx::policy
