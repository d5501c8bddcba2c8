// Matmul on weights kept in their GGML block type (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q4_K, Q5_K, Q6_K): y[r, o] = sum_i x[r, i] * w[o, i].
//
// The activations are quantized first, per row and per block of `block`
// values, to int8 with one f32 scale d = absmax / 127 (QuantizedActs):
// block 32 for the types of 32-value blocks (as ggml's Q8_0 / Q8_1), block
// 256 for the k-quants (as Q8_K). Each weight block is then multiplied with
// integer dot products (unsigned weight codes x signed activations, exact in
// int32) and its scales are applied in fp32:
//   Q4_0  d_w d_a sum (q - 8) a              Q4_1  d_w d_a sum q a + m_w d_a sum a
//   Q5_0  d_w d_a sum (q - 16) a             Q5_1  as Q4_1 with 5-bit q
//   Q8_0  d_w d_a sum q a (q signed)
//   Q4_K, Q5_K  d_a (d sum_j sc_j sum_{i in j} q a - dmin sum_j m_j sum_{i in j} a)
//   Q6_K  d_a d sum_g sc_g (sum_{i in g} q a - 32 sum_{i in g} a)
// so the only rounding beyond fp32 accumulation is the activations' (at most
// d_a / 2 per value).
//
// One op family, one dispatch point (DESIGN.md "Performance rules"): a
// portable generic kernel (quant_dot_generic.cpp) and per-ISA kernels beside
// it (quant_dot_x86.h compiled for AVX2, AVX-VNNI and AVX-512 VNNI), picked at
// run time by best_quant_isa(); tests run every ISA the CPU has.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/ggml_types.h"

namespace longctx::cpu {

enum class QuantIsa : uint8_t {
  kGeneric,     // portable C++
  kAvx2,        // vpmaddubsw + vpmaddwd
  kAvxVnni,     // VEX vpdpbusd on ymm
  kAvx512Vnni,  // EVEX vpdpbusd on ymm (AVX512-VL), AMD Zen 4/5 and Intel
};

const char* quant_isa_name(QuantIsa isa);
// The ISAs this CPU runs, best first; kGeneric is always last.
std::vector<QuantIsa> supported_quant_isas();
// supported_quant_isas().front().
QuantIsa best_quant_isa();

// True for the block types quant_matmul_tile() computes with.
bool is_quant_matmul_type(GgmlType type);
// The activation block for a weight type: 256 for the k-quants, 32 otherwise.
int64_t quant_act_block(GgmlType type);

// `rows` activation rows of k values quantized per block of `block` values.
struct QuantizedActs {
  int64_t rows = 0;
  int64_t k = 0;
  int64_t block = 32;          // 32 or 256
  std::vector<int8_t> q;       // [rows, k]
  std::vector<float> d;        // [rows, k / block] scales
  std::vector<float> dsum;     // block 32: [rows, k / 32] d * sum of the block's q
  std::vector<int32_t> minus_sum4;  // block 32: [rows, k / 4] minus the sums of 4 consecutive q
  std::vector<int32_t> minus_sum32;  // [rows, k / 32] minus the sums of 32 consecutive q
  std::vector<int16_t> sum16;  // block 256: [rows, k / 16] sums of 16 consecutive q
  // block 256: [rows, k / 256, 4] the block's minus_sum32 of sub-blocks (0, 2),
  // (1, 3), (4, 6), (5, 7) as int16 pairs (low, high), for pair products (vpmaddwd)
  std::vector<int32_t> minus_sum32_pairs;
};

// Quantizes x[r * ldx + i] (r < rows, i < k) into out, reusing its buffers;
// many rows are split over the cores with oneTBB.
// k must be a multiple of `block` (32 or 256): Error(kInvalidArgument)
// otherwise. A block holding NaN or Inf gets d = NaN, so the products that
// read it are NaN as they would be in f32.
void quantize_acts(const float* x, int64_t rows, int64_t k, int64_t ldx, int64_t block, QuantizedActs& out);

// How the weight rows lie in memory.
//   kRows: GGML's, row o at w + o * ggml_bytes(type, k).
//   kRows8, kRows16 (Q4_0, Q8_0, Q4_K; Q2_K, Q3_K, Q5_K, Q6_K in kRows16 only):
//     groups of G = 8 or 16 rows, group g
//     at w + G g * ggml_bytes(type, k), the same bytes rearranged by
//     pack_groups. Block b of a group is the G rows' block b field by field,
//     each field's units interleaved by row: unit i of row r of a field of
//     `unit`-byte units at field_start + G unit i + unit r, so the field
//     takes G times its bytes. Fields (unit, bytes) in GGML's order:
//       Q4_0  scale (2, 2), codes (4, 16)     Q8_0  scale (2, 2), codes (4, 32)
//       Q4_K  d (2, 2), dmin (2, 2), 6-bit scales and mins (4, 12), codes (4, 128)
//       Q5_K  as Q4_K with the fifth bits (4, 32) before the codes
//       Q6_K  low nibbles (4, 128), high bit pairs (4, 64), scales (4, 16), d (2, 2)
//       Q3_K  third bits (4, 32), 2-bit codes (4, 64), 6-bit scales (4, 12), d (2, 2)
//       Q2_K  4-bit scales and mins (4, 16), 2-bit codes (4, 64), d (2, 2), dmin (2, 2)
//     One vector load (32 bytes for 8 rows, 64 for 16) then holds the same 4
//     codes (or 8, as low and high nibbles) of G rows, so an integer dot
//     product leaves row r's sum in lane r, and the G rows' scales apply in
//     one vector op each, where row by row they cost as much as the dots
//     (the idea of llama.cpp's Q4_0 8x8 repacking, at 4-byte grain so that
//     no shuffle is needed). kRows16 fills AVX-512's 512-bit vectors: on a
//     Xeon (Emerald Rapids) 512-bit vpdpbusd did 1.7-2.3x the products per
//     second of 256-bit ones.
enum class QuantLayout : uint8_t { kRows, kRows8, kRows16 };

// Rows per group of `layout`: 8, 16, or 1 for kRows.
int64_t quant_group_rows(QuantLayout layout);
// The layout a weight of n rows of `type` is best kept in: groups where the
// type is one above, n a multiple of the group's rows and the CPU's best ISA
// has kernels for them (kRows16 on AVX-512 VNNI, else kRows8; the generic
// ISA would unpack every group first), else kRows.
QuantLayout preferred_quant_layout(GgmlType type, int64_t n);
// n rows of k values in GGML's layout rearranged into the groups of
// `layout` (kRows8 or kRows16; n a multiple of its rows, a type above: the
// caller's to check); `packed` holds as many bytes.
void pack_groups(GgmlType type, QuantLayout layout, const uint8_t* rows, int64_t n, int64_t k, uint8_t* packed);
// Row `row` of a weight in groups of `layout` copied out in GGML's layout
// into `plain` (ggml_bytes(type, k) bytes).
void unpack_group_row(GgmlType type, QuantLayout layout, const uint8_t* packed, int64_t k, int64_t row,
                      uint8_t* plain);

// y[r * ldy + o] = sum_i x[r, i] w[o, i] for r in [r_begin, r_end) and o in
// [o_begin, o_end), where the weight rows lie as `layout` says and x = acts
// (quantized with quant_act_block(type)). Runs on the calling thread;
// callers split the rows across cores. Arguments are the caller's to check:
// is_quant_matmul_type(type), k a multiple of the type's block, and o_begin
// and o_end multiples of the layout's group rows.
void quant_matmul_tile(QuantIsa isa, GgmlType type, QuantLayout layout, const uint8_t* w, const QuantizedActs& acts,
                       int64_t r_begin, int64_t r_end, int64_t o_begin, int64_t o_end, float* y, int64_t ldy);

}  // namespace longctx::cpu
