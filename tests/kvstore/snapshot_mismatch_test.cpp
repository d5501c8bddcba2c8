// Snapshots of another model or store (fingerprint, layout, token count) are
// rejected naming what differs; a budget too small for the load and a failed
// save leave the store and the folder as they were.
#include "longctx/kvstore/snapshot.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "snapshot_fixture.h"

namespace longctx::kvstore {
namespace {

namespace fs = std::filesystem;
using namespace snapshot_testing;

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

// tail: estimate's records hold the tail sums: they round-trip, and a
// snapshot with or without them loads only into a store with the same tail
// mode, the refusal saying so.
TEST_F(SnapshotTest, TailSumsRoundTripAndTailModesDoNotMix) {
  LongContextConfig with = small_config(RepresentativeType::kQuest);
  with.tail = TailMode::kEstimate;
  const LongContextConfig without = small_config(RepresentativeType::kQuest);
  auto source = make_store(with);
  fill_source(*source, 1700);
  save_snapshot(*source, path("tail.snap"), kFingerprint);
  auto target = make_store(with);
  load_snapshot(*target, path("tail.snap"), kFingerprint);
  expect_same_content(*target, *source);  // records included, so the sums too

  auto plain = make_store(without);
  fill_target(*plain, 1800);
  const StoreImage before = image_of(*plain);
  Error e = error_from([&] { load_snapshot(*plain, path("tail.snap"), kFingerprint); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("saved with tail: estimate, its records hold tail sums"), std::string::npos)
      << e.what();
  expect_unchanged(*plain, before, "after a snapshot with tail sums");

  auto plain_source = make_store(without);
  fill_source(*plain_source, 1900);
  save_snapshot(*plain_source, path("plain.snap"), kFingerprint);
  e = error_from([&] { load_snapshot(*target, path("plain.snap"), kFingerprint); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("a snapshot saved with tail: drop has none"), std::string::npos) << e.what();
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

// A model's sequence holds as many tokens in every layer; asked for that
// (equal_layers), a load refuses a snapshot of another store before touching
// the target, and takes one whose layers agree.
TEST_F(SnapshotTest, EqualLayersRefusesLayersOfDifferentLengths) {
  const LongContextConfig cfg = small_config(RepresentativeType::kQuest);
  auto uneven = make_store(cfg);
  fill_source(*uneven, 1750);  // 13 and 6 tokens
  save_snapshot(*uneven, path("uneven.snap"), kFingerprint);
  auto even = make_store(cfg);
  append_random(*even, 0, 9, 1751);
  append_random(*even, 1, 9, 1752);
  save_snapshot(*even, path("even.snap"), kFingerprint);
  for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
    auto target = make_store(cfg);
    append_random(*target, 0, 5, 1753);
    append_random(*target, 1, 5, 1754);
    const StoreImage before = image_of(*target);
    const Error e = error_from([&] { load_snapshot(*target, path("uneven.snap"), kFingerprint, mode, true); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("layer 1 holds 6 tokens, layer 0 holds 13"), std::string::npos) << e.what();
    expect_unchanged(*target, before, "after an uneven snapshot");
    load_snapshot(*target, path("even.snap"), kFingerprint, mode, true);
    expect_same_content(*target, *even);
    load_snapshot(*target, path("uneven.snap"), kFingerprint, mode);  // a plain store takes it
    expect_same_content(*target, *uneven);
  }
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
