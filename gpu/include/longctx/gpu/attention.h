// Attention kernels of the GPU side (docs/architecture.md numerical contract): chunked
// prefill attention (flash-attention style) and local-window decode
// attention, plus the conversion of f32 K/V rows into the device K/V
// buffers. Plain params structs and raw device pointers; no CUDA type leaves
// gpu/src (streams are passed as void*, a cudaStream_t; nullptr = default).
//
// Shapes are row-major and contiguous. GQA: query head h reads kv head
// h / (n_heads / n_kv_heads). Scores are q.k * scale (scale 0 = 1/sqrt(head_dim));
// every sum is fp32. Prefill runs q.k and p.v on tensor cores: q is rounded
// to kv_dtype on load, and the probabilities p = exp(score - running max), in
// [0, 1], are rounded to kv_dtype for p.v only (the row sum uses the unrounded
// p). Local-window decode keeps q and p in f32.
// Every kernel returns out (normalized) and lse = log sum exp(score) over the
// keys it saw; a row that saw no key gets out = 0, lse = -inf. No NaN.
// Supported: head_dim 64, 128, 256; kv_dtype kF16, kBF16 (one table in
// attention.cu); anything else throws Error(kInvalidArgument)
// naming the field. Device k/v buffers must be 16-byte aligned (cudaMalloc
// memory and whole-row offsets into it are). Every function validates its
// params before any CUDA call; launch failures throw Error(kInternal) with
// CUDA's message; a build without CUDA throws Error(kUnsupported).
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::gpu {

// Queries of one chunk over the keys of a layer, causal:
// query row i (absolute position q_first_pos + i) attends keys j in
// [0, min(q_first_pos + i + 1, n_kv)); rows with q_first_pos + i < 0 (or
// n_kv = 0) see no key. The query rows of one GQA group share K/V tiles.
struct PrefillAttentionParams {
  const float* q = nullptr;  // [n_q, n_heads, head_dim] f32
  const void* k = nullptr;   // [n_kv, n_kv_heads, head_dim] kv_dtype
  const void* v = nullptr;   // [n_kv, n_kv_heads, head_dim] kv_dtype
  float* out = nullptr;      // [n_q, n_heads, head_dim] f32
  float* lse = nullptr;      // [n_q, n_heads] f32; may be null (not written)
  DType kv_dtype = DType::kF16;
  int64_t n_q = 0;
  int64_t n_kv = 0;
  int64_t q_first_pos = 0;  // usually n_kv - n_q (the chunk is the last n_q keys)
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;
};
void prefill_attention(const PrefillAttentionParams& params, void* stream);

// One decode query per query head over the slots of a ring of `capacity`
// token slots; slot s holds the token at the latest position p <= last_pos
// with p % capacity == s. Attends the slots whose position is in
// [first_pos, last_pos] (first_pos >= last_pos + 1 - capacity, else
// Error(kInvalidArgument)); an empty range gives lse = -inf, out = 0.
struct LocalAttentionParams {
  const float* q = nullptr;  // [n_heads, head_dim] f32
  const void* k = nullptr;   // ring [capacity, n_kv_heads, head_dim] kv_dtype
  const void* v = nullptr;
  float* out = nullptr;      // [n_heads, head_dim] f32
  float* lse = nullptr;      // [n_heads] f32
  DType kv_dtype = DType::kF16;
  int64_t capacity = 0;
  int64_t first_pos = 0;
  int64_t last_pos = -1;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;
  // Optional device scratch (f32-aligned) for split-K: with it a long window
  // is cut into up to kLocalMaxSplits pieces run by different blocks, then
  // merged by LSE; null or too small = one block per kv head (same result up
  // to fp32 rounding). local_window_workspace_bytes() is always enough.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
void local_window_attention(const LocalAttentionParams& params, void* stream);

inline constexpr int kLocalMaxSplits = 64;
// Workspace that lets local_window_attention use every split it wants:
// partial out [kLocalMaxSplits, n_heads, head_dim] and lse [kLocalMaxSplits, n_heads] f32.
inline size_t local_window_workspace_bytes(int n_heads, int head_dim) {
  return n_heads <= 0 || head_dim <= 0 ? 0
                                       : size_t(kLocalMaxSplits) * size_t(n_heads) * (size_t(head_dim) + 1) * sizeof(float);
}

// Rounds f32 rows [n, n_kv_heads * head_dim] to kv_dtype into a buffer of
// `capacity` rows: row i goes to row (first_pos + i) % capacity (a ring), or
// to row first_pos + i when ring is false (then first_pos + n <= capacity).
// In a ring only the last `capacity` rows of src are written (the others
// would be overwritten), so each slot ends with its latest position.
struct StoreKVParams {
  const float* src = nullptr;  // [n, row_elems] f32
  void* dst = nullptr;         // [capacity, row_elems] kv_dtype
  DType kv_dtype = DType::kF16;
  int64_t n = 0;
  int64_t row_elems = 0;
  int64_t first_pos = 0;
  int64_t capacity = 0;
  bool ring = false;
};
void store_kv(const StoreKVParams& params, void* stream);

// Host-memory conveniences for tests and benchmarks: copy in, run, copy out
// (synchronous). Same params with host pointers; k/v sized n_kv (prefill) or
// capacity (local) rows. local_window_attention_host ignores
// host_params.workspace and allocates a device workspace of
// host_params.workspace_bytes bytes (0 = single pass).
void prefill_attention_host(const PrefillAttentionParams& host_params);
void local_window_attention_host(const LocalAttentionParams& host_params);
// dst: host [capacity, row_elems] kv_dtype, read and written back (rows not
// stored keep their contents).
void store_kv_host(const StoreKVParams& host_params);

}  // namespace longctx::gpu
