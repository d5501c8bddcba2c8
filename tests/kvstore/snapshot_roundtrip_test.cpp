// Snapshots: exact round trips in both load modes (records spread over several
// rep pages included, and into a store with a larger max_seq_len), appending
// after a load, and the byte format of docs/snapshot-format.md read by an
// independent parser (snapshot_fixture.h).
#include "longctx/kvstore/snapshot.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "longctx/core/error.h"
#include "snapshot_fixture.h"

namespace longctx::kvstore {
namespace {

namespace fs = std::filesystem;
using namespace snapshot_testing;

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

// q8_0 pages (codes and scales) and f16 records, every representative type,
// in both modes; head_dim 64 (q8_0 needs a multiple of 32).
TEST_F(SnapshotTest, Q8StoresRoundTripExactly) {
  const KVShape shape{2, 2, 64};
  for (RepresentativeType rep : {RepresentativeType::kMax, RepresentativeType::kMean, RepresentativeType::kQuest,
                                 RepresentativeType::kFix, RepresentativeType::kDynamic}) {
    SCOPED_TRACE(representative_type_name(rep));
    const LongContextConfig cfg = small_config(rep, DType::kQ8_0);
    auto source = make_store(cfg, shape);
    fill_source(*source, 100);
    save_snapshot(*source, path("q8.snap"), kFingerprint);
    EXPECT_EQ(get_le(read_bytes(path("q8.snap")), kKvTypeAt, 4), 3u);
    for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
      auto target = make_store(cfg, shape);
      load_snapshot(*target, path("q8.snap"), kFingerprint, mode);
      expect_same_content(*target, *source);
    }
  }
}

// Version 2, 3 and 4 files (version 5 less q8_0 / with f16 records for q8_0
// / with q8_0 key codes channel by channel) still load without q8_0; one
// claiming q8_0 is refused, saying why.
TEST_F(SnapshotTest, Version2To4FilesLoadWithoutQ8) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto source = make_store(cfg);
  fill_source(*source, 50);
  save_snapshot(*source, path("v5.snap"), kFingerprint);
  for (const uint32_t version : {2u, 3u, 4u}) {
    std::vector<std::byte> f = read_bytes(path("v5.snap"));
    patch_header(f, kVersionAt, version, 4);
    write_bytes(path("old.snap"), f);
    auto target = make_store(cfg);
    load_snapshot(*target, path("old.snap"), kFingerprint);
    expect_same_content(*target, *source);
  }
  std::vector<std::byte> f;

  const KVShape shape{2, 2, 64};
  const LongContextConfig q8 = small_config(RepresentativeType::kQuest, DType::kQ8_0);
  auto q8_source = make_store(q8, shape);
  fill_source(*q8_source, 50);
  save_snapshot(*q8_source, path("q8.snap"), kFingerprint);
  f = read_bytes(path("q8.snap"));
  patch_header(f, kVersionAt, 2, 4);
  write_bytes(path("q8v2.snap"), f);
  auto q8_target = make_store(q8, shape);
  const Error e = error_from([&] { load_snapshot(*q8_target, path("q8v2.snap"), kFingerprint); });
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("q8_0, which format version 2 does not hold"), std::string::npos) << e.what();
  EXPECT_EQ(q8_target->n_tokens(0), 0);

  const std::pair<uint32_t, const char*> refused[] = {
      {3, "version 3 with kv_type q8_0 keeps its representatives in f16"},
      {4, "version 4 with kv_type q8_0 keeps the key codes channel by channel"}};
  for (const auto& [version, why] : refused) {
    f = read_bytes(path("q8.snap"));
    patch_header(f, kVersionAt, version, 4);
    write_bytes(path("q8old.snap"), f);
    const Error old = error_from([&] { load_snapshot(*q8_target, path("q8old.snap"), kFingerprint); });
    EXPECT_EQ(old.code(), ErrorCode::kUnsupported) << version;
    EXPECT_NE(std::string(old.what()).find(why), std::string::npos) << old.what();
    EXPECT_EQ(q8_target->n_tokens(0), 0);
  }
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
  EXPECT_EQ(get_le(f, kVersionAt, 4), 5u);
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

}  // namespace
}  // namespace longctx::kvstore
