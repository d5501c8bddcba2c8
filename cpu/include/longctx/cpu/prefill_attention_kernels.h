// f32 tile kernels of prefill attention (prefill_attention_hwy.cpp), dispatched
// at run time to the best Highway target of this CPU. Internal to the CPU
// kernels: prefill attention and QUOKA's scoring GEMM (policy/src/quoka.cpp).
//
// Every matrix is row-major f32 with a leading dimension (ld*) in elements.
// Column counts and leading dimensions of the outputs must be multiples of
// kTileAlign so that whole vectors of every target cover them.
#pragma once

#include <cstddef>

namespace longctx::cpu::detail {

// Floats per 64 bytes: the widest vector (AVX-512) and a cache line.
constexpr size_t kTileAlign = 16;

// C[rows][cols] = A[rows][depth] x B[depth][cols], or C += A x B when
// `accumulate`. cols must be a multiple of kTileAlign. Each element is summed
// over depth in order 0, 1, ... whatever rows/cols are, so a row's result does
// not depend on the other rows of the call.
void gemm_f32(bool accumulate, size_t rows, size_t cols, size_t depth, const float* a, size_t lda, const float* b,
              size_t ldb, float* c, size_t ldc);

// One step of online softmax over a tile of scores, row by row. Row r holds
// `cols` scores s[r*lds + j] of which the first valid[r] (>= 1) are real keys;
// the rest are masked. With the running max m[r] and sum l[r] of the keys seen
// so far (m = -inf, l = 0 before the first tile):
//   m' = max(m, max_j s_j);  s_j <- exp(s_j - m') (0 where masked);
//   l' = l * exp(m - m') + sum_j s_j;  o[r][0..o_cols) *= exp(m - m').
// Afterwards s holds the unnormalized probabilities P of the tile.
void softmax_step(size_t rows, size_t cols, const int* valid, float* s, size_t lds, float* m, float* l, float* o,
                  size_t ldo, size_t o_cols);

}  // namespace longctx::cpu::detail
