// parallel_for_heads: every item once, each on its kv head's node arena when
// the store spans several nodes, plain parallel_for otherwise; exceptions,
// nesting, concurrent callers; and, on a synthetic topology that hwloc treats
// as this machine, the binding of the node's threads and its undoing.
#include "longctx/kvstore/node_executor.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/kv_reference.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::kvstore {
namespace {

using testref::make_store;
using testref::small_config;
using testref::TestStore;

TestStore store_on(const std::string& topology, int n_kv_heads, NumaPolicy numa = {}) {
  LongContextConfig config = small_config(16, DType::kF16, RepresentativeType::kQuest, 2, 64);
  config.numa = std::move(numa);
  return make_store(KVShape{1, n_kv_heads, 64}, config, uint64_t{1} << 30, topology);
}

// What each item saw when it ran.
struct Record {
  std::vector<std::atomic<int>> runs;
  std::vector<std::atomic<int>> node;         // current_executor_node() in the body
  std::vector<std::atomic<int>> concurrency;  // this_task_arena::max_concurrency() in the body
  explicit Record(int64_t n) : runs(size_t(n)), node(size_t(n)), concurrency(size_t(n)) {}
};

// Runs n items with the given item -> kv head map and records each body.
std::unique_ptr<Record> run_items(const KVStore& store, const std::vector<int>& head_of) {
  const int64_t n = int64_t(head_of.size());
  auto record = std::make_unique<Record>(n);
  parallel_for_heads(
      store, n, [&](int64_t i) { return head_of[size_t(i)]; },
      [&](int64_t i) {
        record->runs[size_t(i)].fetch_add(1);
        record->node[size_t(i)].store(current_executor_node());
        record->concurrency[size_t(i)].store(tbb::this_task_arena::max_concurrency());
      });
  return record;
}

std::vector<int> random_heads(int64_t n, int n_kv_heads, uint32_t seed) {
  std::mt19937 rng(test_seed(seed));
  std::vector<int> heads(static_cast<size_t>(n));
  for (int& h : heads) h = int(rng() % uint32_t(n_kv_heads));
  return heads;
}

// Every item ran once, on the arena of its head's node (-1: the caller's arena).
void expect_placed(const KVStore& store, const std::vector<int>& head_of, const Record& record, bool on_nodes,
                   int node_concurrency) {
  for (size_t i = 0; i < head_of.size(); ++i) {
    ASSERT_EQ(record.runs[i].load(), 1) << "item " << i;
    const int expected = on_nodes ? store.node_of_head(head_of[i]) : -1;
    ASSERT_EQ(record.node[i].load(), expected) << "item " << i << " (kv head " << head_of[i] << ")";
    if (on_nodes) {
      ASSERT_EQ(record.concurrency[i].load(), node_concurrency) << "item " << i;
    }
  }
}

TEST(NodeExecutor, OneNodeIsPlainParallelForInTheCallersArena) {
  TestStore ts = store_on("core:2 pu:1", 3);
  std::atomic<int> head_calls{0};
  std::vector<std::atomic<int>> runs(1000);
  parallel_for_heads(
      *ts.store, 1000,
      [&](int64_t) {
        head_calls++;
        return 0;
      },
      [&](int64_t i) {
        runs[size_t(i)].fetch_add(1);
        EXPECT_EQ(current_executor_node(), -1);
      });
  for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "item " << i;
  EXPECT_EQ(head_calls.load(), 0);  // placement cannot matter: not even asked
  EXPECT_EQ(current_executor_node(), -1);

  // The caller's arena limits the threads.
  tbb::task_arena one(1);
  one.execute([&] {
    const std::vector<int> heads = random_heads(300, 3, 1);
    const auto record = run_items(*ts.store, heads);
    for (size_t i = 0; i < heads.size(); ++i) ASSERT_EQ(record->concurrency[i].load(), 1);
  });
  // Nothing to do is fine.
  parallel_for_heads(*ts.store, 0, [](int64_t) { return 0; }, [](int64_t) { FAIL() << "no item"; });
}

TEST(NodeExecutor, TwoNodesRunEachItemOnItsHeadsNode) {
  TestStore ts = store_on("pack:2 numa:1 core:2 pu:1", 4);
  ASSERT_EQ(ts.store->head_nodes(), (std::vector<int>{0, 0, 1, 1}));
  for (const int64_t n : {1, 2, 7, 1000}) {
    const std::vector<int> heads = random_heads(n, 4, uint32_t(n));
    const auto record = run_items(*ts.store, heads);
    expect_placed(*ts.store, heads, *record, true, 2);  // 2 PUs per node
  }
  // Items of one node only (heads 2, 3): node 1's arena still.
  const std::vector<int> node1(50, 3);
  expect_placed(*ts.store, node1, *run_items(*ts.store, node1), true, 2);
  EXPECT_EQ(current_executor_node(), -1);
}

TEST(NodeExecutor, FourNodesIncludingAnUnusedOne) {
  // 8 heads: 2 per node. 3 heads: nodes 0, 1, 2 (node 3 holds none).
  for (const int n_kv_heads : {8, 3}) {
    TestStore ts = store_on("numa:4 core:2 pu:1", n_kv_heads);
    ASSERT_EQ(ts.store->head_nodes(), place_kv_heads(n_kv_heads, {0, 1, 2, 3}));
    const std::vector<int> heads = random_heads(2000, n_kv_heads, 7);
    expect_placed(*ts.store, heads, *run_items(*ts.store, heads), true, 2);
  }
}

TEST(NodeExecutor, NodeConcurrencyIsCappedByTheCallersLimit) {
  TestStore ts = store_on("numa:2 core:4 pu:1", 4);  // 4 PUs per node
  const std::vector<int> heads = random_heads(500, 4, 3);
  const int machine = tbb::info::default_concurrency();
  expect_placed(*ts.store, heads, *run_items(*ts.store, heads), true, std::min(4, machine));
  const int fewer = std::max(2, machine - 1);  // a caller arena below the machine (where it has > 2 threads)
  tbb::task_arena limited(fewer);
  limited.execute([&] { expect_placed(*ts.store, heads, *run_items(*ts.store, heads), true, std::min(4, fewer)); });
  {
    const tbb::global_control two(tbb::global_control::max_allowed_parallelism, 2);
    expect_placed(*ts.store, heads, *run_items(*ts.store, heads), true, 2);
  }
  {
    // One thread allowed: placement cannot be honoured, run in the caller.
    const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    expect_placed(*ts.store, heads, *run_items(*ts.store, heads), false, 1);
  }
}

TEST(NodeExecutor, NumaPolicyDecides) {
  // numa: [1] puts every head on node 1: its arena runs them.
  NumaPolicy on_1;
  on_1.kind = NumaPolicy::Kind::kNodes;
  on_1.nodes = {1};
  TestStore one = store_on("pack:2 numa:1 core:2 pu:1", 4, on_1);
  const std::vector<int> heads = random_heads(200, 4, 5);
  expect_placed(*one.store, heads, *run_items(*one.store, heads), true, 2);
  // numa: none lets the OS place pages: the caller's arena.
  NumaPolicy none;
  none.kind = NumaPolicy::Kind::kNone;
  TestStore os = store_on("pack:2 numa:1 core:2 pu:1", 4, none);
  expect_placed(*os.store, heads, *run_items(*os.store, heads), false, 0);
}

TEST(NodeExecutor, BadHeadIsRejectedBeforeAnyItemRuns) {
  TestStore ts = store_on("pack:2 numa:1 core:2 pu:1", 4);
  for (const int bad : {-1, 4}) {
    std::atomic<int> runs{0};
    try {
      parallel_for_heads(
          *ts.store, 100, [&](int64_t i) { return i == 60 ? bad : int(i % 4); }, [&](int64_t) { runs++; });
      ADD_FAILURE() << "kv head " << bad << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("item 60 of 100 reads kv head " + std::to_string(bad)),
                std::string::npos)
          << error.what();
    }
    EXPECT_EQ(runs.load(), 0);
  }
}

// head_done runs once per kv head that has items, after every body of the
// head's items, whether placement matters (two nodes) or not (one node, and
// the caller's single thread); an out-of-range head is then rejected on one
// node too, since head_done needs every item's head.
TEST(NodeExecutor, HeadDoneFollowsEachHeadsLastItem) {
  for (const char* topology : {"core:2 pu:1", "pack:2 numa:1 core:2 pu:1"}) {
    TestStore ts = store_on(topology, 4);
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(std::string(topology) + ", " + std::to_string(threads) + " threads");
      const std::vector<int> heads = random_heads(500, 3, uint32_t(threads));  // kv head 3 has no item
      std::vector<int> items_of_head(4, 0);
      for (const int h : heads) ++items_of_head[size_t(h)];
      std::vector<std::atomic<int>> finished(4), done_calls(4), finished_at_done(4);
      tbb::task_arena(threads).execute([&] {
        parallel_for_heads(
            *ts.store, int64_t(heads.size()), [&](int64_t i) { return heads[size_t(i)]; },
            [&](int64_t i) { finished[size_t(heads[size_t(i)])]++; },
            [&](int h) {
              done_calls[size_t(h)]++;
              finished_at_done[size_t(h)].store(finished[size_t(h)].load());
            });
      });
      for (int h = 0; h < 4; ++h) {
        EXPECT_EQ(done_calls[size_t(h)].load(), items_of_head[size_t(h)] > 0 ? 1 : 0) << "kv head " << h;
        EXPECT_EQ(finished_at_done[size_t(h)].load(), items_of_head[size_t(h)]) << "kv head " << h;
      }
    }
    std::atomic<int> runs{0};
    EXPECT_THROW(parallel_for_heads(
                     *ts.store, 10, [](int64_t i) { return i == 7 ? 4 : 0; }, [&](int64_t) { runs++; }, [](int) {}),
                 Error);
    EXPECT_EQ(runs.load(), 0);
  }
}

TEST(NodeExecutor, ExceptionReachesTheCallerAfterEveryGroupEnded) {
  TestStore ts = store_on("pack:2 numa:1 core:2 pu:1", 4);
  const std::vector<int> heads = random_heads(400, 4, 9);
  for (const int throwing_node : {0, 1}) {
    std::vector<std::atomic<int>> runs(heads.size());
    std::atomic<bool> thrown{false};
    try {
      parallel_for_heads(
          *ts.store, int64_t(heads.size()), [&](int64_t i) { return heads[size_t(i)]; },
          [&](int64_t i) {
            runs[size_t(i)]++;
            if (ts.store->node_of_head(heads[size_t(i)]) == throwing_node && !thrown.exchange(true)) {
              fail(ErrorCode::kInternal, "item ", i, " failed");
            }
          });
      ADD_FAILURE() << "no exception";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInternal);
      EXPECT_NE(std::string(error.what()).find("failed"), std::string::npos);
    }
    // The other node's group ran to its end, and nothing ran twice.
    for (size_t i = 0; i < heads.size(); ++i) {
      const bool other = ts.store->node_of_head(heads[i]) != throwing_node;
      if (other) {
        ASSERT_EQ(runs[i].load(), 1) << "item " << i;
      }
      ASSERT_LE(runs[i].load(), 1) << "item " << i;
    }
  }
  // Both nodes throw: one of the exceptions comes back; the executor still works.
  EXPECT_THROW(parallel_for_heads(
                   *ts.store, 400, [](int64_t i) { return int(i % 4); },
                   [](int64_t) { throw std::runtime_error("every item fails"); }),
               std::runtime_error);
  expect_placed(*ts.store, heads, *run_items(*ts.store, heads), true, 2);
}

TEST(NodeExecutor, NestedCallsRunInTheCurrentArena) {
  TestStore ts = store_on("pack:2 numa:1 core:2 pu:1", 4);
  const std::vector<int> outer = random_heads(64, 4, 11);
  std::vector<std::atomic<int>> inner_runs(outer.size() * 32);
  parallel_for_heads(
      *ts.store, int64_t(outer.size()), [&](int64_t i) { return outer[size_t(i)]; },
      [&](int64_t i) {
        const int node = current_executor_node();
        EXPECT_EQ(node, ts.store->node_of_head(outer[size_t(i)]));
        // The inner items read heads of both nodes, yet stay on this thread's arena.
        parallel_for_heads(
            *ts.store, 32, [](int64_t j) { return int(j % 4); },
            [&](int64_t j) {
              inner_runs[size_t(i) * 32 + size_t(j)]++;
              EXPECT_EQ(current_executor_node(), node);
            });
      });
  for (size_t k = 0; k < inner_runs.size(); ++k) ASSERT_EQ(inner_runs[k].load(), 1) << "inner item " << k;
}

TEST(NodeExecutor, ConcurrentCallersShareTheArenas) {
  TestStore ts = store_on("pack:2 numa:1 core:2 pu:1", 4);
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 20; ++round) {
        const std::vector<int> heads = random_heads(100, 4, uint32_t(c * 100 + round));
        const auto record = run_items(*ts.store, heads);
        for (size_t i = 0; i < heads.size(); ++i) {
          if (record->runs[i].load() != 1 || record->node[i].load() != ts.store->node_of_head(heads[i]))
            failures++;
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// The calling thread's CPUs, as a bit mask.
uint64_t thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  uint64_t mask = 0;
  for (int cpu = 0; cpu < 64; ++cpu)
    if (CPU_ISSET(cpu, &set)) mask |= uint64_t{1} << cpu;
  return mask;
}

// Binding needs a topology that is this system with several nodes. hwloc
// builds one from the environment: a synthetic two-node machine (one PU per
// node: CPUs 0 and 1) that hwloc treats as this system, so the binding really
// happens. Run in a fresh process (threadsafe death test) so that the
// environment is read by the first topology load of that process.
TEST(NodeExecutorDeathTest, ThreadsOfANodeArenaAreBoundToItsCpusAndUnboundAfter) {
  if ((thread_cpus() & 0b11) != 0b11) GTEST_SKIP() << "needs CPUs 0 and 1";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("HWLOC_SYNTHETIC", "pack:2 numa:1 core:1 pu:1", 1);
        setenv("HWLOC_THISSYSTEM", "1", 1);
        TestStore ts = store_on("", 4);  // detect(): the environment's topology
        if (!ts.topology->is_this_system() || ts.topology->node_count() != 2) {
          std::fprintf(stderr, "the environment did not give a two-node topology of this system\n");
          std::exit(1);
        }
        const uint64_t before = thread_cpus();
        std::atomic<int> wrong{0};
        std::atomic<int> runs{0};
        for (int round = 0; round < 20; ++round) {
          parallel_for_heads(
              *ts.store, 200, [](int64_t i) { return int(i % 4); },
              [&](int64_t i) {
                const int node = ts.store->node_of_head(int(i % 4));
                const uint64_t want = uint64_t{1} << ts.topology->node_cpus(node).at(0);
                if (thread_cpus() != want || sched_getcpu() != ts.topology->node_cpus(node).at(0)) wrong++;
                runs++;
              });
        }
        if (thread_cpus() != before) {
          std::fprintf(stderr, "the caller stayed bound\n");
          std::exit(2);
        }
        // Workers that left the node arenas are unbound too.
        std::atomic<int> bound_after{0};
        tbb::parallel_for(0, 2000, [&](int) {
          if (thread_cpus() != before) bound_after++;
        });
        std::fprintf(stderr, "runs %d wrong %d bound_after %d\n", runs.load(), wrong.load(), bound_after.load());
        std::exit(0);
      },
      testing::ExitedWithCode(0), "runs 4000 wrong 0 bound_after 0");
}

}  // namespace
}  // namespace longctx::kvstore
