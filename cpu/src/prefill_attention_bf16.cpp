// bf16 tile kernels of prefill attention (prefill_attention_kernels.h) on
// AVX512-BF16's vdpbf16ps, which multiplies pairs of bf16 and adds both
// products to an f32 lane: 32 multiply-adds per instruction where the f32 FMA
// does 16; and the softmax step that writes P in bf16, which the bf16 and
// amx kernels share. Compiled with AVX512-BF16 (cpu/CMakeLists.txt) and
// reached only through the run-time choice of PrefillKernel.
//
// The B operand of vdpbf16ps holds, per f32 lane (one column n), the pair of
// rows 2k and 2k + 1 of that column: B is packed as [depth / 2][cols] 32-bit
// pairs (the layout AMX tiles load as well). A row of A is plain row-major
// bf16, whose consecutive elements are those pairs, broadcast to every lane.
#include <immintrin.h>

// GCC 12's avx512fintrin.h passes _mm512_undefined_ps() through the unmasked
// max, scalef, roundscale and extract intrinsics, which -Wmaybe-uninitialized
// reports (as -Wuninitialized once more of them are unrolled) when they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "longctx/cpu/prefill_attention_kernels.h"

namespace longctx::cpu::detail {
namespace {

constexpr size_t kLanes = 16;  // f32 lanes of a zmm register
constexpr size_t kMaxRows = 6;
constexpr size_t kMaxVecs = 4;  // 6 x 4 accumulators + 4 B vectors: 28 of the 32 registers

// C[kRows][kVecs * 16] (+)= A[kRows][2 * pairs] x B[pairs][kVecs * 16] (B packed in pairs).
template <size_t kRows, size_t kVecs>
inline void micro_kernel(bool accumulate, size_t pairs, const uint16_t* a, size_t lda, const uint32_t* b,
                         size_t ldb, float* c, size_t ldc) {
  __m512 acc[kRows][kVecs];
  for (size_t r = 0; r < kRows; ++r)
    for (size_t v = 0; v < kVecs; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * kLanes) : _mm512_setzero_ps();
  for (size_t k = 0; k < pairs; ++k) {
    __m512bh b_pairs[kVecs];
    for (size_t v = 0; v < kVecs; ++v) b_pairs[v] = (__m512bh)_mm512_loadu_si512(b + k * ldb + v * kLanes);
    for (size_t r = 0; r < kRows; ++r) {
      int32_t a_pair;
      std::memcpy(&a_pair, a + r * lda + 2 * k, sizeof(a_pair));
      const __m512bh a_rk = (__m512bh)_mm512_set1_epi32(a_pair);
      for (size_t v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_rk, b_pairs[v]);
    }
  }
  for (size_t r = 0; r < kRows; ++r)
    for (size_t v = 0; v < kVecs; ++v) _mm512_storeu_ps(c + r * ldc + v * kLanes, acc[r][v]);
}

// micro_kernel<kRows, vecs> for a run-time vecs in [1, kMaxVecs].
template <size_t kRows, size_t kVecs = kMaxVecs>
inline void micro_kernel_vecs(size_t vecs, bool accumulate, size_t pairs, const uint16_t* a, size_t lda,
                              const uint32_t* b, size_t ldb, float* c, size_t ldc) {
  if constexpr (kVecs > 1) {
    if (vecs < kVecs) return micro_kernel_vecs<kRows, kVecs - 1>(vecs, accumulate, pairs, a, lda, b, ldb, c, ldc);
  }
  micro_kernel<kRows, kVecs>(accumulate, pairs, a, lda, b, ldb, c, ldc);
}

// The same for a run-time rows in [1, kMaxRows].
template <size_t kRows = kMaxRows>
inline void micro_kernel_rows(size_t rows, size_t vecs, bool accumulate, size_t pairs, const uint16_t* a,
                              size_t lda, const uint32_t* b, size_t ldb, float* c, size_t ldc) {
  if constexpr (kRows > 1) {
    if (rows < kRows) return micro_kernel_rows<kRows - 1>(rows, vecs, accumulate, pairs, a, lda, b, ldb, c, ldc);
  }
  micro_kernel_vecs<kRows>(vecs, accumulate, pairs, a, lda, b, ldb, c, ldc);
}

// 16 f32 -> 16 bf16, rounded to nearest even.
inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

// 2^t for t < 128 (-inf and t below -150 give 0): t = n + f with n = floor(t)
// and f in [0, 1) (vreduceps, exact), 2^f = 1 + f c(f) with c of degree 3,
// its coefficients fitted for the smallest relative error over [0, 1], scaled
// by 2^n (vscalefps takes the floor of t itself and gives 0 below f32's
// range, so t needs no clamp). Evaluated in f32 the relative error is at most
// 2.97e-6 (every f32 t in [-1, 0] checked), 50 f32 ulps: P is rounded to bf16
// (2^-9) after it, and l and lse stay within a few millionths. The degree-4 c
// of 1.8e-7 cost a multiply-add more per 16 scores, 8% of the exp pass.
// 2^0 is exactly 1.
inline __m512 exp2_approx(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(1.342660654336214e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.224259942770004e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4128015339374542e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.930448412895203e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, t);
}

constexpr float kLog2e = 1.44269504088896341f;

// Independent accumulators of the max and the sum of a row: one chain would
// wait for each max or add to finish (4 cycles) before the next vector.
constexpr size_t kChains = 4;

// Lane-wise maxima of s[0, count), count >= 1 (their max is the row's):
// whole vectors, then at most one partial vector under a mask.
inline __m512 row_max(const float* s, size_t count) {
  const size_t whole = count / kLanes * kLanes;
  const size_t rest = count - whole;
  const size_t chained = whole / (kChains * kLanes) * (kChains * kLanes);  // columns the unrolled loop takes
  __m512 max_v[kChains];
  for (size_t c = 0; c < kChains; ++c) max_v[c] = _mm512_set1_ps(-INFINITY);
  for (size_t j = 0; j < chained; j += kChains * kLanes)
    for (size_t c = 0; c < kChains; ++c) max_v[c] = _mm512_max_ps(max_v[c], _mm512_loadu_ps(s + j + c * kLanes));
  for (size_t j = chained; j < whole; j += kLanes) max_v[0] = _mm512_max_ps(max_v[0], _mm512_loadu_ps(s + j));
  if (rest > 0) {
    const __mmask16 rest_lanes = __mmask16((1u << rest) - 1);
    max_v[1] = _mm512_mask_max_ps(max_v[1], rest_lanes, max_v[1], _mm512_loadu_ps(s + whole));
  }
  for (size_t c = 1; c < kChains; ++c) max_v[0] = _mm512_max_ps(max_v[0], max_v[c]);
  return max_v[0];
}

// p[j] = bf16(exp(s[j] - m)) for j < count, 0 for count <= j < cols; returns
// the f32 exps summed lane-wise. Whole vectors first, then at most one
// partial vector under a mask; the vectors past it only get P = 0.
inline __m512 exp_row(const float* s, size_t count, size_t cols, float m, uint16_t* p) {
  const size_t whole = count / kLanes * kLanes;
  const size_t rest = count - whole;
  const size_t chained = whole / (kChains * kLanes) * (kChains * kLanes);
  // exp(s - m) = 2^((s - m) log2(e)). s - m first: folding m log2(e) into
  // one constant would round it, an error of up to 2^-10 at |m| = 1e4 that
  // lse keeps.
  const __m512 log2e = _mm512_set1_ps(kLog2e);
  const __m512 m_v = _mm512_set1_ps(m);
  const auto exp_at = [&](size_t j) { return exp2_approx(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), m_v), log2e)); };
  const auto store_p = [&](size_t j, __m512 e) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), to_bf16(e));
  };
  __m512 sum_v[kChains];
  for (size_t c = 0; c < kChains; ++c) sum_v[c] = _mm512_setzero_ps();
  for (size_t j = 0; j < chained; j += kChains * kLanes) {
    // Two vectors rounded by one vcvtne2ps2bf16.
    for (size_t c = 0; c < kChains; c += 2) {
      const __m512 lo = exp_at(j + c * kLanes), hi = exp_at(j + (c + 1) * kLanes);
      sum_v[c] = _mm512_add_ps(sum_v[c], lo);
      sum_v[c + 1] = _mm512_add_ps(sum_v[c + 1], hi);
      _mm512_storeu_si512(p + j + c * kLanes, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  for (size_t j = chained; j < whole; j += kLanes) {
    const __m512 e = exp_at(j);
    sum_v[0] = _mm512_add_ps(sum_v[0], e);
    store_p(j, e);
  }
  size_t zero_from = whole;
  if (rest > 0) {
    const __m512 e = _mm512_maskz_mov_ps(__mmask16((1u << rest) - 1), exp_at(whole));
    sum_v[1] = _mm512_add_ps(sum_v[1], e);
    store_p(whole, e);
    zero_from += kLanes;
  }
  if (zero_from < cols) std::memset(p + zero_from, 0, (cols - zero_from) * sizeof(uint16_t));
  for (size_t c = 1; c < kChains; ++c) sum_v[0] = _mm512_add_ps(sum_v[0], sum_v[c]);
  return sum_v[0];
}

// The online softmax step of one row (softmax_step's contract, on `keys`
// columns of which the first `valid` (>= 1) are real): P = exp(s - m')
// rounded to bf16 into p (0 where masked), l and m updated, the row of O
// rescaled.
inline void softmax_row(const float* s, size_t keys, int valid, float& m, float& l, float* o, size_t o_cols,
                        uint16_t* p) {
  const size_t count = std::min(size_t(valid), keys);
  const float m_new = std::max(m, _mm512_reduce_max_ps(row_max(s, count)));  // finite: valid >= 1
  const float sum = _mm512_reduce_add_ps(exp_row(s, count, keys, m_new, p));
  // exp(m - m'): 0 on the first tile (m = -inf), exactly 1 when the max stays.
  const float alpha = _mm512_cvtss_f32(exp2_approx(_mm512_set1_ps((m - m_new) * kLog2e)));
  l = l * alpha + sum;
  m = m_new;
  if (alpha != 1.f) {
    const __m512 alpha_v = _mm512_set1_ps(alpha);
    for (size_t j = 0; j < o_cols; j += kLanes) _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_loadu_ps(o + j), alpha_v));
  }
}

}  // namespace

void softmax_step_bf16(size_t rows, size_t keys, const int* valid, const float* s, size_t lds, float* m, float* l,
                       float* o, size_t ldo, size_t o_cols, uint16_t* p, size_t ldp) {
  for (size_t r = 0; r < rows; ++r)
    softmax_row(s + r * lds, keys, valid[r], m[r], l[r], o + r * ldo, o_cols, p + r * ldp);
}

float row_max_above_bf16(const float* s, size_t count, float bound) {
  const __m512 max_v = row_max(s, count);
  // Not <= bound: also a NaN.
  if (_mm512_cmp_ps_mask(max_v, _mm512_set1_ps(bound), _CMP_NLE_UQ) == 0) return -INFINITY;
  return _mm512_reduce_max_ps(max_v);
}

void exp_row_bf16(const float* s, size_t count, size_t cols, float m, uint16_t* p, float* sum_lanes) {
  _mm512_storeu_ps(sum_lanes, _mm512_add_ps(_mm512_loadu_ps(sum_lanes), exp_row(s, count, cols, m, p)));
}

void gemm_bf16(bool accumulate, size_t rows, size_t cols, size_t pairs, const uint16_t* a, size_t lda,
               const uint32_t* b, size_t ldb, float* c, size_t ldc) {
  // Panels of kMaxVecs vectors of columns (B's panel stays in L1 while every
  // row group of A passes over it), then groups of kMaxRows rows.
  for (size_t col = 0; col < cols; col += kMaxVecs * kLanes) {
    const size_t vecs = std::min(kMaxVecs, (cols - col) / kLanes);
    for (size_t row = 0; row < rows; row += kMaxRows) {
      micro_kernel_rows(std::min(kMaxRows, rows - row), vecs, accumulate, pairs, a + row * lda, lda, b + col, ldb,
                        c + row * ldc + col, ldc);
    }
  }
}

namespace {

// Word indices of vpermt2w that interleave the bf16 of two rows, each 32
// values of a vcvtne2ps2bf16 (indices 0..31 pick from the first row, 32..63
// from the second): lo pairs columns 0-15, hi columns 16-31.
struct PairIndices {
  __m512i lo, hi;
  PairIndices() {
    alignas(64) uint16_t lo_idx[32], hi_idx[32];
    for (uint16_t i = 0; i < 16; ++i) {
      lo_idx[2 * i] = i, lo_idx[2 * i + 1] = uint16_t(32 + i);
      hi_idx[2 * i] = uint16_t(16 + i), hi_idx[2 * i + 1] = uint16_t(48 + i);
    }
    lo = _mm512_load_si512(lo_idx);
    hi = _mm512_load_si512(hi_idx);
  }
};

// Columns j..j+31 of two rows as bf16 (odd null: zeros).
inline __m512i bf16_pair(const float* even, const float* odd, size_t j, __m512i* odd_bf16) {
  *odd_bf16 = odd ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(odd + j + kLanes), _mm512_loadu_ps(odd + j))
                  : _mm512_setzero_si512();
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(even + j + kLanes), _mm512_loadu_ps(even + j));
}

}  // namespace

void pack_bf16_pairs(size_t rows, size_t cols, const float* src, size_t lds, uint32_t* dst, size_t ldd) {
  const PairIndices idx;
  for (size_t r = 0; r < rows; r += 2) {
    const float* even = src + r * lds;
    const float* odd = r + 1 < rows ? even + lds : nullptr;  // a missing odd row packs as zeros
    uint32_t* out = dst + (r / 2) * ldd;
    for (size_t j = 0; j < cols; j += 2 * kLanes) {
      if (j + kLanes == cols) {  // a last half vector: 16 columns
        const __m512i e = _mm512_castsi256_si512(to_bf16(_mm512_loadu_ps(even + j)));
        const __m512i o = _mm512_castsi256_si512(odd ? to_bf16(_mm512_loadu_ps(odd + j)) : _mm256_setzero_si256());
        _mm512_storeu_si512(out + j, _mm512_permutex2var_epi16(e, idx.lo, o));
        break;
      }
      __m512i o;
      const __m512i e = bf16_pair(even, odd, j, &o);
      _mm512_storeu_si512(out + j, _mm512_permutex2var_epi16(e, idx.lo, o));
      _mm512_storeu_si512(out + j + kLanes, _mm512_permutex2var_epi16(e, idx.hi, o));
    }
  }
}

void pack_bf16_tiles(size_t rows, size_t cols, const float* src, size_t lds, uint32_t* dst) {
  const PairIndices idx;
  const size_t steps = (rows + 2 * kLanes - 1) / (2 * kLanes);  // tiles of 32 rows per 16 columns
  const size_t group = steps * kAmxTileWords;                   // words from one column tile to the next
  for (size_t pair = 0; pair < steps * kLanes; ++pair) {
    const size_t r = 2 * pair;
    uint32_t* row = dst + pair / kLanes * kAmxTileWords + pair % kLanes * kLanes;  // row of tile (0, pair / 16)
    for (size_t j = 0; j < cols; j += 2 * kLanes) {
      uint32_t* out = row + j / kLanes * group;
      if (r >= rows) {  // past the last row: zeros
        _mm512_storeu_si512(out, _mm512_setzero_si512());
        _mm512_storeu_si512(out + group, _mm512_setzero_si512());
        continue;
      }
      __m512i o;
      const __m512i e = bf16_pair(src + r * lds, r + 1 < rows ? src + (r + 1) * lds : nullptr, j, &o);
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(e, idx.lo, o));
      _mm512_storeu_si512(out + group, _mm512_permutex2var_epi16(e, idx.hi, o));
    }
  }
}

void round_rows_bf16(size_t rows, size_t cols, const float* src, size_t lds, uint16_t* dst, size_t ldd) {
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < cols; j += kLanes)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ldd + j), to_bf16(_mm512_loadu_ps(src + r * lds + j)));
}

}  // namespace longctx::cpu::detail
