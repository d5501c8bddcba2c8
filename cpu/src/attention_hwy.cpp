// Decode attention over the slices of one flash-decoding piece, written once
// over Highway and dispatched at run time to the best target of this CPU.
//
// For a chunk of at most kChunkTokens consecutive tokens of a block:
//  1. scores: for a tile of consecutive tokens, s[i][t] += q[i][c] * K^T[c][t]
//     over the channels c (one vector load of K^T row c serves every query
//     head of the group; f16/bf16 widened to f32 on load; q8_0: q's codes
//     times the keys' codes (quads of channels, a token's four codes one
//     32-bit lane) summed per 32 channels (exact integers), each sum
//     times its token's scale and q's; with AVX512-VNNI in
//     attention_q8_vnni.cpp, else with AVX-VNNI or AVX2 in attention_q8_x86.h);
//  2. online softmax per query head: running max m, running sum l, the
//     accumulator rescaled by exp(m_old - m_new) when the max grows;
//  3. acc[i][:] += p[i][t] * V[t][:], each V row read once for the group
//     (q8_0: codes in quads of tokens times 16-bit codes of the weights,
//     summed exactly in int32, with AVX512-VNNI in attention_q8_vnni.cpp or
//     AVX-VNNI in attention_q8_avx_vnni.cpp; else here, each code widened
//     and times its token's group scale).
// Query heads are taken kMaxGroup at a time so their accumulators stay in
// registers; with more heads than that, K/V are re-read from cache, not DRAM.
// While a slice computes, the next slice's lines are prefetched into L2 in
// address order (LinePrefetch), at the pace the kernel reads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_kernel.h"
#include "longctx/kvstore/kv_store.h"

// foreach_target.h re-includes this file once per target, looked up through
// the include directories: cpu/include/../src is this folder.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/attention_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "exp_hwy-inl.h"
#include "longctx/core/widen_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::cpu::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using cpu::HWY_NAMESPACE::ExpNonPositive;
using longctx::HWY_NAMESPACE::LoadWidened;

using DF = hn::ScalableTag<float>;
using D1 = hn::CappedTag<float, 1>;  // one lane, for tails

// Tokens scored before their softmax update and V pass (bounds the scratch).
constexpr int kChunkTokens = 128;
static_assert(kChunkTokens <= kQ8VnniChunk);

// Query heads processed together: with 2-4 vectors of accumulators each, 8
// heads fit the 32 vector registers of AVX-512, 4 heads the 16 of AVX2/SSE4.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMaxGroup = 8;
#else
constexpr int kMaxGroup = 4;
#endif

// Vectors of tokens (scores) or channels (V) per tile for G heads: enough
// independent FMA chains to hide the FMA latency, few enough for the
// registers, and each load of K or V and each broadcast serving as many
// FMAs as they allow: G x NV sums take 16 of AVX-512's 32 registers, 12 of
// AVX2's 16 for 3 or 4 heads, and 8 for one head (with 8 and 4 sums, Zen 3's
// f16 decode ran 14% and 11% slower hot). q8_0's P.V widens codes
// (AccumulateQuadTile), which needs the registers that more vectors would
// take: it keeps 4 or 2 (3 was 14% slower, 8 for one head 7%).
template <DType kType, int G>
constexpr int kTileVectors = kType == DType::kQ8_0 ? (G <= kMaxGroup / 2 ? 4 : 2)
                             : G == 1                ? 8
                             : G <= kMaxGroup / 2    ? 4
                             : kMaxGroup == 4        ? 3
                                                     : 2;

// The element type a storage dtype is loaded as.
template <DType kType>
struct Stored;
template <>
struct Stored<DType::kF32> {
  using T = float;
};
template <>
struct Stored<DType::kF16> {
  using T = hwy::float16_t;
};
template <>
struct Stored<DType::kBF16> {
  using T = uint16_t;
};
template <>
struct Stored<DType::kQ8_0> {
  using T = int8_t;  // codes; their f16 scales come beside them
};

template <DType kType, class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const typename Stored<kType>::T* p) {
  if constexpr (kType == DType::kQ8_0) {
    const hn::Rebind<int32_t, D> di32;
    return hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(hn::Rebind<int8_t, D>(), p)));
  } else {
    return LoadWidened<kType>(d, p, 0);
  }
}

// Calls fn(std::integral_constant<int, G>()) for a run-time G in [1, kMaxGroup].
template <class Fn, int... I>
HWY_INLINE void WithGroupSize(int group, Fn&& fn, std::integer_sequence<int, I...>) {
  ((group == I + 1 ? fn(std::integral_constant<int, I + 1>()) : void()), ...);
}

// The f16 scales of a q8_0 page as Highway's f16 type.
using Scales = const hwy::float16_t*;

// sum[i][u] += q_i[c] * K^T[c][t + u * lanes ...] over channels [c_begin,
// c_end) for the G query heads; k points at channel c_begin's row, token t.
template <DType kType, int G, int NV, class D>
HWY_INLINE void DotChannels(D d, const float* q, int dim, int c_begin, int c_end,
                            const typename Stored<kType>::T* k, int block_size, hn::Vec<D> (&sum)[G][NV],
                            LinePrefetch& prefetch) {
  const size_t lanes = hn::Lanes(d);
  LinePrefetch walk = prefetch;  // in registers: through the reference it was a store and a load per channel
  for (int c = c_begin; c < c_end; ++c, k += block_size) {
    prefetch_step(walk, NV * lanes * sizeof(*k));
    hn::Vec<D> key[NV];
    for (int u = 0; u < NV; ++u) key[u] = LoadF32<kType>(d, k + u * lanes);
    for (int i = 0; i < G; ++i) {
      const auto qc = hn::Set(d, q[i * dim + c]);
      for (int u = 0; u < NV; ++u) sum[i][u] = hn::MulAdd(qc, key[u], sum[i][u]);
    }
  }
  prefetch = walk;
}

// Byte kByte of each 32-bit lane of `lanes` (q8_0 codes) moved to the lane's
// top byte, the others zeroed, converted to f32: the code times 2^24, exact.
// One byte shuffle, where shifts would take two instructions on the ports
// that also convert and multiply.
template <int kByte, class D, class VI>
HWY_INLINE hn::Vec<D> CodeTimes2Pow24(D d, VI lanes) {
  const hn::Rebind<int32_t, D> di;
#if HWY_TARGET == HWY_SCALAR  // no bytes of a lane to shuffle
  const auto top = hn::And(hn::ShiftLeft<24 - 8 * kByte>(lanes), hn::Set(di, int32_t(-16777216)));  // 0xFF000000
#else
  const hn::Repartition<uint8_t, decltype(di)> du8;
  alignas(16) static constexpr uint8_t kIndex[16] = {
      0x80, 0x80, 0x80, kByte, 0x80, 0x80, 0x80, 4 + kByte, 0x80, 0x80, 0x80, 8 + kByte, 0x80, 0x80, 0x80, 12 + kByte};
  const auto top = hn::BitCast(di, hn::TableLookupBytesOr0(hn::BitCast(du8, lanes), hn::LoadDup128(du8, kIndex)));
#endif
  return hn::ConvertTo(d, top);
}

// 2^-24: what CodeTimes2Pow24's values are scaled back by.
constexpr float kCodeScale = 1.f / 16777216.f;

// Calls fn(std::integral_constant<int, B>()) for B = 0 .. kQ8KeyQuad - 1 (also
// kQ8ValueQuad): the bytes of a 32-bit lane, with shift counts known at compile time.
template <class Fn>
HWY_INLINE void ForEachByte(Fn&& fn) {
  static_assert(kvstore::kQ8KeyQuad == 4 && kvstore::kQ8ValueQuad == 4);
  fn(std::integral_constant<int, 0>()), fn(std::integral_constant<int, 1>());
  fn(std::integral_constant<int, 2>()), fn(std::integral_constant<int, 3>());
}

// DotChannels for q8_0 codes in quads of channels (kv_store.h): k points at
// token t's codes of the quad of c_begin; each token's four codes are one
// 32-bit lane, whose byte b is the code of channel c + b. c_begin and c_end
// are multiples of 4.
template <int G, int NV, class D>
HWY_INLINE void DotQuads(D d, const float* q, int dim, int c_begin, int c_end, const int8_t* k, int block_size,
                         hn::Vec<D> (&sum)[G][NV], LinePrefetch& prefetch) {
  constexpr int kQuad = kvstore::kQ8KeyQuad;
  const size_t lanes = hn::Lanes(d);
  const hn::Rebind<int32_t, D> di;
  LinePrefetch walk = prefetch;  // in registers (DotChannels)
  for (int c = c_begin; c < c_end; c += kQuad, k += size_t(block_size) * kQuad) {
    prefetch_step(walk, NV * lanes * kQuad);
    hn::Vec<decltype(di)> codes[NV];
    for (int u = 0; u < NV; ++u) codes[u] = hn::LoadU(di, reinterpret_cast<const int32_t*>(k + u * lanes * kQuad));
    ForEachByte([&](auto byte) {
      constexpr int b = decltype(byte)::value;
      for (int u = 0; u < NV; ++u) {
        const auto key = CodeTimes2Pow24<b>(d, codes[u]);
        for (int i = 0; i < G; ++i) sum[i][u] = hn::MulAdd(hn::Set(d, q[i * dim + c + b]), key, sum[i][u]);
      }
    });
  }
  prefetch = walk;
}

// scores[i * kChunkTokens + j + ...] = q_i . k_t for the G query heads (rows of
// q) and the NV vectors of tokens starting at block offset t (score index j).
// q8_0: q holds q's codes, q_scales their [G][dim / 32] scales, k_scales the
// page's [dim / 32][block_size] scales (else null).
template <DType kType, int G, int NV, class D>
HWY_INLINE void ScoreTile(D d, const float* q, const float* q_scales, int dim, const typename Stored<kType>::T* k_t,
                          Scales k_scales, int block_size, int t, float* scores, int j, LinePrefetch& prefetch) {
  const size_t lanes = hn::Lanes(d);
  hn::Vec<D> acc[G][NV];
  for (auto& head : acc)
    for (auto& a : head) a = hn::Zero(d);
  if constexpr (kType == DType::kQ8_0) {
    // Per group of 32 channels: the dot products of the codes (exact), then
    // times the tokens' scales times q's, added to the total.
    constexpr int kGroup = kvstore::kQ8Group;
    const int groups = dim / kGroup;
    for (int c0 = 0; c0 < dim; c0 += kGroup) {
      hn::Vec<D> part[G][NV];
      for (auto& head : part)
        for (auto& a : head) a = hn::Zero(d);
      DotQuads<G, NV>(d, q, dim, c0, c0 + kGroup, k_t + kvstore::q8_key_code_offset(block_size, c0, t), block_size,
                      part, prefetch);
      const Scales row = k_scales + size_t(c0 / kGroup) * size_t(block_size) + size_t(t);
      prefetch_step(prefetch, NV * lanes * sizeof(*row));
      for (int u = 0; u < NV; ++u) {
        const auto scale = LoadF32<DType::kF16>(d, row + u * lanes);
        for (int i = 0; i < G; ++i) {
          const auto q_scale = hn::Set(d, q_scales[size_t(i) * groups + size_t(c0 / kGroup)]);
          acc[i][u] = hn::MulAdd(hn::Mul(part[i][u], hn::Set(d, kCodeScale)), hn::Mul(scale, q_scale), acc[i][u]);
        }
      }
    }
  } else {
    DotChannels<kType, G, NV>(d, q, dim, 0, dim, k_t + t, block_size, acc, prefetch);
  }
  for (int i = 0; i < G; ++i)
    for (int u = 0; u < NV; ++u) hn::StoreU(acc[i][u], d, scores + i * kChunkTokens + j + u * lanes);
}

// Covers [0, n) with tiles: fn(std::integral_constant<int, NV>(), j) for
// tiles of NV vectors from j, NV = kNV, then halved while one still fits
// (a 64-channel head on an 8-vector AVX-512 tile takes one of 4, not 4 of
// 1); returns where whole vectors end.
template <int kNV, class Fn>
HWY_INLINE int ForEachTile(int n, int lanes, int j, Fn&& fn) {
  for (; j + kNV * lanes <= n; j += kNV * lanes) fn(std::integral_constant<int, kNV>(), j);
  if constexpr (kNV > 1) j = ForEachTile<kNV / 2>(n, lanes, j, fn);
  return j;
}

// Scores of G query heads for tokens [t0, t0 + n) of a block.
template <DType kType, int G>
void ScoreHeads(const float* q, const float* q_scales, int dim, const typename Stored<kType>::T* k_t,
                Scales k_scales, int block_size, int t0, int n, float* scores, LinePrefetch& prefetch) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  int j = ForEachTile<kTileVectors<kType, G>>(n, lanes, 0, [&](auto vectors, int at) {
    ScoreTile<kType, G, decltype(vectors)::value>(df, q, q_scales, dim, k_t, k_scales, block_size, t0 + at, scores,
                                                  at, prefetch);
  });
  for (; j < n; ++j) {
    ScoreTile<kType, G, 1>(D1(), q, q_scales, dim, k_t, k_scales, block_size, t0 + j, scores, j, prefetch);
  }
}

// acc[i][c + ...] += sum_j p[i][j] * V[j][c + ...] for G heads, NV vectors of
// channels (f32, f16, bf16; p rows kChunkTokens apart).
template <DType kType, int G, int NV, class D>
HWY_INLINE void AccumulateTile(D d, const float* p, int n, const typename Stored<kType>::T* v, int dim, int c,
                               float* acc, LinePrefetch& prefetch) {
  const size_t lanes = hn::Lanes(d);
  hn::Vec<D> sum[G][NV];
  for (int i = 0; i < G; ++i)
    for (int u = 0; u < NV; ++u) sum[i][u] = hn::LoadU(d, acc + i * dim + c + u * lanes);
  const auto* row = v + c;
  LinePrefetch walk = prefetch;  // in registers (DotChannels)
  for (int j = 0; j < n; ++j, row += dim) {
    prefetch_step(walk, NV * lanes * sizeof(*row));
    hn::Vec<D> value[NV];
    for (int u = 0; u < NV; ++u) value[u] = LoadF32<kType>(d, row + u * lanes);
    for (int i = 0; i < G; ++i) {
      const auto pj = hn::Set(d, p[i * kChunkTokens + j]);
      for (int u = 0; u < NV; ++u) sum[i][u] = hn::MulAdd(pj, value[u], sum[i][u]);
    }
  }
  prefetch = walk;
  for (int i = 0; i < G; ++i)
    for (int u = 0; u < NV; ++u) hn::StoreU(sum[i][u], d, acc + i * dim + c + u * lanes);
}

// Token slots of a q8_0 chunk: the lead of its first quad of tokens (< 4),
// its tokens, the rest of its last quad.
constexpr int kChunkSlots = kChunkTokens + 2 * kvstore::kQ8ValueQuad;

// AccumulateTile for q8_0 codes in quads of tokens (kv_store.h): v points at
// the codes of the chunk's first quad, and slot k of p (rows kChunkSlots
// apart) and of scales (the slots' [dim / 32] scales as f32, times 2^-24 for
// CodeTimes2Pow24) is token k of the quads: both are 0 for the slots that
// are not the chunk's tokens. Each
// channel's four codes are one 32-bit lane, whose byte b is token b's. A
// vector of lanes (which divide 32) starting at a multiple of lanes lies in
// one group.
template <int G, int NV, class D>
HWY_INLINE void AccumulateQuadTile(D d, const float* p, int quads, const int8_t* v, const float* scales, int dim,
                                   int c, float* acc, LinePrefetch& prefetch) {
  constexpr int kQuad = kvstore::kQ8ValueQuad;
  const int groups = dim / kvstore::kQ8Group;
  const size_t lanes = hn::Lanes(d);
  const hn::Rebind<int32_t, D> di;
  hn::Vec<D> sum[G][NV];
  for (int i = 0; i < G; ++i)
    for (int u = 0; u < NV; ++u) sum[i][u] = hn::LoadU(d, acc + i * dim + c + u * lanes);
  LinePrefetch walk = prefetch;  // in registers (DotChannels)
  for (int q = 0; q < quads; ++q) {
    const int8_t* row = v + (size_t(q) * dim + size_t(c)) * kQuad;
    prefetch_step(walk, NV * lanes * kQuad);
    hn::Vec<decltype(di)> codes[NV];
    for (int u = 0; u < NV; ++u) codes[u] = hn::LoadU(di, reinterpret_cast<const int32_t*>(row + u * lanes * kQuad));
    ForEachByte([&](auto byte) {
      const int k = kQuad * q + decltype(byte)::value;
      hn::Vec<D> value[NV];
      for (int u = 0; u < NV; ++u) {
        const float scale = scales[size_t(k) * groups + (c + u * int(lanes)) / kvstore::kQ8Group];
        value[u] = hn::Mul(CodeTimes2Pow24<decltype(byte)::value>(d, codes[u]), hn::Set(d, scale));
      }
      for (int i = 0; i < G; ++i) {
        const auto pk = hn::Set(d, p[i * kChunkSlots + k]);
        for (int u = 0; u < NV; ++u) sum[i][u] = hn::MulAdd(pk, value[u], sum[i][u]);
      }
    });
  }
  prefetch = walk;
  for (int i = 0; i < G; ++i)
    for (int u = 0; u < NV; ++u) hn::StoreU(sum[i][u], d, acc + i * dim + c + u * lanes);
}

// acc (G rows of dim) += p . V over n tokens; v points at the first token's
// row (q8_0: p, v and v_scales as AccumulateQuadTile takes them, n the slots).
template <DType kType, int G>
void AccumulateHeads(const float* p, int n, const typename Stored<kType>::T* v, const float* v_scales, int dim,
                     float* acc, LinePrefetch& prefetch) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  const auto tile = [&](auto d, auto vectors, int c) {
    if constexpr (kType == DType::kQ8_0) {
      AccumulateQuadTile<G, decltype(vectors)::value>(d, p, n / kvstore::kQ8ValueQuad, v, v_scales, dim, c, acc,
                                                      prefetch);
    } else {
      AccumulateTile<kType, G, decltype(vectors)::value>(d, p, n, v, dim, c, acc, prefetch);
    }
  };
  int c = ForEachTile<kTileVectors<kType, G>>(dim, lanes, 0, [&](auto vectors, int at) { tile(df, vectors, at); });
  for (; c < dim; ++c) tile(D1(), std::integral_constant<int, 1>(), c);
}

void ScaleRow(float* x, int n, float factor) {
  const DF df;
  const int lanes = static_cast<int>(hn::Lanes(df));
  const auto f = hn::Set(df, factor);
  int j = 0;
  for (; j + lanes <= n; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(df, x + j), f), df, x + j);
  for (; j < n; ++j) x[j] *= factor;
}

// Online softmax update of one query head with n new scores s (replaced in
// place by p = exp(s - m_new)). Returns exp(m_old - m_new), the factor that
// rescales what was accumulated before (0 when nothing was).
float SoftmaxUpdate(float* s, int n, float& m, float& l) {
  const DF df;
  const D1 d1;
  const int lanes = static_cast<int>(hn::Lanes(df));
  auto vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  int j = 0;
  for (; j + lanes <= n; j += lanes) vmax = hn::Max(vmax, hn::LoadU(df, s + j));
  float chunk_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; j < n; ++j) chunk_max = std::max(chunk_max, s[j]);

  const float m_new = std::max(m, chunk_max);
  // exp(0) = 1 exactly, so a chunk that leaves the max where it was (most
  // do) skips the libm call: 1.6% of q8_0 decode's samples hot.
  const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.f : m_new == m ? 1.f : std::exp(m - m_new);
  auto vsum = hn::Zero(df);
  const auto vm = hn::Set(df, m_new);
  for (j = 0; j + lanes <= n; j += lanes) {
    const auto p = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + j), vm));
    hn::StoreU(p, df, s + j);
    vsum = hn::Add(vsum, p);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  for (; j < n; ++j) {
    const auto p = ExpNonPositive(d1, hn::Sub(hn::LoadU(d1, s + j), hn::Set(d1, m_new)));
    hn::StoreU(p, d1, s + j);
    sum += hn::GetLane(p);
  }
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

template <DType kType>
void AttendPieceOf(const PieceArgs& a) {
  using T = typename Stored<kType>::T;
  // q8_0's score tile keeps a partial sum per accumulator: half the heads at
  // a time. P.V takes them all: each code widened serves every head.
  constexpr int kScoreHeads = kType == DType::kQ8_0 ? kMaxGroup / 2 : kMaxGroup;
  constexpr auto kScoreGroups = std::make_integer_sequence<int, kScoreHeads>();
  constexpr auto kGroups = std::make_integer_sequence<int, kMaxGroup>();
  const int g = a.g;
  const int dim = a.head_dim;
  const int groups = dim / kvstore::kQ8Group;
  // q8_0 on the integer kernels of attention_q8_vnni.cpp where the CPU has
  // AVX512-VNNI (this AVX-512 code only); else, in this AVX2 or AVX-512 code,
  // on those of attention_q8_avx_vnni.cpp with AVX-VNNI, or with AVX2 the
  // scores of attention_q8_avx2.cpp and P.V here; the SSE4 and scalar code
  // widens the codes to f32.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const bool use_vnni = kType == DType::kQ8_0 && has_q8_vnni_kernels();
#else
  const bool use_vnni = false;
#endif
  struct Q8Kernels {
    decltype(&score_q8_avx2) score = nullptr;
    decltype(&accumulate_q8_avx_vnni) accumulate = nullptr;
  };
  Q8Kernels q8_256;  // null where this code does not take them
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if (kType == DType::kQ8_0 && !use_vnni && has_q8_avx2_kernels()) {
    q8_256 = has_q8_avx_vnni_kernels() ? Q8Kernels{score_q8_avx_vnni, accumulate_q8_avx_vnni}
                                       : Q8Kernels{score_q8_avx2, nullptr};
  }
#endif
  const auto accumulate_q8 = use_vnni ? accumulate_q8_avx512_vnni : q8_256.accumulate;  // null: the widening code
  // q8_0 P.V on the widening code: the chunk's weights and V scales by token slot (AccumulateQuadTile).
  const bool q8_slots = kType == DType::kQ8_0 && accumulate_q8 == nullptr;
  std::vector<float> v_scales_f32(q8_slots ? size_t(kChunkSlots) * size_t(groups) : 0);
  std::vector<float> p_slots(q8_slots ? size_t(g) * kChunkSlots : 0);
  std::vector<float> scores(size_t(g) * kChunkTokens);  // scores, then p, per head
  std::vector<float> m(size_t(g), -std::numeric_limits<float>::infinity());
  std::vector<float> l(size_t(g), 0.f);
  float* acc = a.out;  // unnormalized until the end
  std::fill(acc, acc + size_t(g) * dim, 0.f);

  int64_t seen = 0;
  for (size_t s = 0; s < a.n_slices; ++s) {
    const BlockSlice& slice = a.slices[s];
    // The next slice streams into L2 while this one computes. q8_0: with its
    // scales, which follow the codes of K and of V in the page; the kernels
    // step the walk by the scale bytes they read too, so it reaches them
    // (without them, q8_0 dense decode ran 1.6x slower).
    LinePrefetch next_k, next_v;
    const BlockSlice* following = s + 1 < a.n_slices ? &a.slices[s + 1] : a.following;
    if (following != nullptr) {
      const BlockSlice& next = *following;
      const void* k_end = reinterpret_cast<const T*>(next.k_t) + size_t(dim - 1) * a.block_size + next.end;
      const void* v_end = reinterpret_cast<const T*>(next.v) + size_t(next.end) * dim;
      if constexpr (kType == DType::kQ8_0) {
        k_end = next.k_scales + size_t(groups - 1) * a.block_size + next.end;
        v_end = next.v_scales + size_t(next.end) * groups;
      }
      const size_t k_begin = kType == DType::kQ8_0 ? kvstore::q8_key_code_offset(a.block_size, 0, next.begin)
                                                   : size_t(next.begin) * sizeof(T);
      next_k = {reinterpret_cast<const char*>(next.k_t) + k_begin, static_cast<const char*>(k_end)};
      const size_t v_begin = kType == DType::kQ8_0 ? kvstore::q8_value_code_offset(dim, 0, next.begin)
                                                   : size_t(next.begin) * dim * sizeof(T);
      next_v = {reinterpret_cast<const char*>(next.v) + v_begin, static_cast<const char*>(v_end)};
    }
    const T* k_t = reinterpret_cast<const T*>(slice.k_t);
    const T* v = reinterpret_cast<const T*>(slice.v);
    const auto k_scales = reinterpret_cast<Scales>(slice.k_scales);
    const uint16_t* v_scales = slice.v_scales;
    for (int t0 = slice.begin; t0 < slice.end; t0 += kChunkTokens) {
      const int n = std::min(kChunkTokens, slice.end - t0);
      if (use_vnni) {
        for (int j = 0; j < n; j += kQ8VnniTokens) {
          const int tile = std::min(kQ8VnniTokens, n - j);
          const int8_t* k_codes =
              reinterpret_cast<const int8_t*>(k_t) + kvstore::q8_key_code_offset(a.block_size, 0, t0 + j);
          score_q8_avx512_vnni(a, k_codes, slice.k_scales + t0 + j, tile, scores.data() + j, kChunkTokens, next_k);
        }
      } else if (q8_256.score != nullptr) {
        const int8_t* k_codes =
            reinterpret_cast<const int8_t*>(k_t) + kvstore::q8_key_code_offset(a.block_size, 0, t0);
        q8_256.score(a, k_codes, slice.k_scales + t0, n, scores.data(), kChunkTokens, next_k);
      } else {
        for (int h0 = 0; h0 < g; h0 += kScoreHeads) {
          WithGroupSize(std::min(kScoreHeads, g - h0), [&](auto group) {
            ScoreHeads<kType, decltype(group)::value>(
                a.q + size_t(h0) * dim, a.q_scales ? a.q_scales + size_t(h0) * groups : nullptr, dim, k_t,
                k_scales, a.block_size, t0, n, scores.data() + size_t(h0) * kChunkTokens, next_k);
          }, kScoreGroups);
        }
      }
      for (int i = 0; i < g; ++i) {
        const float alpha = SoftmaxUpdate(scores.data() + size_t(i) * kChunkTokens, n, m[size_t(i)], l[size_t(i)]);
        if (alpha != 1.f) ScaleRow(acc + size_t(i) * dim, dim, alpha);
      }
      // q8_0: V codes in quads of tokens, from the quad that holds t0.
      const int lead = kType == DType::kQ8_0 ? t0 % kvstore::kQ8ValueQuad : 0;
      const T* v_first = kType == DType::kQ8_0
                             ? v + kvstore::q8_value_code_offset(dim, 0, t0 - lead)
                             : v + size_t(t0) * dim;
      if (accumulate_q8 != nullptr) {
        accumulate_q8(a, scores.data(), kChunkTokens, n, lead, reinterpret_cast<const int8_t*>(v_first),
                      v_scales + size_t(t0) * groups, acc, next_v);
      } else {
        const float* p = scores.data();
        int p_count = n;  // tokens, or q8_0's slots
        if constexpr (kType == DType::kQ8_0) {
          // Slot lead + j is token t0 + j; the other slots of the chunk's quads get weight and scale 0.
          p_count = (lead + n + kvstore::kQ8ValueQuad - 1) / kvstore::kQ8ValueQuad * kvstore::kQ8ValueQuad;
          std::fill(p_slots.begin(), p_slots.end(), 0.f);
          for (int i = 0; i < g; ++i)
            std::copy_n(scores.data() + size_t(i) * kChunkTokens, n, p_slots.data() + size_t(i) * kChunkSlots + lead);
          p = p_slots.data();
          // The chunk's V scales widened once, for every head, times 2^-24 (CodeTimes2Pow24).
          std::fill(v_scales_f32.begin(), v_scales_f32.end(), 0.f);
          const DF df;
          const auto* first = reinterpret_cast<Scales>(v_scales) + size_t(t0) * size_t(groups);
          float* widened = v_scales_f32.data() + size_t(lead) * size_t(groups);
          const size_t count = size_t(n) * size_t(groups), lanes = hn::Lanes(df);
          prefetch_step(next_v, count * sizeof(*first));
          size_t i = 0;
          const auto code_scale = hn::Set(df, kCodeScale);
          for (; i + lanes <= count; i += lanes)
            hn::StoreU(hn::Mul(LoadF32<DType::kF16>(df, first + i), code_scale), df, widened + i);
          for (; i < count; ++i) widened[i] = hn::GetLane(LoadF32<DType::kF16>(D1(), first + i)) * kCodeScale;
        }
        const size_t p_stride = kType == DType::kQ8_0 ? kChunkSlots : kChunkTokens;
        for (int h0 = 0; h0 < g; h0 += kMaxGroup) {
          WithGroupSize(std::min(kMaxGroup, g - h0), [&](auto group) {
            AccumulateHeads<kType, decltype(group)::value>(p + size_t(h0) * p_stride, p_count, v_first,
                                                           v_scales_f32.data(), dim, acc + size_t(h0) * dim, next_v);
          }, kGroups);
        }
      }
      seen += n;
    }
  }

  for (int i = 0; i < g; ++i) {
    if (seen == 0) {
      a.lse[i] = -std::numeric_limits<float>::infinity();  // out stays 0
      continue;
    }
    // l >= 1: the token that set the max contributes exp(0).
    ScaleRow(acc + size_t(i) * dim, dim, 1.f / l[size_t(i)]);
    a.lse[i] = m[size_t(i)] + std::log(l[size_t(i)]);
  }
}

void AttendPiece(const PieceArgs& args) {
  switch (args.kv_type) {
    case DType::kF32:
      return AttendPieceOf<DType::kF32>(args);
    case DType::kF16:
      return AttendPieceOf<DType::kF16>(args);
    case DType::kBF16:
      return AttendPieceOf<DType::kBF16>(args);
    case DType::kQ8_0:
      return AttendPieceOf<DType::kQ8_0>(args);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::cpu::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::cpu::detail {

HWY_EXPORT(AttendPiece);

void attend_piece(const PieceArgs& args) { HWY_DYNAMIC_DISPATCH(AttendPiece)(args); }

}  // namespace longctx::cpu::detail
#endif  // HWY_ONCE
