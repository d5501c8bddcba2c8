// The CUDA backend with another library's memory and stream, as longctx.torch
// drives it: wrap_device_memory, wait_for_stream / join_stream, and
// scheduler::DeviceLayerAttention run on tensors that live in cudaMalloc'd
// memory written and read on a stream of the caller's, against the CPU step
// (scheduler::LayerAttention with the window attended on the CPU) over a
// second store fed the same tokens. Skips without a CUDA device.
#include <gtest/gtest.h>

#if LONGCTX_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/scheduler/device_layer_attention.h"
#include "longctx/scheduler/layer_attention.h"
#include "scheduler/sequence_fixture.h"
#include "test_seed.h"

namespace longctx::gpu {
namespace {

using namespace longctx::gpu::testing;

class ForeignMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { LONGCTX_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Device memory and a stream that the backend does not own.
struct Foreign {
  cudaStream_t stream = nullptr;
  std::vector<void*> buffers;
  Foreign() { cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); }
  ~Foreign() {
    cudaStreamSynchronize(stream);
    for (void* p : buffers) cudaFree(p);
    cudaStreamDestroy(stream);
  }
  float* alloc(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
    buffers.push_back(p);
    return static_cast<float*>(p);
  }
  // Written on the foreign stream: the backend must wait for it.
  float* upload(const std::vector<float>& host) {
    float* p = alloc(host.size());
    cudaMemcpyAsync(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
    return p;
  }
  std::vector<float> download(const float* p, size_t n) {
    std::vector<float> host(n);
    cudaMemcpyAsync(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    return host;
  }
};

TEST_F(ForeignMemoryTest, WrapTakesDeviceMemoryOfItsDeviceAndNamesWhatItRefuses) {
  auto backend = make_backend(DType::kBF16);
  Foreign foreign;
  float* p = foreign.alloc(12);
  auto t = wrap_device_memory(*backend, p, {3, 4}, DType::kF32, "q");
  EXPECT_EQ(t->data(), p);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 4}));
  std::string message;
  std::vector<float> host(12);
  EXPECT_EQ(error_code_of([&] { wrap_device_memory(*backend, host.data(), {3, 4}, DType::kF32, "k"); }, &message),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("k is not device memory"), std::string::npos) << message;
  EXPECT_EQ(error_code_of([&] { wrap_device_memory(*backend, nullptr, {3, 4}, DType::kF32, "v"); }, &message),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("v is a null pointer"), std::string::npos) << message;
  cpu::CpuBackend cpu;
  EXPECT_EQ(error_code_of([&] { wrap_device_memory(cpu, p, {3, 4}, DType::kF32, "q"); }, &message),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("is not a CUDA backend"), std::string::npos) << message;
  EXPECT_EQ(error_code_of([&] { join_stream(cpu, 0); }), ErrorCode::kInvalidArgument);
}

// Prefill (with an earlier turn uploaded as history) and decode steps of a
// 2-layer store on the device path, every tensor the caller's, against the
// CPU step with the window included. The selection is the same on both sides
// (the same store contents), so the outputs differ only by the device's
// rounding of P to the kv dtype: bound 2 u_kv max|v| + 4e-4 max|v|.
TEST_F(ForeignMemoryTest, DeviceLayerStepOnACallersTensorsAndStreamMatchesTheCpuStep) {
  struct Heads {
    int n_heads, n_kv_heads, head_dim;
  };
  std::mt19937 rng(test_seed(31));
  for (DType kv : {DType::kF16, DType::kBF16})
    for (Heads h : {Heads{8, 2, 64}, Heads{4, 4, 128}, Heads{8, 1, 256}}) {
      LongContextConfig c = longctx::testing::every_block_config(kv);
      c.second_select_num = 3;  // a real selection: 3 of up to 12 context blocks
      c.max_seq_len = 512;
      const int L = 2, H = h.n_heads, KV = h.n_kv_heads, D = h.head_dim;
      const kvstore::KVShape shape{L, KV, D};
      kvstore::MemoryBudget budget_a(uint64_t{1} << 28), budget_b(uint64_t{1} << 28);
      kvstore::KVStore dev_store(shape, c, budget_a, longctx::testing::topology());
      kvstore::KVStore cpu_store(shape, c, budget_b, longctx::testing::topology());
      const float scale = 0.7f / std::sqrt(float(D));  // not 1/sqrt(head_dim): the scale must reach both parts
      scheduler::LayerAttention dev_attention(dev_store, c, scale), cpu_attention(cpu_store, c, scale);
      auto backend = make_backend(DType::kBF16);
      const DeviceAttention::Shape ds = scheduler::DeviceLayerAttention::shape_for(c, L, H, KV, D, scale);
      scheduler::DeviceLayerAttention device(*backend->device_attention(), ds, dev_store, dev_attention);
      Foreign foreign;
      const int64_t q_row = int64_t(H) * D, kv_row = int64_t(KV) * D;
      const std::string what = str_cat(dtype_name(kv), " heads ", H, ":", KV, " d ", D);
      double max_v = 0.0;
      auto random = [&](int64_t n, bool is_v) {
        std::vector<float> x = random_values(rng, n);
        if (is_v)
          for (float e : x) max_v = std::max(max_v, double(std::abs(e)));
        return x;
      };
      auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want, const std::string& at) {
        const double bound = (2.0 * unit_roundoff(kv) + 4e-4) * max_v;
        ASSERT_EQ(got.size(), want.size()) << at;
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::abs(double(got[i]) - double(want[i])), bound) << at << ": element " << i;
      };
      // Two prefill turns (the second sees the first as its history), then decode steps.
      int64_t pos = 0;
      for (int64_t n : {int64_t(150), int64_t(70)}) {
        for (int layer = 0; layer < L; ++layer) {
          const std::vector<float> q = random(n * q_row, false), k = random(n * kv_row, false),
                                   v = random(n * kv_row, true);
          std::vector<float> want(size_t(n * q_row)), lse(size_t(n * H));
          cpu_attention.prefill_chunk(layer, pos, make_view(q.data(), DType::kF32, {n, H, D}),
                                      make_view(k.data(), DType::kF32, {n, KV, D}),
                                      make_view(v.data(), DType::kF32, {n, KV, D}),
                                      make_mutable_view(want.data(), DType::kF32, {n, H, D}),
                                      make_mutable_view(lse.data(), DType::kF32, {n, H}));
          float* out = foreign.alloc(size_t(n * q_row));
          auto qt = wrap_device_memory(*backend, foreign.upload(q), {n, q_row}, DType::kF32, "q");
          auto kt = wrap_device_memory(*backend, foreign.upload(k), {n, kv_row}, DType::kF32, "k");
          auto vt = wrap_device_memory(*backend, foreign.upload(v), {n, kv_row}, DType::kF32, "v");
          auto ot = wrap_device_memory(*backend, out, {n, q_row}, DType::kF32, "out");
          wait_for_stream(*backend, uintptr_t(foreign.stream));
          device.begin_layer(layer);
          device.prefill_chunk(layer, pos, *qt, *kt, *vt, *ot);
          join_stream(*backend, uintptr_t(foreign.stream));
          expect_close(foreign.download(out, size_t(n * q_row)), want,
                       str_cat(what, " layer ", layer, " prefill at ", pos));
          const int64_t w = std::min<int64_t>(c.preselect.window, n);
          const TensorView window_q = make_view(q.data() + (n - w) * q_row, DType::kF32, {w, H, D});
          dev_attention.end_prefill(layer, window_q);
          cpu_attention.end_prefill(layer, window_q);
        }
        pos += n;
      }
      for (int step = 0; step < 6; ++step, ++pos)
        for (int layer = 0; layer < L; ++layer) {
          const std::vector<float> q = random(q_row, false), k = random(kv_row, false), v = random(kv_row, true);
          std::vector<float> want(static_cast<size_t>(q_row)), lse(static_cast<size_t>(H));
          cpu_attention.decode(layer, make_view(q.data(), DType::kF32, {H, D}),
                               make_view(k.data(), DType::kF32, {1, KV, D}),
                               make_view(v.data(), DType::kF32, {1, KV, D}), /*include_local=*/true,
                               make_mutable_view(want.data(), DType::kF32, {H, D}),
                               make_mutable_view(lse.data(), DType::kF32, {H}));
          float* out = foreign.alloc(size_t(q_row));
          auto qt = wrap_device_memory(*backend, foreign.upload(q), {1, q_row}, DType::kF32, "q");
          auto kt = wrap_device_memory(*backend, foreign.upload(k), {1, kv_row}, DType::kF32, "k");
          auto vt = wrap_device_memory(*backend, foreign.upload(v), {1, kv_row}, DType::kF32, "v");
          auto ot = wrap_device_memory(*backend, out, {1, q_row}, DType::kF32, "out");
          wait_for_stream(*backend, uintptr_t(foreign.stream));
          const int64_t attended = device.decode(layer, pos, *qt, *kt, *vt, *ot);
          join_stream(*backend, uintptr_t(foreign.stream));
          const std::string at = str_cat(what, " layer ", layer, " decode at ", pos);
          EXPECT_EQ(attended, cpu_attention.policy().last_stats().attended_tokens) << at;
          expect_close(foreign.download(out, size_t(q_row)), want, at);
        }
      // Another owner takes the device: the step refuses instead of attending its tokens.
      backend->device_attention()->clear();
      EXPECT_FALSE(device.owns());
      std::string message;
      float* out = foreign.alloc(size_t(q_row));
      auto qt = wrap_device_memory(*backend, out, {1, q_row}, DType::kF32, "q");
      EXPECT_EQ(error_code_of([&] { device.begin_layer(0); }, &message), ErrorCode::kInvalidArgument);
      EXPECT_NE(message.find("another owner's tokens"), std::string::npos) << message;
      const int64_t held = dev_store.n_tokens(0);
      EXPECT_EQ(error_code_of([&] { device.decode(0, pos, *qt, *qt, *qt, *qt); }), ErrorCode::kInvalidArgument);
      EXPECT_EQ(dev_store.n_tokens(0), held);  // nothing appended
    }
}

}  // namespace
}  // namespace longctx::gpu

#else
TEST(ForeignMemoryTest, NeedsCuda) { GTEST_SKIP() << "no CUDA device: this longctx was built without CUDA"; }
#endif
