// The group scores of single tokens, private to policy/src: q.k of a kv
// head's tokens for its group's query heads, combined by gqa_reduce, as
// rerank_tokens ranks them and fixed_part_logsums sums their exponentials.
// One Highway kernel (token_scores_hwy.cpp), dispatched at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy::detail {

// The query rows that score kv head h's tokens: the group's g rows summed
// into one (Reduce::kSum: a token's score is the sum of the g products) or
// all g of them (kMax: the score is their largest).
struct GroupQuery {
  std::vector<float> rows;  // [n_rows][d]
  int n_rows = 0;
  int d = 0;
};

// q: f32 [n_q_heads, d] (inner dimension contiguous), n_q_heads = group * n_kv_heads.
GroupQuery group_query(const TensorView& q, int kv_head, int group, Reduce reduce);

// Rows of the transposed keys (read_keys_t's ld) and room of a scores buffer:
// a token count rounded up to whole vectors of every target (16 f32 lanes).
constexpr int kTokenPad = 16;
inline int padded_tokens(int n) { return (n + kTokenPad - 1) / kTokenPad * kTokenPad; }

// out[i] for tokens i < n of keys transposed, kt[c * ld + i] (ld >= n, a
// multiple of kTokenPad): the largest over the n_rows query rows (row r at
// rows + r * d) of scale * sum_c row[c] * kt[c * ld + i], in f32 (fused
// multiply-adds where the target has them). out has room for padded_tokens(n).
void score_tokens_t(const float* rows, int n_rows, int d, const float* kt, size_t ld, int n, float scale, float* out);

// score_tokens_t at scale 1 over a store page's keys as they are stored
// (BlockView: K^T rows of block_size elements, q8_0 codes and scales):
// out[i] for the tokens [first, first + n), n a multiple of kTokenPad. The
// same sums in the same order as score_tokens_t over read_keys_t's f32 keys,
// without staging them.
void score_page_tokens(const float* rows, int n_rows, int d, const kvstore::BlockView& page, DType type, int block_size,
                       int first, int n, float* out);

// The same for each row alone: out[r * ld + i] = scale * sum_c row_r[c] *
// kt[c * ld + i] for r < n_rows, i < n (out: n_rows rows of ld).
void row_scores_t(const float* rows, int n_rows, int d, const float* kt, size_t ld, int n, float scale, float* out);

// sum_i exp(x[i] * factor - shift) over x[0, n), the exponentials in f32
// (Highway's Exp), summed in double.
double sum_exp(const float* x, int64_t n, float factor, float shift);

// acc[i] += exp(x[i] - shift) * factor for i < n, in f32 (Highway's Exp).
void add_exp(const float* x, int64_t n, float shift, float factor, float* acc);

// Appends to `out` the scores of tokens [begin, end) of kv head h of
// `layer`, read a block at a time into `keys` (scratch, resized as needed).
void score_token_range(const kvstore::KVStore& store, int layer, int kv_head, const GroupQuery& q, int64_t begin,
                       int64_t end, std::vector<float>& keys, std::vector<float>& out);

}  // namespace longctx::policy::detail
