// The fp64 references and test stores of the RazorAttention tests
// (razor_*_test.cpp): token roles, the compensation token and dense
// attention over the kept tokens from the stored keys and values, error
// bounds, a two-layer store with random tokens, random cases, heads and
// selections, and the checks of a compensation and of razor decode attention.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "cpu/store_fixture.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/razor.h"
#include "test_seed.h"

namespace longctx::policy::razor_testing {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using cpu::testing::topology;

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

// ---- reference ------------------------------------------------------------------------

enum class Role { kSink, kDropped, kBuffer };

// Each token's role in a non-retrieval head, classified one by one.
inline std::vector<Role> roles(int64_t n, const RazorParams& p) {
  const int64_t buffer = std::max({p.buffer_min, n / p.buffer_ratio, p.local_window});
  std::vector<Role> r;
  for (int64_t t = 0; t < n; ++t) r.push_back(t < p.sinks ? Role::kSink : t >= n - buffer ? Role::kBuffer : Role::kDropped);
  return r;
}

struct Compensation {
  int64_t n_dropped = 0;
  std::vector<double> key, value;  // means, [head_dim]
};

inline Compensation reference_compensation(const prefill_ref::StoredHead& head, const std::vector<Role>& role) {
  Compensation c;
  c.key.assign(size_t(head.head_dim), 0.0);
  c.value.assign(size_t(head.head_dim), 0.0);
  for (size_t t = 0; t < role.size(); ++t) {
    if (role[t] != Role::kDropped) continue;
    ++c.n_dropped;
    for (size_t ch = 0; ch < c.key.size(); ++ch) {
      c.key[ch] += head.key(int64_t(t))[ch];
      c.value[ch] += head.value(int64_t(t))[ch];
    }
  }
  for (size_t ch = 0; ch < c.key.size(); ++ch) {
    if (c.n_dropped > 0) c.key[ch] /= double(c.n_dropped), c.value[ch] /= double(c.n_dropped);
  }
  return c;
}

struct Dense {
  std::vector<double> out;
  double lse = -std::numeric_limits<double>::infinity();
  double max_logit_terms = 0;  // A: max over entries of |logit terms| (scale sum |q k|, + ln N_d)
  double max_abs_value = 0;
  int64_t n = 0;               // entries
};

// Softmax of one query over `tokens` of a head plus, when comp.n_dropped > 0,
// N_d copies of the token (comp.key, comp.value): sum_t e^{s_t} + N_d e^{s_c}.
inline Dense dense_reference(const float* q, double scale, const prefill_ref::StoredHead& head,
                             const std::vector<int64_t>& tokens, const Compensation* comp) {
  const size_t d = size_t(head.head_dim);
  struct Entry {
    double logit, weight;
    const double* value;
  };
  std::vector<Entry> entries;
  Dense r;
  r.out.assign(d, 0.0);
  const auto add = [&](const double* k, const double* v, double weight) {
    double dot = 0, terms = 0;
    for (size_t c = 0; c < d; ++c) dot += double(q[c]) * k[c], terms += std::abs(double(q[c]) * k[c]);
    entries.push_back({scale * dot, weight, v});
    r.max_logit_terms = std::max(r.max_logit_terms, scale * terms + std::log(weight));
    for (size_t c = 0; c < d; ++c) r.max_abs_value = std::max(r.max_abs_value, std::abs(v[c]));
  };
  for (int64_t t : tokens) add(head.key(t), head.value(t), 1.0);
  if (comp && comp->n_dropped > 0) add(comp->key.data(), comp->value.data(), double(comp->n_dropped));
  r.n = int64_t(entries.size());
  if (entries.empty()) return r;
  double m = -std::numeric_limits<double>::infinity();
  for (const Entry& e : entries) m = std::max(m, e.logit);
  double sum = 0;
  for (const Entry& e : entries) {
    const double p = e.weight * std::exp(e.logit - m);
    sum += p;
    for (size_t c = 0; c < d; ++c) r.out[c] += p * e.value[c];
  }
  for (double& x : r.out) x /= sum;
  r.lse = m + std::log(sum);
  return r;
}

// The error bound of the f32 kernels (decode_attention's derivation in
// attention_test.cpp: scores with head_dim + 1 roundings, exp within 1 ulp,
// n + 8 roundings of the sums), with one more merge for the compensation
// token, whose logit (fp64, rounded once to f32) enters A with its ln N_d.
struct Bounds {
  double out = 0, lse = 0;
};

inline Bounds error_bounds(const Dense& ref, int head_dim) {
  const double a = ref.max_logit_terms;
  const double ds = (head_dim + 1) * kU * a;
  const double delta = 2 * ds + 2 * kU * a + 2 * kU;
  const double rounding = double(ref.n + 10) * kU;
  return {2 * ref.max_abs_value * (2 * delta + 2 * rounding), 2 * (ds + delta + rounding + kU * std::abs(ref.lse))};
}

// ---- stores ---------------------------------------------------------------------------

struct Case {
  DType kv_type = DType::kF16;
  int block_size = 16;
  int head_dim = 16;
  int n_kv_heads = 2;
  int g = 1;
  int64_t max_tokens = 512;
  int local_windows_len = 0;
  int initial_len = 0;
  RazorConfig razor;
  int n_q_heads() const { return g * n_kv_heads; }
  std::string describe() const {
    return str_cat(dtype_name(kv_type), " block=", block_size, " head_dim=", head_dim, " kv_heads=", n_kv_heads,
                   " g=", g, " sinks=", razor.sinks, " S0=", razor.buffer_min, " C=", razor.buffer_ratio,
                   " W=", local_windows_len);
  }
};

// A two-layer store; layer kLayer is the one tested, layer 0 holds other tokens.
class RazorStore {
 public:
  static constexpr int kLayer = 1;

  RazorStore(const Case& c, uint32_t seed) : case_(c), rng_(test_seed(seed)), budget_(uint64_t{1} << 30) {
    LongContextConfig config = cpu::testing::kernel_store_config(c.kv_type, c.block_size, c.max_tokens);
    config.initial_len = c.initial_len;
    config.local_windows_len = c.local_windows_len;
    config.razor = c.razor;
    store_ = std::make_unique<kvstore::KVStore>(kvstore::KVShape{2, c.n_kv_heads, c.head_dim}, config, budget_,
                                                topology());
    append(0, 3);
  }

  // Appends n random tokens (normal keys and values) to `layer`.
  void append(int layer, int64_t n) {
    std::normal_distribution<float> normal;
    std::vector<float> k(size_t(n * case_.n_kv_heads * case_.head_dim)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = normal(rng_), v[i] = normal(rng_);
    store_->append(layer, make_view(k.data(), DType::kF32, {n, case_.n_kv_heads, case_.head_dim}),
                   make_view(v.data(), DType::kF32, {n, case_.n_kv_heads, case_.head_dim}));
  }

  std::vector<float> random_q() {
    std::normal_distribution<float> normal;
    std::vector<float> q(size_t(case_.n_q_heads() * case_.head_dim));
    for (float& x : q) x = normal(rng_);
    return q;
  }

  kvstore::KVStore& store() { return *store_; }
  int64_t n_tokens() const { return store_->n_tokens(kLayer); }
  RazorParams params() const { return razor_params(store_->config()); }
  std::mt19937& rng() { return rng_; }

 private:
  Case case_;
  std::mt19937 rng_;
  kvstore::MemoryBudget budget_;
  std::unique_ptr<kvstore::KVStore> store_;
};

inline Case random_case(std::mt19937& rng) {
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16};
  Case c;
  c.kv_type = types[rng() % 3];
  c.block_size = rng() % 2 ? 4 : 16;
  c.head_dim = 8 << (rng() % 3);
  c.n_kv_heads = 1 + int(rng() % 3);
  c.g = 1 << (rng() % 3);
  c.razor.sinks = int(rng() % 7);
  c.razor.buffer_min = int(rng() % 21);
  c.razor.buffer_ratio = 1 + int(rng() % 6);
  c.local_windows_len = rng() % 2 ? 0 : int(rng() % 25);
  c.initial_len = int(rng() % 9);
  return c;
}

inline RetrievalHeads random_heads(const Case& c, std::mt19937& rng) {
  RetrievalHeads heads(2, c.n_kv_heads);
  for (int layer = 0; layer < 2; ++layer)
    for (int h = 0; h < c.n_kv_heads; ++h) heads.set(layer, h, rng() % 3 == 0);
  return heads;
}

// Compares the compensation state of a layer with the reference, per tracked head.
inline void expect_compensation(RazorStore& s, const Case& c, const RazorCompensation& comp) {
  const std::vector<Role> role = roles(s.n_tokens(), s.params());
  ASSERT_EQ(comp.n_tokens(), s.n_tokens());
  ASSERT_EQ(comp.n_dropped(), std::count(role.begin(), role.end(), Role::kDropped));
  for (int h = 0; h < c.n_kv_heads; ++h) {
    if (!comp.tracks(h)) continue;
    SCOPED_TRACE(::testing::Message() << "kv head " << h << " tokens " << s.n_tokens());
    const prefill_ref::StoredHead head = prefill_ref::stored_head(s.store(), RazorStore::kLayer, h);
    const Compensation ref = reference_compensation(head, role);
    const std::vector<double> key = comp.mean_key(h), value = comp.mean_value(h);
    if (ref.n_dropped == 0) {
      EXPECT_TRUE(key.empty() && value.empty());
      continue;
    }
    ASSERT_EQ(key.size(), size_t(c.head_dim));
    // Both are fp64 sums of the same stored values: within n * 2^-53 of each
    // other relative to the sum of magnitudes (<= 8 for normal samples).
    const double tol = double(ref.n_dropped + 2) * std::ldexp(1.0, -52) * 8.0;
    for (int ch = 0; ch < c.head_dim; ++ch) {
      EXPECT_NEAR(key[size_t(ch)], ref.key[size_t(ch)], tol) << "channel " << ch;
      EXPECT_NEAR(value[size_t(ch)], ref.value[size_t(ch)], tol) << "channel " << ch;
    }
  }
}

struct Result {
  std::vector<float> out, lse;
};

inline Result run_razor(RazorStore& s, const Case& c, const std::vector<float>& q, const Selection& retrieval,
                        const RetrievalHeads& heads, const RazorCompensation& comp, bool include_local) {
  Result r;
  r.out.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
  r.lse.assign(size_t(c.n_q_heads()), std::numeric_limits<float>::quiet_NaN());
  RazorDecodeParams params;
  params.include_local = include_local;
  razor_decode_attention(s.store(), RazorStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         retrieval, heads, comp, params,
                         make_mutable_view(r.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         make_mutable_view(r.lse.data(), DType::kF32, {c.n_q_heads()}));
  return r;
}

// Random retrieval spans: runs of taken and skipped tokens.
inline Selection random_selection(int n_kv_heads, int64_t n, std::mt19937& rng) {
  Selection s;
  s.spans.resize(size_t(n_kv_heads));
  for (auto& spans : s.spans) {
    int64_t t = int64_t(rng() % 4);
    while (t < n) {
      const int64_t end = std::min(n, t + 1 + int64_t(rng() % 9));
      spans.push_back({t, end});
      t = end + 1 + int64_t(rng() % 9);
    }
  }
  return s;
}

inline void expect_razor_matches_reference(RazorStore& s, const Case& c, const std::vector<float>& q,
                                           const Selection& retrieval, const RetrievalHeads& heads, bool include_local,
                                           const Result& r) {
  const double scale = 1.0 / std::sqrt(double(float(c.head_dim)));
  const std::vector<Role> role = roles(s.n_tokens(), s.params());
  const int64_t end = include_local ? s.n_tokens() : s.store().partition(RazorStore::kLayer).local_begin;
  for (int qh = 0; qh < c.n_q_heads(); ++qh) {
    const int h = qh / c.g;
    SCOPED_TRACE(::testing::Message() << "query head " << qh << " kv head " << h);
    const prefill_ref::StoredHead head = prefill_ref::stored_head(s.store(), RazorStore::kLayer, h);
    std::vector<int64_t> tokens;
    Compensation comp;
    if (heads.is_retrieval(RazorStore::kLayer, h)) {
      tokens = attention_ref::tokens_of(retrieval.spans[size_t(h)]);
    } else {
      for (int64_t t = 0; t < end; ++t)
        if (role[size_t(t)] != Role::kDropped) tokens.push_back(t);
      comp = reference_compensation(head, role);
    }
    const Dense ref = dense_reference(q.data() + size_t(qh * c.head_dim), scale, head, tokens, &comp);
    const float* out = r.out.data() + size_t(qh * c.head_dim);
    if (ref.n == 0) {
      ASSERT_EQ(r.lse[size_t(qh)], -kInf);
      for (int ch = 0; ch < c.head_dim; ++ch) ASSERT_EQ(out[ch], 0.f);
      continue;
    }
    const Bounds b = error_bounds(ref, c.head_dim);
    ASSERT_NEAR(r.lse[size_t(qh)], ref.lse, b.lse);
    for (int ch = 0; ch < c.head_dim; ++ch) ASSERT_NEAR(out[ch], ref.out[size_t(ch)], b.out) << "channel " << ch;
  }
}

}  // namespace longctx::policy::razor_testing
