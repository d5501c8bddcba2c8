// core/random.h: SplitMix64's discard(n) lands where n calls of next() do,
// so that threads can generate their own parts of one stream.
#include <gtest/gtest.h>

#include "longctx/core/random.h"

namespace longctx {
namespace {

TEST(SplitMix64, DiscardSkipsExactlyNOutputs) {
  for (const uint64_t n : {uint64_t(0), uint64_t(1), uint64_t(7), uint64_t(1000)}) {
    SplitMix64 stepped(42), jumped(42);
    for (uint64_t i = 0; i < n; ++i) stepped.next();
    jumped.discard(n);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(jumped.next(), stepped.next()) << n;
  }
  SplitMix64 a(7), b(7);
  a.discard(uint64_t(1) << 63);  // wraps like 2^63 calls would
  a.discard(uint64_t(1) << 63);
  EXPECT_EQ(a.next(), b.next());
}

}  // namespace
}  // namespace longctx
