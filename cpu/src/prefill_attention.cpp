// Prefill attention on the CPU, tiled flash-attention style.
//
// Keys of a kv head: its history spans (dense: [0, first_pos)), then the
// chunk [first_pos, first_pos + n), concatenated in position order and cut
// into key tiles of kKeyTile consecutive keys of that list (dense: tiles start
// at positions that are multiples of kKeyTile; kAmx's tiles are kAmxKeyTile).
//
// Work item = (kv head, tile of query positions). The tile's rows are its
// positions x the g query heads of the kv head (row = position * g + head in
// group), so every K/V element converted to f32 serves all of them. For each
// tile of kKeyTile keys up to the tile's last position, its K^T and V are
// converted from the pages (K^T [d][block_size], V [block_size][d]) into f32
// scratch of the same layouts, both row-major B matrices, then:
//   S = Q_scaled x K^T
//   causal mask, online softmax step (running max m, sum l; O rescaled)
//   O += P x V
// and at the end out = O / l, lse = m + log(l). Rows whose position is before
// a key tile's first key see none of it and are left out of its products;
// since positions grow with the row, the rows that take part are a suffix of
// the tile. A tile's keys are its history keys (seen by every row) followed by
// consecutive chunk keys, so a row sees a prefix of the tile.
//
// Each element's result depends only on its own row and the fixed key tiling
// (tiles start at multiples of the kernel's key tile), never on how queries are split into
// tiles or threads: on one Highway target the output is the same whatever
// the chunking and thread count.
//
// With PrefillKernel::kBf16 the same tiles go through bf16: Q * scale rounded
// to bf16 once per work item, K^T and V packed from their f32 scratch into
// bf16 pairs (prefill_attention_bf16.cpp), P written in bf16 by the softmax
// step (softmax_step_bf16, after the max is subtracted), both products on
// vdpbf16ps into the same f32 S and O. kOnednn rounds
// the same values into plain row-major bf16 (K^T [d][keys], V [keys][d]) and
// hands both products to oneDNN's matmul (prefill_attention_onednn.cpp),
// which runs them on AMX tiles where the CPU has them. oneDNN's kernels sum
// in an order that depends on the matrix shapes (seen on AMX: the last bit of
// P V moved with the chunking), so every onednn call of a problem has the
// same shapes: all tile_rows rows of a work item and a whole key tile (masked
// keys have P = 0, the value rows past the tile's keys are zeroed); P V goes
// into its own scratch and only the active rows are added to O, so rows that
// do not see a tile are untouched whatever it holds. A row's result then
// depends only on its own data again.
//
// kAmx keeps kBf16's operands (q rounded once, K^T and V in bf16 pairs,
// which is how AMX tiles load B, but packed tile by tile: pack_bf16_tiles)
// with head_dim rounded up to 32 for whole tiles, and hands each key tile
// to amx_attend_key_tile (prefill_attention_amx.cpp), which runs S = Q K^T,
// the softmax step and O += P V fused, 32 rows at a time, both products on
// the tiles; its m is a reference max (m + log(l) is the lse all the same).
//
// The f32 products use our Highway GEMM (prefill_attention_hwy.cpp): oneDNN's
// sgemm on the same scratch tiles ran no faster (chunk 512 at 8K keys, 32/8
// heads, d=128, f16, Zen 4: 97 vs 98 GFLOP/s per core, 84% of the FMA peak)
// and would bring an OpenMP runtime beside TBB.
#include "longctx/cpu/prefill_attention.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/cpu/peak_loops.h"
#include "longctx/cpu/prefill_attention_kernels.h"
#include "longctx/kvstore/node_executor.h"

namespace longctx::cpu {
namespace {

using detail::kTileAlign;

// Keys per tile: K^T and V of one tile are 128 x d f32 each (64 KiB at d=128).
constexpr int64_t kKeyTile = 128;
// kAmx's key tiles: its P V product has the tile's keys as depth, and a tile
// product runs longer for each time its O block is loaded and stored; but
// each block of 32 rows streams the whole tile's K and V tiles through the
// tile loads, from L2 once they outgrow L1. 512 keys ran 14% faster than
// 128 on 16 cores of an AMX Xeon (4096 queries over 128K); on 2 cores of
// another (2026-12-02, 4096 queries over 32K, 32/8 heads), 256 ran 6.7%
// faster than 512 at head_dim 128 (medians of four alternated runs, 1.82
// against 1.95 s) and the same at 32, 64 and 256, and 128 slower again.
constexpr int64_t kAmxKeyTile = 256;
// Rows (positions x heads of a group) per query tile: as many as make the
// tile's Q and O 128 KiB each (256 rows at d=128), so that with S and the key
// tile one work item's data (512 KiB at d=128) stays in L2. Larger tiles
// convert each K/V tile for more rows: 128 rows ran 4% slower (Zen 4).
// The bf16 kernel takes twice as many rows (its Q is half the bytes, and
// converting K/V weighs more against its faster products): 512 rows at
// d=128 ran 4% faster than 256, 1024 another 1% (Zen 4, chunk 4096 over 32K).
constexpr int64_t kTileFloats = 32768;
// kAmx takes 2048 rows whatever head_dim: each work item reads its kv head's
// keys from memory and converts and packs them once, which weighed more the
// faster the tile kernel got. Against the 65536 floats above (chunk 4096
// over 32K, 2 threads, Xeon EMR): head_dim 128, 512 -> 2048 rows, 26% less
// time (1024: 22%); head_dim 256, 256 -> 2048 rows, 38% less (1024: 34%);
// head_dim 64 (1024 rows before) the same within noise. A work item's Q,
// O and scratch then outgrow L2 (about 6 MiB at head_dim 256), which costs
// less: O is read and written once per 32 rows and key tile.
constexpr int64_t kAmxTileRows = 2048;
// Work items per thread a chunk is cut into at least, where kMinTileRows
// allows: at the demo's shape (5 kv heads, head_dim 32, 2048 positions per
// tile) a 2048-query chunk made 5 items, and 2 threads ran 3 and 2 of them
// (16 threads: 11 idle). Smaller tiles convert each key tile for fewer rows;
// 256 rows instead of 2048 cost 3% more cycles in all (Zen 4).
constexpr int64_t kItemsPerThread = 4;
constexpr int64_t kMinTileRows = 128;

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// A 64-byte aligned buffer that only grows; new memory is zeroed so that
// padding columns the kernels read but never fill hold finite values.
template <typename T>
class Buffer {
 public:
  T* get(size_t n) {
    if (n > size_) {
      data_ = hwy::AllocateAligned<T>(n);
      std::fill(data_.get(), data_.get() + n, T{0});
      size_ = n;
    }
    return data_.get();
  }

 private:
  hwy::AlignedFreeUniquePtr<T[]> data_;
  size_t size_ = 0;
};

// Per-thread working set of one work item.
struct TileScratch {
  Buffer<float> q;    // [rows][d]        queries times scale
  Buffer<float> k_t;  // [d][key_tile]    keys of the key tile, channel-major
  Buffer<float> v;    // [key_tile][d_pad] values of the key tile
  Buffer<float> s;    // [rows][key_tile] scores, then probabilities (kAmx: one block of rows)
  Buffer<float> o;    // [rows][d_pad]    unnormalized output
  // kBf16 and kAmx:
  Buffer<uint16_t> q_bf16;  // [rows][d_bf16]          q rounded
  Buffer<uint32_t> k_pairs; // [d_bf16 / 2][key_tile]   K^T, pairs of channels (kAmx: the same words in tiles)
  Buffer<uint32_t> v_pairs; // [key_tile / 2][d_pad]    V, pairs of keys (kAmx: in tiles)
  Buffer<uint16_t> p_bf16;  // [rows][key_tile]         P rounded (kAmx: one block of rows)
  // kOnednn only (with q_bf16 and p_bf16):
  Buffer<uint16_t> k_bf16;  // [d_bf16][key_tile]       K^T rounded
  Buffer<uint16_t> v_bf16;  // [key_tile][d_pad]        V rounded
  Buffer<float> pv;         // [tile_rows][d_pad]       P V of one key tile
  std::vector<float> m, l;
  std::vector<int> valid;
  std::vector<TokenSpan> keys;  // the work item's key list: history spans + chunk
};

struct Problem {
  const kvstore::KVStore* store;
  int layer;
  int64_t first_pos;
  int64_t n;          // queries
  int n_q_heads;
  int group;          // g: query heads per kv head
  int head_dim;
  size_t d_pad;       // head_dim rounded up to kTileAlign (kAmx: 32, two tiles' columns)
  size_t d_bf16;      // head_dim rounded up to 2 (bf16 pairs; kAmx: 32, a tile's depth)
  float scale;
  PrefillKernel kernel;
  const Selection* history;  // per kv head, spans before first_pos
  TensorView q;
  MutableTensorView out, lse;
  int64_t key_tile = kKeyTile;  // keys per key tile (kAmxKeyTile for kAmx)
  size_t tile_rows = 0;  // rows of a full work item (positions x group); onednn's M

  const float* q_row(int64_t i, int head) const {
    return static_cast<const float*>(q.data) + i * q.strides[0] + head * q.strides[1];
  }
  float* out_row(int64_t i, int head) const {
    return static_cast<float*>(out.data) + i * out.strides[0] + head * out.strides[1];
  }
  float* lse_at(int64_t i, int head) const {
    return static_cast<float*>(lse.data) + i * lse.strides[0] + head * lse.strides[1];
  }
};

// Keys [k0, k0 + count) of one kv head, converted to f32: K^T into k_t
// (row c = channel c, ld_kt floats apart), V into v (token rows, ld_v apart).
void load_key_run(const Problem& p, int kv_head, int64_t k0, int64_t count, float* k_t, size_t ld_kt, float* v,
                   size_t ld_v) {
  const kvstore::StoreLayout& layout = p.store->layout();
  const int bs = layout.block_size;
  for (int64_t t = k0; t < k0 + count;) {
    const int64_t offset = t % bs;
    const int len = int(std::min<int64_t>(bs - offset, k0 + count - t));
    const kvstore::BlockView view = p.store->block(p.layer, kv_head, t / bs);
    const size_t col = size_t(t - k0);
    kvstore::read_keys_t(layout, view, int(offset), len, k_t + col, ld_kt);
    kvstore::read_values(layout, view, int(offset), len, v + col * ld_v, ld_v);
    t += len;
  }
}

// Queries [i_begin, i_end) of the chunk, the query heads of `kv_head`.
void run_tile(const Problem& p, int kv_head, int64_t i_begin, int64_t i_end, TileScratch& scratch) {
  const int g = p.group;
  const size_t d = size_t(p.head_dim);
  const size_t d_pad = p.d_pad;
  const size_t rows = size_t(i_end - i_begin) * size_t(g);
  const size_t ld_s = size_t(p.key_tile);

  const bool onednn = p.kernel == PrefillKernel::kOnednn;
  const bool amx = p.kernel == PrefillKernel::kAmx;
  // Rows the products compute: onednn's fixed shapes; AMX's whole blocks.
  const size_t m = onednn ? p.tile_rows : amx ? round_up(rows, detail::kAmxRows) : rows;
  float* q = scratch.q.get(rows * d);
  float* k_t = scratch.k_t.get(d * ld_s);
  float* v = scratch.v.get(ld_s * d_pad);
  // kAmx keeps S and P of one block of rows at a time.
  const size_t s_rows = amx ? detail::kAmxRows : m;
  float* s = scratch.s.get(s_rows * ld_s);
  float* o = scratch.o.get(m * d_pad);
  scratch.m.assign(rows, -std::numeric_limits<float>::infinity());
  scratch.l.assign(rows, 0.f);
  scratch.valid.resize(rows);
  std::fill(o, o + rows * d_pad, 0.f);

  for (int64_t i = i_begin; i < i_end; ++i) {
    for (int j = 0; j < g; ++j) {
      const float* src = p.q_row(i, kv_head * g + j);
      float* dst = q + (size_t(i - i_begin) * size_t(g) + size_t(j)) * d;
      for (size_t c = 0; c < d; ++c) dst[c] = src[c] * p.scale;
    }
  }
  const bool bf16 = p.kernel == PrefillKernel::kBf16;
  const bool pairs = bf16 || amx;  // K^T and V packed in bf16 pairs
  const size_t d_bf16 = p.d_bf16;
  uint16_t* q_bf16 = nullptr;
  uint32_t *k_pairs = nullptr, *v_pairs = nullptr;
  uint16_t *p_bf16 = nullptr, *k_bf16 = nullptr, *v_bf16 = nullptr;
  float* pv = nullptr;
  if (pairs || onednn) {
    // Columns past head_dim stay 0; so do AMX's padding rows, or hold
    // another item's finite rows, which only ever meet P = 0.
    q_bf16 = scratch.q_bf16.get(m * d_bf16);
    for (size_t r = 0; r < rows; ++r) convert(q + r * d, DType::kF32, q_bf16 + r * d_bf16, DType::kBF16, d);
    p_bf16 = scratch.p_bf16.get(s_rows * ld_s);
  }
  if (pairs) {
    k_pairs = scratch.k_pairs.get(d_bf16 / 2 * ld_s);
    v_pairs = scratch.v_pairs.get(ld_s / 2 * d_pad);
  }
  if (onednn) {
    k_bf16 = scratch.k_bf16.get(d_bf16 * ld_s);  // an odd head_dim's last row stays 0
    v_bf16 = scratch.v_bf16.get(ld_s * d_pad);
    pv = scratch.pv.get(m * d_pad);
  }

  // Key list: the history spans, then the chunk up to the tile's last query.
  std::vector<TokenSpan>& keys = scratch.keys;
  keys = p.history->spans[size_t(kv_head)];
  int64_t n_history = 0;
  for (const TokenSpan& span : keys) n_history += span.end - span.begin;
  keys.push_back({p.first_pos, p.first_pos + i_end});
  const int64_t n_keys = n_history + i_end;

  size_t span = 0;      // cursor in the key list: span index,
  int64_t in_span = 0;  // keys of it already loaded
  for (int64_t k0 = 0; k0 < n_keys; k0 += p.key_tile) {
    const int64_t count = std::min(p.key_tile, n_keys - k0);
    const size_t cols = round_up(size_t(count), kTileAlign);
    for (int64_t col = 0; col < count;) {
      const int64_t take = std::min(keys[span].end - keys[span].begin - in_span, count - col);
      load_key_run(p, kv_head, keys[span].begin + in_span, take, k_t + col, ld_s, v + size_t(col) * d_pad, d_pad);
      col += take;
      in_span += take;
      if (keys[span].begin + in_span == keys[span].end) {
        ++span;
        in_span = 0;
      }
    }
    // The tile holds tile_history history keys, then chunk keys from position chunk0 on.
    const int64_t tile_history = std::clamp<int64_t>(n_history - k0, 0, count);
    const int64_t chunk0 = p.first_pos + std::max<int64_t>(0, k0 - n_history);
    const int64_t first_i = tile_history > 0 ? i_begin : std::max(i_begin, chunk0 - p.first_pos);
    const size_t row0 = size_t(first_i - i_begin) * size_t(g);
    const size_t active = rows - row0;
    // The keys each active row sees, set per position for its g rows: the
    // row index divided by g for each row and key tile held about half of
    // this function's own samples in a profile at the demo's shape (Zen 5).
    for (int64_t i = first_i; i < i_end; ++i) {
      const int valid = int(tile_history + std::clamp<int64_t>(p.first_pos + i - chunk0 + 1, 0, count - tile_history));
      std::fill_n(scratch.valid.begin() + (i - first_i) * g, g, valid);
    }
    if (amx) {
      // Whole tiles of 32 keys, packed tile by tile: the columns past the
      // tile's keys are masked, and the value rows past them are zeros
      // (pack_bf16_tiles) so that P = 0 meets no Inf or NaN.
      const size_t key_cols = round_up(size_t(count), 2 * kTileAlign);
      detail::pack_bf16_tiles(d, key_cols, k_t, ld_s, k_pairs);
      detail::pack_bf16_tiles(size_t(count), d_pad, v, d_pad, v_pairs);
      detail::AmxKeyTile tile;
      tile.rows = rows, tile.row0 = row0, tile.keys = key_cols, tile.depth = d_bf16, tile.valid = scratch.valid.data();
      tile.q = q_bf16, tile.ld_q = d_bf16, tile.k_tiles = k_pairs, tile.v_tiles = v_pairs, tile.ld_p = ld_s;
      tile.m = scratch.m.data(), tile.l = scratch.l.data(), tile.o = o, tile.ld_o = d_pad;
      tile.s = s, tile.p = p_bf16;
      detail::amx_attend_key_tile(tile);
      continue;
    }
    if (bf16) {
      detail::pack_bf16_pairs(d, cols, k_t, ld_s, k_pairs, ld_s);
      detail::pack_bf16_pairs(size_t(count), d_pad, v, d_pad, v_pairs, d_pad);
      detail::gemm_bf16(false, active, cols, d_bf16 / 2, q_bf16 + row0 * d_bf16, d_bf16, k_pairs, ld_s, s, ld_s);
    } else if (onednn) {  // fixed shapes: every row, the whole key tile
      detail::round_rows_bf16(d, cols, k_t, ld_s, k_bf16, ld_s);
      detail::round_rows_bf16(size_t(count), d_pad, v, d_pad, v_bf16, d_pad);
      std::fill(v_bf16 + size_t(count) * d_pad, v_bf16 + ld_s * d_pad, uint16_t{0});
      detail::gemm_bf16_onednn(m, ld_s, d_bf16, q_bf16, d_bf16, k_bf16, ld_s, s, ld_s);
    } else {
      detail::gemm_f32(false, active, cols, d, q + row0 * d, d, k_t, ld_s, s, ld_s);
    }
    if (bf16) {
      // P straight into bf16 (AVX-512). An odd count's last pair reads P's
      // next column, masked to 0 (cols >= count + 1).
      detail::softmax_step_bf16(active, cols, scratch.valid.data(), s, ld_s, scratch.m.data() + row0,
                                scratch.l.data() + row0, o + row0 * d_pad, d_pad, d_pad, p_bf16, ld_s);
      const size_t key_pairs = (size_t(count) + 1) / 2;
      detail::gemm_bf16(true, active, d_pad, key_pairs, p_bf16, ld_s, v_pairs, d_pad, o + row0 * d_pad, d_pad);
      continue;
    }
    // S holds the active rows from its first row, onednn's every row of the
    // work item; onednn's masked columns up to the whole tile become P = 0.
    float* s_active = onednn ? s + row0 * ld_s : s;
    detail::softmax_step(active, onednn ? ld_s : cols, scratch.valid.data(), s_active, ld_s,
                         scratch.m.data() + row0, scratch.l.data() + row0, o + row0 * d_pad, d_pad, d_pad);
    if (onednn) {
      detail::round_rows_bf16(active, ld_s, s_active, ld_s, p_bf16 + row0 * ld_s, ld_s);
      detail::gemm_bf16_onednn(m, d_pad, ld_s, p_bf16, ld_s, v_bf16, d_pad, pv, d_pad);
      for (size_t r = row0; r < rows; ++r)  // the active rows only
        for (size_t c = 0; c < d_pad; ++c) o[r * d_pad + c] += pv[r * d_pad + c];
    } else {
      detail::gemm_f32(true, active, d_pad, size_t(count), s, ld_s, v, d_pad, o + row0 * d_pad, d_pad);
    }
  }

  for (size_t r = 0; r < rows; ++r) {
    const int64_t i = i_begin + int64_t(r / size_t(g));
    const int head = kv_head * g + int(r % size_t(g));
    const float l = scratch.l[r];  // >= 1: the row's maximum contributes exp(0)
    float* dst = p.out_row(i, head);
    for (size_t c = 0; c < d; ++c) dst[c] = o[r * d_pad + c] / l;
    *p.lse_at(i, head) = scratch.m[r] + std::log(l);
  }
}

// Throws unless every kv head's spans are sorted, non-empty, non-overlapping
// and inside [0, first_pos).
void check_history(const Selection& history, int n_kv_heads, int64_t first_pos) {
  if (history.spans.size() != size_t(n_kv_heads)) {
    fail(ErrorCode::kInvalidArgument, "prefill_attention: history has span lists for ", history.spans.size(),
         " kv heads, the store has ", n_kv_heads);
  }
  for (int h = 0; h < n_kv_heads; ++h) {
    int64_t previous_end = 0;
    const std::vector<TokenSpan>& spans = history.spans[size_t(h)];
    for (size_t i = 0; i < spans.size(); ++i) {
      const TokenSpan& s = spans[i];
      if (s.begin < previous_end || s.begin >= s.end || s.end > first_pos) {
        fail(ErrorCode::kInvalidArgument, "prefill_attention: history of kv head ", h, ", span ", i, " [", s.begin,
             ", ", s.end, ") is empty, overlaps or precedes the previous span (ending at ", previous_end,
             ") or reaches past the chunk's first position ", first_pos);
      }
      previous_end = s.end;
    }
  }
}

void run_prefill(const kvstore::KVStore& store, int layer, int64_t first_pos, const Selection* history,
                 const TensorView& q, float scale, const MutableTensorView& out, const MutableTensorView& lse,
                 PrefillKernel kernel) {
  const std::string unsupported = prefill_kernel_unsupported_reason(kernel);
  if (!unsupported.empty()) fail(ErrorCode::kUnsupported, "prefill_attention: ", unsupported);
  const kvstore::KVShape& shape = store.layout().shape;
  if (layer < 0 || layer >= shape.n_layers) {
    fail(ErrorCode::kInvalidArgument, "prefill_attention: layer ", layer, " out of range [0, ", shape.n_layers,
         ")");
  }
  const int d = shape.head_dim;
  check_dtype(q, "prefill_attention q", DType::kF32);
  check_shape(q, "prefill_attention q", {-1, -1, d});
  const int64_t n = q.shape[0];
  const int64_t n_q_heads = q.shape[1];
  if (n_q_heads < shape.n_kv_heads || n_q_heads % shape.n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "prefill_attention: q has ", n_q_heads,
         " query heads, not a positive multiple of the store's ", shape.n_kv_heads, " kv heads");
  }
  check_dtype(as_const(out), "prefill_attention out", DType::kF32);
  check_shape(as_const(out), "prefill_attention out", {n, n_q_heads, d});
  check_dtype(as_const(lse), "prefill_attention lse", DType::kF32);
  check_shape(as_const(lse), "prefill_attention lse", {n, n_q_heads});
  const int64_t n_tokens = store.n_tokens(layer);
  if (first_pos < 0 || first_pos > n_tokens - n) {
    fail(ErrorCode::kInvalidArgument, "prefill_attention: queries at positions [", first_pos, ", ", first_pos + n,
         ") but layer ", layer, " holds ", n_tokens, " tokens (append the chunk's K/V first)");
  }
  if (!std::isfinite(scale) || scale < 0.f) {
    fail(ErrorCode::kInvalidArgument, "prefill_attention: scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ",
         scale);
  }
  Selection dense_history;
  if (history == nullptr) {
    dense_history.spans.assign(size_t(shape.n_kv_heads), {});
    if (first_pos > 0)
      for (auto& spans : dense_history.spans) spans.push_back({0, first_pos});
    history = &dense_history;
  } else {
    check_history(*history, shape.n_kv_heads, first_pos);
  }
  if (n == 0) return;
  check_inner_contiguous(q, "prefill_attention q");
  check_finite(q, "prefill_attention q");  // a NaN query gave NaN rows
  check_inner_contiguous(as_const(out), "prefill_attention out");
  check_inner_contiguous(as_const(lse), "prefill_attention lse");

  const bool amx = kernel == PrefillKernel::kAmx;
  Problem p{&store, layer, first_pos, n, int(n_q_heads), int(n_q_heads / shape.n_kv_heads), d,
            round_up(size_t(d), amx ? 2 * kTileAlign : kTileAlign), round_up(size_t(d), amx ? 2 * kTileAlign : 2),
            scale == 0.f ? 1.f / std::sqrt(float(d)) : scale, kernel, history, q, out, lse};
  const int64_t tile_floats = kernel != PrefillKernel::kF32 ? 2 * kTileFloats : kTileFloats;
  int64_t tile_positions = std::max<int64_t>(1, amx ? kAmxTileRows / p.group : tile_floats / (int64_t(p.group) * d));
  // Smaller tiles where the chunk would give fewer than kItemsPerThread work
  // items per thread, down to kMinTileRows rows. Not for onednn, whose
  // shapes (tile_rows) must not depend on the chunk or the threads.
  if (kernel != PrefillKernel::kOnednn) {
    const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
    const int64_t wanted_tiles = (kItemsPerThread * threads + shape.n_kv_heads - 1) / shape.n_kv_heads;
    const int64_t min_positions = std::max<int64_t>(1, kMinTileRows / p.group);
    tile_positions = std::min(tile_positions, std::max(min_positions, (n + wanted_tiles - 1) / wanted_tiles));
  }
  p.tile_rows = size_t(tile_positions) * size_t(p.group);
  if (amx) p.key_tile = kAmxKeyTile;
  const int64_t n_tiles = (n + tile_positions - 1) / tile_positions;
  const int64_t n_items = n_tiles * shape.n_kv_heads;

  const auto kv_head_of = [&](int64_t item) { return int(item % shape.n_kv_heads); };
  tbb::enumerable_thread_specific<TileScratch> scratch;
  kvstore::parallel_for_heads(store, n_items, kv_head_of, [&](int64_t item) {
    // Last tiles (the most keys) first, for a better balance at the end.
    const int64_t tile = n_tiles - 1 - item / shape.n_kv_heads;
    const int64_t i_begin = tile * tile_positions;
    run_tile(p, kv_head_of(item), i_begin, std::min(n, i_begin + tile_positions), scratch.local());
  });
}

}  // namespace

const char* prefill_kernel_name(PrefillKernel kernel) {
  switch (kernel) {
    case PrefillKernel::kF32: return "f32";
    case PrefillKernel::kBf16: return "bf16";
    case PrefillKernel::kOnednn: return "onednn";
    case PrefillKernel::kAmx: return "amx";
  }
  return "?";
}

// oneDNN's choice for a bf16 matmul here, asked once; "" when it has none, or only its reference code.
const std::string& onednn_bf16_kernel() {
  static const std::string impl = [] {
    const std::string name = detail::onednn_bf16_implementation();
    return name.find("ref") == std::string::npos ? name : std::string();
  }();
  return impl;
}

// What prefill_attention_bf16.cpp is compiled for (cpu/CMakeLists.txt); the
// amx kernel runs its softmax step too. Every CPU with AVX512-BF16 so far
// (Cooper Lake, Sapphire Rapids, Zen 4) has the rest.
namespace {
bool bf16_softmax_usable(const CpuFeatures& f) {
  return f.avx512bf16 && f.avx512dq && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}
}  // namespace

std::string prefill_kernel_unsupported_reason(PrefillKernel kernel) {
  const CpuFeatures& f = cpu_features();
  if (kernel == PrefillKernel::kBf16 && !bf16_softmax_usable(f))
    return "the bf16 prefill kernel needs AVX512-BF16 (vdpbf16ps) with AVX512DQ, which this CPU (" + f.brand + ") lacks";
  if (kernel == PrefillKernel::kAmx) {
    if (!f.amx_bf16 && !amx_tiles_emulated()) {
      const std::string& why = amx_unusable_reason();
      return "the amx prefill kernel needs AMX bf16 tiles, which are not usable here: " +
             (why.empty() ? "the CPU (" + f.brand + ") has AMX without bf16" : why);
    }
    if (!bf16_softmax_usable(f))
      return "the amx prefill kernel needs AVX512-BF16 (and AVX512DQ) beside AMX, which this CPU (" + f.brand + ") lacks";
  }
  if (kernel == PrefillKernel::kOnednn && onednn_bf16_kernel().empty())
    return "the onednn prefill kernel needs a bf16 matmul of oneDNN's own (AMX or AVX-512 bf16), which it has not "
           "for this CPU (" + f.brand + ")";
  return "";
}

bool amx_tiles_emulated() {
#ifdef LONGCTX_AMX_EMULATION
  return true;
#else
  return false;
#endif
}

std::string prefill_kernel_engine(PrefillKernel kernel) {
  switch (kernel) {
    case PrefillKernel::kF32: return "f32 FMA (" + highway_target_name() + ")";
    case PrefillKernel::kBf16: return "vdpbf16ps";
    case PrefillKernel::kOnednn: return "oneDNN " + onednn_bf16_kernel();
    case PrefillKernel::kAmx: return amx_tiles_emulated() ? "AMX tdpbf16ps (emulated)" : "AMX tdpbf16ps";
  }
  return "?";
}

std::vector<PrefillKernel> supported_prefill_kernels() {
  std::vector<PrefillKernel> kernels;
  // Our fused AMX kernel first where the tiles are usable, then oneDNN's AMX
  // matmul; on AVX512-BF16 alone our own vdpbf16ps kernel is the measured
  // choice over oneDNN's (README, prefill attention).
  if (prefill_kernel_unsupported_reason(PrefillKernel::kAmx).empty()) kernels.push_back(PrefillKernel::kAmx);
  const bool amx = cpu_features().amx_bf16 && prefill_kernel_unsupported_reason(PrefillKernel::kOnednn).empty();
  if (amx) kernels.push_back(PrefillKernel::kOnednn);
  if (prefill_kernel_unsupported_reason(PrefillKernel::kBf16).empty()) kernels.push_back(PrefillKernel::kBf16);
  if (!amx && prefill_kernel_unsupported_reason(PrefillKernel::kOnednn).empty())
    kernels.push_back(PrefillKernel::kOnednn);
  kernels.push_back(PrefillKernel::kF32);
  return kernels;
}

PrefillKernel best_prefill_kernel() {
  static const PrefillKernel best = [] {
    const PrefillKernel first = supported_prefill_kernels().front();
    // Without AMX, onednn (listed after bf16) runs on vdpbf16ps too.
    if (first == PrefillKernel::kBf16 && !bf16_outruns_fma()) return PrefillKernel::kF32;
    return first;
  }();
  return best;
}


PrefillKernel prefill_kernel_for(PrefillKernelChoice choice) {
  PrefillKernel kernel = PrefillKernel::kF32;
  switch (choice) {
    case PrefillKernelChoice::kAuto: return best_prefill_kernel();
    case PrefillKernelChoice::kF32: return PrefillKernel::kF32;
    case PrefillKernelChoice::kBf16: kernel = PrefillKernel::kBf16; break;
    case PrefillKernelChoice::kOnednn: kernel = PrefillKernel::kOnednn; break;
    case PrefillKernelChoice::kAmx: kernel = PrefillKernel::kAmx; break;
  }
  const std::string unsupported = prefill_kernel_unsupported_reason(kernel);
  if (!unsupported.empty())
    fail(ErrorCode::kConfig, "prefill_kernel: ", prefill_kernel_name(kernel), ": ", unsupported, " (use auto or f32)");
  return kernel;
}

void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                       float scale, const MutableTensorView& out, const MutableTensorView& lse,
                       PrefillKernel kernel) {
  run_prefill(store, layer, first_pos, nullptr, q, scale, out, lse, kernel);
}

void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const Selection& history,
                       const TensorView& q, float scale, const MutableTensorView& out, const MutableTensorView& lse,
                       PrefillKernel kernel) {
  run_prefill(store, layer, first_pos, &history, q, scale, out, lse, kernel);
}

}  // namespace longctx::cpu
