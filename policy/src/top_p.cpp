// choose_by_mass (policy/top_p.h): block counts from estimated attention mass.
#include "longctx/policy/top_p.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "longctx/core/error.h"
#include "longctx/policy/adakv.h"

namespace longctx::policy {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

bool excluded(float logit) { return std::isinf(logit) && logit < 0.f; }

// One head's weights normalised to its total: u[b] = w_b / W, and the fixed part's share.
struct Shares {
  std::vector<double> blocks;
  double fixed = 0.0;
};

Shares shares_of(const float* logits, int64_t n, const std::vector<int64_t>& tokens, double fixed_logsum) {
  double m = fixed_logsum;
  for (int64_t b = 0; b < n; ++b)
    if (!excluded(logits[b]) && tokens[size_t(b)] > 0) m = std::max(m, double(logits[b]));
  Shares s;
  s.blocks.assign(size_t(n), 0.0);
  if (m == kNegInf) return s;  // nothing to weigh: every share is 0
  double total = fixed_logsum == kNegInf ? 0.0 : std::exp(fixed_logsum - m);
  s.fixed = total;
  for (int64_t b = 0; b < n; ++b) {
    if (excluded(logits[b])) continue;
    s.blocks[size_t(b)] = double(tokens[size_t(b)]) * std::exp(double(logits[b]) - m);
    total += s.blocks[size_t(b)];
  }
  for (double& u : s.blocks) u /= total;
  s.fixed /= total;
  return s;
}

// The fewest eligible blocks, largest share first (ties: lower index), whose
// shares with `fixed` reach p, clamped; indices increasing. Sorts only as far
// as it must: a few times the blocks kept, not the whole row.
std::vector<int64_t> fewest_reaching(const std::vector<double>& share, const std::vector<char>& eligible, double fixed,
                                     const BudgetConfig& budget) {
  std::vector<int64_t> order;
  double total = fixed;
  for (int64_t b = 0; b < int64_t(share.size()); ++b)
    if (eligible[size_t(b)]) order.push_back(b), total += share[size_t(b)];
  const int64_t n = int64_t(order.size());
  const auto larger = [&](int64_t a, int64_t b) {
    return share[size_t(a)] > share[size_t(b)] || (share[size_t(a)] == share[size_t(b)] && a < b);
  };
  int64_t sorted = 0;  // order[0, sorted) is the best `sorted` blocks, best first
  const auto sort_best = [&](int64_t k) {
    if (k <= sorted) return;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), larger);
    sorted = k;
  };
  // p = 1 is every eligible block, those whose weight underflows to 0 too.
  // No more than max_blocks are kept: the search stops there.
  const int64_t limit = budget.max_blocks > 0 ? std::min(n, budget.max_blocks) : n;
  int64_t k = budget.p >= 1.0 ? n : 0;
  const double target = budget.p * total;  // the shares sum to 1 up to rounding
  double reached = fixed;
  for (int64_t want = std::min<int64_t>(limit, 64); k < limit && reached < target;
       want = std::min(limit, 4 * want)) {
    sort_best(want);
    while (k < want && reached < target) reached += share[size_t(order[size_t(k++)])];
  }
  k = std::max(k, budget.min_blocks);
  if (budget.max_blocks > 0) k = std::min(k, budget.max_blocks);
  k = std::min(k, n);
  if (k < n) sort_best(k);  // all n: any order, sorted below
  std::vector<int64_t> kept(order.begin(), order.begin() + k);
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace

MassChoice choose_by_mass(const std::vector<float>& logits, int n_kv_heads, int64_t n_context,
                          const std::vector<int64_t>& block_tokens, const std::vector<double>& fixed_logsum,
                          HeadSelectMode mode, const BudgetConfig& budget) {
  if (n_kv_heads < 1) fail(ErrorCode::kInvalidArgument, "choose_by_mass: n_kv_heads is ", n_kv_heads, ", must be >= 1");
  if (n_context < 0 || logits.size() != size_t(n_kv_heads) * size_t(n_context) ||
      block_tokens.size() != size_t(n_context) || fixed_logsum.size() != size_t(n_kv_heads))
    fail(ErrorCode::kInvalidArgument, "choose_by_mass: ", logits.size(), " logits, ", block_tokens.size(),
         " block sizes and ", fixed_logsum.size(), " fixed parts for ", n_kv_heads, " kv heads x ", n_context,
         " context blocks");
  if (!(budget.p >= 0.0 && budget.p <= 1.0) || budget.min_blocks < 0 || budget.max_blocks < 0)
    fail(ErrorCode::kInvalidArgument, "choose_by_mass: budget.p = ", budget.p, " (in [0, 1]), min_blocks = ",
         budget.min_blocks, ", max_blocks = ", budget.max_blocks, " (>= 0)");
  for (const float x : logits)
    if (std::isnan(x)) fail(ErrorCode::kInvalidArgument, "choose_by_mass: a block logit is NaN");

  std::vector<Shares> shares;
  for (int h = 0; h < n_kv_heads; ++h)
    shares.push_back(shares_of(logits.data() + size_t(h) * size_t(n_context), n_context, block_tokens,
                               fixed_logsum[size_t(h)]));
  const auto eligible_of = [&](int h) {
    std::vector<char> e(static_cast<size_t>(n_context));
    for (int64_t b = 0; b < n_context; ++b) e[size_t(b)] = !excluded(logits[size_t(h) * size_t(n_context) + size_t(b)]);
    return e;
  };

  MassChoice out;
  if (mode == HeadSelectMode::kShared) {
    Shares mean;
    mean.blocks.assign(size_t(n_context), 0.0);
    std::vector<char> eligible(size_t(n_context), 0);
    for (int h = 0; h < n_kv_heads; ++h) {
      const std::vector<char> e = eligible_of(h);
      for (int64_t b = 0; b < n_context; ++b) {
        mean.blocks[size_t(b)] += shares[size_t(h)].blocks[size_t(b)] / n_kv_heads;
        eligible[size_t(b)] |= e[size_t(b)];
      }
      mean.fixed += shares[size_t(h)].fixed / n_kv_heads;
    }
    out.chosen.push_back(fewest_reaching(mean.blocks, eligible, mean.fixed, budget));
  } else {
    for (int h = 0; h < n_kv_heads; ++h)
      out.chosen.push_back(fewest_reaching(shares[size_t(h)].blocks, eligible_of(h), shares[size_t(h)].fixed, budget));
    if (budget.policy == BudgetConfig::Policy::kAdaptive) {
      int64_t total = 0;
      for (const auto& c : out.chosen) total += int64_t(c.size());
      std::vector<float> normalised(logits.size());
      for (int h = 0; h < n_kv_heads; ++h)
        for (int64_t b = 0; b < n_context; ++b) {
          const size_t i = size_t(h) * size_t(n_context) + size_t(b);
          normalised[i] = excluded(logits[i]) ? -std::numeric_limits<float>::infinity()
                                              : float(shares[size_t(h)].blocks[size_t(b)]);
        }
      out.chosen = adakv_select(normalised.data(), n_kv_heads, n_context, (total + n_kv_heads - 1) / n_kv_heads,
                                budget.alpha, total);
    }
  }
  for (int h = 0; h < n_kv_heads; ++h) {
    const Shares& s = shares[size_t(h)];
    double mass = s.fixed;
    for (const int64_t b : out.chosen[out.chosen.size() == 1 ? 0 : size_t(h)]) mass += s.blocks[size_t(b)];
    out.mass.push_back(std::min(1.0, mass));
  }
  return out;
}

}  // namespace longctx::policy
