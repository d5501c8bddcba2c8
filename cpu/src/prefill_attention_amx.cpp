// The AMX kernel of prefill attention (prefill_attention_kernels.h): one key
// tile of a work item, fused. For each block of 32 rows, chunk by chunk of
// 128 keys:
//   S = Q K^T        on bf16 tiles (tdpbf16ps), into a 32 x 128 f32 scratch
//   softmax          row_max_above_bf16 and exp_row_bf16 (prefill_attention_bf16.cpp):
//                    P = exp(S - m) in bf16, m the row's reference max
// then, for the whole tile,
//   O += P V         on bf16 tiles, O's f32 blocks loaded into the tiles and back
// so S stays in L1 and P (16 KiB at 256 keys) in the core's caches between
// the products. m is raised only when a chunk's max passes it by more than
// kMaxLead; the P already written (relative to the old m) then goes into O
// before the row's O and l are rescaled.
// Compiled with AMX and AVX512-BF16 (cpu/CMakeLists.txt); reached only through
// the run-time choice of PrefillKernel.
//
// Tiles: 0-3 hold a 32 x 32 f32 block of the output (2 x 2 tiles of 16 x 16),
// 4-5 two 16-row slices of A (16 rows x 32 bf16), 6-7 two slices of B
// (16 pairs of rows x 16 columns, each 32-bit word a bf16 pair); every tile is
// 16 rows of 64 bytes. K^T and V come packed tile by tile (pack_bf16_tiles),
// each B tile 1 KiB in a row: the rows of a [pairs][keys] layout were 2 KiB
// apart at head_dim 128, and prefill ran 10% slower there (20% at 64).
// A tdpbf16ps sums its 32 products per element in the hardware's fixed
// order, and our loops walk the depth in order, so a row's result depends
// only on its own data and the key tiling.
//
// GCC's tile intrinsics are asm statements that do not tell the compiler
// which memory they read or write: compiler_barrier() between a phase's tile
// stores and the vector code reading them (and the reverse) keeps ordinary
// loads and stores in program order around them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "longctx/cpu/prefill_attention_kernels.h"

#ifdef LONGCTX_AMX_EMULATION
#include "amx_emulation.h"  // a developer build without AMX: the tile intrinsics emulated
#endif

namespace longctx::cpu::detail {
namespace {

constexpr size_t kLanes = 16;      // f32 lanes of a zmm register; rows and f32 columns of a tile
constexpr size_t kTileDepth = 32;  // bf16 values in a 64-byte tile row
// Keys of S a block holds at a time: 16 KiB of f32 scores stay in L1, where
// the tile stores of a whole 512-key S (64 KiB) went to L2 and ran 2.5-3x
// slower.
constexpr size_t kChunkKeys = 128;
// How far a chunk's max may pass a row's reference max before the reference
// is raised: P = exp(s - m) <= e^8, far from f32's and bf16's overflow and
// with the same relative rounding, in exchange for raising (and flushing P
// into O) almost never after a row's first chunk.
constexpr float kMaxLead = 8.f;

// Tiles 0-7 configured as 16 x 64 bytes for the scope's lifetime.
class TileScope {
 public:
  TileScope() { amx_configure_tiles(); }
  ~TileScope() { amx_release_tiles(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

inline void compiler_barrier() { asm volatile("" ::: "memory"); }

// C[32][32] = A[32][depth] x B[depth][32], or C += A x B when `accumulate`.
// A: bf16 rows, lda elements apart; B: tiles as pack_bf16_tiles writes them,
// the first column tile's depth steps at b, b + kAmxTileWords, ..., the second
// column tile's col_step words further; C: f32, ldc apart. depth % 32 == 0.
// Each load comes just before the first product that needs it, so the
// tiles load while the previous products run (2-7% faster than loading all
// four first).
inline void block_product(bool accumulate, size_t depth, const uint16_t* a, size_t lda, const uint32_t* b,
                          size_t col_step, float* c, size_t ldc) {
  const size_t c_stride = ldc * sizeof(float), a_stride = lda * sizeof(uint16_t);
  constexpr size_t b_stride = kLanes * sizeof(uint32_t);  // a tile's 64-byte rows, back to back
  float* c1 = c + kLanes * ldc;
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    _tile_loadd(1, c + kLanes, c_stride);
    _tile_loadd(2, c1, c_stride);
    _tile_loadd(3, c1 + kLanes, c_stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (size_t k = 0; k < depth; k += kTileDepth) {
    const uint32_t* b_k = b + k / kTileDepth * kAmxTileWords;
    _tile_loadd(4, a + k, a_stride);
    _tile_loadd(6, b_k, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b_k + col_step, b_stride);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + kLanes * lda + k, a_stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + kLanes, c_stride);
  _tile_stored(2, c1, c_stride);
  _tile_stored(3, c1 + kLanes, c_stride);
}

// ldtilecfg's 64-byte operand, palette 1: tiles 0-7 of 16 rows x 64 bytes.
// A constant in read-only data, not a local filled before the call: GCC's
// _tile_loadconfig declares that it reads 8 bytes of its operand, so the
// stores of a local's row and column fields were dropped as dead (every tile
// left unconfigured, and the first tile instruction raised SIGILL).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
constexpr TileConfig kTileConfig = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
static_assert(sizeof(TileConfig) == 64);

}  // namespace

void amx_configure_tiles() { _tile_loadconfig(&kTileConfig); }

void amx_release_tiles() { _tile_release(); }

void amx_attend_key_tile(const AmxKeyTile& t) {
  const TileScope tiles;
  const size_t ld_s = std::min(kChunkKeys, t.ld_p);  // S holds one chunk of a block
  const size_t ld_p = t.ld_p;                        // P the whole key tile
  const size_t k_steps = t.depth / kTileDepth, v_steps = t.keys / kTileDepth;  // B tiles per column tile
  for (size_t block = t.row0 / kAmxRows * kAmxRows; block < t.rows; block += kAmxRows) {
    // Rows [first, last) of the block see the first valid[row - row0] keys
    // of the tile; the others get P = 0, which leaves their O as it is.
    const size_t first = std::max(block, t.row0), last = std::min(block + kAmxRows, t.rows);
    size_t block_keys = 0;
    for (size_t row = first; row < last; ++row) block_keys = std::max(block_keys, size_t(t.valid[row - t.row0]));
    const auto seen = [&](size_t row, size_t c0, size_t width) -> size_t {
      if (row < first || row >= last) return 0;
      const size_t valid = size_t(t.valid[row - t.row0]);
      return valid > c0 ? std::min(valid - c0, width) : 0;
    };
    // Each row's sum of exps over this tile, lane by lane: reduced into l
    // once, at the end of the tile or when the row's m rises.
    alignas(64) float l_lanes[kAmxRows][kLanes] = {};
    const auto add_lanes = [&](size_t r) {
      float sum = 0.f;
      for (float& x : l_lanes[r]) sum += std::exchange(x, 0.f);
      t.l[block + r] += sum;
    };
    size_t pv_from = 0;  // keys [pv_from, c0) of P are not in O yet
    const auto add_pv = [&](size_t until) {
      compiler_barrier();
      for (size_t col = 0; col < t.ld_o; col += 2 * kLanes)
        block_product(true, until - pv_from, t.p + pv_from, ld_p,
                      t.v_tiles + (col / kLanes * v_steps + pv_from / kTileDepth) * kAmxTileWords,
                      v_steps * kAmxTileWords, t.o + block * t.ld_o + col, t.ld_o);
      compiler_barrier();
      pv_from = until;
    };
    size_t c0 = 0;
    for (; c0 < block_keys; c0 += ld_s) {
      const size_t width = std::min(ld_s, t.keys - c0);
      compiler_barrier();
      for (size_t col = 0; col < width; col += 2 * kLanes)
        block_product(false, t.depth, t.q + block * t.ld_q, t.ld_q,
                      t.k_tiles + (c0 + col) / kLanes * k_steps * kAmxTileWords, k_steps * kAmxTileWords, t.s + col,
                      ld_s);
      compiler_barrier();
      // A row's reference max m stays until a chunk's max passes it by more
      // than kMaxLead. Raising it rescales the row's O, so the P of the
      // earlier chunks (relative to the old m, every row's complete) goes
      // into O first.
      for (size_t r = 0; r < kAmxRows; ++r) {
        const size_t row = block + r, count = seen(row, c0, width);
        const float* s = t.s + r * ld_s;
        uint16_t* p = t.p + r * ld_p + c0;
        if (count == 0) {
          std::memset(p, 0, width * sizeof(uint16_t));
          continue;
        }
        float& m = t.m[row];
        float& l = t.l[row];
        const float chunk_max = row_max_above_bf16(s, count, m + kMaxLead);
        if (chunk_max != -INFINITY) {  // also the row's first key (m = -inf)
          if (pv_from < c0) add_pv(c0);
          const float alpha = std::isinf(m) ? 0.f : std::exp(m - chunk_max);
          add_lanes(r);
          l *= alpha;
          float* o = t.o + row * t.ld_o;
          std::transform(o, o + t.ld_o, o, [alpha](float x) { return x * alpha; });  // alpha may be 0
          m = chunk_max;
        }
        exp_row_bf16(s, count, width, m, p, l_lanes[r]);
      }
    }
    for (size_t row = first; row < last; ++row) add_lanes(row - block);
    add_pv(std::min(c0, t.keys));
  }
}

}  // namespace longctx::cpu::detail
