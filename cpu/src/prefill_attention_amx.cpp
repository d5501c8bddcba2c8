// The AMX kernel of prefill attention (prefill_attention_kernels.h): one key
// tile of a work item, fused. For each block of 32 rows:
//   S = Q K^T        on bf16 tiles (tdpbf16ps), into a 32-row f32 scratch
//   online softmax   softmax_step_bf16 (prefill_attention_bf16.cpp): P in bf16
//   O += P V         on bf16 tiles, O's f32 blocks loaded into the tiles and back
// so S and P of a block (96 KiB at 512 keys) stay in the core's caches
// between the products instead of S covering the whole work item.
// Compiled with AMX and AVX512-BF16 (cpu/CMakeLists.txt); reached only through
// the run-time choice of PrefillKernel.
//
// Tiles: 0-3 hold a 32 x 32 f32 block of the output (2 x 2 tiles of 16 x 16),
// 4-5 two 16-row slices of A (16 rows x 32 bf16), 6-7 two slices of B
// (16 pairs of rows x 16 columns, each 32-bit word a bf16 pair); every tile is
// 16 rows of 64 bytes. A tdpbf16ps sums its 32 products per element in the
// hardware's fixed order, and our loops walk the depth in order, so a row's
// result depends only on its own data and the key tiling.
//
// GCC's tile intrinsics are asm statements that do not tell the compiler
// which memory they read or write: compiler_barrier() between a phase's tile
// stores and the vector code reading them (and the reverse) keeps ordinary
// loads and stores in program order around them.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "longctx/cpu/prefill_attention_kernels.h"

namespace longctx::cpu::detail {
namespace {

constexpr size_t kLanes = 16;      // f32 lanes of a zmm register; rows and f32 columns of a tile
constexpr size_t kTileDepth = 32;  // bf16 values in a 64-byte tile row

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
// A: bf16 rows, lda elements apart; B: pairs of rows as 32-bit words,
// [depth / 2][32], ldb words apart; C: f32, ldc apart. depth % 32 == 0.
inline void block_product(bool accumulate, size_t depth, const uint16_t* a, size_t lda, const uint32_t* b,
                          size_t ldb, float* c, size_t ldc) {
  const size_t c_stride = ldc * sizeof(float), a_stride = lda * sizeof(uint16_t), b_stride = ldb * sizeof(uint32_t);
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
    _tile_loadd(4, a + k, a_stride);
    _tile_loadd(5, a + kLanes * lda + k, a_stride);
    const uint32_t* b_k = b + k / 2 * ldb;
    _tile_loadd(6, b_k, b_stride);
    _tile_loadd(7, b_k + kLanes, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
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
  const size_t ld_s = t.ld_k;  // S and P of a row block are as wide as K^T's tile
  for (size_t block = t.row0 / kAmxRows * kAmxRows; block < t.rows; block += kAmxRows) {
    compiler_barrier();
    for (size_t col = 0; col < t.keys; col += 2 * kLanes)
      block_product(false, t.depth, t.q + block * t.ld_q, t.ld_q, t.k_pairs + col, t.ld_k, t.s + col, ld_s);
    compiler_barrier();
    // Rows [first, last) of the block see the tile's keys; the others get
    // P = 0, which leaves their O as it is.
    const size_t first = std::max(block, t.row0), last = std::min(block + kAmxRows, t.rows);
    for (size_t row = block; row < block + kAmxRows; ++row)
      if (row < first || row >= last) std::memset(t.p + (row - block) * ld_s, 0, t.keys * sizeof(uint16_t));
    softmax_step_bf16(last - first, t.keys, t.valid + (first - t.row0), t.s + (first - block) * ld_s, ld_s,
                      t.m + first, t.l + first, t.o + first * t.ld_o, t.ld_o, t.ld_o, t.p + (first - block) * ld_s,
                      ld_s);
    compiler_barrier();
    for (size_t col = 0; col < t.ld_o; col += 2 * kLanes)
      block_product(true, t.keys, t.p, ld_s, t.v_pairs + col, t.ld_o, t.o + block * t.ld_o + col, t.ld_o);
    compiler_barrier();
  }
}

}  // namespace longctx::cpu::detail
