#include "longctx/kvstore/block_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::kvstore {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Independent reference of the pool geometry.
size_t ref_page_bytes(size_t bytes) { return (bytes + 63) / 64 * 64; }
size_t ref_slab_bytes(size_t bytes) {
  const size_t page = ref_page_bytes(bytes);
  size_t slab = kSlabBytes;
  while (slab < page) slab += kSlabBytes;
  return slab;
}
uint64_t ref_slab_bytes_for(size_t n, size_t bytes) {
  const size_t per_slab = ref_slab_bytes(bytes) / ref_page_bytes(bytes);
  return uint64_t((n + per_slab - 1) / per_slab) * ref_slab_bytes(bytes);
}

const NumaTopology& one_node() {
  static const NumaTopology topology = NumaTopology::synthetic("core:2 pu:1");
  return topology;
}

bool all_zero(const std::byte* page, size_t bytes) {
  return std::all_of(page, page + bytes, [](std::byte b) { return b == std::byte{0}; });
}

// Checks that the pages are 64-byte aligned, pairwise disjoint and writable.
void expect_distinct_writable_pages(std::vector<std::byte*> pages, size_t page_bytes) {
  for (std::byte* page : pages) {
    ASSERT_EQ(reinterpret_cast<uintptr_t>(page) % 64, 0u);
    std::memset(page, 0x5a, page_bytes);
  }
  std::sort(pages.begin(), pages.end());
  for (size_t i = 1; i < pages.size(); ++i) {
    ASSERT_GE(uintptr_t(pages[i]) - uintptr_t(pages[i - 1]), page_bytes) << "pages overlap";
  }
}

TEST(BlockPool, GeometryFollowsPageSize) {
  MemoryBudget budget(64 * kMiB);
  for (const size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4096}, size_t{12345},
                             kSlabBytes - 1, kSlabBytes, kSlabBytes + 1, 3 * kSlabBytes - 64}) {
    BlockPool pool(one_node(), 0, bytes, budget);
    EXPECT_EQ(pool.page_bytes(), ref_page_bytes(bytes)) << bytes;
    EXPECT_EQ(pool.pages_per_slab(), ref_slab_bytes(bytes) / ref_page_bytes(bytes)) << bytes;
    EXPECT_EQ(pool.node(), 0);
    EXPECT_EQ(pool.slab_count(), 0u);
    EXPECT_EQ(pool.reserved_bytes(), 0u);
  }
  EXPECT_EQ(budget.used(), 0u);  // nothing is mapped before the first allocation
}

TEST(BlockPool, SlabBytesForMatchesReferenceAndRealPools) {
  std::mt19937 rng(test_seed(7));
  for (const size_t bytes : {size_t{64}, size_t{100}, size_t{4096}, size_t{65536 + 8}, size_t{700000},
                             kSlabBytes, kSlabBytes + 64, 5 * kMiB + 3}) {
    for (int trial = 0; trial < 4; ++trial) {
      const size_t n = trial == 0 ? 0 : 1 + rng() % 200;
      const uint64_t expected = ref_slab_bytes_for(n, bytes);
      EXPECT_EQ(BlockPool::slab_bytes_for(n, bytes), expected) << n << " pages of " << bytes;
      if (expected > 64 * kMiB) continue;  // keep the test light on memory
      MemoryBudget budget(expected);        // exactly enough
      BlockPool pool(one_node(), 0, bytes, budget);
      const auto pages = pool.allocate(n);
      EXPECT_EQ(pages.size(), n);
      EXPECT_EQ(pool.reserved_bytes(), expected);
      EXPECT_EQ(budget.used(), expected);
      EXPECT_EQ(pool.slab_count() * ref_slab_bytes(bytes), expected);
    }
  }
  EXPECT_THROW(BlockPool::slab_bytes_for(SIZE_MAX, kSlabBytes), Error);
  EXPECT_THROW(BlockPool::slab_bytes_for(1, 0), Error);
}

TEST(BlockPool, PagesAreAlignedDistinctAndSlabsStartOn2MiB) {
  MemoryBudget budget(64 * kMiB);
  for (const size_t bytes : {size_t{4160}, size_t{100000}, size_t{64}}) {
    BlockPool pool(one_node(), 0, bytes, budget);
    const size_t per_slab = pool.pages_per_slab();
    std::vector<std::byte*> pages;
    // Several calls, so slabs are added one allocation at a time and in bulk.
    for (size_t got = 0; got < 3 * per_slab + 1;) {
      const size_t n = std::min<size_t>(3 * per_slab + 1 - got, got == 0 ? 1 : per_slab / 2 + 1);
      const auto more = pool.allocate(n);
      pages.insert(pages.end(), more.begin(), more.end());
      got += n;
    }
    ASSERT_EQ(pool.slab_count(), 4u);
    ASSERT_EQ(pool.pages_in_use(), pages.size());
    // Fresh pages are handed out in slab order, so page k * per_slab starts slab k.
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pages[k * per_slab]) % kSlabBytes, 0u) << "slab " << k;
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      EXPECT_TRUE(all_zero(pages[i], pool.page_bytes())) << "fresh page " << i;
    }
    expect_distinct_writable_pages(pages, pool.page_bytes());
    pool.release(pages);
    EXPECT_EQ(pool.pages_in_use(), 0u);
    EXPECT_EQ(pool.slab_count(), 4u);  // slabs stay mapped
  }
}

TEST(BlockPool, ReusedPagesAreZeroed) {
  MemoryBudget budget(16 * kMiB);
  BlockPool pool(one_node(), 0, 1000, budget);
  auto pages = pool.allocate(50);
  for (std::byte* page : pages) std::memset(page, 0xab, pool.page_bytes());
  const std::set<std::byte*> first(pages.begin(), pages.end());
  pool.release(pages);
  const auto again = pool.allocate(50);
  EXPECT_EQ(std::set<std::byte*>(again.begin(), again.end()), first);  // reused, not new
  EXPECT_EQ(pool.slab_count(), 1u);
  for (std::byte* page : again) EXPECT_TRUE(all_zero(page, pool.page_bytes()));
}

TEST(BlockPool, BudgetAccountingIsExact) {
  MemoryBudget budget(100 * kMiB);
  {
    BlockPool pool(one_node(), 0, 256 * 1024, budget);  // 8 pages per slab
    ASSERT_EQ(pool.pages_per_slab(), 8u);
    auto a = pool.allocate(8);
    EXPECT_EQ(budget.used(), 2 * kMiB);
    auto b = pool.allocate(1);
    EXPECT_EQ(budget.used(), 4 * kMiB);
    EXPECT_EQ(pool.reserved_bytes(), 4 * kMiB);
    pool.release(a);
    EXPECT_EQ(budget.used(), 4 * kMiB);  // released pages keep their slab
    EXPECT_EQ(pool.pages_in_use(), 1u);
    auto c = pool.allocate(15);           // 8 free + 7 fresh of slab 2: no new slab
    EXPECT_EQ(pool.slab_count(), 2u);
    EXPECT_EQ(pool.pages_in_use(), 16u);
    auto d = pool.allocate(1);
    EXPECT_EQ(pool.slab_count(), 3u);
    EXPECT_EQ(budget.used(), 6 * kMiB);
  }
  EXPECT_EQ(budget.used(), 0u);  // the destructor gives everything back
}

TEST(BlockPool, OverrunNamesRequestedAndAvailableBytes) {
  MemoryBudget budget(4 * kMiB + 100);
  BlockPool pool(one_node(), 0, 64 * 1024, budget);  // 32 pages per slab
  try {
    pool.allocate(100);  // 4 slabs
    FAIL() << "allocation beyond the budget must throw";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kOutOfMemory);
    const std::string message = error.what();
    EXPECT_NE(message.find("NUMA node 0"), std::string::npos) << message;
    EXPECT_NE(message.find("requested 8.00 MiB (8388608 bytes)"), std::string::npos) << message;
    EXPECT_NE(message.find("(4194404 bytes) available"), std::string::npos) << message;
  }
  EXPECT_EQ(pool.slab_count(), 0u);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(pool.allocate(64).size(), 64u);  // what fits still works
}

TEST(BlockPool, FailedAllocationLeavesPoolExactlyAsBefore) {
  MemoryBudget budget(3 * kSlabBytes);
  BlockPool pool(one_node(), 0, 64 * 1024, budget);  // 32 pages per slab, 96 fit
  auto held = pool.allocate(40);
  ASSERT_EQ(pool.slab_count(), 2u);
  pool.release({held.back()});
  held.pop_back();
  for (const size_t n : {size_t{58}, size_t{100}, size_t{1000}, SIZE_MAX / 2}) {
    EXPECT_THROW(pool.allocate(n), Error) << n;
    EXPECT_EQ(pool.slab_count(), 2u);
    EXPECT_EQ(pool.pages_in_use(), 39u);
    EXPECT_EQ(pool.reserved_bytes(), 2 * kSlabBytes);
    EXPECT_EQ(budget.used(), 2 * kSlabBytes);
  }
  const auto rest = pool.allocate(57);  // exactly what three slabs still hold
  EXPECT_EQ(pool.slab_count(), 3u);
  EXPECT_EQ(budget.used(), 3 * kSlabBytes);
  held.insert(held.end(), rest.begin(), rest.end());
  expect_distinct_writable_pages(held, pool.page_bytes());
  EXPECT_THROW(pool.allocate(1), Error);
}

TEST(BlockPool, ReleaseRejectsForeignPointersAndChangesNothing) {
  MemoryBudget budget(16 * kMiB);
  BlockPool pool(one_node(), 0, 3000, budget);  // 3008-byte pages, a tail after the last page
  BlockPool other(one_node(), 0, 3000, budget);
  auto pages = pool.allocate(4);
  auto others = other.allocate(1);
  int on_stack = 0;
  std::vector<std::byte> on_heap(64);
  const size_t tail_offset = pool.pages_per_slab() * pool.page_bytes();
  ASSERT_LT(tail_offset, kSlabBytes);
  std::byte* slab_start = pages[0];
  const std::vector<std::vector<std::byte*>> bad = {
      {nullptr},
      {reinterpret_cast<std::byte*>(&on_stack)},
      {on_heap.data()},
      {pages[1] + 64},                 // inside a page
      {slab_start - 64},               // just before the slab
      {slab_start + tail_offset},      // in the slab's unused tail
      {slab_start + kSlabBytes},       // just after the slab
      {others[0]},                     // another pool's page
      {pages[0], pages[2], pages[0]},  // the same page twice
      {pages[0], pages[1] + 1},        // one bad pointer spoils the whole call
  };
  for (const auto& list : bad) {
    try {
      pool.release(list);
      ADD_FAILURE() << "accepted a bad pointer";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    }
    EXPECT_EQ(pool.pages_in_use(), 4u);
  }
  pool.release({pages[3]});
  EXPECT_THROW(pool.release({pages[3]}), Error);  // released twice
  EXPECT_EQ(pool.pages_in_use(), 3u);
  pool.release({pages[0], pages[1], pages[2]});
  EXPECT_EQ(pool.pages_in_use(), 0u);
  pool.release({});
  EXPECT_TRUE(pool.allocate(0).empty());
}

TEST(BlockPool, ConstructorRejectsBadArguments) {
  MemoryBudget budget(kMiB);
  const NumaTopology two = NumaTopology::synthetic("pack:2 numa:1 core:1 pu:1");
  EXPECT_THROW(BlockPool(two, 2, 64, budget), Error);
  EXPECT_THROW(BlockPool(two, -1, 64, budget), Error);
  EXPECT_THROW(BlockPool(two, 0, 0, budget), Error);
  EXPECT_THROW(BlockPool(two, 0, SIZE_MAX, budget), Error);
}

// Threads allocate, stamp, check and release pages. A page handed to two
// owners at once would show another thread's stamp; a reused page that was
// not zeroed would show an old stamp.
TEST(BlockPool, ConcurrentAllocateAndReleaseAreConsistent) {
  constexpr int kThreads = 4;
  MemoryBudget budget(256 * kMiB);
  BlockPool pool(one_node(), 0, 4096, budget);  // 512 pages per slab
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(test_seed(99u + unsigned(t)));
      std::vector<std::byte*> held;
      for (int i = 0; i < 2000; ++i) {
        const auto pages = pool.allocate(1 + rng() % 24);
        for (std::byte* page : pages) {
          if (!all_zero(page, pool.page_bytes())) ++errors;
          std::memset(page, 1 + t, pool.page_bytes());
        }
        held.insert(held.end(), pages.begin(), pages.end());
        std::shuffle(held.begin(), held.end(), rng);
        const size_t keep = rng() % 64;
        if (held.size() > keep) {
          std::vector<std::byte*> give(held.begin() + long(keep), held.end());
          held.resize(keep);
          for (std::byte* page : give) {
            const auto stamp = std::byte(1 + t);
            if (page[0] != stamp || page[pool.page_bytes() - 1] != stamp) ++errors;
          }
          pool.release(give);
        }
      }
      pool.release(held);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(pool.pages_in_use(), 0u);
  EXPECT_EQ(budget.used(), pool.reserved_bytes());
  EXPECT_EQ(pool.reserved_bytes(), pool.slab_count() * kSlabBytes);
  // Never more than 4 threads * (63 kept + 24 new) = 348 pages in use at once:
  // released pages are reused, so one slab is enough.
  EXPECT_EQ(pool.slab_count(), 1u);
}

TEST(BlockPool, SyntheticTwoNodePoolsAllocateUnbound) {
  const NumaTopology two = NumaTopology::synthetic("pack:2 numa:1 core:2 pu:1");
  MemoryBudget budget(16 * kMiB);
  BlockPool pool0(two, 0, 4096, budget);
  BlockPool pool1(two, 1, 4096, budget);
  auto a = pool0.allocate(600);
  auto b = pool1.allocate(10);
  EXPECT_EQ(pool1.node(), 1);
  EXPECT_FALSE(pool0.memory_bound());  // a synthetic topology cannot bind
  EXPECT_FALSE(pool1.memory_bound());
  EXPECT_EQ(budget.used(), pool0.reserved_bytes() + pool1.reserved_bytes());
  EXPECT_EQ(budget.used(), 3 * kSlabBytes);
  a.insert(a.end(), b.begin(), b.end());
  expect_distinct_writable_pages(a, 4096);
}

TEST(BlockPool, ThisMachineBindsOnlyWithSeveralNodes) {
  const NumaTopology here = NumaTopology::detect();
  MemoryBudget budget(16 * kMiB);
  BlockPool pool(here, 0, 4096, budget);
  BlockPool unbound(here, 0, 4096, budget, /*bind_memory=*/false);
  const auto pages = pool.allocate(10);
  unbound.allocate(10);
  expect_distinct_writable_pages(pages, 4096);
  EXPECT_FALSE(unbound.memory_bound());
  if (here.node_count() == 1) {
    EXPECT_FALSE(pool.memory_bound());
  }
  std::printf("this machine: %d NUMA node(s), pool memory bound: %s\n", here.node_count(),
              pool.memory_bound() ? "yes" : "no");
}

TEST(BlockPool, PagesLargerThanASlab) {
  MemoryBudget budget(64 * kMiB);
  const size_t bytes = 3 * kMiB + 1;  // 3 MiB + 64 after rounding: one page per 4 MiB slab
  BlockPool pool(one_node(), 0, bytes, budget);
  ASSERT_EQ(pool.page_bytes(), 3 * kMiB + 64);
  ASSERT_EQ(pool.pages_per_slab(), 1u);
  auto pages = pool.allocate(3);
  EXPECT_EQ(pool.slab_count(), 3u);
  EXPECT_EQ(budget.used(), 12 * kMiB);
  for (std::byte* page : pages) EXPECT_EQ(reinterpret_cast<uintptr_t>(page) % kSlabBytes, 0u);
  expect_distinct_writable_pages(pages, pool.page_bytes());
  pool.release({pages[1]});
  const auto again = pool.allocate(1);
  EXPECT_EQ(again[0], pages[1]);
  EXPECT_TRUE(all_zero(again[0], pool.page_bytes()));
  EXPECT_THROW(pool.allocate(14), Error);  // 56 MiB more than the 52 MiB left
  EXPECT_EQ(pool.slab_count(), 3u);
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// Runs in a child process: caps the address space so that mmap itself fails
// while the budget allows the request. Exit 0: kOutOfMemory and nothing changed.
[[noreturn]] void allocate_past_the_address_space_limit() {
  MemoryBudget budget(uint64_t{1} << 40);
  BlockPool pool(one_node(), 0, 4096, budget);
  pool.allocate(1);
  long vm_pages = 0;
  std::ifstream("/proc/self/statm") >> vm_pages;
  const rlim_t cap = rlim_t(vm_pages) * rlim_t(sysconf(_SC_PAGESIZE)) + 64 * kMiB;
  const rlimit limit{cap, cap};
  if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
  try {
    pool.allocate(512 * 200);  // 200 MiB of slabs
  } catch (const Error& error) {
    const bool as_before = error.code() == ErrorCode::kOutOfMemory && budget.used() == kSlabBytes &&
                           pool.slab_count() == 1 && pool.pages_in_use() == 1;
    _exit(as_before ? 0 : 1);
  }
  _exit(2);
}

TEST(BlockPool, MmapFailureIsOutOfMemoryAndChangesNothing) {
  EXPECT_EXIT(allocate_past_the_address_space_limit(), ::testing::ExitedWithCode(0), "");
}
#endif

}  // namespace
}  // namespace longctx::kvstore
