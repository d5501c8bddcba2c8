// Highway kernel of block scoring (score_kernels.h): dot products of prepared
// f32 queries with the key vectors of representative records stored in
// f32/f16/bf16, or of their 16-bit codes with q8_0 records (integer products,
// then the scales), fp32 accumulation. Each key vector is loaded once for up to
// four queries; the hot case (one query: sums over the GQA group folded into
// it) keeps four accumulators so the FMA latency does not bind. The records
// kScorePrefetchBytes ahead, in this run or the caller's next, are prefetched
// into L2 while a record computes.
#include <algorithm>
#include <limits>

#include "score_kernels.h"

// foreach_target.h re-includes this file once per target; the path is looked
// up through the include directories (cpu/include/../src is this folder).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/score_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "longctx/core/widen_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace longctx::cpu::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using longctx::HWY_NAMESPACE::LoadWidened;

using DF32 = hn::ScalableTag<float>;
using VF32 = hn::Vec<DF32>;

constexpr int kMaxQueriesPerPass = 4;
constexpr size_t kMaxSlotLen = 2 * 512;  // QUEST's pair at the largest head_dim a KVStore takes

// dots[q] = dot(queries + q * len, key) for kQ queries, len elements. Each
// query keeps kChains sums, so that 2-4 queries, or the one query of the hot
// case, have 4 FMA chains in flight: with 2, a record's dot product waited
// on the FMA latency (a 256-element QUEST record took about 74 cycles on
// Zen 3, about the latency of 16 dependent FMAs).
template <DType kT, int kQ>
HWY_INLINE void Dots(const float* queries, const std::byte* key, size_t len, float* dots) {
  constexpr int kChains = kQ == 1 ? 4 : 2;
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  VF32 sum[kQ][kChains];
  for (auto& chains : sum)
    for (auto& s : chains) s = hn::Zero(df);
  size_t i = 0;
  for (; i + kChains * lanes <= len; i += kChains * lanes) {
    VF32 k[kChains];
    for (int c = 0; c < kChains; ++c) k[c] = LoadWidened<kT>(df, key, i + c * lanes);
    for (int q = 0; q < kQ; ++q)
      for (int c = 0; c < kChains; ++c)
        sum[q][c] = hn::MulAdd(hn::LoadU(df, queries + q * len + i + c * lanes), k[c], sum[q][c]);
  }
  // Fewer than kChains vectors left, into chain 0: a chain picked at run
  // time kept every sum in memory (stored and reloaded around each record).
  for (; i + lanes <= len; i += lanes) {
    const VF32 k0 = LoadWidened<kT>(df, key, i);
    for (int q = 0; q < kQ; ++q) sum[q][0] = hn::MulAdd(hn::LoadU(df, queries + q * len + i), k0, sum[q][0]);
  }
  for (int q = 0; q < kQ; ++q) {
    VF32 total = sum[q][0];
    for (int c = 1; c < kChains; ++c) total = hn::Add(total, sum[q][c]);
    dots[q] = hn::GetLane(hn::SumOfLanes(df, total));
  }
  // Lengths are multiples of 8; a tail exists only where vectors are wider.
  for (; i < len; ++i) {
    const float k = load_as_f32(key, kT, i);
    for (int q = 0; q < kQ; ++q) dots[q] += queries[q * len + i] * k;
  }
}

// The products of a slot's q8_0 scales (f16 bits) and each query's:
// scale[q][g] for groups g. Whole vectors then one at a time (no load past
// the last), so that each group's is a broadcast from memory, a load: a
// product taken in the group loop took a multiply and a broadcast there.
template <int kQ>
HWY_INLINE void ScaleProducts(const std::byte* scales, const float* query_scales, size_t groups,
                              float (*scale)[kMaxSlotLen / 32]) {
  const hn::CappedTag<float, 8> d8;
  const hn::CappedTag<float, 1> d1;
  size_t g = 0;
  for (; g + hn::Lanes(d8) <= groups; g += hn::Lanes(d8)) {
    const auto key = LoadWidened<DType::kF16>(d8, scales, g);
    for (int q = 0; q < kQ; ++q)
      hn::StoreU(hn::Mul(key, hn::LoadU(d8, query_scales + q * groups + g)), d8, scale[q] + g);
  }
  for (; g < groups; ++g) {
    const auto key = LoadWidened<DType::kF16>(d1, scales, g);
    for (int q = 0; q < kQ; ++q) scale[q][g] = hn::GetLane(hn::Mul(key, hn::LoadU(d1, query_scales + q * groups + g)));
  }
}

// The same for a q8_0 key, in integers: the query comes as 16-bit codes with
// an f32 scale per 32 (ScoreRun), and vpmaddwd (ReorderWidenMulAccumulate)
// adds pairs of code products exactly into 32 bits; each lane's integer sum
// over a group is then converted and times the group's two scales, summed
// per lane in fp32, in kChains sums per query as in Dots (groups take turns).
// Against widening every code to f32 (per 16 codes a conversion of 8 bits to
// 32, one to float and an FMA, then the group's scale) it takes half the
// vector operations: a QUEST record of head_dim 128 in L2 took 9-11 ns
// instead of 12-14 on Zen 4 (AVX-512 and AVX2 alike), 18 instead of 34 on SSE4.
template <int kQ>
HWY_INLINE void DotsQ8(const int16_t* query_codes, const float* query_scales, const int8_t* codes,
                       const std::byte* scales, size_t len, float* dots) {
  constexpr int kChains = kQ == 1 ? 4 : 2;
  const hn::CappedTag<int16_t, 32> d16;  // lanes divide the 32 of a group
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Rebind<float, decltype(d32)> df;
  const size_t lanes = hn::Lanes(d16);
  using VF = hn::Vec<decltype(df)>;
  using VI = hn::Vec<decltype(d32)>;
  VF acc[kQ][kChains];
  for (auto& chains : acc)
    for (auto& a : chains) a = hn::Zero(df);
  const size_t groups = len / 32;
  float scale[kQ][kMaxSlotLen / 32];
  ScaleProducts<kQ>(scales, query_scales, groups, scale);
  // Group g's products into chain c of each query.
  const auto add_group = [&](size_t g, int c) HWY_ATTR {
    VI sum[kQ], unused[kQ];
    for (int q = 0; q < kQ; ++q) sum[q] = unused[q] = hn::Zero(d32);
    const int8_t* group_codes = codes + 32 * g;
    const int16_t* group_queries = query_codes + 32 * g;
    for (size_t i = 0; i < 32; i += lanes) {  // a constant trip count: unrolled
      const auto k = hn::PromoteTo(d16, hn::LoadU(d8, group_codes + i));
      for (int q = 0; q < kQ; ++q) {
        const auto query = hn::LoadU(d16, group_queries + q * len + i);
        sum[q] = hn::ReorderWidenMulAccumulate(d32, k, query, sum[q], unused[q]);
      }
    }
    for (int q = 0; q < kQ; ++q) {
      const VF products = hn::ConvertTo(df, hn::RearrangeToOddPlusEven(sum[q], unused[q]));
      acc[q][c] = hn::MulAdd(products, hn::Set(df, scale[q][g]), acc[q][c]);
    }
  };
  size_t g = 0;
  for (; g + kChains <= groups; g += kChains)
    for (int c = 0; c < kChains; ++c) add_group(g + c, c);
  for (; g < groups; ++g) add_group(g, 0);
  for (int q = 0; q < kQ; ++q) {
    VF total = acc[q][0];
    for (int c = 1; c < kChains; ++c) total = hn::Add(total, acc[q][c]);
    dots[q] = hn::GetLane(hn::SumOfLanes(df, total));
  }
}

// Slot `slot` of a record: dots[q] for the kQ queries from query q0.
template <DType kT, int kQ>
HWY_INLINE void SlotDots(const ScoreRun& run, int q0, const std::byte* record, int slot, float* dots) {
  const size_t len = size_t(run.slot_len);
  if constexpr (kT == DType::kQ8_0) {
    DotsQ8<kQ>(run.query_codes + size_t(q0) * len, run.query_scales + size_t(q0) * len / 32,
               reinterpret_cast<const int8_t*>(record) + size_t(slot) * len,
               record + run.scales_offset + size_t(slot) * len / 16, len, dots);
  } else {
    // The element size as a constant: dtype_size is a call, made for every record.
    constexpr size_t kElementBytes = kT == DType::kF32 ? 4 : 2;
    Dots<kT, kQ>(run.queries + size_t(q0) * len, record + size_t(slot) * len * kElementBytes, len, dots);
  }
}

template <DType kT>
HWY_INLINE void DotsOfPass(const ScoreRun& run, int n_queries, int q0, const std::byte* record, int slot,
                           float* dots) {
  switch (n_queries) {
    case 1: return SlotDots<kT, 1>(run, q0, record, slot, dots);
    case 2: return SlotDots<kT, 2>(run, q0, record, slot, dots);
    case 3: return SlotDots<kT, 3>(run, q0, record, slot, dots);
    default: return SlotDots<kT, 4>(run, q0, record, slot, dots);
  }
}

// Requests record r + ahead (in this run or the next one) into L2.
HWY_INLINE void PrefetchAhead(const ScoreRun& run, int64_t r, int64_t ahead) {
  const int64_t target = r + ahead;
  const std::byte* record = nullptr;
  if (target < run.n_records) {
    record = run.first_record + size_t(target) * run.record_bytes;
  } else if (target - run.n_records < run.next_n_records) {
    record = run.next_first_record + size_t(target - run.n_records) * run.record_bytes;
  }
  if (record == nullptr) return;
  for (size_t b = 0; b < run.record_bytes; b += 64) __builtin_prefetch(record + b, 0, 2);
}

template <DType kT>
void ScoreRecordsOf(const ScoreRun& run) {
  const bool slot_max = run.slot_reduce == Reduce::kMax;
  const bool query_max = run.query_reduce == Reduce::kMax;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t ahead = std::max<int64_t>(1, int64_t(kScorePrefetchBytes / run.record_bytes));
  if (run.n_queries == 1 && run.n_slots == 1) {  // the hot case: a record's score is one dot product
    for (int64_t r = 0; r < run.n_records; ++r) {
      PrefetchAhead(run, r, ahead);
      SlotDots<kT, 1>(run, 0, run.first_record + size_t(r) * run.record_bytes, 0, run.out + r);
    }
    return;
  }
  for (int64_t r = 0; r < run.n_records; ++r) {
    const std::byte* record = run.first_record + size_t(r) * run.record_bytes;
    PrefetchAhead(run, r, ahead);
    float total = query_max ? kNegInf : 0.f;
    for (int q0 = 0; q0 < run.n_queries; q0 += kMaxQueriesPerPass) {
      const int pass = std::min(kMaxQueriesPerPass, run.n_queries - q0);
      float per_query[kMaxQueriesPerPass];
      DotsOfPass<kT>(run, pass, q0, record, 0, per_query);
      for (int s = 1; s < run.n_slots; ++s) {
        float dots[kMaxQueriesPerPass];
        DotsOfPass<kT>(run, pass, q0, record, s, dots);
        for (int q = 0; q < pass; ++q) per_query[q] = slot_max ? std::max(per_query[q], dots[q]) : per_query[q] + dots[q];
      }
      for (int q = 0; q < pass; ++q) {
        const float score = slot_max ? per_query[q] : per_query[q] / float(run.n_slots);
        total = query_max ? std::max(total, score) : total + score;
      }
    }
    run.out[r] = total;
  }
}

void ScoreRecords(const ScoreRun& run) {
  switch (run.rep_dtype) {
    case DType::kF32: return ScoreRecordsOf<DType::kF32>(run);
    case DType::kF16: return ScoreRecordsOf<DType::kF16>(run);
    case DType::kBF16: return ScoreRecordsOf<DType::kBF16>(run);
    case DType::kQ8_0: return ScoreRecordsOf<DType::kQ8_0>(run);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace longctx::cpu::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace longctx::cpu::detail {

HWY_EXPORT(ScoreRecords);

void score_records(const ScoreRun& run) { HWY_DYNAMIC_DISPATCH(ScoreRecords)(run); }

}  // namespace longctx::cpu::detail
#endif  // HWY_ONCE
