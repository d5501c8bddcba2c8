// The estimated tail (policy/tail.h): estimate_tail against an fp64 reading
// of its definition over the stored keys and values (random stores: kv
// dtypes, head_dim 64/128/256, GQA 1-8, partial blocks, sinks and local
// window clipping blocks, random selections); merge_tail's identities (every
// block selected: exactly the exact part; nothing selected: exactly the
// estimate; both empty: 0 and -inf); DecodePolicy with tail: estimate.
#include "longctx/policy/tail.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/policy/decode_policy.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Case {
  DType kv = DType::kF16;
  int n_kv = 2, group = 2, head_dim = 64, block_size = 16, initial = 0, local = 0;
  int64_t n_tokens = 100;
};

struct Store {
  kvstore::MemoryBudget budget{uint64_t{1} << 30};
  LongContextConfig config;
  std::unique_ptr<kvstore::KVStore> store;
};

std::unique_ptr<Store> make_store(const Case& c, std::mt19937& rng, TailMode tail = TailMode::kEstimate) {
  auto s = std::make_unique<Store>();
  s->config.block_size = c.block_size;
  s->config.kv_type = c.kv;
  s->config.initial_len = c.initial;
  s->config.local_windows_len = c.local;
  s->config.max_seq_len = c.n_tokens + 8;
  s->config.second_select_num = 4;
  s->config.dense_layer_num = 0;
  s->config.tail = tail;
  s->store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, c.n_kv, c.head_dim}, s->config, s->budget,
                                                cpu::testing::topology());
  // Keys with a per-block offset so block means differ; two chunks.
  const size_t row = size_t(c.n_kv) * c.head_dim;
  std::vector<float> k(size_t(c.n_tokens) * row), v(k.size());
  std::normal_distribution<float> normal;
  for (int64_t t = 0; t < c.n_tokens; ++t)
    for (size_t i = 0; i < row; ++i) {
      k[size_t(t) * row + i] = 0.5f * normal(rng) + 0.3f * float((t / c.block_size) % 5) - 0.6f;
      v[size_t(t) * row + i] = normal(rng);
    }
  const int64_t cut = c.n_tokens / 3;
  cpu::testing::append(*s->store, 0, k.data(), v.data(), cut);
  cpu::testing::append(*s->store, 0, k.data() + size_t(cut) * row, v.data() + size_t(cut) * row, c.n_tokens - cut);
  return s;
}

// Per kv head, each context block kept with probability 1/3, as token spans
// (with the sinks and the local window, like a real selection).
cpu::Selection random_selection(const kvstore::KVStore& store, std::mt19937& rng, double keep = 1.0 / 3) {
  const kvstore::Partition p = store.partition(0);
  const int bs = store.layout().block_size;
  cpu::Selection sel;
  for (int h = 0; h < store.layout().shape.n_kv_heads; ++h) {
    std::vector<bool> in(size_t(p.n_tokens), false);
    for (int64_t t = 0; t < p.initial_end; ++t) in[size_t(t)] = true;
    for (int64_t t = p.local_begin; t < p.n_tokens; ++t) in[size_t(t)] = true;
    for (int64_t b = p.first_context_block; b < p.end_context_block; ++b)
      if (std::uniform_real_distribution<double>()(rng) < keep)
        for (int64_t t = p.context_begin_of(b, bs); t < p.context_end_of(b, bs); ++t) in[size_t(t)] = true;
    sel.spans.push_back(cpu::testing::spans_of(in));
  }
  return sel;
}

struct Ref {
  std::vector<double> out, lse;
};

// The definition in fp64, from the keys and values as the store holds them.
Ref reference(const kvstore::KVStore& store, const std::vector<float>& q, int n_q, const cpu::Selection& sel,
              double scale) {
  const kvstore::StoreLayout& L = store.layout();
  const int n_kv = L.shape.n_kv_heads, d = L.shape.head_dim, bs = L.block_size, group = n_q / n_kv;
  const kvstore::Partition p = store.partition(0);
  Ref r;
  r.out.assign(size_t(n_q) * d, 0.0);
  r.lse.assign(size_t(n_q), -INFINITY);
  for (int g = 0; g < n_kv; ++g) {
    std::vector<double> logit_of;  // per tail block, for each query head of the group
    std::vector<std::vector<double>> vmeans, kmeans, kvars;
    std::vector<double> log_n;
    for (int64_t b = p.first_context_block; b < p.end_context_block; ++b) {
      const int64_t cb = p.context_begin_of(b, bs), ce = p.context_end_of(b, bs);
      if (ce <= cb) continue;
      bool touched = false;
      for (const cpu::TokenSpan& s : sel.spans[size_t(g)]) touched = touched || (s.begin < ce && cb < s.end);
      if (touched) continue;
      const kvstore::BlockView view = store.block(0, g, b);
      std::vector<float> kt(size_t(d) * view.n_filled), vv(size_t(view.n_filled) * d);
      kvstore::read_keys_t(L, view, 0, view.n_filled, kt.data(), size_t(view.n_filled));
      kvstore::read_values(L, view, 0, view.n_filled, vv.data(), size_t(d));
      std::vector<double> km(size_t(d), 0.0), vm(size_t(d), 0.0), kv(size_t(d), 0.0);
      for (int c = 0; c < d; ++c)
        for (int t = 0; t < view.n_filled; ++t) {
          km[size_t(c)] += kt[size_t(c) * view.n_filled + t] / view.n_filled;
          vm[size_t(c)] += vv[size_t(t) * d + c] / view.n_filled;
        }
      for (int c = 0; c < d; ++c)  // the per-channel variance of the stored keys
        for (int t = 0; t < view.n_filled; ++t) {
          const double x = kt[size_t(c) * view.n_filled + t] - km[size_t(c)];
          kv[size_t(c)] += x * x / view.n_filled;
        }
      kmeans.push_back(km);
      kvars.push_back(kv);
      vmeans.push_back(vm);
      log_n.push_back(std::log(double(ce - cb)));
    }
    for (int j = 0; j < group; ++j) {
      const int h = g * group + j;
      if (kmeans.empty()) continue;
      std::vector<double> l;
      for (size_t i = 0; i < kmeans.size(); ++i) {
        double dot = 0, var = 0;
        for (int c = 0; c < d; ++c) {
          const double qc = q[size_t(h) * d + c];
          dot += qc * kmeans[i][size_t(c)];
          var += qc * qc * kvars[i][size_t(c)];
        }
        l.push_back(scale * dot + log_n[i] + 0.5 * scale * scale * var);
      }
      const double m = *std::max_element(l.begin(), l.end());
      double w_sum = 0;
      for (size_t i = 0; i < l.size(); ++i) {
        const double w = std::exp(l[i] - m);
        w_sum += w;
        for (int c = 0; c < d; ++c) r.out[size_t(h) * d + c] += w * vmeans[i][size_t(c)];
      }
      for (int c = 0; c < d; ++c) r.out[size_t(h) * d + c] /= w_sum;
      r.lse[size_t(h)] = m + std::log(w_sum);
    }
  }
  return r;
}

TEST(Tail, EstimateMatchesTheFp64Definition) {
  std::mt19937 rng(test_seed(7));
  int cases = 0;
  for (DType kv : {DType::kF16, DType::kBF16, DType::kF32, DType::kQ8_0})
    for (int head_dim : {64, 128, 256})
      for (int group : {1, 4, 8}) {
        Case c;
        c.kv = kv, c.head_dim = head_dim, c.group = group, c.n_kv = 1 + cases % 3;
        c.block_size = cases % 2 == 0 ? 16 : 32;
        c.initial = cases % 3 == 0 ? 0 : 5;       // clips the first block
        c.local = cases % 4 == 0 ? 0 : 21;        // clips a block from the end
        c.n_tokens = 150 + 37 * (cases % 5);      // a partial last block
        ++cases;
        SCOPED_TRACE(str_cat(dtype_name(kv), " d=", head_dim, " group=", group, " kv=", c.n_kv, " block=",
                             c.block_size, " initial=", c.initial, " local=", c.local, " tokens=", c.n_tokens));
        auto s = make_store(c, rng);
        const int n_q = c.n_kv * c.group;
        const std::vector<float> q = cpu::testing::normal_values(size_t(n_q) * head_dim, rng);
        const TensorView qv = make_view(q.data(), DType::kF32, {n_q, head_dim});
        const cpu::Selection sel = random_selection(*s->store, rng);
        const float scale = cases % 2 == 0 ? 0.f : 0.3f;
        const TailEstimate tail = estimate_tail(*s->store, 0, qv, sel, scale);
        const Ref ref = reference(*s->store, q, n_q, sel, scale != 0.f ? scale : 1.0 / std::sqrt(double(head_dim)));
        for (int h = 0; h < n_q; ++h) {
          if (std::isinf(ref.lse[size_t(h)])) {
            EXPECT_EQ(tail.lse[size_t(h)], kNegInf) << "head " << h;
            continue;
          }
          EXPECT_NEAR(tail.lse[size_t(h)], ref.lse[size_t(h)], 1e-4 * (1 + std::abs(ref.lse[size_t(h)])))
              << "head " << h;
          for (int ch = 0; ch < head_dim; ++ch)
            ASSERT_NEAR(tail.out[size_t(h) * head_dim + ch], ref.out[size_t(h) * head_dim + ch], 1e-4)
                << "head " << h << " channel " << ch;
        }
      }
}

// Every context block selected: an empty tail, and the merge leaves the
// exact part bit for bit. Nothing selected: the result is the estimate, bit
// for bit. Neither: 0 and -inf.
TEST(Tail, MergeIdentities) {
  std::mt19937 rng(test_seed(8));
  Case c;
  c.n_kv = 2, c.group = 4, c.head_dim = 128, c.initial = 4, c.local = 16, c.n_tokens = 300;
  auto s = make_store(c, rng);
  const int n_q = 8, d = 128;
  const std::vector<float> q = cpu::testing::normal_values(size_t(n_q) * d, rng);
  const TensorView qv = make_view(q.data(), DType::kF32, {n_q, d});

  const cpu::Selection all = random_selection(*s->store, rng, 1.0);
  const TailEstimate none_left = estimate_tail(*s->store, 0, qv, all, 0.f);
  EXPECT_EQ(none_left.tail_blocks, 0);
  std::vector<float> out(static_cast<size_t>(n_q * d)), lse(static_cast<size_t>(n_q));
  cpu::decode_attention(*s->store, 0, qv, all, {}, make_mutable_view(out.data(), DType::kF32, {n_q, d}),
                        make_mutable_view(lse.data(), DType::kF32, {n_q}));
  const std::vector<float> exact_out = out, exact_lse = lse;
  const std::vector<double> share = merge_tail(none_left, make_mutable_view(out.data(), DType::kF32, {n_q, d}),
                                               make_mutable_view(lse.data(), DType::kF32, {n_q}));
  EXPECT_EQ(out, exact_out);
  EXPECT_EQ(lse, exact_lse);
  EXPECT_EQ(share, std::vector<double>(size_t(n_q), 0.0));

  cpu::Selection nothing;
  nothing.spans.resize(2);
  const TailEstimate everything = estimate_tail(*s->store, 0, qv, nothing, 0.f);
  EXPECT_GT(everything.tail_blocks, 0);
  std::fill(out.begin(), out.end(), 0.f);
  std::fill(lse.begin(), lse.end(), kNegInf);  // the exact part of an empty selection
  const std::vector<double> all_tail = merge_tail(everything, make_mutable_view(out.data(), DType::kF32, {n_q, d}),
                                                  make_mutable_view(lse.data(), DType::kF32, {n_q}));
  EXPECT_EQ(out, everything.out);
  EXPECT_EQ(lse, everything.lse);
  EXPECT_EQ(all_tail, std::vector<double>(size_t(n_q), 1.0));

  TailEstimate empty;
  empty.out.assign(size_t(n_q) * d, 0.f);
  empty.lse.assign(size_t(n_q), kNegInf);
  std::fill(out.begin(), out.end(), 0.f);
  std::fill(lse.begin(), lse.end(), kNegInf);
  merge_tail(empty, make_mutable_view(out.data(), DType::kF32, {n_q, d}),
             make_mutable_view(lse.data(), DType::kF32, {n_q}));
  EXPECT_EQ(out, std::vector<float>(out.size(), 0.f));
  EXPECT_EQ(lse, std::vector<float>(lse.size(), kNegInf));
}

TEST(Tail, RefusesAStoreWithoutSumsAndBadArguments) {
  std::mt19937 rng(test_seed(9));
  Case c;
  auto plain = make_store(c, rng, TailMode::kDrop);
  const std::vector<float> q(size_t(4) * 64, 0.1f);
  const TensorView qv = make_view(q.data(), DType::kF32, {4, 64});
  const cpu::Selection sel = random_selection(*plain->store, rng);
  cpu::testing::expect_invalid([&] { estimate_tail(*plain->store, 0, qv, sel, 0.f); }, {"no tail sums", "tail: drop"});
  auto s = make_store(c, rng);
  cpu::testing::expect_invalid([&] { estimate_tail(*s->store, 3, qv, sel, 0.f); }, {"layer 3"});
  const TensorView bad = make_view(q.data(), DType::kF32, {3, 64});
  cpu::testing::expect_invalid([&] { estimate_tail(*s->store, 0, bad, sel, 0.f); }, {"multiple of 2"});
  cpu::Selection one;
  one.spans.resize(1);
  cpu::testing::expect_invalid([&] { estimate_tail(*s->store, 0, qv, one, 0.f); }, {"1 kv heads"});
}

// DecodePolicy with tail: estimate: the exact part and the tail merged, the
// tail's share reported; with every block selected, the same bits as tail: drop.
TEST(Tail, DecodePolicyAddsTheTailAndReportsItsMass) {
  std::mt19937 rng(test_seed(10));
  Case c;
  c.n_kv = 2, c.group = 2, c.head_dim = 64, c.block_size = 16, c.initial = 4, c.local = 16, c.n_tokens = 400;
  auto s = make_store(c, rng);
  const int n_q = 4, d = 64;
  const std::vector<float> q = cpu::testing::normal_values(size_t(n_q) * d, rng);
  const TensorView qv = make_view(q.data(), DType::kF32, {n_q, d});
  std::vector<float> out(static_cast<size_t>(n_q * d)), lse(static_cast<size_t>(n_q));
  const auto out_v = make_mutable_view(out.data(), DType::kF32, {n_q, d});
  const auto lse_v = make_mutable_view(lse.data(), DType::kF32, {n_q});

  LongContextConfig config = s->config;
  config.head_select_mode = HeadSelectMode::kSeparate;
  DecodePolicy with_tail(config, *s->store, 0.f);
  with_tail.decode(0, 0, qv, true, out_v, lse_v);
  const DecodePolicy::Stats st = with_tail.last_stats();
  ASSERT_EQ(st.tail_mass.size(), 2u);
  for (double m : st.tail_mass) EXPECT_TRUE(m > 0.0 && m < 1.0) << m;
  EXPECT_GT(st.tail_blocks, 0);
  // The result is the exact part over the same selection merged with the estimate.
  std::vector<float> want(out.size()), want_lse(lse.size());
  cpu::decode_attention(*s->store, 0, qv, with_tail.last_selection(), {},
                        make_mutable_view(want.data(), DType::kF32, {n_q, d}),
                        make_mutable_view(want_lse.data(), DType::kF32, {n_q}));
  merge_tail(estimate_tail(*s->store, 0, qv, with_tail.last_selection(), 0.f),
             make_mutable_view(want.data(), DType::kF32, {n_q, d}), make_mutable_view(want_lse.data(), DType::kF32, {n_q}));
  EXPECT_EQ(out, want);
  EXPECT_EQ(lse, want_lse);

  // Every block selected (a budget larger than the context): tail: drop's bits.
  config.second_select_num = int(config.max_seq_len / c.block_size);  // more blocks than the context holds
  DecodePolicy all_tail(config, *s->store, 0.f);
  all_tail.decode(0, 0, qv, true, out_v, lse_v);
  EXPECT_EQ(all_tail.last_stats().tail_blocks, 0);
  EXPECT_EQ(all_tail.last_stats().tail_mass, std::vector<double>(2, 0.0));
  std::vector<float> dense(out.size()), dense_lse(lse.size());
  cpu::dense_decode_attention(*s->store, 0, qv, {}, make_mutable_view(dense.data(), DType::kF32, {n_q, d}),
                              make_mutable_view(dense_lse.data(), DType::kF32, {n_q}));
  EXPECT_EQ(out, dense);
  EXPECT_EQ(lse, dense_lse);
}

}  // namespace
}  // namespace longctx::policy
