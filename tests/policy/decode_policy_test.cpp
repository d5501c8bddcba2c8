// DecodePolicy (policy/decode_policy.h): each config.policy attends the tokens
// its spec names, checked against token sets written out in the test and
// against the attention over those tokens (same kernel: bit-identical; dense
// comparison: fp32 tolerance), on small random f32 stores; and the model's
// attention scale reaching every policy.
#include "longctx/policy/decode_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cpu/store_fixture.h"
#include "error_message.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/preselect.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using cpu::testing::topology;

constexpr float kHeadDimScale = 0.f;  // attn_scale 0: 1/sqrt(head_dim)

// A small f32 config: block 8, 8 sinks, local window 16, every layer selecting.
LongContextConfig small_config() {
  LongContextConfig c;
  c.chunk_size = 64;
  c.max_seq_len = 512;
  c.block_size = 8;
  c.initial_len = 8;
  c.local_windows_len = 16;
  c.second_select_num = 3;
  c.kv_type = DType::kF32;
  c.representative_type = RepresentativeType::kQuest;
  c.representative_num = 2;
  c.dense_layer_num = 0;
  c.preselect_block_count = 4;
  c.preselect.window = 8;
  return c;
}

// A store whose layers all hold the same number of random tokens.
class Fixture {
 public:
  static constexpr int kGroup = 2;  // query heads per kv head

  Fixture(const LongContextConfig& config, kvstore::KVShape shape, int64_t n_prompt, uint32_t seed)
      : shape_(shape), budget_(uint64_t{1} << 28), rng_(test_seed(seed)) {
    store_ = std::make_unique<kvstore::KVStore>(shape, config, budget_, topology());
    append_all(n_prompt);
  }

  void append_all(int64_t n) {
    for (int layer = 0; layer < shape_.n_layers; ++layer) {
      const std::vector<float> k = random(n * shape_.n_kv_heads * shape_.head_dim, 1.5f);
      const std::vector<float> v = random(n * shape_.n_kv_heads * shape_.head_dim, 1.f);
      store_->append(layer, make_view(k.data(), DType::kF32, {n, shape_.n_kv_heads, shape_.head_dim}),
                     make_view(v.data(), DType::kF32, {n, shape_.n_kv_heads, shape_.head_dim}));
    }
  }

  std::vector<float> random(int64_t n, float scale) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = dist(rng_);
    return x;
  }
  std::vector<float> random_q() { return random(n_q_heads() * shape_.head_dim, 1.5f); }
  std::vector<float> random_window(int64_t w) { return random(w * n_q_heads() * shape_.head_dim, 1.5f); }

  int n_q_heads() const { return shape_.n_kv_heads * kGroup; }
  kvstore::KVStore& store() { return *store_; }
  const kvstore::KVShape& shape() const { return shape_; }

 private:
  kvstore::KVShape shape_;
  kvstore::MemoryBudget budget_;
  std::unique_ptr<kvstore::KVStore> store_;
  std::mt19937 rng_;
};

struct Result {
  std::vector<float> out, lse;
};

Result run_policy(DecodePolicy& policy, Fixture& f, int layer, int64_t step, const std::vector<float>& q,
                  bool include_local) {
  Result r{std::vector<float>(size_t(f.n_q_heads() * f.shape().head_dim)), std::vector<float>(size_t(f.n_q_heads()))};
  policy.decode(layer, step, make_view(q.data(), DType::kF32, {f.n_q_heads(), f.shape().head_dim}), include_local,
                make_mutable_view(r.out.data(), DType::kF32, {f.n_q_heads(), f.shape().head_dim}),
                make_mutable_view(r.lse.data(), DType::kF32, {f.n_q_heads()}));
  return r;
}

Result run_attention(Fixture& f, int layer, const std::vector<float>& q, const Selection& selection) {
  Result r{std::vector<float>(size_t(f.n_q_heads() * f.shape().head_dim)), std::vector<float>(size_t(f.n_q_heads()))};
  decode_attention(f.store(), layer, make_view(q.data(), DType::kF32, {f.n_q_heads(), f.shape().head_dim}), selection,
                   {}, make_mutable_view(r.out.data(), DType::kF32, {f.n_q_heads(), f.shape().head_dim}),
                   make_mutable_view(r.lse.data(), DType::kF32, {f.n_q_heads()}));
  return r;
}

void expect_same_bits(const Result& a, const Result& b) {
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)), 0);
}

using TokenSet = std::set<int64_t>;

TokenSet tokens_of(const Selection& s, int kv_head) {
  TokenSet set;
  for (const TokenSpan& span : s.spans.at(size_t(kv_head)))
    for (int64_t t = span.begin; t < span.end; ++t) set.insert(t);
  return set;
}

void add_range(TokenSet& set, int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) set.insert(t);
}

// (1) policy dense is dense_decode_attention, bit for bit; without the local
// window it is the attention over [0, local_begin).
TEST(DecodePolicy, DenseIsDenseDecodeAttention) {
  LongContextConfig config = small_config();
  config.policy = SelectionPolicy::kDense;
  for (const int64_t n : {1, 7, 8, 23, 100, 161}) {
    SCOPED_TRACE(n);
    Fixture f(config, {2, 2, 16}, n, uint32_t(n));
    DecodePolicy policy(config, f.store(), kHeadDimScale);
    for (int layer = 0; layer < 2; ++layer) {
      const std::vector<float> q = f.random_q();
      Result want{std::vector<float>(size_t(f.n_q_heads() * 16)), std::vector<float>(size_t(f.n_q_heads()))};
      dense_decode_attention(f.store(), layer, make_view(q.data(), DType::kF32, {f.n_q_heads(), 16}), {},
                             make_mutable_view(want.out.data(), DType::kF32, {f.n_q_heads(), 16}),
                             make_mutable_view(want.lse.data(), DType::kF32, {f.n_q_heads()}));
      expect_same_bits(run_policy(policy, f, layer, 0, q, true), want);
      EXPECT_EQ(policy.last_stats().attended_tokens, 2 * n);
      EXPECT_FALSE(policy.last_stats().reselected);

      const kvstore::Partition part = f.store().partition(layer);
      Selection before_local;
      before_local.spans.assign(2, {});
      if (part.local_begin > 0)
        for (auto& spans : before_local.spans) spans.push_back({0, part.local_begin});
      expect_same_bits(run_policy(policy, f, layer, 0, q, false), run_attention(f, layer, q, before_local));
      EXPECT_EQ(policy.last_stats().attended_tokens, 2 * part.local_begin);
    }
  }
}

// (2) Selecting at least as many blocks as the context holds attends every
// token: dense within fp32 rounding (the pieces may be split differently).
TEST(DecodePolicy, SelectEverythingEqualsDense) {
  for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
    LongContextConfig config = small_config();
    config.second_select_num = 64;  // 64 * 8 = max_seq_len: more than any context here
    config.dense_layer_num = 1;
    config.head_select_mode = mode;
    for (const int64_t n : {3, 40, 97, 300}) {
      SCOPED_TRACE(::testing::Message() << head_select_mode_name(mode) << " n=" << n);
      Fixture f(config, {3, 2, 16}, n, uint32_t(7 * n));
      DecodePolicy policy(config, f.store(), kHeadDimScale);
      for (int layer = 0; layer < 3; ++layer) {
        const std::vector<float> q = f.random_q();
        const Result got = run_policy(policy, f, layer, 0, q, true);
        EXPECT_EQ(policy.last_stats().reselected, layer >= 1);
        EXPECT_EQ(policy.last_stats().attended_tokens, 2 * n);
        const Result want = run_attention(f, layer, q, select_all(f.store(), layer, true));
        // Outputs are convex combinations of values in [-1, 1]: absolute
        // error of a few fp32 roundings per merge level.
        const float tol = 64 * FLT_EPSILON;
        for (size_t i = 0; i < got.out.size(); ++i) EXPECT_NEAR(got.out[i], want.out[i], tol) << i;
        for (size_t i = 0; i < got.lse.size(); ++i)
          EXPECT_NEAR(got.lse[i], want.lse[i], tol * std::max(1.f, std::fabs(want.lse[i]))) << i;
      }
    }
  }
}

// (3) token_step 3, layer_step 2, dense_layer_num 1: the reselected flag
// follows the literal rule over a grid of (layer, step); a reusing layer
// attends its leader's selection plus every token that entered the CPU's
// range since (the local window is elsewhere here, so new tokens matter).
TEST(DecodePolicy, ReuseFollowsTheSchedule) {
  LongContextConfig config = small_config();
  config.dense_layer_num = 1;
  config.layer_step = 2;
  config.token_step = 3;
  config.second_select_num = 2;
  const int n_layers = 6;
  Fixture f(config, {n_layers, 2, 16}, 120, 11);
  DecodePolicy policy(config, f.store(), kHeadDimScale);

  struct Made {
    std::vector<TokenSet> tokens;  // [kv head]
    int64_t local_begin = 0;
  };
  std::vector<Made> made(n_layers);
  int reuses = 0;
  for (int64_t step = 0; step < 10; ++step) {
    f.append_all(1 + step % 3);  // some steps bring several tokens
    for (int layer = 0; layer < n_layers; ++layer) {
      SCOPED_TRACE(::testing::Message() << "layer " << layer << " step " << step);
      const std::vector<float> q = f.random_q();
      const Result got = run_policy(policy, f, layer, step, q, false);
      expect_same_bits(got, run_attention(f, layer, q, policy.last_selection()));
      const kvstore::Partition part = f.store().partition(layer);
      const bool dense = layer < 1;
      const bool leader = !dense && layer % 2 == 1 % 2;
      const bool literal_reselects = leader && step % 3 == 0;
      ASSERT_EQ(policy.last_stats().reselected, literal_reselects);
      if (dense) {
        TokenSet all;
        add_range(all, 0, part.local_begin);
        for (int h = 0; h < 2; ++h) EXPECT_EQ(tokens_of(policy.last_selection(), h), all);
      } else if (literal_reselects) {
        made[size_t(layer)] = {{tokens_of(policy.last_selection(), 0), tokens_of(policy.last_selection(), 1)},
                               part.local_begin};
        // 2 context blocks per head at most, sinks, nothing of the local window.
        for (int h = 0; h < 2; ++h) {
          const TokenSet& s = made[size_t(layer)].tokens[size_t(h)];
          EXPECT_LE(int64_t(s.size()), 8 + 2 * 8 + 8);  // + the partial last block of the context
          EXPECT_TRUE(s.empty() || *s.rbegin() < part.local_begin);
        }
      } else {
        ++reuses;
        int group = layer;
        while (group % 2 != 1 % 2) --group;
        const Made& source = made[size_t(group)];
        for (int h = 0; h < 2; ++h) {
          TokenSet want = source.tokens[size_t(h)];
          add_range(want, source.local_begin, part.local_begin);
          EXPECT_EQ(tokens_of(policy.last_selection(), h), want) << "kv head " << h;
        }
      }
    }
  }
  EXPECT_GT(reuses, 20);
}

// (4) Preselection with second_select_num >= preselect_block_count attends
// exactly the sinks, the preselected blocks (within the context range), the
// context tokens of the blocks not ranked and the local window; with fewer, a
// subset of the preselected blocks. (No block becomes ranked in between:
// those would compete, PreselectTest.BlocksRankedSincePreselectionCompete.)
TEST(DecodePolicy, PreselectedSetAsIs) {
  for (const HeadSelectMode mode : {HeadSelectMode::kShared, HeadSelectMode::kSeparate}) {
    for (const int second : {4, 6, 2}) {
      SCOPED_TRACE(::testing::Message() << head_select_mode_name(mode) << " second_select_num=" << second);
      LongContextConfig config = small_config();
      config.preselect_block = true;
      config.preselect_block_count = 4;
      config.second_select_num = second;
      config.head_select_mode = mode;
      Fixture f(config, {2, 2, 16}, 128, uint32_t(second * 5 + int(mode)));
      DecodePolicy policy(config, f.store(), kHeadDimScale);
      std::vector<std::vector<std::vector<int64_t>>> preselected(2);
      for (int layer = 0; layer < 2; ++layer) {
        const std::vector<float> window = f.random_window(8);
        const TensorView wq = make_view(window.data(), DType::kF32, {8, f.n_q_heads(), 16});
        policy.on_prefill_end(layer, wq);
        const kvstore::Partition part = f.store().partition(layer);
        SnapKVParams params;  // the config's preselect defaults: kernel 7, max pooling, sum over the group
        preselected[size_t(layer)] =
            preselect_blocks(block_votes(snapkv_token_votes(f.store(), layer, wq, params), 2, part, 8), 2, part, 4,
                             mode, config.budget);
      }
      f.append_all(1);
      for (int layer = 0; layer < 2; ++layer) {
        const std::vector<float> q = f.random_q();
        const Result got = run_policy(policy, f, layer, 0, q, true);
        expect_same_bits(got, run_attention(f, layer, q, policy.last_selection()));
        const kvstore::Partition part = f.store().partition(layer);
        ASSERT_EQ(part.end_ranked_block, 14);  // as at the preselection: 128 tokens, the window from 112
        for (int h = 0; h < 2; ++h) {
          const auto& blocks = preselected[size_t(layer)][mode == HeadSelectMode::kShared ? 0 : size_t(h)];
          EXPECT_EQ(blocks.size(), 4u);
          TokenSet allowed;
          add_range(allowed, 0, part.ranked_begin(8));
          for (const int64_t b : blocks) add_range(allowed, b * 8, (b + 1) * 8);
          add_range(allowed, part.ranked_end(8), part.n_tokens);
          const TokenSet attended = tokens_of(policy.last_selection(), h);
          if (second >= 4) {
            EXPECT_EQ(attended, allowed) << "kv head " << h;
          } else {
            EXPECT_TRUE(std::includes(allowed.begin(), allowed.end(), attended.begin(), attended.end()));
            EXPECT_EQ(int64_t(attended.size()), part.n_tokens - (part.ranked_end(8) - part.ranked_begin(8)) + 2 * 8);
          }
        }
        EXPECT_TRUE(policy.last_stats().reselected);
      }
    }
  }
}

// DYNAMIC representatives take the preselection window's votes before
// pooling: the store then holds what feed_dynamic writes from the unpooled
// votes into a twin store.
TEST(DecodePolicy, PreselectFeedsDynamicRepresentatives) {
  LongContextConfig config = small_config();
  config.representative_type = RepresentativeType::kDynamic;
  config.representative_num = 2;
  config.preselect_block = true;
  Fixture f(config, {1, 2, 16}, 64, 21);
  Fixture twin(config, {1, 2, 16}, 64, 21);  // same seed: same tokens
  const std::vector<float> window = f.random_window(8);
  const TensorView wq = make_view(window.data(), DType::kF32, {8, f.n_q_heads(), 16});
  const size_t record_bytes = f.store().layout().record_bytes;
  std::vector<std::byte> before(f.store().rep_record(0, 1, 3), f.store().rep_record(0, 1, 3) + record_bytes);
  DecodePolicy policy(config, f.store(), kHeadDimScale);
  policy.on_prefill_end(0, wq);
  SnapKVParams unpooled;
  unpooled.pool_kernel = 1;
  feed_dynamic(twin.store(), 0, snapkv_token_votes(twin.store(), 0, wq, unpooled));
  for (int h = 0; h < 2; ++h)
    for (int64_t b = 0; b < f.store().n_blocks(0); ++b)
      ASSERT_EQ(std::memcmp(f.store().rep_record(0, h, b), twin.store().rep_record(0, h, b), record_bytes), 0);
  EXPECT_NE(std::memcmp(before.data(), f.store().rep_record(0, 1, 3), record_bytes), 0);  // the votes moved it
}

// A store of one kv head whose context blocks each hold one key the window
// queries attend strongly; the first offset of each block's DYNAMIC record
// after on_prefill_end is its representative.
struct HotTokenStore {
  static constexpr int kBlock = 16, kDim = 32, kWindow = 4;
  static constexpr int kHot[3] = {5, kBlock + 9, 2 * kBlock + 12};  // one per context block

  explicit HotTokenStore(const LongContextConfig& config) : budget(uint64_t{1} << 26) {
    store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, 1, kDim}, config, budget, topology());
    const int n = 4 * kBlock;  // blocks 0..2 context, block 3 the local window
    std::vector<float> k(size_t(n * kDim)), v(size_t(n * kDim), 0.f);
    std::mt19937 rng(test_seed(1));
    std::normal_distribution<float> noise(0.f, 0.1f);
    for (float& x : k) x = noise(rng);
    for (const int t : kHot) k[size_t(t * kDim)] = 8.f;
    store->append(0, make_view(k.data(), DType::kF32, {n, 1, kDim}), make_view(v.data(), DType::kF32, {n, 1, kDim}));
    window.assign(size_t(kWindow * kDim), 0.f);
    for (int i = 0; i < kWindow; ++i) window[size_t(i * kDim)] = 4.f;  // every window query looks at channel 0
  }
  TensorView window_q() const { return make_view(window.data(), DType::kF32, {kWindow, 1, kDim}); }
  int32_t representative_offset(int64_t block) const {
    int32_t offset = -1;
    std::memcpy(&offset, store->rep_record(0, 0, block) + store->layout().record_offsets_offset, sizeof offset);
    return offset;
  }

  kvstore::MemoryBudget budget;
  std::unique_ptr<kvstore::KVStore> store;
  std::vector<float> window;
};

LongContextConfig hot_token_config(bool preselect_block) {
  LongContextConfig c = small_config();
  c.block_size = HotTokenStore::kBlock;
  c.initial_len = 0;
  c.local_windows_len = HotTokenStore::kBlock;
  c.second_select_num = 1;
  c.representative_type = RepresentativeType::kDynamic;
  c.representative_num = 1;
  c.head_select_mode = HeadSelectMode::kShared;
  c.preselect_block = preselect_block;
  c.preselect_block_count = 2;
  c.preselect.window = HotTokenStore::kWindow;
  return c;
}

// DYNAMIC representatives are the window's most attended keys without
// preselection too (configs/infllm.yaml): on_prefill_end fed them only when
// preselect_block was set, leaving each block represented by its first key.
TEST(DecodePolicy, DynamicRepresentativesWithoutPreselection) {
  LongContextConfig config = hot_token_config(false);
  config.preselect.pool_kernel = 1;  // each vote on its own token
  HotTokenStore hot(config);
  DecodePolicy policy(config, *hot.store, kHeadDimScale);
  policy.on_prefill_end(0, hot.window_q());
  for (int64_t b = 0; b < 3; ++b)
    EXPECT_EQ(hot.representative_offset(b), HotTokenStore::kHot[b] % HotTokenStore::kBlock) << "block " << b;
}

// Pooling (preselect.pool_kernel 7, max) is preselection's: fed to DYNAMIC
// it spread each peak over 3 tokens each side and the tie-break made the
// block's representative the token 3 before its most attended one.
TEST(DecodePolicy, DynamicRepresentativesTakeUnpooledVotes) {
  for (const bool preselect_block : {false, true}) {
    const LongContextConfig config = hot_token_config(preselect_block);
    ASSERT_EQ(config.preselect.pool_kernel, 7);
    HotTokenStore hot(config);
    DecodePolicy policy(config, *hot.store, kHeadDimScale);
    policy.on_prefill_end(0, hot.window_q());
    for (int64_t b = 0; b < 3; ++b)
      EXPECT_EQ(hot.representative_offset(b), HotTokenStore::kHot[b] % HotTokenStore::kBlock)
          << "block " << b << ", preselect_block " << preselect_block;
  }
}

// (5) StreamingLLM: the first initial_len and the last local_windows_len tokens.
TEST(DecodePolicy, StreamingAttendsSinksAndRecent) {
  LongContextConfig config = small_config();
  config.policy = SelectionPolicy::kStreaming;
  for (const int64_t n : {5, 24, 25, 100}) {
    SCOPED_TRACE(n);
    Fixture f(config, {2, 2, 16}, n, uint32_t(3 * n));
    DecodePolicy policy(config, f.store(), kHeadDimScale);
    for (const bool include_local : {true, false}) {
      Selection want;
      std::vector<TokenSpan> spans;
      const int64_t sinks = std::min<int64_t>(8, n), recent = std::max<int64_t>(sinks, n - 16);
      if (sinks > 0) spans.push_back({0, sinks});
      if (include_local && recent < n) {
        if (!spans.empty() && spans.back().end == recent) spans.back().end = n;
        else spans.push_back({recent, n});
      }
      want.spans.assign(2, spans);
      const std::vector<float> q = f.random_q();
      expect_same_bits(run_policy(policy, f, 1, 0, q, include_local), run_attention(f, 1, q, want));
      EXPECT_EQ(policy.last_selection().spans, want.spans);
    }
  }
}

// (6) H2O over several steps: the same results as an H2OState driven by hand,
// and never more than the budget (+ the step's new token) attended per head.
TEST(DecodePolicy, H2ORespectsItsBudget) {
  LongContextConfig config = small_config();
  config.policy = SelectionPolicy::kH2O;
  config.h2o.budget_tokens = 24;
  config.h2o.heavy_ratio = 0.5;
  Fixture f(config, {2, 2, 16}, 60, 5);
  DecodePolicy policy(config, f.store(), kHeadDimScale);
  std::vector<H2OState> reference(2, H2OState(2, H2OParams::from_config(config)));
  for (int layer = 0; layer < 2; ++layer) {
    const std::vector<float> window = f.random_window(8);
    const TensorView wq = make_view(window.data(), DType::kF32, {8, f.n_q_heads(), 16});
    policy.on_prefill_end(layer, wq);
    reference[size_t(layer)].init_from_prefill(f.store(), layer, wq);
  }
  for (int64_t step = 0; step < 8; ++step) {
    f.append_all(1);
    for (int layer = 0; layer < 2; ++layer) {
      const std::vector<float> q = f.random_q();
      const Result got = run_policy(policy, f, layer, step, q, true);
      Result want{std::vector<float>(got.out.size()), std::vector<float>(got.lse.size())};
      reference[size_t(layer)].step(f.store(), layer, make_view(q.data(), DType::kF32, {f.n_q_heads(), 16}),
                                    make_mutable_view(want.out.data(), DType::kF32, {f.n_q_heads(), 16}),
                                    make_mutable_view(want.lse.data(), DType::kF32, {f.n_q_heads()}));
      expect_same_bits(got, want);
      for (int h = 0; h < 2; ++h) {
        EXPECT_EQ(policy.last_selection().tokens(h), 25);  // 24 kept + the new token
        EXPECT_LE(int64_t(reference[size_t(layer)].kept(h).size()), 24);
      }
      EXPECT_EQ(policy.last_stats().attended_tokens, 50);
    }
  }
  std::vector<float> q = f.random_q();
  EXPECT_THROW(run_policy(policy, f, 0, 8, q, false), Error);
}

// (7) RazorAttention with every head a retrieval head is plain selection.
TEST(DecodePolicy, RazorAllRetrievalEqualsSelect) {
  LongContextConfig config = small_config();
  config.razor.buffer_min = 16;
  config.razor.sinks = 4;
  Fixture f(config, {3, 2, 16}, 150, 9);
  DecodePolicy plain(config, f.store(), kHeadDimScale);
  DecodePolicy razor(config, f.store(), kHeadDimScale, RetrievalHeads::all(3, 2));
  RetrievalHeads mixed(3, 2);
  mixed.set(1, 0, true);
  DecodePolicy compressed(config, f.store(), kHeadDimScale, mixed);
  LongContextConfig with_dense = config;
  with_dense.dense_layer_num = 1;
  DecodePolicy compressed_above_dense(with_dense, f.store(), kHeadDimScale, mixed);
  // The same list from the file razor.retrieval_heads names.
  LongContextConfig from_file = config;
  from_file.razor.retrieval_heads = ::testing::TempDir() + "decode_policy_heads.txt";
  save_retrieval_heads(from_file.razor.retrieval_heads, mixed, "");
  DecodePolicy compressed_from_file(from_file, f.store(), kHeadDimScale);
  std::filesystem::remove(from_file.razor.retrieval_heads);  // read at construction
  EXPECT_FALSE(plain.razor_enabled());
  EXPECT_TRUE(compressed_from_file.razor_enabled());
  EXPECT_TRUE(razor.razor_enabled());
  for (int64_t step = 0; step < 3; ++step) {
    f.append_all(1);
    for (int layer = 0; layer < 3; ++layer) {
      for (const bool include_local : {true, false}) {
        const std::vector<float> q = f.random_q();
        expect_same_bits(run_policy(razor, f, layer, step, q, include_local),
                         run_policy(plain, f, layer, step, q, include_local));
        EXPECT_EQ(razor.last_selection().spans, plain.last_selection().spans);
        // Non-retrieval heads: sinks + buffer only (buffer = max(16, n / 5)).
        const Result r = run_policy(compressed, f, layer, step, q, include_local);
        const int64_t n = f.store().n_tokens(layer);
        const int64_t end = include_local ? n : f.store().partition(layer).local_begin;
        TokenSet want;
        add_range(want, 0, std::min<int64_t>(4, end));
        add_range(want, std::max<int64_t>(4, n - std::max<int64_t>(16, n / 5)), end);
        for (int h = 0; h < 2; ++h)
          if (!mixed.is_retrieval(layer, h)) {
            EXPECT_EQ(tokens_of(compressed.last_selection(), h), want);
          }
        for (const float x : r.out) EXPECT_TRUE(std::isfinite(x));
        expect_same_bits(run_policy(compressed_from_file, f, layer, step, q, include_local), r);
        // Dense layers attend everything, retrieval head or not.
        run_policy(compressed_above_dense, f, layer, step, q, include_local);
        if (layer == 0) {
          for (int h = 0; h < 2; ++h) EXPECT_EQ(compressed_above_dense.last_selection().tokens(h), end);
        } else {
          EXPECT_EQ(compressed_above_dense.last_selection().spans, compressed.last_selection().spans);
        }
      }
    }
  }
}

// A group's selection (layer_step 2: layer 1 reuses layer 0's) is chosen by
// the heads that are retrieval heads in any of its layers: kv head 0, a
// retrieval head of layer 1 only, gets its blocks from layer 0's choice.
TEST(DecodePolicy, RazorGroupChoosesForEveryLayersRetrievalHeads) {
  LongContextConfig config = small_config();
  config.head_select_mode = HeadSelectMode::kSeparate;
  config.layer_step = 2;
  config.razor.sinks = 4;
  config.razor.buffer_min = 16;
  Fixture f(config, {2, 2, 16}, 150, 5);
  RetrievalHeads heads(2, 2);
  heads.set(1, 0, true);
  DecodePolicy razor(config, f.store(), kHeadDimScale, heads);
  DecodePolicy plain(config, f.store(), kHeadDimScale);  // SEPARATE: head 0's blocks are its own choice
  const std::vector<float> q = f.random_q();
  for (int layer = 0; layer < 2; ++layer) {
    run_policy(razor, f, layer, 0, q, true);
    run_policy(plain, f, layer, 0, q, true);
  }
  EXPECT_FALSE(razor.last_stats().reselected);  // layer 1 reused layer 0's selection
  EXPECT_EQ(razor.last_selection().spans[0], plain.last_selection().spans[0]);
}

// (8) A config that does not describe the store, or heads of another shape.
TEST(DecodePolicy, RejectsAConfigThatDisagreesWithTheStore) {
  const LongContextConfig config = small_config();
  Fixture f(config, {2, 2, 16}, 20, 1);
  auto expect_invalid = [&](const LongContextConfig& c, RetrievalHeads heads, const char* key) {
    try {
      DecodePolicy policy(c, f.store(), kHeadDimScale, std::move(heads));
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  LongContextConfig c = config;
  c.block_size = 16;
  expect_invalid(c, {}, "block_size");
  c = config;
  c.kv_type = DType::kF16;
  expect_invalid(c, {}, "kv_type");
  c = config;
  c.local_windows_len = 32;
  expect_invalid(c, {}, "local_windows_len");
  c = config;
  c.representative_type = RepresentativeType::kMax;
  c.representative_num = 1;
  expect_invalid(c, {}, "representative_type");
  expect_invalid(config, RetrievalHeads::all(3, 2), "retrieval heads");
  for (const float bad : {-0.25f, INFINITY, NAN}) {
    try {
      DecodePolicy policy(config, f.store(), bad);
      ADD_FAILURE() << "no error for attn_scale " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attn_scale"), std::string::npos) << e.what();
    }
  }
  std::vector<float> q = f.random_q();
  DecodePolicy policy(config, f.store(), kHeadDimScale);
  EXPECT_THROW(run_policy(policy, f, 2, 0, q, true), Error);
  EXPECT_THROW(run_policy(policy, f, 0, -1, q, true), Error);
}

// tail: estimate and RazorAttention are not combined, whether the heads come
// from razor.retrieval_heads (validate_config) or are given to the
// constructor (the Python bindings, bench_accuracy), which accepted them: the
// tail estimate then covered the blocks of every head, non-retrieval heads
// included, on top of their compensation token.
TEST(DecodePolicy, RefusesTailEstimateWithRetrievalHeadsGiven) {
  LongContextConfig config = small_config();
  config.tail = TailMode::kEstimate;
  Fixture f(config, {2, 2, 16}, 40, 3);
  RetrievalHeads heads(2, 2);
  heads.set(1, 0, true);
  expect_error([&] { DecodePolicy policy(config, f.store(), kHeadDimScale, heads); }, ErrorCode::kInvalidArgument,
               {"tail: estimate", "RazorAttention"});
  EXPECT_NO_THROW(DecodePolicy(config, f.store(), kHeadDimScale));
  // rerank: tokens likewise: RazorAttention selects its own tokens.
  config.tail = TailMode::kDrop;
  config.rerank = RerankMode::kTokens;
  expect_error([&] { DecodePolicy policy(config, f.store(), kHeadDimScale, heads); }, ErrorCode::kInvalidArgument,
               {"rerank: tokens", "RazorAttention"});
  EXPECT_NO_THROW(DecodePolicy(config, f.store(), kHeadDimScale));
}

// (9) The model's attention scale reaches every attention a policy computes
// and the SnapKV and H2O probabilities. With head_dim 16 (default scale 1/4),
// a policy at scale 1/2 given q attends with the scores (q.k / 2) of a policy
// at the default scale given 2q: powers of two scale exactly, so the two give
// the same bits, step after step (H2O's evictions and SnapKV's votes
// included); the default scale given q gives other numbers.
TEST(DecodePolicy, ModelScaleReachesEveryPolicy) {
  struct Case {
    std::string name;
    LongContextConfig config;
    RetrievalHeads heads;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name) -> LongContextConfig& {
    cases.push_back({std::move(name), small_config(), {}});
    return cases.back().config;
  };
  add("dense").policy = SelectionPolicy::kDense;
  add("streaming").policy = SelectionPolicy::kStreaming;
  add("select");  // 3 context blocks of up to 12
  {
    LongContextConfig& c = add("select separate ada-kv");
    c.head_select_mode = HeadSelectMode::kSeparate;
    c.budget.policy = BudgetConfig::Policy::kAdaptive;
  }
  {
    LongContextConfig& c = add("select preselect dynamic");
    c.preselect_block = true;
    c.representative_type = RepresentativeType::kDynamic;
    c.second_select_num = 2;
  }
  {
    LongContextConfig& c = add("h2o");
    c.policy = SelectionPolicy::kH2O;
    c.h2o.budget_tokens = 24;
    c.h2o.heavy_ratio = 0.5;
  }
  {
    LongContextConfig& c = add("razor");
    c.razor.buffer_min = 16;
    c.razor.sinks = 4;
    cases.back().heads = RetrievalHeads(2, 2);
    cases.back().heads.set(1, 0, true);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // Three stores of the same tokens (DYNAMIC representatives are written by on_prefill_end).
    Fixture scaled(c.config, {2, 2, 16}, 100, 13), doubled(c.config, {2, 2, 16}, 100, 13),
        unscaled(c.config, {2, 2, 16}, 100, 13);
    DecodePolicy at_half(c.config, scaled.store(), 0.5f, c.heads);
    DecodePolicy at_default(c.config, doubled.store(), kHeadDimScale, c.heads);
    DecodePolicy at_default_q(c.config, unscaled.store(), kHeadDimScale, c.heads);
    EXPECT_EQ(at_half.attn_scale(), 0.5f);
    std::mt19937 rng(test_seed(17));
    std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
    auto random = [&](int64_t n) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& e : x) e = dist(rng);
      return x;
    };
    auto twice = [](std::vector<float> x) {
      for (float& e : x) e *= 2.f;
      return x;
    };
    const int64_t n_q = scaled.n_q_heads() * 16;
    for (int layer = 0; layer < 2; ++layer) {
      const std::vector<float> window = random(8 * n_q);
      const std::vector<float> window2 = twice(window);
      at_half.on_prefill_end(layer, make_view(window.data(), DType::kF32, {8, scaled.n_q_heads(), 16}));
      at_default.on_prefill_end(layer, make_view(window2.data(), DType::kF32, {8, scaled.n_q_heads(), 16}));
      at_default_q.on_prefill_end(layer, make_view(window.data(), DType::kF32, {8, scaled.n_q_heads(), 16}));
    }
    bool differs = false;
    for (int64_t step = 0; step < 6; ++step) {
      for (Fixture* f : {&scaled, &doubled, &unscaled}) f->append_all(1);
      for (int layer = 0; layer < 2; ++layer) {
        for (const bool include_local : {true, false}) {
          if (c.config.policy == SelectionPolicy::kH2O && !include_local) continue;
          SCOPED_TRACE(::testing::Message() << "step " << step << " layer " << layer << " local " << include_local);
          const std::vector<float> q = random(n_q);
          const Result got = run_policy(at_half, scaled, layer, step, q, include_local);
          expect_same_bits(got, run_policy(at_default, doubled, layer, step, twice(q), include_local));
          EXPECT_EQ(at_half.last_selection().spans, at_default.last_selection().spans);
          const Result other = run_policy(at_default_q, unscaled, layer, step, q, include_local);
          differs = differs || got.lse != other.lse;
        }
      }
    }
    EXPECT_TRUE(differs);
  }
}

// Every shipped config builds a policy that prefills and decodes a small store.
TEST(DecodePolicy, EveryShippedConfigRuns) {
  int n_configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LONGCTX_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    ++n_configs;
    const LongContextConfig config = load_config_file(entry.path().string(), {"max_seq_len=8192"});
    Fixture f(config, {3, 2, 16}, 200, uint32_t(n_configs));
    DecodePolicy policy(config, f.store(), kHeadDimScale);
    for (int layer = 0; layer < 3; ++layer) {
      const int64_t w = std::min<int64_t>(config.preselect.window, 200);
      const std::vector<float> window = f.random_window(w);
      policy.on_prefill_end(layer, make_view(window.data(), DType::kF32, {w, f.n_q_heads(), 16}));
    }
    for (int64_t step = 0; step < 2; ++step) {
      f.append_all(1);
      for (int layer = 0; layer < 3; ++layer) {
        const std::vector<float> q = f.random_q();
        const Result r = run_policy(policy, f, layer, step, q, true);
        EXPECT_GT(policy.last_stats().attended_tokens, 0);
        for (const float x : r.out) ASSERT_TRUE(std::isfinite(x));
        for (const float x : r.lse) ASSERT_TRUE(std::isfinite(x));
      }
    }
  }
  EXPECT_GE(n_configs, 7);
}

}  // namespace
}  // namespace longctx::policy
