// RazorAttention (policy/razor.h) against plain references written here:
// token ranges from a per-token classification, the compensation token from
// the dropped keys and values read back from the store in fp64, razor decode
// attention as one dense fp64 softmax over the kept tokens plus the
// compensation token weighted by N_d, and echo/induction scores from token
// equality (not position arithmetic) on synthetic probability rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
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

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using cpu::testing::topology;

constexpr float kInf = std::numeric_limits<float>::infinity();
const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

// ---- reference ------------------------------------------------------------------------

enum class Role { kSink, kDropped, kBuffer };

// Each token's role in a non-retrieval head, classified one by one.
std::vector<Role> roles(int64_t n, const RazorParams& p) {
  const int64_t buffer = std::max({p.buffer_min, n / p.buffer_ratio, p.local_window});
  std::vector<Role> r;
  for (int64_t t = 0; t < n; ++t) r.push_back(t < p.sinks ? Role::kSink : t >= n - buffer ? Role::kBuffer : Role::kDropped);
  return r;
}

struct Compensation {
  int64_t n_dropped = 0;
  std::vector<double> key, value;  // means, [head_dim]
};

Compensation reference_compensation(const prefill_ref::StoredHead& head, const std::vector<Role>& role) {
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
Dense dense_reference(const float* q, double scale, const prefill_ref::StoredHead& head,
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

Bounds error_bounds(const Dense& ref, int head_dim) {
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

  RazorStore(const Case& c, uint32_t seed) : case_(c), rng_(seed), budget_(uint64_t{1} << 30) {
    LongContextConfig config;
    config.max_seq_len = c.max_tokens;
    config.block_size = c.block_size;
    config.kv_type = c.kv_type;
    config.initial_len = c.initial_len;
    config.local_windows_len = c.local_windows_len;
    config.second_select_num = 0;
    config.representative_type = RepresentativeType::kMax;
    config.representative_num = 1;
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

Case random_case(std::mt19937& rng) {
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

RetrievalHeads random_heads(const Case& c, std::mt19937& rng) {
  RetrievalHeads heads(2, c.n_kv_heads);
  for (int layer = 0; layer < 2; ++layer)
    for (int h = 0; h < c.n_kv_heads; ++h) heads.set(layer, h, rng() % 3 == 0);
  return heads;
}

// Compares the compensation state of a layer with the reference, per tracked head.
void expect_compensation(RazorStore& s, const Case& c, const RazorCompensation& comp) {
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

Result run_razor(RazorStore& s, const Case& c, const std::vector<float>& q, const Selection& retrieval,
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
Selection random_selection(int n_kv_heads, int64_t n, std::mt19937& rng) {
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

void expect_razor_matches_reference(RazorStore& s, const Case& c, const std::vector<float>& q,
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

// ---- ranges ---------------------------------------------------------------------------

TEST(RazorRanges, MatchPerTokenRolesAndSpans) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    RazorParams p;
    p.sinks = int64_t(rng() % 8);
    p.buffer_min = int64_t(rng() % 30);
    p.buffer_ratio = 1 + int64_t(rng() % 7);
    p.local_window = rng() % 2 ? 0 : int64_t(rng() % 40);
    const int64_t n = int64_t(rng() % 150);
    const std::vector<Role> role = roles(n, p);
    const RazorRanges r = razor_ranges(n, p);
    SCOPED_TRACE(::testing::Message() << "n " << n << " sinks " << p.sinks << " S0 " << p.buffer_min << " C "
                                      << p.buffer_ratio << " W " << p.local_window);
    for (int64_t t = 0; t < n; ++t) {
      const Role got = t < r.sinks_end ? Role::kSink : t < r.buffer_begin ? Role::kDropped : Role::kBuffer;
      ASSERT_EQ(got, role[size_t(t)]) << "token " << t;
    }
    // Spans: the sink and buffer tokens below `end`, each exactly once.
    const int64_t end = int64_t(rng() % uint64_t(n + 1));
    std::vector<int64_t> expected;
    for (int64_t t = 0; t < end; ++t)
      if (role[size_t(t)] != Role::kDropped) expected.push_back(t);
    const std::vector<TokenSpan> spans = non_retrieval_spans(r, end);
    EXPECT_EQ(attention_ref::tokens_of(spans), expected);
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_LT(spans[i].begin, spans[i].end);
      if (i > 0) {
        EXPECT_LT(spans[i - 1].end, spans[i].begin) << "adjacent spans not merged";
      }
    }
  }
}

// The claim the incremental update rests on: as tokens arrive the dropped
// range only grows at its end (its begin is fixed once it is non-empty).
TEST(RazorRanges, DroppedRangeOnlyGrows) {
  for (int64_t sinks : {0, 4}) {
    for (int64_t s0 : {0, 7, 100}) {
      for (int64_t ratio : {1, 2, 5, 13}) {
        for (int64_t w : {0, 50}) {
          const RazorParams p{sinks, s0, ratio, w};
          RazorRanges previous = razor_ranges(0, p);
          for (int64_t n = 1; n < 3000; ++n) {
            const RazorRanges r = razor_ranges(n, p);
            ASSERT_GE(r.buffer_begin, previous.buffer_begin) << n;
            if (previous.n_dropped() > 0) {
              ASSERT_EQ(r.sinks_end, previous.sinks_end) << n;
            }
            previous = r;
          }
        }
      }
    }
  }
}

TEST(RazorRanges, RejectsBadParams) {
  EXPECT_THROW(razor_ranges(10, RazorParams{4, 10, 0, 0}), Error);
  EXPECT_THROW(razor_ranges(10, RazorParams{-1, 10, 5, 0}), Error);
  EXPECT_THROW(razor_ranges(-1, RazorParams{}), Error);
  EXPECT_THROW(razor_ranges(10, RazorParams{4, -1, 5, 0}), Error);
}

TEST(RazorRanges, ParamsFromConfig) {
  LongContextConfig config;
  config.razor.sinks = 7;
  config.razor.buffer_min = 123;
  config.razor.buffer_ratio = 9;
  config.local_windows_len = 321;
  const RazorParams p = razor_params(config);
  EXPECT_EQ(p.sinks, 7);
  EXPECT_EQ(p.buffer_min, 123);
  EXPECT_EQ(p.buffer_ratio, 9);
  EXPECT_EQ(p.local_window, 321);
  // Default config, 100K tokens: buffer = max(4000, 20000, 4096) = 20000.
  const RazorRanges r = razor_ranges(100000, razor_params(LongContextConfig{}));
  EXPECT_EQ(r.sinks_end, 4);
  EXPECT_EQ(r.buffer_begin, 80000);
}

// ---- compensation ---------------------------------------------------------------------

// Random stores filled in random chunks, updated after each: the sums and
// the compensation partials against the reference; then equal bit for bit to
// a compensation built at once.
TEST(RazorCompensation, IncrementalMatchesReferenceAndFromScratch) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 40; ++trial) {
    Case c = random_case(rng);
    SCOPED_TRACE(c.describe());
    RazorStore s(c, uint32_t(trial));
    const RetrievalHeads heads = random_heads(c, rng);
    RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
    const int64_t target = 20 + int64_t(rng() % 150);
    while (s.n_tokens() < target) {
      s.append(RazorStore::kLayer, std::min(target - s.n_tokens(), 1 + int64_t(rng() % 12)));
      if (rng() % 4 == 0) s.append(0, 1);  // another layer does not matter
      comp.update(s.store());
      if (rng() % 3 == 0) comp.update(s.store());  // no new token: no change
      ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
    }
    RazorCompensation fresh(s.store(), RazorStore::kLayer, heads, s.params());
    fresh.update(s.store());
    for (int h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_EQ(comp.tracks(h), !heads.is_retrieval(RazorStore::kLayer, h));
      if (!comp.tracks(h)) continue;
      EXPECT_EQ(comp.mean_key(h), fresh.mean_key(h)) << "kv head " << h;
      EXPECT_EQ(comp.mean_value(h), fresh.mean_value(h)) << "kv head " << h;
    }

    // compensation_partial: out = v^, lse = scale q.k^ + ln N_d.
    const std::vector<float> q = s.random_q();
    const float scale = 1.f / std::sqrt(float(c.head_dim));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      if (!comp.tracks(h)) {
        std::vector<float> out(size_t(c.g * c.head_dim)), lse(size_t(c.g));
        EXPECT_THROW(comp.compensation_partial(h, q.data(), c.g, scale, out.data(), lse.data()), Error);
        continue;
      }
      const prefill_ref::StoredHead head = prefill_ref::stored_head(s.store(), RazorStore::kLayer, h);
      const Compensation ref = reference_compensation(head, roles(s.n_tokens(), s.params()));
      std::vector<float> out(size_t(c.g * c.head_dim), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> lse(size_t(c.g), std::numeric_limits<float>::quiet_NaN());
      comp.compensation_partial(h, q.data() + size_t(h * c.g * c.head_dim), c.g, scale, out.data(), lse.data());
      for (int j = 0; j < c.g; ++j) {
        const float* qj = q.data() + size_t((h * c.g + j) * c.head_dim);
        if (ref.n_dropped == 0) {
          EXPECT_EQ(lse[size_t(j)], -kInf);
          for (int ch = 0; ch < c.head_dim; ++ch) EXPECT_EQ(out[size_t(j * c.head_dim + ch)], 0.f);
          continue;
        }
        double dot = 0, terms = 0;
        for (int ch = 0; ch < c.head_dim; ++ch) {
          dot += double(qj[ch]) * ref.key[size_t(ch)];
          terms += std::abs(double(qj[ch]) * ref.key[size_t(ch)]);
        }
        const double ref_lse = double(scale) * dot + std::log(double(ref.n_dropped));
        // fp64 throughout, one rounding to f32 at the end.
        EXPECT_NEAR(lse[size_t(j)], ref_lse, kU * std::abs(ref_lse) + 1e-12 * (1 + double(scale) * terms));
        for (int ch = 0; ch < c.head_dim; ++ch) {
          EXPECT_NEAR(out[size_t(j * c.head_dim + ch)], ref.value[size_t(ch)],
                      kU * std::abs(ref.value[size_t(ch)]) + 1e-12);
        }
      }
    }
  }
}

// One token at a time over several hundred tokens (buffer = N / C takes over
// from S0), checked against the reference every step.
TEST(RazorCompensation, TokenByTokenUpdates) {
  Case c;
  c.kv_type = DType::kF16;
  c.block_size = 4;
  c.head_dim = 8;
  c.n_kv_heads = 2;
  c.razor = RazorConfig{"", 4, 20, 5};
  RazorStore s(c, 7);
  RetrievalHeads heads(2, 2);
  heads.set(RazorStore::kLayer, 1, true);
  RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
  int64_t previous_dropped = 0;
  for (int i = 0; i < 300; ++i) {
    s.append(RazorStore::kLayer, 1);
    comp.update(s.store());
    ASSERT_GE(comp.n_dropped(), previous_dropped);
    previous_dropped = comp.n_dropped();
    ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
  }
  EXPECT_EQ(comp.n_dropped(), 300 - 4 - 60);  // buffer = 300 / 5
}

// The store shrank (clear and refill with fewer tokens): update rebuilds.
// After refilling to more tokens than before, reset() then update rebuilds.
TEST(RazorCompensation, ClearedStoreRebuilds) {
  Case c;
  c.kv_type = DType::kF32;
  c.block_size = 16;
  c.razor = RazorConfig{"", 2, 5, 3};
  RazorStore s(c, 3);
  const RetrievalHeads heads(2, c.n_kv_heads);
  RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
  s.append(RazorStore::kLayer, 100);
  comp.update(s.store());
  ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
  s.store().clear();
  s.append(RazorStore::kLayer, 40);
  comp.update(s.store());
  ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
  s.store().clear();
  s.append(RazorStore::kLayer, 120);
  comp.reset();
  comp.update(s.store());
  ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
}

TEST(RazorCompensation, RejectsMismatchedArguments) {
  Case c;
  RazorStore s(c, 1);
  EXPECT_THROW(RazorCompensation(s.store(), 2, RetrievalHeads(2, c.n_kv_heads), s.params()), Error);
  EXPECT_THROW(RazorCompensation(s.store(), 1, RetrievalHeads(3, c.n_kv_heads), s.params()), Error);
  EXPECT_THROW(RazorCompensation(s.store(), 1, RetrievalHeads(2, c.n_kv_heads), RazorParams{1, 1, 0, 0}), Error);
  Case other = c;
  other.head_dim = 32;
  RazorStore s2(other, 1);
  RazorCompensation comp(s.store(), 1, RetrievalHeads(2, c.n_kv_heads), s.params());
  EXPECT_THROW(comp.update(s2.store()), Error);
  EXPECT_THROW(comp.mean_key(c.n_kv_heads), Error);
}

// ---- razor decode attention -------------------------------------------------------------

// Mixed retrieval and non-retrieval heads in one layer, local window attended
// here or elsewhere, against one dense fp64 softmax per query head.
TEST(RazorDecodeAttention, MatchesDenseReference) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 60; ++trial) {
    Case c = random_case(rng);
    SCOPED_TRACE(c.describe());
    RazorStore s(c, uint32_t(1000 + trial));
    s.append(RazorStore::kLayer, int64_t(rng() % 160));
    const RetrievalHeads heads = random_heads(c, rng);
    RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
    comp.update(s.store());
    const Selection retrieval = random_selection(c.n_kv_heads, s.n_tokens(), rng);
    const std::vector<float> q = s.random_q();
    for (bool include_local : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "tokens " << s.n_tokens() << " include_local " << include_local);
      const Result r = run_razor(s, c, q, retrieval, heads, comp, include_local);
      ASSERT_NO_FATAL_FAILURE(expect_razor_matches_reference(s, c, q, retrieval, heads, include_local, r));
      // out may alias q.
      std::vector<float> q_out = q, lse(size_t(c.n_q_heads()));
      RazorDecodeParams params;
      params.include_local = include_local;
      razor_decode_attention(s.store(), RazorStore::kLayer,
                             make_view(q_out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}), retrieval, heads,
                             comp, params, make_mutable_view(q_out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                             make_mutable_view(lse.data(), DType::kF32, {c.n_q_heads()}));
      EXPECT_EQ(q_out, r.out);
      EXPECT_EQ(lse, r.lse);
    }
  }
}

// Few tokens: nothing dropped, the compensation part is empty and razor
// attention is plain attention over every token.
TEST(RazorDecodeAttention, NothingDroppedIsDense) {
  Case c;
  c.g = 2;
  c.razor = RazorConfig{"", 4, 50, 5};
  RazorStore s(c, 5);
  s.append(RazorStore::kLayer, 50);
  const RetrievalHeads heads(2, c.n_kv_heads);  // no retrieval head
  RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
  comp.update(s.store());
  EXPECT_EQ(comp.n_dropped(), 0);
  const std::vector<float> q = s.random_q();
  Selection none;
  none.spans.resize(size_t(c.n_kv_heads));
  const Result r = run_razor(s, c, q, none, heads, comp, true);
  Result dense;
  dense.out.resize(q.size());
  dense.lse.resize(size_t(c.n_q_heads()));
  dense_decode_attention(s.store(), RazorStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         {}, make_mutable_view(dense.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         make_mutable_view(dense.lse.data(), DType::kF32, {c.n_q_heads()}));
  EXPECT_EQ(r.out, dense.out);
  EXPECT_EQ(r.lse, dense.lse);
}

// Every head a retrieval head (RazorAttention off): decode_attention over
// the retrieval selection as is; an empty layer gives empty results.
TEST(RazorDecodeAttention, AllRetrievalHeadsAndEmptyLayer) {
  Case c;
  c.g = 4;
  RazorStore s(c, 8);
  const RetrievalHeads all = RetrievalHeads::all(2, c.n_kv_heads);
  RazorCompensation comp(s.store(), RazorStore::kLayer, all, s.params());
  comp.update(s.store());
  const std::vector<float> q = s.random_q();
  Selection none;
  none.spans.resize(size_t(c.n_kv_heads));
  Result r = run_razor(s, c, q, none, all, comp, true);
  for (float l : r.lse) EXPECT_EQ(l, -kInf);
  for (float o : r.out) EXPECT_EQ(o, 0.f);

  s.append(RazorStore::kLayer, 70);
  comp.update(s.store());
  const Selection sel = random_selection(c.n_kv_heads, s.n_tokens(), s.rng());
  r = run_razor(s, c, q, sel, all, comp, true);
  Result plain;
  plain.out.resize(q.size());
  plain.lse.resize(size_t(c.n_q_heads()));
  decode_attention(s.store(), RazorStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}), sel,
                   {}, make_mutable_view(plain.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                   make_mutable_view(plain.lse.data(), DType::kF32, {c.n_q_heads()}));
  EXPECT_EQ(r.out, plain.out);
  EXPECT_EQ(r.lse, plain.lse);
}

TEST(RazorDecodeAttention, RejectsStaleOrForeignCompensation) {
  Case c;
  c.razor = RazorConfig{"", 2, 4, 5};
  RazorStore s(c, 4);
  s.append(RazorStore::kLayer, 30);
  const RetrievalHeads none(2, c.n_kv_heads);
  RazorCompensation comp(s.store(), RazorStore::kLayer, none, s.params());
  const std::vector<float> q = s.random_q();
  Selection sel;
  sel.spans.resize(size_t(c.n_kv_heads));
  EXPECT_THROW(run_razor(s, c, q, sel, none, comp, true), Error);  // not updated
  comp.update(s.store());
  EXPECT_NO_THROW(run_razor(s, c, q, sel, none, comp, true));
  // A compensation that tracks only some heads, used with a list where more are compressed.
  RetrievalHeads some(2, c.n_kv_heads);
  some.set(RazorStore::kLayer, 0, true);
  RazorCompensation partial(s.store(), RazorStore::kLayer, some, s.params());
  partial.update(s.store());
  EXPECT_THROW(run_razor(s, c, q, sel, none, partial, true), Error);
  RazorCompensation layer0(s.store(), 0, none, s.params());
  layer0.update(s.store());
  EXPECT_THROW(run_razor(s, c, q, sel, none, layer0, true), Error);
  Selection short_sel;
  EXPECT_THROW(run_razor(s, c, q, short_sel, none, comp, true), Error);
}

// ---- head-list file ---------------------------------------------------------------------

class RazorHeadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("longctx_razor_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "heads.txt").string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The message of the Error load_retrieval_heads throws ("" when none).
  std::string load_error(const std::string& text, ErrorCode* code = nullptr) {
    try {
      load_retrieval_heads(write(text), 4, 8);
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
};

TEST_F(RazorHeadFile, ParsesCommentsBlanksAndCrlf) {
  const RetrievalHeads heads = load_retrieval_heads(write("# header\n\n0 0\n  3\t7  # tail\r\n2 5\r\n\n#1 1\n1 2"), 4, 8);
  RetrievalHeads expected(4, 8);
  expected.set(0, 0, true);
  expected.set(3, 7, true);
  expected.set(2, 5, true);
  expected.set(1, 2, true);
  EXPECT_EQ(heads, expected);
  EXPECT_EQ(heads.count(), 4);
  EXPECT_EQ(load_retrieval_heads(write(""), 4, 8), RetrievalHeads(4, 8));
  EXPECT_EQ(load_retrieval_heads("", 4, 8), RetrievalHeads::all(4, 8));
  EXPECT_EQ(RetrievalHeads::all(4, 8).count(), 32);
}

TEST_F(RazorHeadFile, ErrorsNameFileAndLine) {
  struct Bad {
    std::string text, fragment;
  };
  const std::vector<Bad> cases = {
      {"0 0\n4 0\n", ":2: layer 4 out of range [0, 4)"},
      {"0 8\n", ":1: kv_head 8 out of range [0, 8)"},
      {"# c\n-1 0\n", ":2: layer -1 out of range"},
      {"0 0 0\n", ":1: expected '<layer> <kv_head>', got 3 fields"},
      {"\n\n3\n", ":3: expected '<layer> <kv_head>', got 1 fields"},
      {"0 x\n", ":1: kv_head 'x' is not a decimal integer"},
      {"1.5 0\n", ":1: layer '1.5' is not a decimal integer"},
      {"0 99999999999999999999999\n", ":1: kv_head 99999999999999999999999 out of range"},
      {"1 1\n2 2\n1 1\n", ":3: layer 1 kv_head 1 is listed twice"},
  };
  for (const Bad& bad : cases) {
    ErrorCode code = ErrorCode::kInternal;
    const std::string message = load_error(bad.text, &code);
    EXPECT_NE(message.find("heads.txt" + bad.fragment), std::string::npos) << bad.text << " -> " << message;
    EXPECT_EQ(code, ErrorCode::kConfig) << message;
  }
  try {
    load_retrieval_heads((dir_ / "missing.txt").string(), 4, 8);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
}

TEST_F(RazorHeadFile, SaveLoadRoundTrip) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int n_layers = 1 + int(rng() % 6), n_kv = 1 + int(rng() % 9);
    RetrievalHeads heads(n_layers, n_kv);
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < n_kv; ++h) heads.set(l, h, rng() % 3 == 0);
    const std::string path = (dir_ / "saved.txt").string();
    save_retrieval_heads(path, heads, trial % 2 ? "probe: seed 1\nmodel: test" : "");
    EXPECT_EQ(load_retrieval_heads(path, n_layers, n_kv), heads);
  }
}

TEST(RazorHeadFileExample, ParsesForItsModelShape) {
  const std::string path = std::string(LONGCTX_SOURCE_DIR) + "/configs/retrieval_heads.example.txt";
  const RetrievalHeads heads = load_retrieval_heads(path, 32, 8);
  EXPECT_EQ(heads.count(), 10);
  EXPECT_TRUE(heads.is_retrieval(15, 7));
  EXPECT_THROW(load_retrieval_heads(path, 16, 8), Error);
}

// ---- probe ------------------------------------------------------------------------------

TEST(RazorProbe, RepeatedDistinctTokens) {
  const Probe p = make_probe_tokens(50, 4, 60, 123, 1);
  ASSERT_EQ(p.tokens.size(), size_t(1 + 50 * 4));
  EXPECT_EQ(p.tokens[0], 1);
  EXPECT_EQ(p.first, 1);
  EXPECT_EQ(p.period, 50);
  EXPECT_EQ(p.repeats, 4);
  const std::set<int32_t> ids(p.tokens.begin() + 1, p.tokens.begin() + 51);
  EXPECT_EQ(ids.size(), 50u);
  EXPECT_EQ(ids.count(1), 0u);
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 60);
  for (size_t i = 51; i < p.tokens.size(); ++i) EXPECT_EQ(p.tokens[i], p.tokens[i - 50]);
  EXPECT_EQ(make_probe_tokens(50, 4, 60, 123, 1).tokens, p.tokens);
  EXPECT_NE(make_probe_tokens(50, 4, 60, 124, 1).tokens, p.tokens);
  // Exactly as many ids as the vocabulary has besides BOS; no BOS.
  EXPECT_NO_THROW(make_probe_tokens(59, 2, 60, 1, 0));
  const Probe no_bos = make_probe_tokens(10, 2, 100, 1, -1);
  EXPECT_EQ(no_bos.first, 0);
  EXPECT_EQ(no_bos.tokens.size(), 20u);
  EXPECT_THROW(make_probe_tokens(60, 2, 60, 1, 0), Error);
  EXPECT_THROW(make_probe_tokens(0, 2, 60, 1, 0), Error);
  EXPECT_THROW(make_probe_tokens(10, 1, 60, 1, 0), Error);
}

// ---- search -----------------------------------------------------------------------------

// Echo and induction of a row by token equality: keys m < i holding the
// query's token (m >= first, so not the BOS) for echo, keys m + 1 for induction.
struct RowScores {
  double echo = 0, induction = 0;
  bool scored = false;
};

RowScores reference_row(const Probe& p, int64_t i, const std::vector<float>& row) {
  RowScores s;
  for (int64_t m = p.first; m < i; ++m) {
    if (p.tokens[size_t(m)] != p.tokens[size_t(i)]) continue;
    s.scored = true;
    s.echo += row[size_t(m)];
    s.induction += row[size_t(m + 1)];
  }
  return s;
}

// A causal probability row of query i: random positive weights, normalized;
// kind 1 puts all mass on the previous copy (echo head), kind 2 on the token
// after it (induction head), kind 3 on the BOS / first token (sink head).
std::vector<float> probability_row(const Probe& p, int64_t i, int kind, std::mt19937& rng) {
  std::vector<float> row(size_t(i + 1), 0.f);
  if (kind != 0 && i >= p.first + p.period) {
    const int64_t target = kind == 1 ? i - p.period : kind == 2 ? i - p.period + 1 : 0;
    row[size_t(target)] = 1.f;
    return row;
  }
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  float sum = 0;
  for (float& x : row) sum += (x = uniform(rng));
  for (float& x : row) x /= sum;
  return row;
}

TEST(RazorSearch, ScoresMatchTokenEqualityReference) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 10; ++trial) {
    const int n_random = 3 + int(rng() % 8), repeats = 2 + int(rng() % 3);
    const Probe p = make_probe_tokens(n_random, repeats, 1000, uint64_t(trial), trial % 2 ? 0 : -1);
    const int n_layers = 2, n_kv = 2, g = 1 + int(rng() % 3);
    RetrievalHeadSearch search(n_layers, n_kv * g, n_kv, p);
    const int64_t t_len = int64_t(p.tokens.size());
    std::vector<double> echo(size_t(n_layers * n_kv * g)), induction(echo.size());
    std::vector<int64_t> rows(echo.size());
    for (int l = 0; l < n_layers; ++l)
      for (int qh = 0; qh < n_kv * g; ++qh) {
        const size_t k = size_t(l * n_kv * g + qh);
        const int kind = int(rng() % 4);
        for (int64_t i = 0; i < t_len; ++i) {
          const std::vector<float> row = probability_row(p, i, kind, rng);
          search.accumulate_row(l, qh, i, row.data());
          const RowScores r = reference_row(p, i, row);
          if (!r.scored) continue;
          echo[k] += r.echo, induction[k] += r.induction, ++rows[k];
        }
      }
    const HeadScores scores = search.kv_head_scores();
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < n_kv; ++h) {
        double echo_max = -1, induction_max = -1;
        for (int qh = h * g; qh < (h + 1) * g; ++qh) {
          const size_t k = size_t(l * n_kv * g + qh);
          ASSERT_EQ(search.scoring_rows(l, qh), rows[k]);
          ASSERT_EQ(rows[k], t_len - p.first - p.period);
          // Sums of at most `repeats` f32 probabilities in fp64, in another order.
          EXPECT_NEAR(search.echo_score(l, qh), echo[k] / double(rows[k]), 1e-12);
          EXPECT_NEAR(search.induction_score(l, qh), induction[k] / double(rows[k]), 1e-12);
          echo_max = std::max(echo_max, echo[k] / double(rows[k]));
          induction_max = std::max(induction_max, induction[k] / double(rows[k]));
        }
        EXPECT_NEAR(scores.echo[size_t(l * n_kv + h)], echo_max, 1e-12);
        EXPECT_NEAR(scores.induction[size_t(l * n_kv + h)], induction_max, 1e-12);
      }
  }
}

// Pure heads score 1 on their kind, and the group's max carries a pure head
// sharing its kv head with noise.
TEST(RazorSearch, EchoInductionHeadsAndGqaMax) {
  const Probe p = make_probe_tokens(20, 4, 500, 9, 0);
  const int64_t t_len = int64_t(p.tokens.size());
  RetrievalHeadSearch search(1, 6, 3, p);  // g = 2
  std::mt19937 rng(1);
  const int kinds[6] = {1, 0, 0, 2, 3, 0};  // kv 0: echo + noise; kv 1: noise + induction; kv 2: sink + noise
  std::vector<float> matrix(size_t(t_len * t_len), 0.f);
  for (int qh = 0; qh < 6; ++qh) {
    for (int64_t i = 0; i < t_len; ++i) {
      const std::vector<float> row = probability_row(p, i, kinds[qh], rng);
      std::copy(row.begin(), row.end(), matrix.begin() + i * t_len);
      std::fill(matrix.begin() + i * t_len + i + 1, matrix.begin() + (i + 1) * t_len, 99.f);  // ignored
    }
    search.accumulate_matrix(0, qh, matrix.data());
  }
  EXPECT_DOUBLE_EQ(search.echo_score(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(search.induction_score(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(search.echo_score(0, 3), 0.0);
  EXPECT_DOUBLE_EQ(search.induction_score(0, 3), 1.0);
  EXPECT_DOUBLE_EQ(search.echo_score(0, 4), 0.0);
  const HeadScores s = search.kv_head_scores();
  EXPECT_DOUBLE_EQ(s.echo[0], 1.0);
  EXPECT_DOUBLE_EQ(s.induction[1], 1.0);
  EXPECT_LT(s.echo[2], 0.5);
  EXPECT_LT(s.induction[2], 0.5);
  const RetrievalHeads heads = select_retrieval_heads(s, 0.34, 0.34);  // one each
  EXPECT_TRUE(heads.is_retrieval(0, 0));
  EXPECT_TRUE(heads.is_retrieval(0, 1));
  EXPECT_FALSE(heads.is_retrieval(0, 2));
}

TEST(RazorSearch, RejectsBadRows) {
  const Probe p = make_probe_tokens(5, 2, 100, 1, 0);
  RetrievalHeadSearch search(1, 2, 1, p);
  std::vector<float> row(p.tokens.size(), 0.1f);
  EXPECT_THROW(search.accumulate_row(1, 0, 7, row.data()), Error);
  EXPECT_THROW(search.accumulate_row(0, 2, 7, row.data()), Error);
  EXPECT_THROW(search.accumulate_row(0, 0, int64_t(p.tokens.size()), row.data()), Error);
  EXPECT_THROW(search.kv_head_scores(), Error);  // no scoring row yet
  search.accumulate_row(0, 0, 7, row.data());
  EXPECT_THROW(search.accumulate_row(0, 0, 7, row.data()), Error);
  search.accumulate_row(0, 0, 2, row.data());  // no earlier copy: ignored
  search.accumulate_row(0, 0, 2, row.data());
  EXPECT_EQ(search.scoring_rows(0, 0), 1);
  row[2] = std::numeric_limits<float>::quiet_NaN();  // the copy of row 7
  EXPECT_THROW(search.accumulate_row(0, 1, 7, row.data()), Error);
  EXPECT_EQ(search.scoring_rows(0, 1), 0);
  EXPECT_THROW(search.kv_head_scores(), Error);  // query head 1 has no row
  EXPECT_THROW(RetrievalHeadSearch(1, 3, 2, p), Error);
}

// Reference selection: sort every head by score (stable), take the counts.
std::set<std::pair<int, int>> reference_select(const HeadScores& s, int64_t n_induction, int64_t n_echo) {
  std::set<std::pair<int, int>> chosen;
  for (const auto* scores : {&s.induction, &s.echo}) {
    std::vector<std::pair<double, int>> order;  // (-score, index): ascending = best first, ties low index
    for (size_t i = 0; i < scores->size(); ++i) order.push_back({-(*scores)[i], int(i)});
    std::sort(order.begin(), order.end());
    const int64_t count = scores == &s.induction ? n_induction : n_echo;
    for (int64_t j = 0; j < count; ++j)
      chosen.insert({order[size_t(j)].second / s.n_kv_heads, order[size_t(j)].second % s.n_kv_heads});
  }
  return chosen;
}

std::set<std::pair<int, int>> as_set(const RetrievalHeads& heads) {
  std::set<std::pair<int, int>> s;
  for (int l = 0; l < heads.n_layers(); ++l)
    for (int h = 0; h < heads.n_kv_heads(); ++h)
      if (heads.is_retrieval(l, h)) s.insert({l, h});
  return s;
}

TEST(RazorSearch, TopFractionsUnion) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 30; ++trial) {
    HeadScores s;
    s.n_layers = 1 + int(rng() % 32);
    s.n_kv_heads = 1 + int(rng() % 8);
    const size_t n = size_t(s.n_layers * s.n_kv_heads);
    for (size_t i = 0; i < n; ++i) {
      // Coarse values so that ties occur.
      s.echo.push_back(double(rng() % 7) / 7);
      s.induction.push_back(double(rng() % 7) / 7);
    }
    // round(0.14 n), round(0.01 n), halves up, at least 1: computed by hand.
    const int64_t n_ind = std::max<int64_t>(1, (int64_t(n) * 14 + 50) / 100);
    const int64_t n_echo = std::max<int64_t>(1, (int64_t(n) + 50) / 100);
    EXPECT_EQ(as_set(select_retrieval_heads(s)), reference_select(s, n_ind, n_echo)) << "n " << n;
    EXPECT_EQ(select_retrieval_heads(s, 0, 0).count(), 0);
    EXPECT_EQ(select_retrieval_heads(s, 1, 0).count(), int64_t(n));
  }
  // 256 heads (32 layers x 8): 36 by induction, 3 by echo.
  HeadScores s{32, 8, std::vector<double>(256), std::vector<double>(256)};
  for (size_t i = 0; i < 256; ++i) s.induction[i] = double(i), s.echo[i] = double(i);  // same order: union = 36
  EXPECT_EQ(select_retrieval_heads(s).count(), 36);
  for (size_t i = 0; i < 256; ++i) s.echo[i] = -double(i);  // disjoint: 36 + 3
  EXPECT_EQ(select_retrieval_heads(s).count(), 39);
  EXPECT_THROW(select_retrieval_heads(s, 1.5, 0.01), Error);
  EXPECT_THROW(select_retrieval_heads(s, 0.14, -0.1), Error);
  s.echo.pop_back();
  EXPECT_THROW(select_retrieval_heads(s), Error);
}

// Search -> selection -> file -> load gives the same heads.
TEST_F(RazorHeadFile, SearchResultRoundTrip) {
  const Probe p = make_probe_tokens(6, 3, 50, 4, 0);
  RetrievalHeadSearch search(3, 4, 2, p);
  std::mt19937 rng(6);
  for (int l = 0; l < 3; ++l)
    for (int qh = 0; qh < 4; ++qh)
      for (int64_t i = 0; i < int64_t(p.tokens.size()); ++i) {
        const std::vector<float> row = probability_row(p, i, int(rng() % 4), rng);
        search.accumulate_row(l, qh, i, row.data());
      }
  const RetrievalHeads heads = select_retrieval_heads(search.kv_head_scores());
  const std::string path = (dir_ / "found.txt").string();
  save_retrieval_heads(path, heads, "probe 6 x 3, seed 4");
  EXPECT_EQ(load_retrieval_heads(path, 3, 2), heads);
  EXPECT_GE(heads.count(), 1);
}

}  // namespace
}  // namespace longctx::policy
