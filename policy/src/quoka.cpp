// QUOKA sparse prefill (policy/quoka.h).
//
// Scoring is one GEMM per key tile and kv head: the retained queries of the
// group's g heads, normalized to unit length, are the rows of U [g * R][d];
// a tile of 128 keys is widened to f32 K^T [d][128] straight from the page
// layout, S = U x K^T (the Highway GEMM of prefill attention), and each column
// times the inverse of its key's norm gives the cosines. Work items are (kv
// head, piece of kPieceKeys candidates), each writing its own slice of the
// head's scores, so the scores do not depend on the thread count.
#include "longctx/policy/quoka.h"

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/prefill_attention_kernels.h"
#include "longctx/kvstore/node_executor.h"

namespace longctx::policy {

using cpu::prefill_attention;
using cpu::Selection;
using cpu::TokenSpan;
using cpu::top_k;

namespace {

using cpu::detail::kTileAlign;

constexpr int64_t kKeyTile = 128;     // keys per GEMM (a multiple of kTileAlign)
constexpr int64_t kPieceKeys = 4096;  // candidates per work item (a multiple of kKeyTile)
constexpr float kInf = std::numeric_limits<float>::infinity();

// a.b / (|a| |b|) from its parts; 0 for a zero norm or a non-finite quotient.
float cosine(float dot, float norm_a, float norm_b) {
  if (norm_a == 0.f || norm_b == 0.f) return 0.f;
  const float c = dot / norm_a / norm_b;  // |dot / norm_a| <= norm_b: no overflow in between
  return std::isfinite(c) ? c : 0.f;
}

float dot(const float* a, const float* b, size_t d) {
  float sum = 0.f;
  for (size_t c = 0; c < d; ++c) sum += a[c] * b[c];
  return sum;
}

const float* q_row(const TensorView& q, int64_t i, int head) {
  return static_cast<const float*>(q.data) + i * q.strides[0] + head * q.strides[1];
}

// Indices of the min(n_q, n) queries of `head` least similar (cosine) to the
// head's mean query, ties to the lower index.
std::vector<int64_t> retained_queries(const TensorView& q, int head, int n_q) {
  const int64_t n = q.shape[0];
  const size_t d = size_t(q.shape[2]);
  std::vector<float> mean(d, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = q_row(q, i, head);
    for (size_t c = 0; c < d; ++c) mean[c] += row[c];
  }
  for (float& x : mean) x /= float(n);
  const float mean_norm = std::sqrt(dot(mean.data(), mean.data(), d));
  std::vector<float> similarity(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float* row = q_row(q, i, head);
    similarity[size_t(i)] = cosine(dot(row, mean.data(), d), std::sqrt(dot(row, row, d)), mean_norm);
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  const auto keep = std::min<int64_t>(n, n_q);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
    const float sa = similarity[size_t(a)], sb = similarity[size_t(b)];
    return sa != sb ? sa < sb : a < b;
  });
  order.resize(size_t(keep));
  return order;
}

struct ScoreScratch {
  std::vector<float> k_t;    // [d][kKeyTile] keys of the tile, channel-major
  std::vector<float> s;      // [g * R][kKeyTile] unit query . key
  std::vector<float> inv_norms;   // [kKeyTile] 1 / key norm
  std::vector<float> head_score;  // [kKeyTile] one query head's scores
};

// Scores of candidates [begin, end) of kv head `kv_head` into scores[0..end-begin).
// unit_q: [g][R][d] unit retained queries of the group's heads.
void score_keys(const kvstore::KVStore& store, int layer, int kv_head, int64_t begin, int64_t end,
                const std::vector<float>& unit_q, int g, int64_t n_retained, const QuokaConfig& config,
                ScoreScratch& scratch, float* scores) {
  const int bs = store.layout().block_size;
  const size_t d = size_t(store.layout().shape.head_dim);
  const size_t rows = size_t(g) * size_t(n_retained);
  constexpr size_t ld = size_t(kKeyTile);
  // Zero-filled once: the padding columns the GEMM reads stay finite.
  if (scratch.k_t.size() < d * ld) scratch.k_t.assign(d * ld, 0.f);
  if (scratch.s.size() < rows * ld) scratch.s.assign(rows * ld, 0.f);
  scratch.inv_norms.resize(ld);
  scratch.head_score.resize(ld);

  for (int64_t k0 = begin; k0 < end; k0 += kKeyTile) {
    const int64_t count = std::min(kKeyTile, end - k0);
    for (int64_t t = k0; t < k0 + count;) {
      const int64_t offset = t % bs;
      const int64_t len = std::min<int64_t>(bs - offset, k0 + count - t);
      const kvstore::BlockView view = store.block(layer, kv_head, t / bs);
      kvstore::read_keys_t(store.layout(), view, int(offset), int(len), &scratch.k_t[size_t(t - k0)], ld);
      t += len;
    }
    // 1 / |k| per key, 0 for a zero (or overflowing) norm: its cosines are 0.
    float* inv_norm = scratch.inv_norms.data();
    std::fill(inv_norm, inv_norm + ld, 0.f);
    for (size_t c = 0; c < d; ++c) {
      const float* channel = &scratch.k_t[c * ld];
      for (int64_t j = 0; j < count; ++j) inv_norm[j] += channel[j] * channel[j];
    }
    for (int64_t j = 0; j < count; ++j) {
      const float norm = std::sqrt(inv_norm[j]);
      const float inverse = 1.f / norm;
      inv_norm[j] = norm > 0.f && std::isfinite(inverse) ? inverse : 0.f;
    }

    cpu::detail::gemm_f32(false, rows, (size_t(count) + kTileAlign - 1) / kTileAlign * kTileAlign, d, unit_q.data(), d,
                     scratch.k_t.data(), ld, scratch.s.data(), ld);

    // Cosines (|unit q . k| <= |k|, so each is in [-1, 1] up to rounding),
    // reduced over each head's R queries, then over the g heads.
    float* head_score = scratch.head_score.data();
    float* group_score = scores + (k0 - begin);
    const float empty_group = config.head_reduce == Reduce::kMax ? -kInf : 0.f;
    const float empty_head = config.query_reduce == Reduce::kMax ? -kInf : 0.f;
    std::fill(group_score, group_score + count, empty_group);
    for (int h = 0; h < g; ++h) {
      std::fill(head_score, head_score + count, empty_head);
      for (int64_t r = 0; r < n_retained; ++r) {
        const float* dots = &scratch.s[(size_t(h) * size_t(n_retained) + size_t(r)) * ld];
        if (config.query_reduce == Reduce::kMax) {
          for (int64_t j = 0; j < count; ++j) head_score[j] = std::max(head_score[j], dots[j] * inv_norm[j]);
        } else {
          for (int64_t j = 0; j < count; ++j) head_score[j] += dots[j] * inv_norm[j];
        }
      }
      if (config.query_reduce != Reduce::kMax)
        for (int64_t j = 0; j < count; ++j) head_score[j] /= float(n_retained);
      if (config.head_reduce == Reduce::kMax) {
        for (int64_t j = 0; j < count; ++j) group_score[j] = std::max(group_score[j], head_score[j]);
      } else {
        for (int64_t j = 0; j < count; ++j) group_score[j] += head_score[j];
      }
    }
    if (config.head_reduce != Reduce::kMax)
      for (int64_t j = 0; j < count; ++j) group_score[j] /= float(g);
  }
}

}  // namespace

Selection quoka_select_keys(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                            const QuokaConfig& config, int initial_len, int chunk_size) {
  const kvstore::KVShape& shape = store.layout().shape;
  if (layer < 0 || layer >= shape.n_layers) {
    fail(ErrorCode::kInvalidArgument, "quoka_select_keys: layer ", layer, " out of range [0, ", shape.n_layers, ")");
  }
  const int d = shape.head_dim;
  check_dtype(q, "quoka_select_keys q", DType::kF32);
  check_shape(q, "quoka_select_keys q", {-1, -1, d});
  const int64_t n = q.shape[0];
  const int64_t n_q_heads = q.shape[1];
  if (n < 1) fail(ErrorCode::kInvalidArgument, "quoka_select_keys: the chunk has no query (q has 0 rows)");
  if (n_q_heads < shape.n_kv_heads || n_q_heads % shape.n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "quoka_select_keys: q has ", n_q_heads,
         " query heads, not a positive multiple of the store's ", shape.n_kv_heads, " kv heads");
  }
  check_inner_contiguous(q, "quoka_select_keys q");
  if (first_pos < 0 || first_pos > store.n_tokens(layer)) {
    fail(ErrorCode::kInvalidArgument, "quoka_select_keys: chunk starts at position ", first_pos, " but layer ", layer,
         " holds ", store.n_tokens(layer), " tokens");
  }
  const auto check_at_least = [](const char* key, int value, int minimum) {
    if (value < minimum)
      fail(ErrorCode::kInvalidArgument, "quoka_select_keys: ", key, " is ", value, ", must be >= ", minimum);
  };
  check_at_least("quoka.n_q", config.n_q, 1);
  check_at_least("quoka.b_sa", config.b_sa, 0);
  check_at_least("quoka.b_cp", config.b_cp, 0);
  check_at_least("initial_len", initial_len, 0);
  if (config.b_cp == 0 && chunk_size < 1) {
    fail(ErrorCode::kInvalidArgument, "quoka_select_keys: quoka.b_cp is 0 (= chunk_size) and chunk_size is ",
         chunk_size, ", must be >= 1");
  }

  const int n_kv = shape.n_kv_heads;
  const int g = int(n_q_heads / n_kv);
  const int64_t previous_len = config.b_cp > 0 ? config.b_cp : chunk_size;
  const int64_t sinks_end = std::min<int64_t>(initial_len, first_pos);
  const int64_t candidates_begin = sinks_end;
  const int64_t candidates_end = std::max(sinks_end, first_pos - previous_len);
  const int64_t n_candidates = candidates_end - candidates_begin;

  Selection selection;
  selection.spans.assign(size_t(n_kv), {});
  if (first_pos == 0) return selection;
  if (n_candidates <= config.b_sa) {
    for (auto& spans : selection.spans) spans.push_back({0, first_pos});
    return selection;
  }

  // Unit retained queries per kv head: [g][R][d].
  const int64_t n_retained = std::min<int64_t>(n, config.n_q);
  std::vector<std::vector<float>> unit_q(size_t(n_kv), std::vector<float>(size_t(g * n_retained * d)));
  for (int head = 0; head < int(n_q_heads); ++head) {
    const std::vector<int64_t> kept = retained_queries(q, head, config.n_q);
    float* dst = &unit_q[size_t(head / g)][size_t(head % g) * size_t(n_retained * d)];
    for (int64_t r = 0; r < n_retained; ++r, dst += d) {
      const float* row = q_row(q, kept[size_t(r)], head);
      const float norm = std::sqrt(dot(row, row, size_t(d)));
      for (int c = 0; c < d; ++c) dst[c] = norm > 0.f && std::isfinite(norm) ? row[c] / norm : 0.f;
    }
  }

  // Scores of the candidates per kv head.
  std::vector<std::vector<float>> scores(static_cast<size_t>(n_kv),
                                         std::vector<float>(static_cast<size_t>(n_candidates)));
  const int64_t pieces = (n_candidates + kPieceKeys - 1) / kPieceKeys;
  const auto kv_head_of = [&](int64_t item) { return int(item % n_kv); };
  tbb::enumerable_thread_specific<ScoreScratch> scratch;
  kvstore::parallel_for_heads(store, pieces * n_kv, kv_head_of, [&](int64_t item) {
    const int kv_head = kv_head_of(item);
    const int64_t begin = candidates_begin + item / n_kv * kPieceKeys;
    const int64_t end = std::min(candidates_end, begin + kPieceKeys);
    score_keys(store, layer, kv_head, begin, end, unit_q[size_t(kv_head)], g, n_retained, config, scratch.local(),
               &scores[size_t(kv_head)][size_t(begin - candidates_begin)]);
  });

  for (int h = 0; h < n_kv; ++h) {
    std::vector<int64_t> kept = top_k(scores[size_t(h)].data(), n_candidates, config.b_sa);
    std::sort(kept.begin(), kept.end());
    std::vector<TokenSpan>& spans = selection.spans[size_t(h)];
    if (sinks_end > 0) spans.push_back({0, sinks_end});
    for (const int64_t index : kept) {
      const int64_t t = candidates_begin + index;
      if (!spans.empty() && spans.back().end == t) {
        spans.back().end = t + 1;
      } else {
        spans.push_back({t, t + 1});
      }
    }
    if (candidates_end < first_pos) {
      if (!spans.empty() && spans.back().end == candidates_end) {
        spans.back().end = first_pos;
      } else {
        spans.push_back({candidates_end, first_pos});
      }
    }
  }
  return selection;
}

Selection quoka_prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                                  const QuokaConfig& config, int initial_len, int chunk_size, float scale,
                                  const MutableTensorView& out, const MutableTensorView& lse,
                                  cpu::PrefillKernel kernel) {
  Selection history = quoka_select_keys(store, layer, first_pos, q, config, initial_len, chunk_size);
  prefill_attention(store, layer, first_pos, history, q, scale, out, lse, kernel);
  return history;
}

}  // namespace longctx::policy
