#include "longctx/kvstore/numa.h"

#include <hwloc.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "longctx/core/error.h"

namespace longctx::kvstore {

struct NumaTopology::Impl {
  hwloc_topology_t topology = nullptr;
  ~Impl() {
    if (topology != nullptr) hwloc_topology_destroy(topology);
  }
};

namespace {

// hwloc 2 always inserts at least one NUMA node; if it ever reports none, the
// whole machine counts as one node (node 0) and this returns null.
hwloc_obj_t numa_obj(hwloc_topology_t topology, int node) {
  return hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(node));
}

// "0-3,8,10-11"
std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t end = i + 1;
    while (end < cpus.size() && cpus[end] == cpus[end - 1] + 1) ++end;
    if (!text.empty()) text += ",";
    text += std::to_string(cpus[i]);
    if (end - i > 1) text += str_cat("-", cpus[end - 1]);
    i = end;
  }
  return text.empty() ? "none" : text;
}

}  // namespace

NumaTopology::NumaTopology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NumaTopology::NumaTopology(NumaTopology&&) noexcept = default;
NumaTopology& NumaTopology::operator=(NumaTopology&&) noexcept = default;
NumaTopology::~NumaTopology() = default;

NumaTopology NumaTopology::detect() {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0) {
    impl->topology = nullptr;
    fail(ErrorCode::kInternal, "hwloc_topology_init failed: ", std::strerror(errno));
  }
  if (hwloc_topology_load(impl->topology) != 0) {
    fail(ErrorCode::kInternal, "hwloc could not load this machine's topology: ", std::strerror(errno));
  }
  return NumaTopology(std::move(impl));
}

NumaTopology NumaTopology::synthetic(const std::string& description) {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0) {
    impl->topology = nullptr;
    fail(ErrorCode::kInternal, "hwloc_topology_init failed: ", std::strerror(errno));
  }
  // hwloc explains a rejected string on stderr only when HWLOC_SYNTHETIC_VERBOSE=1.
  if (hwloc_topology_set_synthetic(impl->topology, description.c_str()) != 0) {
    fail(ErrorCode::kInvalidArgument, "hwloc rejected the synthetic topology '", description,
         "' (", std::strerror(errno), "; set HWLOC_SYNTHETIC_VERBOSE=1 to see why); "
         "example of a valid one: 'pack:2 numa:1 core:2 pu:1'");
  }
  if (hwloc_topology_load(impl->topology) != 0) {
    fail(ErrorCode::kInvalidArgument, "hwloc could not build the synthetic topology '", description,
         "': ", std::strerror(errno));
  }
  return NumaTopology(std::move(impl));
}

int NumaTopology::node_count() const {
  const int count = hwloc_get_nbobjs_by_type(impl_->topology, HWLOC_OBJ_NUMANODE);
  return count > 0 ? count : 1;
}

int NumaTopology::node_os_index(int node) const {
  if (node < 0 || node >= node_count()) {
    fail(ErrorCode::kInvalidArgument, "NUMA node ", node, " does not exist (", node_count(), " nodes)");
  }
  const hwloc_obj_t obj = numa_obj(impl_->topology, node);
  return obj != nullptr ? static_cast<int>(obj->os_index) : 0;
}

uint64_t NumaTopology::node_memory_bytes(int node) const {
  if (node < 0 || node >= node_count()) {
    fail(ErrorCode::kInvalidArgument, "NUMA node ", node, " does not exist (", node_count(), " nodes)");
  }
  const hwloc_obj_t obj = numa_obj(impl_->topology, node);
  if (obj != nullptr) return obj->attr->numanode.local_memory;
  return hwloc_get_root_obj(impl_->topology)->total_memory;
}

std::vector<int> NumaTopology::node_cpus(int node) const {
  if (node < 0 || node >= node_count()) {
    fail(ErrorCode::kInvalidArgument, "NUMA node ", node, " does not exist (", node_count(), " nodes)");
  }
  const hwloc_obj_t obj = numa_obj(impl_->topology, node);
  // Bits of an hwloc cpuset are the OS indices of the PUs.
  const hwloc_const_cpuset_t cpuset =
      obj != nullptr ? obj->cpuset : hwloc_get_root_obj(impl_->topology)->cpuset;
  std::vector<int> cpus;
  for (int cpu = hwloc_bitmap_first(cpuset); cpu != -1; cpu = hwloc_bitmap_next(cpuset, cpu)) {
    cpus.push_back(cpu);
  }
  return cpus;
}

bool NumaTopology::is_this_system() const {
  return hwloc_topology_is_thissystem(impl_->topology) != 0;
}

std::string NumaTopology::describe() const {
  std::string text;
  for (int node = 0; node < node_count(); ++node) {
    const uint64_t memory = node_memory_bytes(node);
    if (node > 0) text += "\n";
    text += str_cat("node ", node, " (os ", node_os_index(node), "): ",
                    memory != 0 ? format_bytes(memory) : std::string("memory unknown"),
                    ", cpus ", cpu_ranges(node_cpus(node)));
  }
  return text;
}

void* NumaTopology::hwloc_handle() const { return impl_->topology; }

std::vector<int> resolve_numa_nodes(const NumaPolicy& policy, const NumaTopology& topology) {
  const int count = topology.node_count();
  switch (policy.kind) {
    case NumaPolicy::Kind::kAuto: {
      std::vector<int> nodes(static_cast<size_t>(count));
      for (int node = 0; node < count; ++node) nodes[static_cast<size_t>(node)] = node;
      return nodes;
    }
    case NumaPolicy::Kind::kNone:
      return {0};
    case NumaPolicy::Kind::kNodes: {
      if (policy.nodes.empty()) {
        fail(ErrorCode::kConfig, "key 'numa': the list of nodes is empty (use 'auto', 'none' or "
                                 "node indices such as [0, 1])");
      }
      std::vector<bool> seen(static_cast<size_t>(count), false);
      for (const int node : policy.nodes) {
        if (node < 0 || node >= count) {
          fail(ErrorCode::kConfig, "key 'numa': node ", node, " does not exist (this machine has ",
               count, count == 1 ? " NUMA node)" : " NUMA nodes)");
        }
        if (seen[static_cast<size_t>(node)]) {
          fail(ErrorCode::kConfig, "key 'numa': node ", node, " is listed twice");
        }
        seen[static_cast<size_t>(node)] = true;
      }
      return policy.nodes;
    }
  }
  fail(ErrorCode::kInternal, "resolve_numa_nodes: unknown NUMA policy kind");
}

std::vector<int> place_kv_heads(int n_kv_heads, const std::vector<int>& nodes) {
  if (n_kv_heads < 0) fail(ErrorCode::kInvalidArgument, "place_kv_heads: n_kv_heads is ", n_kv_heads);
  if (nodes.empty()) fail(ErrorCode::kInvalidArgument, "place_kv_heads: no NUMA node to place ",
                          n_kv_heads, " kv heads on");
  std::vector<int> head_nodes(static_cast<size_t>(n_kv_heads));
  for (int head = 0; head < n_kv_heads; ++head) {
    const size_t group = static_cast<size_t>(head) * nodes.size() / static_cast<size_t>(n_kv_heads);
    head_nodes[static_cast<size_t>(head)] = nodes[group];
  }
  return head_nodes;
}

}  // namespace longctx::kvstore
