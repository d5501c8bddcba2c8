// group_query and score_token_range (token_scores.h).
#include "token_scores.h"

#include <algorithm>

namespace longctx::policy::detail {

GroupQuery group_query(const TensorView& q, int kv_head, int group, Reduce reduce) {
  GroupQuery g;
  g.d = int(q.shape[1]);
  g.n_rows = reduce == Reduce::kSum ? 1 : group;
  g.rows.assign(size_t(g.n_rows) * size_t(g.d), 0.f);
  const float* first = static_cast<const float*>(q.data) + int64_t(kv_head) * group * q.strides[0];
  for (int j = 0; j < group; ++j) {
    const float* row = first + int64_t(j) * q.strides[0];
    float* to = g.rows.data() + size_t(reduce == Reduce::kSum ? 0 : j) * size_t(g.d);
    for (int c = 0; c < g.d; ++c) to[c] += row[c];
  }
  return g;
}

void score_token_range(const kvstore::KVStore& store, int layer, int kv_head, const GroupQuery& q, int64_t begin,
                       int64_t end, std::vector<float>& keys, std::vector<float>& out) {
  const kvstore::StoreLayout& layout = store.layout();
  const int bs = layout.block_size;
  // Keys are scored in their page, whole vectors of tokens at a time; a
  // span's last few tokens through f32 keys staged in `keys` (staging every
  // key had cost as much as the products).
  for (int64_t t = begin; t < end;) {
    const int64_t b = t / bs;
    const int n = int(std::min<int64_t>(end, (b + 1) * bs) - t);
    const int offset = int(t - b * bs);
    const kvstore::BlockView view = store.block(layer, kv_head, b);
    const size_t at = out.size();
    out.resize(at + size_t(padded_tokens(n)));
    const int direct = n / kTokenPad * kTokenPad;
    if (direct > 0)
      score_page_tokens(q.rows.data(), q.n_rows, q.d, view, layout.kv_type, bs, offset, direct, out.data() + at);
    if (direct < n) {
      const int rest = n - direct;
      const int ld = padded_tokens(rest);
      keys.resize(size_t(q.d) * size_t(ld));
      kvstore::read_keys_t(layout, view, offset + direct, rest, keys.data(), size_t(ld));
      score_tokens_t(q.rows.data(), q.n_rows, q.d, keys.data(), size_t(ld), rest, 1.f, out.data() + at + direct);
    }
    out.resize(at + size_t(n));
    t += n;
  }
}

}  // namespace longctx::policy::detail
