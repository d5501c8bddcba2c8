// The per-ISA kernels of quant_matmul.h behind its one dispatch point
// (quant_matmul.cpp): each computes up to kQuantMaxRows activation rows
// against one weight row, so the weight row is read and unpacked once for
// all of them.
#pragma once

#include <cstdint>

#include "longctx/core/ggml_types.h"

namespace longctx::cpu::detail {

constexpr int kQuantMaxRows = 4;
// Group kernels (QuantGroupFn) take up to this many activation rows.
constexpr int kQuantGroupMaxRows = 8;

// A decode step finds the weights in DRAM. With the hardware prefetchers
// alone the GEMV kernels read them at 0.4-0.7 of the read bandwidth (Xeon
// EMR, 2 cores): their loads came too late. Each kernel (these and
// cpu_backend_gemv_hwy.cpp) requests the lines this many bytes ahead of
// its reads, and they arrive in time (0.7-1.0 of it).
constexpr int kWeightPrefetchAhead = 2048;
// The group kernels (kRows8, kRows16) request a whole block of 8 or 16 rows
// (1-3.5 KB) at once. Into L1 at 2048 bytes ahead, a Zen 4 read kRows16 weights
// at 13-18 GB/s of its 32 on one activation row (Q3_K to Q6_K; Q4_0 and Q8_0
// 28-30); into L2 at 4096 bytes ahead, at 22-31 (2 cores, medians of three).
constexpr int kGroupPrefetchAhead = 4096;

// Activations quantized per block of `block` values (32 or 256; Highway,
// quant_acts_hwy.cpp): d[b] = absmax / 127 and q = the nearest integer (ties
// to even) of x * (127 / absmax), 0 where absmax is 0 or below the smallest
// normal f32; a block holding NaN or Inf gets d = NaN and q = 0.
void quantize_act_blocks(const float* x, int64_t n_blocks, int64_t block, int8_t* q, float* d);
// The same in 16-bit codes: d[b] = absmax / 32767, each value within half of
// d (2^-16 of absmax). Block scoring of a q8_0 store codes its query so
// (score_kernels.h): 8-bit codes would break QUEST's bound.
void quantize_act_blocks(const float* x, int64_t n_blocks, int64_t block, int16_t* q, float* d);

// QuantizedActs as plain pointers. The ISA files see only this: a member
// function or std::vector instantiated there would be compiled with that
// ISA's flags and could be the copy the linker keeps for everyone.
struct ActRows {
  const int8_t* q;       // [rows, k]
  const float* d;        // [rows, k / block]
  const float* dsum;     // block 32: [rows, k / 32]
  const int32_t* minus_sum4;  // block 32: [rows, k / 4]
  const int32_t* minus_sum32;  // [rows, k / 32]
  const int16_t* sum16;  // block 256: [rows, k / 16]
  const int32_t* minus_sum32_pairs;  // block 256: [rows, k / 256, 4]
  int64_t k;
  int64_t block;
};

// y[j * ldy] = dot(weight row w_row, activation row r0 + j) for j < n_rows
// (1..kQuantMaxRows); the row has k = acts.k values.
using QuantRowsFn = void (*)(const uint8_t* w_row, const ActRows& acts, int64_t r0, int n_rows, float* y,
                             int64_t ldy);

// y[j * ldy + i] = dot(weight row i of the group at `group` (kRows8 or
// kRows16), activation row r0 + j) for i < the group's rows and j < n_rows
// (1..kQuantGroupMaxRows).
using QuantGroupFn = void (*)(const uint8_t* group, const ActRows& acts, int64_t r0, int n_rows, float* y,
                              int64_t ldy);

// The kernel of `type` for each ISA, or null for a type the ISA lacks.
QuantRowsFn quant_rows_generic(GgmlType type);
QuantRowsFn quant_rows_avx2(GgmlType type);
QuantRowsFn quant_rows_avx_vnni(GgmlType type);
QuantRowsFn quant_rows_avx512_vnni(GgmlType type);
// The group kernel of `type` (a type quant_matmul.h lists for groups) for
// each SIMD ISA and group size, or null.
QuantGroupFn quant_rows8_avx2(GgmlType type);
QuantGroupFn quant_rows8_avx_vnni(GgmlType type);
QuantGroupFn quant_rows8_avx512_vnni(GgmlType type);
QuantGroupFn quant_rows16_avx512_vnni(GgmlType type);

}  // namespace longctx::cpu::detail
