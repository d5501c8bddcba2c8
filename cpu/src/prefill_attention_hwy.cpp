// f32 tile kernels of prefill attention (see prefill_attention_kernels.h),
// written once over Highway and compiled for every x86 target; the best one
// for this CPU is picked at run time.
//
// The GEMM is register-blocked: a micro-kernel keeps kRows x kVecs vectors of
// C in registers and, for each step k of the depth, loads kVecs vectors of
// row k of B and broadcasts one element of each of the kRows rows of A. With
// AVX-512 (32 registers) 4 x 4 accumulators + 4 B vectors fit; with 16
// registers (AVX2, SSE4) 6 x 2, 12 accumulators + 2 B vectors + the
// broadcast, as BLIS's Haswell kernel: 4 x 2 left 8 FMA chains for Zen 3's
// 2 pipes of latency 4, no slack (a 256 x 128 x 128 product ran at 70 GFLOP/s
// on one core, 6 x 2 at 87).
#include <algorithm>
#include <cmath>
#include <limits>

#include "longctx/cpu/prefill_attention_kernels.h"

// foreach_target.h re-includes this file once per target. The path is looked
// up through the include directories; cpu/include/../src is this folder.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/prefill_attention_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "exp_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx {
namespace cpu {
namespace HWY_NAMESPACE {
namespace {  // internal linkage: other kernels of cpu/ may use the same helper names
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if HWY_TARGET <= HWY_AVX3
constexpr size_t kMaxRows = 4;
constexpr size_t kMaxVecs = 4;
#else
constexpr size_t kMaxRows = 6;
constexpr size_t kMaxVecs = 2;
#endif

// C[kRows][kVecs * lanes] (+)= A[kRows][depth] x B[depth][kVecs * lanes].
template <size_t kRows, size_t kVecs>
HWY_INLINE void MicroKernel(bool accumulate, size_t depth, const float* HWY_RESTRICT a, size_t lda,
                            const float* HWY_RESTRICT b, size_t ldb, float* HWY_RESTRICT c, size_t ldc) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF acc[kRows][kVecs];
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t v = 0; v < kVecs; ++v) acc[r][v] = accumulate ? hn::LoadU(df, c + r * ldc + v * lanes) : hn::Zero(df);
  }
  for (size_t k = 0; k < depth; ++k) {
    VF b_row[kVecs];
    for (size_t v = 0; v < kVecs; ++v) b_row[v] = hn::LoadU(df, b + k * ldb + v * lanes);
    for (size_t r = 0; r < kRows; ++r) {
      const VF a_rk = hn::Set(df, a[r * lda + k]);
      for (size_t v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(a_rk, b_row[v], acc[r][v]);
    }
  }
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t v = 0; v < kVecs; ++v) hn::StoreU(acc[r][v], df, c + r * ldc + v * lanes);
  }
}

// MicroKernel<kRows, vecs> for a run-time vecs in [1, kMaxVecs].
template <size_t kRows, size_t kVecs = kMaxVecs>
HWY_INLINE void MicroKernelVecs(size_t vecs, bool accumulate, size_t depth, const float* a, size_t lda,
                                const float* b, size_t ldb, float* c, size_t ldc) {
  if constexpr (kVecs > 1) {
    if (vecs < kVecs) return MicroKernelVecs<kRows, kVecs - 1>(vecs, accumulate, depth, a, lda, b, ldb, c, ldc);
  }
  MicroKernel<kRows, kVecs>(accumulate, depth, a, lda, b, ldb, c, ldc);
}

// The same for a run-time rows in [1, kMaxRows].
template <size_t kRows = kMaxRows>
HWY_INLINE void MicroKernelRowsVecs(size_t rows, size_t vecs, bool accumulate, size_t depth, const float* a,
                                    size_t lda, const float* b, size_t ldb, float* c, size_t ldc) {
  if constexpr (kRows > 1) {
    if (rows < kRows) {
      return MicroKernelRowsVecs<kRows - 1>(rows, vecs, accumulate, depth, a, lda, b, ldb, c, ldc);
    }
  }
  MicroKernelVecs<kRows>(vecs, accumulate, depth, a, lda, b, ldb, c, ldc);
}

// Panels of kMaxVecs vectors of columns (B's panel stays in L1 while every
// row group of A passes over it), then groups of kMaxRows rows.
void PrefillGemm(bool accumulate, size_t rows, size_t cols, size_t depth, const float* a, size_t lda,
                 const float* b, size_t ldb, float* c, size_t ldc) {
  const size_t lanes = hn::Lanes(DF());
  for (size_t col = 0; col < cols; col += kMaxVecs * lanes) {
    const size_t vecs = std::min(kMaxVecs, (cols - col) / lanes);
    for (size_t row = 0; row < rows; row += kMaxRows) {
      const size_t n_rows = std::min(kMaxRows, rows - row);
      MicroKernelRowsVecs(n_rows, vecs, accumulate, depth, a + row * lda, lda, b + col, ldb, c + row * ldc + col,
                          ldc);
    }
  }
}

void PrefillSoftmaxStep(size_t rows, size_t cols, const int* valid, float* s, size_t lds, float* m, float* l,
                        float* o, size_t ldo, size_t o_cols) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    std::fill(row + valid[r], row + cols, kNegInf);
    VF max_v = hn::Set(df, kNegInf);
    for (size_t j = 0; j < cols; j += lanes) max_v = hn::Max(max_v, hn::LoadU(df, row + j));
    // Finite: valid[r] >= 1 real (finite) score.
    const float m_new = std::max(m[r], hn::GetLane(hn::MaxOfLanes(df, max_v)));
    const VF m_new_v = hn::Set(df, m_new);
    VF sum_v = hn::Zero(df);
    for (size_t j = 0; j < cols; j += lanes) {
      const VF p = ExpNonPositive(df, hn::Sub(hn::LoadU(df, row + j), m_new_v));  // masked: exp(-inf) = 0
      hn::StoreU(p, df, row + j);
      sum_v = hn::Add(sum_v, p);
    }
    const float alpha = std::exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
    l[r] = l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, sum_v));
    m[r] = m_new;
    if (alpha != 1.f) {
      float* o_row = o + r * ldo;
      const VF alpha_v = hn::Set(df, alpha);
      for (size_t j = 0; j < o_cols; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(df, o_row + j), alpha_v), df, o_row + j);
    }
  }
}

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace longctx
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::cpu {

HWY_EXPORT(PrefillGemm);
HWY_EXPORT(PrefillSoftmaxStep);

namespace detail {

void gemm_f32(bool accumulate, size_t rows, size_t cols, size_t depth, const float* a, size_t lda, const float* b,
              size_t ldb, float* c, size_t ldc) {
  HWY_DYNAMIC_DISPATCH(PrefillGemm)(accumulate, rows, cols, depth, a, lda, b, ldb, c, ldc);
}

void softmax_step(size_t rows, size_t cols, const int* valid, float* s, size_t lds, float* m, float* l, float* o,
                  size_t ldo, size_t o_cols) {
  HWY_DYNAMIC_DISPATCH(PrefillSoftmaxStep)(rows, cols, valid, s, lds, m, l, o, ldo, o_cols);
}

}  // namespace detail
}  // namespace longctx::cpu
#endif  // HWY_ONCE
