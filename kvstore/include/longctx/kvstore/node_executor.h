// Runs per-kv-head work on the threads of the NUMA node that holds the head's
// blocks (docs/architecture.md, threads and NUMA).
//
// Scheme. A kernel cuts its work into items (a piece of a kv head's tokens, a
// (kv head, query tile) pair, ...) and says which kv head each item reads.
// - When placement cannot matter (the topology has one node, or the store's
//   numa policy is 'none' so the OS placed its pages) the call is exactly
//   tbb::parallel_for over the items in the caller's arena: no overhead, and
//   the caller's tbb::global_control / task_arena thread limit applies as is.
//   So is a call whose caller allows only one thread, and a call made from
//   inside a body of another multi-node call (it stays in that body's node
//   arena: nesting arenas of different nodes could leave every thread of
//   both waiting on the other).
// - Otherwise (also when every head sits on one node of several, numa: [1])
//   items are grouped by the node of their kv head (head_nodes()).
//   Each group runs as a tbb::parallel_for inside a tbb::task_arena dedicated
//   to that node: concurrency = the node's PUs, capped by the caller's limit
//   (tbb::global_control max_allowed_parallelism and the caller's arena).
//   When the topology is this system, a task_scheduler_observer binds every
//   thread entering the arena to the node's cpuset (hwloc_set_cpubind,
//   HWLOC_CPUBIND_THREAD) and restores the thread's previous binding when it
//   leaves, so the caller's own thread comes back unpinned. The groups of the
//   different nodes run concurrently; the call returns when all have ended.
//   Arenas are created on first use and cached for the life of the process,
//   one per (node, its cpus, pinned or not, concurrency), thread-safely.
//
// Exceptions: the first exception caught (one per group at most, groups in
// node order) is rethrown to the caller after every group has ended; the
// rest of the throwing group may be skipped, as with tbb::parallel_for, the
// other groups run to their end.
#pragma once

#include <cstdint>
#include <functional>

#include "longctx/kvstore/kv_store.h"

namespace longctx::kvstore {

// Runs body(i) exactly once for every i in [0, n_items), in parallel;
// head_of_item(i) is the kv head (0..n_kv_heads-1) item i reads. head_of_item
// is called (once per item, on the calling thread, before any body runs) only
// when placement matters or head_done is set; an out-of-range head throws
// Error(kInvalidArgument) before any body runs.
// head_done, when set, is called once for each kv head that has items, by the
// task whose body finishes the head's last item, and sees what every body of
// the head's items wrote: per-head work on their results (a merge, a top-k)
// runs while other heads' items still run, not in a pass of its own after all.
void parallel_for_heads(const KVStore& store, int64_t n_items, const std::function<int(int64_t)>& head_of_item,
                        const std::function<void(int64_t)>& body, const std::function<void(int)>& head_done = {});

// The node index whose executor arena the calling thread is working in, or -1
// when it is in none (plain tbb::parallel_for, or outside TBB). For tests and
// diagnostics.
int current_executor_node();

}  // namespace longctx::kvstore
