// The KV store: layout sizes, preflight, errors (all-or-nothing appends),
// partition, accessors, clear and NUMA placement. Content against the
// reference is in representatives_test.cpp; the values each type holds and
// refuses (q8_0 rounding, NaN, Inf, overflow) in kv_store_values_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "error_message.h"
#include "kv_reference.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::kvstore {
namespace {

using namespace testref;
using RT = RepresentativeType;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// ---- layout -------------------------------------------------------------------------

struct LayoutCase {
  RT rep;
  int rep_num, block_size, head_dim;
  DType kv;
  // Expected, worked out by hand from the layout comment in kv_store.h.
  int rep_slots;
  size_t page, record, sum_at, importance_at, offsets_at, per_page;
};

TEST(StoreLayout, SizesFollowTheDocumentedLayout) {
  const LayoutCase cases[] = {
      // QUEST: keys 2 x 128 x 2 = 512.
      {RT::kQuest, 2, 128, 128, DType::kF16, 2, 65536, 512, 0, 0, 0, 128},
      // MEAN: keys 256, sum 512 at 256.
      {RT::kMean, 1, 16, 128, DType::kF16, 1, 8192, 768, 256, 0, 0, 85},
      // DYNAMIC R=4: keys 1024, importance 512 at 1024, offsets 16 at 1536 -> 1600.
      {RT::kDynamic, 4, 128, 128, DType::kF16, 4, 65536, 1600, 0, 1024, 1536, 40},
      // FIX R=3: keys 96 -> 128, offsets 12 at 128 -> 192; page 640.
      {RT::kFix, 3, 10, 8, DType::kF32, 3, 640, 192, 0, 0, 128, 341},
      // MAX with one-token blocks: page 32 -> 64, keys 16 -> 64.
      {RT::kMax, 2, 1, 8, DType::kBF16, 1, 64, 64, 0, 0, 0, 1024},
      // DYNAMIC R=1, one-token blocks: keys 2048, importance at 2048, offsets at 2112.
      {RT::kDynamic, 1, 1, 512, DType::kF32, 1, 4096, 2176, 0, 2048, 2112, 30},
      // A record over 64 KiB: one per rep page.
      {RT::kFix, 128, 128, 512, DType::kF32, 128, 524288, 262656, 0, 0, 262144, 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(representative_type_name(c.rep)) + " block " + std::to_string(c.block_size));
    LongContextConfig config = small_config(c.block_size, c.kv, c.rep, c.rep_num, 1024);
    const StoreLayout L = StoreLayout::make({2, 3, c.head_dim}, config);
    EXPECT_EQ(L.rep_slots, c.rep_slots);
    EXPECT_EQ(L.rep_num, c.rep_num);
    EXPECT_EQ(L.page_bytes, c.page);
    EXPECT_EQ(L.record_bytes, c.record);
    EXPECT_EQ(L.record_sum_offset, c.sum_at);
    EXPECT_EQ(L.record_importance_offset, c.importance_at);
    EXPECT_EQ(L.record_offsets_offset, c.offsets_at);
    EXPECT_EQ(L.records_per_rep_page, c.per_page);
    EXPECT_EQ(L.rep_page_bytes, c.per_page * c.record);
    EXPECT_EQ(L.shape.n_kv_heads, 3);
  }
}

TEST(StoreLayout, RejectsShapesItCannotHold) {
  const LongContextConfig ok = small_config(16, DType::kF16, RT::kQuest, 2, 64);
  for (int layers : {0, -1}) expect_error([&] { StoreLayout::make({layers, 1, 64}, ok); }, ErrorCode::kInvalidArgument, {"n_layers"});
  for (int heads : {0, -3}) expect_error([&] { StoreLayout::make({1, heads, 64}, ok); }, ErrorCode::kInvalidArgument, {"n_kv_heads"});
  for (int dim : {0, 4, 12, 100, 520, 1024})
    expect_error([&] { StoreLayout::make({1, 1, dim}, ok); }, ErrorCode::kInvalidArgument, {"head_dim", std::to_string(dim)});
  for (int dim : {8, 16, 136, 512}) EXPECT_NO_THROW(StoreLayout::make({1, 1, dim}, ok));
  LongContextConfig zero_block = ok;
  zero_block.block_size = 0;
  expect_error([&] { StoreLayout::make({1, 1, 64}, zero_block); }, ErrorCode::kInvalidArgument, {"block_size"});
  for (RT rep : {RT::kFix, RT::kDynamic})
    for (int r : {0, 17}) {
      const LongContextConfig bad = small_config(16, DType::kF16, rep, r, 64);
      expect_error([&] { StoreLayout::make({1, 1, 64}, bad); }, ErrorCode::kInvalidArgument, {"representative_num"});
    }
  // representative_num means nothing to MAX/MEAN/QUEST.
  EXPECT_NO_THROW(StoreLayout::make({1, 1, 64}, small_config(16, DType::kF16, RT::kMean, 0, 64)));
  // q8_0: one scale per 32 channels.
  const LongContextConfig q8 = small_config(16, DType::kQ8_0, RT::kQuest, 2, 64);
  for (int dim : {8, 16, 48, 136})
    expect_error([&] { StoreLayout::make({1, 1, dim}, q8); }, ErrorCode::kInvalidArgument,
                 {"q8_0", "multiple of 32", std::to_string(dim)});
  for (int dim : {32, 64, 128, 256, 512}) EXPECT_NO_THROW(StoreLayout::make({1, 1, dim}, q8));
}

// q8_0 pages: codes K^T [d/4][bs][4], K scales f16 [d/32][bs], codes V
// [ceil(bs/4)][d][4], V scales [bs][d/32], back to back; records hold q8_0
// keys: codes, then scales.
TEST(StoreLayout, Q8PagesHoldCodesAndScales) {
  const StoreLayout L = StoreLayout::make({2, 3, 128}, small_config(128, DType::kQ8_0, RT::kQuest, 2, 1024));
  EXPECT_EQ(L.page_k_scales, 128u * 128);
  EXPECT_EQ(L.page_v, 128u * 128 + 128 * 4 * 2);
  EXPECT_EQ(L.page_v_scales, 2u * 128 * 128 + 128 * 4 * 2);
  EXPECT_EQ(L.page_bytes, 2u * 128 * (128 + 8));  // 8.5 bits per value, already a multiple of 64
  EXPECT_EQ(L.record_bytes, 320u);                 // QUEST: 2 x (128 codes + 4 f16 scales) = 272, padded to 64
  EXPECT_EQ(kv_vector_bytes(DType::kQ8_0, 128), 136u);
  EXPECT_EQ(kv_vector_bytes(DType::kF16, 128), 256u);
  // A block of 6 tokens keeps 8 rows of value codes (two whole quads of tokens).
  const StoreLayout odd = StoreLayout::make({1, 1, 64}, small_config(6, DType::kQ8_0, RT::kQuest, 2, 1024));
  EXPECT_EQ(odd.page_v, 6u * 64 + 6 * 2 * 2);
  EXPECT_EQ(odd.page_v_scales, odd.page_v + 8 * 64);
  EXPECT_EQ(odd.page_bytes, 960u);  // 920 + 24 bytes of V scales, rounded up to 64
  EXPECT_EQ(q8_value_code_offset(64, 3, 5), (1u * 64 + 3) * 4 + 1);
  EXPECT_EQ(q8_key_code_offset(6, 5, 2), (1u * 6 + 2) * 4 + 1);
}

// ---- preflight ------------------------------------------------------------------------

TEST(Preflight, DefaultModelNeedsSixteenGiBPlusReps) {
  LongContextConfig config;  // 131072 tokens, block 128, f16, QUEST
  const StoreLayout L = StoreLayout::make({32, 8, 128}, config);
  const Preflight p = preflight(L, config.max_seq_len, std::vector<int>(8, 0));
  EXPECT_EQ(p.kv_bytes_per_token_per_layer, 8u * 128 * 2 * 2);
  EXPECT_EQ(p.rep_bytes_per_block_per_layer, 8u * 512);
  EXPECT_EQ(p.blocks_per_head, 1024u);
  // 64 KiB pages, 32 to a 2 MiB slab: 32 layers x 8 heads x 1024 blocks; rep
  // pages of 128 records (64 KiB): 8 per head and layer.
  const uint64_t pages = 32ull * 8 * 1024, rep_pages = 32ull * 8 * 8;
  EXPECT_EQ(p.total_bytes, pages / 32 * 2 * kMiB + rep_pages / 32 * 2 * kMiB);
  ASSERT_EQ(p.bytes_per_node.size(), 1u);
  EXPECT_EQ(p.bytes_per_node[0], p.total_bytes);
  const std::string text = p.describe();
  EXPECT_NE(text.find("KV store for 131072 tokens x 32 layers: "), std::string::npos) << text;
  EXPECT_NE(text.find(format_bytes(p.total_bytes)), std::string::npos) << text;
  EXPECT_NE(text.find(std::string("(128.00 KiB per token; 8 kv heads x 128 dims f16 + ") +
                      representative_type_name(RT::kQuest) + " reps)"),
            std::string::npos)
      << text;
}

TEST(Preflight, IsSlabBytesPerNodeForPagesAndRepPages) {
  std::mt19937 rng(test_seed(3));
  for (int trial = 0; trial < 20; ++trial) {
    const RT rep = RT(rng() % 5);
    const int bs = 1 + int(rng() % 200);
    const int dim = 8 * (1 + int(rng() % 64));
    const int heads = 1 + int(rng() % 9);
    const int layers = 1 + int(rng() % 5);
    const int64_t max_len = 1 + int64_t(rng() % 100000);
    const int nodes = 1 + int(rng() % 3);
    const LongContextConfig config = small_config(bs, DType(rng() % 3), rep, 1 + int(rng() % uint32_t(bs)), max_len);
    const StoreLayout L = StoreLayout::make({layers, heads, dim}, config);
    std::vector<int> node_list;
    for (int n = 0; n < nodes; ++n) node_list.push_back(n);
    const std::vector<int> head_nodes = place_kv_heads(heads, node_list);
    const Preflight p = preflight(L, max_len, head_nodes);
    const uint64_t blocks = uint64_t((max_len + bs - 1) / bs);
    const uint64_t reps = (blocks + L.records_per_rep_page - 1) / L.records_per_rep_page;
    EXPECT_EQ(p.blocks_per_head, blocks);
    uint64_t total = 0;
    for (int n = 0; n < nodes; ++n) {
      const uint64_t on = uint64_t(std::count(head_nodes.begin(), head_nodes.end(), n)) * uint64_t(layers);
      const uint64_t want = on == 0 ? 0
                                    : BlockPool::slab_bytes_for(size_t(on * blocks), L.page_bytes) +
                                          BlockPool::slab_bytes_for(size_t(on * reps), L.rep_page_bytes);
      if (size_t(n) < p.bytes_per_node.size()) {
        EXPECT_EQ(p.bytes_per_node[size_t(n)], want) << "node " << n;
      }
      total += want;
    }
    EXPECT_EQ(p.total_bytes, total);
  }
}

TEST(KVStore, RefusesBeforeAllocatingWhenPreflightExceedsBudget) {
  const KVShape shape{2, 2, 64};
  const LongContextConfig config = small_config(16, DType::kF16, RT::kQuest, 2, 4000);
  const Preflight p = preflight(StoreLayout::make(shape, config), config.max_seq_len, {0, 0});
  const NumaTopology topology = NumaTopology::detect();
  MemoryBudget budget(p.total_bytes - 1);
  expect_error([&] { KVStore store(shape, config, budget, topology); }, ErrorCode::kOutOfMemory,
               {std::to_string(p.total_bytes), std::to_string(p.total_bytes - 1), "max_seq_len", "kv_type", "dram_budget"});
  EXPECT_EQ(budget.used(), 0u);
  // Someone else holding part of the budget counts too.
  MemoryBudget shared(p.total_bytes);
  shared.reserve(1, "another user");
  EXPECT_THROW(KVStore(shape, config, shared, topology), Error);
  EXPECT_EQ(shared.used(), 1u);
  MemoryBudget exact(p.total_bytes);
  EXPECT_NO_THROW(KVStore(shape, config, exact, topology));
}

// Filling every layer to max_seq_len maps exactly what preflight said.
TEST(KVStore, FullStoreUsesExactlyThePreflightBytes) {
  for (RT rep : {RT::kQuest, RT::kDynamic, RT::kMean}) {
    const KVShape shape{3, 3, 64};
    const LongContextConfig config = small_config(16, DType::kF16, rep, 3, 3000);
    const Preflight p = preflight(StoreLayout::make(shape, config), config.max_seq_len, {0, 0, 0});
    TestStore ts = make_store(shape, config, p.total_bytes);
    std::mt19937 rng(test_seed(1));
    const Input k = random_input(rng, 3000, 3, 64, DType::kF16, false);
    const Input v = random_input(rng, 3000, 3, 64, DType::kF16, false);
    for (int layer = 0; layer < 3; ++layer) {
      ts.store->append(layer, slice_tokens(k.view, 0, 1000), slice_tokens(v.view, 0, 1000));
      ts.store->append(layer, slice_tokens(k.view, 1000, 3000), slice_tokens(v.view, 1000, 3000));
    }
    EXPECT_EQ(ts.budget->used(), p.total_bytes);
    EXPECT_EQ(ts.store->memory_stats().reserved_bytes, p.total_bytes);
    const StoreBytes before = store_bytes(*ts.store);
    expect_error([&] { ts.store->append(1, slice_tokens(k.view, 0, 1), slice_tokens(v.view, 0, 1)); },
                 ErrorCode::kInvalidArgument, {"layer 1", "3000", "max_seq_len"});
    EXPECT_TRUE(before == store_bytes(*ts.store));
  }
}

// ---- append errors --------------------------------------------------------------------

TEST(KVStore, AppendRejectsBadInputAndLeavesStoreUnchanged) {
  const KVShape shape{2, 2, 16};
  TestStore ts = make_store(shape, small_config(4, DType::kBF16, RT::kDynamic, 2, 20));
  KVStore& s = *ts.store;
  std::mt19937 rng(test_seed(2));
  const Input k = random_input(rng, 6, 2, 16, DType::kF32, false);
  const Input v = random_input(rng, 6, 2, 16, DType::kF32, false);
  s.append(0, k.view, v.view);
  const StoreBytes before = store_bytes(s);
  const uint64_t used_before = s.memory_stats().used_bytes;

  const Input k3 = random_input(rng, 6, 3, 16, DType::kF32, false);
  const Input k8 = random_input(rng, 6, 2, 8, DType::kF32, false);
  const Input v5 = random_input(rng, 5, 2, 16, DType::kF32, false);
  std::vector<float> imp(12, 1.f);
  std::vector<float> imp_nan = imp;
  imp_nan[7] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint16_t> imp_f16(12, 0);
  TensorView k_2d = k.view;
  k_2d.rank = 2;
  k_2d.shape = {6, 32, 0, 0};
  k_2d.strides = {32, 1, 0, 0};
  std::vector<float> wide(6 * 2 * 32, 0.f);  // every other float of it
  TensorView k_strided_inner = make_view(wide.data(), DType::kF32, {6, 2, 16});
  k_strided_inner.strides = {64, 32, 2, 0};

  const TensorView none{};
  expect_error([&] { s.append(-1, k.view, v.view); }, ErrorCode::kInvalidArgument, {"layer -1", "[0, 2)"});
  expect_error([&] { s.append(2, k.view, v.view); }, ErrorCode::kInvalidArgument, {"layer 2"});
  expect_error([&] { s.append(1, k3.view, v.view); }, ErrorCode::kInvalidArgument, {"KV store append (layer 1): k:"});
  expect_error([&] { s.append(1, k8.view, k8.view); }, ErrorCode::kInvalidArgument, {"k"});
  expect_error([&] { s.append(1, k.view, v5.view); }, ErrorCode::kInvalidArgument, {"KV store append (layer 1): v:"});
  expect_error([&] { s.append(1, k_2d, v.view); }, ErrorCode::kInvalidArgument, {"k"});
  expect_error([&] { s.append(1, k_strided_inner, v.view); }, ErrorCode::kInvalidArgument,
               {"KV store append (layer 1): k: innermost"});
  expect_error([&] { s.append(1, k.view, v.view, make_view(imp.data(), DType::kF32, {6, 3})); },
               ErrorCode::kInvalidArgument, {"KV store append (layer 1): importance:"});
  expect_error([&] { s.append(1, k.view, v.view, make_view(imp.data(), DType::kF32, {12})); },
               ErrorCode::kInvalidArgument, {"importance"});
  expect_error([&] { s.append(1, k.view, v.view, make_view(imp_f16.data(), DType::kF16, {6, 2})); },
               ErrorCode::kInvalidArgument, {"importance"});
  expect_error([&] { s.append(1, k.view, v.view, make_view(imp_nan.data(), DType::kF32, {6, 2})); },
               ErrorCode::kInvalidArgument, {"importance", "[3, 1]"});
  // Capacity: 6 held in layer 0, 15 more exceed 20.
  const Input k15 = random_input(rng, 15, 2, 16, DType::kF16, false);
  expect_error([&] { s.append(0, k15.view, k15.view, none); }, ErrorCode::kInvalidArgument,
               {"layer 0", "6", "15", "max_seq_len 20"});
  EXPECT_TRUE(before == store_bytes(s));
  EXPECT_EQ(s.memory_stats().used_bytes, used_before);

  // n == 0 is a no-op, even on a layer with nothing yet.
  s.append(1, make_view(nullptr, DType::kF16, {0, 2, 16}), make_view(nullptr, DType::kF16, {0, 2, 16}));
  EXPECT_TRUE(before == store_bytes(s));
  EXPECT_EQ(s.n_tokens(1), 0);
}

// A budget that runs out in the middle of a multi-head append: the heads that
// got pages give them back, and nothing changes.
TEST(KVStore, BudgetExhaustedMidAppendLeavesStoreUnchanged) {
  struct Scenario {
    const char* what;
    KVShape shape;
    LongContextConfig config;
    int64_t first, second;  // tokens appended before / in the failing append
  };
  const Scenario scenarios[] = {
      // 64 KiB pages, 32 per slab: 7 blocks x 4 heads use 28; 2 more blocks per
      // head fit heads 0 and 1, head 2 needs a second slab.
      {"block pages", {1, 4, 128}, small_config(64, DType::kF32, RT::kQuest, 2, 4096), 7 * 64, 128},
      // 192-byte DYNAMIC records, 341 per rep page, 32 rep pages per slab: 16
      // rep pages per head fill it; head 0 gets its page, then its rep page fails.
      {"rep pages", {1, 2, 8}, small_config(1, DType::kF16, RT::kDynamic, 1, 8000), 16 * 341, 1},
  };
  for (const auto& sc : scenarios) {
    SCOPED_TRACE(sc.what);
    TestStore ts = make_store(sc.shape, sc.config);
    KVStore& s = *ts.store;
    std::mt19937 rng(test_seed(4));
    const int heads = sc.shape.n_kv_heads, dim = sc.shape.head_dim;
    const Input k = random_input(rng, sc.first + sc.second, heads, dim, DType::kF32, true);
    const Input v = random_input(rng, sc.first + sc.second, heads, dim, DType::kF32, true);
    const std::vector<float> imp = random_importance(rng, sc.first + sc.second, heads);
    const bool dynamic = sc.config.representative_type == RT::kDynamic;
    auto importance = [&](int64_t a, int64_t b) { return dynamic ? importance_view(imp, a, b, heads) : TensorView{}; };
    s.append(0, slice_tokens(k.view, 0, sc.first), slice_tokens(v.view, 0, sc.first), importance(0, sc.first));
    ASSERT_EQ(ts.budget->used(), 2 * 2 * kMiB) << "one slab per pool expected";
    const uint64_t rest = ts.budget->available();
    ts.budget->reserve(rest, "test");
    const StoreBytes before = store_bytes(s);
    const MemoryStats stats_before = s.memory_stats();
    const int64_t end = sc.first + sc.second;
    expect_error([&] {
      s.append(0, slice_tokens(k.view, sc.first, end), slice_tokens(v.view, sc.first, end), importance(sc.first, end));
    }, ErrorCode::kOutOfMemory, {});
    EXPECT_TRUE(before == store_bytes(s));
    EXPECT_EQ(s.memory_stats().used_bytes, stats_before.used_bytes);
    EXPECT_EQ(s.memory_stats().reserved_bytes, stats_before.reserved_bytes);
    // With the budget back, the same append succeeds and the store matches the reference.
    ts.budget->release(rest);
    s.append(0, slice_tokens(k.view, sc.first, end), slice_tokens(v.view, sc.first, end), importance(sc.first, end));
    RefLayer ref;
    ref_append(ref, k, v, 0, end, dynamic ? imp.data() : nullptr, sc.config.kv_type);
    EXPECT_TRUE(layer_matches(s, 0, ref));
  }
}

// ---- partition ------------------------------------------------------------------------

TEST(KVStore, PartitionMatchesPerTokenClassification) {
  enum Kind { kInitial, kContext, kLocal };
  for (int bs : {1, 4, 16})
    for (int initial : {0, 1, 5, 16, 40})
      for (int local : {0, 1, 7, 16, 50}) {
        SCOPED_TRACE("block " + std::to_string(bs) + " initial " + std::to_string(initial) + " local " +
                     std::to_string(local));
        LongContextConfig config = small_config(bs, DType::kF16, RT::kMax, 1, 80);
        config.initial_len = initial;
        config.local_windows_len = local;
        TestStore ts = make_store({1, 1, 8}, config);
        std::mt19937 rng(test_seed(uint32_t(bs * 10000 + initial * 100 + local)));
        const Input k = random_input(rng, 80, 1, 8, DType::kF16, false);
        for (int64_t n = 0; n <= 80; ++n) {
          if (n > 0) ts.store->append(0, slice_tokens(k.view, n - 1, n), slice_tokens(k.view, n - 1, n));
          const Partition p = ts.store->partition(0);
          ASSERT_EQ(p.n_tokens, n);
          std::vector<Kind> kind(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) kind[size_t(i)] = i < initial ? kInitial : i >= n - local ? kLocal : kContext;
          int64_t first_block = -1, end_block = -1;
          for (int64_t i = 0; i < n; ++i) {
            const Kind from_partition = i < p.initial_end ? kInitial : i >= p.local_begin ? kLocal : kContext;
            ASSERT_EQ(from_partition, kind[size_t(i)]) << "n " << n << " token " << i;
            if (kind[size_t(i)] == kContext) {
              if (first_block < 0) first_block = i / bs;
              end_block = i / bs + 1;
            }
          }
          ASSERT_LE(p.initial_end, p.local_begin);
          ASSERT_LE(p.local_begin, n);
          if (first_block < 0) {
            EXPECT_EQ(p.first_context_block, p.end_context_block) << "n " << n;
          } else {
            EXPECT_EQ(p.first_context_block, first_block) << "n " << n;
            EXPECT_EQ(p.end_context_block, end_block) << "n " << n;
          }
          for (int64_t b = 0; b < (n + bs - 1) / bs + 2; ++b) {
            int64_t lo = -1, hi = -1;
            for (int64_t i = b * bs; i < std::min<int64_t>(n, (b + 1) * bs); ++i)
              if (kind[size_t(i)] == kContext) {
                if (lo < 0) lo = i;
                hi = i + 1;
              }
            const int64_t begin = p.context_begin_of(b, bs), end = p.context_end_of(b, bs);
            if (lo < 0) {
              EXPECT_EQ(begin, end) << "n " << n << " block " << b;
            } else {
              EXPECT_EQ(begin, lo) << "n " << n << " block " << b;
              EXPECT_EQ(end, hi) << "n " << n << " block " << b;
            }
          }
        }
      }
}

// ---- accessors, clear, memory -------------------------------------------------------------

TEST(KVStore, AccessorsAreBoundsChecked) {
  TestStore ts = make_store({2, 3, 8}, small_config(4, DType::kF16, RT::kFix, 2, 40));
  KVStore& s = *ts.store;
  std::mt19937 rng(test_seed(6));
  const Input k = random_input(rng, 9, 3, 8, DType::kF16, false);
  s.append(1, k.view, k.view);  // layer 1: 3 blocks; layer 0: none
  EXPECT_EQ(s.n_blocks(1), 3);
  EXPECT_EQ(s.block(1, 2, 2).n_filled, 1);
  EXPECT_EQ(s.valid_rep_slots(1, 0, 2), 1);  // offsets 0, 2; one token
  EXPECT_EQ(s.valid_rep_slots(1, 0, 1), 2);
  const std::vector<std::pair<std::function<void()>, std::vector<std::string>>> calls = {
      {[&] { s.block(-1, 0, 0); }, {"layer -1", "[0, 2)"}},
      {[&] { s.block(2, 0, 0); }, {"layer 2"}},
      {[&] { s.block(1, 3, 0); }, {"kv head 3", "[0, 3)"}},
      {[&] { s.block(1, -1, 0); }, {"kv head -1"}},
      {[&] { s.block(1, 0, 3); }, {"block 3", "[0, 3)", "layer 1", "9 tokens"}},
      {[&] { s.block(1, 0, -1); }, {"block -1"}},
      {[&] { s.block(0, 0, 0); }, {"block 0", "[0, 0)", "layer 0"}},
      {[&] { s.rep_record(1, 0, 3); }, {"rep_record", "block 3"}},
      {[&] { s.rep_record(1, 5, 0); }, {"rep_record", "kv head 5"}},
      {[&] { s.valid_rep_slots(1, 0, 7); }, {"valid_rep_slots", "block 7"}},
      {[&] { s.valid_rep_slots(9, 0, 0); }, {"valid_rep_slots", "layer 9"}},
      {[&] { s.n_tokens(2); }, {"layer 2"}},
      {[&] { s.partition(-1); }, {"layer -1"}},
  };
  for (const auto& [call, fragments] : calls) expect_error(call, ErrorCode::kInvalidArgument, fragments);
}

TEST(KVStore, ClearReturnsPagesAndKeepsSlabs) {
  const KVShape shape{2, 2, 64};
  const LongContextConfig config = small_config(16, DType::kF16, RT::kMean, 1, 500);
  TestStore ts = make_store(shape, config);
  std::mt19937 rng(test_seed(7));
  const Input k = random_input(rng, 300, 2, 64, DType::kF32, false);
  const Input v = random_input(rng, 300, 2, 64, DType::kF32, false);
  auto fill = [&] {
    ts.store->append(0, k.view, v.view);
    ts.store->append(1, slice_tokens(k.view, 0, 45), slice_tokens(v.view, 0, 45));
  };
  fill();
  const StoreBytes first = store_bytes(*ts.store);
  const MemoryStats full = ts.store->memory_stats();
  const StoreLayout& L = ts.store->layout();
  EXPECT_EQ(full.used_bytes, (2 * (19 + 3)) * L.page_bytes + 4 * L.rep_page_bytes);
  ts.store->clear();
  const MemoryStats empty = ts.store->memory_stats();
  EXPECT_EQ(ts.store->n_tokens(0), 0);
  EXPECT_EQ(ts.store->n_tokens(1), 0);
  EXPECT_EQ(ts.store->n_blocks(0), 0);
  EXPECT_EQ(empty.used_bytes, 0u);
  EXPECT_EQ(empty.reserved_bytes, full.reserved_bytes);
  EXPECT_EQ(empty.budget_used_bytes, full.budget_used_bytes);
  EXPECT_TRUE(SnapshotAccess::pages(*ts.store, 0, 0).empty());
  // Reused pages come back zeroed: the same appends give the same bytes.
  fill();
  EXPECT_TRUE(first == store_bytes(*ts.store));
  EXPECT_EQ(ts.store->memory_stats().reserved_bytes, full.reserved_bytes);
}

// Truncating to whole blocks leaves what appending only the kept tokens
// leaves (pages, records, memory), and the store goes on from there.
TEST(KVStore, TruncateToWholeBlocksEqualsAppendingOnlyThoseTokens) {
  struct Case {
    RT rep;
    int rep_num;
    DType kv;
  };
  for (const Case& c : {Case{RT::kQuest, 2, DType::kF16}, Case{RT::kMean, 1, DType::kBF16},
                        Case{RT::kDynamic, 4, DType::kF32}, Case{RT::kFix, 3, DType::kQ8_0}}) {
    SCOPED_TRACE(representative_type_name(c.rep));
    const KVShape shape{2, 2, 64};
    const int64_t n = 6000;  // more blocks than a ~64 KiB rep page holds records
    const LongContextConfig config = small_config(16, c.kv, c.rep, c.rep_num, n);
    std::mt19937 rng(test_seed(11));
    const Input k = random_input(rng, n, 2, 64, DType::kF32, false);
    const Input v = random_input(rng, n, 2, 64, DType::kF32, false);
    auto append = [&](KVStore& store, int64_t begin, int64_t end) {
      for (int layer = 0; layer < 2; ++layer)
        store.append(layer, slice_tokens(k.view, begin, end), slice_tokens(v.view, begin, end));
    };
    TestStore full = make_store(shape, config);
    append(*full.store, 0, n);
    const StoreBytes all = store_bytes(*full.store);
    // Keep nothing, 3 blocks (inside the first rep page), 300 blocks (past it).
    for (int64_t keep : {int64_t{0}, int64_t{48}, int64_t{4800}}) {
      SCOPED_TRACE(keep);
      TestStore fresh = make_store(shape, config);
      append(*fresh.store, 0, keep);
      TestStore cut = make_store(shape, config);
      append(*cut.store, 0, n);
      cut.store->truncate(keep);
      EXPECT_TRUE(store_bytes(*cut.store) == store_bytes(*fresh.store));
      EXPECT_EQ(cut.store->memory_stats().used_bytes, fresh.store->memory_stats().used_bytes);
      append(*cut.store, keep, n);
      EXPECT_TRUE(store_bytes(*cut.store) == all);
    }
    // Refused, store unchanged: inside a block, more than a layer holds, negative.
    TestStore odd = make_store(shape, config);
    append(*odd.store, 0, 100);
    odd.store->append(1, slice_tokens(k.view, 100, 120), slice_tokens(v.view, 100, 120));
    const StoreBytes before = store_bytes(*odd.store);
    expect_error([&] { odd.store->truncate(40); }, ErrorCode::kInvalidArgument, {"40 tokens", "16-token blocks"});
    expect_error([&] { odd.store->truncate(112); }, ErrorCode::kInvalidArgument, {"keep 112", "layer 0 holds 100"});
    expect_error([&] { odd.store->truncate(-16); }, ErrorCode::kInvalidArgument, {"-16 tokens"});
    EXPECT_TRUE(store_bytes(*odd.store) == before);
  }
}

// Any token/head strides: a head-major buffer seen as [n, heads, dim].
TEST(KVStore, ArbitraryOuterStridesGiveTheSameBytes) {
  const int n = 37, heads = 3, dim = 32;
  const LongContextConfig config = small_config(16, DType::kF16, RT::kQuest, 2, n);
  std::mt19937 rng(test_seed(8));
  const Input k = random_input(rng, n, heads, dim, DType::kF32, false);
  const Input v = random_input(rng, n, heads, dim, DType::kF32, false);
  std::vector<float> k_head_major(size_t(n) * heads * dim), v_head_major(k_head_major.size());
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < dim; ++c) {
        k_head_major[(size_t(h) * n + t) * dim + c] = k.at(t, h, c);
        v_head_major[(size_t(h) * n + t) * dim + c] = v.at(t, h, c);
      }
  auto head_major_view = [&](const std::vector<float>& buf) {
    TensorView view = make_view(buf.data(), DType::kF32, {n, heads, dim});
    view.strides = {dim, int64_t(n) * dim, 1, 0};
    return view;
  };
  TestStore a = make_store({1, heads, dim}, config);
  TestStore b = make_store({1, heads, dim}, config);
  a.store->append(0, k.view, v.view);
  b.store->append(0, head_major_view(k_head_major), head_major_view(v_head_major));
  EXPECT_TRUE(store_bytes(*a.store) == store_bytes(*b.store));
}

// ---- add_importance errors -------------------------------------------------------------

TEST(KVStore, AddImportanceValidatesBeforeChanging) {
  TestStore dyn = make_store({2, 2, 8}, small_config(4, DType::kF32, RT::kDynamic, 2, 40));
  std::mt19937 rng(test_seed(10));
  const Input k = random_input(rng, 10, 2, 8, DType::kF32, false);
  dyn.store->append(0, k.view, k.view);
  const StoreBytes before = store_bytes(*dyn.store);
  std::vector<float> ones(40, 1.f);
  std::vector<float> inf = ones;
  inf[3] = std::numeric_limits<float>::infinity();
  KVStore& s = *dyn.store;
  expect_error([&] { s.add_importance(0, 8, importance_view(ones, 0, 3, 2)); }, ErrorCode::kInvalidArgument,
               {"[8, 11)", "layer 0", "10 tokens"});
  expect_error([&] { s.add_importance(0, -1, importance_view(ones, 0, 1, 2)); }, ErrorCode::kInvalidArgument, {"-1"});
  expect_error([&] { s.add_importance(1, 0, importance_view(ones, 0, 1, 2)); }, ErrorCode::kInvalidArgument,
               {"layer 1", "0 tokens"});
  expect_error([&] { s.add_importance(2, 0, importance_view(ones, 0, 1, 2)); }, ErrorCode::kInvalidArgument, {"layer 2"});
  expect_error([&] { s.add_importance(0, 0, make_view(ones.data(), DType::kF32, {2, 3})); }, ErrorCode::kInvalidArgument,
               {"KV store add_importance (layer 0): importance:"});
  expect_error([&] { s.add_importance(0, 0, importance_view(inf, 0, 4, 2)); }, ErrorCode::kInvalidArgument,
               {"importance", "[1, 1]"});
  EXPECT_TRUE(before == store_bytes(s));
  s.add_importance(0, 10, importance_view(ones, 0, 0, 2));  // empty range at the end: fine
  EXPECT_TRUE(before == store_bytes(s));

  TestStore quest = make_store({1, 2, 8}, small_config(4, DType::kF32, RT::kQuest, 2, 40));
  quest.store->append(0, k.view, k.view);
  expect_error([&] { quest.store->add_importance(0, 0, importance_view(ones, 0, 1, 2)); }, ErrorCode::kInvalidArgument,
               {"DYNAMIC"});
}

// ---- NUMA -----------------------------------------------------------------------------------

TEST(KVStore, TwoNodeTopologyPlacesHeadsAndCountsMemoryPerNode) {
  const KVShape shape{2, 5, 64};
  LongContextConfig config = small_config(16, DType::kF16, RT::kQuest, 2, 200);
  TestStore ts = make_store(shape, config, uint64_t{1} << 30, "pack:2 numa:1 core:1 pu:1");
  KVStore& s = *ts.store;
  ASSERT_EQ(ts.topology->node_count(), 2);
  // Contiguous groups: head h on node h * 2 / 5 -> 0, 0, 0, 1, 1.
  const std::vector<int> expected{0, 0, 0, 1, 1};
  EXPECT_EQ(s.head_nodes(), expected);
  for (int h = 0; h < 5; ++h) EXPECT_EQ(s.node_of_head(h), expected[size_t(h)]);
  EXPECT_EQ(s.head_nodes(), place_kv_heads(5, {0, 1}));

  std::mt19937 rng(test_seed(12));
  const Input k = random_input(rng, 200, 5, 64, DType::kBF16, true);
  const Input v = random_input(rng, 200, 5, 64, DType::kBF16, true);
  s.append(0, k.view, v.view);
  s.append(1, slice_tokens(k.view, 0, 70), slice_tokens(v.view, 0, 70));
  RefLayer ref0, ref1;
  ref_append(ref0, k, v, 0, 200, nullptr, DType::kF16);
  ref_append(ref1, k, v, 0, 70, nullptr, DType::kF16);
  EXPECT_TRUE(layer_matches(s, 0, ref0));
  EXPECT_TRUE(layer_matches(s, 1, ref1));

  const StoreLayout& L = s.layout();
  const MemoryStats m = s.memory_stats();
  ASSERT_EQ(m.reserved_bytes_per_node.size(), 2u);
  EXPECT_EQ(m.reserved_bytes_per_node[0] + m.reserved_bytes_per_node[1], m.reserved_bytes);
  EXPECT_EQ(m.reserved_bytes, ts.budget->used());
  EXPECT_EQ(m.budget_used_bytes, ts.budget->used());
  EXPECT_EQ(m.budget_bytes, uint64_t{1} << 30);
  const size_t blocks = 13 + 5;  // per head: 200 and 70 tokens of 16
  EXPECT_EQ(m.used_bytes, 5 * blocks * L.page_bytes + 5 * 2 * L.rep_page_bytes);
  for (int node = 0; node < 2; ++node) {
    const size_t heads = node == 0 ? 3 : 2;
    EXPECT_EQ(m.reserved_bytes_per_node[size_t(node)],
              BlockPool::slab_bytes_for(heads * blocks, L.page_bytes) +
                  BlockPool::slab_bytes_for(heads * 2, L.rep_page_bytes))
        << "node " << node;
  }

  // numa: [1] puts every head on node 1.
  config.numa.kind = NumaPolicy::Kind::kNodes;
  config.numa.nodes = {1};
  TestStore one = make_store(shape, config, uint64_t{1} << 30, "pack:2 numa:1 core:1 pu:1");
  EXPECT_EQ(one.store->head_nodes(), std::vector<int>(5, 1));
  one.store->append(0, k.view, v.view);
  const MemoryStats m1 = one.store->memory_stats();
  EXPECT_EQ(m1.reserved_bytes_per_node[0], 0u);
  EXPECT_EQ(m1.reserved_bytes_per_node[1], m1.reserved_bytes);
  EXPECT_GT(m1.reserved_bytes, 0u);
}

}  // namespace
}  // namespace longctx::kvstore
