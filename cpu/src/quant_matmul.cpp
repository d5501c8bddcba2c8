// The dispatch point of quant_matmul.h: activation quantization, the ISA
// table and the tile loop over the per-ISA row kernels (quant_dot.h).
#include "longctx/cpu/quant_matmul.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "longctx/core/cpu_features.h"
#include "longctx/core/error.h"
#include "quant_dot.h"

namespace longctx::cpu {
namespace {

// The group kernel of `isa` for `layout`, or null where it has none.
detail::QuantGroupFn group_fn(QuantIsa isa, QuantLayout layout, GgmlType type) {
  if (layout == QuantLayout::kRows16)
    return isa == QuantIsa::kAvx512Vnni ? detail::quant_rows16_avx512_vnni(type) : nullptr;
  if (layout != QuantLayout::kRows8) return nullptr;
  switch (isa) {
    case QuantIsa::kAvx2: return detail::quant_rows8_avx2(type);
    case QuantIsa::kAvxVnni: return detail::quant_rows8_avx_vnni(type);
    case QuantIsa::kAvx512Vnni: return detail::quant_rows8_avx512_vnni(type);
    case QuantIsa::kGeneric: break;
  }
  return nullptr;
}

detail::QuantRowsFn rows_fn(QuantIsa isa, GgmlType type) {
  switch (isa) {
    case QuantIsa::kAvx2: return detail::quant_rows_avx2(type);
    case QuantIsa::kAvxVnni: return detail::quant_rows_avx_vnni(type);
    case QuantIsa::kAvx512Vnni: return detail::quant_rows_avx512_vnni(type);
    case QuantIsa::kGeneric: break;
  }
  return detail::quant_rows_generic(type);
}

}  // namespace

const char* quant_isa_name(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kGeneric: return "generic";
    case QuantIsa::kAvx2: return "avx2";
    case QuantIsa::kAvxVnni: return "avx-vnni";
    case QuantIsa::kAvx512Vnni: return "avx512-vnni";
  }
  return "?";
}

std::vector<QuantIsa> supported_quant_isas() {
  const CpuFeatures& f = cpu_features();
  std::vector<QuantIsa> isas;
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2 && f.avx512vnni && f.avx512vl && f.avx512bw) isas.push_back(QuantIsa::kAvx512Vnni);
  if (avx2 && f.avx_vnni) isas.push_back(QuantIsa::kAvxVnni);
  if (avx2) isas.push_back(QuantIsa::kAvx2);
  isas.push_back(QuantIsa::kGeneric);
  return isas;
}

QuantIsa best_quant_isa() {
  static const QuantIsa best = supported_quant_isas().front();
  return best;
}

bool is_quant_matmul_type(GgmlType type) { return detail::quant_rows_generic(type) != nullptr; }

int64_t quant_act_block(GgmlType type) { return ggml_type_info(type).block_elems == 256 ? 256 : 32; }

void quantize_acts(const float* x, int64_t rows, int64_t k, int64_t ldx, int64_t block, QuantizedActs& out) {
  if ((block != 32 && block != 256) || k % block != 0 || rows < 0)
    fail(ErrorCode::kInvalidArgument, "quantize_acts: ", rows, " rows of ", k, " values in blocks of ", block,
         ": the block must be 32 or 256 and divide the row");
  out.rows = rows;
  out.k = k;
  out.block = block;
  out.q.resize(size_t(rows * k));
  out.d.resize(size_t(rows * (k / block)));
  out.dsum.assign(block == 32 ? size_t(rows * (k / 32)) : 0, 0.f);
  out.minus_sum4.resize(block == 32 ? size_t(rows * (k / 4)) : 0);
  out.minus_sum32.assign(size_t(rows * (k / 32)), 0);
  out.sum16.assign(block == 256 ? size_t(rows * (k / 16)) : 0, 0);
  out.minus_sum32_pairs.resize(block == 256 ? size_t(rows * (k / 256) * 4) : 0);
  auto quantize_row = [&](int64_t r) {
    int8_t* q = out.q.data() + r * k;
    float* d = out.d.data() + r * (k / block);
    detail::quantize_act_blocks(x + r * ldx, k / block, block, q, d);
    // One pass over the codes: sums of 4 (block 32 keeps them, negated),
    // added up to sums of 16.
    for (int64_t g = 0; g < k / 16; ++g) {
      int sum = 0;
      for (int t = 0; t < 4; ++t) {
        const int8_t* four = q + 16 * g + 4 * t;
        const int sum4 = four[0] + four[1] + four[2] + four[3];
        if (block == 32) out.minus_sum4[size_t(r * (k / 4) + 4 * g + t)] = -sum4;
        sum += sum4;
      }
      if (block == 256) out.sum16[size_t(r * (k / 16) + g)] = static_cast<int16_t>(sum);
      out.minus_sum32[size_t(r * (k / 32) + g / 2)] -= sum;
    }
    // d times the exact sum of 32 codes, one rounding: adding d times each
    // half's sum rounded twice, and lost most of its digits where the halves
    // nearly cancel.
    for (int64_t b = 0; block == 32 && b < k / 32; ++b)
      out.dsum[size_t(r * (k / 32) + b)] = d[b] * static_cast<float>(-out.minus_sum32[size_t(r * (k / 32) + b)]);
    for (int64_t b = 0; block == 256 && b < k / 256; ++b) {
      const int32_t* sub = out.minus_sum32.data() + r * (k / 32) + 8 * b;  // |sum| <= 32 * 127: int16
      for (int w = 0; w < 4; ++w) {
        const int first = w % 2 + 4 * (w / 2);  // sub-blocks 0, 1, 4, 5, each paired with the one two on
        out.minus_sum32_pairs[size_t((r * (k / 256) + b) * 4 + w)] =
            int32_t(uint32_t(uint16_t(sub[first])) | uint32_t(uint16_t(sub[first + 2])) << 16);
      }
    }
  };
  if (rows * k < (int64_t(1) << 16)) {  // decode: not worth a task
    for (int64_t r = 0; r < rows; ++r) quantize_row(r);
  } else {
    tbb::parallel_for(int64_t{0}, rows, quantize_row);
  }
}

namespace {

// The fields of a block in a group (quant_matmul.h): unit i of row r at
// field_start + G unit i + unit r for groups of G rows.
struct GroupField {
  int64_t unit, bytes;
};

std::span<const GroupField> group_fields(GgmlType type) {
  static constexpr GroupField kQ4_0[] = {{2, 2}, {4, 16}};
  static constexpr GroupField kQ8_0[] = {{2, 2}, {4, 32}};
  static constexpr GroupField kQ2_K[] = {{4, 16}, {4, 64}, {2, 2}, {2, 2}};
  static constexpr GroupField kQ3_K[] = {{4, 32}, {4, 64}, {4, 12}, {2, 2}};
  static constexpr GroupField kQ4_K[] = {{2, 2}, {2, 2}, {4, 12}, {4, 128}};
  static constexpr GroupField kQ5_K[] = {{2, 2}, {2, 2}, {4, 12}, {4, 32}, {4, 128}};
  static constexpr GroupField kQ6_K[] = {{4, 128}, {4, 64}, {4, 16}, {2, 2}};
  switch (type) {
    case GgmlType::kQ4_0: return kQ4_0;
    case GgmlType::kQ8_0: return kQ8_0;
    case GgmlType::kQ2_K: return kQ2_K;
    case GgmlType::kQ3_K: return kQ3_K;
    case GgmlType::kQ4_K: return kQ4_K;
    case GgmlType::kQ5_K: return kQ5_K;
    case GgmlType::kQ6_K: return kQ6_K;
    default: return {};
  }
}

// Row r's block copied out of the block of a group of g rows (GGML's layout).
void unpack_row_block(GgmlType type, int64_t g, int64_t r, const uint8_t* group_block, uint8_t* block) {
  int64_t at_row = 0, at_group = 0;
  for (const GroupField& f : group_fields(type)) {
    for (int64_t i = 0; i < f.bytes / f.unit; ++i)
      std::memcpy(block + at_row + f.unit * i, group_block + at_group + g * f.unit * i + f.unit * r, size_t(f.unit));
    at_row += f.bytes;
    at_group += g * f.bytes;
  }
}

}  // namespace

int64_t quant_group_rows(QuantLayout layout) {
  switch (layout) {
    case QuantLayout::kRows8: return 8;
    case QuantLayout::kRows16: return 16;
    case QuantLayout::kRows: break;
  }
  return 1;
}

QuantLayout preferred_quant_layout(GgmlType type, int64_t n) {
  if (group_fields(type).empty()) return QuantLayout::kRows;
  for (QuantLayout layout : {QuantLayout::kRows16, QuantLayout::kRows8})
    if (n % quant_group_rows(layout) == 0 && group_fn(best_quant_isa(), layout, type) != nullptr) return layout;
  return QuantLayout::kRows;
}

void pack_groups(GgmlType type, QuantLayout layout, const uint8_t* rows, int64_t n, int64_t k, uint8_t* packed) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  const int64_t nb = k / info.block_elems, row_bytes = nb * info.block_bytes, g_rows = quant_group_rows(layout);
  // At load, a model's weights: the groups split over the cores, each
  // written in order (its rows read side by side).
  tbb::parallel_for(int64_t{0}, n / g_rows, [&](int64_t g) {
    uint8_t* to = packed + g * g_rows * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = rows + g * g_rows * row_bytes + b * info.block_bytes;  // row 0's
      int64_t at_row = 0;
      for (const GroupField& f : group_fields(type)) {
        for (int64_t i = at_row; i < at_row + f.bytes; i += f.unit) {
          for (int64_t r = 0; r < g_rows; ++r, to += f.unit) {
            if (f.unit == 2) std::memcpy(to, block + r * row_bytes + i, 2);
            else std::memcpy(to, block + r * row_bytes + i, 4);
          }
        }
        at_row += f.bytes;
      }
    }
  });
}

void unpack_group_row(GgmlType type, QuantLayout layout, const uint8_t* packed, int64_t k, int64_t row,
                      uint8_t* plain) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  const int64_t nb = k / info.block_elems, row_bytes = nb * info.block_bytes, g = quant_group_rows(layout);
  for (int64_t b = 0; b < nb; ++b)
    unpack_row_block(type, g, row % g, packed + (row / g) * g * row_bytes + b * g * info.block_bytes,
                     plain + b * info.block_bytes);
}

void quant_matmul_tile(QuantIsa isa, GgmlType type, QuantLayout layout, const uint8_t* w, const QuantizedActs& acts,
                       int64_t r_begin, int64_t r_end, int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
  const detail::ActRows rows{acts.q.data(),     acts.d.data(),           acts.dsum.data(),
                             acts.minus_sum4.data(), acts.minus_sum32.data(), acts.sum16.data(),
                             acts.minus_sum32_pairs.data(), acts.k, acts.block};
  const int64_t row_bytes = int64_t(*ggml_bytes(type, acts.k));
  const detail::QuantRowsFn kernel = rows_fn(isa, type);
  const int64_t g = quant_group_rows(layout);
  const detail::QuantGroupFn group_kernel = group_fn(isa, layout, type);
  if (layout != QuantLayout::kRows && group_kernel == nullptr) {
    // An ISA without kernels for these groups: each group's rows unpacked, then the row kernel.
    std::vector<uint8_t> plain(size_t(g * row_bytes));
    for (int64_t o = o_begin; o < o_end; o += g) {
      for (int64_t i = 0; i < g; ++i) unpack_group_row(type, layout, w, acts.k, o + i, plain.data() + i * row_bytes);
      quant_matmul_tile(isa, type, QuantLayout::kRows, plain.data(), acts, r_begin, r_end, 0, g, y + o, ldy);
    }
    return;
  }
  // Activation rows outside: a few (four; eight for the k-quant group
  // kernels on AVX-512) stay in cache while the tile's weight rows stream past.
  const int64_t max_rows = group_kernel != nullptr ? detail::kQuantGroupMaxRows : detail::kQuantMaxRows;
  for (int64_t r = r_begin; r < r_end; r += max_rows) {
    const int n_rows = int(std::min<int64_t>(max_rows, r_end - r));
    if (group_kernel != nullptr) {
      for (int64_t o = o_begin; o < o_end; o += g)
        group_kernel(w + o * row_bytes, rows, r, n_rows, y + r * ldy + o, ldy);
    } else {
      for (int64_t o = o_begin; o < o_end; ++o) kernel(w + o * row_bytes, rows, r, n_rows, y + r * ldy + o, ldy);
    }
  }
}

}  // namespace longctx::cpu
