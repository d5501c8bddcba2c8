// Plain fp64 references of the cpu/ kernels, shared by the tests in this
// folder. Each section belongs to one kernel family and stands alone: it is
// written for clarity, not speed, and reads its inputs as the store holds
// them (rounded to kv_type) so that tolerances measure the kernel only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/kvstore/kv_store.h"

// ============================================================================
// Block scoring (score_blocks): representatives from their definitions in
// kv_store.h, computed from the keys read back from the K^T pages.
// ============================================================================
namespace longctx::cpu::score_ref {

// Keys of one block as stored, widened exactly: [n_filled][head_dim].
inline std::vector<std::vector<double>> stored_block_keys(const kvstore::KVStore& store, int layer, int kv_head,
                                                          int64_t block) {
  const kvstore::StoreLayout& layout = store.layout();
  const kvstore::BlockView view = store.block(layer, kv_head, block);
  const int d = layout.shape.head_dim;
  std::vector<std::vector<double>> keys(size_t(view.n_filled), std::vector<double>(size_t(d)));
  // q8_0 through the store's reader (its dequantization is checked against
  // the plain q8_0 reference in tests/kvstore); float types element by element.
  std::vector<float> q8_keys(layout.kv_type == DType::kQ8_0 ? size_t(d) * size_t(view.n_filled) : 0);
  if (!q8_keys.empty()) kvstore::read_keys_t(layout, view, 0, view.n_filled, q8_keys.data(), size_t(view.n_filled));
  for (int t = 0; t < view.n_filled; ++t)
    for (int c = 0; c < d; ++c)
      keys[size_t(t)][size_t(c)] = q8_keys.empty()
                                       ? load_as_f32(view.k_t, layout.kv_type, size_t(c) * layout.block_size + t)
                                       : q8_keys[size_t(c) * size_t(view.n_filled) + size_t(t)];
  return keys;
}

// The vectors a block is scored with: MAX {channel max}, MEAN {channel mean},
// QUEST {channel max, channel min}, FIX the keys at offsets
// floor(j * block_size / R) that exist, DYNAMIC the min(n_filled, R) keys of
// highest importance (ties: lower offset first). importance: [n_filled], read
// by DYNAMIC only.
inline std::vector<std::vector<double>> representatives(RepresentativeType type,
                                                        const std::vector<std::vector<double>>& keys,
                                                        int block_size, int rep_num,
                                                        const std::vector<float>& importance) {
  const size_t n = keys.size();
  const size_t d = keys.at(0).size();
  std::vector<std::vector<double>> reps;
  switch (type) {
    case RepresentativeType::kMax:
    case RepresentativeType::kQuest: {
      std::vector<double> hi(keys[0]), lo(keys[0]);
      for (const auto& k : keys)
        for (size_t c = 0; c < d; ++c) hi[c] = std::max(hi[c], k[c]), lo[c] = std::min(lo[c], k[c]);
      reps.push_back(hi);
      if (type == RepresentativeType::kQuest) reps.push_back(lo);
      break;
    }
    case RepresentativeType::kMean: {
      std::vector<double> mean(d, 0.0);
      for (const auto& k : keys)
        for (size_t c = 0; c < d; ++c) mean[c] += k[c] / double(n);
      reps.push_back(mean);
      break;
    }
    case RepresentativeType::kFix:
      for (int j = 0; j < rep_num; ++j) {
        const int64_t offset = int64_t(j) * block_size / rep_num;
        if (offset < int64_t(n)) reps.push_back(keys[size_t(offset)]);
      }
      break;
    case RepresentativeType::kDynamic: {
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return importance.at(a) > importance.at(b); });
      for (size_t j = 0; j < std::min(n, size_t(rep_num)); ++j) reps.push_back(keys[order[j]]);
      break;
    }
  }
  return reps;
}

struct BlockScore {
  double score = 0;      // the reference score
  double magnitude = 0;  // sum over heads, representatives and channels of |q_c| |rep_c|
};

// Score of one block for one kv head: per query head (rows of q_group,
// [g][head_dim]) q.rep (MAX/MEAN), sum_c max(q_c max_c, q_c min_c) (QUEST),
// or max/mean over the representatives of q.k (FIX/DYNAMIC); then the sum or
// max over the g heads.
inline BlockScore block_score(RepresentativeType type, const std::vector<std::vector<double>>& reps,
                              const std::vector<std::vector<double>>& q_group, Reduce gqa_reduce,
                              Reduce dynamic_reduce) {
  BlockScore result;
  result.score = gqa_reduce == Reduce::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
  for (const auto& q : q_group) {
    double head_score = 0;
    if (type == RepresentativeType::kQuest) {
      for (size_t c = 0; c < q.size(); ++c) head_score += std::max(q[c] * reps[0][c], q[c] * reps[1][c]);
    } else {
      std::vector<double> dots;
      for (const auto& rep : reps) {
        double dot = 0;
        for (size_t c = 0; c < q.size(); ++c) dot += q[c] * rep[c];
        dots.push_back(dot);
      }
      const bool take_max = (type == RepresentativeType::kFix || type == RepresentativeType::kDynamic) &&
                            dynamic_reduce == Reduce::kMax;
      head_score = take_max ? *std::max_element(dots.begin(), dots.end())
                            : std::accumulate(dots.begin(), dots.end(), 0.0) / double(dots.size());
    }
    for (const auto& rep : reps)
      for (size_t c = 0; c < q.size(); ++c) result.magnitude += std::abs(q[c] * rep[c]);
    result.score = gqa_reduce == Reduce::kMax ? std::max(result.score, head_score) : result.score + head_score;
  }
  return result;
}

}  // namespace longctx::cpu::score_ref

// ============================================================================
// Decode attention and its merge (decode_attention, dense_decode_attention,
// merge_attention): softmax attention of one query over an explicit token
// list, and the LSE merge formula, in fp64.
// ============================================================================
#include "longctx/cpu/selection.h"

namespace longctx::cpu::attention_ref {

// Keys and values of one kv head as stored (rounded to kv_type), [n_tokens][head_dim].
struct HeadKV {
  int head_dim = 0;
  std::vector<float> k, v;
  const float* key(int64_t t) const { return &k[size_t(t) * size_t(head_dim)]; }
  const float* value(int64_t t) const { return &v[size_t(t) * size_t(head_dim)]; }
};

struct Attention {
  std::vector<double> out;  // [head_dim], normalized; 0 when there is no token
  double lse = -std::numeric_limits<double>::infinity();
  // What the error of an fp32 kernel scales with:
  double max_logit_terms = 0;  // max over tokens of scale * sum_c |q_c k_c|
  double max_abs_value = 0;    // max over tokens and channels of |v|
};

// out = sum_t softmax(scale q.k_t) v_t, lse = log sum_t exp(scale q.k_t), over `tokens`.
inline Attention attend(const float* q, double scale, const HeadKV& kv, const std::vector<int64_t>& tokens) {
  const size_t d = size_t(kv.head_dim);
  Attention r;
  r.out.assign(d, 0.0);
  if (tokens.empty()) return r;
  std::vector<double> logits;
  for (int64_t t : tokens) {
    double dot = 0, terms = 0;
    for (size_t c = 0; c < d; ++c) {
      dot += double(q[c]) * double(kv.key(t)[c]);
      terms += std::abs(double(q[c]) * double(kv.key(t)[c]));
    }
    logits.push_back(scale * dot);
    r.max_logit_terms = std::max(r.max_logit_terms, std::abs(scale) * terms);
    for (size_t c = 0; c < d; ++c) r.max_abs_value = std::max(r.max_abs_value, std::abs(double(kv.value(t)[c])));
  }
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const double p = std::exp(logits[i] - m);
    sum += p;
    for (size_t c = 0; c < d; ++c) r.out[c] += p * double(kv.value(tokens[i])[c]);
  }
  for (double& x : r.out) x /= sum;
  r.lse = m + std::log(sum);
  return r;
}

// The token positions that spans list, in order.
inline std::vector<int64_t> tokens_of(const std::vector<TokenSpan>& spans) {
  std::vector<int64_t> tokens;
  for (const TokenSpan& s : spans)
    for (int64_t t = s.begin; t < s.end; ++t) tokens.push_back(t);
  return tokens;
}

// The contract's merge of (out_b, lse_b) into (out_a, lse_a): m = max(l_a, l_b),
// w_i = exp(l_i - m), o = (w_a o_a + w_b o_b) / (w_a + w_b), l = m + log(w_a + w_b);
// an empty part (-inf) leaves the other unchanged, two empty parts give out 0, -inf.
inline void merge(std::vector<double>& out_a, double& lse_a, const std::vector<double>& out_b, double lse_b) {
  const double empty = -std::numeric_limits<double>::infinity();
  if (lse_b == empty) {
    if (lse_a == empty) std::fill(out_a.begin(), out_a.end(), 0.0);
    return;
  }
  if (lse_a == empty) {
    out_a = out_b;
    lse_a = lse_b;
    return;
  }
  const double m = std::max(lse_a, lse_b);
  const double wa = std::exp(lse_a - m), wb = std::exp(lse_b - m);
  for (size_t c = 0; c < out_a.size(); ++c) out_a[c] = (wa * out_a[c] + wb * out_b[c]) / (wa + wb);
  lse_a = m + std::log(wa + wb);
}

}  // namespace longctx::cpu::attention_ref

// ============================================================================
// Prefill attention (prefill_attention): each query of a chunk attends every
// token of the layer up to its own position, plain softmax in fp64 over the
// keys and values read back from the block pages.
// ============================================================================
namespace longctx::cpu::prefill_ref {

// One kv head of a layer as stored, widened exactly: k and v [n_tokens][head_dim].
struct StoredHead {
  int head_dim = 0;
  std::vector<double> k, v;
  const double* key(int64_t t) const { return &k[size_t(t) * size_t(head_dim)]; }
  const double* value(int64_t t) const { return &v[size_t(t) * size_t(head_dim)]; }
};

inline StoredHead stored_head(const kvstore::KVStore& store, int layer, int kv_head) {
  const kvstore::StoreLayout& layout = store.layout();
  const int bs = layout.block_size;
  StoredHead head;
  head.head_dim = layout.shape.head_dim;
  std::vector<float> k(size_t(head.head_dim)), v(size_t(head.head_dim));
  for (int64_t t = 0; t < store.n_tokens(layer); ++t) {
    const kvstore::BlockView page = store.block(layer, kv_head, t / bs);
    const size_t offset = size_t(t % bs);
    if (layout.kv_type == DType::kQ8_0) {  // the store's reader, checked in tests/kvstore
      kvstore::read_keys_t(layout, page, int(offset), 1, k.data(), 1);
      kvstore::read_values(layout, page, int(offset), 1, v.data(), size_t(head.head_dim));
      head.k.insert(head.k.end(), k.begin(), k.end());
      head.v.insert(head.v.end(), v.begin(), v.end());
      continue;
    }
    for (int c = 0; c < head.head_dim; ++c) {
      head.k.push_back(load_as_f32(page.k_t, layout.kv_type, size_t(c) * size_t(bs) + offset));
      head.v.push_back(load_as_f32(page.v, layout.kv_type, offset * size_t(head.head_dim) + size_t(c)));
    }
  }
  return head;
}

struct Row {
  std::vector<double> out;  // [head_dim], normalized
  double lse = 0;
  // What the error of an fp32 kernel scales with:
  double max_logit_terms = 0;  // A: max over keys of scale * sum_c |q_c k_c|
  double max_abs_value = 0;    // max over keys and channels of |v|
};

// Decode attention of one query (head_dim floats) over keys [0, position]:
// out = sum_t softmax_t(scale q.k_t) v_t, lse = log sum_t exp(scale q.k_t).
inline Row attend_causal(const float* q, double scale, const StoredHead& kv, int64_t position) {
  const size_t d = size_t(kv.head_dim);
  Row row;
  std::vector<double> logits;
  for (int64_t t = 0; t <= position; ++t) {
    double dot = 0, terms = 0;
    for (size_t c = 0; c < d; ++c) {
      dot += double(q[c]) * kv.key(t)[c];
      terms += std::abs(double(q[c]) * kv.key(t)[c]);
    }
    logits.push_back(scale * dot);
    row.max_logit_terms = std::max(row.max_logit_terms, scale * terms);
    for (size_t c = 0; c < d; ++c) row.max_abs_value = std::max(row.max_abs_value, std::abs(kv.value(t)[c]));
  }
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  row.out.assign(d, 0.0);
  for (int64_t t = 0; t <= position; ++t) {
    const double p = std::exp(logits[size_t(t)] - m);
    sum += p;
    for (size_t c = 0; c < d; ++c) row.out[c] += p * kv.value(t)[c];
  }
  for (double& x : row.out) x /= sum;
  row.lse = m + std::log(sum);
  return row;
}

}  // namespace longctx::cpu::prefill_ref
