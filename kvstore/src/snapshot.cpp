// Snapshot save and load. The byte format and the validation order are
// specified in docs/snapshot-format.md; this file follows it section by section.
#include "longctx/kvstore/snapshot.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <utility>

#include "longctx/core/crc32c.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"

namespace longctx::kvstore {
namespace {

// ---- constants of format version 5 -------------------------------------------

constexpr char kMagic[8] = {'L', 'C', 'T', 'X', 'S', 'N', 'A', 'P'};
constexpr char kEndMagic[8] = {'L', 'C', 'T', 'X', 'E', 'N', 'D', '.'};
constexpr uint32_t kFormatVersion = 5;
// Versions 2 to 4 are still read: version 4 is version 5 with a q8_0 page's
// K codes channel by channel and V codes token by token, version 3 is
// version 4 with f16 representatives in q8_0 stores (q8_0 files of both are
// refused: their pages or records do not fit this build's), version 2 is
// version 3 without the q8_0 kv_type.
constexpr uint32_t kOldestVersion = 2;

constexpr size_t kFixedHeaderBytes = 92;   // magic .. fingerprint_bytes
constexpr size_t kCrcBytes = 4;
constexpr size_t kTrailerBytes = 16;       // end magic + u64 file size
constexpr size_t kMaxFingerprintBytes = 4096;

// Sanity bounds on header fields: far above any real model, low enough that
// every size computed from them fits in 64 bits (still computed checked).
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxKvHeads = 4096;
constexpr uint32_t kMaxHeadDim = 65536;
constexpr uint32_t kMaxBlockSize = uint32_t{1} << 24;
constexpr uint32_t kMaxRepNum = 65536;
constexpr uint64_t kMaxPageBytes = uint64_t{1} << 32;
constexpr uint64_t kMaxTokens = uint64_t{1} << 40;

constexpr size_t kMinHeaderBytes = kFixedHeaderBytes + 8 + kCrcBytes;  // 1 layer, no fingerprint
constexpr size_t kMaxHeaderBytes = kFixedHeaderBytes + kMaxFingerprintBytes + 8 * size_t{kMaxLayers} + kCrcBytes;

// Field offsets in the fixed part of the header.
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderBytes = 12;
constexpr size_t kOffFingerprintBytes = 88;

// ---- codes of enums in the file (independent of the C++ enum values) ---------

uint32_t dtype_code(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kBF16: return 2;
    case DType::kQ8_0: return 3;
  }
  fail(ErrorCode::kInternal, "snapshot: unknown dtype ", int(t));
}

std::optional<DType> dtype_from_code(uint32_t code) {
  switch (code) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kBF16;
    case 3: return DType::kQ8_0;
    default: return std::nullopt;
  }
}

uint32_t rep_type_code(RepresentativeType t) {
  switch (t) {
    case RepresentativeType::kMax: return 0;
    case RepresentativeType::kMean: return 1;
    case RepresentativeType::kQuest: return 2;
    case RepresentativeType::kFix: return 3;
    case RepresentativeType::kDynamic: return 4;
  }
  fail(ErrorCode::kInternal, "snapshot: unknown representative type ", int(t));
}

std::optional<RepresentativeType> rep_type_from_code(uint32_t code) {
  switch (code) {
    case 0: return RepresentativeType::kMax;
    case 1: return RepresentativeType::kMean;
    case 2: return RepresentativeType::kQuest;
    case 3: return RepresentativeType::kFix;
    case 4: return RepresentativeType::kDynamic;
    default: return std::nullopt;
  }
}

// ---- little-endian encoding --------------------------------------------------

void put_u32(std::vector<std::byte>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(std::byte(v >> (8 * i)));
}
void put_u64(std::vector<std::byte>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(std::byte(v >> (8 * i)));
}
uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

// The checksum of a block: CRC32C of its page bytes, then its record bytes,
// then the u64 file offset of the block, so a block moved to another place
// does not verify.
uint32_t block_crc(const std::byte* page, size_t page_bytes, const std::byte* record, size_t record_bytes,
                   uint64_t file_offset) {
  std::byte offset_le[8];
  for (int i = 0; i < 8; ++i) offset_le[i] = std::byte(file_offset >> (8 * i));
  return crc32c(offset_le, sizeof offset_le, crc32c(record, record_bytes, crc32c(page, page_bytes)));
}

// Where a store keeps block b's record: slot b % rpp of rep page b / rpp
// (kv_store.h). The packing is the store's own; the file does not depend on it.
std::byte* record_slot(const std::vector<std::byte*>& rep_pages, const StoreLayout& l, uint64_t block) {
  return rep_pages[size_t(block / l.records_per_rep_page)] + size_t(block % l.records_per_rep_page) * l.record_bytes;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// A fingerprint or magic as printable text: other bytes as \xNN, at most 200 bytes shown.
std::string printable(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > 200) out += "...";
  return out;
}

// ---- checked arithmetic (sizes of untrusted files) ---------------------------

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

// ---- block content (what append enforces) -----------------------------------

// Whether none of n values of `type` (f32, f16, bf16) is NaN, nor, with
// `finite`, infinite.
bool values_ok(const std::byte* p, size_t n, DType type, bool finite) {
  return (finite ? first_non_finite(p, type, n) : first_nan(p, type, n)) < 0;
}

// A block whose checksum is right can still hold what no store writes (a
// file edited and its checksums recomputed): a NaN or infinite K/V value or
// q8_0 scale, which append refuses and the next append to the block would
// compute representatives from (a NaN code: undefined behaviour), or a NaN in
// its record (sums may reach Inf, never NaN). The part that is wrong, or nullptr.
const char* bad_block_content(const StoreLayout& l, const std::byte* page, const std::byte* record) {
  const size_t bs = size_t(l.block_size), d = size_t(l.shape.head_dim), slots = size_t(l.rep_slots);
  if (l.kv_type == DType::kQ8_0) {
    const size_t scales = bs * (d / kQ8Group);
    if (!values_ok(page + l.page_k_scales, scales, DType::kF16, true)) return "a K scale of the page is NaN or Inf";
    if (!values_ok(page + l.page_v_scales, scales, DType::kF16, true)) return "a V scale of the page is NaN or Inf";
    if (!values_ok(record + slots * d, slots * (d / kQ8Group), DType::kF16, true))
      return "a representative key scale is NaN or Inf";
  } else {
    if (!values_ok(page, bs * d, l.kv_type, true)) return "a key of the page is NaN or Inf";
    if (!values_ok(page + l.page_v, bs * d, l.kv_type, true)) return "a value of the page is NaN or Inf";
    if (!values_ok(record, slots * d, l.kv_type, false)) return "a representative key is NaN";
  }
  if (l.record_sum_offset != 0 && !values_ok(record + l.record_sum_offset, d, DType::kF32, false))
    return "the MEAN sum is NaN";
  if (l.record_importance_offset != 0 && !values_ok(record + l.record_importance_offset, bs, DType::kF32, false))
    return "a DYNAMIC importance is NaN";
  if (l.record_tail_offset != 0 && !values_ok(record + l.record_tail_offset, 3 * d, DType::kF32, false))
    return "a tail sum is NaN";
  return nullptr;
}

// ---- the header --------------------------------------------------------------

struct Header {
  uint32_t header_bytes = 0;
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 0;
  uint32_t kv_type = 0;   // code, see dtype_code
  uint32_t rep_type = 0;  // code, see rep_type_code
  uint32_t rep_num = 0;
  uint32_t rep_slots = 0;
  uint64_t page_bytes = 0;
  uint64_t record_bytes = 0;
  uint64_t record_sum_offset = 0;
  uint64_t record_importance_offset = 0;
  uint64_t record_offsets_offset = 0;
  std::string fingerprint;
  std::vector<uint64_t> n_tokens;  // per layer
};

Header header_of(const KVStore& store, const std::string& fingerprint) {
  const StoreLayout& l = store.layout();
  Header h;
  h.n_layers = uint32_t(l.shape.n_layers);
  h.n_kv_heads = uint32_t(l.shape.n_kv_heads);
  h.head_dim = uint32_t(l.shape.head_dim);
  h.block_size = uint32_t(l.block_size);
  h.kv_type = dtype_code(l.kv_type);
  h.rep_type = rep_type_code(l.rep_type);
  h.rep_num = uint32_t(l.rep_num);
  h.rep_slots = uint32_t(l.rep_slots);
  h.page_bytes = l.page_bytes;
  h.record_bytes = l.record_bytes;
  h.record_sum_offset = l.record_sum_offset;
  h.record_importance_offset = l.record_importance_offset;
  h.record_offsets_offset = l.record_offsets_offset;
  h.fingerprint = fingerprint;
  for (int layer = 0; layer < l.shape.n_layers; ++layer) h.n_tokens.push_back(uint64_t(store.n_tokens(layer)));
  h.header_bytes = uint32_t(kFixedHeaderBytes + h.fingerprint.size() + 8 * h.n_tokens.size() + kCrcBytes);
  return h;
}

std::vector<std::byte> encode_header(const Header& h) {
  std::vector<std::byte> out;
  out.reserve(h.header_bytes);
  for (char c : kMagic) out.push_back(std::byte(c));
  put_u32(out, kFormatVersion);
  put_u32(out, h.header_bytes);
  for (uint32_t v : {h.n_layers, h.n_kv_heads, h.head_dim, h.block_size, h.kv_type, h.rep_type, h.rep_num,
                     h.rep_slots}) {
    put_u32(out, v);
  }
  for (uint64_t v : {h.page_bytes, h.record_bytes, h.record_sum_offset, h.record_importance_offset,
                     h.record_offsets_offset}) {
    put_u64(out, v);
  }
  put_u32(out, uint32_t(h.fingerprint.size()));
  for (char c : h.fingerprint) out.push_back(std::byte(c));
  for (uint64_t n : h.n_tokens) put_u64(out, n);
  put_u32(out, crc32c(out.data(), out.size()));
  if (out.size() != h.header_bytes) {
    fail(ErrorCode::kInternal, "snapshot header: encoded ", out.size(), " bytes, expected ", h.header_bytes);
  }
  return out;
}

// ---- the body plan: where each (layer, kv head)'s blocks are ------------------

// Body order: layer-major, then kv head, then block; each block is its page,
// its representative record and the u32 checksum of both.
struct HeadPlan {
  uint64_t n_blocks = 0;
  uint64_t offset = 0;  // file offset of its first block
};

struct BodyPlan {
  std::vector<HeadPlan> heads;  // [layer * n_kv_heads + kv_head]
  uint64_t trailer_offset = 0;
  uint64_t file_bytes = 0;
};

// Returns nullopt when a size overflows 64 bits (only a crafted header can do that).
std::optional<BodyPlan> plan_body(const Header& h) {
  BodyPlan plan;
  uint64_t offset = h.header_bytes;
  const uint64_t block_stride = h.page_bytes + h.record_bytes + kCrcBytes;  // < 2^34 by the field bounds
  for (uint32_t layer = 0; layer < h.n_layers; ++layer) {
    const uint64_t n_blocks = (h.n_tokens[layer] + h.block_size - 1) / h.block_size;
    uint64_t head_bytes = 0;
    if (!checked_mul(n_blocks, block_stride, head_bytes)) return std::nullopt;
    for (uint32_t head = 0; head < h.n_kv_heads; ++head) {
      plan.heads.push_back(HeadPlan{n_blocks, offset});
      if (!checked_add(offset, head_bytes, offset)) return std::nullopt;
    }
  }
  plan.trailer_offset = offset;
  if (!checked_add(offset, kTrailerBytes, plan.file_bytes)) return std::nullopt;
  return plan;
}

// ---- load-side validation ------------------------------------------------------

[[noreturn]] void fail_header_field(const std::string& path, const std::string& field, uint64_t value,
                                   const std::string& why) {
  fail(ErrorCode::kCorrupt, "snapshot ", path, ": header field ", field, " = ", value, " ", why);
}

void check_range(const std::string& path, const char* field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) fail_header_field(path, field, value, str_cat("outside [", lo, ", ", hi, "]"));
}

// Step 6: bounds of every field and their consistency, before any size is
// computed from them.
void check_header_fields(const Header& h, uint32_t fingerprint_bytes, const std::string& path) {
  check_range(path, "fingerprint_bytes", fingerprint_bytes, 0, kMaxFingerprintBytes);
  check_range(path, "n_layers", h.n_layers, 1, kMaxLayers);
  const uint64_t expected_header_bytes = kFixedHeaderBytes + fingerprint_bytes + 8 * uint64_t{h.n_layers} + kCrcBytes;
  if (h.header_bytes != expected_header_bytes) {
    fail_header_field(path, "header_bytes", h.header_bytes,
                      str_cat("does not match ", fingerprint_bytes, " fingerprint bytes and ", h.n_layers,
                              " layers (expected ", expected_header_bytes, ")"));
  }
  check_range(path, "n_kv_heads", h.n_kv_heads, 1, kMaxKvHeads);
  check_range(path, "head_dim", h.head_dim, 1, kMaxHeadDim);
  check_range(path, "block_size", h.block_size, 1, kMaxBlockSize);
  const std::optional<DType> kv_type = dtype_from_code(h.kv_type);
  if (!kv_type) fail_header_field(path, "kv_type", h.kv_type, "is not a dtype code (0 f32, 1 f16, 2 bf16, 3 q8_0)");
  if (!rep_type_from_code(h.rep_type)) {
    fail_header_field(path, "rep_type", h.rep_type, "is not a representative type code (0..4)");
  }
  check_range(path, "rep_num", h.rep_num, 0, kMaxRepNum);
  check_range(path, "rep_slots", h.rep_slots, 1, kMaxRepNum);
  // Pages and records hold at least their vectors, in multiples of 64 bytes
  // (the products stay below 2^48 by the bounds above).
  if (*kv_type == DType::kQ8_0 && h.head_dim % kQ8Group != 0)
    fail_header_field(path, "head_dim", h.head_dim, "is not a multiple of 32, which kv_type q8_0 needs");
  const uint64_t kv_bytes = 2 * uint64_t{h.block_size} * kv_vector_bytes(*kv_type, int(h.head_dim));
  check_range(path, "page_bytes", h.page_bytes, kv_bytes, kMaxPageBytes);
  if (h.page_bytes % 64 != 0) fail_header_field(path, "page_bytes", h.page_bytes, "is not a multiple of 64");
  const uint64_t keys_bytes = uint64_t{h.rep_slots} * kv_vector_bytes(*kv_type, int(h.head_dim));
  check_range(path, "record_bytes", h.record_bytes, keys_bytes, kMaxPageBytes);
  if (h.record_bytes % 64 != 0) fail_header_field(path, "record_bytes", h.record_bytes, "is not a multiple of 64");
  check_range(path, "record_sum_offset", h.record_sum_offset, 0, h.record_bytes - 1);
  check_range(path, "record_importance_offset", h.record_importance_offset, 0, h.record_bytes - 1);
  check_range(path, "record_offsets_offset", h.record_offsets_offset, 0, h.record_bytes - 1);
}

// Steps 1-6 of the validation order: size, magic, version, header size,
// header CRC, then the fields (check_header_fields).
Header read_header(std::span<const std::byte> file, const std::string& path) {
  if (file.size() < kMinHeaderBytes + kTrailerBytes) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": size ", file.size(), ", expected at least ",
         kMinHeaderBytes + kTrailerBytes, " (header and trailer of a snapshot)");
  }
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": not a longctx KV snapshot (starts with '",
         printable(std::string_view(reinterpret_cast<const char*>(file.data()), sizeof kMagic)), "', expected '",
         std::string_view(kMagic, sizeof kMagic), "')");
  }
  const uint32_t version = get_u32(file.data() + kOffVersion);
  if (version < kOldestVersion || version > kFormatVersion) {
    fail(ErrorCode::kUnsupported, "snapshot ", path, ": format version ", version, ", this build reads versions ",
         kOldestVersion, " to ", kFormatVersion);
  }
  Header h;
  h.header_bytes = get_u32(file.data() + kOffHeaderBytes);
  if (h.header_bytes < kMinHeaderBytes || h.header_bytes > kMaxHeaderBytes) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": header size ", h.header_bytes, " outside [", kMinHeaderBytes,
         ", ", kMaxHeaderBytes, "]");
  }
  if (file.size() < uint64_t{h.header_bytes} + kTrailerBytes) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": size ", file.size(), ", expected at least ",
         uint64_t{h.header_bytes} + kTrailerBytes, " (header of ", h.header_bytes, " bytes and trailer)");
  }
  const size_t crc_at = h.header_bytes - kCrcBytes;
  const uint32_t stored_crc = get_u32(file.data() + crc_at);
  const uint32_t computed_crc = crc32c(file.data(), crc_at);
  if (stored_crc != computed_crc) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": header checksum mismatch (stored ", hex32(stored_crc),
         ", computed ", hex32(computed_crc), " over bytes [0, ", crc_at, "))");
  }

  const std::byte* p = file.data() + 16;
  uint32_t* const u32_fields[] = {&h.n_layers, &h.n_kv_heads, &h.head_dim, &h.block_size,
                                  &h.kv_type,  &h.rep_type,   &h.rep_num,  &h.rep_slots};
  for (uint32_t* f : u32_fields) {
    *f = get_u32(p);
    p += 4;
  }
  uint64_t* const u64_fields[] = {&h.page_bytes, &h.record_bytes, &h.record_sum_offset,
                                  &h.record_importance_offset, &h.record_offsets_offset};
  for (uint64_t* f : u64_fields) {
    *f = get_u64(p);
    p += 8;
  }
  const uint32_t fingerprint_bytes = get_u32(file.data() + kOffFingerprintBytes);

  check_header_fields(h, fingerprint_bytes, path);
  if (version == 2 && h.kv_type == dtype_code(DType::kQ8_0))
    fail_header_field(path, "kv_type", h.kv_type, "is q8_0, which format version 2 does not hold");
  if (version == 3 && h.kv_type == dtype_code(DType::kQ8_0))
    fail(ErrorCode::kUnsupported, "snapshot ", path, ": format version 3 with kv_type q8_0 keeps its representatives "
         "in f16, this build keeps them in q8_0 (version 4); prefill the context again to rebuild it");
  if (version == 4 && h.kv_type == dtype_code(DType::kQ8_0))
    fail(ErrorCode::kUnsupported, "snapshot ", path, ": format version 4 with kv_type q8_0 keeps the key codes "
         "channel by channel and the value codes token by token, this build keeps them in quads (version 5); prefill "
         "the context again to rebuild it");

  p = file.data() + kFixedHeaderBytes;
  h.fingerprint.assign(reinterpret_cast<const char*>(p), fingerprint_bytes);
  p += fingerprint_bytes;
  for (uint32_t layer = 0; layer < h.n_layers; ++layer, p += 8) {
    const uint64_t n = get_u64(p);
    if (n > kMaxTokens) {
      fail_header_field(path, str_cat("n_tokens[", layer, "]"), n, str_cat("exceeds ", kMaxTokens));
    }
    h.n_tokens.push_back(n);
  }
  return h;
}

// Step 7: the snapshot's layout against the store's; every differing field is named.
void check_layout(const Header& h, const StoreLayout& l, const std::string& path) {
  std::string diffs;
  auto field = [&](const char* name, uint64_t file_value, uint64_t store_value) {
    if (file_value != store_value) {
      diffs += str_cat(diffs.empty() ? "" : ", ", name, " ", file_value, " vs ", store_value);
    }
  };
  field("n_layers", h.n_layers, uint64_t(l.shape.n_layers));
  field("n_kv_heads", h.n_kv_heads, uint64_t(l.shape.n_kv_heads));
  field("head_dim", h.head_dim, uint64_t(l.shape.head_dim));
  field("block_size", h.block_size, uint64_t(l.block_size));
  if (h.kv_type != dtype_code(l.kv_type)) {
    diffs += str_cat(diffs.empty() ? "" : ", ", "kv_type ", dtype_name(*dtype_from_code(h.kv_type)), " vs ",
                     dtype_name(l.kv_type));
  }
  if (h.rep_type != rep_type_code(l.rep_type)) {
    diffs += str_cat(diffs.empty() ? "" : ", ", "representative_type ",
                     representative_type_name(*rep_type_from_code(h.rep_type)), " vs ",
                     representative_type_name(l.rep_type));
  }
  field("representative_num", h.rep_num, uint64_t(l.rep_num));
  field("rep_slots", h.rep_slots, uint64_t(l.rep_slots));
  field("page_bytes", h.page_bytes, l.page_bytes);
  field("record_bytes", h.record_bytes, l.record_bytes);
  field("record_sum_offset", h.record_sum_offset, l.record_sum_offset);
  field("record_importance_offset", h.record_importance_offset, l.record_importance_offset);
  field("record_offsets_offset", h.record_offsets_offset, l.record_offsets_offset);
  if (!diffs.empty()) {
    // The records hold the tail sums only with tail: estimate, which makes them larger.
    const std::string hint =
        h.record_bytes != l.record_bytes
            ? (l.record_tail_offset != 0
                   ? " (this store keeps the tail sums of tail: estimate in its records; a snapshot saved with tail: "
                     "drop has none: load it with tail: drop, or prefill again)"
                   : " (if the snapshot was saved with tail: estimate, its records hold tail sums: load it with "
                     "tail: estimate)")
            : "";
    fail(ErrorCode::kInvalidArgument, "snapshot ", path,
         ": its layout differs from this store's (snapshot vs store): ", diffs, hint);
  }
}

// The snapshot's bytes, read into memory (kRead) or mapped (kMmap).
class SnapshotFile {
 public:
  SnapshotFile(const std::string& path, LoadMode mode) {
    if (mode == LoadMode::kMmap) {
      map_.emplace(path);
      bytes_ = std::span<const std::byte>(map_->data(), map_->size());
    } else {
      buffer_ = read_file(path);
      bytes_ = std::span<const std::byte>(buffer_.data(), buffer_.size());
    }
  }
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  std::vector<std::byte> buffer_;
  std::optional<MappedFile> map_;
  std::span<const std::byte> bytes_;
};

// One block of the body: whose it is and where it is in the file.
struct BlockRef {
  uint32_t layer;
  uint32_t kv_head;
  uint64_t block;
  uint64_t offset;  // file offset of the page; the record follows it, then the CRC
};

// Calls visit(BlockRef) for every block of one (layer, kv head) in file order.
template <typename F>
void for_each_block(const Header& h, const HeadPlan& head, uint32_t layer, uint32_t kv_head, F&& visit) {
  uint64_t offset = head.offset;
  for (uint64_t b = 0; b < head.n_blocks; ++b, offset += h.page_bytes + h.record_bytes + kCrcBytes) {
    visit(BlockRef{layer, kv_head, b, offset});
  }
}

[[noreturn]] void fail_block_crc(const std::string& path, const Header& h, const BlockRef& block, uint32_t stored,
                                 uint32_t computed, const char* when) {
  fail(ErrorCode::kCorrupt, "snapshot ", path, ": layer ", block.layer, " kv head ", block.kv_head, " block ",
       block.block, ": checksum mismatch", when, " (block at file offset ", block.offset, ", page of ", h.page_bytes,
       " bytes and record of ", h.record_bytes, " bytes; stored ", hex32(stored), ", computed ", hex32(computed), ")");
}

// Frees every page taken so far if the load does not reach install().
class PendingPages {
 public:
  PendingPages(KVStore& store, size_t n_heads, int n_kv_heads)
      : store_(store), n_kv_heads_(n_kv_heads), pages_(n_heads), rep_pages_(n_heads) {}
  PendingPages(const PendingPages&) = delete;
  PendingPages& operator=(const PendingPages&) = delete;
  ~PendingPages() {
    for (size_t i = 0; i < pages_.size(); ++i) {
      const int kv_head = int(i % size_t(n_kv_heads_));
      if (!pages_[i].empty()) SnapshotAccess::release_pages(store_, kv_head, pages_[i]);
      if (!rep_pages_[i].empty()) SnapshotAccess::release_rep_pages(store_, kv_head, rep_pages_[i]);
    }
  }
  std::vector<std::vector<std::byte*>>& pages() { return pages_; }
  std::vector<std::vector<std::byte*>>& rep_pages() { return rep_pages_; }
  // The pages now belong to the store: nothing is released on destruction.
  void dismiss() {
    pages_.clear();
    rep_pages_.clear();
  }

 private:
  KVStore& store_;
  int n_kv_heads_;
  std::vector<std::vector<std::byte*>> pages_;      // [layer * n_kv_heads + kv_head]
  std::vector<std::vector<std::byte*>> rep_pages_;
};

// ---- save-side buffering -----------------------------------------------------

// Groups small writes (checksums, header) into large ones.
class BufferedSink {
 public:
  explicit BufferedSink(FileSink& sink) : sink_(sink) { buffer_.reserve(kCapacity); }
  void write(const void* data, size_t n) {
    if (buffer_.size() + n > kCapacity) flush();
    if (n >= kCapacity) {
      sink_.write(data, n);
    } else {
      const auto* bytes = static_cast<const std::byte*>(data);
      buffer_.insert(buffer_.end(), bytes, bytes + n);
    }
    written_ += n;
  }
  void write_u32(uint32_t v) {
    std::byte le[4];
    for (int i = 0; i < 4; ++i) le[i] = std::byte(v >> (8 * i));
    write(le, sizeof le);
  }
  void flush() {
    if (!buffer_.empty()) sink_.write(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  uint64_t written() const { return written_; }

 private:
  static constexpr size_t kCapacity = size_t{1} << 20;
  FileSink& sink_;
  std::vector<std::byte> buffer_;
  uint64_t written_ = 0;
};

}  // namespace

void save_snapshot(const KVStore& store, const std::string& path, const std::string& fingerprint) {
  if (fingerprint.size() > kMaxFingerprintBytes) {
    fail(ErrorCode::kInvalidArgument, "save_snapshot ", path, ": fingerprint of ", fingerprint.size(),
         " bytes, at most ", kMaxFingerprintBytes, " allowed");
  }
  const StoreLayout& layout = store.layout();
  const Header h = header_of(store, fingerprint);
  const std::optional<BodyPlan> plan = plan_body(h);
  if (!plan) fail(ErrorCode::kInternal, "save_snapshot ", path, ": snapshot size overflows 64 bits");

  // The store's page lists must match its token counts (checked before any file exists).
  for (uint32_t layer = 0; layer < h.n_layers; ++layer) {
    for (uint32_t head = 0; head < h.n_kv_heads; ++head) {
      const uint64_t n_blocks = plan->heads[size_t(layer) * h.n_kv_heads + head].n_blocks;
      const uint64_t n_rep_expected = (n_blocks + layout.records_per_rep_page - 1) / layout.records_per_rep_page;
      const size_t n_pages = SnapshotAccess::pages(store, int(layer), int(head)).size();
      const size_t n_rep = SnapshotAccess::rep_pages(store, int(layer), int(head)).size();
      if (n_pages != n_blocks || n_rep != n_rep_expected) {
        fail(ErrorCode::kInternal, "save_snapshot: layer ", layer, " kv head ", head, " holds ", n_pages,
             " block pages and ", n_rep, " rep pages for ", h.n_tokens[layer], " tokens (expected ", n_blocks,
             " and ", n_rep_expected, ")");
      }
    }
  }

  const std::vector<std::byte> header = encode_header(h);
  write_file_atomically(path, [&](FileSink& file) {
    BufferedSink out(file);
    out.write(header.data(), header.size());
    for (uint32_t layer = 0; layer < h.n_layers; ++layer) {
      for (uint32_t head = 0; head < h.n_kv_heads; ++head) {
        const auto& pages = SnapshotAccess::pages(store, int(layer), int(head));
        const auto& rep_pages = SnapshotAccess::rep_pages(store, int(layer), int(head));
        for_each_block(h, plan->heads[size_t(layer) * h.n_kv_heads + head], layer, head, [&](const BlockRef& b) {
          const std::byte* page = pages[size_t(b.block)];
          const std::byte* record = record_slot(rep_pages, layout, b.block);
          if (out.written() != b.offset) fail(ErrorCode::kInternal, "save_snapshot: block offset drifted");
          out.write(page, h.page_bytes);
          out.write(record, h.record_bytes);
          out.write_u32(block_crc(page, h.page_bytes, record, h.record_bytes, b.offset));
        });
      }
    }
    if (out.written() != plan->trailer_offset) fail(ErrorCode::kInternal, "save_snapshot: trailer offset drifted");
    std::vector<std::byte> trailer;
    for (char c : kEndMagic) trailer.push_back(std::byte(c));
    put_u64(trailer, plan->file_bytes);
    out.write(trailer.data(), trailer.size());
    out.flush();
  });
}

std::string read_snapshot_fingerprint(const std::string& path) {
  const SnapshotFile file(path, LoadMode::kMmap);  // the header's pages only are read
  return read_header(file.bytes(), path).fingerprint;
}

void load_snapshot(KVStore& store, const std::string& path, const std::string& expected_fingerprint,
                   LoadMode mode, bool equal_layers) {
  const SnapshotFile file(path, mode);
  const std::span<const std::byte> bytes = file.bytes();

  // Steps 1-6: header.
  const Header h = read_header(bytes, path);
  const std::optional<BodyPlan> plan = plan_body(h);
  if (!plan) fail(ErrorCode::kCorrupt, "snapshot ", path, ": token counts give a file size beyond 64 bits");

  // Steps 7-9: does it belong to this store?
  const StoreLayout& layout = store.layout();
  check_layout(h, layout, path);
  if (h.fingerprint != expected_fingerprint) {
    fail(ErrorCode::kInvalidArgument, "snapshot ", path, " was made for model '", printable(h.fingerprint),
         "', this store serves '", printable(expected_fingerprint), "'");
  }
  const int64_t max_seq_len = store.config().max_seq_len;
  for (uint32_t layer = 0; layer < h.n_layers; ++layer) {
    if (h.n_tokens[layer] > uint64_t(std::max<int64_t>(max_seq_len, 0))) {
      fail(ErrorCode::kInvalidArgument, "snapshot ", path, ": layer ", layer, " holds ", h.n_tokens[layer],
           " tokens, more than this store's max_seq_len ", max_seq_len);
    }
    if (equal_layers && h.n_tokens[layer] != h.n_tokens[0]) {
      fail(ErrorCode::kInvalidArgument, "snapshot ", path, ": layer ", layer, " holds ", h.n_tokens[layer],
           " tokens, layer 0 holds ", h.n_tokens[0], " (a model's sequence holds as many in every layer)");
    }
  }

  // Steps 10-12: exact size, trailer, every block checksum.
  if (bytes.size() != plan->file_bytes) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": size ", bytes.size(), ", expected ", plan->file_bytes);
  }
  const std::byte* trailer = bytes.data() + plan->trailer_offset;
  if (std::memcmp(trailer, kEndMagic, sizeof kEndMagic) != 0 || get_u64(trailer + 8) != plan->file_bytes) {
    fail(ErrorCode::kCorrupt, "snapshot ", path, ": trailer at file offset ", plan->trailer_offset,
         " is damaged (expected '", std::string_view(kEndMagic, sizeof kEndMagic), "' and file size ",
         plan->file_bytes, ")");
  }
  std::vector<uint32_t> crcs;  // in file order, to re-check the copies of a mapped file
  for (uint32_t layer = 0; layer < h.n_layers; ++layer) {
    for (uint32_t head = 0; head < h.n_kv_heads; ++head) {
      for_each_block(h, plan->heads[size_t(layer) * h.n_kv_heads + head], layer, head, [&](const BlockRef& b) {
        const std::byte* page = bytes.data() + b.offset;
        const std::byte* record = page + h.page_bytes;
        const uint32_t stored = get_u32(record + h.record_bytes);
        const uint32_t computed = block_crc(page, h.page_bytes, record, h.record_bytes, b.offset);
        if (stored != computed) fail_block_crc(path, h, b, stored, computed, "");
        if (const char* bad = bad_block_content(layout, page, record)) {
          fail(ErrorCode::kCorrupt, "snapshot ", path, ": layer ", b.layer, " kv head ", b.kv_head, " block ",
               b.block, " (file offset ", b.offset, "): ", bad, ", which no store holds");
        }
        crcs.push_back(stored);
      });
    }
  }

  // Everything checked: take all pages (all or nothing), copy, install. Rep
  // pages are packed the way this store packs them; they come zeroed, so the
  // slots past the last block are zero as in a store that appended its tokens.
  const size_t n_heads = plan->heads.size();
  PendingPages pending(store, n_heads, int(h.n_kv_heads));
  for (size_t i = 0; i < n_heads; ++i) {
    const int kv_head = int(i % h.n_kv_heads);
    const uint64_t n_blocks = plan->heads[i].n_blocks;
    if (n_blocks == 0) continue;
    const uint64_t n_rep_pages = (n_blocks + layout.records_per_rep_page - 1) / layout.records_per_rep_page;
    pending.pages()[i] = SnapshotAccess::allocate_pages(store, kv_head, size_t(n_blocks));
    pending.rep_pages()[i] = SnapshotAccess::allocate_rep_pages(store, kv_head, size_t(n_rep_pages));
  }
  // A mapped file can change under us after validation: the copies are checked again.
  const bool recheck = mode == LoadMode::kMmap;
  size_t crc_index = 0;
  for (uint32_t layer = 0; layer < h.n_layers; ++layer) {
    for (uint32_t head = 0; head < h.n_kv_heads; ++head) {
      const size_t i = size_t(layer) * h.n_kv_heads + head;
      for_each_block(h, plan->heads[i], layer, head, [&](const BlockRef& b) {
        std::byte* page = pending.pages()[i][size_t(b.block)];
        std::byte* record = record_slot(pending.rep_pages()[i], layout, b.block);
        std::memcpy(page, bytes.data() + b.offset, h.page_bytes);
        std::memcpy(record, bytes.data() + b.offset + h.page_bytes, h.record_bytes);
        const uint32_t expected = crcs[crc_index++];
        if (recheck) {
          const uint32_t computed = block_crc(page, h.page_bytes, record, h.record_bytes, b.offset);
          if (computed != expected) fail_block_crc(path, h, b, expected, computed, " (file changed while loading)");
        }
      });
    }
  }
  std::vector<int64_t> n_tokens(h.n_tokens.begin(), h.n_tokens.end());
  // install() gets copies of the lists so the pages are still released if it throws.
  SnapshotAccess::install(store, pending.pages(), pending.rep_pages(), std::move(n_tokens));
  pending.dismiss();
}

}  // namespace longctx::kvstore
