// The AMX kernel of prefill attention (prefill_attention_kernels.h): one key
// tile of a work item, fused. For each block of 32 rows:
//   S = Q K^T        on bf16 tiles (tdpbf16ps), into a 32-row f32 scratch
//   online softmax   on AVX-512, row by row: P rounded to bf16 into a scratch
//   O += P V         on bf16 tiles, O's f32 blocks loaded into the tiles and back
// so S and P of a block stay in L1 while both products run on the tile unit.
// Compiled with AMX and AVX512-BF16 (cpu/CMakeLists.txt); reached only through
// the run-time choice of PrefillKernel.
//
// Tiles: 0-3 hold a 32 x 32 f32 block of the output (2 x 2 tiles of 16 x 16),
// 4-5 two 16-row slices of A (16 rows x 32 bf16), 6-7 two slices of B
// (16 pairs of rows x 16 columns, each 32-bit word a bf16 pair); every tile is
// 16 rows of 64 bytes. A tdpbf16ps sums its 32 products per element in the
// hardware's fixed order, and our loops walk the depth in order, so a row's
// result depends only on its own data and the key tiling.
//
// GCC's tile intrinsics are asm statements that do not tell the compiler
// which memory they read or write: compiler_barrier() between a phase's tile
// stores and the vector code reading them (and the reverse) keeps ordinary
// loads and stores in program order around them.
#include <immintrin.h>

// GCC 12's avx512fintrin.h passes _mm512_undefined_ps() through the unmasked
// max, scalef, roundscale and extract intrinsics, which -Wmaybe-uninitialized
// reports once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "longctx/cpu/prefill_attention_kernels.h"

namespace longctx::cpu::detail {
namespace {

constexpr size_t kLanes = 16;      // f32 lanes of a zmm register; rows and f32 columns of a tile
constexpr size_t kTileDepth = 32;  // bf16 values in a 64-byte tile row

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-7 configured as 16 x 64 bytes for the scope's lifetime.
class TileScope {
 public:
  TileScope() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = kLanes;
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

inline void compiler_barrier() { asm volatile("" ::: "memory"); }

// C[32][32] = A[32][depth] x B[depth][32], or C += A x B when `accumulate`.
// A: bf16 rows, lda elements apart; B: pairs of rows as 32-bit words,
// [depth / 2][32], ldb words apart; C: f32, ldc apart. depth % 32 == 0.
inline void block_product(bool accumulate, size_t depth, const uint16_t* a, size_t lda, const uint32_t* b,
                          size_t ldb, float* c, size_t ldc) {
  const size_t c_stride = ldc * sizeof(float), a_stride = lda * sizeof(uint16_t), b_stride = ldb * sizeof(uint32_t);
  float* c1 = c + kLanes * ldc;
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    _tile_loadd(1, c + kLanes, c_stride);
    _tile_loadd(2, c1, c_stride);
    _tile_loadd(3, c1 + kLanes, c_stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (size_t k = 0; k < depth; k += kTileDepth) {
    _tile_loadd(4, a + k, a_stride);
    _tile_loadd(5, a + kLanes * lda + k, a_stride);
    const uint32_t* b_k = b + k / 2 * ldb;
    _tile_loadd(6, b_k, b_stride);
    _tile_loadd(7, b_k + kLanes, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + kLanes, c_stride);
  _tile_stored(2, c1, c_stride);
  _tile_stored(3, c1 + kLanes, c_stride);
}

// 2^t for t <= 0 (t below -150 gives 0): t = n + f with n an integer and
// |f| <= 1/2, 2^f = 1 + f c(f) with c of degree 4, its coefficients fitted
// for the smallest relative error over [-1/2, 1/2] (1.9e-7 evaluated in f32,
// 1.6 ulp), scaled by 2^n. 2^0 is exactly 1.
inline __m512 exp2_nonpositive(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-150.f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3264701701700687e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.671504609286785e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550733581185341e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022242426872253e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931470036506653e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

constexpr float kLog2e = 1.44269504088896341f;

// The online softmax step of one row (softmax_step's contract, on `keys`
// columns of which the first `valid` (>= 1) are real): P = exp(s - m')
// rounded to bf16 into p (0 where masked), l and m updated, the row of O
// rescaled. Whole vectors of real keys first, then at most one partial
// vector under a mask; the vectors past it only get P = 0.
inline void softmax_row(const float* s, size_t keys, int valid, float& m, float& l, float* o, size_t o_cols,
                        uint16_t* p) {
  const size_t whole = std::min(size_t(valid), keys) / kLanes * kLanes;  // columns of whole real vectors
  const size_t rest = std::min(size_t(valid), keys) - whole;
  const __mmask16 rest_lanes = __mmask16((1u << rest) - 1);
  __m512 max_v = _mm512_set1_ps(-INFINITY);
  for (size_t j = 0; j < whole; j += kLanes) max_v = _mm512_max_ps(max_v, _mm512_loadu_ps(s + j));
  if (rest > 0) max_v = _mm512_mask_max_ps(max_v, rest_lanes, max_v, _mm512_loadu_ps(s + whole));
  const float m_new = std::max(m, _mm512_reduce_max_ps(max_v));  // finite: valid >= 1
  // exp(s - m') = 2^((s - m') log2(e)). s - m' first: folding m' log2(e)
  // into one constant would round it, an error of up to 2^-10 at |m'| = 1e4
  // that lse keeps.
  const __m512 log2e = _mm512_set1_ps(kLog2e);
  const __m512 m_v = _mm512_set1_ps(m_new);
  __m512 sum_v = _mm512_setzero_ps();
  const auto exp_store = [&](size_t j, __m512 e) {
    sum_v = _mm512_add_ps(sum_v, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(e));
  };
  for (size_t j = 0; j < whole; j += kLanes)
    exp_store(j, exp2_nonpositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), m_v), log2e)));
  size_t zero_from = whole;
  if (rest > 0) {
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + whole), m_v), log2e);
    exp_store(whole, _mm512_maskz_mov_ps(rest_lanes, exp2_nonpositive(t)));
    zero_from += kLanes;
  }
  if (zero_from < keys) std::memset(p + zero_from, 0, (keys - zero_from) * sizeof(uint16_t));
  // exp(m - m'): 0 on the first tile (m = -inf), exactly 1 when the max stays.
  const float alpha = _mm512_cvtss_f32(exp2_nonpositive(_mm512_set1_ps((m - m_new) * kLog2e)));
  l = l * alpha + _mm512_reduce_add_ps(sum_v);
  m = m_new;
  if (alpha != 1.f) {
    const __m512 alpha_v = _mm512_set1_ps(alpha);
    for (size_t j = 0; j < o_cols; j += kLanes) _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_loadu_ps(o + j), alpha_v));
  }
}

}  // namespace

void amx_attend_key_tile(const AmxKeyTile& t) {
  const TileScope tiles;
  const size_t ld_s = t.ld_k;  // S and P of a row block are as wide as K^T's tile
  for (size_t block = t.row0 / kAmxRows * kAmxRows; block < t.rows; block += kAmxRows) {
    compiler_barrier();
    for (size_t col = 0; col < t.keys; col += 2 * kLanes)
      block_product(false, t.depth, t.q + block * t.ld_q, t.ld_q, t.k_pairs + col, t.ld_k, t.s + col, ld_s);
    compiler_barrier();
    for (size_t r = 0; r < kAmxRows; ++r) {
      const size_t row = block + r;
      uint16_t* p_row = t.p + r * ld_s;
      if (row < t.row0 || row >= t.rows) {  // no keys of this tile for it: P = 0 leaves its O as it is
        std::memset(p_row, 0, t.keys * sizeof(uint16_t));
        continue;
      }
      softmax_row(t.s + r * ld_s, t.keys, t.valid[row - t.row0], t.m[row], t.l[row], t.o + row * t.ld_o, t.ld_o,
                  p_row);
    }
    compiler_barrier();
    for (size_t col = 0; col < t.ld_o; col += 2 * kLanes)
      block_product(true, t.keys, t.p, ld_s, t.v_pairs + col, t.ld_o, t.o + block * t.ld_o + col, t.ld_o);
    compiler_barrier();
  }
}

}  // namespace longctx::cpu::detail
