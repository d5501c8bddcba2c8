// Ada-KV adaptive budgets, kvpress form (policy/adakv.h): per-head floors
// first, then the global top of what remains.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/policy/adakv.h"

namespace longctx::policy {
namespace {

struct Entry {
  float score;
  int head;
  int64_t index;
};

// The rank order of adakv.h: larger score first (-0 == +0), NaN last, then
// lower head, then lower index. A strict weak ordering.
bool ranks_before(const Entry& a, const Entry& b) {
  const bool a_nan = std::isnan(a.score), b_nan = std::isnan(b.score);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.score != b.score) return a.score > b.score;
  if (a.head != b.head) return a.head < b.head;
  return a.index < b.index;
}

bool eligible(float score) { return !(std::isinf(score) && score < 0.f); }

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

  const int64_t budget = std::min(per_head_budget, n_per_head);
  // With a total, the floors are at most alpha of its share per head: their sum stays within it.
  double floor_share = alpha * double(budget);
  if (total_budget >= 0) floor_share = std::min(floor_share, alpha * double(total_budget) / n_heads);
  const auto floor_budget = static_cast<int64_t>(std::floor(floor_share));

  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(n_heads));
  std::vector<Entry> remaining;  // eligible entries not taken by a floor, all heads
  int64_t n_eligible = 0;
  std::vector<Entry> head_entries;
  for (int h = 0; h < n_heads; ++h) {
    head_entries.clear();
    const float* row = scores + size_t(h) * size_t(n_per_head);
    for (int64_t i = 0; i < n_per_head; ++i)
      if (eligible(row[i])) head_entries.push_back({row[i], h, i});
    n_eligible += int64_t(head_entries.size());
    const int64_t floor_h = std::min<int64_t>(floor_budget, int64_t(head_entries.size()));
    std::partial_sort(head_entries.begin(), head_entries.begin() + floor_h, head_entries.end(), ranks_before);
    for (int64_t j = 0; j < floor_h; ++j) chosen[size_t(h)].push_back(head_entries[size_t(j)].index);
    remaining.insert(remaining.end(), head_entries.begin() + floor_h, head_entries.end());
  }

  int64_t total = std::min(int64_t(n_heads) * budget, n_eligible);
  if (total_budget >= 0) total = std::min(total, total_budget);
  int64_t taken = 0;
  for (const auto& c : chosen) taken += int64_t(c.size());
  const int64_t rest = total - taken;  // >= 0: each floor_h <= budget, and their sum <= total_budget
  std::partial_sort(remaining.begin(), remaining.begin() + rest, remaining.end(), ranks_before);
  for (int64_t j = 0; j < rest; ++j) chosen[size_t(remaining[size_t(j)].head)].push_back(remaining[size_t(j)].index);

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
