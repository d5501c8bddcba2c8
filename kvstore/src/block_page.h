// Block pages (private to the KV store): writing a segment of tokens into a
// page and what a q8_0 store can hold. The layout is in kv_store.h; reading a
// page back (read_keys_t, read_values) is public there.
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/dtype.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::kvstore::detail {

// Tokens [offset, offset + count) of a block page in a float kv_type: K rows
// (k_stride bytes apart, k_dtype) converted into `keys` [count][head_dim] (the
// segment's keys as stored, for the representatives) and transposed into the
// page's K^T (through `k_t_scratch`, count * head_dim elements), V rows
// converted into the page.
void write_segment(const StoreLayout& L, const std::byte* k_src, int64_t k_stride, DType k_dtype,
                   const std::byte* v_src, int64_t v_stride, DType v_dtype, std::byte* page, int offset, int count,
                   std::byte* keys, std::byte* k_t_scratch);

// The same for q8_0: rows staged in f32 (`rows` [count][head_dim]) and
// quantized per group of 32 channels into the page's codes and scales; the
// dequantized keys go to `keys` [count][head_dim] f32.
void write_q8_segment(const StoreLayout& L, const std::byte* k_src, int64_t k_stride, DType k_dtype,
                      const std::byte* v_src, int64_t v_stride, DType v_dtype, std::byte* page, int offset, int count,
                      float* rows, float* keys);

// ---- q8_0 (kv_store.h): int8 codes, one f16 scale per 32 channels ----

// The f16 scale of a group whose largest magnitude is amax.
inline uint16_t q8_scale_bits(float amax) { return f32_to_f16_bits(amax / 127.f); }

// Whether that scale is finite, so that a q8_0 store can hold the group.
inline bool q8_scale_fits(float amax) { return (q8_scale_bits(amax) & 0x7FFF) < 0x7C00; }

// Quantizes n_groups groups of 32 finite values (x, back to back) as a q8_0
// store does (kv_store.h): codes [n_groups][32], scales [n_groups] as f16
// bits, and deq [n_groups][32] (when not null) the stored values q * s.
// Vectorized (q8_quant_hwy.cpp).
void quantize_q8_groups(const float* x, size_t n_groups, int8_t* codes, uint16_t* scales, float* deq);

// Whether a q8_0 store can hold a row of head_dim values: all finite, and no
// group's scale overflows f16 (q8_quant_hwy.cpp).
bool q8_row_storable(const float* row, int head_dim);

// Keys of a q8_0 page as f32, one group of 32 channels [c0, c0 + 32) at a
// time: dst[c * ld + i] = the code of channel c, token t + i, times scales[i]
// (the group's f16 scale of that token, as f32), for i < n (q8_quant_hwy.cpp).
void dequantize_q8_keys_t(const int8_t* codes, const float* scales, int block_size, int t, int n, int c0, float* dst,
                          size_t ld);

// The first channel of a row (head_dim values) that a q8_0 store cannot hold
// (not finite, or in a group whose scale overflows f16), or -1.
int q8_unstorable_channel(const float* row, int head_dim);

// What an f32, f16 or bf16 store holds of a `source` element (f32, f16,
// bf16): the largest bit pattern, sign cleared, whose value it keeps finite
// (the limit of first_magnitude_above, dtype.h). Every finite one when the
// store's type is at least as wide; in an f16 store what does not round to
// Inf (|x| < 65520, the tie that does, to the even Inf); in a bf16 store
// from f32, below the tie 0x7f7f8000.
uint32_t storable_bits(DType source, DType kv_type);

}  // namespace longctx::kvstore::detail
