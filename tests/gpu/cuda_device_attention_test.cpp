// The CUDA backend's DeviceAttention (core/backend.h) against an fp64
// attention reference written here: layer-major prefill over several chunks
// (with a history), the chunk K/V copied to the host, decode local window +
// merge with a CPU part; argument and budget errors. And the issue's
// end-to-end check: Sequence over a generated model gives the same logits on
// the CUDA backend as on the CPU backend. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/model/gguf.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"
#include "longctx/tools/test_model.h"
#include "scheduler/sequence_fixture.h"
#include "test_seed.h"

namespace longctx::gpu {
namespace {

using namespace longctx::gpu::testing;
using Shape = DeviceAttention::Shape;

// Attention of query rows over key ranges, fp64, from the values the device
// holds (q, K and V rounded to kv_dtype, as attention.h documents).
struct Reference {
  std::vector<double> out;  // [n, n_heads, head_dim]
  std::vector<double> lse;  // [n, n_heads]
  double max_abs_v = 0.0;
};

// Row i attends keys [lo[i], hi[i]) of k/v [*, n_kv_heads, head_dim].
Reference attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                 const Shape& s, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  const int64_t n = int64_t(lo.size()), d = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(d));
  Reference r;
  r.out.assign(size_t(n * s.n_heads * d), 0.0);
  r.lse.assign(size_t(n * s.n_heads), -std::numeric_limits<double>::infinity());
  for (float x : v) r.max_abs_v = std::max(r.max_abs_v, double(std::abs(x)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kh = h / group;
      const float* qi = &q[size_t((i * s.n_heads + h) * d)];
      std::vector<double> scores;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = lo[size_t(i)]; j < hi[size_t(i)]; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += double(qi[c]) * k[size_t((j * s.n_kv_heads + kh) * d + c)];
        scores.push_back(dot * scale);
        m = std::max(m, scores.back());
      }
      if (scores.empty()) continue;
      double sum = 0.0;
      double* o = &r.out[size_t((i * s.n_heads + h) * d)];
      for (size_t t = 0; t < scores.size(); ++t) {
        const double p = std::exp(scores[t] - m);
        sum += p;
        const int64_t j = lo[size_t(i)] + int64_t(t);
        for (int64_t c = 0; c < d; ++c) o[c] += p * v[size_t((j * s.n_kv_heads + kh) * d + c)];
      }
      for (int64_t c = 0; c < d; ++c) o[c] /= sum;
      r.lse[size_t(i * s.n_heads + h)] = m + std::log(sum);
    }
  return r;
}

// The kernels round P to kv_dtype before P.V (u_kv max|v|, once more for
// safety) and form scores in fp32 from rounded inputs (4e-4 covers
// gamma_d sum|q k| scale for unit-normal data up to head_dim 256).
std::vector<double> attention_bound(const Reference& r, DType kv_dtype) {
  return std::vector<double>(r.out.size(), (2.0 * unit_roundoff(kv_dtype) + 4e-4) * r.max_abs_v);
}

std::vector<float> concat(std::vector<float> a, const std::vector<float>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class CudaDeviceAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { LONGCTX_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Prefills `layer` with `history` tokens then chunks of the given sizes,
// checking every chunk's output and K/V copy; returns all K/V (f32, unrounded).
// pinned_history: the history goes in through history_buffer() (kv_dtype,
// uploaded without blocking) instead of f32 host vectors.
void prefill_and_check(Backend& backend, const Shape& s, int layer, int64_t history, const std::vector<int64_t>& chunks,
                       std::mt19937& rng, std::vector<float>& all_k, std::vector<float>& all_v,
                       bool pinned_history = false) {
  DeviceAttention& da = *backend.device_attention();
  const int64_t kv_row = int64_t(s.n_kv_heads) * s.head_dim, q_row = int64_t(s.n_heads) * s.head_dim;
  all_k = random_values(rng, history * kv_row);
  all_v = random_values(rng, history * kv_row);
  if (pinned_history) {
    const DeviceAttention::HostKVBuffer h = da.history_buffer(history);
    ASSERT_EQ(h.k.numel(), history * kv_row);
    convert(all_k.data(), DType::kF32, h.k.data, s.kv_dtype, all_k.size());
    convert(all_v.data(), DType::kF32, h.v.data, s.kv_dtype, all_v.size());
    da.begin_prefill_layer(layer, as_const(h.k), as_const(h.v));
  } else {
    da.begin_prefill_layer(layer, make_view(all_k.data(), DType::kF32, {history, s.n_kv_heads, s.head_dim}),
                           make_view(all_v.data(), DType::kF32, {history, s.n_kv_heads, s.head_dim}));
  }
  int64_t first = history;
  for (int64_t n : chunks) {
    const std::string what = str_cat(dtype_name(s.kv_dtype), " heads ", s.n_heads, ":", s.n_kv_heads, " d ",
                                     s.head_dim, " layer ", layer, " chunk at ", first, " of ", n);
    const std::vector<float> q = random_values(rng, n * q_row);
    const std::vector<float> k = random_values(rng, n * kv_row), v = random_values(rng, n * kv_row);
    auto qt = upload(backend, q, {n, q_row});
    auto kt = upload(backend, k, {n, kv_row});
    auto vt = upload(backend, v, {n, kv_row});
    auto out = backend.alloc({n, q_row});
    da.prefill_chunk(layer, first, *qt, *kt, *vt, *out);
    const DeviceAttention::HostKV host = da.chunk_kv();
    ASSERT_EQ(host.k.numel(), n * kv_row) << what;
    ASSERT_EQ(host.k.dtype, s.kv_dtype) << what;
    const std::vector<float> kr = rounded(k, s.kv_dtype), vr = rounded(v, s.kv_dtype);
    for (size_t i = 0; i < kr.size(); ++i) {
      ASSERT_EQ(load_as_f32(host.k.data, s.kv_dtype, i), kr[i]) << what << ": chunk K element " << i;
      ASSERT_EQ(load_as_f32(host.v.data, s.kv_dtype, i), vr[i]) << what << ": chunk V element " << i;
    }
    all_k = concat(all_k, k);
    all_v = concat(all_v, v);
    std::vector<int64_t> lo(static_cast<size_t>(n), 0), hi(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) hi[size_t(i)] = first + i + 1;
    const Reference ref =
        attend(rounded(q, s.kv_dtype), rounded(all_k, s.kv_dtype), rounded(all_v, s.kv_dtype), s, lo, hi);
    expect_within(download(backend, *out), ref.out, attention_bound(ref, s.kv_dtype), what);
    first += n;
  }
}

TEST_F(CudaDeviceAttentionTest, PrefillChunksMatchFp64ReferenceAndCopyTheirKV) {
  std::mt19937 rng(test_seed(21));
  auto backend = make_backend(DType::kBF16);
  struct Heads {
    int n_heads, n_kv_heads, head_dim;
  };
  for (DType kv : {DType::kF16, DType::kBF16})
    for (Heads h : {Heads{4, 2, 64}, Heads{8, 2, 128}, Heads{3, 3, 256}}) {
      Shape s;
      s.n_layers = 2, s.n_heads = h.n_heads, s.n_kv_heads = h.n_kv_heads, s.head_dim = h.head_dim;
      s.kv_dtype = kv, s.max_tokens = 80, s.window = 16, s.initial_len = 4;
      backend->device_attention()->configure(s);
      std::vector<float> k, v;
      prefill_and_check(*backend, s, 1, 5, {7, 16, 1, 33}, rng, k, v);
      prefill_and_check(*backend, s, 0, 0, {70}, rng, k, v);  // the next layer, no history
      // The history through the pinned buffer, twice (the second call waits for the first upload).
      prefill_and_check(*backend, s, 1, 37, {9, 20}, rng, k, v, /*pinned_history=*/true);
      prefill_and_check(*backend, s, 0, 50, {30}, rng, k, v, /*pinned_history=*/true);
    }
  EXPECT_EQ(error_code_of([&] { backend->device_attention()->history_buffer(81); }), ErrorCode::kInvalidArgument);
}

// Decode: the local part (ring of `window` tokens from initial_len on) merged
// with a CPU part over the other tokens equals attention over every token.
void decode_and_check(Backend& backend, const Shape& s, int64_t prompt, int steps, std::mt19937& rng) {
  DeviceAttention& da = *backend.device_attention();
  std::vector<float> all_k, all_v;
  prefill_and_check(backend, s, 0, prompt / 3, {prompt - prompt / 3}, rng, all_k, all_v);
  const int64_t kv_row = int64_t(s.n_kv_heads) * s.head_dim, q_row = int64_t(s.n_heads) * s.head_dim;
  for (int64_t pos = prompt; pos < prompt + steps; ++pos) {
    const std::string what = str_cat(dtype_name(s.kv_dtype), " window ", s.window, " initial ", s.initial_len,
                                     " decode pos ", pos);
    const std::vector<float> q = random_values(rng, q_row);
    const std::vector<float> k = random_values(rng, kv_row), v = random_values(rng, kv_row);
    all_k = concat(all_k, k);
    all_v = concat(all_v, v);
    auto qt = upload(backend, q, {1, q_row});
    auto kt = upload(backend, k, {1, kv_row});
    auto vt = upload(backend, v, {1, kv_row});
    const DeviceAttention::DecodeLocal step = da.decode_local(0, pos, *qt, *kt, *vt);
    // The CPU part: every token the window does not attend (sinks and older).
    const int64_t local_lo = std::min(std::max(s.initial_len, pos + 1 - s.window), pos + 1);
    EXPECT_EQ(step.first_pos, local_lo) << what;
    // The host copies of q/k/v are exact.
    const std::pair<const TensorView*, const std::vector<float>*> copies[] = {{&step.q, &q}, {&step.k, &k}, {&step.v, &v}};
    for (const auto& [got, want] : copies) {
      ASSERT_EQ(got->dtype, DType::kF32) << what;
      ASSERT_EQ(got->numel(), int64_t(want->size())) << what;
      EXPECT_EQ(std::memcmp(got->data, want->data(), want->size() * sizeof(float)), 0) << what;
    }
    const std::vector<float> qr = rounded(q, s.kv_dtype), kr = rounded(all_k, s.kv_dtype),
                             vr = rounded(all_v, s.kv_dtype);
    Reference cpu = attend(qr, kr, vr, s, {0}, {local_lo});
    std::vector<float> cpu_out(cpu.out.begin(), cpu.out.end()), cpu_lse(cpu.lse.begin(), cpu.lse.end());
    auto out = backend.alloc({1, q_row});
    da.decode_merge(0, make_view(cpu_out.data(), DType::kF32, {s.n_heads, s.head_dim}),
                    make_view(cpu_lse.data(), DType::kF32, {s.n_heads}), *out);
    const Reference full = attend(qr, kr, vr, s, {0}, {pos + 1});
    expect_within(download(backend, *out), full.out, attention_bound(full, s.kv_dtype), what);
  }
}

// A layer whose window has seen nothing (after clear() on a loaded store):
// a decode at `from` starts its run there, so the local part covers [from,
// pos] and a CPU part over [0, from) completes it.
void restart_and_check(Backend& backend, const Shape& s, int layer, int64_t from, std::mt19937& rng) {
  DeviceAttention& da = *backend.device_attention();
  const int64_t kv_row = int64_t(s.n_kv_heads) * s.head_dim, q_row = int64_t(s.n_heads) * s.head_dim;
  std::vector<float> all_k = random_values(rng, from * kv_row), all_v = random_values(rng, from * kv_row);
  for (int64_t pos = from; pos < from + 3; ++pos) {
    const std::vector<float> q = random_values(rng, q_row);
    const std::vector<float> k = random_values(rng, kv_row), v = random_values(rng, kv_row);
    all_k = concat(all_k, k);
    all_v = concat(all_v, v);
    auto qt = upload(backend, q, {1, q_row});
    auto kt = upload(backend, k, {1, kv_row});
    auto vt = upload(backend, v, {1, kv_row});
    const int64_t window_lo = std::min(std::max(s.initial_len, pos + 1 - s.window), pos + 1);
    EXPECT_EQ(da.decode_local(layer, pos, *qt, *kt, *vt).first_pos, std::max(window_lo, from))
        << "layer " << layer << " restarted at " << from << ", pos " << pos;
    const std::vector<float> qr = rounded(q, s.kv_dtype), kr = rounded(all_k, s.kv_dtype),
                             vr = rounded(all_v, s.kv_dtype);
    const Reference cpu = attend(qr, kr, vr, s, {0}, {from});
    std::vector<float> cpu_out(cpu.out.begin(), cpu.out.end()), cpu_lse(cpu.lse.begin(), cpu.lse.end());
    auto out = backend.alloc({1, q_row});
    da.decode_merge(layer, make_view(cpu_out.data(), DType::kF32, {s.n_heads, s.head_dim}),
                    make_view(cpu_lse.data(), DType::kF32, {s.n_heads}), *out);
    const Reference full = attend(qr, kr, vr, s, {0}, {pos + 1});
    expect_within(download(backend, *out), full.out, attention_bound(full, s.kv_dtype),
                  str_cat("layer ", layer, " restarted at ", from, ", pos ", pos));
  }
}

TEST_F(CudaDeviceAttentionTest, DecodeLocalMergedWithCpuPartMatchesFullAttention) {
  std::mt19937 rng(test_seed(22));
  auto backend = make_backend(DType::kBF16);
  for (DType kv : {DType::kF16, DType::kBF16}) {
    Shape s;
    s.n_layers = 2, s.n_heads = 8, s.n_kv_heads = 2, s.head_dim = 128, s.kv_dtype = kv;
    s.max_tokens = 96, s.window = 16, s.initial_len = 4;
    backend->device_attention()->configure(s);
    decode_and_check(*backend, s, 40, 20, rng);  // the ring wraps
    restart_and_check(*backend, s, 1, 60, rng);
  }
  Shape s;
  s.n_layers = 1, s.n_heads = 4, s.n_kv_heads = 1, s.head_dim = 64, s.kv_dtype = DType::kF16;
  s.max_tokens = 40, s.window = 8, s.initial_len = 12;
  backend->device_attention()->configure(s);
  decode_and_check(*backend, s, 3, 14, rng);  // positions below initial_len: the local part is empty
  s.window = 0;                               // no local window: the CPU part is everything
  backend->device_attention()->configure(s);
  decode_and_check(*backend, s, 9, 3, rng);
}

TEST_F(CudaDeviceAttentionTest, RejectsBadShapesAndCallsOutOfOrder) {
  auto backend = make_backend(DType::kBF16);
  DeviceAttention& da = *backend->device_attention();
  Shape s;
  s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.max_tokens = 32, s.window = 8;
  auto q = backend->alloc({2, 256});
  auto k = backend->alloc({2, 128});
  EXPECT_EQ(error_code_of([&] { da.prefill_chunk(0, 0, *q, *k, *k, *q); }), ErrorCode::kInvalidArgument);
  for (auto [field, change] : std::vector<std::pair<std::string, std::function<void(Shape&)>>>{
           {"kv_dtype", [](Shape& x) { x.kv_dtype = DType::kF32; }},
           {"head_dim", [](Shape& x) { x.head_dim = 96; }},
           {"n_kv_heads", [](Shape& x) { x.n_kv_heads = 3; }},
           {"window", [](Shape& x) { x.window = 33; }},
       }) {
    Shape bad = s;
    change(bad);
    std::string message;
    EXPECT_EQ(error_code_of([&] { da.configure(bad); }, &message), ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find(field), std::string::npos) << message;
  }
  da.configure(s);
  auto out = backend->alloc({2, 256});
  EXPECT_EQ(error_code_of([&] { da.chunk_kv(); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { da.prefill_chunk(0, 0, *q, *k, *k, *out); }), ErrorCode::kInvalidArgument);
  const TensorView empty = make_view(nullptr, DType::kF32, {0, 2, 64});
  da.begin_prefill_layer(0, empty, empty);
  EXPECT_EQ(error_code_of([&] { da.prefill_chunk(0, 1, *q, *k, *k, *out); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { da.prefill_chunk(1, 0, *q, *k, *k, *out); }), ErrorCode::kInvalidArgument);
  auto k3 = backend->alloc({3, 128});
  EXPECT_EQ(error_code_of([&] { da.prefill_chunk(0, 0, *q, *k3, *k3, *out); }), ErrorCode::kInvalidArgument);
  std::vector<float> wrong(3 * 64);
  EXPECT_EQ(error_code_of([&] {
              da.begin_prefill_layer(0, make_view(wrong.data(), DType::kF32, {1, 3, 64}),
                                     make_view(wrong.data(), DType::kF32, {1, 3, 64}));
            }),
            ErrorCode::kInvalidArgument);
  std::vector<float> cpu_out(256), cpu_lse(4);
  EXPECT_EQ(error_code_of([&] {
              da.decode_merge(0, make_view(cpu_out.data(), DType::kF32, {4, 64}),
                              make_view(cpu_lse.data(), DType::kF32, {4}), *out);
            }),
            ErrorCode::kInvalidArgument);  // no decode_local before
}

TEST_F(CudaDeviceAttentionTest, BudgetsThrowOutOfMemoryAndKeepTheOldState) {
  std::mt19937 rng(test_seed(23));
  // Device: a second configuration beyond the budget leaves the first working.
  auto backend = make_backend(DType::kBF16, 8u << 20, 7168);
  DeviceAttention& da = *backend->device_attention();
  Shape s;
  s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.kv_dtype = DType::kF16;
  s.max_tokens = 64, s.window = 8, s.initial_len = 2;
  da.configure(s);
  Shape huge = s;
  huge.max_tokens = 1 << 20;  // 256 MiB per K
  EXPECT_EQ(error_code_of([&] { da.configure(huge); }), ErrorCode::kOutOfMemory);
  // Pinned: 7 KiB hold the merge staging (1040 bytes), the decode step's q/k/v
  // (2048 bytes) and chunks of up to 3 rows (512 bytes a row), not 16.
  const TensorView empty = make_view(nullptr, DType::kF32, {0, 2, 64});
  da.begin_prefill_layer(0, empty, empty);
  auto q = upload(*backend, random_values(rng, 16 * 256), {16, 256});
  auto k = upload(*backend, random_values(rng, 16 * 128), {16, 128});
  auto out = backend->alloc({16, 256});
  std::string message;
  EXPECT_EQ(error_code_of([&] { da.prefill_chunk(0, 0, *q, *k, *k, *out); }, &message), ErrorCode::kOutOfMemory);
  EXPECT_NE(message.find("pinned"), std::string::npos) << message;
  std::vector<float> kk, vv;
  prefill_and_check(*backend, s, 0, 0, {2, 3, 1}, rng, kk, vv);  // the same layer, from position 0
}

// ---------------------------------------------------------------- Sequence

// Logits of a 40-token prefill in two turns of 24 and 16 (every position) and 4 decode steps.
std::vector<float> run_sequence(Backend& backend, const model::GgufFile& file, const std::vector<int32_t>& tokens) {
  const scheduler::Transformer model = model::load_llama(file, backend);
  // f16 K/V: a dtype the device attention can hold.
  const LongContextConfig config = longctx::testing::every_block_config(DType::kF16);
  scheduler::Sequence seq(backend, model, config, &longctx::testing::topology());
  std::vector<float> logits;
  scheduler::PrefillOptions options;
  options.on_logits = [&](int64_t, int64_t, std::span<const float> l) { logits.insert(logits.end(), l.begin(), l.end()); };
  // Two turns: the second uploads each layer's first 24 tokens back to the device (history_buffer).
  seq.prefill(std::span<const int32_t>(tokens).first(24), options);
  seq.prefill(std::span<const int32_t>(tokens).subspan(24, 16), options);
  for (size_t i = 40; i < tokens.size(); ++i) {
    const std::vector<float> step = seq.decode(tokens[i]);
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

// Tolerance: both engines are fp32 with f16 K/V; the device kernels also
// round q and P to f16 (q rounding moves scores of size ~10 by ~10 u_f16:
// 16 u_f16 per layer), bf16 weights round matmul inputs to bf16 (4 u_bf16
// per layer). Scaled by the largest logit. Gross errors (a wrong position,
// layer or head, an attention scale on one side of the LSE merge only) move
// logits by O(1).
TEST_F(CudaDeviceAttentionTest, SequenceOnGeneratedModelsGivesTheCpuBackendsLogits) {
  std::vector<tools::TestModelSpec> specs;
  for (const char* name : {"gqa-128", "qwen2-bias", "llama3-rope"}) specs.push_back(tools::test_model_by_name(name));
  specs.push_back(tools::test_model_by_name("gqa-128"));
  specs.back().name = "gqa-128 attention.scale";
  specs.back().attn_scale = 0.05f;  // not 1/sqrt(128)
  for (const tools::TestModelSpec& spec : specs) {
    const std::string& name = spec.name;
    const std::vector<uint8_t> bytes = tools::make_test_model(spec).to_bytes();
    const model::GgufFile file = model::GgufFile::from_bytes(bytes, name);
    std::mt19937 rng(test_seed(uint32_t(spec.seed) + 9));
    std::uniform_int_distribution<int32_t> dist(0, spec.n_vocab - 1);
    std::vector<int32_t> tokens(44);
    for (int32_t& t : tokens) t = dist(rng);
    for (DType wdt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(str_cat(name, " ", dtype_name(wdt), " weights"));
      cpu::CpuBackend cpu({.weights = wdt == DType::kBF16 ? WeightStorage::kBF16 : WeightStorage::kF32,
                           .bf16_matmul = cpu::Bf16Matmul::kDequantize});
      auto gpu = make_backend(wdt);
      const std::vector<float> want = run_sequence(cpu, file, tokens);
      const std::vector<float> got = run_sequence(*gpu, file, tokens);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(got.size(), size_t(44 * spec.n_vocab));
      double max_logit = 0.0, worst = 0.0;
      size_t worst_i = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_logit = std::max(max_logit, double(std::abs(want[i])));
        const double e = std::abs(double(got[i]) - want[i]);
        if (!(e <= worst)) worst = e, worst_i = i;
      }
      const double k_max = double(std::max({spec.n_embd, spec.n_ff, spec.n_heads * spec.head_dim, 44}));
      const double per_layer = 10.0 * k_max * kU + 16.0 * unit_roundoff(DType::kF16) +
                               (wdt == DType::kBF16 ? 4.0 * unit_roundoff(DType::kBF16) : 0.0);
      const double tol = (spec.n_layers * per_layer + k_max * kU) * std::max(1.0, max_logit);
      EXPECT_LE(worst, tol) << "position " << worst_i / size_t(spec.n_vocab) << " token "
                            << worst_i % size_t(spec.n_vocab);
      EXPECT_GT(max_logit, 0.5);  // real logits, not a degenerate model
    }
  }
}

}  // namespace
}  // namespace longctx::gpu
