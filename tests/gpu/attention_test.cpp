// GPU attention kernels (gpu/attention.h) against plain fp64 references
// written here from the contract. Inputs are rounded to the device dtype
// first (K/V to kv_dtype; for prefill q too), so the tolerances measure the
// kernels: they are derived from the f32 and kv_dtype unit roundoffs, the
// score magnitudes and the rounding of p for P.V. Every test but the
// validation one skips ("no CUDA device: <reason>") without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/gpu/attention.h"
#include "longctx/gpu/device.h"
#include "longctx/gpu/merge.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "test_seed.h"

namespace longctx::gpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const double kU32 = std::ldexp(1.0, -24);  // f32 unit roundoff

double unit_roundoff(DType t) { return t == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }

class GpuAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (list_devices(&why).empty()) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// A K/V (or q) tensor: f32 values as generated, the kv_dtype buffer the
// device reads, and the rounded values the reference reads.
struct Rounded {
  std::vector<uint16_t> bits;  // kv_dtype elements
  std::vector<double> value;   // the same, widened exactly
};

Rounded round_all(const std::vector<float>& x, DType t) {
  Rounded r;
  r.bits.resize(x.size());
  r.value.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    store_from_f32(r.bits.data(), t, i, x[i]);
    r.value[i] = load_as_f32(r.bits.data(), t, i);
  }
  return r;
}

// The fp64 softmax attention of one query over `keys` (indices into k/v rows
// with stride `row`, offset `at`), plus what the tolerance needs.
struct RowRef {
  std::vector<double> out;
  double lse = -std::numeric_limits<double>::infinity();
  double max_abs_dot = 0;  // max over keys of scale * sum |q_c k_c|
  double max_abs_v = 0;
  int64_t n = 0;
};

RowRef reference_row(const double* q, const std::vector<double>& k, const std::vector<double>& v,
                     const std::vector<int64_t>& keys, size_t row, size_t at, int d, double scale) {
  RowRef r;
  r.out.assign(size_t(d), 0.0);
  r.n = int64_t(keys.size());
  if (keys.empty()) return r;
  std::vector<double> s(keys.size());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < keys.size(); ++j) {
    const double* kr = k.data() + size_t(keys[j]) * row + at;
    double dot = 0, abs_dot = 0;
    for (int c = 0; c < d; ++c) dot += q[c] * kr[c], abs_dot += std::abs(q[c] * kr[c]);
    s[j] = scale * dot;
    r.max_abs_dot = std::max(r.max_abs_dot, std::abs(scale) * abs_dot);
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const double w = std::exp(s[j] - m);
    sum += w;
    const double* vr = v.data() + size_t(keys[j]) * row + at;
    for (int c = 0; c < d; ++c) r.out[size_t(c)] += w * vr[c], r.max_abs_v = std::max(r.max_abs_v, std::abs(vr[c]));
  }
  for (double& o : r.out) o /= sum;
  r.lse = m + std::log(sum);
  return r;
}

// Error bounds of one row. Scores carry the f32 accumulation error of a
// d-term dot product; a relative error e of the weights moves out by at most
// e * max|v|. p_roundoff: prefill rounds p (<= 1) to kv_dtype for P.V (f16
// subnormals add an absolute 2^-25 per key); local keeps p in f32.
struct Tolerance {
  double out, lse;
};
Tolerance tolerance(const RowRef& r, int d, double p_roundoff, bool f16_subnormals) {
  const double score = (d + 4) * kU32 * r.max_abs_dot;
  const double sums = (double(r.n) + 16) * kU32;
  const double subnormal = f16_subnormals ? double(r.n) * std::ldexp(1.0, -25) : 0.0;
  Tolerance t;
  t.out = 2 * r.max_abs_v * (p_roundoff + subnormal + 2 * score + 2 * sums) + 1e-30;
  t.lse = 2 * (score + sums) + 4 * kU32 * std::abs(r.lse);
  return t;
}

// Checks one (out, lse) row against its reference; empty rows must be exactly 0 / -inf.
void expect_row(const float* out, const float* lse, const RowRef& ref, const Tolerance& tol, int d,
                const std::string& where) {
  if (ref.n == 0) {
    for (int c = 0; c < d; ++c) {
      ASSERT_EQ(out[c], 0.0f) << where << " channel " << c << " (row saw no key)";
    }
    if (lse) {
      ASSERT_TRUE(std::isinf(*lse) && *lse < 0) << where << " lse " << *lse << " (row saw no key)";
    }
    return;
  }
  for (int c = 0; c < d; ++c) {
    ASSERT_FALSE(std::isnan(out[c])) << where << " channel " << c;
    ASSERT_NEAR(out[c], ref.out[size_t(c)], tol.out) << where << " channel " << c;
  }
  if (lse) {
    ASSERT_NEAR(*lse, ref.lse, tol.lse) << where;
  }
}

// ---- prefill ----------------------------------------------------------------

enum class Values { kNormal, kLargeScores, kNegativeScores };

struct PrefillCase {
  DType dtype = DType::kF16;
  int head_dim = 64;
  int n_kv_heads = 1;
  int group = 1;
  int64_t n_q = 1, n_kv = 1, q_first_pos = 0;
  float scale = 0.f;
  bool with_lse = true;
  Values values = Values::kNormal;

  std::string describe() const {
    return str_cat(dtype_name(dtype), " d=", head_dim, " kv_heads=", n_kv_heads, " group=", group, " n_q=", n_q,
                   " n_kv=", n_kv, " q_first_pos=", q_first_pos, " scale=", scale, " lse=", with_lse,
                   " values=", int(values));
  }
};

void run_prefill_case(const PrefillCase& c, std::mt19937& rng) {
  SCOPED_TRACE(c.describe());
  const int d = c.head_dim, n_heads = c.n_kv_heads * c.group;
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(c.n_q) * n_heads * d), k(size_t(c.n_kv) * c.n_kv_heads * d), v(k.size());
  for (float& x : v) x = normal(rng);
  switch (c.values) {
    case Values::kNormal:
      for (float& x : q) x = normal(rng);
      for (float& x : k) x = normal(rng);
      break;
    case Values::kLargeScores:  // score std ~ 30: exp(score) alone would overflow f32
      for (float& x : q) x = 30.f * normal(rng);
      for (float& x : k) x = normal(rng);
      break;
    case Values::kNegativeScores:  // every score well below -50: the running max is negative
      for (float& x : q) x = -3.f * (1.f + 0.2f * normal(rng));
      for (float& x : k) x = 2.f + 0.3f * normal(rng);
      break;
  }
  const Rounded qr = round_all(q, c.dtype), kr = round_all(k, c.dtype), vr = round_all(v, c.dtype);

  std::vector<float> out(q.size(), kNaN), lse(size_t(c.n_q) * n_heads, kNaN);
  PrefillAttentionParams p;
  p.q = q.data();
  p.k = kr.bits.data();
  p.v = vr.bits.data();
  p.out = out.data();
  p.lse = c.with_lse ? lse.data() : nullptr;
  p.kv_dtype = c.dtype;
  p.n_q = c.n_q, p.n_kv = c.n_kv, p.q_first_pos = c.q_first_pos;
  p.n_heads = n_heads, p.n_kv_heads = c.n_kv_heads, p.head_dim = d, p.scale = c.scale;
  prefill_attention_host(p);

  const double scale = c.scale == 0.f ? 1.0 / std::sqrt(double(d)) : double(c.scale);
  const bool f16 = c.dtype == DType::kF16;
  double max_out = 0, max_ref = 0;
  for (int64_t i = 0; i < c.n_q; ++i) {
    const int64_t limit = std::clamp<int64_t>(c.q_first_pos + i + 1, 0, c.n_kv);
    std::vector<int64_t> keys(static_cast<size_t>(limit));
    for (int64_t j = 0; j < limit; ++j) keys[size_t(j)] = j;
    for (int h = 0; h < n_heads; ++h) {
      const size_t at = (size_t(i) * n_heads + h) * d;
      const RowRef ref = reference_row(qr.value.data() + at, kr.value, vr.value, keys, size_t(c.n_kv_heads) * d,
                                       size_t(h / c.group) * d, d, scale);
      expect_row(out.data() + at, c.with_lse ? lse.data() + size_t(i) * n_heads + h : nullptr, ref,
                 tolerance(ref, d, unit_roundoff(c.dtype), f16), d, str_cat("query ", i, " head ", h));
      for (int ch = 0; ch < d; ++ch)
        max_out = std::max(max_out, double(std::abs(out[at + ch]))),
        max_ref = std::max(max_ref, std::abs(ref.out[size_t(ch)]));
    }
  }
  if (max_ref > 0) {
    EXPECT_GT(max_out, 0.0) << "all-zero output";
  }
  if (!c.with_lse) {
    EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return std::isnan(x); })) << "lse written";
  }
}

TEST_F(GpuAttention, PrefillMatchesReferenceOverShapes) {
  std::mt19937 rng(test_seed(11));
  // (n_q, n_kv, q_first_pos): single token, square causal, chunk after a
  // history, more queries than keys, rows before any key, no keys, all keys.
  const int64_t shapes[][3] = {{1, 1, 0},    {13, 13, 0},   {113, 300, 187}, {300, 113, 0},
                               {70, 130, -9}, {17, 0, 0},    {37, 150, 1000}, {64, 64, 0}};
  const int groups[] = {1, 2, 4, 8};
  int n = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int d : {64, 128, 256})
      for (const auto& s : shapes) {
        PrefillCase c;
        c.dtype = dtype, c.head_dim = d;
        c.n_q = s[0], c.n_kv = s[1], c.q_first_pos = s[2];
        c.group = groups[n % 4];
        c.n_kv_heads = 1 + (n / 4) % 2 + (d == 64 ? 1 : 0);
        c.scale = (n % 3 == 2) ? 0.07f : 0.f;
        c.with_lse = n % 5 != 3;
        ++n;
        run_prefill_case(c, rng);
        if (HasFatalFailure()) return;
      }
}

TEST_F(GpuAttention, PrefillRandomShapes) {
  std::mt19937 rng(test_seed(23));
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  const int dims[] = {64, 128, 256}, groups[] = {1, 2, 4, 8};
  for (int iter = 0; iter < 12; ++iter) {
    PrefillCase c;
    c.dtype = iter % 2 ? DType::kBF16 : DType::kF16;
    c.head_dim = dims[pick(rng) % 3];
    c.group = groups[pick(rng) % 4];
    c.n_kv_heads = 1 + pick(rng) % 2;
    c.n_q = 1 + pick(rng) % 150;
    c.n_kv = pick(rng) % 260;
    c.q_first_pos = int64_t(pick(rng) % 300) - 20;
    c.with_lse = pick(rng) % 4 != 0;
    run_prefill_case(c, rng);
    if (HasFatalFailure()) return;
  }
}

TEST_F(GpuAttention, PrefillHardInputs) {
  std::mt19937 rng(test_seed(5));
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int d : {64, 128, 256})
      for (Values values : {Values::kLargeScores, Values::kNegativeScores}) {
        PrefillCase c;
        c.dtype = dtype, c.head_dim = d, c.values = values;
        c.group = 4, c.n_kv_heads = 1;
        c.n_q = 70, c.n_kv = 200, c.q_first_pos = 130;
        run_prefill_case(c, rng);
        if (HasFatalFailure()) return;
      }
}

// ---- local window -------------------------------------------------------------

struct LocalCase {
  DType dtype = DType::kF16;
  int head_dim = 64;
  int n_kv_heads = 1;
  int group = 1;
  int64_t capacity = 1, first_pos = 0, last_pos = -1;
  bool workspace = false;
  float scale = 0.f;

  std::string describe() const {
    return str_cat(dtype_name(dtype), " d=", head_dim, " kv_heads=", n_kv_heads, " group=", group,
                   " capacity=", capacity, " first_pos=", first_pos, " last_pos=", last_pos,
                   " workspace=", workspace);
  }
};

void run_local_case(const LocalCase& c, std::mt19937& rng) {
  SCOPED_TRACE(c.describe());
  const int d = c.head_dim, n_heads = c.n_kv_heads * c.group;
  std::normal_distribution<float> normal;
  // Every slot gets a token: slots outside [first_pos, last_pos] hold tokens
  // that must not be attended.
  std::vector<float> q(size_t(n_heads) * d), k(size_t(c.capacity) * c.n_kv_heads * d), v(k.size());
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  const Rounded kr = round_all(k, c.dtype), vr = round_all(v, c.dtype);

  std::vector<float> out(q.size(), kNaN), lse(size_t(n_heads), kNaN);
  LocalAttentionParams p;
  p.q = q.data(), p.k = kr.bits.data(), p.v = vr.bits.data(), p.out = out.data(), p.lse = lse.data();
  p.kv_dtype = c.dtype;
  p.capacity = c.capacity, p.first_pos = c.first_pos, p.last_pos = c.last_pos;
  p.n_heads = n_heads, p.n_kv_heads = c.n_kv_heads, p.head_dim = d, p.scale = c.scale;
  p.workspace_bytes = c.workspace ? local_window_workspace_bytes(n_heads, d) : 0;
  local_window_attention_host(p);

  // Position pos lives in slot pos % capacity.
  std::vector<int64_t> slots;
  for (int64_t pos = c.first_pos; pos <= c.last_pos; ++pos) slots.push_back(pos % c.capacity);
  const double scale = c.scale == 0.f ? 1.0 / std::sqrt(double(d)) : double(c.scale);
  for (int h = 0; h < n_heads; ++h) {
    std::vector<double> qh(q.begin() + size_t(h) * d, q.begin() + size_t(h + 1) * d);
    const RowRef ref =
        reference_row(qh.data(), kr.value, vr.value, slots, size_t(c.n_kv_heads) * d, size_t(h / c.group) * d, d, scale);
    expect_row(out.data() + size_t(h) * d, lse.data() + h, ref, tolerance(ref, d, 0.0, false), d,
               str_cat("head ", h));
  }
}

TEST_F(GpuAttention, LocalWindowMatchesReference) {
  std::mt19937 rng(test_seed(31));
  // (capacity, first_pos, last_pos): full ring after wrap-around, first_pos
  // cutting the ring, ring not yet full, capacity 1, empty ranges, long
  // windows that split over blocks.
  const int64_t windows[][3] = {{100, 1135, 1234}, {100, 1200, 1234}, {64, 0, 20},   {1, 57, 57},
                                {50, 80, 79},      {8, 0, -1},        {700, 1301, 1999}, {3000, 7001, 10000}};
  const int groups[] = {1, 2, 4, 8, 3, 12};
  int n = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int d : {64, 128, 256})
      for (const auto& w : windows)
        for (bool workspace : {false, true}) {
          LocalCase c;
          c.dtype = dtype, c.head_dim = d;
          c.capacity = w[0], c.first_pos = w[1], c.last_pos = w[2];
          c.group = groups[n % 6];
          c.n_kv_heads = 1 + n % 2;
          c.workspace = workspace;
          c.scale = n % 4 == 3 ? 0.2f : 0.f;
          ++n;
          run_local_case(c, rng);
          if (HasFatalFailure()) return;
        }
}

// ---- store_kv -------------------------------------------------------------------

void run_store_case(DType dtype, int64_t n, int64_t row_elems, int64_t first_pos, int64_t capacity, bool ring,
                    std::mt19937& rng) {
  SCOPED_TRACE(str_cat(dtype_name(dtype), " n=", n, " row=", row_elems, " first_pos=", first_pos,
                       " capacity=", capacity, " ring=", ring));
  std::normal_distribution<float> normal;
  std::vector<float> src(size_t(n * row_elems));
  for (float& x : src) x = 100.f * normal(rng);
  std::vector<uint16_t> dst(size_t(capacity * row_elems)), expected;
  for (uint16_t& x : dst) x = uint16_t(rng());
  expected = dst;
  // Row i goes to (first_pos + i) % capacity (ring) or first_pos + i; later rows win.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ring ? (first_pos + i) % capacity : first_pos + i;
    for (int64_t e = 0; e < row_elems; ++e)
      store_from_f32(expected.data(), dtype, size_t(row * row_elems + e), src[size_t(i * row_elems + e)]);
  }
  StoreKVParams p;
  p.src = src.data(), p.dst = dst.data(), p.kv_dtype = dtype;
  p.n = n, p.row_elems = row_elems, p.first_pos = first_pos, p.capacity = capacity, p.ring = ring;
  store_kv_host(p);
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_EQ(dst[i], expected[i]) << "element " << i;
}

TEST_F(GpuAttention, StoreKVLinearAndRing) {
  std::mt19937 rng(test_seed(3));
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    run_store_case(dtype, 13, 256, 0, 40, false, rng);
    run_store_case(dtype, 27, 64, 13, 40, false, rng);   // ends exactly at capacity
    run_store_case(dtype, 1, 1024, 39, 40, false, rng);
    run_store_case(dtype, 30, 128, 25, 40, true, rng);   // wraps
    run_store_case(dtype, 95, 64, 1234, 40, true, rng);  // more rows than slots: the last 40 stay
    run_store_case(dtype, 5, 8, 0, 1, true, rng);        // capacity 1
    run_store_case(dtype, 0, 8, 3, 4, false, rng);       // nothing to do
    if (HasFatalFailure()) return;
  }
}

// ---- GPU local part + CPU sparse part == all-CPU --------------------------------

TEST_F(GpuAttention, LocalPartMergedWithCpuPartEqualsCpuDense) {
  const int n_kv_heads = 2, group = 4, d = 128, n_heads = n_kv_heads * group;
  const int64_t n_tokens = 300;
  LongContextConfig config;
  config.max_seq_len = 512;
  config.block_size = 16;
  config.kv_type = DType::kF16;
  config.initial_len = 16;
  config.local_windows_len = 64;
  config.second_select_num = 4;
  kvstore::MemoryBudget budget(uint64_t{1} << 30);
  const kvstore::NumaTopology topology = kvstore::NumaTopology::detect();
  kvstore::KVStore store(kvstore::KVShape{1, n_kv_heads, d}, config, budget, topology);

  std::mt19937 rng(test_seed(77));
  std::normal_distribution<float> normal;
  const size_t row = size_t(n_kv_heads) * d;
  std::vector<float> k(size_t(n_tokens) * row), v(k.size()), q(size_t(n_heads) * d);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = 2.f * normal(rng);
  store.append(0, make_view(k.data(), DType::kF32, {n_tokens, n_kv_heads, d}),
               make_view(v.data(), DType::kF32, {n_tokens, n_kv_heads, d}));
  const kvstore::Partition part = store.partition(0);
  ASSERT_EQ(part.local_begin, n_tokens - config.local_windows_len);

  // CPU: sinks + context (every token before the local window).
  std::vector<float> cpu_out(q.size()), cpu_lse(static_cast<size_t>(n_heads));
  const TensorView q_view = make_view(q.data(), DType::kF32, {n_heads, d});
  cpu::decode_attention(store, 0, q_view, cpu::select_all(store, 0, /*include_local=*/false), {},
                        make_mutable_view(cpu_out.data(), DType::kF32, {n_heads, d}),
                        make_mutable_view(cpu_lse.data(), DType::kF32, {n_heads}));

  // GPU: the local window from a ring of local_windows_len slots, filled like
  // the device does (store_kv, ring), from the last window's tokens.
  const int64_t capacity = config.local_windows_len;
  std::vector<uint16_t> ring_k(size_t(capacity) * row), ring_v(ring_k.size());
  for (auto [src, dst] : {std::pair{&k, &ring_k}, std::pair{&v, &ring_v}}) {
    StoreKVParams s;
    s.src = src->data() + size_t(part.local_begin) * row;
    s.dst = dst->data();
    s.kv_dtype = config.kv_type;
    s.n = n_tokens - part.local_begin, s.row_elems = int64_t(row), s.first_pos = part.local_begin;
    s.capacity = capacity, s.ring = true;
    store_kv_host(s);
  }
  std::vector<float> gpu_out(q.size()), gpu_lse(static_cast<size_t>(n_heads));
  LocalAttentionParams lp;
  lp.q = q.data(), lp.k = ring_k.data(), lp.v = ring_v.data(), lp.out = gpu_out.data(), lp.lse = gpu_lse.data();
  lp.kv_dtype = config.kv_type;
  lp.capacity = capacity, lp.first_pos = part.local_begin, lp.last_pos = n_tokens - 1;
  lp.n_heads = n_heads, lp.n_kv_heads = n_kv_heads, lp.head_dim = d;
  local_window_attention_host(lp);

  std::vector<float> merged(q.size()), merged_lse(static_cast<size_t>(n_heads));
  merge_attention_states_host(MergeParams{cpu_out.data(), cpu_lse.data(), gpu_out.data(), gpu_lse.data(),
                                          merged.data(), merged_lse.data(), n_heads, d});

  std::vector<float> dense(q.size()), dense_lse(static_cast<size_t>(n_heads));
  cpu::dense_decode_attention(store, 0, q_view, {}, make_mutable_view(dense.data(), DType::kF32, {n_heads, d}),
                              make_mutable_view(dense_lse.data(), DType::kF32, {n_heads}));

  // fp64 reference over every token, K/V as stored.
  const Rounded kr = round_all(k, config.kv_type), vr = round_all(v, config.kv_type);
  std::vector<int64_t> all(static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) all[size_t(t)] = t;
  for (int h = 0; h < n_heads; ++h) {
    std::vector<double> qh(q.begin() + size_t(h) * d, q.begin() + size_t(h + 1) * d);
    const RowRef ref =
        reference_row(qh.data(), kr.value, vr.value, all, row, size_t(h / group) * d, d, 1.0 / std::sqrt(double(d)));
    Tolerance tol = tolerance(ref, d, 0.0, false);
    tol.out *= 2, tol.lse *= 2;  // two f32 paths (and a merge) on each side
    expect_row(merged.data() + size_t(h) * d, merged_lse.data() + h, ref, tol, d, str_cat("merged head ", h));
    expect_row(dense.data() + size_t(h) * d, dense_lse.data() + h, ref, tol, d, str_cat("dense head ", h));
    for (int c = 0; c < d; ++c)
      ASSERT_NEAR(merged[size_t(h) * d + c], dense[size_t(h) * d + c], 2 * tol.out) << "head " << h << " channel " << c;
    ASSERT_NEAR(merged_lse[size_t(h)], dense_lse[size_t(h)], 2 * tol.lse) << "head " << h;
  }
}

// ---- parameter validation ------------------------------------------------------

template <typename Fn>
void expect_invalid(Fn&& fn, const std::string& field) {
  try {
    fn();
    ADD_FAILURE() << "expected Error(kInvalidArgument) naming " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

PrefillAttentionParams valid_prefill(std::vector<float>& q, std::vector<uint16_t>& kv, std::vector<float>& out) {
  PrefillAttentionParams p;
  p.n_q = 2, p.n_kv = 3, p.n_heads = 4, p.n_kv_heads = 2, p.head_dim = 64;
  q.assign(size_t(p.n_q) * p.n_heads * p.head_dim, 0.f);
  out.assign(q.size(), 0.f);
  kv.assign(size_t(p.n_kv) * p.n_kv_heads * p.head_dim, 0);
  p.q = q.data(), p.k = kv.data(), p.v = kv.data(), p.out = out.data();
  return p;
}

// Runs in every build, with or without a device: validation comes before any
// CUDA call, and a build without CUDA refuses as unsupported.
TEST(GpuAttentionValidation, RefusesBadParamsBeforeAnyCudaCall) {
  std::vector<float> q, out;
  std::vector<uint16_t> kv;
  PrefillAttentionParams p = valid_prefill(q, kv, out);
  p.head_dim = 96;
#ifdef LONGCTX_HAVE_CUDA
  ASSERT_TRUE(built_with_cuda());
  expect_invalid([&] { prefill_attention_host(p); }, "head_dim");
  expect_invalid([&] { prefill_attention(p, nullptr); }, "head_dim");
  LocalAttentionParams l;
  l.n_heads = 1, l.n_kv_heads = 1, l.head_dim = 64, l.capacity = 4, l.first_pos = 0, l.last_pos = 9;
  expect_invalid([&] { local_window_attention_host(l); }, "first_pos");
  StoreKVParams s;
  s.n = 1, s.row_elems = 8, s.capacity = 1;
  expect_invalid([&] { store_kv_host(s); }, "src");
#else
  ASSERT_FALSE(built_with_cuda());
  for (auto fn : {+[](const PrefillAttentionParams& x) { prefill_attention_host(x); },
                  +[](const PrefillAttentionParams& x) { prefill_attention(x, nullptr); }}) {
    try {
      fn(p);
      ADD_FAILURE() << "expected Error(kUnsupported)";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
  EXPECT_THROW(local_window_attention_host(LocalAttentionParams{}), Error);
  EXPECT_THROW(local_window_attention(LocalAttentionParams{}, nullptr), Error);
  EXPECT_THROW(store_kv(StoreKVParams{}, nullptr), Error);
  EXPECT_THROW(store_kv_host(StoreKVParams{}), Error);
#endif
}

TEST_F(GpuAttention, RejectsEachBadField) {
  std::vector<float> q, out;
  std::vector<uint16_t> kv;
  const PrefillAttentionParams good = valid_prefill(q, kv, out);
  prefill_attention_host(good);  // the baseline is valid
  auto bad = [&](auto edit, const std::string& field) {
    PrefillAttentionParams p = good;
    edit(p);
    expect_invalid([&] { prefill_attention_host(p); }, field);
  };
  bad([](auto& p) { p.q = nullptr; }, "q is null");
  bad([](auto& p) { p.k = nullptr; }, "k is null");
  bad([](auto& p) { p.v = nullptr; }, "v is null");
  bad([](auto& p) { p.out = nullptr; }, "out is null");
  bad([](auto& p) { p.n_q = -1; }, "n_q");
  bad([](auto& p) { p.n_kv = -1; }, "n_kv");
  bad([](auto& p) { p.n_heads = 0; }, "n_heads");
  bad([](auto& p) { p.n_kv_heads = 3; }, "n_kv_heads");
  bad([](auto& p) { p.n_kv_heads = 0; }, "n_kv_heads");
  bad([](auto& p) { p.head_dim = 32; }, "head_dim");
  bad([](auto& p) { p.kv_dtype = DType::kF32; }, "kv_dtype");
  bad([](auto& p) { p.scale = std::numeric_limits<float>::infinity(); }, "scale");
  {  // device pointers must be 16-byte aligned
    PrefillAttentionParams p = good;
    p.k = reinterpret_cast<const char*>(p.k) + 2;
    expect_invalid([&] { prefill_attention(p, nullptr); }, "aligned");
  }

  std::vector<float> lq(64), lout(64), llse(1);
  LocalAttentionParams l;
  l.q = lq.data(), l.k = kv.data(), l.v = kv.data(), l.out = lout.data(), l.lse = llse.data();
  l.n_heads = 1, l.n_kv_heads = 1, l.head_dim = 64, l.capacity = 4, l.first_pos = 0, l.last_pos = 3;
  local_window_attention_host(l);  // valid
  auto bad_local = [&](auto edit, const std::string& field) {
    LocalAttentionParams x = l;
    edit(x);
    expect_invalid([&] { local_window_attention_host(x); }, field);
  };
  bad_local([](auto& x) { x.first_pos = 1, x.last_pos = 5; }, "first_pos");
  bad_local([](auto& x) { x.first_pos = -1; }, "first_pos");
  bad_local([](auto& x) { x.capacity = 0; }, "capacity");
  bad_local([](auto& x) { x.lse = nullptr; }, "lse is null");
  bad_local([](auto& x) { x.k = nullptr; }, "k is null");
  bad_local([](auto& x) { x.head_dim = 80; }, "head_dim");
  bad_local([](auto& x) { x.kv_dtype = DType::kF32; }, "kv_dtype");
  bad_local([](auto& x) { x.n_heads = 3, x.n_kv_heads = 2; }, "n_heads");

  std::vector<float> src(16);
  std::vector<uint16_t> dst(16);
  StoreKVParams s;
  s.src = src.data(), s.dst = dst.data(), s.n = 2, s.row_elems = 8, s.capacity = 2;
  store_kv_host(s);  // valid
  auto bad_store = [&](auto edit, const std::string& field) {
    StoreKVParams x = s;
    edit(x);
    expect_invalid([&] { store_kv_host(x); }, field);
  };
  bad_store([](auto& x) { x.first_pos = 1; }, "capacity");
  bad_store([](auto& x) { x.first_pos = -1; }, "first_pos");
  bad_store([](auto& x) { x.row_elems = 0; }, "row_elems");
  bad_store([](auto& x) { x.dst = nullptr; }, "dst");
  bad_store([](auto& x) { x.kv_dtype = DType::kF32; }, "kv_dtype");
}

}  // namespace
}  // namespace longctx::gpu
