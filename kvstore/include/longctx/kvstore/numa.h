// NUMA topology (hwloc) and the placement of kv heads on nodes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/config.h"

namespace longctx::kvstore {

// A loaded hwloc topology: the real machine, or a synthetic one for tests.
class NumaTopology {
 public:
  // The machine we run on. Throws Error(kInternal) only if hwloc itself fails.
  static NumaTopology detect();
  // An hwloc synthetic description, e.g. "pack:2 numa:1 core:2 pu:1" (2 nodes).
  // Memory cannot be bound on a synthetic topology (is_this_system() is false).
  static NumaTopology synthetic(const std::string& description);

  NumaTopology(NumaTopology&&) noexcept;
  NumaTopology& operator=(NumaTopology&&) noexcept;
  ~NumaTopology();

  int node_count() const;                      // >= 1
  int node_os_index(int node) const;           // the OS's number of node `node`
  uint64_t node_memory_bytes(int node) const;  // 0 when unknown
  std::vector<int> node_cpus(int node) const;  // OS indices of the PUs of the node
  bool is_this_system() const;                 // memory binding can take effect
  std::string describe() const;                // one line per node

  // hwloc_topology_t, for the block pool (kept opaque to avoid hwloc.h here).
  void* hwloc_handle() const;

 private:
  struct Impl;
  explicit NumaTopology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The node indices (0..node_count-1) the policy allows; throws Error(kConfig)
// naming key 'numa' when a listed node does not exist (or is listed twice, or
// the list is empty). kAuto: every node. kNodes: the listed nodes, in order.
// kNone: {0}, i.e. one pool, which must not bind its memory (the OS places it):
// build it with BlockPool(..., /*bind_memory=*/policy.kind != NumaPolicy::Kind::kNone).
std::vector<int> resolve_numa_nodes(const NumaPolicy& policy, const NumaTopology& topology);

// Node of each kv head: heads split into contiguous groups of (almost) equal
// size, one group per node, in order. kv head h -> nodes[h * nodes.size() / n_kv_heads].
std::vector<int> place_kv_heads(int n_kv_heads, const std::vector<int>& nodes);

}  // namespace longctx::kvstore
