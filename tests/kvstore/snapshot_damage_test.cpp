// Snapshots: rejection of damaged files (a byte flip at every offset, a
// truncation to every length, moved or duplicated blocks, crafted headers, in
// the documented order of validation) with the target store left exactly as
// it was.
#include "longctx/kvstore/snapshot.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "snapshot_fixture.h"

namespace longctx::kvstore {
namespace {

using namespace snapshot_testing;

// ---- damaged files ----------------------------------------------------------------

// Loads `file` after flipping each byte at `positions` with `mask` (one at a
// time, restored after): every load must fail with the code the format gives
// (kUnsupported for the version field, unless the flip makes it 2, the other
// version read, whose header checksum then fails: kCorrupt, as elsewhere)
// naming the file.
void expect_flips_rejected(KVStore& target, const std::string& file, const std::vector<std::byte>& original,
                           const std::vector<size_t>& positions, std::byte mask, LoadMode mode) {
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << file;
  auto set_byte = [&](size_t i, std::byte b) { ASSERT_EQ(::pwrite(fd, &b, 1, off_t(i)), 1); };
  for (size_t i : positions) {
    set_byte(i, original[i] ^ mask);
    try {
      load_snapshot(target, file, kFingerprint, mode);
      ADD_FAILURE() << "flip of byte " << i << " with mask " << int(mask) << " was accepted";
    } catch (const Error& e) {
      std::vector<std::byte> flipped(original.begin() + kVersionAt, original.begin() + kVersionAt + 4);
      if (i >= kVersionAt && i < kVersionAt + 4) flipped[i - kVersionAt] ^= mask;
      // A flip to another version this build reads fails the header checksum instead.
      const uint64_t version = get_le(flipped, 0, 4);
      const bool version_field = i >= kVersionAt && i < kVersionAt + 4 && (version < 2 || version > 5);
      const ErrorCode expected = version_field ? ErrorCode::kUnsupported : ErrorCode::kCorrupt;
      if (e.code() != expected || std::string(e.what()).find(file) == std::string::npos) {
        ADD_FAILURE() << "byte " << i << ": " << error_code_name(e.code()) << ": " << e.what();
      }
    }
    set_byte(i, original[i]);
  }
  ::close(fd);
}

// Cuts the file to each of `lengths` (any order) and loads it: every load
// must fail with "size L, expected ..." (mmap of an empty file may fail to map).
void expect_truncations_rejected(KVStore& target, const std::string& file, const std::vector<std::byte>& original,
                                 std::vector<size_t> lengths, LoadMode mode) {
  std::sort(lengths.rbegin(), lengths.rend());  // cut shorter and shorter
  write_bytes(file, original);
  for (size_t len : lengths) {
    ASSERT_LT(len, original.size());
    ASSERT_EQ(::truncate(file.c_str(), off_t(len)), 0);
    try {
      load_snapshot(target, file, kFingerprint, mode);
      ADD_FAILURE() << "truncation to " << len << " bytes was accepted";
    } catch (const Error& e) {
      const bool size_error =
          e.code() == ErrorCode::kCorrupt && std::string(e.what()).find(str_cat(file, ": size ", len, ", expected")) !=
                                                 std::string::npos;
      if (!size_error && !(len == 0 && mode == LoadMode::kMmap && e.code() == ErrorCode::kIo)) {
        ADD_FAILURE() << "length " << len << ": " << error_code_name(e.code()) << ": " << e.what();
      }
    }
  }
  write_bytes(file, original);
}

// Every byte position (and truncation length) of a file of `size` bytes.
std::vector<size_t> all_positions(size_t size) {
  std::vector<size_t> positions(size);
  for (size_t i = 0; i < size; ++i) positions[i] = i;
  return positions;
}

std::vector<size_t> every_nth(const std::vector<size_t>& v, size_t n) {
  std::vector<size_t> out;
  for (size_t i = 0; i < v.size(); i += n) out.push_back(v[i]);
  return out;
}

class SnapshotDamage : public SnapshotTest, public ::testing::WithParamInterface<RepresentativeType> {};

TEST_P(SnapshotDamage, ByteFlipsAreRejectedAndLeaveTheStoreUnchanged) {
  const LongContextConfig cfg = small_config(GetParam());
  auto source = make_store(cfg);
  fill_source(*source, 700);
  const std::string file = path("flip.snap");
  save_snapshot(*source, file, kFingerprint);
  const std::vector<std::byte> original = read_bytes(file);
  auto target = make_store(cfg);
  fill_target(*target, 800);
  const StoreImage before = image_of(*target);

  // A few KiB: header, 12 blocks (page + record + CRC each), trailer.
  ASSERT_GT(original.size(), 1000u);
  ASSERT_LT(original.size(), 16384u) << "the damage tests expect a snapshot of a few KiB";
  const std::vector<size_t> positions = all_positions(original.size());
  expect_flips_rejected(*target, file, original, positions, std::byte{0xFF}, LoadMode::kRead);
  expect_flips_rejected(*target, file, original, positions, std::byte{0x80}, LoadMode::kRead);
  expect_flips_rejected(*target, file, original, positions, std::byte{0x01}, LoadMode::kMmap);
  expect_unchanged(*target, before, "after rejected loads");
  ASSERT_TRUE(read_bytes(file) == original);
  load_snapshot(*target, file, kFingerprint);  // the restored file loads
  expect_same_content(*target, *source);
}

TEST_P(SnapshotDamage, TruncationsAndTrailingBytesAreRejectedUpFront) {
  const LongContextConfig cfg = small_config(GetParam());
  auto source = make_store(cfg);
  fill_source(*source, 900);
  const std::string file = path("cut.snap");
  save_snapshot(*source, file, kFingerprint);
  const std::vector<std::byte> original = read_bytes(file);
  auto target = make_store(cfg);
  fill_target(*target, 1000);
  const StoreImage before = image_of(*target);

  for (size_t extra : {size_t{1}, size_t{4096}}) {
    std::vector<std::byte> longer = original;
    longer.resize(original.size() + extra, std::byte{0x5A});
    write_bytes(file, longer);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      const Error e = error_from([&] { load_snapshot(*target, file, kFingerprint, mode); });
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
      EXPECT_NE(std::string(e.what()).find(str_cat("size ", longer.size(), ", expected ", original.size())),
                std::string::npos)
          << e.what();
    }
  }
  const std::vector<size_t> lengths = all_positions(original.size());  // 0 .. size - 1
  expect_truncations_rejected(*target, file, original, lengths, LoadMode::kRead);
  expect_truncations_rejected(*target, file, original, every_nth(lengths, 5), LoadMode::kMmap);  // 0 included
  expect_unchanged(*target, before, "after truncated loads");
}

INSTANTIATE_TEST_SUITE_P(Types, SnapshotDamage,
                         ::testing::Values(RepresentativeType::kQuest, RepresentativeType::kDynamic,
                                           RepresentativeType::kMean),
                         [](const ::testing::TestParamInfo<RepresentativeType>& p) {
                           return std::string(representative_type_name(p.param));
                         });

// Whole blocks (page, record and their own valid CRC) moved inside the file:
// the block's file offset in its CRC catches them.
// The fingerprint is read only once the header checks out: a flipped byte
// in it, or anywhere in the header, is a checksum mismatch, not a fingerprint
// that seems to name another model.
TEST_F(SnapshotTest, ReadFingerprintChecksTheHeaderFirst) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  fill_source(*source, 700);
  const std::string file = path("fingerprint.snap");
  save_snapshot(*source, file, kFingerprint);
  EXPECT_EQ(read_snapshot_fingerprint(file), kFingerprint);
  const std::vector<std::byte> original = read_bytes(file);
  for (const size_t at : {size_t{20}, size_t{92}, size_t{93}}) {  // a field, the fingerprint's first bytes
    std::vector<std::byte> damaged = original;
    damaged[at] ^= std::byte{0x04};
    write_bytes(file, damaged);
    try {
      read_snapshot_fingerprint(file);
      ADD_FAILURE() << "byte " << at << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("header checksum mismatch"), std::string::npos) << e.what();
    }
  }
  for (const std::string& bad : {path("missing.snap"), dir_.string()}) {
    try {
      read_snapshot_fingerprint(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST_F(SnapshotTest, MovedOrDuplicatedBlocksAreRejected) {
  const LongContextConfig cfg = small_config(RepresentativeType::kMean);
  auto source = make_store(cfg);
  fill_source(*source, 2200);
  save_snapshot(*source, path("m.snap"), kFingerprint);
  const std::vector<std::byte> good = read_bytes(path("m.snap"));
  const std::vector<FileBlock> blocks = documented_blocks(*source, good);
  ASSERT_EQ(blocks.size(), 12u);  // layer 0: 2 heads x 4 blocks, then layer 1: 2 heads x 2 blocks
  const size_t stride = source->layout().page_bytes + source->layout().record_bytes + 4;
  auto target = make_store(cfg);
  fill_target(*target, 2201);
  const StoreImage before = image_of(*target);

  struct Move {
    size_t from, to;  // block indices in file order; `from` is copied over `to`
    bool swap;
    std::string message_part;
  };
  const Move moves[] = {
      {0, 1, true, "layer 0 kv head 0 block 0: checksum mismatch"},
      {3, 4, false, "layer 0 kv head 1 block 0: checksum mismatch"},   // head 0's last block over head 1's first
      {9, 11, false, "layer 1 kv head 1 block 1: checksum mismatch"},  // another head's block, same index
  };
  for (const Move& m : moves) {
    std::vector<std::byte> f = good;
    std::copy_n(good.begin() + std::ptrdiff_t(blocks[m.from].offset), stride,
                f.begin() + std::ptrdiff_t(blocks[m.to].offset));
    if (m.swap) {
      std::copy_n(good.begin() + std::ptrdiff_t(blocks[m.to].offset), stride,
                  f.begin() + std::ptrdiff_t(blocks[m.from].offset));
    }
    write_bytes(path("moved.snap"), f);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      const Error e = error_from([&] { load_snapshot(*target, path("moved.snap"), kFingerprint, mode); });
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(m.message_part), std::string::npos) << e.what();
    }
  }
  expect_unchanged(*target, before, "after loads of moved blocks");
}

// Headers with a valid checksum but impossible or hostile fields.
TEST_F(SnapshotTest, CraftedHeaderFieldsAreRejected) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  fill_source(*source, 1100);
  save_snapshot(*source, path("good.snap"), kFingerprint);
  const std::vector<std::byte> good = read_bytes(path("good.snap"));
  auto target = make_store(cfg);
  fill_target(*target, 1200);
  const StoreImage before = image_of(*target);
  const size_t tokens_at = kFingerprintAt + std::strlen(kFingerprint);

  struct Craft {
    const char* what;
    size_t at;
    uint64_t value;
    int width;
    ErrorCode code;
    std::string message_part;
  };
  const uint64_t page_bytes = get_le(good, kPageBytesAt, 8);
  const uint64_t record_bytes = get_le(good, kRecordBytesAt, 8);
  const Craft crafts[] = {
      {"version 1", kVersionAt, 1, 4, ErrorCode::kUnsupported, "format version 1, this build reads versions 2 to 5"},
      {"version 6", kVersionAt, 6, 4, ErrorCode::kUnsupported, "format version 6, this build reads versions 2 to 5"},
      {"no layers", kNLayersAt, 0, 4, ErrorCode::kCorrupt, "n_layers"},
      {"huge layer count", kNLayersAt, 0xFFFFFFFF, 4, ErrorCode::kCorrupt, "n_layers"},
      {"3 layers", kNLayersAt, 3, 4, ErrorCode::kCorrupt, "header_bytes"},
      {"no kv heads", kNKvHeadsAt, 0, 4, ErrorCode::kCorrupt, "n_kv_heads"},
      {"zero block size", kBlockSizeAt, 0, 4, ErrorCode::kCorrupt, "block_size"},
      {"unknown dtype", kKvTypeAt, 7, 4, ErrorCode::kCorrupt, "kv_type"},
      {"unknown rep type", kRepTypeAt, 9, 4, ErrorCode::kCorrupt, "rep_type"},
      {"huge page", kPageBytesAt, uint64_t{1} << 63, 8, ErrorCode::kCorrupt, "page_bytes"},
      {"small page", kPageBytesAt, 64, 8, ErrorCode::kCorrupt, "page_bytes"},
      {"odd page", kPageBytesAt, page_bytes + 1, 8, ErrorCode::kCorrupt, "page_bytes"},
      {"huge record", kRecordBytesAt, ~uint64_t{0}, 8, ErrorCode::kCorrupt, "record_bytes"},
      {"small record", kRecordBytesAt, 0, 8, ErrorCode::kCorrupt, "record_bytes"},
      {"odd record", kRecordBytesAt, record_bytes + 32, 8, ErrorCode::kCorrupt, "record_bytes"},
      {"other record size", kRecordBytesAt, record_bytes + 64, 8, ErrorCode::kInvalidArgument,
       str_cat("record_bytes ", record_bytes + 64, " vs ", record_bytes)},
      {"offset outside record", kSumOffsetAt, uint64_t{1} << 40, 8, ErrorCode::kCorrupt, "record_sum_offset"},
      {"long fingerprint", kFingerprintBytesAt, 5000, 4, ErrorCode::kCorrupt, "fingerprint_bytes"},
      {"short fingerprint", kFingerprintBytesAt, 3, 4, ErrorCode::kCorrupt, "header_bytes"},
      {"absurd token count", tokens_at, uint64_t{1} << 62, 8, ErrorCode::kCorrupt, "n_tokens[0]"},
      {"too many tokens", tokens_at, 1000, 8, ErrorCode::kInvalidArgument, "max_seq_len 64"},
      {"one block more in layer 0", tokens_at, 17, 8, ErrorCode::kCorrupt, "expected"},
      {"one block more in layer 1", tokens_at + 8, 9, 8, ErrorCode::kCorrupt, "expected"},
      {"other rep type", kRepTypeAt, 1, 4, ErrorCode::kInvalidArgument,
       str_cat("representative_type ", representative_type_name(RepresentativeType::kMean), " vs ",
               representative_type_name(RepresentativeType::kQuest))},
      {"other head_dim", kHeadDimAt, 4, 4, ErrorCode::kInvalidArgument, "head_dim 4 vs 8"},
  };
  for (const Craft& c : crafts) {
    std::vector<std::byte> f = good;
    patch_header(f, c.at, c.value, c.width);
    write_bytes(path("crafted.snap"), f);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      const Error e = error_from([&] { load_snapshot(*target, path("crafted.snap"), kFingerprint, mode); });
      EXPECT_EQ(e.code(), c.code) << c.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << c.what << ": " << e.what();
    }
  }
  // Valid fields whose sizes overflow 64 bits: 2^38 blocks of 4 GiB pages.
  {
    std::vector<std::byte> f = good;
    patch_header(f, kPageBytesAt, uint64_t{1} << 32, 8);
    patch_header(f, tokens_at, uint64_t{1} << 40, 8);
    write_bytes(path("crafted.snap"), f);
    const Error e = error_from([&] { load_snapshot(*target, path("crafted.snap"), kFingerprint); });
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("beyond 64 bits"), std::string::npos) << e.what();
  }
  // A header size pointing past the file, and one below the minimum.
  for (uint64_t header_bytes : {uint64_t{good.size()}, uint64_t{100}}) {
    std::vector<std::byte> f = good;
    put_le(f, kHeaderBytesAt, header_bytes, 4);
    write_bytes(path("crafted.snap"), f);
    EXPECT_EQ(error_from([&] { load_snapshot(*target, path("crafted.snap"), kFingerprint); }).code(),
              ErrorCode::kCorrupt);
  }
  // A file of the right size that is not a snapshot.
  write_bytes(path("crafted.snap"), std::vector<std::byte>(good.size(), std::byte{'x'}));
  const Error e = error_from([&] { load_snapshot(*target, path("crafted.snap"), kFingerprint); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("not a longctx KV snapshot"), std::string::npos) << e.what();
  // A missing file.
  EXPECT_EQ(error_from([&] { load_snapshot(*target, path("missing.snap"), kFingerprint); }).code(), ErrorCode::kIo);
  EXPECT_EQ(error_from([&] { load_snapshot(*target, path("missing.snap"), kFingerprint, LoadMode::kMmap); }).code(),
            ErrorCode::kIo);
  expect_unchanged(*target, before, "after crafted loads");
}

// The checks run in the documented order: each pair of defects reports the earlier one.
TEST_F(SnapshotTest, ValidationFollowsTheDocumentedOrder) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  fill_source(*source, 2100);
  save_snapshot(*source, path("o.snap"), kFingerprint);
  const std::vector<std::byte> good = read_bytes(path("o.snap"));
  auto load_error = [&](const std::vector<std::byte>& f, KVStore& target, const std::string& fingerprint) {
    write_bytes(path("x.snap"), f);
    return error_from([&] { load_snapshot(target, path("x.snap"), fingerprint); });
  };
  auto target = make_store(cfg);
  const StoreImage before = image_of(*target);

  // Version (step 3) before the header checksum (step 5).
  std::vector<std::byte> f = good;
  put_le(f, kVersionAt, 6, 4);
  put_le(f, kNKvHeadsAt, 5, 4);
  EXPECT_EQ(load_error(f, *target, kFingerprint).code(), ErrorCode::kUnsupported);
  // Layout (7) before fingerprint (8).
  auto other_layout = make_store(small_config(RepresentativeType::kQuest, DType::kBF16));
  Error e = load_error(good, *other_layout, "other");
  EXPECT_NE(std::string(e.what()).find("kv_type"), std::string::npos) << e.what();
  // Fingerprint (8) before the exact size (10).
  f = good;
  f.pop_back();
  e = load_error(f, *target, "other");
  EXPECT_NE(std::string(e.what()).find("made for model"), std::string::npos) << e.what();
  // max_seq_len (9) before the exact size (10) and the page checksums (12).
  auto short_store = make_store(small_config(RepresentativeType::kQuest, DType::kF16, 4, 8));
  f = good;
  f[good.size() - 100] ^= std::byte{1};
  e = load_error(f, *short_store, kFingerprint);
  EXPECT_NE(std::string(e.what()).find("max_seq_len 8"), std::string::npos) << e.what();
  f.pop_back();
  e = load_error(f, *short_store, kFingerprint);
  EXPECT_NE(std::string(e.what()).find("max_seq_len 8"), std::string::npos) << e.what();
  // Exact size (10) before the trailer (11) and page checksums (12).
  f = good;
  f[good.size() - 1] ^= std::byte{1};
  f[good.size() - 100] ^= std::byte{1};
  f.push_back(std::byte{0});
  e = load_error(f, *target, kFingerprint);
  EXPECT_NE(std::string(e.what()).find(str_cat("size ", good.size() + 1, ", expected ", good.size())),
            std::string::npos)
      << e.what();
  // Trailer (11) before page checksums (12); the first damaged page is named.
  f.pop_back();
  e = load_error(f, *target, kFingerprint);
  EXPECT_NE(std::string(e.what()).find("trailer"), std::string::npos) << e.what();
  f = good;
  const size_t header_bytes = size_t(get_le(good, kHeaderBytesAt, 4));
  const size_t page_bytes = size_t(get_le(good, kPageBytesAt, 8));
  const size_t record_bytes = size_t(get_le(good, kRecordBytesAt, 8));
  const size_t second_block = header_bytes + (page_bytes + record_bytes + 4);
  f[second_block + page_bytes + 5] ^= std::byte{0x10};  // in its record
  f[good.size() - 100] ^= std::byte{1};
  e = load_error(f, *target, kFingerprint);
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_NE(std::string(e.what()).find(str_cat("layer 0 kv head 0 block 1: checksum mismatch (block at file offset ",
                                               second_block, ",")),
            std::string::npos)
      << e.what();
  expect_unchanged(*target, before, "after rejected loads");
}

// A block that holds what no store writes, its checksum recomputed (a file
// edited on purpose; a CRC is no defence against that): NaN or infinite K/V
// values and q8_0 scales, NaN in a record. Refused with the block and the
// part named, in both modes, the store unchanged. The patched block is layer
// 0's partial last block, which the next append would extend (computing
// representatives from a NaN scale was undefined behaviour). An infinite MEAN
// sum (f32 sums may overflow) still loads.
TEST_F(SnapshotTest, ValuesNoStoreHoldsAreRejectedEvenWithTheirChecksumRecomputed) {
  struct Case {
    const char* what;
    DType kv_type;
    RepresentativeType rep;
    bool tail;
    size_t (*at)(const StoreLayout&);  // byte offset in the block: the page, then the record
    uint32_t bits;
    int width;
    const char* refusal;  // nullptr: it loads
  };
  const Case cases[] = {
      {"f16 key Inf", DType::kF16, RepresentativeType::kQuest, false, [](const StoreLayout&) { return size_t(0); },
       0x7C00, 2, "a key of the page is NaN or Inf"},
      {"bf16 value NaN", DType::kBF16, RepresentativeType::kMean, false,
       [](const StoreLayout& l) { return l.page_v + 2; }, 0x7FC0, 2, "a value of the page is NaN or Inf"},
      {"f16 representative key NaN", DType::kF16, RepresentativeType::kQuest, false,
       [](const StoreLayout& l) { return l.page_bytes; }, 0x7E00, 2, "a representative key is NaN"},
      {"f32 MEAN sum NaN", DType::kF32, RepresentativeType::kMean, false,
       [](const StoreLayout& l) { return l.page_bytes + l.record_sum_offset; }, 0x7FC00000, 4, "the MEAN sum is NaN"},
      {"f32 MEAN sum Inf", DType::kF32, RepresentativeType::kMean, false,
       [](const StoreLayout& l) { return l.page_bytes + l.record_sum_offset; }, 0x7F800000, 4, nullptr},
      {"DYNAMIC importance NaN", DType::kF32, RepresentativeType::kDynamic, false,
       [](const StoreLayout& l) { return l.page_bytes + l.record_importance_offset; }, 0x7FC00000, 4,
       "a DYNAMIC importance is NaN"},
      {"tail sum NaN", DType::kF16, RepresentativeType::kQuest, true,
       [](const StoreLayout& l) { return l.page_bytes + l.record_tail_offset + 4; }, 0xFFC00000, 4,
       "a tail sum is NaN"},
      {"q8_0 K scale Inf", DType::kQ8_0, RepresentativeType::kQuest, false,
       [](const StoreLayout& l) { return l.page_k_scales; }, 0x7C00, 2, "a K scale of the page is NaN or Inf"},
      {"q8_0 V scale NaN", DType::kQ8_0, RepresentativeType::kMax, false,
       [](const StoreLayout& l) { return l.page_v_scales + 2; }, 0x7E00, 2, "a V scale of the page is NaN or Inf"},
      {"q8_0 record key scale Inf", DType::kQ8_0, RepresentativeType::kQuest, false,
       [](const StoreLayout& l) { return l.page_bytes + size_t(l.rep_slots) * size_t(l.shape.head_dim); }, 0x7C00,
       2, "a representative key scale is NaN or Inf"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    LongContextConfig cfg = small_config(c.rep, c.kv_type);
    if (c.tail) cfg.tail = TailMode::kEstimate;
    const KVShape shape = c.kv_type == DType::kQ8_0 ? KVShape{2, 2, 64} : kShape;  // q8_0: head_dim % 32 == 0
    auto source = make_store(cfg, shape);
    fill_source(*source, 2300);
    save_snapshot(*source, path("v.snap"), kFingerprint);
    std::vector<std::byte> f = read_bytes(path("v.snap"));
    const StoreLayout& l = source->layout();
    const size_t block = documented_blocks(*source, f)[3].offset;  // layer 0, kv head 0, block 3 (partial)
    put_le(f, block + c.at(l), c.bits, c.width);
    put_le(f, block + l.page_bytes + l.record_bytes, documented_block_crc(f, block, l), 4);
    write_bytes(path("v.snap"), f);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      auto target = make_store(cfg, shape);
      fill_target(*target, 2301);
      if (c.refusal == nullptr) {
        load_snapshot(*target, path("v.snap"), kFingerprint, mode);
        EXPECT_EQ(target->n_tokens(0), 13);
        continue;
      }
      const StoreImage before = image_of(*target);
      const Error e = error_from([&] { load_snapshot(*target, path("v.snap"), kFingerprint, mode); });
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      const std::string expected = "layer 0 kv head 0 block 3 (file offset " + std::to_string(block) + "): " +
                                   c.refusal + ", which no store holds";
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      expect_unchanged(*target, before, c.what);
    }
  }
}

}  // namespace
}  // namespace longctx::kvstore
