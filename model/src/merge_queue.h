// The queue of candidate pairs of the merge algorithms (tokenizer_spm.cpp,
// tokenizer_bpe.cpp): pops in the order (best key, then leftmost position),
// exactly like one priority queue of (key, left), but groups the pairs by key
// and consumes the best group from a sorted array. A single heap over a long
// prompt (one SPM fragment, a megabyte of spaces as one BPE word) sifts
// through hundreds of megabytes per pop; groups are read in order instead.
// Not a public header.
#pragma once

#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>
#include <vector>

namespace longctx::model::detail {

// Key: the merge priority; Better(a, b): a is merged before b. Item: has an
// `int left` (its position) and whatever the caller needs to validate it.
template <typename Key, typename Better, typename Item>
class MergeQueue {
 public:
  void push(Key key, const Item& item) {
    const bool is_current = current_.has_value() && *current_ == key;
    auto [it, inserted] = buckets_.try_emplace(key);
    Bucket& bucket = it->second;
    if (bucket.sorted) {  // being consumed: keep order through the side heap
      bucket.late.push_back(item);
      std::push_heap(bucket.late.begin(), bucket.late.end(), RightOf{});
    } else {
      bucket.items.push_back(item);
    }
    if (inserted && !is_current) keys_.push(key);
  }

  // The next item in (key, left) order; false when none is left.
  bool pop(Item& out) {
    for (;;) {
      if (!current_ || (!keys_.empty() && Better{}(keys_.top(), *current_))) {
        if (keys_.empty()) return false;
        const Key next = keys_.top();
        keys_.pop();
        if (current_) keys_.push(*current_);  // a better key appeared: come back later
        current_ = next;
        Bucket& bucket = buckets_[next];
        if (!bucket.sorted) {
          std::sort(bucket.items.begin(), bucket.items.end(),
                    [](const Item& a, const Item& b) { return a.left < b.left; });
          bucket.sorted = true;
        }
      }
      Bucket& bucket = buckets_[*current_];
      const bool have_sorted = bucket.next < bucket.items.size();
      if (!have_sorted && bucket.late.empty()) {
        buckets_.erase(*current_);
        current_.reset();
        continue;
      }
      if (!bucket.late.empty() && (!have_sorted || bucket.late.front().left < bucket.items[bucket.next].left)) {
        std::pop_heap(bucket.late.begin(), bucket.late.end(), RightOf{});
        out = bucket.late.back();
        bucket.late.pop_back();
      } else {
        out = bucket.items[bucket.next++];
      }
      return true;
    }
  }

 private:
  struct RightOf {  // heap order: the leftmost on top
    bool operator()(const Item& a, const Item& b) const { return a.left > b.left; }
  };
  struct Worse {
    bool operator()(const Key& a, const Key& b) const { return Better{}(b, a); }
  };
  struct Bucket {
    std::vector<Item> items;  // unsorted until the bucket is first consumed
    size_t next = 0;          // then items[next..] is what is left, leftmost first
    bool sorted = false;
    std::vector<Item> late;  // pushed while sorted: a heap, leftmost on top
  };
  // Every bucket is either current_ or in keys_, exactly once.
  std::unordered_map<Key, Bucket> buckets_;
  std::priority_queue<Key, std::vector<Key>, Worse> keys_;
  std::optional<Key> current_;
};

}  // namespace longctx::model::detail
