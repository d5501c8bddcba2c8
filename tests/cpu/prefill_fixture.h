// What the prefill attention tests share (prefill_attention_test.cpp,
// prefill_kernel_choice_test.cpp): a case's store and random tokens, queries
// and outputs (possibly strided, with padding that must stay untouched), every
// kernel and Highway target this CPU runs, the fp64 reference rows of a chunk
// (over the bf16 kernels' rounded inputs where they round) and the error
// bounds they are compared with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/kvstore/kv_store.h"
#include "reference.h"
#include "store_fixture.h"

namespace longctx::cpu::prefill_testing {

inline const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff
inline constexpr float kSentinel = -12345.f;    // fills padding the kernel must not write

// ---- stores -------------------------------------------------------------------------

struct PrefillCase {
  DType kv_type = DType::kF16;
  int block_size = 16;
  int head_dim = 64;
  int n_kv_heads = 1;
  int g = 1;            // query heads per kv head
  int64_t history = 0;  // tokens before the chunk
  int64_t n = 1;        // queries in the chunk
  bool strided = false; // q/out/lse as views into larger buffers

  int n_q_heads() const { return g * n_kv_heads; }
  int64_t n_tokens() const { return history + n; }
  std::string describe() const {
    return str_cat(dtype_name(kv_type), " block=", block_size, " head_dim=", head_dim, " kv_heads=", n_kv_heads,
                   " g=", g, " history=", history, " n=", n, strided ? " strided" : "");
  }
};

using testing::append;
using testing::expect_invalid;
using testing::normal_values;

// A store of the case's dtype, block size and heads (testing::make_store).
inline std::unique_ptr<testing::BudgetedStore> make_store(const PrefillCase& c, int64_t capacity) {
  return testing::make_store(c.kv_type, c.block_size, c.n_kv_heads, c.head_dim, capacity);
}

// Random tokens on both layers (layer 1 gets n_tokens, layer 0 a different count).
inline void fill_random(kvstore::KVStore& store, int64_t n_tokens, std::mt19937& rng) {
  const kvstore::KVShape& s = store.layout().shape;
  for (int layer : {0, 1}) {
    const int64_t count = layer == 1 ? n_tokens : std::max<int64_t>(1, n_tokens / 2);
    const size_t size = size_t(count) * size_t(s.n_kv_heads) * size_t(s.head_dim);
    const std::vector<float> k = normal_values(size, rng), v = normal_values(size, rng);
    append(store, layer, k.data(), v.data(), count);
  }
}

// ---- queries and outputs, possibly strided ---------------------------------------------

// q [n][n_q_heads][head_dim] and out/lse, each optionally inside a larger
// buffer (head rows padded, lse rows padded) whose padding must stay untouched.
struct Buffers {
  int64_t n = 0;
  int n_q_heads = 0, head_dim = 0;
  int64_t head_stride = 0, lse_row_stride = 0;  // >= head_dim, >= n_q_heads
  std::vector<float> q, out, lse;

  Buffers(const PrefillCase& c, std::mt19937& rng)
      : n(c.n), n_q_heads(c.n_q_heads()), head_dim(c.head_dim),
        head_stride(c.strided ? c.head_dim + 5 : c.head_dim),
        lse_row_stride(c.strided ? c.n_q_heads() + 3 : c.n_q_heads()) {
    q = normal_values(size_t(n * n_q_heads * head_stride), rng);
    out.assign(q.size(), kSentinel);
    lse.assign(size_t(n * lse_row_stride), kSentinel);
  }
  const float* q_row(int64_t i, int h) const { return &q[size_t((i * n_q_heads + h) * head_stride)]; }
  float* q_row(int64_t i, int h) { return &q[size_t((i * n_q_heads + h) * head_stride)]; }
  const float* out_row(int64_t i, int h) const { return &out[size_t((i * n_q_heads + h) * head_stride)]; }
  float lse_at(int64_t i, int h) const { return lse[size_t(i * lse_row_stride + h)]; }

  TensorView q_view() const {
    TensorView v = make_view(q.data(), DType::kF32, {n, n_q_heads, head_dim});
    v.strides = {n_q_heads * head_stride, head_stride, 1, 0};
    return v;
  }
  MutableTensorView out_view() {
    MutableTensorView v = make_mutable_view(out.data(), DType::kF32, {n, n_q_heads, head_dim});
    v.strides = {n_q_heads * head_stride, head_stride, 1, 0};
    return v;
  }
  MutableTensorView lse_view() {
    MutableTensorView v = make_mutable_view(lse.data(), DType::kF32, {n, n_q_heads});
    v.strides = {lse_row_stride, 1, 0, 0};
    return v;
  }
  void reset_outputs() {
    std::fill(out.begin(), out.end(), kSentinel);
    std::fill(lse.begin(), lse.end(), kSentinel);
  }
  bool padding_untouched() const {
    for (int64_t i = 0; i < n; ++i) {
      for (int h = 0; h < n_q_heads; ++h)
        for (int64_t c = head_dim; c < head_stride; ++c)
          if (out_row(i, h)[c] != kSentinel) return false;
      for (int64_t h = n_q_heads; h < lse_row_stride; ++h)
        if (lse[size_t(i * lse_row_stride + h)] != kSentinel) return false;
    }
    return true;
  }
};

// ---- kernels ------------------------------------------------------------------------

// One way to run the kernel: f32 on one Highway target, or bf16 (its softmax
// step on the best target).
struct KernelRun {
  PrefillKernel kernel = PrefillKernel::kF32;
  int64_t target = 0;  // f32: the Highway target forced
  std::string name() const {
    return kernel == PrefillKernel::kF32 ? str_cat("f32 on ", hwy::TargetName(target)) : prefill_kernel_name(kernel);
  }
};

// Every kernel and target compiled in and supported by this CPU.
inline std::vector<KernelRun> every_kernel_run() {
  std::vector<KernelRun> runs;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) runs.push_back({PrefillKernel::kF32, target});
  for (PrefillKernel kernel : supported_prefill_kernels())
    if (kernel != PrefillKernel::kF32) runs.push_back({kernel, 0});
  return runs;
}

// Forces the run's Highway target while it lives (f32 runs).
class KernelScope {
 public:
  explicit KernelScope(const KernelRun& run) {
    if (run.target != 0) hwy::SetSupportedTargetsForTest(run.target);
  }
  ~KernelScope() { hwy::SetSupportedTargetsForTest(0); }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
};

inline void run_prefill(const kvstore::KVStore& store, int64_t first_pos, Buffers& b, float scale = 0.f,
                 PrefillKernel kernel = PrefillKernel::kF32) {
  prefill_attention(store, 1, first_pos, b.q_view(), scale, b.out_view(), b.lse_view(), kernel);
}

// ---- error budget -------------------------------------------------------------------

// Bounds of |kernel - reference| for one row, u = 2^-24, L = keys the row
// attends (position + 1), A = max over keys of scale sum_c |q_c k_c|,
// V = max |v| (from the reference):
// - logits: q * scale rounded, the f32 scale itself rounded, then a d-term
//   FMA chain: |s_kernel - s| <= (d + 2) u A = e_s.
// - each unnormalized probability exp(s_t - m) carries a relative error
//     e_p = 2 e_s               (s_t and the running max m)
//         + 110 u               (the argument, in [-105, 0], rounded; Exp within 2 ulp)
//         + (2 A + 2 L) u       (the online-softmax rescalings exp(m_old - m_new), one
//                                per key tile, at most L: their arguments add up to at
//                                most 2A, each rounded, each product rounded)
//         + exp_polynomial_error (bf16 and amx: their exp's own error)
// - l and each output channel are f32 sums of L terms (lanes, lane reduction,
//   tiles): relative error <= 4 L u of the sum of |terms|.
// out = sum p v / sum p:  |err| <= V (2 e_p + 8 L u + 2 u)
// lse = m + log l:        |err| <= e_s + e_p + 4 L u + (|lse| + 2) u
// With integer inputs, scale 1 and logits below 2^24 (exact_logits), every
// logit, running max and difference of them is exact in f32: e_s = 0 and the
// 2A term drops.
//
// The bf16 kernel is compared with the reference over its rounded inputs
// (bf16(q * scale), bf16(k), bf16(v): rounded_reference_rows), where its
// products of bf16 pairs are exact in f32 and the logits carry the same e_s.
// What remains is P rounded to bf16 for P V (l sums the f32 p): each term
// p v gains a relative error of at most u_bf16 = 2^-8, the output V u_bf16.
struct Bounds {
  double out = 0, lse = 0;
};

inline const double kUBf16 = std::ldexp(1.0, -8);  // bf16 unit roundoff (8-bit significand)

// bf16 and onednn multiply the same bf16-rounded q * scale, k, v and p.
inline bool rounds_to_bf16(PrefillKernel kernel) { return kernel != PrefillKernel::kF32; }

// bf16 and amx take exp from a polynomial within a relative 3.0e-6
// (prefill_attention_kernels.h) instead of Exp's 2 ulp: once for p itself and
// once per rise of the row's max after it, at most once per 128 keys (kBf16's
// key tiles, kAmx's chunks).
inline double exp_polynomial_error(PrefillKernel kernel, double n_keys) {
  const bool polynomial = kernel == PrefillKernel::kBf16 || kernel == PrefillKernel::kAmx;
  return polynomial ? 3.0e-6 * (1 + std::ceil(n_keys / 128)) : 0.0;
}

inline Bounds error_bounds(const prefill_ref::Row& ref, int head_dim, int64_t n_keys, bool exact_logits = false,
                    PrefillKernel kernel = PrefillKernel::kF32) {
  const double A = ref.max_logit_terms, L = double(n_keys);
  const double e_s = exact_logits ? 0.0 : (head_dim + 2) * kU * A;
  const double e_p =
      2 * e_s + 110 * kU + ((exact_logits ? 0.0 : 2 * A) + 2 * L) * kU + exp_polynomial_error(kernel, L);
  const double p_rounding = rounds_to_bf16(kernel) ? kUBf16 : 0.0;
  Bounds b;
  b.out = ref.max_abs_value * (2 * e_p + p_rounding + 8 * L * kU + 2 * kU);
  b.lse = e_s + e_p + 4 * L * kU + (std::abs(ref.lse) + 2) * kU;
  return b;
}

inline double round_bf16(double x) { return bf16_bits_to_f32(f32_to_bf16_bits(float(x))); }

// A stored head with its keys and values rounded to bf16, as the bf16 kernel reads them.
inline prefill_ref::StoredHead rounded_to_bf16(prefill_ref::StoredHead head) {
  for (double& x : head.k) x = round_bf16(x);
  for (double& x : head.v) x = round_bf16(x);
  return head;
}

// A query as the bf16 kernel multiplies it: q * scale in f32, rounded to bf16.
inline std::vector<float> rounded_query(const float* q, int head_dim, float scale) {
  std::vector<float> rounded(static_cast<size_t>(head_dim));
  for (int c = 0; c < head_dim; ++c) rounded[size_t(c)] = float(round_bf16(q[c] * scale));
  return rounded;
}

// The reference rows of a chunk, [n][n_q_heads], for `kernel`: over the
// stored values (f32), or over the bf16 kernel's rounded inputs (scale is
// then the kernel's f32 scale, applied before rounding).
inline std::vector<prefill_ref::Row> reference_rows(const kvstore::KVStore& store, int64_t first_pos, const Buffers& b,
                                             double scale, PrefillKernel kernel = PrefillKernel::kF32) {
  const int n_kv = store.layout().shape.n_kv_heads;
  const int g = b.n_q_heads / n_kv;
  const bool bf16 = rounds_to_bf16(kernel);
  std::vector<prefill_ref::StoredHead> heads;
  for (int h = 0; h < n_kv; ++h) {
    prefill_ref::StoredHead head = prefill_ref::stored_head(store, 1, h);
    heads.push_back(bf16 ? rounded_to_bf16(std::move(head)) : std::move(head));
  }
  std::vector<prefill_ref::Row> rows;
  for (int64_t i = 0; i < b.n; ++i) {
    for (int h = 0; h < b.n_q_heads; ++h) {
      const prefill_ref::StoredHead& head = heads[size_t(h / g)];
      rows.push_back(bf16 ? prefill_ref::attend_causal(rounded_query(b.q_row(i, h), b.head_dim, float(scale)).data(),
                                                       1.0, head, first_pos + i)
                          : prefill_ref::attend_causal(b.q_row(i, h), scale, head, first_pos + i));
    }
  }
  return rows;
}

inline void expect_matches_reference(const Buffers& b, int64_t first_pos, const std::vector<prefill_ref::Row>& ref,
                              bool exact_logits = false, PrefillKernel kernel = PrefillKernel::kF32) {
  ASSERT_TRUE(b.padding_untouched()) << "wrote outside the views";
  for (int64_t i = 0; i < b.n; ++i) {
    for (int h = 0; h < b.n_q_heads; ++h) {
      const prefill_ref::Row& r = ref[size_t(i * b.n_q_heads + h)];
      const Bounds bounds = error_bounds(r, b.head_dim, first_pos + i + 1, exact_logits, kernel);
      SCOPED_TRACE(str_cat("query ", i, " (position ", first_pos + i, ") head ", h));
      ASSERT_TRUE(std::isfinite(b.lse_at(i, h))) << b.lse_at(i, h);
      ASSERT_NEAR(b.lse_at(i, h), r.lse, bounds.lse);
      for (int c = 0; c < b.head_dim; ++c) {
        ASSERT_TRUE(std::isfinite(b.out_row(i, h)[c])) << "channel " << c << ": " << b.out_row(i, h)[c];
        ASSERT_NEAR(b.out_row(i, h)[c], r.out[size_t(c)], bounds.out) << "channel " << c;
      }
    }
  }
}

}  // namespace longctx::cpu::prefill_testing
