// H2O baseline: accumulated attention, heavy hitters + recent, permanent
// eviction (policy/h2o.h).
#include "longctx/policy/h2o.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

namespace longctx::policy {

using cpu::decode_attention;
using cpu::DecodeAttentionParams;
using cpu::Selection;
using cpu::TokenSpan;

namespace {

// Keys of one kv head at `positions` (ascending), widened to f32: [m][head_dim].
// Each block page touched is converted once.
std::vector<float> gather_keys(const kvstore::KVStore& store, int layer, int kv_head,
                               const std::vector<int64_t>& positions) {
  const kvstore::StoreLayout& layout = store.layout();
  const int d = layout.shape.head_dim;
  const int block_size = layout.block_size;
  std::vector<float> keys(positions.size() * size_t(d));
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
    for (int c = 0; c < d; ++c) keys[j * size_t(d) + size_t(c)] = k_t[size_t(c) * size_t(block_size) + size_t(t)];
  }
  return keys;
}

// For each of n_q query rows (q + r * q_stride, head_dim floats): the fp32
// softmax of q.k * scale over the first `visible` gathered keys; the
// probabilities, summed over the rows, are added to acc[0..visible).
void add_probabilities(const std::vector<float>& keys, int d, int64_t visible, const float* q, int64_t q_stride,
                       int n_q, float scale, std::vector<double>& acc, std::vector<float>& scratch) {
  if (visible == 0) return;
  scratch.resize(size_t(visible));
  for (int r = 0; r < n_q; ++r) {
    const float* qr = q + r * q_stride;
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      const float* k = keys.data() + j * d;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot += qr[c] * k[c];
      scratch[size_t(j)] = dot * scale;
      max_score = std::max(max_score, scratch[size_t(j)]);
    }
    float sum = 0.f;
    for (int64_t j = 0; j < visible; ++j) {
      scratch[size_t(j)] = std::exp(scratch[size_t(j)] - max_score);
      sum += scratch[size_t(j)];
    }
    // sum >= 1 (the maximum contributes exp(0)); a NaN query propagates, as in attention.
    for (int64_t j = 0; j < visible; ++j) acc[size_t(j)] += double(scratch[size_t(j)] / sum);
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
  const int g = int(window_q.shape[1]) / shape.n_kv_heads;
  const auto* q = static_cast<const float*>(window_q.data);
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  const float scale = scale_for(store);
  std::vector<float> scratch;
  for (int h = 0; h < shape.n_kv_heads; ++h) {
    Head& head = heads_[size_t(h)];
    head.positions = all;
    head.acc.assign(size_t(n), 0.0);
    const std::vector<float> keys = gather_keys(store, layer, h, all);
    for (int64_t i = 0; i < w; ++i) {
      const int64_t position = n - w + i;  // query i attends [0, position]
      const float* rows = q + i * window_q.strides[0] + int64_t(h) * g * window_q.strides[1];
      add_probabilities(keys, shape.head_dim, position + 1, rows, window_q.strides[1], g, scale, head.acc, scratch);
    }
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
    const std::vector<float> keys = gather_keys(store, layer, h, head.positions);
    add_probabilities(keys, shape.head_dim, int64_t(head.positions.size()), qd + int64_t(h) * g * q.strides[0],
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
