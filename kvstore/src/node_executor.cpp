#include "longctx/kvstore/node_executor.h"

#include <hwloc.h>
#include <sched.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#include <tbb/task_scheduler_observer.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::kvstore {
namespace {

// What a thread did on entering one of our arenas, undone when it leaves.
// Entries and exits nest (an arena entered from inside another is left first).
// The binding before is saved as the kernel's affinity mask, not through
// hwloc: hwloc reports a binding cut down to its topology's PUs, so with a
// topology of fewer PUs than the machine (HWLOC_SYNTHETIC, a restricted one)
// restoring it would leave the thread bound to those.
struct EntryFrame {
  const void* observer = nullptr;  // the arena's observer
  int node = -1;                   // the arena's node
  bool pinned = false;             // saved holds the thread's affinity before
  cpu_set_t saved;
};
thread_local std::vector<EntryFrame> t_entries;

// This machine's topology, for binding threads. Loaded once, never destroyed:
// a store's own topology may die before the arenas that pin to its nodes.
hwloc_topology_t system_topology() {
  static NumaTopology* const system = new NumaTopology(NumaTopology::detect());
  return static_cast<hwloc_topology_t>(system->hwloc_handle());
}

// Marks (and, given a topology, pins to `cpus`) every thread in its arena.
class NodeObserver : public tbb::task_scheduler_observer {
 public:
  NodeObserver(tbb::task_arena& arena, int node, const std::vector<int>& cpus, hwloc_topology_t pin_topology)
      : tbb::task_scheduler_observer(arena), node_(node), topology_(pin_topology) {
    if (topology_ != nullptr) {
      cpuset_ = hwloc_bitmap_alloc();
      if (cpuset_ == nullptr) fail(ErrorCode::kOutOfMemory, "hwloc_bitmap_alloc failed");
      for (const int cpu : cpus) hwloc_bitmap_set(cpuset_, unsigned(cpu));
    }
  }
  ~NodeObserver() override {
    observe(false);
    hwloc_bitmap_free(cpuset_);
  }

  void on_scheduler_entry(bool /*is_worker*/) override {
    EntryFrame frame;
    frame.observer = this, frame.node = node_;
    // Pin only what can be restored. A refused binding (a cpuset the process
    // may not use) only costs locality.
    if (topology_ != nullptr && sched_getaffinity(0, sizeof(frame.saved), &frame.saved) == 0) {
      frame.pinned = true;
      hwloc_set_cpubind(topology_, cpuset_, HWLOC_CPUBIND_THREAD);
    }
    t_entries.push_back(frame);
  }

  void on_scheduler_exit(bool /*is_worker*/) override {
    for (size_t i = t_entries.size(); i-- > 0;) {
      if (t_entries[i].observer != this) continue;
      if (t_entries[i].pinned) sched_setaffinity(0, sizeof(t_entries[i].saved), &t_entries[i].saved);
      t_entries.erase(t_entries.begin() + std::ptrdiff_t(i));
      return;
    }
  }

 private:
  int node_;
  hwloc_topology_t topology_;  // null: synthetic topology, mark only
  hwloc_bitmap_t cpuset_ = nullptr;
};

struct NodeArena {
  // One slot stays reserved for a caller (TBB's default): the arena asks for
  // concurrency - 1 workers, which never exceeds what the caller's limit lets
  // TBB start, and the caller waiting on the group works in that slot.
  NodeArena(int node, const std::vector<int>& cpus, int concurrency, hwloc_topology_t pin_topology)
      : arena(concurrency, 1), observer(arena, node, cpus, pin_topology) {
    arena.initialize();
    observer.observe(true);
  }
  tbb::task_arena arena;
  NodeObserver observer;
};

tbb::task_arena& node_arena(const NumaTopology& topology, int node, int limit) {
  const std::vector<int> cpus = topology.node_cpus(node);
  // A node without PUs (memory only) has no threads of its own: unpinned arena.
  const bool pin = topology.is_this_system() && !cpus.empty();
  const int concurrency = cpus.empty() ? limit : std::min(int(cpus.size()), limit);
  using Key = std::tuple<int, std::vector<int>, bool, int>;
  static std::mutex mutex;
  static auto* const arenas = new std::map<Key, std::unique_ptr<NodeArena>>();  // never destroyed
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<NodeArena>& slot = (*arenas)[Key{node, cpus, pin, concurrency}];
  if (!slot) slot = std::make_unique<NodeArena>(node, cpus, concurrency, pin ? system_topology() : nullptr);
  return slot->arena;
}

// The threads the caller allows: global_control's limit and its arena's.
int caller_limit() {
  const size_t global = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return int(std::min<size_t>(global, size_t(std::max(1, tbb::this_task_arena::max_concurrency()))));
}

}  // namespace

int current_executor_node() { return t_entries.empty() ? -1 : t_entries.back().node; }

void parallel_for_heads(const KVStore& store, int64_t n_items, const std::function<int(int64_t)>& head_of_item,
                        const std::function<void(int64_t)>& body, const std::function<void(int)>& head_done) {
  if (n_items <= 0) return;
  const NumaTopology& topology = store.topology();
  const int limit = caller_limit();
  const bool placed = !(topology.node_count() == 1 || store.config().numa.kind == NumaPolicy::Kind::kNone ||
                        limit <= 1 || current_executor_node() >= 0);

  const int n_kv_heads = store.layout().shape.n_kv_heads;
  std::vector<int> heads;  // head_of_item of every item, where asked
  if (placed || head_done) {
    heads.resize(size_t(n_items));
    for (int64_t i = 0; i < n_items; ++i) {
      const int head = head_of_item(i);
      if (head < 0 || head >= n_kv_heads) {
        fail(ErrorCode::kInvalidArgument, "parallel_for_heads: item ", i, " of ", n_items, " reads kv head ", head,
             ", the store has ", n_kv_heads, " kv heads");
      }
      heads[size_t(i)] = head;
    }
  }
  // Items of each head whose body has not finished: the task that finishes
  // the last one calls head_done (acq_rel: it sees the other bodies' writes).
  std::vector<std::atomic<int64_t>> unfinished(head_done ? size_t(n_kv_heads) : 0);
  if (head_done)
    for (const int head : heads) ++unfinished[size_t(head)];
  const auto run = [&](int64_t i) {
    body(i);
    if (!head_done) return;
    const int head = heads[size_t(i)];
    if (unfinished[size_t(head)].fetch_sub(1, std::memory_order_acq_rel) == 1) head_done(head);
  };
  if (!placed) {
    tbb::parallel_for(int64_t{0}, n_items, run);
    return;
  }

  const std::vector<int>& head_nodes = store.head_nodes();
  std::vector<std::vector<int64_t>> items_of_node(size_t(topology.node_count()));
  for (int64_t i = 0; i < n_items; ++i) items_of_node[size_t(head_nodes[size_t(heads[size_t(i)])])].push_back(i);

  struct Group {
    tbb::task_arena* arena = nullptr;
    const std::vector<int64_t>* items = nullptr;
    tbb::task_group work;
  };
  std::vector<std::unique_ptr<Group>> groups;  // task_group cannot move
  for (int node = 0; node < topology.node_count(); ++node) {
    if (items_of_node[size_t(node)].empty()) continue;
    groups.push_back(std::make_unique<Group>());
    groups.back()->arena = &node_arena(topology, node, limit);
    groups.back()->items = &items_of_node[size_t(node)];
  }

  // Start every group, then wait for each inside its arena (the caller helps).
  std::exception_ptr first_error;
  size_t started = 0;
  try {
    for (; started < groups.size(); ++started) {
      Group& group = *groups[started];
      group.arena->execute([&] {
        group.work.run([&] {
          tbb::parallel_for(size_t{0}, group.items->size(), [&](size_t j) { run((*group.items)[j]); });
        });
      });
    }
  } catch (...) {
    first_error = std::current_exception();
  }
  for (size_t k = 0; k < started; ++k) {
    Group& group = *groups[k];
    try {
      group.arena->execute([&] { group.work.wait(); });
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace longctx::kvstore
