// Fixtures of the cpu/ and policy/ tests.
//
// Stores built by hand: this machine's NUMA topology, a two-layer store with
// its memory budget, appends of f32 K/V, random values, the rounding a store
// applies; spans of a token set; Highway target forcing; the checks of an
// Error(kInvalidArgument).
//
// The test stores of the scoring and selection tests (StoreCase, TestStore): a
// KV store whose layer 1 holds random keys (with a few tokens of large norm),
// filled by appends of random sizes, and for DYNAMIC the importances it was
// given, accumulated the way kv_store.h defines them (fp32, in call order).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "error_message.h"
#include "hwy_target.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"

namespace longctx::cpu::testing {

// ---- stores built by hand ----------------------------------------------------------

// The NUMA topology of this machine, detected once.
inline const kvstore::NumaTopology& topology() {
  static const kvstore::NumaTopology detected = kvstore::NumaTopology::detect();
  return detected;
}

// The config of a store that the kernels read directly: no initial tokens,
// no local window, no selection, one MAX representative per block.
inline LongContextConfig kernel_store_config(DType kv_type, int block_size, int64_t max_seq_len) {
  LongContextConfig config;
  config.max_seq_len = max_seq_len;
  config.block_size = block_size;
  config.kv_type = kv_type;
  config.initial_len = 0;
  config.local_windows_len = 0;
  config.second_select_num = 0;
  config.representative_type = RepresentativeType::kMax;
  config.representative_num = 1;
  return config;
}

// A KV store and the memory budget it draws from.
struct BudgetedStore {
  kvstore::MemoryBudget budget{uint64_t{1} << 30};
  std::unique_ptr<kvstore::KVStore> store;
};

// A two-layer store with no initial tokens, local window or selection; the
// tested layer is 1, layer 0 holds other tokens so that reading the wrong
// layer shows.
inline std::unique_ptr<BudgetedStore> make_store(DType kv_type, int block_size, int n_kv_heads, int head_dim,
                                                 int64_t capacity) {
  LongContextConfig config;
  config.initial_len = 0;
  config.local_windows_len = 0;
  config.second_select_num = 0;
  config.max_seq_len = capacity;
  config.block_size = block_size;
  config.kv_type = kv_type;
  auto t = std::make_unique<BudgetedStore>();
  t->store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{2, n_kv_heads, head_dim}, config, t->budget,
                                                topology());
  return t;
}

// Appends `count` tokens of k and v [count][n_kv_heads][head_dim] to `layer`.
inline void append(kvstore::KVStore& store, int layer, const float* k, const float* v, int64_t count) {
  const kvstore::KVShape& s = store.layout().shape;
  store.append(layer, make_view(k, DType::kF32, {count, s.n_kv_heads, s.head_dim}),
               make_view(v, DType::kF32, {count, s.n_kv_heads, s.head_dim}));
}
inline void append(kvstore::KVStore& store, int layer, const std::vector<float>& k, const std::vector<float>& v,
                   int64_t count) {
  append(store, layer, k.data(), v.data(), count);
}

// `count` draws of a standard normal.
inline std::vector<float> normal_values(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& x : values) x = normal(rng);
  return values;
}

// x as a store of `dtype` keeps it.
inline float round_to(DType dtype, float x) {
  std::byte buffer[4];
  store_from_f32(buffer, dtype, 0, x);
  return load_as_f32(buffer, dtype, 0);
}

// Sorted, merged, non-empty spans of a token set.
inline std::vector<TokenSpan> spans_of(const std::vector<bool>& in) {
  std::vector<TokenSpan> spans;
  for (int64_t t = 0; t < int64_t(in.size()); ++t) {
    if (!in[size_t(t)]) continue;
    if (!spans.empty() && spans.back().end == t) ++spans.back().end;
    else spans.push_back({t, t + 1});
  }
  return spans;
}

// Tokens a head attends, one flag per token: initial, the context tokens of
// chosen blocks and of every block not wholly inside the context range (the
// sinks or the window reach into it, or it is the partial last block), the
// local window.
inline std::vector<bool> reference_mask(const kvstore::Partition& p, int block_size, const std::vector<int64_t>& chosen,
                                        bool include_local) {
  std::vector<bool> mask(size_t(p.n_tokens), false);
  const auto in_context = [&p](int64_t t) { return t >= p.initial_end && t < p.local_begin; };
  for (int64_t t = 0; t < p.initial_end; ++t) mask[size_t(t)] = true;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t b = t / block_size;
    const bool whole = b * block_size >= p.initial_end && (b + 1) * block_size <= p.local_begin;
    const bool is_chosen = std::find(chosen.begin(), chosen.end(), b) != chosen.end();
    if (in_context(t) && (!whole || is_chosen)) mask[size_t(t)] = true;
  }
  if (include_local)
    for (int64_t t = p.local_begin; t < p.n_tokens; ++t) mask[size_t(t)] = true;
  return mask;
}

// ---- Highway targets ------------------------------------------------------------------

using longctx::testing::ForcedHighwayTarget;

// ---- errors ---------------------------------------------------------------------------

// Runs f, expects Error(kInvalidArgument) whose message contains every fragment.
template <typename F>
void expect_invalid(F&& f, const std::vector<std::string>& fragments) {
  expect_error(f, ErrorCode::kInvalidArgument, fragments);
}

// Runs call, expects Error(kInvalidArgument); `what` names the case.
template <typename F>
void expect_invalid_argument(F&& call, const char* what) {
  SCOPED_TRACE(what);
  error_message(call);
}

// ---- stores of the scoring and selection tests ----------------------------------------

struct StoreCase {
  RepresentativeType type = RepresentativeType::kQuest;
  DType kv_type = DType::kF16;
  int n_kv_heads = 2;
  int head_dim = 64;
  int block_size = 16;
  int rep_num = 2;  // FIX/DYNAMIC
  int initial_len = 0;
  int local_windows_len = 0;
  int64_t n_tokens = 1;

  std::string describe() const {
    return str_cat(representative_type_name(type), " ", dtype_name(kv_type), " kv_heads=", n_kv_heads,
                   " head_dim=", head_dim, " block=", block_size, " R=", rep_num, " initial=", initial_len,
                   " local=", local_windows_len, " tokens=", n_tokens);
  }
};

class TestStore {
 public:
  static constexpr int kLayer = 1;  // layer 0 holds a few other tokens

  TestStore(const StoreCase& c, std::mt19937& rng)
      : case_(c), budget_(uint64_t{1} << 30), topology_(kvstore::NumaTopology::detect()) {
    LongContextConfig config;
    config.block_size = c.block_size;
    config.initial_len = c.initial_len;
    config.local_windows_len = c.local_windows_len;
    config.representative_type = c.type;
    config.representative_num = c.rep_num;
    config.kv_type = c.kv_type;
    config.max_seq_len = std::max<int64_t>(c.n_tokens, 8);
    store_ = std::make_unique<kvstore::KVStore>(kvstore::KVShape{2, c.n_kv_heads, c.head_dim}, config, budget_,
                                                topology_);
    importance_.assign(size_t(c.n_tokens) * size_t(c.n_kv_heads), 0.f);
    append(0, std::min<int64_t>(c.n_tokens, 5), rng, false);

    std::uniform_int_distribution<int64_t> chunk(1, std::max<int64_t>(1, c.n_tokens / 3));
    for (int64_t t = 0; t < c.n_tokens;) {
      const int64_t n = std::min(c.n_tokens - t, chunk(rng));
      append(kLayer, n, rng, c.type == RepresentativeType::kDynamic && rng() % 2 == 0, t);
      t += n;
    }
    if (c.type == RepresentativeType::kDynamic && c.n_tokens > 0) {
      std::uniform_int_distribution<int64_t> pick(0, c.n_tokens - 1);
      int64_t first = pick(rng), last = pick(rng);
      if (first > last) std::swap(first, last);
      const std::vector<float> extra = random_importance(last + 1 - first, rng);
      store_->add_importance(kLayer, first, make_view(extra.data(), DType::kF32, {last + 1 - first, c.n_kv_heads}));
      for (int64_t i = 0; i < (last + 1 - first) * c.n_kv_heads; ++i) importance_[size_t(first * c.n_kv_heads + i)] += extra[size_t(i)];
    }
  }

  const kvstore::KVStore& store() const { return *store_; }
  const StoreCase& config() const { return case_; }

  // Importance of the tokens of a block (DYNAMIC), [n_filled].
  std::vector<float> block_importance(int kv_head, int64_t block) const {
    std::vector<float> out;
    const int64_t begin = block * case_.block_size;
    const int64_t end = std::min<int64_t>(case_.n_tokens, begin + case_.block_size);
    for (int64_t t = begin; t < end; ++t) out.push_back(importance_[size_t(t * case_.n_kv_heads + kv_head)]);
    return out;
  }

 private:
  // Small integers, so that many tokens tie.
  std::vector<float> random_importance(int64_t n, std::mt19937& rng) const {
    std::uniform_int_distribution<int> value(0, 4);
    std::vector<float> out(size_t(n) * size_t(case_.n_kv_heads));
    for (float& x : out) x = float(value(rng));
    return out;
  }

  void append(int layer, int64_t n, std::mt19937& rng, bool with_importance, int64_t first_token = 0) {
    if (n == 0) return;
    const size_t row = size_t(case_.n_kv_heads) * size_t(case_.head_dim);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> k(size_t(n) * row), v(size_t(n) * row);
    for (int64_t t = 0; t < n; ++t) {
      const float scale = rng() % 16 == 0 ? 40.f : 1.f;  // some keys of large norm
      for (size_t i = 0; i < row; ++i) k[size_t(t) * row + i] = scale * normal(rng) + 0.25f * float(i % 5);
    }
    for (float& x : v) x = normal(rng);
    const TensorView kv_k = make_view(k.data(), DType::kF32, {n, case_.n_kv_heads, case_.head_dim});
    const TensorView kv_v = make_view(v.data(), DType::kF32, {n, case_.n_kv_heads, case_.head_dim});
    if (!with_importance) {
      store_->append(layer, kv_k, kv_v);
      return;
    }
    const std::vector<float> imp = random_importance(n, rng);
    store_->append(layer, kv_k, kv_v, make_view(imp.data(), DType::kF32, {n, case_.n_kv_heads}));
    for (size_t i = 0; i < imp.size(); ++i) importance_[size_t(first_token * case_.n_kv_heads) + i] += imp[i];
  }

  StoreCase case_;
  kvstore::MemoryBudget budget_;
  kvstore::NumaTopology topology_;
  std::unique_ptr<kvstore::KVStore> store_;
  std::vector<float> importance_;  // [n_tokens][n_kv_heads] of layer kLayer
};

}  // namespace longctx::cpu::testing
