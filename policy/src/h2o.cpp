// H2O baseline: accumulated attention, heavy hitters + recent, permanent
// eviction (policy/h2o.h).
#include "longctx/policy/h2o.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/policy/preselect.h"
#include "token_scores.h"

namespace longctx::policy {

using cpu::decode_attention;
using cpu::DecodeAttentionParams;
using cpu::Selection;
using cpu::TokenSpan;

namespace {

// Keys of one kv head at `positions` (ascending), widened to f32 and
// transposed, keys[c * ld + j] with ld = padded_tokens(m), as the token-score
// kernel reads them. Each block page touched is converted once.
std::vector<float> gather_keys_t(const kvstore::KVStore& store, int layer, int kv_head,
                                 const std::vector<int64_t>& positions) {
  const kvstore::StoreLayout& layout = store.layout();
  const int d = layout.shape.head_dim;
  const int block_size = layout.block_size;
  const size_t ld = size_t(detail::padded_tokens(int(positions.size())));
  std::vector<float> keys(size_t(d) * ld, 0.f);
  std::vector<float> k_t(size_t(d) * size_t(block_size));  // K^T of the current block, f32
  int64_t loaded_block = -1;
  for (size_t j = 0; j < positions.size(); ++j) {
    const int64_t block = positions[j] / block_size;
    if (block != loaded_block) {
      const kvstore::BlockView view = store.block(layer, kv_head, block);
      kvstore::read_keys_t(layout, view, 0, block_size, k_t.data(), size_t(block_size));
      loaded_block = block;
    }
    const int64_t t = positions[j] % block_size;
    for (int c = 0; c < d; ++c) keys[size_t(c) * ld + j] = k_t[size_t(c) * size_t(block_size) + size_t(t)];
  }
  return keys;
}

// For each of n_q query rows (q + r * q_stride, head_dim floats): the fp32
// softmax of q.k * scale over the m gathered keys (keys_t, gather_keys_t's
// layout); the probabilities, summed over the rows, are added to acc[0..m).
void add_probabilities(const std::vector<float>& keys_t, int d, int64_t m, const float* q, int64_t q_stride,
                       int n_q, float scale, std::vector<double>& acc, std::vector<float>& scratch) {
  if (m == 0) return;
  const size_t ld = size_t(detail::padded_tokens(int(m)));
  scratch.assign(size_t(n_q) * size_t(d) + size_t(n_q + 1) * ld, 0.f);
  float* rows = scratch.data();  // the query rows, packed: one kernel call scores them all
  float* p = rows + size_t(n_q) * size_t(d);
  float* all_logits = p + ld;  // [n_q][ld]
  for (int r = 0; r < n_q; ++r) std::copy_n(q + r * q_stride, d, rows + size_t(r) * size_t(d));
  detail::row_scores_t(rows, n_q, d, keys_t.data(), ld, int(m), scale, all_logits);
  for (int r = 0; r < n_q; ++r) {
    const float* logits = all_logits + size_t(r) * ld;
    const float max_score = *std::max_element(logits, logits + m);
    // sum >= 1 (the maximum contributes exp(0)); a NaN query propagates, as in attention.
    const float inv_sum = float(1.0 / detail::sum_exp(logits, m, 1.f, max_score));
    std::fill_n(p, m, 0.f);
    detail::add_exp(logits, m, max_score, inv_sum, p);
    for (int64_t j = 0; j < m; ++j) acc[size_t(j)] += double(p[j]);
  }
}

// q: [..., n_q_heads, head_dim] f32 (shape already checked).
void check_query(const TensorView& q, const char* what, int n_kv_heads) {
  check_dtype(q, what, DType::kF32);
  if (q.numel() > 0) check_inner_contiguous(q, what);  // an empty window may have no data
  const int64_t n_q_heads = q.shape[q.rank - 2];
  if (n_q_heads < n_kv_heads || n_q_heads % n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, what, ": ", n_q_heads, " query heads is not a multiple of the store's ",
         n_kv_heads, " kv heads");
  }
}

}  // namespace

H2OParams H2OParams::from_config(const LongContextConfig& config) {
  H2OParams params;
  params.budget = h2o_budget_tokens(config);
  const auto heavy = static_cast<int64_t>(std::floor(config.h2o.heavy_ratio * double(params.budget)));
  params.n_recent = params.budget - std::clamp<int64_t>(heavy, 0, params.budget);
  return params;
}

H2OState::H2OState(int n_kv_heads, const H2OParams& params) : params_(params) {
  if (n_kv_heads < 1 || params.budget < 1 || params.n_recent < 0 || params.n_recent > params.budget) {
    fail(ErrorCode::kInvalidArgument, "H2OState: need n_kv_heads >= 1, budget >= 1 and 0 <= n_recent <= budget; got ",
         "n_kv_heads = ", n_kv_heads, ", budget = ", params.budget, ", n_recent = ", params.n_recent);
  }
  heads_.resize(size_t(n_kv_heads));
}

float H2OState::scale_for(const kvstore::KVStore& store) const {
  return params_.scale != 0.f ? params_.scale : 1.f / std::sqrt(float(store.layout().shape.head_dim));
}

void H2OState::admit(int64_t n_tokens) {
  for (Head& head : heads_) {
    for (int64_t t = n_seen_; t < n_tokens; ++t) {
      head.positions.push_back(t);
      head.acc.push_back(0.0);
    }
  }
  n_seen_ = std::max(n_seen_, n_tokens);
}

void H2OState::evict(int64_t n_tokens) {
  const int64_t recent_begin = n_tokens - params_.n_recent;
  for (Head& head : heads_) {
    const int64_t excess = int64_t(head.positions.size()) - params_.budget;
    if (excess <= 0) continue;
    // Candidates: kept tokens before the recent window, lowest acc first, older first on ties.
    std::vector<size_t> candidates;
    for (size_t j = 0; j < head.positions.size() && head.positions[j] < recent_begin; ++j) candidates.push_back(j);
    const size_t n_evict = size_t(std::min<int64_t>(excess, int64_t(candidates.size())));
    std::partial_sort(candidates.begin(), candidates.begin() + ptrdiff_t(n_evict), candidates.end(),
                      [&](size_t a, size_t b) {
                        if (head.acc[a] != head.acc[b]) return head.acc[a] < head.acc[b];
                        return head.positions[a] < head.positions[b];
                      });
    std::vector<bool> evicted(head.positions.size(), false);
    for (size_t i = 0; i < n_evict; ++i) evicted[candidates[i]] = true;
    size_t out = 0;
    for (size_t j = 0; j < head.positions.size(); ++j) {
      if (evicted[j]) continue;
      head.positions[out] = head.positions[j];
      head.acc[out] = head.acc[j];
      ++out;
    }
    head.positions.resize(out);
    head.acc.resize(out);
  }
}

void H2OState::init_from_prefill(const kvstore::KVStore& store, int layer, const TensorView& window_q) {
  const kvstore::KVShape& shape = store.layout().shape;
  if (int(heads_.size()) != shape.n_kv_heads) {
    fail(ErrorCode::kInvalidArgument, "H2OState::init_from_prefill: state has ", heads_.size(),
         " kv heads, the store ", shape.n_kv_heads);
  }
  if (n_seen_ != 0) {
    fail(ErrorCode::kInvalidArgument, "H2OState::init_from_prefill: layer ", layer, ": the state has already seen ",
         n_seen_, " tokens; init_from_prefill comes first");
  }
  check_shape(window_q, "window_q", {-1, -1, shape.head_dim});
  check_query(window_q, "window_q", shape.n_kv_heads);
  const int64_t n = store.n_tokens(layer);
  const int64_t w = window_q.shape[0];
  if (w > n) {
    fail(ErrorCode::kInvalidArgument, "H2OState::init_from_prefill: layer ", layer, ": ", w,
         " window queries for only ", n, " tokens");
  }
  // The window's probabilities summed per token over its queries and each
  // group's query heads: SnapKV's votes, unpooled, summed over the group.
  std::vector<float> votes;
  if (w > 0) {
    SnapKVParams votes_params;
    votes_params.pool_kernel = 1;
    votes_params.gqa_reduce = Reduce::kSum;
    votes_params.scale = scale_for(store);
    votes = snapkv_token_votes(store, layer, window_q, votes_params);
  }
  for (int h = 0; h < shape.n_kv_heads; ++h) {
    Head& head = heads_[size_t(h)];
    head.positions.resize(size_t(n));
    std::iota(head.positions.begin(), head.positions.end(), int64_t{0});
    head.acc.assign(size_t(n), 0.0);
    if (w > 0)
      for (int64_t t = 0; t < n; ++t) head.acc[size_t(t)] = double(votes[size_t(h * n + t)]);
  }
  n_seen_ = n;
  evict(n);
}

void H2OState::step(const kvstore::KVStore& store, int layer, const TensorView& q, const MutableTensorView& out,
                    const MutableTensorView& lse) {
  const kvstore::KVShape& shape = store.layout().shape;
  if (int(heads_.size()) != shape.n_kv_heads) {
    fail(ErrorCode::kInvalidArgument, "H2OState::step: state has ", heads_.size(), " kv heads, the store ",
         shape.n_kv_heads);
  }
  const int64_t n = store.n_tokens(layer);
  if (n < n_seen_) {
    fail(ErrorCode::kInvalidArgument, "H2OState::step: layer ", layer, " holds ", n, " tokens, fewer than the ",
         n_seen_, " the state has seen");
  }
  check_shape(q, "q", {-1, shape.head_dim});
  check_query(q, "q", shape.n_kv_heads);
  // decode_attention validates out and lse; on its error the admitted tokens
  // (appended at the end of every head) are taken back: the state is unchanged.
  const int64_t seen_before = n_seen_;
  admit(n);
  try {
    decode_attention(store, layer, q, selection(), DecodeAttentionParams{scale_for(store), 0}, out, lse);
  } catch (...) {
    for (Head& head : heads_) {
      head.positions.resize(head.positions.size() - size_t(n - seen_before));
      head.acc.resize(head.acc.size() - size_t(n - seen_before));
    }
    n_seen_ = seen_before;
    throw;
  }
  const int g = int(q.shape[0]) / shape.n_kv_heads;
  const auto* qd = static_cast<const float*>(q.data);
  const float scale = scale_for(store);
  std::vector<float> scratch;
  for (int h = 0; h < shape.n_kv_heads; ++h) {
    Head& head = heads_[size_t(h)];
    const std::vector<float> keys_t = gather_keys_t(store, layer, h, head.positions);
    add_probabilities(keys_t, shape.head_dim, int64_t(head.positions.size()), qd + int64_t(h) * g * q.strides[0],
                      q.strides[0], g, scale, head.acc, scratch);
  }
  evict(n);
}

Selection H2OState::selection() const {
  Selection selection;
  for (const Head& head : heads_) {
    std::vector<TokenSpan> spans;
    for (const int64_t p : head.positions) {
      if (!spans.empty() && spans.back().end == p) {
        ++spans.back().end;
      } else {
        spans.push_back({p, p + 1});
      }
    }
    selection.spans.push_back(std::move(spans));
  }
  return selection;
}

}  // namespace longctx::policy
