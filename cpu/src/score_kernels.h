// The vector kernel behind score_blocks (private to cpu/): scores a run of
// consecutive representative records against prepared query vectors.
// score.cpp prepares the queries and splits the work; score_hwy.cpp holds the
// Highway kernel, dispatched at run time to the best target of the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/tensor.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::cpu::detail {

// Every record holds n_slots vectors of slot_len elements (rep_dtype = kv_type) at its
// start, slot j at element j * slot_len (q8_0: codes at byte j * slot_len,
// their f16 scales, one per 32, at byte scales_offset + j * slot_len / 16). For each record:
//   score_q = slot_reduce over j of dot(queries[q], slot j)   (max or mean)
//   out     = query_reduce over q of score_q                  (sum or max)
// with fp32 accumulation. QUEST's max|min pair is one slot of 2*head_dim.
// q8_0 records are scored in integers: each query comes as 16-bit codes with
// an f32 scale per 32 elements (quantize_act_blocks, quant_dot.h), each group's
// products of codes are summed exactly, then times both scales.
struct ScoreRun {
  DType rep_dtype = DType::kF16;
  const float* queries = nullptr;  // [n_queries][slot_len]; f32/f16/bf16 records
  const int16_t* query_codes = nullptr;  // [n_queries][slot_len]; q8_0 records
  const float* query_scales = nullptr;   // [n_queries][slot_len / 32]; q8_0 records
  int n_queries = 0;
  int slot_len = 0;
  int n_slots = 0;  // valid slots of every record of the run (>= 1)
  Reduce slot_reduce = Reduce::kMax;
  Reduce query_reduce = Reduce::kSum;
  size_t scales_offset = 0;  // q8_0: bytes from a record's start to its scales
  const std::byte* first_record = nullptr;
  size_t record_bytes = 0;  // stride between consecutive records
  int64_t n_records = 0;
  float* out = nullptr;  // [n_records]
  // The records the caller scores next (the next rep page of its piece), or
  // none: the kernel prefetches ahead of its reads across into them.
  const std::byte* next_first_record = nullptr;
  int64_t next_n_records = 0;
};

// How far ahead of its reads the kernel prefetches. Without it a 2-core
// Xeon read the records at about half its bandwidth: each rep page (64 KiB)
// is a new stream that the hardware prefetchers pick up late.
constexpr size_t kScorePrefetchBytes = 8192;

void score_records(const ScoreRun& run);

}  // namespace longctx::cpu::detail
