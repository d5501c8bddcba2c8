// The per-piece decode attention kernel shared by attention.cpp (planning,
// threads, merge) and attention_hwy.cpp (the Highway code). Private to cpu/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "longctx/core/dtype.h"

namespace longctx::cpu::detail {

// Consecutive tokens [begin, end) of one block page (offsets inside the block,
// end <= the block's n_filled).
struct BlockSlice {
  const std::byte* k_t = nullptr;  // the page's K^T [head_dim][block_size]
  const std::byte* v = nullptr;    // the page's V [block_size][head_dim]
  int begin = 0;
  int end = 0;
  const uint16_t* k_scales = nullptr;  // q8_0: f16 [head_dim / 32][block_size]
  const uint16_t* v_scales = nullptr;  // q8_0: f16 [block_size][head_dim / 32]
};

// Software prefetch of a byte range into L2, in address order, paced by the
// kernel's own reads: prefetch_step(p, bytes) after reading `bytes` of the
// current slice requests as many bytes of the next one. The kernel walks a
// block page down its rows (K^T rows for a score tile, V rows for a channel
// tile), a pattern that DRAM and the hardware prefetchers serve at about half
// the bandwidth of a sequential read; requested in order while this slice
// computes, the next slice's lines then come from L2. Small steps: a burst of
// hundreds of prefetches stalls the loads behind it.
struct LinePrefetch {
  const char* at = nullptr;
  const char* end = nullptr;
  size_t credit = 0;
};

namespace {  // internal linkage: each file compiled for its own ISA keeps its own copy

inline void prefetch_step(LinePrefetch& p, size_t bytes) {
  constexpr size_t kLineBytes = 64;
  // Whole lines read, none owed and all of them before the end: those lines,
  // without the credit's arithmetic (bytes is a constant where the tiles
  // inline this; hot f16 decode attention ran 8-9% faster, Zen 5).
  if (bytes % kLineBytes == 0 && p.credit == 0 && p.end - p.at >= std::ptrdiff_t(bytes)) {
    for (size_t i = 0; i < bytes / kLineBytes; ++i) __builtin_prefetch(p.at + i * kLineBytes, 0, 2);
    p.at += bytes;
    return;
  }
  p.credit += bytes;
  if (p.at >= p.end) return;
  // The lines counted first: a loop testing both bounds per line took 14% of
  // the q8_0 score kernel's samples hot.
  const size_t lines = std::min(p.credit / kLineBytes, (size_t(p.end - p.at) + kLineBytes - 1) / kLineBytes);
  for (size_t i = 0; i < lines; ++i) __builtin_prefetch(p.at + i * kLineBytes, 0, 2);
  p.credit -= lines * kLineBytes;
  p.at += lines * kLineBytes;
}

// Query heads the integer q8_0 kernels keep in registers at a time (AVX2: 4
// x (sum + partial) and the temporaries fit 16 registers; AVX512-VNNI: 4 x 4
// vectors of int32 sums).
constexpr int kQ8Heads = 4;

// Calls fn(std::integral_constant<int, G>(), h0) for the g query heads taken
// kQ8Heads at a time (G heads from h0).
template <class Fn>
void for_head_groups(int g, Fn&& fn) {
  for (int h0 = 0; h0 < g; h0 += kQ8Heads) {
    switch (g - h0) {
      case 1: fn(std::integral_constant<int, 1>(), h0); break;
      case 2: fn(std::integral_constant<int, 2>(), h0); break;
      case 3: fn(std::integral_constant<int, 3>(), h0); break;
      default: fn(std::integral_constant<int, kQ8Heads>(), h0); break;
    }
  }
}

}  // namespace

// One piece of flash-decoding work: the g query heads of one kv head over the
// tokens of `slices`, in order.
struct PieceArgs {
  // [g][head_dim], already multiplied by the scale. q8_0: the codes of q
  // quantized per 32 channels as quant_matmul.h quantizes activations
  // (q ~ code * q_scales), as floats: a group's sum of code products is then
  // an exact integer on every path, as vpdpbusd computes it.
  const float* q = nullptr;
  const int8_t* q_codes = nullptr;       // q8_0: [g][head_dim]
  const float* q_scales = nullptr;       // q8_0: [g][head_dim / 32]
  const int32_t* q_code_sums = nullptr;  // q8_0: [g][head_dim / 32] sums of the codes
  int g = 0;
  int head_dim = 0;
  int block_size = 0;
  DType kv_type = DType::kF16;
  const BlockSlice* slices = nullptr;
  size_t n_slices = 0;
  // The first slice of the piece planned after this one, or null: prefetched
  // while the last slice computes (pieces run in plan order on each thread,
  // mostly), so a piece does not start on cold memory.
  const BlockSlice* following = nullptr;
  float* out = nullptr;  // [g][head_dim]: normalized output (0 when no token)
  float* lse = nullptr;  // [g]: log-sum-exp of the scores (-inf when no token)
};

// Runs one piece on the best Highway target of this CPU (online softmax over
// the slices' tokens, fp32 accumulation). Inputs must be finite.
void attend_piece(const PieceArgs& args);

// q8_0 scores on AVX512-VNNI (attention_q8_vnni.cpp), for the AVX-512
// instantiation of attend_piece on CPUs that have it:
//   scores[i * score_stride + j] = sum over groups G of
//     float(sum_{c in G} q_code[i][c] * k_code[c][t + j]) * (k_scale[G][t + j] * q_scale[i][G])
// accumulated in that order with FMA, for the g query heads of `args` and the
// n <= kQ8VnniTokens tokens from block offset t; k_t points at token t's
// codes of the first quad of channels ([head_dim / 4][block_size][4],
// kv_store.h), k_scales at token t of group 0 (rows block_size apart).
// Both kernels step `prefetch` by the bytes they read, scales included.
constexpr int kQ8VnniTokens = 64;
constexpr int kQ8VnniGroup = 32;  // kvstore::kQ8Group (checked in attention.cpp)
constexpr int kQ8VnniQuad = 4;    // kvstore::kQ8KeyQuad and kQ8ValueQuad (checked in attention.cpp)
// The CPU has what they need (AVX512-F/BW/VL and VNNI).
bool has_q8_vnni_kernels();
void score_q8_avx512_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n,
                          float* scores, int score_stride, LinePrefetch& prefetch);

// The same scores, bit for bit, on 256-bit vectors (attention_q8_x86.h), for
// the AVX2 and AVX-512 instantiations of attend_piece on CPUs without
// AVX512-VNNI; n is any count. With AVX-VNNI (vpdpbusd), else with AVX2
// (vpmaddubsw and vpmaddwd).
bool has_q8_avx2_kernels();      // AVX2, FMA and F16C
bool has_q8_avx_vnni_kernels();  // those and AVX-VNNI
void score_q8_avx2(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                   int score_stride, LinePrefetch& prefetch);
void score_q8_avx_vnni(const PieceArgs& args, const int8_t* k_t, const uint16_t* k_scales, int n, float* scores,
                       int score_stride, LinePrefetch& prefetch);

// q8_0 P.V on AVX512-VNNI, for the same callers: for the g query heads of
// `args` and n <= kQ8VnniChunk consecutive tokens from block offset t
// (p[i * p_stride + j] is token t + j's weight; v points at the codes of the
// quad of tokens that holds t, [ceil(block_size / 4)][head_dim][4] in kv_store.h,
// and lead = t % 4; v_scales at token t's f16 scales),
//   acc[i][c] += sum_j w[i][j][G] * v_code[j][c]   (G = c / 32)
// where w = p[i * p_stride + j] * v_scale[j][G] is rounded to 16 bits against
// the largest w of (i, G) over the n tokens: w ~ code * max / 65535, the code
// products summed exactly in int32 (vpdpbusd, by the codes' high and low
// bytes), then times max / 65535 in f32. Each weight is off by at most
// max / 131070, and max <= sum of the tokens' weights, so the output moves
// by at most n / 131070 of the largest |v| relative to the softmax sum.
constexpr int kQ8VnniChunk = 128;
void accumulate_q8_avx512_vnni(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                               const uint16_t* v_scales, float* acc, LinePrefetch& prefetch);
// The same P.V, bit for bit, on AVX-VNNI (attention_q8_avx_vnni.cpp), beside
// score_q8_avx_vnni.
void accumulate_q8_avx_vnni(const PieceArgs& args, const float* p, int p_stride, int n, int lead, const int8_t* v,
                            const uint16_t* v_scales, float* acc, LinePrefetch& prefetch);

}  // namespace longctx::cpu::detail
