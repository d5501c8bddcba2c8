#include "longctx/kvstore/memory_budget.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::kvstore {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(MemoryBudget, CountsReservationsExactly) {
  MemoryBudget budget(10 * kMiB);
  EXPECT_EQ(budget.limit(), 10 * kMiB);
  EXPECT_EQ(budget.name(), "DRAM budget");
  budget.reserve(3 * kMiB, "a");
  budget.reserve(5, "b");
  EXPECT_EQ(budget.used(), 3 * kMiB + 5);
  EXPECT_EQ(budget.available(), 7 * kMiB - 5);
  budget.release(5);
  EXPECT_EQ(budget.used(), 3 * kMiB);
  budget.release(3 * kMiB);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.available(), 10 * kMiB);
}

TEST(MemoryBudget, ReservesUpToTheLimitAndNotOneByteMore) {
  MemoryBudget budget(1000);
  budget.reserve(999, "x");
  budget.reserve(1, "x");
  EXPECT_EQ(budget.available(), 0u);
  budget.reserve(0, "nothing");  // always fits
  EXPECT_THROW(budget.reserve(1, "x"), Error);
  EXPECT_EQ(budget.used(), 1000u);
}

TEST(MemoryBudget, OverrunMessageNamesWhatAndTheNumbers) {
  MemoryBudget budget(64 * kMiB);
  budget.reserve(63 * kMiB, "earlier");
  try {
    budget.reserve(2 * kMiB, "slab on NUMA node 1");
    FAIL() << "reserve beyond the limit must throw";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kOutOfMemory);
    EXPECT_EQ(std::string(error.what()),
              "slab on NUMA node 1: requested 2.00 MiB (2097152 bytes), 1.00 MiB (1048576 bytes) "
              "available (DRAM budget 64.00 MiB (67108864 bytes), 63.00 MiB (66060288 bytes) in use)");
  }
  EXPECT_EQ(budget.used(), 63 * kMiB);  // a failed reserve takes nothing
}

TEST(MemoryBudget, OverrunMessageUsesTheBudgetName) {
  MemoryBudget budget(100, "pinned budget");
  try {
    budget.reserve(101, "staging buffer");
    FAIL();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("staging buffer: requested 101 B (101 bytes), 100 B (100 bytes) available"),
              std::string::npos) << message;
    EXPECT_NE(message.find("(pinned budget 100 B (100 bytes), 0 B (0 bytes) in use)"), std::string::npos)
        << message;
  }
}

TEST(MemoryBudget, HugeRequestDoesNotWrap) {
  MemoryBudget budget(kMiB);
  budget.reserve(10, "x");
  EXPECT_THROW(budget.reserve(UINT64_MAX, "x"), Error);
  EXPECT_THROW(budget.reserve(UINT64_MAX - 5, "x"), Error);
  EXPECT_EQ(budget.used(), 10u);
}

TEST(MemoryBudget, ReleasingMoreThanReservedIsAnErrorAndChangesNothing) {
  MemoryBudget budget(kMiB);
  budget.reserve(100, "x");
  try {
    budget.release(101);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
  }
  EXPECT_EQ(budget.used(), 100u);
}

// Threads reserve fixed chunks until the budget refuses. No reservation may
// be lost or granted beyond the limit, and once every thread has been refused
// less than the smallest chunk can be left.
TEST(MemoryBudget, ConcurrentReservationsNeverExceedTheLimit) {
  constexpr int kThreads = 4;
  const uint64_t chunks[kThreads] = {4096, 3 * 4096 + 7, 5 * 4096 + 1, 13};
  const uint64_t limit = 4096 * 1000 + 123;
  MemoryBudget budget(limit);
  for (int round = 0; round < 20; ++round) {
    std::vector<uint64_t> held(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (;;) {
          try {
            budget.reserve(chunks[t], "chunk");
          } catch (const Error&) {
            return;
          }
          held[size_t(t)] += chunks[t];
        }
      });
    }
    for (auto& thread : threads) thread.join();
    uint64_t total = 0;
    for (const uint64_t bytes : held) total += bytes;
    ASSERT_EQ(budget.used(), total);
    ASSERT_LE(total, limit);
    ASSERT_LT(limit - total, uint64_t{13});
    for (const uint64_t bytes : held) budget.release(bytes);
    ASSERT_EQ(budget.used(), 0u);
  }
}

// Mixed reserve/release traffic with a watcher: used() never exceeds the
// limit and everything adds up to zero at the end.
TEST(MemoryBudget, ConcurrentReserveAndReleaseStayConsistent) {
  constexpr int kThreads = 4;
  const uint64_t limit = 16 * 4096;  // small enough that even one thread gets refused
  MemoryBudget budget(limit);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> max_seen{0};
  std::thread watcher([&] {
    while (!done.load()) {
      const uint64_t used = budget.used();
      if (used > max_seen.load()) max_seen.store(used);
    }
  });
  std::vector<std::thread> threads;
  std::atomic<int64_t> granted{0};
  std::atomic<int64_t> refused{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(test_seed(1234u + unsigned(t)));
      std::vector<uint64_t> held;
      for (int i = 0; i < 20000; ++i) {
        const uint64_t bytes = 1 + rng() % (8 * 4096);
        try {
          budget.reserve(bytes, "random");
          held.push_back(bytes);
          ++granted;
        } catch (const Error&) {
          ++refused;
        }
        if (held.size() > 3 || (!held.empty() && rng() % 2 == 0)) {
          budget.release(held.back());
          held.pop_back();
        }
      }
      for (const uint64_t bytes : held) budget.release(bytes);
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  watcher.join();
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_LE(max_seen.load(), limit);
  EXPECT_GT(granted.load(), 0);
  EXPECT_GT(refused.load(), 0);  // the limit was actually contended
}

TEST(MemoryBudget, DefaultIsNinetyPercentOfPhysicalMemoryOrLess) {
  const uint64_t physical = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t budget = default_dram_budget();
  EXPECT_GT(budget, 0u);
  EXPECT_LE(budget, physical / 10 * 9);
  const bool has_cgroup_limit_file = std::filesystem::exists("/sys/fs/cgroup/memory.max") ||
                                     std::filesystem::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (!has_cgroup_limit_file) {
    EXPECT_EQ(budget, physical / 10 * 9);
  }
}

}  // namespace
}  // namespace longctx::kvstore
