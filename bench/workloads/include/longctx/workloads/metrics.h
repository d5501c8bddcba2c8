// Quality of a selection against dense attention (fp64 accumulation).
// GQA as everywhere: query head h belongs to kv head h / (n_q_heads / n_kv_heads),
// with n_kv_heads = selection.spans.size().
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/cpu/selection.h"
#include "longctx/workloads/synthetic.h"

namespace longctx::workloads {

// Fraction of the k tokens with the largest dense attention probability
// (per query head, then averaged over heads) that the selection attends.
// Ties between equal probabilities: lower token index first. k is clamped to
// n_tokens; with n_tokens == 0 there is nothing to miss and the recall is 1.
// probs: [n_q_heads][n_tokens] dense attention probabilities.
// Throws Error(kInvalidArgument) when probs.size() != n_q_heads * n_tokens,
// n_q_heads is not a positive multiple of the selection's kv heads, or k < 1.
double topk_token_recall(const std::vector<double>& probs, int n_q_heads, int64_t n_tokens,
                         const cpu::Selection& selection, int k = 10);

// ||o_sparse - o_dense||_2 / ||o_dense||_2 over all heads and channels;
// 0 when both are zero, +inf when only o_dense is.
double relative_l2_error(const float* out_sparse, const float* out_dense, int64_t n);

// Ada-KV's L1 loss: mean over query heads of ||o_sparse - o_dense||_1.
double l1_loss(const float* out_sparse, const float* out_dense, int n_q_heads, int head_dim);

// Fraction of `blocks` (e.g. the needle blocks) whose tokens
// [b * block_size, min((b + 1) * block_size, n_tokens)) the selection of every
// kv head attends entirely; 1 when `blocks` is empty. Throws
// Error(kInvalidArgument) for block_size < 1 or a block outside
// [0, ceil(n_tokens / block_size)).
double block_recall(const cpu::Selection& selection, const std::vector<int64_t>& blocks, int block_size,
                    int64_t n_tokens);

// Dense softmax(q.k * scale) of each query head over every token, in fp64:
// [n_q_heads][n_tokens]. q: [n_q_heads][head_dim]; k: [n_tokens][n_kv_heads][head_dim]
// (the SyntheticWorkload layout; pass keys rounded to the storage dtype to
// compare with a store). scale 0 = 1/sqrt(head_dim). Throws
// Error(kInvalidArgument) for sizes < 1 or n_q_heads not a multiple of n_kv_heads.
std::vector<double> dense_probabilities(const float* q, const float* k, int n_q_heads, int n_kv_heads,
                                        int head_dim, int64_t n_tokens, double scale = 0);
std::vector<double> dense_probabilities(const SyntheticWorkload& workload, double scale = 0);

}  // namespace longctx::workloads
