// Helpers of the snapshot tests (snapshot_*_test.cpp): small store configs,
// beside snapshot_store.h's random content and store images, the public view
// of a store to compare, the file bytes and the header fields of
// docs/snapshot-format.md read by an independent parser, and the
// SnapshotTest fixture (a temporary folder per test, the stores).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "longctx/core/crc32c.h"
#include "longctx/core/error.h"
#include "longctx/kvstore/snapshot.h"
#include "snapshot_store.h"

namespace longctx::kvstore::snapshot_testing {

namespace fs = std::filesystem;

inline const KVShape kShape{2, 2, 8};  // 2 layers, 2 kv heads, head_dim 8

// What readers see through the public API: K, V, fill, records, valid slots.
inline std::vector<std::byte> public_view_of(const KVStore& store) {
  const StoreLayout& l = store.layout();
  // K (and V) of a block with its scales (q8_0): block_size vectors.
  const size_t half_bytes = size_t(l.block_size) * kv_vector_bytes(l.kv_type, l.shape.head_dim);
  std::vector<std::byte> out;
  auto put_int = [&](int64_t x) {
    const auto* p = reinterpret_cast<const std::byte*>(&x);
    out.insert(out.end(), p, p + sizeof x);
  };
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    put_int(store.n_tokens(layer));
    put_int(store.n_blocks(layer));
    for (int head = 0; head < l.shape.n_kv_heads; ++head) {
      for (int64_t b = 0; b < store.n_blocks(layer); ++b) {
        const BlockView block = store.block(layer, head, b);
        out.insert(out.end(), block.k_t, block.k_t + half_bytes);  // q8_0: codes and scales
        out.insert(out.end(), block.v, block.v + half_bytes);
        put_int(block.n_filled);
        const std::byte* record = store.rep_record(layer, head, b);
        out.insert(out.end(), record, record + l.record_bytes);
        put_int(store.valid_rep_slots(layer, head, b));
      }
    }
  }
  return out;
}

inline void expect_same_content(const KVStore& actual, const KVStore& expected) {
  const StoreImage a = image_of(actual), e = image_of(expected);
  EXPECT_EQ(a.n_tokens, e.n_tokens);
  EXPECT_TRUE(a.bytes == e.bytes) << "page bytes differ";
  EXPECT_TRUE(public_view_of(actual) == public_view_of(expected)) << "blocks or records differ";
}

inline void expect_unchanged(const KVStore& store, const StoreImage& before, const std::string& what) {
  const StoreImage now = image_of(store);
  EXPECT_EQ(now.n_tokens, before.n_tokens) << what;
  EXPECT_TRUE(now.bytes == before.bytes) << what << ": page bytes changed";
  EXPECT_TRUE(now.addresses == before.addresses) << what << ": page lists changed";
}

// Runs f, which must throw Error; returns it.
inline Error error_from(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error(ErrorCode::kInternal, "<no error>");
}

inline std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

inline void write_bytes(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Offsets of docs/snapshot-format.md (version 3, as version 2), written out again here on purpose.
inline constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kNLayersAt = 16, kNKvHeadsAt = 20, kHeadDimAt = 24,
                        kBlockSizeAt = 28, kKvTypeAt = 32, kRepTypeAt = 36, kRepNumAt = 40, kRepSlotsAt = 44,
                        kPageBytesAt = 48, kRecordBytesAt = 56, kSumOffsetAt = 64, kImportanceOffsetAt = 72,
                        kOffsetsOffsetAt = 80, kFingerprintBytesAt = 88, kFingerprintAt = 92;

// Sets a header field of a snapshot image and recomputes the header CRC (a
// crafted file, which only the field checks can catch).
inline void patch_header(std::vector<std::byte>& f, size_t at, uint64_t value, int width) {
  const size_t header_bytes = size_t(get_le(f, kHeaderBytesAt, 4));
  put_le(f, at, value, width);
  put_le(f, header_bytes - 4, crc32c(f.data(), header_bytes - 4), 4);
}

// A block of the body where docs/snapshot-format.md places it.
struct FileBlock {
  size_t offset;  // of the page bytes; the record follows them, then the u32 CRC
  const std::byte* page;    // the store's block page it copies
  const std::byte* record;  // the store's record it copies (through the public API)
};

// The blocks of a snapshot of `store`, in file order: after the header, per
// layer, per kv head, per block: page_bytes + record_bytes + 4 CRC bytes.
inline std::vector<FileBlock> documented_blocks(const KVStore& store, const std::vector<std::byte>& file) {
  const StoreLayout& l = store.layout();
  size_t at = size_t(get_le(file, kHeaderBytesAt, 4));
  std::vector<FileBlock> blocks;
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    const int64_t n_blocks = (store.n_tokens(layer) + l.block_size - 1) / l.block_size;
    for (int head = 0; head < l.shape.n_kv_heads; ++head) {
      const auto& pages = SnapshotAccess::pages(store, layer, head);
      EXPECT_EQ(pages.size(), size_t(n_blocks));
      for (int64_t b = 0; b < n_blocks && size_t(b) < pages.size(); ++b) {
        blocks.push_back({at, pages[size_t(b)], store.rep_record(layer, head, b)});
        at += l.page_bytes + l.record_bytes + 4;
      }
    }
  }
  return blocks;
}

// The documented CRC of the block at file offset `at`: CRC32C(page bytes,
// record bytes, the offset as u64 LE).
inline uint32_t documented_block_crc(const std::vector<std::byte>& f, size_t at, const StoreLayout& l) {
  std::vector<std::byte> covered(f.data() + at, f.data() + at + l.page_bytes + l.record_bytes);
  for (int i = 0; i < 8; ++i) covered.push_back(std::byte(uint64_t(at) >> (8 * i)));
  return crc32c(covered.data(), covered.size());
}

// Checks the body and trailer of snapshot `f` of `store` against the documented format.
inline void expect_documented_body(const KVStore& store, const std::vector<std::byte>& f) {
  const StoreLayout& l = store.layout();
  const size_t header_bytes = size_t(get_le(f, kHeaderBytesAt, 4));
  // Body: layer, kv head, block: page, record, then
  // CRC32C(page bytes, record bytes, the block's file offset as u64 LE).
  size_t at = header_bytes;
  size_t n_blocks = 0;
  for (const FileBlock& block : documented_blocks(store, f)) {
    ASSERT_EQ(block.offset, at);
    ASSERT_LE(at + l.page_bytes + l.record_bytes + 4, f.size());
    EXPECT_EQ(std::memcmp(f.data() + at, block.page, l.page_bytes), 0) << "page at " << at;
    EXPECT_EQ(std::memcmp(f.data() + at + l.page_bytes, block.record, l.record_bytes), 0)
        << "record of block at " << at;
    EXPECT_EQ(get_le(f, at + l.page_bytes + l.record_bytes, 4), documented_block_crc(f, at, l)) << "block at " << at;
    at += l.page_bytes + l.record_bytes + 4;
    ++n_blocks;
  }
  size_t expected_blocks = 0;
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    expected_blocks += size_t(l.shape.n_kv_heads) * size_t(store.n_blocks(layer));
  }
  EXPECT_EQ(n_blocks, expected_blocks);
  ASSERT_EQ(f.size(), at + 16);
  EXPECT_EQ(std::memcmp(f.data() + at, "LCTXEND.", 8), 0);
  EXPECT_EQ(get_le(f, at + 8, 8), f.size());
}

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = fs::path(::testing::TempDir()) / ("longctx_snapshot_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<KVStore> make_store(const LongContextConfig& cfg, const KVShape& shape = kShape) {
    return std::make_unique<KVStore>(shape, cfg, budget_, topology());
  }
  // The source content of most tests: 13 tokens in layer 0 (a partial block)
  // and 6 in layer 1, each appended in two chunks.
  void fill_source(KVStore& store, uint32_t seed) {
    append_random(store, 0, 9, seed);
    append_random(store, 0, 4, seed + 1);
    append_random(store, 1, 5, seed + 2);
    append_random(store, 1, 1, seed + 3);
  }
  // Different content for the target store a load must replace (or keep).
  void fill_target(KVStore& store, uint32_t seed) {
    append_random(store, 0, 3, seed);
    append_random(store, 1, 21, seed + 1);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
  MemoryBudget budget_{uint64_t{1} << 30};
};

inline const char* const kFingerprint = "test-model-2x2x8";

}  // namespace longctx::kvstore::snapshot_testing
