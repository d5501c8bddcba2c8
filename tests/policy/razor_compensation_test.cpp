// RazorAttention (policy/razor.h) against plain references (razor_fixture.h):
// token ranges from a per-token classification, and the compensation token
// from the dropped keys and values read back from the store in fp64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/policy/razor.h"
#include "razor_fixture.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using namespace razor_testing;

// ---- ranges ---------------------------------------------------------------------------

TEST(RazorRanges, MatchPerTokenRolesAndSpans) {
  std::mt19937 rng(test_seed(11));
  for (int trial = 0; trial < 200; ++trial) {
    RazorParams p;
    p.sinks = int64_t(rng() % 8);
    p.buffer_min = int64_t(rng() % 30);
    p.buffer_ratio = 1 + int64_t(rng() % 7);
    p.local_window = rng() % 2 ? 0 : int64_t(rng() % 40);
    const int64_t n = int64_t(rng() % 150);
    const std::vector<Role> role = roles(n, p);
    const RazorRanges r = razor_ranges(n, p);
    SCOPED_TRACE(::testing::Message() << "n " << n << " sinks " << p.sinks << " S0 " << p.buffer_min << " C "
                                      << p.buffer_ratio << " W " << p.local_window);
    for (int64_t t = 0; t < n; ++t) {
      const Role got = t < r.sinks_end ? Role::kSink : t < r.buffer_begin ? Role::kDropped : Role::kBuffer;
      ASSERT_EQ(got, role[size_t(t)]) << "token " << t;
    }
    // Spans: the sink and buffer tokens below `end`, each exactly once.
    const int64_t end = int64_t(rng() % uint64_t(n + 1));
    std::vector<int64_t> expected;
    for (int64_t t = 0; t < end; ++t)
      if (role[size_t(t)] != Role::kDropped) expected.push_back(t);
    const std::vector<TokenSpan> spans = non_retrieval_spans(r, end);
    EXPECT_EQ(attention_ref::tokens_of(spans), expected);
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_LT(spans[i].begin, spans[i].end);
      if (i > 0) {
        EXPECT_LT(spans[i - 1].end, spans[i].begin) << "adjacent spans not merged";
      }
    }
  }
}

// The claim the incremental update rests on: as tokens arrive the dropped
// range only grows at its end (its begin is fixed once it is non-empty).
TEST(RazorRanges, DroppedRangeOnlyGrows) {
  for (int64_t sinks : {0, 4}) {
    for (int64_t s0 : {0, 7, 100}) {
      for (int64_t ratio : {1, 2, 5, 13}) {
        for (int64_t w : {0, 50}) {
          const RazorParams p{sinks, s0, ratio, w};
          RazorRanges previous = razor_ranges(0, p);
          for (int64_t n = 1; n < 3000; ++n) {
            const RazorRanges r = razor_ranges(n, p);
            ASSERT_GE(r.buffer_begin, previous.buffer_begin) << n;
            if (previous.n_dropped() > 0) {
              ASSERT_EQ(r.sinks_end, previous.sinks_end) << n;
            }
            previous = r;
          }
        }
      }
    }
  }
}

TEST(RazorRanges, RejectsBadParams) {
  EXPECT_THROW(razor_ranges(10, RazorParams{4, 10, 0, 0}), Error);
  EXPECT_THROW(razor_ranges(10, RazorParams{-1, 10, 5, 0}), Error);
  EXPECT_THROW(razor_ranges(-1, RazorParams{}), Error);
  EXPECT_THROW(razor_ranges(10, RazorParams{4, -1, 5, 0}), Error);
}

TEST(RazorRanges, ParamsFromConfig) {
  LongContextConfig config;
  config.razor.sinks = 7;
  config.razor.buffer_min = 123;
  config.razor.buffer_ratio = 9;
  config.local_windows_len = 321;
  const RazorParams p = razor_params(config);
  EXPECT_EQ(p.sinks, 7);
  EXPECT_EQ(p.buffer_min, 123);
  EXPECT_EQ(p.buffer_ratio, 9);
  EXPECT_EQ(p.local_window, 321);
  // Default config, 100K tokens: buffer = max(4000, 20000, 4096) = 20000.
  const RazorRanges r = razor_ranges(100000, razor_params(LongContextConfig{}));
  EXPECT_EQ(r.sinks_end, 4);
  EXPECT_EQ(r.buffer_begin, 80000);
}

// ---- compensation ---------------------------------------------------------------------

// Random stores filled in random chunks, updated after each: the sums and
// the compensation partials against the reference; then equal bit for bit to
// a compensation built at once.
TEST(RazorCompensation, IncrementalMatchesReferenceAndFromScratch) {
  std::mt19937 rng(test_seed(2024));
  for (int trial = 0; trial < 40; ++trial) {
    Case c = random_case(rng);
    SCOPED_TRACE(c.describe());
    RazorStore s(c, uint32_t(trial));
    const RetrievalHeads heads = random_heads(c, rng);
    RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
    const int64_t target = 20 + int64_t(rng() % 150);
    while (s.n_tokens() < target) {
      s.append(RazorStore::kLayer, std::min(target - s.n_tokens(), 1 + int64_t(rng() % 12)));
      if (rng() % 4 == 0) s.append(0, 1);  // another layer does not matter
      comp.update(s.store());
      if (rng() % 3 == 0) comp.update(s.store());  // no new token: no change
      ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
    }
    RazorCompensation fresh(s.store(), RazorStore::kLayer, heads, s.params());
    fresh.update(s.store());
    for (int h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_EQ(comp.tracks(h), !heads.is_retrieval(RazorStore::kLayer, h));
      if (!comp.tracks(h)) continue;
      EXPECT_EQ(comp.mean_key(h), fresh.mean_key(h)) << "kv head " << h;
      EXPECT_EQ(comp.mean_value(h), fresh.mean_value(h)) << "kv head " << h;
    }

    // compensation_partial: out = v^, lse = scale q.k^ + ln N_d.
    const std::vector<float> q = s.random_q();
    const float scale = 1.f / std::sqrt(float(c.head_dim));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      if (!comp.tracks(h)) {
        std::vector<float> out(size_t(c.g * c.head_dim)), lse(size_t(c.g));
        EXPECT_THROW(comp.compensation_partial(h, q.data(), c.g, scale, out.data(), lse.data()), Error);
        continue;
      }
      const prefill_ref::StoredHead head = prefill_ref::stored_head(s.store(), RazorStore::kLayer, h);
      const Compensation ref = reference_compensation(head, roles(s.n_tokens(), s.params()));
      std::vector<float> out(size_t(c.g * c.head_dim), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> lse(size_t(c.g), std::numeric_limits<float>::quiet_NaN());
      comp.compensation_partial(h, q.data() + size_t(h * c.g * c.head_dim), c.g, scale, out.data(), lse.data());
      for (int j = 0; j < c.g; ++j) {
        const float* qj = q.data() + size_t((h * c.g + j) * c.head_dim);
        if (ref.n_dropped == 0) {
          EXPECT_EQ(lse[size_t(j)], -kInf);
          for (int ch = 0; ch < c.head_dim; ++ch) EXPECT_EQ(out[size_t(j * c.head_dim + ch)], 0.f);
          continue;
        }
        double dot = 0, terms = 0;
        for (int ch = 0; ch < c.head_dim; ++ch) {
          dot += double(qj[ch]) * ref.key[size_t(ch)];
          terms += std::abs(double(qj[ch]) * ref.key[size_t(ch)]);
        }
        const double ref_lse = double(scale) * dot + std::log(double(ref.n_dropped));
        // fp64 throughout, one rounding to f32 at the end.
        EXPECT_NEAR(lse[size_t(j)], ref_lse, kU * std::abs(ref_lse) + 1e-12 * (1 + double(scale) * terms));
        for (int ch = 0; ch < c.head_dim; ++ch) {
          EXPECT_NEAR(out[size_t(j * c.head_dim + ch)], ref.value[size_t(ch)],
                      kU * std::abs(ref.value[size_t(ch)]) + 1e-12);
        }
      }
    }
  }
}

// One token at a time over several hundred tokens (buffer = N / C takes over
// from S0), checked against the reference every step.
TEST(RazorCompensation, TokenByTokenUpdates) {
  Case c;
  c.kv_type = DType::kF16;
  c.block_size = 4;
  c.head_dim = 8;
  c.n_kv_heads = 2;
  c.razor = RazorConfig{"", 4, 20, 5};
  RazorStore s(c, 7);
  RetrievalHeads heads(2, 2);
  heads.set(RazorStore::kLayer, 1, true);
  RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
  int64_t previous_dropped = 0;
  for (int i = 0; i < 300; ++i) {
    s.append(RazorStore::kLayer, 1);
    comp.update(s.store());
    ASSERT_GE(comp.n_dropped(), previous_dropped);
    previous_dropped = comp.n_dropped();
    ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
  }
  EXPECT_EQ(comp.n_dropped(), 300 - 4 - 60);  // buffer = 300 / 5
}

// The store shrank (clear and refill with fewer tokens): update rebuilds.
// After refilling to more tokens than before, reset() then update rebuilds.
TEST(RazorCompensation, ClearedStoreRebuilds) {
  Case c;
  c.kv_type = DType::kF32;
  c.block_size = 16;
  c.razor = RazorConfig{"", 2, 5, 3};
  RazorStore s(c, 3);
  const RetrievalHeads heads(2, c.n_kv_heads);
  RazorCompensation comp(s.store(), RazorStore::kLayer, heads, s.params());
  s.append(RazorStore::kLayer, 100);
  comp.update(s.store());
  ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
  s.store().clear();
  s.append(RazorStore::kLayer, 40);
  comp.update(s.store());
  ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
  s.store().clear();
  s.append(RazorStore::kLayer, 120);
  comp.reset();
  comp.update(s.store());
  ASSERT_NO_FATAL_FAILURE(expect_compensation(s, c, comp));
}

TEST(RazorCompensation, RejectsMismatchedArguments) {
  Case c;
  RazorStore s(c, 1);
  EXPECT_THROW(RazorCompensation(s.store(), 2, RetrievalHeads(2, c.n_kv_heads), s.params()), Error);
  EXPECT_THROW(RazorCompensation(s.store(), 1, RetrievalHeads(3, c.n_kv_heads), s.params()), Error);
  EXPECT_THROW(RazorCompensation(s.store(), 1, RetrievalHeads(2, c.n_kv_heads), RazorParams{1, 1, 0, 0}), Error);
  Case other = c;
  other.head_dim = 32;
  RazorStore s2(other, 1);
  RazorCompensation comp(s.store(), 1, RetrievalHeads(2, c.n_kv_heads), s.params());
  EXPECT_THROW(comp.update(s2.store()), Error);
  EXPECT_THROW(comp.mean_key(c.n_kv_heads), Error);
}

}  // namespace
}  // namespace longctx::policy
