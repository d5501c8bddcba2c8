// prefill_attention against the fp64 reference of reference.h (prefill_ref:
// each query row is decode attention over keys [0, its position], keys and
// values as stored), with every kernel this CPU runs (f32 on every Highway
// target, bf16 and onednn where they run: prefill_kernel_choice_test.cpp), over randomized shapes;
// results independent of chunking and thread count; logits near +-1e4 and
// sink keys of huge norm; argument validation.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "hwy/highway.h"
#include "longctx/core/config.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/prefill_attention_kernels.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "prefill_fixture.h"
#include "reference.h"
#include "store_fixture.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

using namespace prefill_testing;

// ---- tests --------------------------------------------------------------------------

// Query counts around the block size and the kernel's tiles: 1, 17,
// block_size - 1, block_size, block_size + 1, odd and prime.
std::vector<int64_t> chunk_lengths(int block_size) {
  std::vector<int64_t> lengths = {1, 17, 37, 131};
  for (int64_t n : {block_size - 1, block_size, block_size + 1})
    if (n >= 1) lengths.push_back(n);
  return lengths;
}

TEST(PrefillAttention, RandomShapesOnEveryTargetMatchReference) {
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0};
  const int block_sizes[] = {1, 16, 64, 128};
  const int head_dims[] = {64, 128, 256};
  const int groups[] = {1, 2, 4, 8};
  std::mt19937 rng(test_seed(2024));
  int checked = 0;
  for (DType kv_type : types) {
    for (int block_size : block_sizes) {
      for (int rep = 0; rep < 2; ++rep) {
        PrefillCase c;
        c.kv_type = kv_type;
        c.block_size = block_size;
        c.head_dim = head_dims[rng() % 3];
        c.g = groups[rng() % 4];
        c.n_kv_heads = c.g == 8 ? 1 : 1 + int(rng() % 2);
        const std::vector<int64_t> lengths = chunk_lengths(block_size);
        c.n = lengths[rng() % lengths.size()];
        c.history = rep == 0 ? 0 : 1 + int64_t(rng() % 300);  // first_pos 0, then with history
        c.strided = rng() % 2 == 0;
        // Keep the fp64 reference small: q heads x queries x keys x head_dim.
        while (double(c.n_q_heads()) * double(c.n) * double(c.n_tokens()) * c.head_dim > 2e7) {
          c.history /= 2;
          if (c.n > 17) c.n = c.n / 2 + 1;
        }
        SCOPED_TRACE(c.describe());
        auto t = make_store(c, c.n_tokens());
        fill_random(*t->store, c.n_tokens(), rng);
        Buffers b(c, rng);
        const float scale = 1.f / std::sqrt(float(c.head_dim));
        for (const KernelRun& run : every_kernel_run()) {
          SCOPED_TRACE(run.name());
          const KernelScope scope(run);
          b.reset_outputs();
          run_prefill(*t->store, c.history, b, 0.f, run.kernel);
          expect_matches_reference(b, c.history, reference_rows(*t->store, c.history, b, scale, run.kernel), false,
                                   run.kernel);
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 24);
}

TEST(PrefillAttention, ExplicitScaleIsUsed) {
  PrefillCase c;
  c.head_dim = 128;
  c.g = 4;
  c.n_kv_heads = 2;
  c.history = 70;
  c.n = 40;
  std::mt19937 rng(test_seed(5));
  auto t = make_store(c, c.n_tokens());
  fill_random(*t->store, c.n_tokens(), rng);
  Buffers b(c, rng);
  const float scale = 0.3f;
  for (PrefillKernel kernel : supported_prefill_kernels()) {
    SCOPED_TRACE(prefill_kernel_name(kernel));
    run_prefill(*t->store, c.history, b, scale, kernel);
    expect_matches_reference(b, c.history, reference_rows(*t->store, c.history, b, scale, kernel), false, kernel);
  }
}

// Histories and chunks longer than several key tiles (128 keys; the amx
// kernel's 256): the online softmax carries m, l and O from tile to tile,
// through history tiles and chunk tiles whose causal mask cuts inside them.
TEST(PrefillAttention, KeysOverSeveralKeyTilesMatchReference) {
  std::mt19937 rng(test_seed(31));
  for (const auto& [history, n, head_dim, g] : {std::tuple<int64_t, int64_t, int, int>{1300, 37, 128, 4},
                                                std::tuple<int64_t, int64_t, int, int>{0, 1100, 64, 1},
                                                std::tuple<int64_t, int64_t, int, int>{600, 40, 256, 2}}) {
    PrefillCase c;
    c.history = history, c.n = n, c.head_dim = head_dim, c.g = g;
    SCOPED_TRACE(c.describe());
    auto t = make_store(c, c.n_tokens());
    fill_random(*t->store, c.n_tokens(), rng);
    Buffers b(c, rng);
    const float scale = 1.f / std::sqrt(float(c.head_dim));
    for (PrefillKernel kernel : supported_prefill_kernels()) {
      SCOPED_TRACE(prefill_kernel_name(kernel));
      b.reset_outputs();
      run_prefill(*t->store, c.history, b, 0.f, kernel);
      expect_matches_reference(b, c.history, reference_rows(*t->store, c.history, b, scale, kernel), false, kernel);
    }
  }
}

// The prefill of a prompt in chunks, each attended right after its K/V is
// appended (as the pipeline does), gives the same bits as one chunk over the
// whole prompt, with one thread or all: a row's result depends only on its
// query and keys.
TEST(PrefillAttention, ChunkingAndThreadsDoNotChangeResults) {
  PrefillCase c;
  c.kv_type = DType::kBF16;
  c.block_size = 16;
  c.head_dim = 64;
  c.n_kv_heads = 2;
  c.g = 4;
  c.n = 1100;  // several key tiles of every kernel
  std::mt19937 rng(test_seed(77));
  const size_t token_size = size_t(c.n_kv_heads * c.head_dim);
  const std::vector<float> k = normal_values(size_t(c.n) * token_size, rng);
  const std::vector<float> v = normal_values(size_t(c.n) * token_size, rng);
  Buffers whole(c, rng);
  auto full = make_store(c, c.n);
  append(*full->store, 1, k.data(), v.data(), c.n);

  for (PrefillKernel kernel : supported_prefill_kernels()) {
    SCOPED_TRACE(prefill_kernel_name(kernel));
    whole.reset_outputs();
    run_prefill(*full->store, 0, whole, 0.f, kernel);
    expect_matches_reference(whole, 0, reference_rows(*full->store, 0, whole, 1.0 / 8, kernel), false, kernel);

    for (int threads : {1, 2}) {
      const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
      SCOPED_TRACE(str_cat(threads, " threads"));
      auto chunked = make_store(c, c.n);
      int64_t first = 0;
      for (int64_t size : {1, 7, 16, 100, 129, 47, 600, 200}) {
        append(*chunked->store, 1, &k[size_t(first) * token_size], &v[size_t(first) * token_size], size);
        PrefillCase chunk_case = c;
        chunk_case.n = size;
        Buffers part(chunk_case, rng);
        for (int64_t i = 0; i < size; ++i)
          for (int h = 0; h < c.n_q_heads(); ++h)
            std::copy_n(whole.q_row(first + i, h), c.head_dim, part.q_row(i, h));
        run_prefill(*chunked->store, first, part, 0.f, kernel);
        for (int64_t i = 0; i < size; ++i) {
          for (int h = 0; h < c.n_q_heads(); ++h) {
            ASSERT_EQ(part.lse_at(i, h), whole.lse_at(first + i, h)) << "position " << first + i << " head " << h;
            for (int ch = 0; ch < c.head_dim; ++ch)
              ASSERT_EQ(part.out_row(i, h)[ch], whole.out_row(first + i, h)[ch])
                  << "position " << first + i << " head " << h << " channel " << ch;
          }
        }
        first += size;
      }
      ASSERT_EQ(first, c.n);
    }
  }
}

// Every kernel this CPU runs, at scale 1, against the reference with exact
// logits (integer data whose logits f32 holds exactly).
void expect_every_kernel_exact(const kvstore::KVStore& store, int64_t first_pos, Buffers& b) {
  for (const KernelRun& run : every_kernel_run()) {
    SCOPED_TRACE(run.name());
    const KernelScope scope(run);
    b.reset_outputs();
    run_prefill(store, first_pos, b, 1.f, run.kernel);
    expect_matches_reference(b, first_pos, reference_rows(store, first_pos, b, 1.0, run.kernel),
                             /*exact_logits=*/true, run.kernel);
  }
}

// Integer keys, values and queries with scale 1: channel 0 adds +-1e4 to
// every logit (q_0 = +-100, k_0 = 100), the other channels add small integers,
// so the softmax is not trivial and every logit is exact in f32.
TEST(PrefillAttention, LogitsNearPlusMinus1e4AreFiniteAndCorrect) {
  std::mt19937 rng(test_seed(11));
  std::uniform_int_distribution<int> small(-2, 2);
  for (DType kv_type : {DType::kF32, DType::kF16, DType::kBF16}) {
    PrefillCase c;
    c.kv_type = kv_type;
    c.block_size = 16;
    c.head_dim = 64;
    c.n_kv_heads = 1;
    c.g = 2;
    c.history = 150;
    c.n = 20;
    SCOPED_TRACE(c.describe());
    auto t = make_store(c, c.n_tokens());
    std::vector<float> k(size_t(c.n_tokens() * c.head_dim)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = i % size_t(c.head_dim) == 0 ? 100.f : float(small(rng));
      v[i] = float(small(rng));
    }
    append(*t->store, 1, k.data(), v.data(), c.n_tokens());
    Buffers b(c, rng);
    for (int64_t i = 0; i < c.n; ++i) {
      for (int h = 0; h < c.n_q_heads(); ++h) {
        float* q = b.q_row(i, h);
        q[0] = (i + h) % 2 == 0 ? 100.f : -100.f;
        for (int ch = 1; ch < c.head_dim; ++ch) q[ch] = float(small(rng));
      }
    }
    expect_every_kernel_exact(*t->store, c.history, b);
  }
}

// Logits that jump by 200 (exp(-200) is 0 in f32) partway through a key
// tile: keys 0..199 have channel 0 at 0, the later ones at 1, and the
// queries' channel 0 is 200. Every key before the jump must drop out of O
// and l, whatever chunk of a tile it sits in.
TEST(PrefillAttention, LogitJumpPastExpRangeDropsEarlierKeys) {
  std::mt19937 rng(test_seed(5));
  std::uniform_int_distribution<int> small(-2, 2);
  for (DType kv_type : {DType::kF32, DType::kF16}) {
    PrefillCase c;
    c.kv_type = kv_type;
    c.block_size = 16;
    c.head_dim = 32;
    c.n_kv_heads = 1;
    c.g = 1;
    c.history = 300;
    c.n = 40;
    SCOPED_TRACE(c.describe());
    auto t = make_store(c, c.n_tokens());
    std::vector<float> k(size_t(c.n_tokens() * c.head_dim)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      const size_t position = i / size_t(c.head_dim);
      k[i] = i % size_t(c.head_dim) == 0 ? (position < 200 ? 0.f : 1.f) : float(small(rng));
      v[i] = float(small(rng));
    }
    append(*t->store, 1, k.data(), v.data(), c.n_tokens());
    Buffers b(c, rng);
    for (int64_t i = 0; i < c.n; ++i) {
      float* q = b.q_row(i, 0);
      q[0] = 200.f;
      for (int ch = 1; ch < c.head_dim; ++ch) q[ch] = float(small(rng));
    }
    expect_every_kernel_exact(*t->store, c.history, b);
  }
}

// Attention sinks: the first tokens have keys of huge norm (every channel
// 60 or 1e4; 1e4 rounds to 10016 in bf16, read back as stored). Queries leaning towards them put all
// weight on the sinks; queries leaning away must still attend the rest.
// Integer data and scale 1 keep the logits (up to ~2.6e6) exact.
TEST(PrefillAttention, HugeNormSinkKeysNeverGiveNaN) {
  std::mt19937 rng(test_seed(3));
  std::uniform_int_distribution<int> small(-2, 2), lean(0, 2);
  for (DType kv_type : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (float sink_value : {60.f, 1e4f}) {
      PrefillCase c;
      c.kv_type = kv_type;
      c.block_size = 64;
      c.head_dim = 128;
      c.n_kv_heads = 2;
      c.g = 2;
      c.history = 200;
      c.n = 30;
      SCOPED_TRACE(str_cat(c.describe(), " sink channels ", sink_value));
      auto t = make_store(c, c.n_tokens());
      const size_t token_size = size_t(c.n_kv_heads * c.head_dim);
      std::vector<float> k(size_t(c.n_tokens()) * token_size), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = i < 4 * token_size ? sink_value : float(small(rng));  // tokens 0..3 are sinks
        v[i] = float(small(rng));
      }
      append(*t->store, 1, k.data(), v.data(), c.n_tokens());
      Buffers b(c, rng);
      for (int64_t i = 0; i < c.n; ++i) {
        for (int h = 0; h < c.n_q_heads(); ++h) {
          const float sign = (i * 3 + h) % 2 == 0 ? 1.f : -1.f;
          for (int ch = 0; ch < c.head_dim; ++ch) b.q_row(i, h)[ch] = sign * float(lean(rng));
        }
      }
      expect_every_kernel_exact(*t->store, c.history, b);
    }
  }
}

TEST(PrefillAttention, EmptyChunkWritesNothing) {
  PrefillCase c;
  c.n_kv_heads = 2;
  c.g = 2;
  c.n = 0;
  std::mt19937 rng(test_seed(1));
  auto t = make_store(c, 40);
  fill_random(*t->store, 40, rng);
  float q = 0, out = kSentinel, lse = kSentinel;
  prefill_attention(*t->store, 1, 40, make_view(&q, DType::kF32, {0, 4, 64}), 0.f,
                    make_mutable_view(&out, DType::kF32, {0, 4, 64}), make_mutable_view(&lse, DType::kF32, {0, 4}));
  EXPECT_EQ(out, kSentinel);
  EXPECT_EQ(lse, kSentinel);
}

TEST(PrefillAttention, RejectsInvalidArgumentsNamingThem) {
  PrefillCase c;
  c.kv_type = DType::kF32;
  c.n_kv_heads = 2;
  c.g = 2;
  c.head_dim = 64;
  c.n = 5;
  c.history = 15;
  std::mt19937 rng(test_seed(9));
  auto t = make_store(c, c.n_tokens());
  fill_random(*t->store, c.n_tokens(), rng);  // layer 1: 20 tokens
  const kvstore::KVStore& store = *t->store;
  std::vector<float> q(size_t(5 * 4 * 64), 0.5f), out(q.size(), kSentinel), lse(20, kSentinel);
  const TensorView qv = make_view(q.data(), DType::kF32, {5, 4, 64});
  const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {5, 4, 64});
  const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {5, 4});

  expect_invalid([&] { prefill_attention(store, 2, 15, qv, 0.f, ov, lv); }, {"layer 2", "[0, 2)"});
  expect_invalid([&] { prefill_attention(store, -1, 15, qv, 0.f, ov, lv); }, {"layer -1"});
  TensorView q_f16 = qv;
  q_f16.dtype = DType::kF16;
  expect_invalid([&] { prefill_attention(store, 1, 15, q_f16, 0.f, ov, lv); }, {"q", "f32", "f16"});
  expect_invalid([&] { prefill_attention(store, 1, 15, make_view(q.data(), DType::kF32, {5, 8, 32}), 0.f, ov, lv); },
                 {"q", "[*, *, 64]"});
  expect_invalid([&] { prefill_attention(store, 1, 15, make_view(q.data(), DType::kF32, {5, 3, 64}), 0.f, ov, lv); },
                 {"3 query heads", "2 kv heads"});
  expect_invalid([&] { prefill_attention(store, 1, 15, make_view(q.data(), DType::kF32, {20, 64}), 0.f, ov, lv); },
                 {"q", "[*, *, 64]"});
  expect_invalid(
      [&] { prefill_attention(store, 1, 15, qv, 0.f, make_mutable_view(out.data(), DType::kF32, {4, 4, 64}), lv); },
      {"out", "[5, 4, 64]"});
  expect_invalid(
      [&] { prefill_attention(store, 1, 15, qv, 0.f, ov, make_mutable_view(lse.data(), DType::kF32, {5, 2})); },
      {"lse", "[5, 4]"});
  MutableTensorView lse_bf16 = lv;
  lse_bf16.dtype = DType::kBF16;
  expect_invalid([&] { prefill_attention(store, 1, 15, qv, 0.f, ov, lse_bf16); }, {"lse", "f32"});
  expect_invalid([&] { prefill_attention(store, 1, 16, qv, 0.f, ov, lv); },
                 {"[16, 21)", "layer 1 holds 20 tokens"});
  expect_invalid([&] { prefill_attention(store, 1, -1, qv, 0.f, ov, lv); }, {"[-1, 4)"});
  expect_invalid([&] { prefill_attention(store, 1, 15, qv, -1.f, ov, lv); }, {"scale", "-1"});
  expect_invalid([&] { prefill_attention(store, 1, 15, qv, std::numeric_limits<float>::quiet_NaN(), ov, lv); },
                 {"scale"});
  TensorView q_inner_strided = qv;  // validation only: never read
  q_inner_strided.strides = {256, 64, 2, 0};
  expect_invalid([&] { prefill_attention(store, 1, 15, q_inner_strided, 0.f, ov, lv); }, {"q", "stride 1"});
  TensorView null_q = qv;
  null_q.data = nullptr;
  expect_invalid([&] { prefill_attention(store, 1, 15, null_q, 0.f, ov, lv); }, {"q", "null"});
  std::vector<float> q_nan(q);
  q_nan[(3 * 4 + 2) * 64 + 17] = std::numeric_limits<float>::infinity();
  const TensorView q_inf = make_view(q_nan.data(), DType::kF32, {5, 4, 64});
  expect_invalid([&] { prefill_attention(store, 1, 15, q_inf, 0.f, ov, lv); },
                 {"prefill_attention q: element [3, 2, 17] is inf"});

  // Nothing was written by the calls that failed.
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == kSentinel; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == kSentinel; }));
}


// ---- history restricted to spans (sparse prefill) ---------------------------------------

// fp64 attention of one query over an explicit, increasing key list.
prefill_ref::Row attend_tokens(const float* q, double scale, const prefill_ref::StoredHead& kv,
                               const std::vector<int64_t>& tokens) {
  const size_t d = size_t(kv.head_dim);
  prefill_ref::Row row;
  std::vector<double> logits;
  for (int64_t t : tokens) {
    double dot = 0, terms = 0;
    for (size_t c = 0; c < d; ++c) {
      dot += double(q[c]) * kv.key(t)[c];
      terms += std::abs(double(q[c]) * kv.key(t)[c]);
    }
    logits.push_back(scale * dot);
    row.max_logit_terms = std::max(row.max_logit_terms, scale * terms);
    for (size_t c = 0; c < d; ++c) row.max_abs_value = std::max(row.max_abs_value, std::abs(kv.value(t)[c]));
  }
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  row.out.assign(d, 0.0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const double p = std::exp(logits[i] - m);
    sum += p;
    for (size_t c = 0; c < d; ++c) row.out[c] += p * kv.value(tokens[i])[c];
  }
  for (double& x : row.out) x /= sum;
  row.lse = m + std::log(sum);
  return row;
}

// Random spans inside [0, history): sorted, non-overlapping, sometimes
// adjacent (not merged), sometimes none.
std::vector<TokenSpan> random_spans(int64_t history, std::mt19937& rng) {
  std::vector<TokenSpan> spans;
  int64_t t = 0;
  while (t < history) {
    t += int64_t(rng() % 3 == 0 ? 0 : rng() % 40);  // a gap, often 0 after a span: adjacent
    if (t >= history) break;
    const int64_t len = 1 + int64_t(rng() % 50);
    spans.push_back({t, std::min(history, t + len)});
    t = spans.back().end;
    if (rng() % 7 == 0) break;
  }
  return spans;
}

void run_restricted(const kvstore::KVStore& store, int64_t first_pos, const Selection& history, Buffers& b,
                    PrefillKernel kernel = PrefillKernel::kF32) {
  prefill_attention(store, 1, first_pos, history, b.q_view(), 0.f, b.out_view(), b.lse_view(), kernel);
}

// Each query attends its kv head's spans plus the chunk up to itself.
TEST(PrefillAttention, RestrictedHistoryOnEveryTargetMatchesReference) {
  std::mt19937 rng(test_seed(606));
  int checked = 0;
  for (DType kv_type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    for (int block_size : {1, 16, 64}) {
      for (int rep = 0; rep < 2; ++rep) {
        PrefillCase c;
        c.kv_type = kv_type;
        c.block_size = block_size;
        c.head_dim = rep == 0 ? 64 : 128;
        c.g = 1 << (rng() % 3);
        c.n_kv_heads = 1 + int(rng() % 2);
        const std::vector<int64_t> lengths = chunk_lengths(block_size);
        c.n = lengths[rng() % lengths.size()];
        c.history = 1 + int64_t(rng() % 400);
        c.strided = rng() % 2 == 0;
        SCOPED_TRACE(c.describe());
        auto t = make_store(c, c.n_tokens());
        fill_random(*t->store, c.n_tokens(), rng);
        Selection history;
        for (int h = 0; h < c.n_kv_heads; ++h) history.spans.push_back(random_spans(c.history, rng));
        if (rep == 1) history.spans[0].clear();  // a head that sees the chunk only
        Buffers b(c, rng);
        const float scale = 1.f / std::sqrt(float(c.head_dim));
        for (const KernelRun& run : every_kernel_run()) {
          SCOPED_TRACE(run.name());
          // The reference over what the kernel reads: stored or bf16-rounded inputs.
          const bool bf16 = rounds_to_bf16(run.kernel);
          std::vector<prefill_ref::StoredHead> heads;
          for (int h = 0; h < c.n_kv_heads; ++h) {
            prefill_ref::StoredHead head = prefill_ref::stored_head(*t->store, 1, h);
            heads.push_back(bf16 ? rounded_to_bf16(std::move(head)) : std::move(head));
          }
          std::vector<prefill_ref::Row> ref;
          std::vector<int64_t> n_keys;
          for (int64_t i = 0; i < c.n; ++i) {
            for (int h = 0; h < c.n_q_heads(); ++h) {
              const int kv = h / c.g;
              std::vector<int64_t> tokens;
              for (const TokenSpan& s : history.spans[size_t(kv)])
                for (int64_t k = s.begin; k < s.end; ++k) tokens.push_back(k);
              for (int64_t k = c.history; k <= c.history + i; ++k) tokens.push_back(k);
              ref.push_back(bf16 ? attend_tokens(rounded_query(b.q_row(i, h), c.head_dim, scale).data(), 1.0,
                                                 heads[size_t(kv)], tokens)
                                 : attend_tokens(b.q_row(i, h), scale, heads[size_t(kv)], tokens));
              n_keys.push_back(int64_t(tokens.size()));
            }
          }
          const KernelScope scope(run);
          b.reset_outputs();
          run_restricted(*t->store, c.history, history, b, run.kernel);
          ASSERT_TRUE(b.padding_untouched()) << "wrote outside the views";
          for (int64_t i = 0; i < c.n; ++i) {
            for (int h = 0; h < c.n_q_heads(); ++h) {
              const size_t row = size_t(i * c.n_q_heads() + h);
              const Bounds bounds = error_bounds(ref[row], c.head_dim, n_keys[row], false, run.kernel);
              SCOPED_TRACE(str_cat("query ", i, " head ", h));
              ASSERT_NEAR(b.lse_at(i, h), ref[row].lse, bounds.lse);
              for (int ch = 0; ch < c.head_dim; ++ch)
                ASSERT_NEAR(b.out_row(i, h)[ch], ref[row].out[size_t(ch)], bounds.out) << "channel " << ch;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 18);
}

// The span [0, first_pos), whole or cut into adjacent pieces, is the dense
// prefill bit for bit (same key list, same tiles).
TEST(PrefillAttention, FullHistorySpansEqualDenseBitForBit) {
  std::mt19937 rng(test_seed(707));
  for (int64_t history : {0, 1, 127, 128, 300}) {
    PrefillCase c;
    c.kv_type = DType::kF16;
    c.block_size = 16;
    c.n_kv_heads = 2;
    c.g = 2;
    c.history = history;
    c.n = 150;
    SCOPED_TRACE(c.describe());
    auto t = make_store(c, c.n_tokens());
    fill_random(*t->store, c.n_tokens(), rng);
    Buffers dense(c, rng), sparse = dense;
    for (PrefillKernel kernel : supported_prefill_kernels()) {
      SCOPED_TRACE(prefill_kernel_name(kernel));
      dense.reset_outputs();
      run_prefill(*t->store, history, dense, 0.f, kernel);
      Selection whole, pieces;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        whole.spans.push_back(history > 0 ? std::vector<TokenSpan>{{0, history}} : std::vector<TokenSpan>{});
        std::vector<TokenSpan> cut;
        for (int64_t b = 0; b < history; b += 37) cut.push_back({b, std::min(history, b + 37)});
        pieces.spans.push_back(cut);
      }
      for (const Selection* selection : {&whole, &pieces}) {
        sparse.reset_outputs();
        run_restricted(*t->store, history, *selection, sparse, kernel);
        ASSERT_EQ(0, std::memcmp(sparse.out.data(), dense.out.data(), dense.out.size() * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(sparse.lse.data(), dense.lse.data(), dense.lse.size() * sizeof(float)));
      }
    }
  }
}

TEST(PrefillAttention, RejectsInvalidHistorySpansNamingThem) {
  PrefillCase c;
  c.kv_type = DType::kF32;
  c.n_kv_heads = 2;
  c.g = 2;
  c.n = 5;
  c.history = 15;
  std::mt19937 rng(test_seed(10));
  auto t = make_store(c, c.n_tokens());
  fill_random(*t->store, c.n_tokens(), rng);
  Buffers b(c, rng);
  const auto with = [&](std::vector<TokenSpan> head1) {
    Selection s;
    s.spans = {{{0, 3}}, std::move(head1)};
    return s;
  };
  expect_invalid([&] { run_restricted(*t->store, 15, with({{2, 2}}), b); }, {"kv head 1", "span 0", "[2, 2)"});
  expect_invalid([&] { run_restricted(*t->store, 15, with({{0, 16}}), b); }, {"kv head 1", "[0, 16)", "15"});
  expect_invalid([&] { run_restricted(*t->store, 15, with({{-1, 2}}), b); }, {"[-1, 2)"});
  expect_invalid([&] { run_restricted(*t->store, 15, with({{4, 8}, {6, 9}}), b); }, {"span 1", "[6, 9)"});
  expect_invalid([&] { run_restricted(*t->store, 15, with({{6, 9}, {1, 2}}), b); }, {"span 1", "[1, 2)"});
  Selection one_head;
  one_head.spans = {{{0, 3}}};
  expect_invalid([&] { run_restricted(*t->store, 15, one_head, b); }, {"1 kv heads", "2"});
  // Nothing was written by the calls that failed.
  EXPECT_TRUE(std::all_of(b.out.begin(), b.out.end(), [](float x) { return x == kSentinel; }));
  EXPECT_TRUE(std::all_of(b.lse.begin(), b.lse.end(), [](float x) { return x == kSentinel; }));
}

}  // namespace

// The f32 softmax step's exp (cpu/src/exp_hwy-inl.h, which decode's softmax
// shares) on every Highway target: with a row whose max is 0, p = exp(s)
// exactly as the argument s, within 1 ulp (2u relative) of exp in fp64 down
// to -86, 0 below it and in masked columns; m' = 0 and l = sum of p.
TEST(PrefillAttention, F32SoftmaxExpIsWithin1UlpOnEveryTarget) {
  std::mt19937 rng(test_seed(5));
  std::uniform_real_distribution<float> uniform(-90.f, 0.f);
  std::vector<float> args = {-1e-7f, -0.34657f, -0.34658f, -0.5f, -1.f, -85.99f, -86.f, -86.01f, -87.5f, -104.f};
  for (int i = 0; i < 40000; ++i) args.push_back(i < 8000 ? uniform(rng) / 90.f : uniform(rng));
  constexpr size_t kCols = 64;  // 63 arguments, then the max 0 (valid = 64) or a masked column (valid = 63)
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const KernelScope scope({PrefillKernel::kF32, target});  // also restored when an assertion returns
    SCOPED_TRACE(hwy::TargetName(target));
    double worst = 0;
    for (size_t first = 0; first < args.size(); first += kCols - 1) {
      const size_t n = std::min(kCols - 1, args.size() - first);
      std::vector<float> s(kCols, -3.f), o(detail::kTileAlign, 2.f);  // o_cols: a multiple of kTileAlign
      std::copy_n(args.begin() + long(first), n, s.begin());
      s[kCols - 1] = 0.f;
      float m = -std::numeric_limits<float>::infinity(), l = 0.f;
      const int valid = int(kCols);
      detail::softmax_step(1, kCols, &valid, s.data(), kCols, &m, &l, o.data(), o.size(), o.size());
      ASSERT_EQ(m, 0.f);
      ASSERT_EQ(s[kCols - 1], 1.f);
      ASSERT_EQ(o[0], 0.f) << "o *= exp(-inf - 0) = 0 on the first tile";
      double sum = 0;
      for (size_t j = 0; j + 1 < kCols; ++j) {
        const float arg = j < n ? args[first + j] : -3.f;
        const double ref = arg < -86.f ? 0.0 : std::exp(double(arg));
        worst = std::max(worst, ref > 0 ? std::abs(double(s[j]) - ref) / ref : 0.0);
        ASSERT_LE(std::abs(double(s[j]) - ref), 2 * kU * ref) << "exp(" << arg << ") gave " << s[j];
        sum += s[j];
      }
      ASSERT_NEAR(l, sum + 1.0, 4 * kCols * kU * (sum + 1.0));
      // The same row with its last column masked: its p is exactly 0.
      std::copy_n(args.begin() + long(first), n, s.begin());
      m = -std::numeric_limits<float>::infinity(), l = 0.f;
      const int all_but_last = int(kCols) - 1;
      detail::softmax_step(1, kCols, &all_but_last, s.data(), kCols, &m, &l, o.data(), o.size(), o.size());
      ASSERT_EQ(s[kCols - 1], 0.f);
    }
    RecordProperty(str_cat("worst_relative_error_", hwy::TargetName(target)), ::testing::PrintToString(worst));
  }
}

// The bf16 kernels' exp directly: a row whose running max m = t < 0 meets a
// key of score 0, so its O (all 1) is rescaled by exp(t - 0), which the
// kernel computes as 2^(f32(t * log2(e))). Against that power of two in fp64
// the polynomial's relative error must stay within its documented 3.0e-6
// over the whole normal range, t from 0 down to -87.
TEST(PrefillAttention, Bf16SoftmaxExpIsWithinItsBound) {
  const std::string why = prefill_kernel_unsupported_reason(PrefillKernel::kBf16);
  if (!why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(test_seed(7));
  std::uniform_real_distribution<float> uniform(-87.f, 0.f);
  std::vector<float> ts = {0.f, -0.5f, -1.f, -1.5f, -1e-7f, -86.99f};
  for (int i = 0; i < 20000; ++i) ts.push_back(i < 4000 ? uniform(rng) / 87.f : uniform(rng));
  constexpr size_t kCols = 32;
  std::vector<float> s(kCols, 0.f), o(kCols);
  std::vector<uint16_t> p(kCols);
  const int valid = 1;
  double worst = 0;
  for (float t : ts) {
    float m = t, l = 0.f;
    std::fill(o.begin(), o.end(), 1.f);
    detail::softmax_step_bf16(1, kCols, &valid, s.data(), kCols, &m, &l, o.data(), kCols, kCols, p.data(), kCols);
    const float arg = t * 1.44269504088896341f;  // the kernel's (m - m') log2(e), m' = 0
    const double ref = std::exp2(double(arg));
    worst = std::max(worst, std::abs(double(o[0]) - ref) / ref);
    ASSERT_NEAR(o[0], ref, 3.0e-6 * ref) << "t = " << t;
    ASSERT_EQ(o[kCols - 1], o[0]);
    ASSERT_EQ(m, 0.f);
    ASSERT_EQ(l, 1.f) << "l = l_old exp(t) + exp(0) with l_old = 0";
  }
  RecordProperty("worst_relative_error", ::testing::PrintToString(worst));
}

}  // namespace longctx::cpu

namespace longctx::cpu {

// pack_bf16_tiles against its layout written out element by element: tile
// (g, k) at (g * steps + k) * 256 words, row i the bf16 pair of rows 32k + 2i
// and 32k + 2i + 1 (the odd row in the high half) of columns 16g..16g+15,
// zeros past the last row; nothing written past the tiles. Odd row counts,
// partial and whole 32-row steps, padded source rows.
TEST(PrefillAttention, AmxTilePackingMatchesItsLayout) {
  const std::string why = prefill_kernel_unsupported_reason(PrefillKernel::kBf16);
  if (!why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(test_seed(11));
  std::normal_distribution<float> normal(0.f, 3.f);
  constexpr uint32_t kSentinel = 0xdeadbeef;
  for (size_t rows : {1, 2, 17, 31, 32, 33, 64, 100, 128}) {
    for (size_t cols : {32, 64, 160}) {
      SCOPED_TRACE(str_cat("rows ", rows, " cols ", cols));
      const size_t lds = cols + 16;
      std::vector<float> src(rows * lds);
      for (float& x : src) x = normal(rng);
      const size_t steps = (rows + 31) / 32, words = cols / 16 * steps * 256;
      std::vector<uint32_t> dst(words + 64, kSentinel);
      detail::pack_bf16_tiles(rows, cols, src.data(), lds, dst.data());
      const auto bf16_at = [&](size_t r, size_t c) -> uint32_t {
        return r < rows ? f32_to_bf16_bits(src[r * lds + c]) : 0u;
      };
      for (size_t g = 0; g < cols / 16; ++g)
        for (size_t k = 0; k < steps; ++k)
          for (size_t i = 0; i < 16; ++i)
            for (size_t c = 0; c < 16; ++c) {
              const size_t r = 32 * k + 2 * i, col = 16 * g + c;
              const uint32_t want = bf16_at(r, col) | bf16_at(r + 1, col) << 16;
              ASSERT_EQ(dst[(g * steps + k) * 256 + i * 16 + c], want) << "tile (" << g << ", " << k << ") row " << i
                                                                       << " column " << c;
            }
      for (size_t w = words; w < dst.size(); ++w) ASSERT_EQ(dst[w], kSentinel) << "word " << w << " past the tiles";
    }
  }
}

}  // namespace longctx::cpu
