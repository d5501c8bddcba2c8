// Tile kernels of prefill attention. Internal to the CPU kernels: prefill
// attention and QUOKA's scoring GEMM (policy/src/quoka.cpp).
// - f32 (prefill_attention_hwy.cpp), dispatched at run time to the best
//   Highway target of this CPU;
// - bf16 (prefill_attention_bf16.cpp), AVX512-BF16 only: callers check
//   PrefillKernel support first;
// - bf16 through oneDNN (prefill_attention_onednn.cpp): AMX tiles where the
//   CPU has them, where oneDNN has a bf16 matmul (onednn_bf16_implementation);
// - AMX (prefill_attention_amx.cpp): both products and the softmax step of a
//   key tile fused, AMX tiles and AVX512-BF16 only: callers check
//   PrefillKernel support first.
//
// Every matrix is row-major f32 with a leading dimension (ld*) in elements.
// Column counts and leading dimensions of the outputs must be multiples of
// kTileAlign so that whole vectors of every target cover them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

// ---- bf16 (AVX512-BF16) ----

// C[rows][cols] = A x B, or C += A x B when `accumulate`: A is bf16 row-major
// [rows][2 * pairs] (lda elements apart), B holds pairs of consecutive rows of
// the [2 * pairs][cols] matrix as 32-bit words (bf16 of row 2k in the low
// half), [pairs][cols] (ldb words apart), as pack_bf16_pairs writes it. cols
// must be a multiple of kTileAlign. Products of bf16 pairs are exact in f32;
// each element is summed over pairs in order 0, 1, ... whatever rows/cols are.
void gemm_bf16(bool accumulate, size_t rows, size_t cols, size_t pairs, const uint16_t* a, size_t lda,
               const uint32_t* b, size_t ldb, float* c, size_t ldc);

// dst[r / 2][j] = (bf16(src[r][j]), bf16(src[r + 1][j])) for even r < rows and
// j < cols, rounded to nearest even; an odd last row pairs with zeros. cols
// must be a multiple of kTileAlign.
void pack_bf16_pairs(size_t rows, size_t cols, const float* src, size_t lds, uint32_t* dst, size_t ldd);

// softmax_step's contract on AVX-512 for the kernels whose P is bf16: rows
// [0, rows) of s (lds apart) hold `keys` scores (a multiple of kTileAlign) of
// which the first valid[r] >= 1 are real; P = exp(s - m') goes to p (ldp
// apart) rounded to bf16, 0 where masked, and l sums the f32 values; m, l and
// the rows of o are updated as softmax_step does. s is left as it was. exp is
// a polynomial within a relative 3.0e-6 of 2^(f32 argument).
void softmax_step_bf16(size_t rows, size_t keys, const int* valid, const float* s, size_t lds, float* m, float* l,
                       float* o, size_t ldo, size_t o_cols, uint16_t* p, size_t ldp);

// Its two passes over a row, for the amx kernel's chunks, without the
// horizontal sums that took a third of a 128-key row's time:
// - the largest of s[0, count) (count >= 1) where it is not <= bound, else -inf;
// - p[j] = bf16(exp(s[j] - m)) for j < count, 0 for count <= j < cols, the
//   f32 exps added lane-wise into sum_lanes[16] (s[j] - m up to 80: m need
//   not be the max).
float row_max_above_bf16(const float* s, size_t count, float bound);
void exp_row_bf16(const float* s, size_t count, size_t cols, float m, uint16_t* p, float* sum_lanes);

// 32-bit words of one AMX tile as pack_bf16_tiles lays it out (16 rows of 64 bytes).
constexpr size_t kAmxTileWords = 256;
// The same pairs as the B operand of AMX tiles, tile by tile: tile (g, k) of
// [cols / 16][ceil(rows / 32)], 1 KiB at
// dst + (g * ceil(rows / 32) + k) * kAmxTileWords, holds in its row i the pairs of rows 32k + 2i and 32k + 2i + 1 of columns
// 16g to 16g + 15, so that a tile loads 1 KiB in a row; the rows past `rows`
// are zeros. cols must be a multiple of 32.
void pack_bf16_tiles(size_t rows, size_t cols, const float* src, size_t lds, uint32_t* dst);
// dst[r][j] = bf16(src[r][j]), rounded to nearest even; cols a multiple of kTileAlign.
void round_rows_bf16(size_t rows, size_t cols, const float* src, size_t lds, uint16_t* dst, size_t ldd);

// ---- bf16 through oneDNN ----

// C[rows][cols] = A x B: A bf16 [rows][depth] (lda apart), B bf16
// [depth][cols] (ldb apart), both plain row-major, C f32. oneDNN's matmul, on
// the calling thread alone; its summation order may depend on the shapes
// (prefill_attention.cpp calls it with fixed ones). Error(kUnsupported) where
// oneDNN has no bf16 matmul.
void gemm_bf16_onednn(size_t rows, size_t cols, size_t depth, const uint16_t* a, size_t lda, const uint16_t* b,
                      size_t ldb, float* c, size_t ldc);
// The implementation oneDNN picks for a bf16 matmul here ("brg:avx512_core_amx",
// "brg:avx512_core_bf16", ...), or "" when it has none.
std::string onednn_bf16_implementation();

// ---- AMX ----

// Rows of the AMX kernel's blocks (two tiles of 16): a work item's bf16 q and
// f32 O hold its rows rounded up to this many.
constexpr size_t kAmxRows = 32;

// One key tile of a work item whose rows [row0, rows) see some of its keys.
struct AmxKeyTile {
  size_t rows = 0;         // rows of the work item
  size_t row0 = 0;         // the first row that sees a key of the tile
  size_t keys = 0;         // the tile's keys rounded up to 32: columns of S, depth of P V
  size_t depth = 0;        // depth of Q K^T: head_dim rounded up to 32
  const int* valid = nullptr;  // [rows - row0]: keys of the tile row0 + r sees, >= 1
  const uint16_t* q = nullptr;  // [rows rounded up to kAmxRows][ld_q] bf16 q * scale (0 past head_dim)
  size_t ld_q = 0;
  const uint32_t* k_tiles = nullptr;  // K^T [depth][keys] as pack_bf16_tiles writes it
  const uint32_t* v_tiles = nullptr;  // V [keys][ld_o] as pack_bf16_tiles writes it (0 or finite past the tile's keys)
  size_t ld_p = 0;                    // >= keys: p's rows are ld_p apart, s's min(128, ld_p)
  float* m = nullptr;  // [rows] reference max (see amx_attend_key_tile) and sum of the online softmax
  float* l = nullptr;
  float* o = nullptr;  // [rows rounded up to kAmxRows][ld_o] unnormalized output, ld_o % 32 == 0
  size_t ld_o = 0;
  float* s = nullptr;     // scratch [kAmxRows][ld_k]
  uint16_t* p = nullptr;  // scratch [kAmxRows][ld_k]
};

// Tiles 0-7 of the calling thread configured as 16 rows x 64 bytes (palette
// 1), the shape every AMX kernel here uses, until amx_release_tiles(). AMX
// must be usable (cpu_features().amx_bf16).
void amx_configure_tiles();
void amx_release_tiles();

// S = Q K^T, an online softmax step and O += P V for the rows [row0, rows)
// (rows before row0 untouched), a block of kAmxRows at a time. Unlike
// softmax_step, m is a reference that stays while the scores stay below m + 8
// (P = exp(s - m) <= e^8; O and l are rescaled when it rises), so m + log(l)
// is still the lse; P is rounded to bf16 after m is subtracted, l sums the
// f32 values.
void amx_attend_key_tile(const AmxKeyTile& tile);

}  // namespace longctx::cpu::detail
