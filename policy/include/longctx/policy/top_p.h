// Attention-mass budgets (Twilight; ALGORITHMS.md "Top-p budget"):
// `budget.mode: top_p` keeps, per kv head and decode step, the fewest context
// blocks whose estimated attention mass reaches p.
//
// The estimate: block b has logit e_b (its representative score for the
// group times the attention scale: the mean over the group's query heads with
// gqa_reduce sum, the max with max) and n_b tokens in the context range, so
// it weighs w_b = n_b * exp(e_b - m). The always-attended tokens (sinks and
// the local window) weigh w_fixed = exp(L - m), L = log sum_t exp(e_t) over
// their exact logits; m is the largest of all, for range. A head keeps its
// blocks in decreasing w (ties: lower index) until w_fixed plus the kept w
// reaches p of w_fixed + sum_b w_b, then clamps the count to [min_blocks,
// max_blocks] (max_blocks 0: no limit) and to its eligible blocks (an -inf
// logit is excluded: outside the preselected set); p = 1 keeps every eligible
// block, so that top_p at 1 attends what dense does. The mass is an estimate:
// QUEST's logit is an upper bound on each token's, MEAN's the mean key's.
//
// Modes: SEPARATE, each kv head by its own mass; SHARED, one list for every
// head by the mean over heads of their normalised masses; SEPARATE with
// budget.policy adaptive (Ada-KV), each head's count from its own mass, then
// the total of the counts shared among the heads by Ada-KV on the normalised
// masses (comparable across heads), each keeping >= alpha * the mean count.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/config.h"

namespace longctx::policy {

struct MassChoice {
  // Kept blocks as indices into a row of the logits, increasing: one list
  // per kv head, or one list for all in SHARED mode.
  std::vector<std::vector<int64_t>> chosen;
  // Per kv head: the estimated share of its attention the step attends
  // exactly (w_fixed + kept w, over the total), in [0, 1].
  std::vector<double> mass;
};

// logits: [n_kv_heads][n_context] block logits (scaled); block_tokens:
// [n_context] tokens of each block in the context range; fixed_logsum:
// [n_kv_heads] L of each head's always-attended tokens (-inf when there are
// none). Error(kInvalidArgument) for sizes that do not match, n_kv_heads < 1,
// a budget outside its documented range, or a NaN logit.
MassChoice choose_by_mass(const std::vector<float>& logits, int n_kv_heads, int64_t n_context,
                          const std::vector<int64_t>& block_tokens, const std::vector<double>& fixed_logsum,
                          HeadSelectMode mode, const BudgetConfig& budget);

}  // namespace longctx::policy
