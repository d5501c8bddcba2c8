// MergeQueue (model/src/merge_queue.h, internal to the tokenizers) against a
// std::multiset of (key, left): random pushes interleaved with pops, with
// keys better, equal and worse than the one being consumed.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <utility>

#include "../../model/src/merge_queue.h"
#include "test_seed.h"

namespace longctx::model::detail {
namespace {

struct Item {
  int left = 0;
  int key = 0;
};
struct Lower {
  bool operator()(int a, int b) const { return a < b; }
};
struct Higher {
  bool operator()(float a, float b) const { return a > b; }
};

TEST(MergeQueue, PopsBestKeyThenLeftmost) {
  std::mt19937 rng(test_seed(11));
  for (int trial = 0; trial < 200; ++trial) {
    MergeQueue<int, Lower, Item> queue;
    std::multiset<std::pair<int, int>> reference;  // (key, left), smallest first
    const int n_keys = 1 + int(rng() % 8);
    for (int step = 0; step < 400; ++step) {
      if (rng() % 3 != 0) {
        const Item item{int(rng() % 50), int(rng() % n_keys)};
        queue.push(item.key, item);
        reference.insert({item.key, item.left});
      } else {
        Item item;
        const bool got = queue.pop(item);
        ASSERT_EQ(got, !reference.empty());
        if (!got) continue;
        ASSERT_EQ(std::make_pair(item.key, item.left), *reference.begin()) << "trial " << trial << " step " << step;
        reference.erase(reference.begin());
      }
    }
    for (Item item; queue.pop(item);) {
      ASSERT_FALSE(reference.empty());
      ASSERT_EQ(std::make_pair(item.key, item.left), *reference.begin());
      reference.erase(reference.begin());
    }
    EXPECT_TRUE(reference.empty());
  }
}

TEST(MergeQueue, HighestFloatKeyFirst) {
  MergeQueue<float, Higher, Item> queue;
  queue.push(-2.f, {5, 0});
  queue.push(-1.f, {9, 1});
  queue.push(-1.f, {3, 2});
  queue.push(-0.f, {7, 3});
  queue.push(0.f, {6, 4});  // -0 and +0 are one key
  Item item;
  std::vector<int> order;
  while (queue.pop(item)) order.push_back(item.key);
  EXPECT_EQ(order, (std::vector<int>{4, 3, 2, 1, 0}));
}

}  // namespace
}  // namespace longctx::model::detail
