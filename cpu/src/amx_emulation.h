// Scalar stand-ins for the AMX tile instructions that prefill_attention_amx.cpp
// uses, for a developer build on a CPU without AMX (cmake
// -DLONGCTX_AMX_EMULATION=ON): the amx prefill kernel then runs, slowly, and
// every test that runs it checks its logic here. It says nothing about speed.
//
// Included after <immintrin.h>, it replaces the intrinsics by macros of the
// same names: the kernel's code is the code an AMX machine runs. The tile
// registers are per thread, as the hardware's are. Semantics follow Intel's
// pseudocode (SDM, LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TDPBF16PS):
// palette 1, up to 16 rows of up to 64 bytes; TDPBF16PS adds each element's
// products pair by pair, in depth order, each product exact in f32 and each
// sum rounded to nearest even, with bf16 denormal inputs read as zero and
// denormal sums flushed to zero. What would raise #UD there (a tile used
// unconfigured, shapes that do not match) aborts with a message.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace longctx::cpu::detail::amx_emulation {

constexpr int kTiles = 8;
constexpr int kMaxRows = 16;
constexpr int kMaxRowBytes = 64;

struct TileRegisters {
  bool configured = false;
  int rows[kTiles] = {};
  int row_bytes[kTiles] = {};
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxRowBytes] = {};
};

inline thread_local TileRegisters registers;

[[noreturn]] inline void undefined_instruction(const char* what, int tile) {
  std::fprintf(stderr, "amx emulation: %s (tile %d): the hardware raises #UD here\n", what, tile);
  std::abort();
}

inline void check_tile(const char* instruction, int tile) {
  if (!registers.configured) undefined_instruction(instruction, tile);
  if (tile < 0 || tile >= kTiles || registers.rows[tile] == 0) undefined_instruction(instruction, tile);
}

// The 64-byte LDTILECFG operand: palette, start row, 14 reserved bytes,
// 16 x 16-bit bytes per row, 16 x 8-bit rows.
inline void load_config(const void* config) {
  uint8_t bytes[64];
  std::memcpy(bytes, config, sizeof(bytes));
  if (bytes[0] == 0) {  // palette 0: the tiles are released
    registers = TileRegisters{};
    return;
  }
  if (bytes[0] != 1) undefined_instruction("ldtilecfg: palette other than 0 or 1", -1);
  registers = TileRegisters{};
  for (int t = 0; t < kTiles; ++t) {
    uint16_t row_bytes;
    std::memcpy(&row_bytes, bytes + 16 + 2 * t, sizeof(row_bytes));
    const int rows = bytes[48 + t];
    if (rows > kMaxRows || row_bytes > kMaxRowBytes || (rows == 0) != (row_bytes == 0))
      undefined_instruction("ldtilecfg: a tile shape palette 1 does not have", t);
    registers.rows[t] = rows;
    registers.row_bytes[t] = row_bytes;
  }
  registers.configured = true;
}

inline void release() { registers = TileRegisters{}; }

inline void zero(int tile) {
  check_tile("tilezero", tile);
  std::memset(registers.data[tile], 0, sizeof(registers.data[tile]));
}

inline void load(int tile, const void* base, long stride) {
  check_tile("tileloadd", tile);
  std::memset(registers.data[tile], 0, sizeof(registers.data[tile]));
  for (int r = 0; r < registers.rows[tile]; ++r)
    std::memcpy(registers.data[tile][r], static_cast<const uint8_t*>(base) + r * stride,
                size_t(registers.row_bytes[tile]));
}

inline void store(int tile, void* base, long stride) {
  check_tile("tilestored", tile);
  for (int r = 0; r < registers.rows[tile]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, registers.data[tile][r],
                size_t(registers.row_bytes[tile]));
}

// A bf16 value as f32, denormals read as zero.
inline float bf16_daz(uint16_t bits) {
  if ((bits & 0x7f80u) == 0) bits &= 0x8000u;
  const uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline float flush_denormal(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7f800000u) == 0) word &= 0x80000000u;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// C[m][n] += sum over k of A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1], in that order.
inline void dpbf16ps(int c, int a, int b) {
  check_tile("tdpbf16ps", c);
  check_tile("tdpbf16ps", a);
  check_tile("tdpbf16ps", b);
  const int m_rows = registers.rows[c], n_cols = registers.row_bytes[c] / 4, k_pairs = registers.row_bytes[a] / 4;
  if (registers.rows[a] != m_rows || registers.rows[b] != k_pairs || registers.row_bytes[b] != registers.row_bytes[c])
    undefined_instruction("tdpbf16ps: tile shapes that do not chain", c);
  for (int m = 0; m < m_rows; ++m) {
    float* acc = reinterpret_cast<float*>(registers.data[c][m]);
    const uint16_t* a_row = reinterpret_cast<const uint16_t*>(registers.data[a][m]);
    for (int k = 0; k < k_pairs; ++k) {
      const uint16_t* b_row = reinterpret_cast<const uint16_t*>(registers.data[b][k]);
      const float a0 = bf16_daz(a_row[2 * k]), a1 = bf16_daz(a_row[2 * k + 1]);
      for (int n = 0; n < n_cols; ++n) {
        acc[n] = flush_denormal(acc[n] + a0 * bf16_daz(b_row[2 * n]));
        acc[n] = flush_denormal(acc[n] + a1 * bf16_daz(b_row[2 * n + 1]));
      }
    }
  }
}

}  // namespace longctx::cpu::detail::amx_emulation

// The intrinsics' names, now calls of the stand-ins above.
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) ::longctx::cpu::detail::amx_emulation::load_config(config)
#define _tile_release() ::longctx::cpu::detail::amx_emulation::release()
#define _tile_loadd(tile, base, stride) ::longctx::cpu::detail::amx_emulation::load(tile, base, long(stride))
#define _tile_stored(tile, base, stride) ::longctx::cpu::detail::amx_emulation::store(tile, base, long(stride))
#define _tile_zero(tile) ::longctx::cpu::detail::amx_emulation::zero(tile)
#define _tile_dpbf16ps(c, a, b) ::longctx::cpu::detail::amx_emulation::dpbf16ps(c, a, b)
