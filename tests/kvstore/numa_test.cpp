#include "longctx/kvstore/numa.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "error_message.h"
#include "longctx/core/error.h"

namespace longctx::kvstore {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

NumaPolicy nodes_policy(std::vector<int> nodes) {
  NumaPolicy policy;
  policy.kind = NumaPolicy::Kind::kNodes;
  policy.nodes = std::move(nodes);
  return policy;
}

TEST(NumaTopology, SyntheticTwoNodes) {
  const NumaTopology topology = NumaTopology::synthetic("pack:2 numa:1(memory=1GiB) core:2 pu:1");
  ASSERT_EQ(topology.node_count(), 2);
  EXPECT_FALSE(topology.is_this_system());
  EXPECT_NE(topology.hwloc_handle(), nullptr);
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(topology.node_os_index(node), node);
    EXPECT_EQ(topology.node_memory_bytes(node), kGiB);
  }
  EXPECT_EQ(topology.node_cpus(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(topology.node_cpus(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(topology.describe(), "node 0 (os 0): 1.00 GiB, cpus 0-1\nnode 1 (os 1): 1.00 GiB, cpus 2-3");
}

TEST(NumaTopology, SyntheticFourNodesPartitionThePUs) {
  const NumaTopology topology = NumaTopology::synthetic("numa:4(memory=2147483648) core:3 pu:2");
  ASSERT_EQ(topology.node_count(), 4);
  std::set<int> seen;
  for (int node = 0; node < 4; ++node) {
    const std::vector<int> cpus = topology.node_cpus(node);
    EXPECT_EQ(cpus.size(), 6u) << "node " << node;
    EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
    for (const int cpu : cpus) EXPECT_TRUE(seen.insert(cpu).second) << "cpu " << cpu << " in two nodes";
    EXPECT_EQ(topology.node_memory_bytes(node), 2 * kGiB);
  }
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 23);
  EXPECT_EQ(topology.describe(),
            "node 0 (os 0): 2.00 GiB, cpus 0-5\nnode 1 (os 1): 2.00 GiB, cpus 6-11\n"
            "node 2 (os 2): 2.00 GiB, cpus 12-17\nnode 3 (os 3): 2.00 GiB, cpus 18-23");
}

TEST(NumaTopology, SyntheticWithoutNumaLevelIsOneNodeWithEveryPU) {
  const NumaTopology topology = NumaTopology::synthetic("pack:2 core:2 pu:1");
  ASSERT_EQ(topology.node_count(), 1);
  EXPECT_EQ(topology.node_cpus(0), (std::vector<int>{0, 1, 2, 3}));
}

TEST(NumaTopology, BadSyntheticDescriptionIsInvalidArgument) {
  for (const std::string description : {"bogus:3", "", "numa:0 pu:1", "pack:2 numa:1"}) {
    try {
      NumaTopology::synthetic(description);
      ADD_FAILURE() << "accepted '" << description << "'";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("'" + description + "'"), std::string::npos) << error.what();
    }
  }
}

TEST(NumaTopology, NodeIndexOutOfRangeIsInvalidArgument) {
  const NumaTopology topology = NumaTopology::synthetic("pack:2 numa:1 core:2 pu:1");
  for (const int node : {-1, 2, 100}) {
    EXPECT_THROW(topology.node_cpus(node), Error);
    EXPECT_THROW(topology.node_os_index(node), Error);
    EXPECT_THROW(topology.node_memory_bytes(node), Error);
  }
}

TEST(NumaTopology, MovesKeepTheTopology) {
  NumaTopology a = NumaTopology::synthetic("numa:4 core:1 pu:1");
  NumaTopology b(std::move(a));
  EXPECT_EQ(b.node_count(), 4);
  NumaTopology c = NumaTopology::synthetic("pack:2 numa:1 core:1 pu:1");
  c = std::move(b);
  EXPECT_EQ(c.node_count(), 4);
  EXPECT_EQ(c.node_cpus(3), (std::vector<int>{3}));
}

TEST(NumaTopology, DetectsThisMachine) {
  const NumaTopology topology = NumaTopology::detect();
  ASSERT_GE(topology.node_count(), 1);
  EXPECT_TRUE(topology.is_this_system());
  std::set<int> all_cpus;
  std::set<int> os_indices;
  for (int node = 0; node < topology.node_count(); ++node) {
    for (const int cpu : topology.node_cpus(node)) {
      EXPECT_TRUE(all_cpus.insert(cpu).second) << "cpu " << cpu << " in two nodes";
    }
    EXPECT_TRUE(os_indices.insert(topology.node_os_index(node)).second);
  }
  EXPECT_FALSE(all_cpus.empty());
  // Every CPU this process may run on belongs to some node.
  cpu_set_t affinity;
  ASSERT_EQ(sched_getaffinity(0, sizeof affinity, &affinity), 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &affinity)) {
      EXPECT_TRUE(all_cpus.count(cpu)) << "cpu " << cpu;
    }
  }
  const std::string text = topology.describe();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), topology.node_count() - 1);
  EXPECT_EQ(text.rfind("node 0 (os ", 0), 0u) << text;
}

TEST(ResolveNumaNodes, AutoIsEveryNodeNoneIsOneNode) {
  const NumaTopology four = NumaTopology::synthetic("numa:4 core:1 pu:1");
  NumaPolicy policy;
  policy.kind = NumaPolicy::Kind::kAuto;
  EXPECT_EQ(resolve_numa_nodes(policy, four), (std::vector<int>{0, 1, 2, 3}));
  policy.kind = NumaPolicy::Kind::kNone;
  EXPECT_EQ(resolve_numa_nodes(policy, four), (std::vector<int>{0}));
  const NumaTopology one = NumaTopology::synthetic("core:2 pu:1");
  policy.kind = NumaPolicy::Kind::kAuto;
  EXPECT_EQ(resolve_numa_nodes(policy, one), (std::vector<int>{0}));
}

TEST(ResolveNumaNodes, ListedNodesKeepTheirOrder) {
  const NumaTopology four = NumaTopology::synthetic("numa:4 core:1 pu:1");
  EXPECT_EQ(resolve_numa_nodes(nodes_policy({3, 1}), four), (std::vector<int>{3, 1}));
  EXPECT_EQ(resolve_numa_nodes(nodes_policy({0}), four), (std::vector<int>{0}));
}

TEST(ResolveNumaNodes, BadListsAreConfigErrorsNamingTheKey) {
  const NumaTopology two = NumaTopology::synthetic("pack:2 numa:1 core:2 pu:1");
  EXPECT_EQ(error_message([&] { resolve_numa_nodes(nodes_policy({0, 3}), two); }, ErrorCode::kConfig),
            "key 'numa': node 3 does not exist (this machine has 2 NUMA nodes)");
  EXPECT_EQ(error_message([&] { resolve_numa_nodes(nodes_policy({-1}), two); }, ErrorCode::kConfig),
            "key 'numa': node -1 does not exist (this machine has 2 NUMA nodes)");
  EXPECT_EQ(error_message([&] { resolve_numa_nodes(nodes_policy({1, 1}), two); }, ErrorCode::kConfig),
            "key 'numa': node 1 is listed twice");
  EXPECT_NE(error_message([&] { resolve_numa_nodes(nodes_policy({}), two); }, ErrorCode::kConfig).find("key 'numa'"),
            std::string::npos);
  const NumaTopology one = NumaTopology::synthetic("core:2 pu:1");
  EXPECT_EQ(error_message([&] { resolve_numa_nodes(nodes_policy({1}), one); }, ErrorCode::kConfig),
            "key 'numa': node 1 does not exist (this machine has 1 NUMA node)");
  try {
    resolve_numa_nodes(nodes_policy({2}), two);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kConfig);
  }
}

// The header's contract: contiguous groups of (almost) equal size, one group
// per node, in order, i.e. group sizes differ by at most one and every head
// of group j comes before every head of group j + 1.
TEST(PlaceKvHeads, BalancedContiguousGroupsInNodeOrder) {
  for (int heads = 1; heads <= 48; ++heads) {
    for (int n_nodes = 1; n_nodes <= 12; ++n_nodes) {
      std::vector<int> nodes;
      for (int j = 0; j < n_nodes; ++j) nodes.push_back((j * 7 + 3) % 13);  // distinct, unordered ids
      const std::vector<int> placed = place_kv_heads(heads, nodes);
      ASSERT_EQ(placed.size(), size_t(heads));
      std::vector<int> group_of_head;
      for (const int node : placed) {
        const auto it = std::find(nodes.begin(), nodes.end(), node);
        ASSERT_NE(it, nodes.end());
        group_of_head.push_back(int(it - nodes.begin()));
      }
      EXPECT_TRUE(std::is_sorted(group_of_head.begin(), group_of_head.end()))
          << heads << " heads on " << n_nodes << " nodes";
      EXPECT_EQ(group_of_head.front(), 0);
      std::vector<int> group_size(size_t(n_nodes), 0);
      for (const int group : group_of_head) ++group_size[size_t(group)];
      for (int j = 0; j < n_nodes; ++j) {
        EXPECT_GE(group_size[size_t(j)], heads / n_nodes) << heads << " heads, " << n_nodes << " nodes";
        EXPECT_LE(group_size[size_t(j)], (heads + n_nodes - 1) / n_nodes);
      }
      // And the exact formula of the header.
      for (int h = 0; h < heads; ++h) {
        EXPECT_EQ(placed[size_t(h)], nodes[size_t(int64_t(h) * n_nodes / heads)]);
      }
    }
  }
}

TEST(PlaceKvHeads, MoreNodesThanHeadsUsesSpreadOutNodes) {
  EXPECT_EQ(place_kv_heads(2, {0, 1, 2, 3}), (std::vector<int>{0, 2}));
  EXPECT_EQ(place_kv_heads(1, {5, 6}), (std::vector<int>{5}));
  EXPECT_EQ(place_kv_heads(8, {0, 1}), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(PlaceKvHeads, EdgeCases) {
  EXPECT_TRUE(place_kv_heads(0, {0}).empty());
  EXPECT_THROW(place_kv_heads(4, {}), Error);
  EXPECT_THROW(place_kv_heads(-1, {0}), Error);
}

}  // namespace
}  // namespace longctx::kvstore
