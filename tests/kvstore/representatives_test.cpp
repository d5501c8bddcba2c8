// The KV store's pages and representative records against a plain reference
// (kv_reference.h), over block sizes, head dims, dtypes, representative types
// and the ways tokens can arrive (one chunk, random chunks, token by token).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include "kv_reference.h"
#include "test_seed.h"

namespace longctx::kvstore {
namespace {

using namespace testref;
using RT = RepresentativeType;

const RT kTypes[] = {RT::kMax, RT::kMean, RT::kQuest, RT::kFix, RT::kDynamic};
const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
const int kBlockSizes[] = {1, 16, 64, 128};
const int kHeadDims[] = {8, 64, 128, 256};

enum class Arrival { kOneChunk, kRandomChunks, kTokenByToken };
const char* arrival_name(Arrival a) {
  return a == Arrival::kOneChunk ? "one chunk" : a == Arrival::kRandomChunks ? "random chunks" : "token by token";
}

struct Case {
  RT rep;
  DType kv;
  int block_size;
  int head_dim;
  int rep_num;
  std::vector<int64_t> tokens;  // per layer
  bool tail = false;            // tail: estimate (records hold the tail sums)
  std::string describe() const {
    std::ostringstream s;
    s << representative_type_name(rep) << " " << dtype_name(kv) << " block " << block_size << " head_dim " << head_dim
      << " R " << rep_num << (tail ? " tail" : "") << " tokens";
    for (int64_t n : tokens) s << " " << n;
    return s.str();
  }
};

// The data a case appends to each layer.
struct LayerData {
  Input k, v;
  std::vector<float> importance;  // [n][heads]; empty: never passed
};

constexpr int kHeads = 2;

// Cuts [0, n) into the pieces one arrival mode appends.
std::vector<int64_t> cut_points(Arrival arrival, int64_t n, int block_size, std::mt19937& rng) {
  std::vector<int64_t> cuts{0};
  if (arrival == Arrival::kOneChunk) {
    cuts.push_back(n);
  } else if (arrival == Arrival::kTokenByToken) {
    for (int64_t t = 1; t <= n; ++t) cuts.push_back(t);
  } else {
    while (cuts.back() < n) {
      const int64_t step = 1 + int64_t(rng() % uint32_t(2 * block_size + 3));
      cuts.push_back(std::min(n, cuts.back() + step));
    }
  }
  return cuts;
}

// Importance passed with a chunk: absent when every value in it is 0 (every
// other time), so "absent means 0" is exercised against an explicit 0.
TensorView chunk_importance(const LayerData& data, int64_t begin, int64_t end, bool allow_absent) {
  if (data.importance.empty()) return TensorView{};
  bool all_zero = true;
  for (int64_t i = begin * kHeads; i < end * kHeads; ++i) all_zero = all_zero && data.importance[size_t(i)] == 0.f;
  if (all_zero && allow_absent) return TensorView{};
  return importance_view(data.importance, begin, end, kHeads);
}

// Appends every layer's data in the given arrival mode, layers interleaved.
void fill(KVStore& store, const std::vector<LayerData>& layers, Arrival arrival, uint32_t seed) {
  std::mt19937 rng(test_seed(seed));
  std::vector<std::vector<int64_t>> cuts;
  for (const auto& d : layers) cuts.push_back(cut_points(arrival, d.k.n, store.layout().block_size, rng));
  for (size_t step = 1;; ++step) {
    bool any = false;
    for (size_t layer = 0; layer < layers.size(); ++layer) {
      if (step >= cuts[layer].size()) continue;
      any = true;
      const int64_t begin = cuts[layer][step - 1], end = cuts[layer][step];
      const LayerData& d = layers[layer];
      store.append(int(layer), slice_tokens(d.k.view, begin, end), slice_tokens(d.v.view, begin, end),
                   chunk_importance(d, begin, end, step % 2 == 0));
    }
    if (!any) break;
  }
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.describe());
  std::mt19937 rng(test_seed(seed));
  const int n_layers = int(c.tokens.size());
  const int64_t max_seq_len = *std::max_element(c.tokens.begin(), c.tokens.end());
  LongContextConfig config = small_config(c.block_size, c.kv, c.rep, c.rep_num, max_seq_len);
  if (c.tail) config.tail = TailMode::kEstimate;
  const KVShape shape{n_layers, kHeads, c.head_dim};

  std::vector<LayerData> data;
  std::vector<RefLayer> ref(static_cast<size_t>(n_layers));
  for (int layer = 0; layer < n_layers; ++layer) {
    const DType src = kDtypes[rng() % 3];
    const bool strided = rng() % 2 == 0;
    LayerData d;
    d.k = random_input(rng, c.tokens[size_t(layer)], kHeads, c.head_dim, src, strided);
    d.v = random_input(rng, c.tokens[size_t(layer)], kHeads, c.head_dim, src, strided);
    // DYNAMIC uses importances; MAX gets some too, which it must ignore.
    if (c.rep == RT::kDynamic || c.rep == RT::kMax) {
      d.importance = random_importance(rng, d.k.n, kHeads);
      // A zero stretch, passed as "absent" by some arrivals.
      const int64_t z0 = int64_t(rng() % uint32_t(d.k.n)), z1 = std::min<int64_t>(d.k.n, z0 + c.block_size);
      for (int64_t i = z0 * kHeads; i < z1 * kHeads; ++i) d.importance[size_t(i)] = 0.f;
    }
    const bool dynamic = c.rep == RT::kDynamic && !d.importance.empty();
    ref_append(ref[size_t(layer)], d.k, d.v, 0, d.k.n, dynamic ? d.importance.data() : nullptr, c.kv);
    data.push_back(std::move(d));
  }

  std::vector<TestStore> stores;
  for (Arrival arrival : {Arrival::kOneChunk, Arrival::kRandomChunks, Arrival::kTokenByToken}) {
    stores.push_back(make_store(shape, config));
    fill(*stores.back().store, data, arrival, seed + 1);
  }
  // (1) + (2): the one-chunk store against the reference, (3) every arrival byte-identical to it.
  for (int layer = 0; layer < n_layers; ++layer) ASSERT_TRUE(layer_matches(*stores[0].store, layer, ref[size_t(layer)]));
  const StoreBytes whole = store_bytes(*stores[0].store);
  EXPECT_TRUE(whole == store_bytes(*stores[1].store)) << arrival_name(Arrival::kRandomChunks);
  EXPECT_TRUE(whole == store_bytes(*stores[2].store)) << arrival_name(Arrival::kTokenByToken);

  if (c.rep != RT::kDynamic) return;
  // add_importance over random ranges, some crossing blocks, some single tokens.
  for (int round = 0; round < 6; ++round) {
    const int layer = int(rng() % uint32_t(n_layers));
    const int64_t n = c.tokens[size_t(layer)];
    const int64_t first = int64_t(rng() % uint32_t(n));
    const int64_t count = 1 + int64_t(rng() % uint32_t(std::min<int64_t>(n - first, 2 * c.block_size + 1)));
    const std::vector<float> delta = random_importance(rng, count, kHeads);
    for (auto& ts : stores) ts.store->add_importance(layer, first, importance_view(delta, 0, count, kHeads));
    ref_add_importance(ref[size_t(layer)], first, delta, kHeads);
  }
  for (int layer = 0; layer < n_layers; ++layer) ASSERT_TRUE(layer_matches(*stores[0].store, layer, ref[size_t(layer)]));
  const StoreBytes after = store_bytes(*stores[0].store);
  EXPECT_TRUE(after == store_bytes(*stores[1].store)) << "after add_importance, random chunks";
  EXPECT_TRUE(after == store_bytes(*stores[2].store)) << "after add_importance, token by token";
}

// A random representative_num (FIX/DYNAMIC) and token counts of two layers:
// blocks of one token, or a layer ending inside its third block and one
// layer short of a block.
void randomize_counts(Case& c, std::mt19937& rng) {
  const int max_r = std::min(c.block_size, 6);
  c.rep_num = (c.rep == RT::kFix || c.rep == RT::kDynamic) ? 1 + int(rng() % uint32_t(max_r)) : 2;
  if (c.block_size == 1) {
    c.tokens = {int64_t(20 + rng() % 20), int64_t(5 + rng() % 10)};
  } else {
    const int64_t n0 = 2 * c.block_size + 1 + int64_t(rng() % uint32_t(c.block_size - 1));
    c.tokens = {n0, c.block_size - 1 - int64_t(rng() % 3)};
  }
}

// Every (type, kv dtype, block size); head dims rotate so each block size
// meets each head dim. Token counts mostly end inside a block.
TEST(Representatives, MatchReferenceForEveryTypeDtypeAndArrival) {
  std::mt19937 rng(test_seed(20240611));
  std::set<std::pair<int, int>> seen_dims;  // (block size, head dim)
  int index = 0;
  for (RT rep : kTypes)
    for (DType kv : kDtypes)
      for (int bs_i = 0; bs_i < 4; ++bs_i, ++index) {
        Case c;
        c.rep = rep;
        c.kv = kv;
        c.block_size = kBlockSizes[bs_i];
        c.head_dim = kHeadDims[(index / 4 + bs_i) % 4];  // index / 4 counts (type, dtype) pairs
        randomize_counts(c, rng);
        if (c.block_size > 1) {
          c.tokens.push_back(c.tokens[0] - c.block_size - 1);
          if (index % 5 == 0) c.tokens.push_back(c.block_size);  // exactly one full block
        }
        seen_dims.insert({c.block_size, c.head_dim});
        run_case(c, 1000 + uint32_t(index));
        if (HasFatalFailure()) return;
      }
  EXPECT_EQ(seen_dims.size(), 16u) << "every block size should meet every head dim";
}

// R = block_size: FIX keeps every token, DYNAMIC ranks the whole block.
TEST(Representatives, RepresentativeNumEqualToBlockSize) {
  for (RT rep : {RT::kFix, RT::kDynamic})
    for (int bs : {1, 5, 16}) {
      Case c{rep, DType::kF16, bs, 16, bs, {int64_t(3 * bs + bs / 2 + 1)}};
      run_case(c, 77 + uint32_t(bs));
      if (HasFatalFailure()) return;
    }
}

// The largest head_dim, and a block size that is not a power of two.
TEST(Representatives, LargestHeadDimAndOddBlockSize) {
  const Case cases[] = {
      {RT::kQuest, DType::kF32, 16, 512, 2, {45, 16}},
      {RT::kMean, DType::kBF16, 24, 512, 1, {70}},
      {RT::kDynamic, DType::kF16, 24, 512, 3, {50, 7}},
      {RT::kMax, DType::kF16, 40, 136, 1, {99}},
  };
  uint32_t seed = 300;
  for (const Case& c : cases) {
    run_case(c, seed++);
    if (HasFatalFailure()) return;
  }
}

// FIX offsets for R that does not divide block_size.
TEST(Representatives, FixOffsetsAreFloorOfStride) {
  LongContextConfig config = small_config(10, DType::kF32, RT::kFix, 3, 10);
  TestStore ts = make_store({1, 1, 8}, config);
  std::mt19937 rng(test_seed(5));
  const Input k = random_input(rng, 10, 1, 8, DType::kF32, false);
  const Input v = random_input(rng, 10, 1, 8, DType::kF32, false);
  const int expected_valid[] = {1, 1, 1, 2, 2, 2, 3, 3, 3, 3};  // offsets 0, 3, 6; n_filled = t + 1
  for (int64_t t = 0; t < 10; ++t) {
    ts.store->append(0, slice_tokens(k.view, t, t + 1), slice_tokens(v.view, t, t + 1));
    EXPECT_EQ(ts.store->valid_rep_slots(0, 0, 0), expected_valid[t]) << "after token " << t;
  }
  const StoreLayout& L = ts.store->layout();
  const std::byte* rec = record_of(*ts.store, 0, 0, 0);
  int32_t offsets[3];
  std::memcpy(offsets, rec + L.record_offsets_offset, sizeof offsets);
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[1], 3);
  EXPECT_EQ(offsets[2], 6);
  for (int c = 0; c < 8; ++c) EXPECT_EQ(decode(rec + 2 * 8 * 4, DType::kF32, size_t(c)), k.at(6, 0, c));
}

// DYNAMIC with every importance equal picks the first R tokens; with
// add_importance a later token overtakes, and ties keep the lower offset.
TEST(Representatives, DynamicTiesAndAddImportance) {
  LongContextConfig config = small_config(8, DType::kF32, RT::kDynamic, 2, 8);
  TestStore ts = make_store({1, 1, 8}, config);
  std::mt19937 rng(test_seed(9));
  const Input k = random_input(rng, 8, 1, 8, DType::kF32, false);
  const Input v = random_input(rng, 8, 1, 8, DType::kF32, false);
  ts.store->append(0, k.view, v.view);
  const StoreLayout& L = ts.store->layout();
  auto offsets = [&] {
    int32_t o[2];
    std::memcpy(o, record_of(*ts.store, 0, 0, 0) + L.record_offsets_offset, sizeof o);
    return std::vector<int>{o[0], o[1]};
  };
  EXPECT_EQ(offsets(), (std::vector<int>{0, 1}));
  const std::vector<float> bump{1.f};
  ts.store->add_importance(0, 5, importance_view(bump, 0, 1, 1));
  EXPECT_EQ(offsets(), (std::vector<int>{5, 0}));
  ts.store->add_importance(0, 3, importance_view(bump, 0, 1, 1));  // tie with 5: 3 first
  EXPECT_EQ(offsets(), (std::vector<int>{3, 5}));
  const std::byte* rec = record_of(*ts.store, 0, 0, 0);
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(decode(rec, DType::kF32, size_t(c)), k.at(3, 0, c));
    EXPECT_EQ(decode(rec + 8 * 4, DType::kF32, size_t(c)), k.at(5, 0, c));
  }
}

// q8_0 stores: every type and arrival against the reference, whose keys are
// the dequantized values and whose records hold them in q8_0 (MAX and
// QUEST's extremes rounded outward), byte for byte. head_dim a
// multiple of 32, each block size meeting each head dim.
TEST(Representatives, Q8MatchReferenceForEveryTypeAndArrival) {
  std::mt19937 rng(test_seed(20251125));
  const int head_dims[] = {32, 64, 128, 256};
  int index = 0;
  for (RT rep : kTypes)
    for (int bs_i = 0; bs_i < 4; ++bs_i, ++index) {
      Case c;
      c.rep = rep;
      c.kv = DType::kQ8_0;
      c.block_size = kBlockSizes[bs_i];
      c.head_dim = head_dims[(index + bs_i) % 4];
      randomize_counts(c, rng);
      run_case(c, 5000 + uint32_t(index));
      if (HasFatalFailure()) return;
    }
}

// tail: estimate: the records also hold fp32 sums of the stored keys, values
// and squared keys (q8_0: dequantized), next to every representative type's parts,
// the same bits whatever way the tokens arrive.
TEST(Representatives, TailSumsMatchReferenceForEveryTypeDtypeAndArrival) {
  std::mt19937 rng(test_seed(20261126));
  int index = 0;
  for (RT rep : kTypes)
    for (DType kv : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0})
      for (int bs : {1, 16, 64}) {
        Case c;
        c.rep = rep;
        c.kv = kv;
        c.block_size = bs;
        c.head_dim = kv == DType::kQ8_0 ? 32 * (1 + index % 4) : kHeadDims[index % 4];
        c.tail = true;
        randomize_counts(c, rng);
        run_case(c, 9000 + uint32_t(index++));
        if (HasFatalFailure()) return;
      }
  // The layout: the sums after every other part, and they make the record larger.
  LongContextConfig config = small_config(16, DType::kF16, RT::kDynamic, 4, 64);
  const StoreLayout drop = StoreLayout::make({1, 1, 64}, config);
  config.tail = TailMode::kEstimate;
  const StoreLayout est = StoreLayout::make({1, 1, 64}, config);
  EXPECT_EQ(drop.record_tail_offset, 0u);
  EXPECT_EQ(est.record_tail_offset, drop.record_bytes);
  EXPECT_EQ(est.record_bytes, drop.record_bytes + 3 * 64 * sizeof(float));
}

// QUEST's bound holds for every stored key and any query: the min/max are of
// the keys as stored.
TEST(Representatives, QuestBoundsStoredKeys) {
  for (DType kv : kDtypes) {
    LongContextConfig config = small_config(16, kv, RT::kQuest, 2, 40);
    TestStore ts = make_store({1, 1, 64}, config);
    std::mt19937 rng(test_seed(11));
    const Input k = random_input(rng, 40, 1, 64, DType::kF32, false);
    const Input v = random_input(rng, 40, 1, 64, DType::kF32, false);
    ts.store->append(0, k.view, v.view);
    const StoreLayout& L = ts.store->layout();
    for (int64_t b = 0; b < ts.store->n_blocks(0); ++b) {
      const std::byte* rec = record_of(*ts.store, 0, 0, b);
      const std::byte* page = page_of(*ts.store, 0, 0, b);
      const int n_filled = ts.store->block(0, 0, b).n_filled;
      for (int trial = 0; trial < 20; ++trial) {
        double bound = 0, scale = 0;
        std::vector<double> q(64);
        for (int c = 0; c < 64; ++c) {
          q[size_t(c)] = random_value(rng);
          const double mx = decode(rec, kv, size_t(c)), mn = decode(rec + 64 * dtype_size(kv), kv, size_t(c));
          bound += std::max(q[size_t(c)] * mx, q[size_t(c)] * mn);
          scale += std::fabs(q[size_t(c)]) * std::max(std::fabs(mx), std::fabs(mn));
        }
        // Products of floats are exact in fp64; two 64-term fp64 sums err by at most 64 u64 scale each.
        const double tol = 2 * 64 * std::ldexp(1.0, -53) * scale;
        for (int t = 0; t < n_filled; ++t) {
          double dot = 0;
          for (int c = 0; c < 64; ++c) dot += q[size_t(c)] * decode(page, kv, size_t(c) * L.block_size + size_t(t));
          EXPECT_LE(dot, bound + tol) << dtype_name(kv) << " block " << b << " token " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace longctx::kvstore
