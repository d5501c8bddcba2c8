// H2O (policy/h2o.h) against an fp64 reference of the same procedure, written
// here from the definition: accumulated probabilities, heavy hitters + recent
// window, permanent eviction (lowest acc first, older first on ties).
#include "longctx/policy/h2o.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "cpu/store_fixture.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "test_seed.h"

namespace longctx::policy {
namespace {

using namespace cpu;  // Selection, TokenSpan and the kernels the policies build on
using cpu::testing::kernel_store_config;
using cpu::testing::round_to;
using cpu::testing::topology;

const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

struct Case {
  DType kv_type = DType::kF16;
  int block_size = 4;
  int head_dim = 16;
  int n_kv_heads = 2;
  int g = 2;
  int64_t n_prompt = 20;
  int64_t window = 4;
  int steps = 6;
  int64_t budget = 10;
  int64_t n_recent = 3;
};

// One-layer store plus the keys as stored, for the reference: keys[h][t][c].
class Fixture {
 public:
  explicit Fixture(const Case& c) : c_(c), budget_(uint64_t{1} << 28) {
    const LongContextConfig config = kernel_store_config(c.kv_type, c.block_size, c.n_prompt + c.steps + 1);
    store_ = std::make_unique<kvstore::KVStore>(kvstore::KVShape{1, c.n_kv_heads, c.head_dim}, config, budget_,
                                                topology());
    keys_.resize(size_t(c.n_kv_heads));
  }

  // Appends n tokens with keys from `make_key(h, c)`.
  template <typename MakeKey>
  void append(int64_t n, MakeKey make_key, std::mt19937& rng) {
    std::normal_distribution<float> normal;
    const int row = c_.n_kv_heads * c_.head_dim;
    std::vector<float> k(size_t(n * row)), v(size_t(n * row));
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        std::vector<double> stored;
        for (int ch = 0; ch < c_.head_dim; ++ch) {
          const size_t i = size_t(t * row + h * c_.head_dim + ch);
          k[i] = make_key(h, ch);
          v[i] = normal(rng);
          stored.push_back(round_to(c_.kv_type, k[i]));
        }
        keys_[size_t(h)].push_back(stored);
      }
    store_->append(0, make_view(k.data(), DType::kF32, {n, c_.n_kv_heads, c_.head_dim}),
                   make_view(v.data(), DType::kF32, {n, c_.n_kv_heads, c_.head_dim}));
  }

  const kvstore::KVStore& store() const { return *store_; }
  const std::vector<std::vector<double>>& keys(int h) const { return keys_[size_t(h)]; }

 private:
  Case c_;
  kvstore::MemoryBudget budget_;
  std::unique_ptr<kvstore::KVStore> store_;
  std::vector<std::vector<std::vector<double>>> keys_;
};

// fp64 reference of H2O for one kv head, with an error bound per kept token
// (how far the fp32 implementation's acc may be from this one).
struct RefHead {
  std::vector<int64_t> kept;
  std::vector<double> acc, bound;
  bool ambiguous = false;  // an eviction decided by less than the bounds: stop comparing
};

// Adds softmax(q.k * scale) over the first `visible` kept tokens, for each of
// the g query rows, to acc; bound grows by what fp32 may differ: scores
// err <= (d + 2) u sum|q_c k_c| scale, so each probability is off by at most
// p * (2 * max score error + (visible + 8) u).
void ref_add(RefHead& head, const std::vector<std::vector<double>>& keys, const std::vector<std::vector<float>>& q,
             int64_t visible, double scale) {
  const size_t d = q.at(0).size();
  for (const auto& qr : q) {
    std::vector<double> score(static_cast<size_t>(visible));
    double max_score = -std::numeric_limits<double>::infinity(), max_err = 0;
    for (int64_t j = 0; j < visible; ++j) {
      double dot = 0, mag = 0;
      for (size_t c = 0; c < d; ++c) {
        dot += double(qr[c]) * keys[size_t(head.kept[size_t(j)])][c];
        mag += std::abs(double(qr[c]) * keys[size_t(head.kept[size_t(j)])][c]);
      }
      score[size_t(j)] = dot * scale;
      max_score = std::max(max_score, score[size_t(j)]);
      max_err = std::max(max_err, double(d + 2) * kU * mag * scale);
    }
    double sum = 0;
    for (int64_t j = 0; j < visible; ++j) sum += std::exp(score[size_t(j)] - max_score);
    for (int64_t j = 0; j < visible; ++j) {
      const double p = std::exp(score[size_t(j)] - max_score) / sum;
      head.acc[size_t(j)] += p;
      head.bound[size_t(j)] += p * (4 * max_err + double(visible + 8) * kU) + 1e-300;
    }
  }
}

void ref_evict(RefHead& head, int64_t n, int64_t budget, int64_t n_recent) {
  while (int64_t(head.kept.size()) > budget) {
    // The candidate with the lowest acc, older first on ties; and the runner-up.
    size_t worst = head.kept.size(), second = head.kept.size();
    for (size_t j = 0; j < head.kept.size(); ++j) {
      if (head.kept[j] >= n - n_recent) continue;
      if (worst == head.kept.size() || head.acc[j] < head.acc[worst]) {
        second = worst;
        worst = j;
      } else if (second == head.kept.size() || head.acc[j] < head.acc[second]) {
        second = j;
      }
    }
    if (worst == head.kept.size()) return;  // only recent tokens left
    if (second != head.kept.size() &&
        head.acc[second] - head.acc[worst] <= head.bound[second] + head.bound[worst]) {
      head.ambiguous = true;
    }
    head.kept.erase(head.kept.begin() + ptrdiff_t(worst));
    head.acc.erase(head.acc.begin() + ptrdiff_t(worst));
    head.bound.erase(head.bound.begin() + ptrdiff_t(worst));
  }
}

std::vector<float> random_vector(std::mt19937& rng, size_t n, float sigma) {
  std::normal_distribution<float> normal(0.f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Runs prefill init + steps on the implementation and the reference, comparing
// kept sets, acc (within the bounds), and the attention output (bit for bit
// with decode_attention over the reference's kept set). Returns false when an
// eviction was too close to call and the comparison stopped early.
bool run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(test_seed(seed));
  Fixture fx(c);
  const float key_sigma = 1.5f;
  fx.append(c.n_prompt, [&](int, int) { return std::normal_distribution<float>(0.f, key_sigma)(rng); }, rng);
  const int n_q = c.g * c.n_kv_heads;
  const double scale = 1.0 / std::sqrt(double(c.head_dim));
  const std::vector<float> window = random_vector(rng, size_t(c.window * n_q * c.head_dim), 1.5f);

  H2OState state(c.n_kv_heads, {c.budget, c.n_recent, 0.f});
  state.init_from_prefill(fx.store(), 0, make_view(window.data(), DType::kF32, {c.window, n_q, c.head_dim}));

  std::vector<RefHead> ref(size_t(c.n_kv_heads));
  for (int h = 0; h < c.n_kv_heads; ++h) {
    RefHead& head = ref[size_t(h)];
    for (int64_t t = 0; t < c.n_prompt; ++t) head.kept.push_back(t);
    head.acc.assign(size_t(c.n_prompt), 0.0);
    head.bound.assign(size_t(c.n_prompt), 0.0);
    for (int64_t i = 0; i < c.window; ++i) {
      std::vector<std::vector<float>> rows;
      for (int k = 0; k < c.g; ++k) {
        const float* row = window.data() + (i * n_q + h * c.g + k) * c.head_dim;
        rows.emplace_back(row, row + c.head_dim);
      }
      ref_add(head, fx.keys(h), rows, c.n_prompt - c.window + i + 1, scale);
    }
    ref_evict(head, c.n_prompt, c.budget, c.n_recent);
  }

  std::set<std::pair<int, int64_t>> evicted;
  for (int step = 0; step <= c.steps; ++step) {
    const int64_t n = fx.store().n_tokens(0);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const RefHead& head = ref[size_t(h)];
      SCOPED_TRACE(::testing::Message() << "head " << h << " step " << step);
      EXPECT_EQ(state.kept(h), head.kept);
      EXPECT_EQ(int64_t(state.kept(h).size()), std::min(n, c.budget));  // budget respected, and filled
      for (int64_t t = std::max<int64_t>(0, n - c.n_recent); t < n; ++t) {
        EXPECT_TRUE(std::binary_search(state.kept(h).begin(), state.kept(h).end(), t)) << "recent token " << t;
      }
      for (int64_t t = 0; t < n; ++t) {
        const bool kept = std::binary_search(state.kept(h).begin(), state.kept(h).end(), t);
        if (!kept) evicted.insert({h, t});
        EXPECT_FALSE(kept && evicted.contains({h, t})) << "token " << t << " came back";  // permanent
      }
      if (state.kept(h) != head.kept) return true;
      for (size_t j = 0; j < head.kept.size(); ++j) {
        EXPECT_NEAR(state.accumulated(h)[j], head.acc[j], head.bound[j]) << "token " << head.kept[j];
      }
    }
    if (::testing::Test::HasFailure()) return true;
    for (const RefHead& head : ref) {
      if (head.ambiguous) return false;
    }
    if (step == c.steps) break;

    // Decode step: a new token, a query; attention over the kept set.
    fx.append(1, [&](int, int) { return std::normal_distribution<float>(0.f, key_sigma)(rng); }, rng);
    const int64_t n_new = fx.store().n_tokens(0);
    const std::vector<float> q = random_vector(rng, size_t(n_q * c.head_dim), 1.5f);
    std::vector<float> out(q.size()), lse(static_cast<size_t>(n_q)), want_out(q.size()), want_lse(static_cast<size_t>(n_q));
    Selection want_selection;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      RefHead& head = ref[size_t(h)];
      head.kept.push_back(n_new - 1);
      head.acc.push_back(0.0);
      head.bound.push_back(0.0);
      std::vector<TokenSpan> spans;
      for (const int64_t p : head.kept) {
        if (!spans.empty() && spans.back().end == p) ++spans.back().end;
        else spans.push_back({p, p + 1});
      }
      want_selection.spans.push_back(spans);
    }
    const TensorView qv = make_view(q.data(), DType::kF32, {n_q, c.head_dim});
    decode_attention(fx.store(), 0, qv, want_selection, {}, make_mutable_view(want_out.data(), DType::kF32, {n_q, c.head_dim}),
                     make_mutable_view(want_lse.data(), DType::kF32, {n_q}));
    state.step(fx.store(), 0, qv, make_mutable_view(out.data(), DType::kF32, {n_q, c.head_dim}),
               make_mutable_view(lse.data(), DType::kF32, {n_q}));
    EXPECT_EQ(std::memcmp(out.data(), want_out.data(), out.size() * sizeof(float)), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(lse.data(), want_lse.data(), lse.size() * sizeof(float)), 0) << "step " << step;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      RefHead& head = ref[size_t(h)];
      std::vector<std::vector<float>> rows;
      for (int k = 0; k < c.g; ++k) {
        const float* row = q.data() + (h * c.g + k) * c.head_dim;
        rows.emplace_back(row, row + c.head_dim);
      }
      ref_add(head, fx.keys(h), rows, int64_t(head.kept.size()), scale);
      ref_evict(head, n_new, c.budget, c.n_recent);
    }
  }
  return true;
}

TEST(PolicyH2O, MatchesTheFp64ReferenceOnRandomStores) {
  std::mt19937 rng(test_seed(7));
  int decided = 0;
  const int kCases = 120;
  for (int i = 0; i < kCases; ++i) {
    Case c;
    c.kv_type = std::array{DType::kF32, DType::kF16, DType::kBF16}[size_t(i % 3)];
    c.block_size = std::uniform_int_distribution<int>(1, 8)(rng);
    c.head_dim = 8 * std::uniform_int_distribution<int>(1, 4)(rng);
    c.n_kv_heads = std::uniform_int_distribution<int>(1, 3)(rng);
    c.g = std::uniform_int_distribution<int>(1, 3)(rng);
    c.n_prompt = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    c.window = std::uniform_int_distribution<int64_t>(0, c.n_prompt)(rng);
    c.steps = std::uniform_int_distribution<int>(0, 8)(rng);
    c.budget = std::uniform_int_distribution<int64_t>(1, c.n_prompt + 3)(rng);
    c.n_recent = std::uniform_int_distribution<int64_t>(0, c.budget)(rng);
    SCOPED_TRACE(::testing::Message() << "case " << i << " " << dtype_name(c.kv_type) << " block " << c.block_size
                                      << " d " << c.head_dim << " kv " << c.n_kv_heads << " g " << c.g << " prompt "
                                      << c.n_prompt << " window " << c.window << " steps " << c.steps << " budget "
                                      << c.budget << " recent " << c.n_recent);
    decided += run_case(c, 1000 + uint32_t(i)) ? 1 : 0;
    if (::testing::Test::HasFailure()) return;
  }
  // Near-ties (closer than the fp32 error bound) are rare with random keys:
  // most cases must have been compared to the end. Over 81 other seeds
  // (a sweep, not committed) 107-119 of the 120 were.
  EXPECT_GE(decided, kCases * 85 / 100);
}

TEST(PolicyH2O, TiesEvictTheOlderTokenAndEvictionIsPermanent) {
  // All keys zero: every visible token gets the same probability, so the
  // tokens seen by the same queries tie and the oldest go first.
  Case c;
  c.kv_type = DType::kF32;
  c.n_kv_heads = 1;
  c.g = 1;
  c.head_dim = 8;
  c.n_prompt = 12;
  c.steps = 3;
  std::mt19937 rng(test_seed(3));
  Fixture fx(c);
  fx.append(c.n_prompt, [](int, int) { return 0.f; }, rng);
  const std::vector<float> window = random_vector(rng, 8, 1.f);
  H2OState state(1, {9, 0, 0.f});  // no recent window: every token is a candidate
  state.init_from_prefill(fx.store(), 0, make_view(window.data(), DType::kF32, {1, 1, 8}));
  EXPECT_EQ(state.kept(0), (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9, 10, 11}));
  for (const double a : state.accumulated(0)) EXPECT_EQ(a, double(1.f / 12.f));
  EXPECT_EQ(state.selection().spans, (std::vector<std::vector<TokenSpan>>{{{3, 12}}}));

  // A step: the new token (acc 1/10 after the step) and the kept tokens (1/12 + 1/10):
  // the new token has the lowest acc and is evicted at once (n_recent = 0).
  const std::vector<float> q = random_vector(rng, 8, 1.f);
  std::vector<float> out(8), lse(1);
  fx.append(1, [](int, int) { return 0.f; }, rng);
  state.step(fx.store(), 0, make_view(q.data(), DType::kF32, {1, 8}), make_mutable_view(out.data(), DType::kF32, {1, 8}),
             make_mutable_view(lse.data(), DType::kF32, {1}));
  EXPECT_EQ(state.kept(0), (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_FLOAT_EQ(lse[0], std::log(10.f));
  EXPECT_EQ(state.n_seen(), 13);
}

TEST(PolicyH2O, ParamsFromConfigAndErrors) {
  LongContextConfig config;
  config.h2o.budget_tokens = 101;
  config.h2o.heavy_ratio = 0.5;
  H2OParams p = H2OParams::from_config(config);
  EXPECT_EQ(p.budget, 101);
  EXPECT_EQ(p.n_recent, 101 - 50);
  config.h2o.budget_tokens = 0;
  config.h2o.heavy_ratio = 1.0;
  p = H2OParams::from_config(config);
  EXPECT_EQ(p.budget, h2o_budget_tokens(config));
  EXPECT_EQ(p.n_recent, 0);

  EXPECT_THROW(H2OState(0, {4, 2, 0.f}), Error);
  EXPECT_THROW(H2OState(1, {0, 0, 0.f}), Error);
  EXPECT_THROW(H2OState(1, {4, 5, 0.f}), Error);
  EXPECT_THROW(H2OState(1, {4, -1, 0.f}), Error);

  Case c;
  c.n_kv_heads = 2;
  c.g = 2;
  c.head_dim = 8;
  c.n_prompt = 6;
  std::mt19937 rng(test_seed(5));
  Fixture fx(c);
  fx.append(c.n_prompt, [&](int, int) { return 0.5f; }, rng);
  H2OState state(2, {4, 1, 0.f});
  const std::vector<float> window = random_vector(rng, size_t(7 * 4 * 8), 1.f);
  // More window queries than tokens, or a head count the store does not have.
  EXPECT_THROW(state.init_from_prefill(fx.store(), 0, make_view(window.data(), DType::kF32, {7, 4, 8})), Error);
  EXPECT_THROW(state.init_from_prefill(fx.store(), 0, make_view(window.data(), DType::kF32, {2, 3, 8})), Error);
  EXPECT_EQ(state.n_seen(), 0);
  state.init_from_prefill(fx.store(), 0, make_view(window.data(), DType::kF32, {6, 4, 8}));
  EXPECT_THROW(state.init_from_prefill(fx.store(), 0, make_view(window.data(), DType::kF32, {6, 4, 8})), Error);
  // A step whose output has the wrong shape leaves the state as it was.
  fx.append(1, [&](int, int) { return 0.5f; }, rng);
  const std::vector<int64_t> kept = state.kept(0);
  std::vector<float> q(32), out(32), lse(4);
  EXPECT_THROW(state.step(fx.store(), 0, make_view(q.data(), DType::kF32, {4, 8}),
                          make_mutable_view(out.data(), DType::kF32, {3, 8}), make_mutable_view(lse.data(), DType::kF32, {4})),
               Error);
  EXPECT_EQ(state.kept(0), kept);
  EXPECT_EQ(state.n_seen(), 6);
  EXPECT_NO_THROW(state.step(fx.store(), 0, make_view(q.data(), DType::kF32, {4, 8}),
                             make_mutable_view(out.data(), DType::kF32, {4, 8}),
                             make_mutable_view(lse.data(), DType::kF32, {4})));
  EXPECT_EQ(state.n_seen(), 7);
}

}  // namespace
}  // namespace longctx::policy
