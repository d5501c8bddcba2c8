// Snapshots: exact round trips in both load modes (records spread over several
// rep pages included, and into a store with a larger max_seq_len), appending
// after a load, the byte format of docs/snapshot-format.md read by an
// independent parser, and rejection of damaged files (a byte flip at every
// offset, a truncation to every length, crafted headers) with the target
// store left exactly as it was.
#include "longctx/kvstore/snapshot.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/crc32c.h"
#include "longctx/core/error.h"

namespace longctx::kvstore {
namespace {

namespace fs = std::filesystem;

const KVShape kShape{2, 2, 8};  // 2 layers, 2 kv heads, head_dim 8

LongContextConfig small_config(RepresentativeType rep, DType kv_type = DType::kF16, int block_size = 4,
                               int64_t max_seq_len = 64) {
  LongContextConfig cfg;
  cfg.block_size = block_size;
  cfg.max_seq_len = max_seq_len;
  cfg.kv_type = kv_type;
  cfg.representative_type = rep;
  cfg.representative_num = rep == RepresentativeType::kFix || rep == RepresentativeType::kDynamic ? 3
                           : rep == RepresentativeType::kQuest                                      ? 2
                                                                                                    : 1;
  cfg.chunk_size = 16;
  cfg.local_windows_len = 8;
  cfg.initial_len = 4;
  cfg.second_select_num = 2;
  cfg.preselect_block_count = 2;
  cfg.dense_layer_num = 0;
  return cfg;
}

const NumaTopology& topology() {
  static const NumaTopology topo = NumaTopology::detect();
  return topo;
}

// Appends n tokens of random K, V (and, for DYNAMIC, importance) to one layer.
void append_random(KVStore& store, int layer, int64_t n, uint32_t seed) {
  const KVShape& s = store.layout().shape;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  const size_t n_values = size_t(n) * size_t(s.n_kv_heads) * size_t(s.head_dim);
  std::vector<float> k(n_values), v(n_values), importance(size_t(n) * size_t(s.n_kv_heads));
  for (float& x : k) x = value(rng);
  for (float& x : v) x = value(rng);
  for (float& x : importance) x = weight(rng);
  const TensorView k_view = make_view(k.data(), DType::kF32, {n, s.n_kv_heads, s.head_dim});
  const TensorView v_view = make_view(v.data(), DType::kF32, {n, s.n_kv_heads, s.head_dim});
  if (store.layout().rep_type == RepresentativeType::kDynamic) {
    store.append(layer, k_view, v_view, make_view(importance.data(), DType::kF32, {n, s.n_kv_heads}));
  } else {
    store.append(layer, k_view, v_view);
  }
}

// Every byte of every page and rep page, their addresses and the token counts.
struct StoreImage {
  std::vector<int64_t> n_tokens;
  std::vector<std::byte> bytes;
  std::vector<const std::byte*> addresses;
};

StoreImage image_of(const KVStore& store) {
  const StoreLayout& l = store.layout();
  StoreImage image;
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    image.n_tokens.push_back(store.n_tokens(layer));
    for (int head = 0; head < l.shape.n_kv_heads; ++head) {
      for (const std::byte* page : SnapshotAccess::pages(store, layer, head)) {
        image.bytes.insert(image.bytes.end(), page, page + l.page_bytes);
        image.addresses.push_back(page);
      }
      for (const std::byte* page : SnapshotAccess::rep_pages(store, layer, head)) {
        image.bytes.insert(image.bytes.end(), page, page + l.rep_page_bytes);
        image.addresses.push_back(page);
      }
    }
  }
  return image;
}

// What readers see through the public API: K, V, fill, records, valid slots.
std::vector<std::byte> public_view_of(const KVStore& store) {
  const StoreLayout& l = store.layout();
  const size_t half_bytes = size_t(l.block_size) * size_t(l.shape.head_dim) * dtype_size(l.kv_type);
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
        out.insert(out.end(), block.k_t, block.k_t + half_bytes);
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

void expect_same_content(const KVStore& actual, const KVStore& expected) {
  const StoreImage a = image_of(actual), e = image_of(expected);
  EXPECT_EQ(a.n_tokens, e.n_tokens);
  EXPECT_TRUE(a.bytes == e.bytes) << "page bytes differ";
  EXPECT_TRUE(public_view_of(actual) == public_view_of(expected)) << "blocks or records differ";
}

void expect_unchanged(const KVStore& store, const StoreImage& before, const std::string& what) {
  const StoreImage now = image_of(store);
  EXPECT_EQ(now.n_tokens, before.n_tokens) << what;
  EXPECT_TRUE(now.bytes == before.bytes) << what << ": page bytes changed";
  EXPECT_TRUE(now.addresses == before.addresses) << what << ": page lists changed";
}

// Runs f, which must throw Error; returns it.
Error error_from(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error(ErrorCode::kInternal, "<no error>");
}

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_bytes(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

uint64_t get_le(const std::vector<std::byte>& f, size_t at, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= uint64_t(f[at + size_t(i)]) << (8 * i);
  return v;
}

void put_le(std::vector<std::byte>& f, size_t at, uint64_t v, int width) {
  for (int i = 0; i < width; ++i) f[at + size_t(i)] = std::byte(v >> (8 * i));
}

// Offsets of docs/snapshot-format.md (version 2), written out again here on purpose.
constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kNLayersAt = 16, kNKvHeadsAt = 20, kHeadDimAt = 24,
                 kBlockSizeAt = 28, kKvTypeAt = 32, kRepTypeAt = 36, kRepNumAt = 40, kRepSlotsAt = 44,
                 kPageBytesAt = 48, kRecordBytesAt = 56, kSumOffsetAt = 64, kImportanceOffsetAt = 72,
                 kOffsetsOffsetAt = 80, kFingerprintBytesAt = 88, kFingerprintAt = 92;

// Sets a header field of a snapshot image and recomputes the header CRC (a
// crafted file, which only the field checks can catch).
void patch_header(std::vector<std::byte>& f, size_t at, uint64_t value, int width) {
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
std::vector<FileBlock> documented_blocks(const KVStore& store, const std::vector<std::byte>& file) {
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

// Checks the body and trailer of snapshot `f` of `store` against the documented format.
void expect_documented_body(const KVStore& store, const std::vector<std::byte>& f) {
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
    std::byte offset_le[8];
    for (int i = 0; i < 8; ++i) offset_le[i] = std::byte(uint64_t(at) >> (8 * i));
    std::vector<std::byte> covered(f.data() + at, f.data() + at + l.page_bytes + l.record_bytes);
    covered.insert(covered.end(), offset_le, offset_le + 8);
    EXPECT_EQ(get_le(f, at + l.page_bytes + l.record_bytes, 4), crc32c(covered.data(), covered.size()))
        << "block at " << at;
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

const char* const kFingerprint = "test-model-2x2x8";

// ---- round trips ---------------------------------------------------------------

struct RoundTripCase {
  RepresentativeType rep;
  DType kv_type;
};

class SnapshotRoundTrip : public SnapshotTest, public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(SnapshotRoundTrip, LoadGivesExactlyTheSavedStoreInBothModes) {
  const LongContextConfig cfg = small_config(GetParam().rep, GetParam().kv_type);
  auto source = make_store(cfg);
  fill_source(*source, 100);
  const std::string file = path("a.snap");
  save_snapshot(*source, file, kFingerprint);

  for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
    SCOPED_TRACE(mode == LoadMode::kRead ? "kRead" : "kMmap");
    auto target = make_store(cfg);
    fill_target(*target, 200);
    load_snapshot(*target, file, kFingerprint, mode);
    expect_same_content(*target, *source);
    // The target's old pages went back to its pools.
    EXPECT_EQ(target->memory_stats().used_bytes, source->memory_stats().used_bytes);

    auto fresh = make_store(cfg);  // into an empty store too
    load_snapshot(*fresh, file, kFingerprint, mode);
    expect_same_content(*fresh, *source);
  }
  // Saving what was loaded gives the same file.
  auto reloaded = make_store(cfg);
  load_snapshot(*reloaded, file, kFingerprint);
  save_snapshot(*reloaded, path("b.snap"), kFingerprint);
  EXPECT_TRUE(read_bytes(file) == read_bytes(path("b.snap")));
}

std::vector<RoundTripCase> all_round_trip_cases() {
  std::vector<RoundTripCase> cases;
  for (RepresentativeType rep : {RepresentativeType::kMax, RepresentativeType::kMean, RepresentativeType::kQuest,
                                 RepresentativeType::kFix, RepresentativeType::kDynamic}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) cases.push_back({rep, t});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, SnapshotRoundTrip, ::testing::ValuesIn(all_round_trip_cases()),
                         [](const ::testing::TestParamInfo<RoundTripCase>& p) {
                           return std::string(representative_type_name(p.param.rep)) + "_" +
                                  dtype_name(p.param.kv_type);
                         });

TEST_F(SnapshotTest, EmptyStoreRoundTripsAndEmptiesTheTarget) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  save_snapshot(*source, path("empty.snap"), kFingerprint);
  auto target = make_store(cfg);
  fill_target(*target, 7);
  EXPECT_EQ(fs::file_size(path("empty.snap")), 92 + std::strlen(kFingerprint) + 8 * 2 + 4 + 16);
  load_snapshot(*target, path("empty.snap"), kFingerprint, LoadMode::kMmap);
  EXPECT_EQ(target->n_tokens(0), 0);
  EXPECT_EQ(target->n_tokens(1), 0);
  EXPECT_EQ(target->memory_stats().used_bytes, 0u);
  append_random(*target, 0, 5, 8);  // still usable
  EXPECT_EQ(target->n_tokens(0), 5);
}

// A loaded store keeps appending exactly as if it had never been saved: the
// partial block's state (MEAN sums, DYNAMIC importances) lives in the pages.
class SnapshotAppendAfterLoad : public SnapshotTest, public ::testing::WithParamInterface<RepresentativeType> {};

TEST_P(SnapshotAppendAfterLoad, GivesTheSamePagesAsAnUninterruptedStore) {
  const LongContextConfig cfg = small_config(GetParam());
  auto uninterrupted = make_store(cfg);
  auto saved = make_store(cfg);
  auto loaded = make_store(cfg);
  fill_target(*loaded, 300);
  for (KVStore* s : {uninterrupted.get(), saved.get()}) fill_source(*s, 400);
  save_snapshot(*saved, path("mid.snap"), kFingerprint);
  saved.reset();
  load_snapshot(*loaded, path("mid.snap"), kFingerprint, LoadMode::kMmap);

  for (KVStore* s : {uninterrupted.get(), loaded.get()}) {
    append_random(*s, 0, 2, 500);   // completes nothing yet (13 -> 15)
    append_random(*s, 0, 10, 501);  // crosses block boundaries (15 -> 25)
    append_random(*s, 1, 11, 502);  // 6 -> 17
    if (GetParam() == RepresentativeType::kDynamic) {
      std::vector<float> extra(7 * 2);
      for (size_t i = 0; i < extra.size(); ++i) extra[i] = 0.25f * float(i % 5);
      s->add_importance(0, 10, make_view(extra.data(), DType::kF32, {7, 2}));
    }
  }
  expect_same_content(*loaded, *uninterrupted);
}

INSTANTIATE_TEST_SUITE_P(Types, SnapshotAppendAfterLoad,
                         ::testing::Values(RepresentativeType::kMax, RepresentativeType::kMean,
                                           RepresentativeType::kQuest, RepresentativeType::kFix,
                                           RepresentativeType::kDynamic),
                         [](const ::testing::TestParamInfo<RepresentativeType>& p) {
                           return std::string(representative_type_name(p.param));
                         });

// ---- the byte format, read by an independent parser ------------------------------

TEST_F(SnapshotTest, FileFollowsTheDocumentedFormat) {
  const LongContextConfig cfg = small_config(RepresentativeType::kDynamic);
  auto store = make_store(cfg);
  fill_source(*store, 600);
  const std::string fingerprint = "model \xff\x01 fp";
  save_snapshot(*store, path("f.snap"), fingerprint);
  const std::vector<std::byte> f = read_bytes(path("f.snap"));
  const StoreLayout& l = store->layout();

  ASSERT_GE(f.size(), 120u);
  EXPECT_EQ(std::memcmp(f.data(), "LCTXSNAP", 8), 0);
  EXPECT_EQ(get_le(f, kVersionAt, 4), 2u);
  const size_t header_bytes = size_t(get_le(f, kHeaderBytesAt, 4));
  EXPECT_EQ(header_bytes, 92 + fingerprint.size() + 8 * 2 + 4);
  EXPECT_EQ(get_le(f, kNLayersAt, 4), 2u);
  EXPECT_EQ(get_le(f, kNKvHeadsAt, 4), 2u);
  EXPECT_EQ(get_le(f, kHeadDimAt, 4), 8u);
  EXPECT_EQ(get_le(f, kBlockSizeAt, 4), 4u);
  EXPECT_EQ(get_le(f, kKvTypeAt, 4), 1u);   // f16
  EXPECT_EQ(get_le(f, kRepTypeAt, 4), 4u);  // DYNAMIC
  EXPECT_EQ(get_le(f, kRepNumAt, 4), uint64_t(l.rep_num));
  EXPECT_EQ(get_le(f, kRepSlotsAt, 4), uint64_t(l.rep_slots));
  EXPECT_EQ(get_le(f, kPageBytesAt, 8), l.page_bytes);
  EXPECT_EQ(get_le(f, kRecordBytesAt, 8), l.record_bytes);
  EXPECT_EQ(get_le(f, kSumOffsetAt, 8), l.record_sum_offset);
  EXPECT_EQ(get_le(f, kImportanceOffsetAt, 8), l.record_importance_offset);
  EXPECT_EQ(get_le(f, kOffsetsOffsetAt, 8), l.record_offsets_offset);
  EXPECT_EQ(get_le(f, kFingerprintBytesAt, 4), fingerprint.size());
  EXPECT_EQ(std::memcmp(f.data() + kFingerprintAt, fingerprint.data(), fingerprint.size()), 0);
  const size_t tokens_at = kFingerprintAt + fingerprint.size();
  EXPECT_EQ(get_le(f, tokens_at, 8), 13u);
  EXPECT_EQ(get_le(f, tokens_at + 8, 8), 6u);
  EXPECT_EQ(tokens_at + 16 + 4, header_bytes);
  EXPECT_EQ(get_le(f, header_bytes - 4, 4), crc32c(f.data(), header_bytes - 4));

  expect_documented_body(*store, f);
  // 2 kv heads x (4 blocks in layer 0 + 2 in layer 1), nothing else.
  EXPECT_EQ(f.size(), header_bytes + 2 * (4 + 2) * (l.page_bytes + l.record_bytes + 4) + 16);
}

// Records of blocks stored in different rep pages of the store (the file
// does not depend on how the store packs them): head_dim 512 f32 QUEST
// records are 4 KiB, so a rep page holds 16 of them.
TEST_F(SnapshotTest, RecordsOfSeveralRepPagesRoundTrip) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest, DType::kF32, 4, 128);
  const KVShape shape{2, 2, 512};
  auto source = make_store(cfg, shape);
  const StoreLayout& l = source->layout();
  append_random(*source, 0, 70, 3000);   // 18 blocks: a full rep page and 2 records of a second
  append_random(*source, 1, 64, 3001);   // 16 blocks: exactly one full rep page
  ASSERT_EQ(l.records_per_rep_page, 16u) << "test premise";
  ASSERT_EQ(SnapshotAccess::rep_pages(*source, 0, 1).size(), 2u) << "test premise";
  save_snapshot(*source, path("wide.snap"), kFingerprint);
  const std::vector<std::byte> f = read_bytes(path("wide.snap"));
  expect_documented_body(*source, f);
  for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
    SCOPED_TRACE(mode == LoadMode::kRead ? "kRead" : "kMmap");
    auto target = make_store(cfg, shape);
    append_random(*target, 0, 128, 3002);
    load_snapshot(*target, path("wide.snap"), kFingerprint, mode);
    expect_same_content(*target, *source);
    EXPECT_EQ(target->memory_stats().used_bytes, source->memory_stats().used_bytes);
  }
}

// max_seq_len is not part of the layout: a snapshot loads into a store sized
// for more tokens, with the same content, keeps growing past the saved
// store's limit, and saving it again gives the same file.
TEST_F(SnapshotTest, LoadsIntoAStoreWithALargerMaxSeqLen) {
  for (RepresentativeType rep : {RepresentativeType::kQuest, RepresentativeType::kDynamic}) {
    SCOPED_TRACE(representative_type_name(rep));
    auto source = make_store(small_config(rep, DType::kF16, 4, 64));
    fill_source(*source, 3100);
    append_random(*source, 1, 58, 3101);  // layer 1 full: 64 tokens
    save_snapshot(*source, path("short.snap"), kFingerprint);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      SCOPED_TRACE(mode == LoadMode::kRead ? "kRead" : "kMmap");
      auto larger = make_store(small_config(rep, DType::kF16, 4, 4096));
      fill_target(*larger, 3102);
      load_snapshot(*larger, path("short.snap"), kFingerprint, mode);
      expect_same_content(*larger, *source);
      save_snapshot(*larger, path("again.snap"), kFingerprint);
      EXPECT_TRUE(read_bytes(path("again.snap")) == read_bytes(path("short.snap")));
      append_random(*larger, 1, 1000, 3103);
      EXPECT_EQ(larger->n_tokens(1), 1064);
    }
  }
}

// ---- damaged files ----------------------------------------------------------------

// Loads `file` after flipping each byte at `positions` with `mask` (one at a
// time, restored after): every load must fail with the code the format gives
// (kUnsupported for the version field, kCorrupt elsewhere) naming the file.
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
      const ErrorCode expected = i >= kVersionAt && i < kVersionAt + 4 ? ErrorCode::kUnsupported : ErrorCode::kCorrupt;
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
      {"version 1", kVersionAt, 1, 4, ErrorCode::kUnsupported, "format version 1, this build reads version 2"},
      {"version 3", kVersionAt, 3, 4, ErrorCode::kUnsupported, "format version 3, this build reads version 2"},
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
  put_le(f, kVersionAt, 3, 4);
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

// ---- snapshots of another model or store ---------------------------------------------

TEST_F(SnapshotTest, FingerprintMismatchIsRejected) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  fill_source(*source, 1300);
  save_snapshot(*source, path("fp.snap"), "llama-3-8b-instruct");
  auto target = make_store(cfg);
  fill_target(*target, 1400);
  const StoreImage before = image_of(*target);
  for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
    const Error e = error_from([&] { load_snapshot(*target, path("fp.snap"), "llama-3-70b-instruct", mode); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("made for model 'llama-3-8b-instruct', this store serves "
                                         "'llama-3-70b-instruct'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(error_from([&] { load_snapshot(*target, path("fp.snap"), ""); }).code(), ErrorCode::kInvalidArgument);
  expect_unchanged(*target, before, "after fingerprint mismatches");

  // The longest fingerprint round-trips; a longer one is refused at save.
  const std::string longest(4096, 'f');
  save_snapshot(*source, path("long.snap"), longest);
  load_snapshot(*target, path("long.snap"), longest);
  expect_same_content(*target, *source);
  const Error e = error_from([&] { save_snapshot(*source, path("longer.snap"), longest + "g"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(path("longer.snap")));
}

TEST_F(SnapshotTest, LayoutMismatchNamesTheFieldAndBothValues) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  fill_source(*source, 1500);
  save_snapshot(*source, path("l.snap"), kFingerprint);

  struct Other {
    LongContextConfig cfg;
    KVShape shape;
    std::string message_part;
  };
  const Other others[] = {
      {small_config(RepresentativeType::kQuest, DType::kF16, 8), kShape, "block_size 4 vs 8"},
      {small_config(RepresentativeType::kQuest, DType::kBF16), kShape, "kv_type f16 vs bf16"},
      {small_config(RepresentativeType::kQuest, DType::kF32), kShape, "kv_type f16 vs f32"},
      {small_config(RepresentativeType::kMean), kShape,
       str_cat("representative_type ", representative_type_name(RepresentativeType::kQuest), " vs ",
               representative_type_name(RepresentativeType::kMean))},
      {small_config(RepresentativeType::kQuest), KVShape{3, 2, 8}, "n_layers 2 vs 3"},
      {small_config(RepresentativeType::kQuest), KVShape{2, 1, 8}, "n_kv_heads 2 vs 1"},
      {small_config(RepresentativeType::kQuest), KVShape{2, 2, 16}, "head_dim 8 vs 16"},
  };
  for (const Other& other : others) {
    auto target = make_store(other.cfg, other.shape);
    append_random(*target, 0, 5, 1600);
    const StoreImage before = image_of(*target);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      const Error e = error_from([&] { load_snapshot(*target, path("l.snap"), kFingerprint, mode); });
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(other.message_part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path("l.snap")), std::string::npos) << e.what();
    }
    expect_unchanged(*target, before, other.message_part);
  }
}

TEST_F(SnapshotTest, TokenCountAboveTheStoresMaxSeqLenIsRejected) {
  auto source = make_store(small_config(RepresentativeType::kQuest, DType::kF16, 4, 64));
  append_random(*source, 0, 10, 1700);
  append_random(*source, 1, 40, 1701);
  save_snapshot(*source, path("big.snap"), kFingerprint);
  auto target = make_store(small_config(RepresentativeType::kQuest, DType::kF16, 4, 32));
  append_random(*target, 1, 7, 1702);
  const StoreImage before = image_of(*target);
  const Error e = error_from([&] { load_snapshot(*target, path("big.snap"), kFingerprint); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("layer 1 holds 40 tokens, more than this store's max_seq_len 32"),
            std::string::npos)
      << e.what();
  expect_unchanged(*target, before, "after a too long snapshot");
  // Exactly max_seq_len fits.
  auto exact = make_store(small_config(RepresentativeType::kQuest, DType::kF16, 4, 40));
  load_snapshot(*exact, path("big.snap"), kFingerprint);
  expect_same_content(*exact, *source);
}

// ---- resources ----------------------------------------------------------------------

TEST_F(SnapshotTest, BudgetTooSmallForTheLoadLeavesTheStoreUnchanged) {
  // One kv head (so every page comes from one pool) with f32 block pages of
  // 2*64*64*4 = 32 KiB. The target holds 16 blocks per layer; the snapshot 32
  // per layer: layer 0's pages fit in the target's mapped slab, layer 1's need
  // a new slab, which the exhausted budget refuses, so layer 0's pages taken
  // already must go back.
  LongContextConfig cfg = small_config(RepresentativeType::kQuest, DType::kF32, 64, 2048);
  cfg.chunk_size = 256;
  cfg.local_windows_len = 128;
  const KVShape shape{2, 1, 64};
  auto source = make_store(cfg, shape);
  for (int layer = 0; layer < 2; ++layer) append_random(*source, layer, 2048, 1800 + uint32_t(layer));
  save_snapshot(*source, path("full.snap"), kFingerprint);

  auto target = make_store(cfg, shape);
  for (int layer = 0; layer < 2; ++layer) append_random(*target, layer, 1024, 1900 + uint32_t(layer));
  const StoreImage before = image_of(*target);
  const MemoryStats stats = target->memory_stats();
  const size_t page_bytes = target->layout().page_bytes;
  ASSERT_EQ(page_bytes, 32768u);
  ASSERT_EQ(BlockPool::slab_bytes_for(32 + 32, page_bytes), BlockPool::slab_bytes_for(32, page_bytes))
      << "test premise: layer 0's pages fit in the target's slab";
  ASSERT_GT(BlockPool::slab_bytes_for(32 + 64, page_bytes), BlockPool::slab_bytes_for(32, page_bytes))
      << "test premise: the whole load needs a new slab";
  const uint64_t hog = budget_.available();
  budget_.reserve(hog, "test: everything else");
  for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
    const Error e = error_from([&] { load_snapshot(*target, path("full.snap"), kFingerprint, mode); });
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
    expect_unchanged(*target, before, "after an out-of-memory load");
    EXPECT_EQ(target->memory_stats().used_bytes, stats.used_bytes) << "pages taken by the failed load leaked";
  }
  budget_.release(hog);
  load_snapshot(*target, path("full.snap"), kFingerprint);
  expect_same_content(*target, *source);
}

TEST_F(SnapshotTest, FailedSaveLeavesNothingBehind) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto store = make_store(cfg);
  fill_source(*store, 2000);

  // A directory that does not exist.
  const Error missing = error_from([&] { save_snapshot(*store, path("no/such/dir/x.snap"), kFingerprint); });
  EXPECT_EQ(missing.code(), ErrorCode::kIo) << missing.what();
  EXPECT_FALSE(fs::exists(dir_ / "no"));

  // A path that is a non-empty directory: the temp file is written, the
  // rename fails, and the temp file is removed.
  fs::create_directory(dir_ / "occupied");
  write_bytes(dir_ / "occupied" / "keep", std::vector<std::byte>(3, std::byte{1}));
  const Error onto_dir = error_from([&] { save_snapshot(*store, path("occupied"), kFingerprint); });
  EXPECT_EQ(onto_dir.code(), ErrorCode::kIo) << onto_dir.what();
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"occupied"});
  EXPECT_TRUE(fs::is_regular_file(dir_ / "occupied" / "keep"));

  // A failed save does not touch an existing snapshot at the path.
  save_snapshot(*store, path("s.snap"), kFingerprint);
  const std::vector<std::byte> saved = read_bytes(path("s.snap"));
  EXPECT_THROW(save_snapshot(*store, path("s.snap"), std::string(5000, 'x')), Error);
  EXPECT_TRUE(read_bytes(path("s.snap")) == saved);
  // A successful save replaces it whole.
  append_random(*store, 1, 3, 2001);
  save_snapshot(*store, path("s.snap"), kFingerprint);
  auto loaded = make_store(cfg);
  load_snapshot(*loaded, path("s.snap"), kFingerprint);
  expect_same_content(*loaded, *store);
}

}  // namespace
}  // namespace longctx::kvstore
