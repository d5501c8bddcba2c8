// decode_attention and dense_decode_attention against the fp64 reference of
// reference.h (softmax attention over the listed tokens, keys and values as
// stored), on every Highway target this CPU runs, over randomized shapes,
// selections and flash-decoding splits, plus hard numerical cases.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/quant_matmul.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "../../cpu/src/attention_kernel.h"
#include "reference.h"
#include "store_fixture.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const double kU = std::ldexp(1.0, -24);  // f32 unit roundoff

using testing::ForcedHighwayTarget;
using testing::kernel_store_config;
using testing::round_to;
using testing::topology;

// ---- stores -------------------------------------------------------------------------

struct AttnCase {
  DType kv_type = DType::kF16;
  int block_size = 16;
  int head_dim = 64;
  int n_kv_heads = 2;
  int g = 1;  // query heads per kv head
  int64_t n_tokens = 1;

  int n_q_heads() const { return g * n_kv_heads; }
  std::string describe() const {
    return str_cat(dtype_name(kv_type), " block=", block_size, " head_dim=", head_dim, " kv_heads=", n_kv_heads,
                   " g=", g, " tokens=", n_tokens);
  }
};

// Keys and values of the tested layer before rounding, [n_tokens][n_kv_heads][head_dim].
struct RawKV {
  std::vector<float> k, v;
};

RawKV random_kv(const AttnCase& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  RawKV kv;
  for (int64_t i = 0; i < c.n_tokens * c.n_kv_heads * c.head_dim; ++i) {
    kv.k.push_back(normal(rng));
    kv.v.push_back(normal(rng));
  }
  return kv;
}

std::vector<float> random_q(const AttnCase& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(c.n_q_heads()) * c.head_dim);
  for (float& x : q) x = normal(rng);
  return q;
}

// A two-layer store: layer kLayer holds the case's tokens (appended in chunks
// of random sizes), layer 0 three unrelated tokens. head(h) holds kv head h's
// keys and values as stored, for the reference.
class AttnStore {
 public:
  static constexpr int kLayer = 1;

  AttnStore(const AttnCase& c, const RawKV& kv, std::mt19937& rng) : case_(c), budget_(uint64_t{1} << 30) {
    const LongContextConfig config = kernel_store_config(c.kv_type, c.block_size, std::max<int64_t>(c.n_tokens, 8));
    store_ = std::make_unique<kvstore::KVStore>(kvstore::KVShape{2, c.n_kv_heads, c.head_dim}, config, budget_,
                                                topology());
    const int64_t row = int64_t(c.n_kv_heads) * c.head_dim;
    std::vector<float> other(size_t(3 * row), 0.5f);
    store_->append(0, make_view(other.data(), DType::kF32, {3, c.n_kv_heads, c.head_dim}),
                   make_view(other.data(), DType::kF32, {3, c.n_kv_heads, c.head_dim}));
    std::uniform_int_distribution<int64_t> chunk(1, std::max<int64_t>(1, c.n_tokens / 3));
    for (int64_t t = 0; t < c.n_tokens;) {
      const int64_t n = std::min(c.n_tokens - t, chunk(rng));
      store_->append(kLayer, make_view(kv.k.data() + t * row, DType::kF32, {n, c.n_kv_heads, c.head_dim}),
                     make_view(kv.v.data() + t * row, DType::kF32, {n, c.n_kv_heads, c.head_dim}));
      t += n;
    }
    heads_.resize(size_t(c.n_kv_heads));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      heads_[size_t(h)].head_dim = c.head_dim;
      if (c.kv_type == DType::kQ8_0) {  // dequantized as the store reads it (checked in tests/kvstore)
        const prefill_ref::StoredHead stored = prefill_ref::stored_head(*store_, kLayer, h);
        heads_[size_t(h)].k.assign(stored.k.begin(), stored.k.end());
        heads_[size_t(h)].v.assign(stored.v.begin(), stored.v.end());
        continue;
      }
      for (int64_t t = 0; t < c.n_tokens; ++t)
        for (int ch = 0; ch < c.head_dim; ++ch) {
          const size_t i = size_t((t * c.n_kv_heads + h) * c.head_dim + ch);
          heads_[size_t(h)].k.push_back(round_to(c.kv_type, kv.k[i]));
          heads_[size_t(h)].v.push_back(round_to(c.kv_type, kv.v[i]));
        }
    }
  }

  const kvstore::KVStore& store() const { return *store_; }
  const AttnCase& config() const { return case_; }
  const attention_ref::HeadKV& head(int h) const { return heads_[size_t(h)]; }

 private:
  AttnCase case_;
  kvstore::MemoryBudget budget_;
  std::unique_ptr<kvstore::KVStore> store_;
  std::vector<attention_ref::HeadKV> heads_;
};

// ---- selections ---------------------------------------------------------------------

// Each block in or out with probability 1/2; a block that is in may lose a
// random head and/or tail, so spans start and end mid-block.
std::vector<TokenSpan> random_block_spans(int64_t n, int block_size, std::mt19937& rng) {
  std::vector<TokenSpan> spans;
  for (int64_t b0 = 0; b0 < n; b0 += block_size) {
    if (rng() % 2 == 0) continue;
    int64_t begin = b0, end = std::min<int64_t>(n, b0 + block_size);
    if (end - begin > 1 && rng() % 3 == 0) begin += int64_t(rng() % uint64_t(end - begin));
    if (end - begin > 1 && rng() % 3 == 0) end -= int64_t(rng() % uint64_t(end - begin));
    if (!spans.empty() && spans.back().end == begin) {
      spans.back().end = end;
    } else {
      spans.push_back({begin, end});
    }
  }
  return spans;
}

// Alternating skipped and taken runs of 1 to 2 * block_size + 1 tokens: several
// spans in one block, spans across block boundaries.
std::vector<TokenSpan> random_token_spans(int64_t n, int block_size, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> run(1, 2 * int64_t(block_size) + 1);
  std::vector<TokenSpan> spans;
  int64_t t = rng() % 2 == 0 ? 0 : run(rng);
  while (t < n) {
    const int64_t end = std::min(n, t + run(rng));
    spans.push_back({t, end});
    t = end + run(rng);
  }
  return spans;
}

// Per kv head: 1/8 nothing, 1/8 everything, else block-wise or token-wise random spans.
Selection random_selection(const AttnCase& c, std::mt19937& rng) {
  Selection s;
  for (int h = 0; h < c.n_kv_heads; ++h) {
    const uint32_t kind = rng() % 8;
    if (kind == 0) {
      s.spans.emplace_back();
    } else if (kind == 1) {
      s.spans.push_back({{0, c.n_tokens}});
    } else if (kind < 5) {
      s.spans.push_back(random_block_spans(c.n_tokens, c.block_size, rng));
    } else {
      s.spans.push_back(random_token_spans(c.n_tokens, c.block_size, rng));
    }
  }
  return s;
}

Selection full_selection(const AttnCase& c) {
  Selection s;
  s.spans.assign(size_t(c.n_kv_heads), c.n_tokens > 0 ? std::vector<TokenSpan>{{0, c.n_tokens}}
                                                      : std::vector<TokenSpan>{});
  return s;
}

// ---- running and checking ---------------------------------------------------------

struct Result {
  std::vector<float> out, lse;
};

// out and lse start as NaN so that an element the kernel does not write fails.
Result run_decode(const AttnStore& s, const std::vector<float>& q, const Selection& selection,
                  const DecodeAttentionParams& params = {}) {
  const AttnCase& c = s.config();
  Result r;
  r.out.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
  r.lse.assign(size_t(c.n_q_heads()), std::numeric_limits<float>::quiet_NaN());
  decode_attention(s.store(), AttnStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                   selection, params, make_mutable_view(r.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                   make_mutable_view(r.lse.data(), DType::kF32, {c.n_q_heads()}));
  return r;
}

Result run_dense(const AttnStore& s, const std::vector<float>& q, const DecodeAttentionParams& params = {}) {
  const AttnCase& c = s.config();
  Result r;
  r.out.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
  r.lse.assign(size_t(c.n_q_heads()), std::numeric_limits<float>::quiet_NaN());
  dense_decode_attention(s.store(), AttnStore::kLayer,
                         make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}), params,
                         make_mutable_view(r.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
                         make_mutable_view(r.lse.data(), DType::kF32, {c.n_q_heads()}));
  return r;
}

bool bitwise_equal(const Result& a, const Result& b) {
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

// Error bound of an fp32 kernel against the fp64 reference for one query head
// over n tokens, with u = 2^-24, A = ref.max_logit_terms, V = ref.max_abs_value:
//  - score: q times the scale (1 rounding), then head_dim products summed by
//    FMA (head_dim roundings): |ds| <= (head_dim + 1) u A; 0 with exact_logits
//    (tests whose logits are exact f32 products);
//  - p = exp(s - m): s and m each off by ds, the subtraction rounds
//    (|s - m| <= 2A), exp is within 1 ulp: relative error of p within
//    delta = 2 ds + 2uA + 2u;
//  - out = sum p v / sum p: the weights p / sum p are off by 2 delta relative;
//    each sum takes at most n + 8 roundings (accumulation, rescales of the
//    running max, normalization, merges of flash-decoding pieces), so
//    |d out| <= V (2 delta + 2 (n + 8) u);
//  - lse = m + log(l): |d lse| <= ds + delta + (n + 8) u + u |lse|.
// These are first-order bounds: the factor 2 below covers the higher orders.
struct Bounds {
  double out = 0, lse = 0;
};

Bounds error_bounds(const attention_ref::Attention& ref, int head_dim, int64_t n, bool exact_logits) {
  const double a = ref.max_logit_terms;
  const double ds = exact_logits ? 0.0 : (head_dim + 1) * kU * a;
  const double delta = 2 * ds + 2 * kU * a + 2 * kU;
  const double rounding = double(n + 8) * kU;
  Bounds b;
  b.out = 2 * ref.max_abs_value * (2 * delta + 2 * rounding);
  b.lse = 2 * (ds + delta + rounding + kU * std::abs(ref.lse));
  return b;
}

// The query the kernel attends with over q8_0 keys: q times the (f32) scale,
// quantized per 32 channels as quant_matmul.h quantizes activations (checked
// in quant_matmul_test.cpp), dequantized; the scale is then in it.
std::vector<float> q8_query(const std::vector<float>& q, int head_dim, float scale) {
  std::vector<float> scaled(q.size());
  for (size_t i = 0; i < q.size(); ++i) scaled[i] = q[i] * scale;
  QuantizedActs acts;
  quantize_acts(scaled.data(), int64_t(q.size()) / head_dim, head_dim, head_dim, kvstore::kQ8Group, acts);
  for (size_t i = 0; i < q.size(); ++i) scaled[i] = float(acts.q[i]) * acts.d[i / kvstore::kQ8Group];
  return scaled;
}

// Every query head of r against the reference over its kv head's selected
// tokens. scale is the kernel's f32 scale.
void expect_matches_reference(const AttnStore& s, const std::vector<float>& q_in, const Selection& selection,
                              const Result& r, double scale_in, bool exact_logits = false) {
  const AttnCase& c = s.config();
  const bool q8 = c.kv_type == DType::kQ8_0;
  const std::vector<float> q = q8 ? q8_query(q_in, c.head_dim, float(scale_in)) : q_in;
  const double scale = q8 ? 1.0 : scale_in;
  for (int qh = 0; qh < c.n_q_heads(); ++qh) {
    const int h = qh / c.g;
    SCOPED_TRACE(::testing::Message() << "query head " << qh << " (kv head " << h << ")");
    const std::vector<int64_t> tokens = attention_ref::tokens_of(selection.spans[size_t(h)]);
    const auto ref = attention_ref::attend(q.data() + size_t(qh) * c.head_dim, scale, s.head(h), tokens);
    const float* out = r.out.data() + size_t(qh) * c.head_dim;
    if (tokens.empty()) {
      ASSERT_EQ(r.lse[size_t(qh)], -kInf);
      for (int ch = 0; ch < c.head_dim; ++ch) ASSERT_EQ(out[ch], 0.f) << "channel " << ch;
      continue;
    }
    Bounds bounds = error_bounds(ref, c.head_dim, int64_t(tokens.size()), exact_logits);
    // q8_0 on AVX512-VNNI: P.V's weights rounded to 16 bits per chunk (attention_kernel.h).
    if (q8) bounds.out += 2 * (double(detail::kQ8VnniChunk) / 131070) * ref.max_abs_value;
    ASSERT_TRUE(std::isfinite(r.lse[size_t(qh)])) << r.lse[size_t(qh)];
    ASSERT_NEAR(r.lse[size_t(qh)], ref.lse, bounds.lse);
    for (int ch = 0; ch < c.head_dim; ++ch) {
      ASSERT_TRUE(std::isfinite(out[ch])) << "channel " << ch << ": " << out[ch];
      ASSERT_NEAR(out[ch], ref.out[size_t(ch)], bounds.out) << "channel " << ch;
    }
  }
}

// The kernel's default scale, as it computes it in f32.
double default_scale(const AttnCase& c) { return 1.f / std::sqrt(float(c.head_dim)); }

// ---- Highway targets ----------------------------------------------------------------

// Every target compiled in and supported by this CPU (AVX3_DL, AVX3, AVX2,
// SSE4, SSSE3, the scalar fallback, ... as available).
std::vector<int64_t> targets_under_test() { return hwy::SupportedAndGeneratedTargets(); }

TEST(DecodeAttention, TargetsUnderTestCoverEveryPathThisCpuRuns) {
  const std::vector<int64_t> targets = targets_under_test();
  auto has = [&](int64_t t) { return std::find(targets.begin(), targets.end(), t) != targets.end(); };
  std::string names;
  for (int64_t t : targets) names += str_cat(hwy::TargetName(t), " ");
  SCOPED_TRACE(names);
  EXPECT_TRUE(has(HWY_SCALAR) || has(HWY_EMU128));
  if (hwy::SupportedTargets() & HWY_SSE4) {
    EXPECT_TRUE(has(HWY_SSE4));
  }
  if (hwy::SupportedTargets() & HWY_AVX2) {
    EXPECT_TRUE(has(HWY_AVX2));
  }
  if (hwy::SupportedTargets() & HWY_AVX3) {
    EXPECT_TRUE(has(HWY_AVX3));
  }
}

// ---- tests --------------------------------------------------------------------------

// Lengths around the block size: 1, block_size - 1, block_size, block_size + 1,
// odd, prime, many blocks with a partial last one.
std::vector<int64_t> lengths_for(int block_size) {
  auto is_prime = [](int64_t n) {
    if (n < 2) return false;
    for (int64_t d = 2; d * d <= n; ++d)
      if (n % d == 0) return false;
    return true;
  };
  int64_t prime = 3 * int64_t(block_size) + 2;
  while (!is_prime(prime)) ++prime;
  std::set<int64_t> lengths = {1, block_size, block_size + 1, 2 * int64_t(block_size) + 3, prime,
                               17 * int64_t(block_size) + 5};
  if (block_size > 1) lengths.insert(block_size - 1);
  return {lengths.begin(), lengths.end()};
}

TEST(DecodeAttention, RandomShapesAndSelectionsOnEveryTargetMatchReference) {
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0};
  const int block_sizes[] = {1, 6, 16, 64, 128};  // 1 and 6: q8_0 value quads padded past the block
  const int head_dims[] = {64, 128, 256};
  const int groups[] = {1, 2, 4, 8, 3, 5};
  const std::vector<int64_t> targets = targets_under_test();
  std::mt19937 rng(test_seed(2024));
  int index = 0;
  for (DType dtype : dtypes) {
    for (int block_size : block_sizes) {
      for (int64_t n : lengths_for(block_size)) {
        AttnCase c;
        c.kv_type = dtype;
        c.block_size = block_size;
        c.head_dim = head_dims[index % 3];
        c.n_kv_heads = 1 + index % 2;
        c.g = groups[(index / 3) % 6];
        c.n_tokens = n;
        ++index;
        SCOPED_TRACE(c.describe());
        const AttnStore s(c, random_kv(c, rng), rng);
        const std::vector<float> q = random_q(c, rng);
        const Selection selection = random_selection(c, rng);
        for (int64_t target : targets) {
          SCOPED_TRACE(hwy::TargetName(target));
          const ForcedHighwayTarget forced(target);
          expect_matches_reference(s, q, selection, run_decode(s, q, selection), default_scale(c));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// q8_0 P.V on the AVX-512 and AVX2 code takes the integer kernels of
// attention_q8_vnni.cpp or attention_q8_avx_vnni.cpp where the CPU has them
// (checked against the reference above with every target); their 16-bit
// weights give other bits than the SSE4 code's f32 ones, which shows that
// they are the ones that ran.
TEST(DecodeAttention, Q8IntegerKernelsRunWhereTheCpuHasThem) {
  if (!detail::has_q8_vnni_kernels() && !detail::has_q8_avx_vnni_kernels()) {
    GTEST_SKIP() << "no AVX512-VNNI or AVX-VNNI here: q8_0 P.V widens codes to f32";
  }
  const std::vector<int64_t> targets = targets_under_test();
  const auto has = [&](int64_t target) { return std::find(targets.begin(), targets.end(), target) != targets.end(); };
  if (!has(HWY_SSE4)) GTEST_SKIP() << "needs the SSE4 Highway target to compare with";
  std::mt19937 rng(test_seed(41));
  const AttnCase c{DType::kQ8_0, 64, 128, 2, 4, 64 * 9 + 13};
  const AttnStore s(c, random_kv(c, rng), rng);
  const std::vector<float> q = random_q(c, rng);
  const auto dense_on = [&](int64_t target) {
    const ForcedHighwayTarget forced(target);
    return run_dense(s, q);
  };
  const Result widened = dense_on(HWY_SSE4);
  int compared = 0;
  for (const int64_t target : {HWY_AVX3, HWY_AVX2}) {
    // AVX2 code takes integer P.V only with AVX-VNNI.
    if (!has(target) || (target == HWY_AVX2 && !detail::has_q8_avx_vnni_kernels())) continue;
    SCOPED_TRACE(hwy::TargetName(target));
    const Result integer = dense_on(target);
    expect_matches_reference(s, q, full_selection(c), integer, default_scale(c));
    EXPECT_FALSE(bitwise_equal(integer, widened));
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "no AVX3 or AVX2 Highway target here";
}

TEST(DecodeAttention, FullSelectionEqualsDense) {
  std::mt19937 rng(test_seed(5));
  const AttnCase cases[] = {
      {DType::kF16, 16, 64, 2, 4, 16 * 9 + 7},
      {DType::kBF16, 64, 128, 1, 8, 64 * 5},
      {DType::kF32, 128, 256, 2, 2, 128 * 3 + 1},
      {DType::kF16, 1, 128, 2, 3, 37},
      {DType::kBF16, 16, 40, 2, 5, 16 * 7 + 3},  // head_dim not a multiple of the vector width
      {DType::kQ8_0, 32, 96, 2, 4, 32 * 6 + 9},  // q8_0 with 3 groups of 32 channels (not a power of two)
      {DType::kQ8_0, 128, 512, 1, 2, 128 * 2 + 77},  // the largest head_dim, 16 groups
  };
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const AttnStore s(c, random_kv(c, rng), rng);
    const std::vector<float> q = random_q(c, rng);
    const Selection full = full_selection(c);
    Selection per_block;  // the same tokens as one span per block
    per_block.spans.resize(size_t(c.n_kv_heads));
    for (auto& spans : per_block.spans)
      for (int64_t b0 = 0; b0 < c.n_tokens; b0 += c.block_size)
        spans.push_back({b0, std::min<int64_t>(c.n_tokens, b0 + c.block_size)});

    for (int64_t target : targets_under_test()) {
      SCOPED_TRACE(hwy::TargetName(target));
      const ForcedHighwayTarget forced(target);
      const Result dense = run_dense(s, q);
      expect_matches_reference(s, q, full, dense, default_scale(c));
      EXPECT_TRUE(bitwise_equal(run_decode(s, q, full), dense));
      expect_matches_reference(s, q, per_block, run_decode(s, q, per_block), default_scale(c));
    }
  }
}

TEST(DecodeAttention, SplitSizesAgreeAndThreadCountDoesNotChangeTheResult) {
  std::mt19937 rng(test_seed(17));
  const AttnCase c{DType::kF16, 64, 128, 2, 4, 64 * 20 + 29};
  const AttnStore s(c, random_kv(c, rng), rng);
  const std::vector<float> q = random_q(c, rng);
  Selection selection;
  selection.spans = {random_token_spans(c.n_tokens, c.block_size, rng), {{0, c.n_tokens}}};
  for (int64_t split : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{17}, int64_t{63}, int64_t{64}, int64_t{100},
                        int64_t{129}, int64_t{1000}, int64_t{1} << 40}) {
    SCOPED_TRACE(::testing::Message() << "split_tokens " << split);
    DecodeAttentionParams params;
    params.split_tokens = split;
    const Result r = run_decode(s, q, selection, params);
    expect_matches_reference(s, q, selection, r, default_scale(c));
    for (size_t threads : {1, 2, 3}) {
      const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
      EXPECT_TRUE(bitwise_equal(run_decode(s, q, selection, params), r)) << threads << " threads";
    }
  }
}

// HeadwiseDecodeAttention: heads attended one by one, in a shuffled order and
// concurrently, give decode_attention's bits over the same spans (heads of
// very different lengths and empty heads included, explicit and default
// splits, 1 and 3 threads), and a head it refuses leaves every row unwritten.
TEST(DecodeAttention, HeadByHeadEqualsTheWholeSelectionBitForBit) {
  std::mt19937 rng(test_seed(29));
  const AttnCase cases[] = {
      {DType::kF16, 64, 128, 4, 4, 64 * 40 + 29},
      {DType::kQ8_0, 32, 64, 8, 2, 32 * 70 + 5},
      {DType::kBF16, 16, 256, 3, 1, 16 * 90 + 1},
      {DType::kF32, 128, 128, 2, 8, 128 * 20},
  };
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const AttnStore s(c, random_kv(c, rng), rng);
    const std::vector<float> q = random_q(c, rng);
    Selection selection;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      if (h == 1) selection.spans.push_back({});                    // nothing selected
      else if (h == 0) selection.spans.push_back({{0, c.n_tokens}});  // every token: many pieces
      else selection.spans.push_back(random_token_spans(c.n_tokens, c.block_size, rng));
    }
    for (int64_t split : {int64_t{0}, int64_t{37}, int64_t{256}}) {
      SCOPED_TRACE(::testing::Message() << "split_tokens " << split);
      DecodeAttentionParams params;
      params.split_tokens = split;
      const Result whole = run_decode(s, q, selection, params);
      expect_matches_reference(s, q, selection, whole, default_scale(c));
      std::vector<int> order(size_t(c.n_kv_heads));
      for (int h = 0; h < c.n_kv_heads; ++h) order[size_t(h)] = h;
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t threads : {1, 3}) {
        const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
        Result r;
        r.out.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
        r.lse.assign(size_t(c.n_q_heads()), std::numeric_limits<float>::quiet_NaN());
        const HeadwiseDecodeAttention attention(
            s.store(), AttnStore::kLayer, make_view(q.data(), DType::kF32, {c.n_q_heads(), c.head_dim}), params,
            make_mutable_view(r.out.data(), DType::kF32, {c.n_q_heads(), c.head_dim}),
            make_mutable_view(r.lse.data(), DType::kF32, {c.n_q_heads()}));
        tbb::parallel_for(size_t{0}, order.size(), [&](size_t i) {
          attention.attend_head(order[i], selection.spans[size_t(order[i])]);
        });
        EXPECT_TRUE(bitwise_equal(r, whole)) << threads << " threads";
      }
    }
  }

  const AttnCase c{DType::kF16, 16, 64, 2, 2, 50};
  const AttnStore s(c, random_kv(c, rng), rng);
  std::vector<float> q = random_q(c, rng), out(q.size(), 9.f), lse(4, 9.f);
  const HeadwiseDecodeAttention attention(s.store(), AttnStore::kLayer, make_view(q.data(), DType::kF32, {4, 64}),
                                          {}, make_mutable_view(out.data(), DType::kF32, {4, 64}),
                                          make_mutable_view(lse.data(), DType::kF32, {4}));
  const std::pair<int, std::vector<TokenSpan>> refused[] = {
      {2, {{0, 10}}}, {-1, {{0, 10}}}, {0, {{0, 51}}}, {1, {{0, 10}, {5, 12}}}, {1, {{4, 4}}}};
  for (const auto& [head, spans] : refused) {
    SCOPED_TRACE(::testing::Message() << "kv head " << head);
    try {
      attention.attend_head(head, spans);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("kv head " + std::to_string(head)), std::string::npos) << e.what();
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 9.f; }));
    EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == 9.f; }));
  }
}

// Tokens outside the selection have keys aligned with q (large logits) and
// huge values, and the zero slots past the last filled token would score 0
// while every selected logit is about -34: reading any of them moves out far
// from the reference over the selected tokens.
TEST(DecodeAttention, ReadsOnlySelectedTokens) {
  std::mt19937 rng(test_seed(23));
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    const AttnCase c{dtype, 64, 128, 2, 2, 64 * 15 + 21};
    SCOPED_TRACE(c.describe());
    Selection selection;
    selection.spans = {random_token_spans(c.n_tokens, c.block_size, rng),
                       random_block_spans(c.n_tokens, c.block_size, rng)};
    for (auto& spans : selection.spans) spans.push_back({c.n_tokens - 5, c.n_tokens});  // the partial block's end
    for (auto& spans : selection.spans) {
      std::sort(spans.begin(), spans.end(), [](TokenSpan a, TokenSpan b) { return a.begin < b.begin; });
      std::vector<TokenSpan> merged;
      for (TokenSpan span : spans) {
        if (!merged.empty() && span.begin <= merged.back().end) {
          merged.back().end = std::max(merged.back().end, span.end);
        } else {
          merged.push_back(span);
        }
      }
      spans = merged;
    }
    RawKV kv;
    for (int64_t t = 0; t < c.n_tokens; ++t)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const auto tokens = attention_ref::tokens_of(selection.spans[size_t(h)]);
        const bool selected = std::binary_search(tokens.begin(), tokens.end(), t);
        for (int ch = 0; ch < c.head_dim; ++ch) {
          kv.k.push_back(selected ? -3.f + 0.1f * normal(rng) : 3.f);
          kv.v.push_back(selected ? 5.f + normal(rng) : 1000.f);
        }
      }
    const AttnStore s(c, kv, rng);
    const std::vector<float> q(size_t(c.n_q_heads()) * c.head_dim, 1.f);
    for (int64_t target : targets_under_test()) {
      SCOPED_TRACE(hwy::TargetName(target));
      const ForcedHighwayTarget forced(target);
      for (int64_t split : {0, 7, 100}) {
        DecodeAttentionParams params;
        params.split_tokens = split;
        expect_matches_reference(s, q, selection, run_decode(s, q, selection, params), default_scale(c));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(DecodeAttention, EmptySelectionsAndEmptyLayersGiveZeroAndMinusInfinity) {
  std::mt19937 rng(test_seed(29));
  AttnCase c{DType::kF16, 16, 64, 2, 4, 40};
  const AttnStore s(c, random_kv(c, rng), rng);
  const std::vector<float> q = random_q(c, rng);
  Selection none;
  none.spans.resize(2);
  expect_matches_reference(s, q, none, run_decode(s, q, none), default_scale(c));
  Selection one;  // kv head 0 empty, kv head 1 one token
  one.spans = {{}, {{39, 40}}};
  expect_matches_reference(s, q, one, run_decode(s, q, one), default_scale(c));

  c.n_tokens = 0;  // layer 1 holds nothing
  const AttnStore empty(c, random_kv(c, rng), rng);
  expect_matches_reference(empty, q, full_selection(c), run_dense(empty, q), default_scale(c));
}

// Logits of about +1e4 and -1e4 (scale 1, q = 1e4 e_0, key channel 0 a multiple
// of 1/8: exact f32 logits), keys of norm 1e3 times the others, identical keys:
// finite results that match the reference, on every target.
TEST(DecodeAttention, HardLogitsNeverMakeNaN) {
  std::mt19937 rng(test_seed(31));
  std::normal_distribution<float> normal;
  const AttnCase c{DType::kF16, 16, 64, 2, 2, 16 * 6 + 5};
  const int64_t row = int64_t(c.n_kv_heads) * c.head_dim;
  std::vector<float> q_axis(size_t(c.n_q_heads()) * c.head_dim, 0.f);
  for (int qh = 0; qh < c.n_q_heads(); ++qh) q_axis[size_t(qh) * c.head_dim] = 1e4f;

  struct Workload {
    const char* name;
    RawKV kv;
    std::vector<float> q;
    float scale;
    bool exact_logits;
  };
  std::vector<Workload> workloads;
  for (int sign : {1, -1}) {
    Workload w{sign > 0 ? "logits up to +1e4" : "logits down to -1e4", random_kv(c, rng), q_axis, 1.f, true};
    std::uniform_int_distribution<int> eighths(sign > 0 ? -8 : 4, 8);  // -1e4: channel 0 in [0.5, 1]
    for (int64_t t = 0; t < c.n_tokens; ++t)
      for (int h = 0; h < c.n_kv_heads; ++h) w.kv.k[size_t(t * row + h * c.head_dim)] = sign * eighths(rng) / 8.f;
    workloads.push_back(w);
  }
  {
    Workload w{"sink keys of 1e3 x the norm", random_kv(c, rng), random_q(c, rng), 0.f, false};
    for (size_t i = 0; i < size_t(3 * row); ++i) w.kv.k[i] *= 1e3f;
    workloads.push_back(w);
  }
  {
    Workload w{"identical keys", random_kv(c, rng), random_q(c, rng), 0.f, false};
    for (int64_t t = 1; t < c.n_tokens; ++t) std::copy_n(w.kv.k.begin(), row, w.kv.k.begin() + t * row);
    workloads.push_back(w);
  }
  for (const Workload& w : workloads) {
    SCOPED_TRACE(w.name);
    const AttnStore s(c, w.kv, rng);
    Selection selection;
    selection.spans = {{{0, c.n_tokens}}, random_token_spans(c.n_tokens, c.block_size, rng)};
    for (int64_t target : targets_under_test()) {
      SCOPED_TRACE(hwy::TargetName(target));
      const ForcedHighwayTarget forced(target);
      for (int64_t split : {0, 13}) {
        DecodeAttentionParams params;
        params.scale = w.scale;
        params.split_tokens = split;
        const double scale = w.scale != 0.f ? w.scale : default_scale(c);
        expect_matches_reference(s, w.q, selection, run_decode(s, w.q, selection, params), scale, w.exact_logits);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// One kv head, a long context: many flash-decoding pieces merged.
TEST(DecodeAttention, LongContextOneKvHead) {
  std::mt19937 rng(test_seed(37));
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const AttnCase c{dtype, 128, 128, 1, 8, 20000};
    SCOPED_TRACE(c.describe());
    const AttnStore s(c, random_kv(c, rng), rng);
    const std::vector<float> q = random_q(c, rng);
    expect_matches_reference(s, q, full_selection(c), run_dense(s, q), default_scale(c));
    Selection sparse;
    sparse.spans = {random_block_spans(c.n_tokens, c.block_size, rng)};
    expect_matches_reference(s, q, sparse, run_decode(s, q, sparse), default_scale(c));
  }
}

// q and out with padded rows, a custom scale: only the rows' first head_dim
// elements are read and written.
TEST(DecodeAttention, StridedViewsAndCustomScale) {
  std::mt19937 rng(test_seed(41));
  const AttnCase c{DType::kBF16, 16, 64, 2, 3, 16 * 4 + 9};
  const AttnStore s(c, random_kv(c, rng), rng);
  const std::vector<float> q = random_q(c, rng);
  const int q_row = c.head_dim + 8, out_row = c.head_dim + 4;
  std::vector<float> q_padded(size_t(c.n_q_heads()) * q_row, std::numeric_limits<float>::quiet_NaN());
  for (int qh = 0; qh < c.n_q_heads(); ++qh)
    std::copy_n(q.begin() + qh * c.head_dim, c.head_dim, q_padded.begin() + qh * q_row);
  TensorView q_view = make_view(q_padded.data(), DType::kF32, {c.n_q_heads(), c.head_dim});
  q_view.strides[0] = q_row;
  std::vector<float> out_padded(size_t(c.n_q_heads()) * out_row, -7.f), lse(size_t(c.n_q_heads()));
  MutableTensorView out_view = make_mutable_view(out_padded.data(), DType::kF32, {c.n_q_heads(), c.head_dim});
  out_view.strides[0] = out_row;

  const Selection selection = random_selection(c, rng);
  DecodeAttentionParams params;
  params.scale = 0.05f;
  decode_attention(s.store(), AttnStore::kLayer, q_view, selection, params, out_view,
                   make_mutable_view(lse.data(), DType::kF32, {c.n_q_heads()}));
  Result r;
  r.lse = lse;
  for (int qh = 0; qh < c.n_q_heads(); ++qh) {
    r.out.insert(r.out.end(), out_padded.begin() + qh * out_row, out_padded.begin() + qh * out_row + c.head_dim);
    for (int i = c.head_dim; i < out_row; ++i) EXPECT_EQ(out_padded[size_t(qh * out_row + i)], -7.f);
  }
  expect_matches_reference(s, q, selection, r, double(0.05f));
}

TEST(DecodeAttention, RejectsBadArgumentsNamingThem) {
  std::mt19937 rng(test_seed(43));
  const AttnCase c{DType::kF16, 16, 64, 2, 2, 50};
  const AttnStore s(c, random_kv(c, rng), rng);
  std::vector<float> q = random_q(c, rng), out(q.size(), 9.f), lse(4, 9.f);
  std::vector<uint16_t> half(q.size());
  const TensorView qv = make_view(q.data(), DType::kF32, {4, 64});
  const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {4, 64});
  const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {4});
  const Selection ok = full_selection(c);

  auto expect_invalid = [&](const char* needle, auto&& call) {
    try {
      call();
      ADD_FAILURE() << needle << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "'" << needle << "' not in: " << e.what();
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 9.f; })) << needle << ": out written";
  };
  auto decode = [&](int layer, const TensorView& qq, const Selection& sel, const DecodeAttentionParams& p,
                    const MutableTensorView& oo, const MutableTensorView& ll) {
    return [&s, layer, qq, sel, p, oo, ll] { decode_attention(s.store(), layer, qq, sel, p, oo, ll); };
  };
  const DecodeAttentionParams defaults;
  expect_invalid("layer 2", decode(2, qv, ok, defaults, ov, lv));
  expect_invalid("layer -1", decode(-1, qv, ok, defaults, ov, lv));
  expect_invalid("decode_attention q", decode(1, make_view(half.data(), DType::kF16, {4, 64}), ok, defaults, ov, lv));
  expect_invalid("decode_attention q", decode(1, make_view(q.data(), DType::kF32, {2, 128}), ok, defaults, ov, lv));
  expect_invalid("decode_attention q", decode(1, make_view(q.data(), DType::kF32, {256}), ok, defaults, ov, lv));
  expect_invalid("multiple", decode(1, make_view(q.data(), DType::kF32, {3, 64}), ok, defaults,
                                    make_mutable_view(out.data(), DType::kF32, {3, 64}),
                                    make_mutable_view(lse.data(), DType::kF32, {3})));
  const MutableTensorView out_short = make_mutable_view(out.data(), DType::kF32, {2, 64});
  const MutableTensorView out_f16 = make_mutable_view(out.data(), DType::kF16, {4, 64});
  const MutableTensorView lse_short = make_mutable_view(lse.data(), DType::kF32, {3});
  const MutableTensorView lse_bf16 = make_mutable_view(lse.data(), DType::kBF16, {4});
  expect_invalid("decode_attention out", decode(1, qv, ok, defaults, out_short, lv));
  expect_invalid("decode_attention out", decode(1, qv, ok, defaults, out_f16, lv));
  expect_invalid("decode_attention lse", decode(1, qv, ok, defaults, ov, lse_short));
  expect_invalid("decode_attention lse", decode(1, qv, ok, defaults, ov, lse_bf16));
  DecodeAttentionParams bad_scale;
  bad_scale.scale = std::numeric_limits<float>::quiet_NaN();
  expect_invalid("scale", decode(1, qv, ok, bad_scale, ov, lv));
  std::vector<float> q_nan(q);
  q_nan[64 + 5] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid("decode_attention q: element [1, 5] is nan",
                 decode(1, make_view(q_nan.data(), DType::kF32, {4, 64}), ok, defaults, ov, lv));
  bad_scale.scale = -0.125f;  // refused as prefill_attention and the policies refuse it
  expect_invalid("scale: -0.125 must be finite and >= 0", decode(1, qv, ok, bad_scale, ov, lv));
  DecodeAttentionParams bad_split;
  bad_split.split_tokens = -1;
  expect_invalid("split_tokens", decode(1, qv, ok, bad_split, ov, lv));

  Selection one_head;
  one_head.spans = {{{0, 10}}};
  expect_invalid("selection", decode(1, qv, one_head, defaults, ov, lv));
  const std::vector<std::vector<TokenSpan>> bad_spans[] = {
      {{{5, 3}}, {}},             // reversed
      {{{4, 4}}, {}},             // empty
      {{}, {{-1, 2}}},            // before the first token
      {{{0, 51}}, {}},            // past the last token
      {{{0, 10}, {5, 12}}, {}},   // overlapping
      {{{10, 12}, {0, 5}}, {}},   // unsorted
  };
  for (const auto& spans : bad_spans) {
    Selection bad;
    bad.spans = spans;
    expect_invalid("span", decode(1, qv, bad, defaults, ov, lv));
  }
  expect_invalid("layer 5", [&] { dense_decode_attention(s.store(), 5, qv, defaults, ov, lv); });
}

}  // namespace
}  // namespace longctx::cpu
