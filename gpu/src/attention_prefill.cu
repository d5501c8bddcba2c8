// Chunked causal prefill attention, flash-attention style, on tensor cores
// through nvcuda::wmma (16x16x16 f16/bf16 fragments, fp32 accumulators).
//
// Work split: one block per (tile of kRows query rows, kv head). A "row" is
// one (query, query head) pair of the kv head's GQA group, numbered
// flat = i * group + g (query i, head kv_head * group + g), so the group's
// heads share every K/V tile the block loads. Each of the kWarps warps owns
// 16 consecutive rows. Per tile of kKeys keys:
//   1. all threads load K and V (kv_dtype) into shared memory, zero past the
//      last key the block needs;
//   2. each warp computes its 16 x kKeys scores S = Q K^T (fp32) on tensor
//      cores into shared memory;
//   3. each warp runs the online softmax of its rows: masked scores -> -inf,
//      new running max m, alpha = exp(m_old - m), p = exp(s - m) in [0, 1];
//      d = d * alpha + sum(p) with the unrounded p; p rounded to kv_dtype
//      into shared memory for the tensor cores;
//   4. each warp rescales its output accumulators by alpha and adds P V.
// The output accumulators stay in registers. wmma does not say which row an
// accumulator element belongs to, so a fragment loaded from a 16x16 matrix
// holding its own row indices (row_of) tells each element its row.
#include <mma.h>

#include <algorithm>

#include "attention_common.cuh"
#include "cuda_check.h"

namespace longctx::gpu::detail {
namespace {

namespace wmma = nvcuda::wmma;

constexpr size_t align128(size_t bytes) { return (bytes + 127) / 128 * 128; }

// Tile sizes and the shared-memory layout per head_dim. Leading dimensions
// are padded (8 halves, 4 floats): rows stay 32-byte aligned for wmma and
// consecutive rows start in different banks.
template <int D>
struct PrefillTraits {
  static_assert(D % 16 == 0 && D >= 64 && D <= 256, "head_dim must be 64, 128 or 256");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;         // (query, head) rows per block
  static constexpr int kKeys = D == 256 ? 32 : 64;  // keys per tile (d=256: smaller, to fit shared memory)
  static constexpr int kLdQKV = D + 8;              // Q, K, V tiles: 16-bit elements per smem row
  static constexpr int kLdS = kKeys + 4;            // S tile: floats per smem row
  static constexpr int kLdP = kKeys + 8;            // P tile: 16-bit elements per smem row

  static constexpr size_t kQBytes = align128(size_t(kRows) * kLdQKV * 2);
  static constexpr size_t kKBytes = align128(size_t(kKeys) * kLdQKV * 2);
  static constexpr size_t kSBytes = align128(size_t(kRows) * kLdS * 4);
  static constexpr size_t kPBytes = align128(size_t(kRows) * kLdP * 2);
  static constexpr size_t kRowBytes = align128(size_t(kRows) * 4);  // one float per row

  static constexpr size_t kQOffset = 0;
  static constexpr size_t kKOffset = kQOffset + kQBytes;
  static constexpr size_t kVOffset = kKOffset + kKBytes;
  static constexpr size_t kSOffset = kVOffset + kKBytes;
  static constexpr size_t kPOffset = kSOffset + kSBytes;
  static constexpr size_t kMOffset = kPOffset + kPBytes;       // running max per row
  static constexpr size_t kDOffset = kMOffset + kRowBytes;     // running sum per row
  static constexpr size_t kAOffset = kDOffset + kRowBytes;     // alpha of the current tile per row
  static constexpr size_t kMapOffset = kAOffset + kRowBytes;   // 16x16 row-index matrix
  static constexpr size_t kSmemBytes = kMapOffset + align128(16 * 16 * 4);
};

template <typename T, int D>
__global__ void __launch_bounds__(PrefillTraits<D>::kThreads)
    prefill_kernel(PrefillAttentionParams p, int group, float scale) {
  using Tr = PrefillTraits<D>;
  constexpr int kLd = Tr::kLdQKV;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem + Tr::kQOffset);
  T* sk = reinterpret_cast<T*>(smem + Tr::kKOffset);
  T* sv = reinterpret_cast<T*>(smem + Tr::kVOffset);
  float* ss = reinterpret_cast<float*>(smem + Tr::kSOffset);
  T* sp = reinterpret_cast<T*>(smem + Tr::kPOffset);
  float* row_m = reinterpret_cast<float*>(smem + Tr::kMOffset);
  float* row_d = reinterpret_cast<float*>(smem + Tr::kDOffset);
  float* row_alpha = reinterpret_cast<float*>(smem + Tr::kAOffset);
  float* row_map = reinterpret_cast<float*>(smem + Tr::kMapOffset);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv_head = blockIdx.y;
  const int64_t n_rows = p.n_q * group;
  // The last tiles hold the latest queries, which see the most keys: run them first.
  const int64_t row0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * Tr::kRows;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);

  // Row r of the tile -> (query i, head h); its q/out row is (i * n_heads + h).
  auto query_of = [&](int r) { return (row0 + r) / group; };
  auto head_of = [&](int r) { return kv_head * group + int((row0 + r) % group); };

  // Q tile, rounded to T (rows past n_rows are zero and never written out).
  for (int e = threadIdx.x; e < Tr::kRows * D; e += Tr::kThreads) {
    const int r = e / D, c = e % D;
    float x = 0.f;
    if (row0 + r < n_rows) x = p.q[(size_t(query_of(r)) * p.n_heads + head_of(r)) * D + c];
    sq[r * kLd + c] = from_f32<T>(x);
  }
  for (int r = threadIdx.x; r < Tr::kRows; r += Tr::kThreads) row_m[r] = -INFINITY, row_d[r] = 0.f;
  for (int e = threadIdx.x; e < 256; e += Tr::kThreads) row_map[e] = float(e / 16);
  __syncthreads();

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> row_of;  // row (0..15) of each element
  wmma::load_matrix_sync(row_of, row_map, 16, wmma::mem_row_major);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[D / 16];  // this warp's 16 x D output, unnormalized
#pragma unroll
  for (int f = 0; f < D / 16; ++f) wmma::fill_fragment(o[f], 0.f);

  // Keys any row of the block may see: [0, key_end). The block's last row is
  // its latest query (rows are ordered by query).
  const int64_t last_query = (std::min(n_rows, row0 + Tr::kRows) - 1) / group;
  const int64_t key_end = std::max<int64_t>(0, std::min(p.q_first_pos + last_query + 1, p.n_kv));

  const T* q_warp = sq + warp * 16 * kLd;
  float* s_warp = ss + warp * 16 * Tr::kLdS;
  T* p_warp = sp + warp * 16 * Tr::kLdP;

  for (int64_t k0 = 0; k0 < key_end; k0 += Tr::kKeys) {
    // 1. K and V tiles, 8 elements (16 bytes) per load; key k0 + r, channels c..c+7.
    constexpr int kVecsPerRow = D / 8;
    for (int e = threadIdx.x; e < Tr::kKeys * kVecsPerRow; e += Tr::kThreads) {
      const int r = e / kVecsPerRow, c = (e % kVecsPerRow) * 8;
      uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
      if (k0 + r < key_end) {
        const size_t at = (size_t(k0 + r) * p.n_kv_heads + kv_head) * D + c;
        kx = *reinterpret_cast<const uint4*>(k + at);
        vx = *reinterpret_cast<const uint4*>(v + at);
      }
      *reinterpret_cast<uint4*>(sk + r * kLd + c) = kx;
      *reinterpret_cast<uint4*>(sv + r * kLd + c) = vx;
    }
    __syncthreads();

    // 2. S[16 x kKeys] = Q_warp K^T. K^T as a col-major B operand is K's rows as stored.
#pragma unroll
    for (int n = 0; n < Tr::kKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_warp + kk * 16, kLd);
        wmma::load_matrix_sync(b, sk + n * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(s_warp + n * 16, acc, Tr::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // 3. Online softmax, one row at a time; lane handles keys lane, lane + 32, ...
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr;
      // Keys this row sees: [0, limit); 0 for padding rows.
      int64_t limit = 0;
      if (row0 + r < n_rows) limit = std::max<int64_t>(0, std::min(p.q_first_pos + query_of(r) + 1, p.n_kv));
      float s[Tr::kKeys / 32];
      float tile_max = -INFINITY;
#pragma unroll
      for (int t = 0; t < Tr::kKeys / 32; ++t) {
        const int c = lane + 32 * t;
        s[t] = (k0 + c < limit) ? s_warp[rr * Tr::kLdS + c] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[t]);
      }
      tile_max = warp_max(tile_max);
      RowState state{row_m[r], row_d[r]};
      const float alpha = state.raise_max(fmaxf(state.m, tile_max));
      float sum = 0.f;
#pragma unroll
      for (int t = 0; t < Tr::kKeys / 32; ++t) {
        // Masked keys (and every key of a row that has seen none: m = -inf) weigh 0.
        const float pr = (s[t] == -INFINITY) ? 0.f : expf(s[t] - state.m);
        sum += pr;
        p_warp[rr * Tr::kLdP + lane + 32 * t] = from_f32<T>(pr);
      }
      sum = group_sum<32>(sum);
      __syncwarp();  // every lane has read row_m/row_d[r] before lane 0 rewrites them
      if (lane == 0) row_m[r] = state.m, row_d[r] = state.d + sum, row_alpha[r] = alpha;
    }
    __syncwarp();

    // 4. o = o * alpha(row) + P V. V as a row-major B operand is V's rows as stored.
#pragma unroll
    for (int f = 0; f < D / 16; ++f)
#pragma unroll
      for (int i = 0; i < o[f].num_elements; ++i) o[f].x[i] *= row_alpha[warp * 16 + int(row_of.x[i])];
#pragma unroll
    for (int kk = 0; kk < Tr::kKeys / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::load_matrix_sync(a, p_warp + kk * 16, Tr::kLdP);
#pragma unroll
      for (int f = 0; f < D / 16; ++f) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
        wmma::load_matrix_sync(b, sv + kk * 16 * kLd + f * 16, kLd);
        wmma::mma_sync(o[f], a, b, o[f]);
      }
    }
    __syncthreads();  // the next tile overwrites K, V (S and P are per warp)
  }

  // Epilogue: each 16x16 output fragment goes through the warp's S area,
  // is divided by the row sum and written to its (query, head) row.
#pragma unroll
  for (int f = 0; f < D / 16; ++f) {
    wmma::store_matrix_sync(s_warp, o[f], Tr::kLdS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int rr = e / 16, c = e % 16, r = warp * 16 + rr;
      if (row0 + r >= n_rows) continue;
      const RowState state{row_m[r], row_d[r]};
      p.out[(size_t(query_of(r)) * p.n_heads + head_of(r)) * D + f * 16 + c] = s_warp[rr * Tr::kLdS + c] * state.inv_d();
    }
    __syncwarp();
  }
  if (p.lse != nullptr && lane < 16) {
    const int r = warp * 16 + lane;
    if (row0 + r < n_rows) p.lse[size_t(query_of(r)) * p.n_heads + head_of(r)] = RowState{row_m[r], row_d[r]}.lse();
  }
}

}  // namespace

template <typename T, int D>
void launch_prefill(const PrefillAttentionParams& p, float scale, cudaStream_t stream) {
  using Tr = PrefillTraits<D>;
  const int group = p.n_heads / p.n_kv_heads;
  const int64_t tiles = (p.n_q * group + Tr::kRows - 1) / Tr::kRows;  // bounded by the caller
  if (tiles == 0) return;
  auto* kernel = &prefill_kernel<T, D>;
  static PerDevice<bool> smem_raised;  // the kernel's shared-memory limit, set once per device
  smem_raised.get(current_device("prefill_attention: cudaGetDevice"), [kernel] {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)),
               "prefill_attention: cudaFuncSetAttribute (shared memory)");
    return true;
  });
  kernel<<<dim3(unsigned(tiles), unsigned(p.n_kv_heads)), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, group, scale);
  cuda_check(cudaGetLastError(), "prefill_attention launch");
}

template void launch_prefill<__half, 64>(const PrefillAttentionParams&, float, cudaStream_t);
template void launch_prefill<__half, 128>(const PrefillAttentionParams&, float, cudaStream_t);
template void launch_prefill<__half, 256>(const PrefillAttentionParams&, float, cudaStream_t);
template void launch_prefill<__nv_bfloat16, 64>(const PrefillAttentionParams&, float, cudaStream_t);
template void launch_prefill<__nv_bfloat16, 128>(const PrefillAttentionParams&, float, cudaStream_t);
template void launch_prefill<__nv_bfloat16, 256>(const PrefillAttentionParams&, float, cudaStream_t);

}  // namespace longctx::gpu::detail
