// The estimated tail of a select step (tail.h).
#include "longctx/policy/tail.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "longctx/core/error.h"
#include "longctx/core/lse_merge.h"
#include "longctx/kvstore/node_executor.h"
#include "tail_kernel.h"

namespace longctx::policy {

TailEstimate estimate_tail(const kvstore::KVStore& store, int layer, const TensorView& q,
                           const cpu::Selection& selection, float scale) {
  const kvstore::StoreLayout& layout = store.layout();
  const int n_kv = layout.shape.n_kv_heads, d = layout.shape.head_dim, bs = layout.block_size;
  if (layout.record_tail_offset == 0)
    fail(ErrorCode::kInvalidArgument, "estimate_tail: the KV store keeps no tail sums (it was built with tail: drop)");
  cpu::check_decode_query(store, layer, q, "estimate_tail");
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

    // The blocks' sums and sizes, the group's queries (and their squares), then the kernel.
    const size_t nb = blocks.size();
    std::vector<const float*> sums(nb);
    std::vector<float> inv_filled(nb), log_n(nb), logits(size_t(group) * nb);
    const float log_bs = std::log(float(bs));  // log n_b of every block the context does not clip
    for (size_t i = 0; i < nb; ++i) {
      const int64_t b = blocks[i];
      sums[i] = reinterpret_cast<const float*>(store.rep_record(layer, g, b) + layout.record_tail_offset);
      inv_filled[i] = 1.f / float(std::min<int64_t>(bs, part.n_tokens - b * bs));
      const int64_t n = part.context_end_of(b, bs) - part.context_begin_of(b, bs);
      log_n[i] = n == bs ? log_bs : std::log(float(n));
    }
    std::vector<float> qg(size_t(group) * d), q_sq(qg.size());
    for (int j = 0; j < group; ++j)
      for (int c = 0; c < d; ++c) {
        const float x = static_cast<const float*>(q.data)[(g * group + j) * q.strides[0] + c];
        qg[size_t(j) * d + c] = x;
        q_sq[size_t(j) * d + c] = x * x;
      }
    detail::TailHeadArgs args;
    args.sums = sums.data();
    args.inv_filled = inv_filled.data();
    args.log_n = log_n.data();
    args.n = nb;
    args.q = qg.data();
    args.q_sq = q_sq.data();
    args.group = group;
    args.d = d;
    args.scale = s;
    args.logits = logits.data();
    args.out = tail.out.data() + size_t(g * group) * d;
    args.lse = tail.lse.data() + size_t(g * group);
    detail::tail_head(args);
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
