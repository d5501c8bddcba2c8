// StreamingLLM selection (policy/streaming.h) against token-by-token membership.
#include "longctx/policy/streaming.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using cpu::testing::kernel_store_config;
using cpu::testing::spans_of;
using cpu::testing::topology;

TEST(PolicyStreaming, SinksAndRecentMatchBruteForce) {
  for (int64_t n = 0; n <= 40; ++n)
    for (int64_t sinks = 0; sinks <= 6; ++sinks)
      for (int64_t recent = 0; recent <= 45; recent += 3)
        for (int heads = 1; heads <= 2; ++heads) {
          std::vector<bool> in(static_cast<size_t>(n));
          for (int64_t t = 0; t < n; ++t) in[size_t(t)] = t < sinks || t >= n - recent;
          const Selection s = streaming_selection(n, sinks, recent, heads);
          ASSERT_EQ(s.spans.size(), size_t(heads));
          for (const auto& head : s.spans) ASSERT_EQ(head, spans_of(in)) << n << " " << sinks << " " << recent;
        }
  EXPECT_THROW(streaming_selection(-1, 0, 0, 1), Error);
  EXPECT_THROW(streaming_selection(4, -1, 0, 1), Error);
  EXPECT_THROW(streaming_selection(4, 0, -1, 1), Error);
  EXPECT_THROW(streaming_selection(4, 0, 0, 0), Error);
}

TEST(PolicyStreaming, FromTheStoreUsesInitialAndLocal) {
  kvstore::MemoryBudget budget(uint64_t{1} << 28);
  for (const int initial : {0, 4, 9}) {
    for (const int local : {0, 5, 30}) {
      LongContextConfig config = kernel_store_config(DType::kF32, 8, 64);
      config.initial_len = initial;
      config.local_windows_len = local;
      kvstore::KVStore store({1, 2, 8}, config, budget, topology());
      std::vector<float> kv(2 * 8, 0.25f);
      for (int64_t n = 1; n <= 50; ++n) {
        store.append(0, make_view(kv.data(), DType::kF32, {1, 2, 8}), make_view(kv.data(), DType::kF32, {1, 2, 8}));
        SCOPED_TRACE(::testing::Message() << "initial " << initial << " local " << local << " n " << n);
        const Selection all = streaming_selection(store, 0, true);
        ASSERT_EQ(all.spans, streaming_selection(n, initial, local, 2).spans);
        // Without the local window: the sinks, never a token of the window.
        const Selection cpu = streaming_selection(store, 0, false);
        std::vector<bool> want(static_cast<size_t>(n));
        const int64_t window_begin = std::max<int64_t>(std::min<int64_t>(initial, n), n - local);
        for (int64_t t = 0; t < n; ++t) want[size_t(t)] = t < initial && t < window_begin;
        for (const auto& head : cpu.spans) ASSERT_EQ(head, spans_of(want));
      }
    }
  }
}

}  // namespace
}  // namespace longctx::policy
