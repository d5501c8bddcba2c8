// Local-window decode attention over a ring of K/V slots, and store_kv.
//
// Decode is bound by reading K/V, so the kernel reads each K/V byte once per
// block and scores it against all the query heads of the block (up to
// kMaxHeads heads of one GQA group). Work split: block (kv head, split, head
// slice). Each warp is cut into lane groups of D/8 lanes; a lane group
// handles one position at a time (lane l holds channels [8l', 8l'+8) of it),
// keeps an online-softmax state per query head, and the block merges its
// lane groups' states in shared memory at the end. With a workspace, the
// window is cut into `splits` consecutive pieces (one block each) whose
// normalized (out, lse) go to the workspace and a second kernel merges them
// by LSE; without one, splits = 1 and the block writes out/lse directly.
#include <algorithm>

#include "attention_common.cuh"
#include "cuda_check.h"
#include "longctx/core/lse_merge.h"

namespace longctx::gpu::detail {
namespace {

template <int D>
struct LocalTraits {
  static constexpr int kVec = 8;                        // elements per lane (one 16-byte load)
  static constexpr int kLanesPerPos = D / kVec;         // 8, 16 or 32 lanes read one key row
  static constexpr int kPosPerWarp = 32 / kLanesPerPos;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStreams = kWarps * kPosPerWarp;  // positions in flight per block
  static constexpr int kMaxHeads = 8;                    // query heads per block
  static_assert(kLanesPerPos >= 1 && kLanesPerPos <= 32 && 32 % kLanesPerPos == 0, "head_dim 64..256");
};

constexpr int64_t kMinPositionsPerSplit = 256;  // below this a split costs more than it saves

// out/lse of split `blockIdx.y` go to (part_out, part_lse) when part_out is
// set, else to p.out/p.lse. heads_per_block divides the group size.
template <typename T, int D>
__global__ void __launch_bounds__(LocalTraits<D>::kThreads)
    local_kernel(LocalAttentionParams p, int group, int heads_per_block, float scale, int64_t positions_per_split,
                 float* part_out, float* part_lse) {
  using Tr = LocalTraits<D>;
  __shared__ float st_m[Tr::kStreams][Tr::kMaxHeads];
  __shared__ float st_d[Tr::kStreams][Tr::kMaxHeads];
  __shared__ float st_o[Tr::kStreams][Tr::kMaxHeads][D];  // 32 KiB for every D

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int lane_group = lane / Tr::kLanesPerPos;  // position slot inside the warp
  const int c0 = (lane % Tr::kLanesPerPos) * Tr::kVec;
  const int stream = warp * Tr::kPosPerWarp + lane_group;
  const int kv_head = blockIdx.x;
  const int head0 = kv_head * group + blockIdx.z * heads_per_block;
  const int hb = heads_per_block;

  // This lane's channels of each query head, pre-multiplied by the scale (like the CPU kernel).
  float q[Tr::kMaxHeads][Tr::kVec];
#pragma unroll
  for (int h = 0; h < Tr::kMaxHeads; ++h)
#pragma unroll
    for (int e = 0; e < Tr::kVec; ++e) q[h][e] = h < hb ? p.q[size_t(head0 + h) * D + c0 + e] * scale : 0.f;

  RowState state[Tr::kMaxHeads];
  float o[Tr::kMaxHeads][Tr::kVec] = {};

  const int64_t begin = p.first_pos + int64_t(blockIdx.y) * positions_per_split;
  const int64_t end = std::min(p.last_pos + 1, begin + positions_per_split);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  // The warp steps together (the shuffles need every lane); a lane group
  // whose position is past the end takes part with a zero row and no update.
  for (int64_t base = begin + warp * Tr::kPosPerWarp; base < end; base += Tr::kStreams) {
    const int64_t pos = base + lane_group;
    const bool valid = pos < end;
    float kx[Tr::kVec] = {}, vx[Tr::kVec] = {};
    if (valid) {
      const size_t at = (size_t(pos % p.capacity) * p.n_kv_heads + kv_head) * D + c0;  // pos >= 0
      load8(k + at, kx);
      load8(v + at, vx);
    }
#pragma unroll
    for (int h = 0; h < Tr::kMaxHeads; ++h) {
      if (h >= hb) break;  // hb is the same for the whole block
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < Tr::kVec; ++e) s = fmaf(q[h][e], kx[e], s);
      s = group_sum<Tr::kLanesPerPos>(s);
      if (!valid) continue;
      const float alpha = s > state[h].m ? state[h].raise_max(s) : 1.f;
      const float w = expf(s - state[h].m);
      state[h].d += w;
#pragma unroll
      for (int e = 0; e < Tr::kVec; ++e) o[h][e] = fmaf(w, vx[e], o[h][e] * alpha);
    }
  }

  // Merge the kStreams partial states of each head.
#pragma unroll
  for (int h = 0; h < Tr::kMaxHeads; ++h) {
    if (h >= hb) break;
    if (c0 == 0) st_m[stream][h] = state[h].m, st_d[stream][h] = state[h].d;
#pragma unroll
    for (int e = 0; e < Tr::kVec; ++e) st_o[stream][h][c0 + e] = o[h][e];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < hb * D; idx += Tr::kThreads) {
    const int h = idx / D, c = idx % D;
    RowState total;
    float acc = 0.f;
    for (int s = 0; s < Tr::kStreams; ++s) {
      const float2 w = total.merge(RowState{st_m[s][h], st_d[s][h]});
      acc = w.x * acc + w.y * st_o[s][h][c];
    }
    const int head = head0 + h;
    float* out = part_out ? part_out + (size_t(blockIdx.y) * p.n_heads + head) * D : p.out + size_t(head) * D;
    out[c] = acc * total.inv_d();
    if (c == 0) {
      if (part_lse) part_lse[size_t(blockIdx.y) * p.n_heads + head] = total.lse();
      else p.lse[head] = total.lse();
    }
  }
}

// One block per query head: merges the splits' normalized (out, lse) by LSE.
template <int D>
__global__ void merge_splits_kernel(const float* part_out, const float* part_lse, int splits, int n_heads, float* out,
                                    float* lse) {
  const int head = blockIdx.x;
  const LseMerge m = lse_merge(part_lse + head, splits, size_t(n_heads));  // all splits empty: out 0, lse -inf
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float w = lse_weight(part_lse[size_t(s) * n_heads + head], m.max_lse);
      if (w > 0.f) acc += w / m.weight_sum * part_out[(size_t(s) * n_heads + head) * D + c];
    }
    out[size_t(head) * D + c] = acc;
  }
  if (threadIdx.x == 0) lse[head] = m.lse;
}

template <typename T>
__global__ void store_kv_kernel(StoreKVParams p, int64_t first_row) {
  T* dst = static_cast<T*>(p.dst);
  const int64_t total = p.n * p.row_elems;
  for (int64_t idx = first_row * p.row_elems + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / p.row_elems, e = idx % p.row_elems;
    const int64_t row = p.ring ? (p.first_pos + i) % p.capacity : p.first_pos + i;
    dst[row * p.row_elems + e] = from_f32<T>(p.src[idx]);
  }
}

// Largest divisor of the group size that fits one block.
int heads_per_block(int group, int max_heads) {
  for (int h = std::min(group, max_heads); h > 1; --h)
    if (group % h == 0) return h;
  return 1;
}

}  // namespace

template <typename T, int D>
void launch_local(const LocalAttentionParams& p, float scale, cudaStream_t stream) {
  using Tr = LocalTraits<D>;
  const int group = p.n_heads / p.n_kv_heads;
  const int hb = heads_per_block(group, Tr::kMaxHeads);
  const int slices = group / hb;
  const int64_t length = std::max<int64_t>(0, p.last_pos - p.first_pos + 1);

  // Splits: enough blocks for about two waves, pieces of at least
  // kMinPositionsPerSplit positions, as many as the workspace holds.
  int64_t splits = 1;
  const size_t split_bytes = size_t(p.n_heads) * (size_t(D) + 1) * sizeof(float);
  const int64_t room = p.workspace ? int64_t(std::min<size_t>(p.workspace_bytes / split_bytes, kLocalMaxSplits)) : 0;
  if (room > 1 && length > kMinPositionsPerSplit) {
    static PerDevice<int> multiprocessors;  // asked once per device
    const int device = current_device("local_window_attention: cudaGetDevice");
    const int sms = multiprocessors.get(device, [device] {
      int count = 0;
      cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
                 "local_window_attention: cudaDeviceGetAttribute");
      return count;
    });
    const int64_t blocks = int64_t(p.n_kv_heads) * slices;
    const int64_t wanted = std::max<int64_t>(1, (2 * int64_t(sms) + blocks - 1) / blocks);
    splits = std::min({wanted, room, (length + kMinPositionsPerSplit - 1) / kMinPositionsPerSplit});
  }
  const int64_t per_split = splits > 1 ? (length + splits - 1) / splits : std::max<int64_t>(length, 1);
  splits = splits > 1 ? (length + per_split - 1) / per_split : 1;  // no empty trailing split

  float* part_out = nullptr;
  float* part_lse = nullptr;
  if (splits > 1) {
    part_out = static_cast<float*>(p.workspace);
    part_lse = part_out + size_t(splits) * p.n_heads * D;
  }
  const dim3 grid(unsigned(p.n_kv_heads), unsigned(splits), unsigned(slices));
  local_kernel<T, D><<<grid, Tr::kThreads, 0, stream>>>(p, group, hb, scale, per_split, part_out, part_lse);
  cuda_check(cudaGetLastError(), "local_window_attention launch");
  if (splits > 1) {
    merge_splits_kernel<D><<<p.n_heads, 128, 0, stream>>>(part_out, part_lse, int(splits), p.n_heads, p.out, p.lse);
    cuda_check(cudaGetLastError(), "local_window_attention merge launch");
  }
}

template <typename T>
void launch_store_kv(const StoreKVParams& p, cudaStream_t stream) {
  // In a ring, rows older than the last `capacity` would be overwritten: skip them.
  const int64_t first_row = p.ring ? std::max<int64_t>(0, p.n - p.capacity) : 0;
  const int64_t elems = (p.n - first_row) * p.row_elems;
  if (elems <= 0) return;
  const int64_t blocks = std::min<int64_t>((elems + 255) / 256, 4096);
  store_kv_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(p, first_row);
  cuda_check(cudaGetLastError(), "store_kv launch");
}

template void launch_local<__half, 64>(const LocalAttentionParams&, float, cudaStream_t);
template void launch_local<__half, 128>(const LocalAttentionParams&, float, cudaStream_t);
template void launch_local<__half, 256>(const LocalAttentionParams&, float, cudaStream_t);
template void launch_local<__nv_bfloat16, 64>(const LocalAttentionParams&, float, cudaStream_t);
template void launch_local<__nv_bfloat16, 128>(const LocalAttentionParams&, float, cudaStream_t);
template void launch_local<__nv_bfloat16, 256>(const LocalAttentionParams&, float, cudaStream_t);
template void launch_store_kv<__half>(const StoreKVParams&, cudaStream_t);
template void launch_store_kv<__nv_bfloat16>(const StoreKVParams&, cudaStream_t);

}  // namespace longctx::gpu::detail
