// The estimated tail of a select step (tail.h).
#include "longctx/policy/tail.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "longctx/core/error.h"
#include "longctx/core/lse_merge.h"
#include "longctx/kvstore/node_executor.h"

namespace longctx::policy {
namespace {

// 4 floats as one value (GCC/Clang vector extension, one SSE register): the
// loops below compile to vector instructions on any x86-64 (d is a multiple of 8).
using F32x4 = float __attribute__((vector_size(16)));
F32x4 load4(const float* p) {
  F32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store4(float* p, F32x4 v) { std::memcpy(p, &v, sizeof v); }

float dot(const float* a, const float* b, int d) {
  F32x4 acc0{}, acc1{};
  for (int c = 0; c < d; c += 8) {
    acc0 += load4(a + c) * load4(b + c);
    acc1 += load4(a + c + 4) * load4(b + c + 4);
  }
  const F32x4 acc = acc0 + acc1;
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Σ a_c b_c²
float dot_sq(const float* a, const float* b, int d) {
  F32x4 acc0{}, acc1{};
  for (int c = 0; c < d; c += 8) {
    const F32x4 b0 = load4(b + c), b1 = load4(b + c + 4);
    acc0 += load4(a + c) * b0 * b0;
    acc1 += load4(a + c + 4) * b1 * b1;
  }
  const F32x4 acc = acc0 + acc1;
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// y += a x
void axpy(float a, const float* x, float* y, int d) {
  for (int c = 0; c < d; c += 4) store4(y + c, load4(y + c) + a * load4(x + c));
}

// y *= a
void scale_by(float a, float* y, int d) {
  for (int c = 0; c < d; c += 4) store4(y + c, a * load4(y + c));
}

}  // namespace

TailEstimate estimate_tail(const kvstore::KVStore& store, int layer, const TensorView& q,
                           const cpu::Selection& selection, float scale) {
  const kvstore::StoreLayout& layout = store.layout();
  const int n_kv = layout.shape.n_kv_heads, d = layout.shape.head_dim, bs = layout.block_size;
  if (layout.record_tail_offset == 0)
    fail(ErrorCode::kInvalidArgument, "estimate_tail: the KV store keeps no tail sums (it was built with tail: drop)");
  if (layer < 0 || layer >= layout.shape.n_layers)
    fail(ErrorCode::kInvalidArgument, "estimate_tail: layer ", layer, " outside [0, ", layout.shape.n_layers, ")");
  if (q.rank != 2 || q.dtype != DType::kF32 || q.shape[1] != d || q.shape[0] < 1 || q.shape[0] % n_kv != 0 ||
      q.strides[1] != 1)
    fail(ErrorCode::kInvalidArgument, "estimate_tail: q must be f32 [n_q_heads, ", d, "] with n_q_heads a multiple of ",
         n_kv, " and unit channel stride, got ", q.describe());
  if (int(selection.spans.size()) != n_kv)
    fail(ErrorCode::kInvalidArgument, "estimate_tail: a selection for ", selection.spans.size(),
         " kv heads, the store has ", n_kv);
  const int n_q = int(q.shape[0]), group = n_q / n_kv;
  const float s = scale != 0.f ? scale : 1.f / std::sqrt(float(d));
  const kvstore::Partition part = store.partition(layer);
  const int64_t b0 = part.first_context_block, b1 = part.end_context_block;

  TailEstimate tail;
  tail.out.assign(size_t(n_q) * d, 0.f);
  tail.lse.assign(size_t(n_q), -std::numeric_limits<float>::infinity());
  std::vector<int64_t> blocks_per_head(size_t(n_kv), 0);
  kvstore::parallel_for_heads(store, n_kv, [](int64_t h) { return int(h); }, [&](int64_t item) {
    const int g = int(item);
    // The context blocks no span of this head touches.
    std::vector<char> touched(size_t(b1 - b0), 0);
    for (const cpu::TokenSpan& span : selection.spans[size_t(g)])
      for (int64_t b = std::max(b0, span.begin / bs); b < b1 && b * bs < span.end; ++b)
        if (span.begin < part.context_end_of(b, bs) && part.context_begin_of(b, bs) < span.end)
          touched[size_t(b - b0)] = 1;
    std::vector<int64_t> blocks;
    for (int64_t b = b0; b < b1; ++b)
      if (!touched[size_t(b - b0)] && part.context_end_of(b, bs) > part.context_begin_of(b, bs)) blocks.push_back(b);
    blocks_per_head[size_t(g)] = int64_t(blocks.size());
    if (blocks.empty()) return;

    // One pass over the blocks' records (each read once), an online softmax
    // per query head of the group: l = s (q·ksum_b) / n_filled + log n_b + s² var / 2,
    // out += exp(l - m) · vsum_b / n_filled, rescaled when the running max m grows.
    std::vector<float> m(static_cast<size_t>(group), -std::numeric_limits<float>::infinity());
    std::vector<double> w_sum(static_cast<size_t>(group), 0.0);
    float* out = tail.out.data() + size_t(g * group) * d;
    std::vector<float> q_sq(size_t(group) * d);  // the group's q, squared per channel
    for (int j = 0; j < group; ++j)
      for (int c = 0; c < d; ++c) {
        const float x = static_cast<const float*>(q.data)[(g * group + j) * q.strides[0] + c];
        q_sq[size_t(j) * d + c] = x * x;
      }
    const float log_bs = std::log(float(bs));  // log n_b of every block the context does not clip
    for (const int64_t b : blocks) {
      const auto* ksum = reinterpret_cast<const float*>(store.rep_record(layer, g, b) + layout.record_tail_offset);
      const float* vsum = ksum + d;
      const float* ksq = ksum + 2 * d;
      const float inv_filled = 1.f / float(std::min<int64_t>(bs, part.n_tokens - b * bs));
      const int64_t n = part.context_end_of(b, bs) - part.context_begin_of(b, bs);
      const float log_n = n == bs ? log_bs : std::log(float(n));
      for (int j = 0; j < group; ++j) {
        const float* qh = static_cast<const float*>(q.data) + (g * group + j) * q.strides[0];
        // Σ_c q_c² var_c = (q²·ksq - q²·ksum² / n_filled) / n_filled, at least 0 (rounding).
        const float* q2 = q_sq.data() + size_t(j) * d;
        const float var = std::max(0.f, (dot(q2, ksq, d) - dot_sq(q2, ksum, d) * inv_filled) * inv_filled);
        const float l = s * dot(qh, ksum, d) * inv_filled + log_n + 0.5f * s * s * var;
        float* acc = out + size_t(j) * d;
        if (l > m[size_t(j)]) {  // a new max: what was summed so far shrinks by exp(old - new)
          const float shrink = std::exp(m[size_t(j)] - l);  // 0 for the first block
          w_sum[size_t(j)] *= shrink;
          scale_by(shrink, acc, d);
          m[size_t(j)] = l;
        }
        const float w = std::exp(l - m[size_t(j)]);
        w_sum[size_t(j)] += w;
        axpy(w * inv_filled, vsum, acc, d);  // w_b v̄_b = w_b / n_filled · vsum_b
      }
    }
    for (int j = 0; j < group; ++j) {
      const float inv_w = float(1.0 / w_sum[size_t(j)]);
      scale_by(inv_w, out + size_t(j) * d, d);
      tail.lse[size_t(g * group + j)] = m[size_t(j)] + float(std::log(w_sum[size_t(j)]));
    }
  });
  for (int64_t n : blocks_per_head) tail.tail_blocks += n;
  return tail;
}

std::vector<double> merge_tail(const TailEstimate& tail, const MutableTensorView& out, const MutableTensorView& lse) {
  const int n_q = int(tail.lse.size());
  const int d = n_q > 0 ? int(tail.out.size() / size_t(n_q)) : 0;
  std::vector<double> share(size_t(n_q), 0.0);
  for (int h = 0; h < n_q; ++h) {
    float* o = static_cast<float*>(out.data) + h * out.strides[0];
    float* l = static_cast<float*>(lse.data) + h * lse.strides[0];
    const float parts[2] = {*l, tail.lse[size_t(h)]};
    const LseMerge m = lse_merge(parts, 2);
    if (m.max_lse == -INFINITY) continue;  // both empty: out stays 0, lse -inf
    const float wa = lse_weight(parts[0], m.max_lse) / m.weight_sum;
    const float wb = lse_weight(parts[1], m.max_lse) / m.weight_sum;
    const float* t = tail.out.data() + size_t(h) * d;
    for (int c = 0; c < d; ++c) o[c] = (parts[0] == -INFINITY ? 0.f : wa * o[c]) + wb * t[c];
    *l = m.lse;
    share[size_t(h)] = double(wb);
  }
  return share;
}

}  // namespace longctx::policy
