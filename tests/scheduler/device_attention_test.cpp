// Sequence's device path (sequence.h): a Sequence on FakeDeviceBackend (CPU
// backend ops + the fp64 FakeDeviceAttention of fake_device_attention.h)
// gives the logits of a Sequence on the CPU backend, for chunked and
// multi-turn prefill, dense / select / streaming decode, reset, snapshot +
// sync_with_store, windows larger than the sequence, two sequences taking
// turns with one device, a device cleared behind a sequence's back, and a
// model attention scale that is not 1/sqrt(head_dim) (also against the fp64
// reference); and configurations
// the device does not run stay on the CPU path bit for bit, without a single
// device call. Every device-path test also checks the fake's call counts, so
// it cannot pass by falling back to the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/kvstore/snapshot.h"
#include "longctx/scheduler/sequence.h"
#include "scheduler/fake_device_attention.h"
#include "scheduler/reference_forward.h"
#include "scheduler/sequence_fixture.h"

namespace longctx::scheduler {
namespace {

using testing::FakeDeviceAttention;
using testing::FakeDeviceBackend;
using testing::HostModel;
using testing::logits_tolerance;
using testing::max_abs;
using testing::random_host_model;
using testing::random_tokens;
using testing::reference_logits;
using testing::streaming_keys;
using testing::topology;
using testing::upload_model;

// head_dim 64: the smallest the device kernels run.
TransformerSpec device_spec() {
  TransformerSpec s;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.n_embd = 64;
  s.n_ff = 96;
  s.n_vocab = 64;
  s.rms_eps = 1e-5f;
  s.rope.n_rot = 64;
  s.rope.theta = 10000.0f;
  return s;
}

// f16 store: block 16, 16 sinks, window 32, chunk 32; the CPU path's prefill
// attention in f32, as the device's.
LongContextConfig device_config(SelectionPolicy policy = SelectionPolicy::kDense) {
  LongContextConfig c;
  c.prefill_kernel = PrefillKernelChoice::kF32;
  c.chunk_size = 32;
  c.max_seq_len = 512;
  c.block_size = 16;
  c.initial_len = 16;
  c.local_windows_len = 32;
  c.second_select_num = 2;
  c.kv_type = DType::kF16;
  c.representative_type = RepresentativeType::kQuest;
  c.dense_layer_num = 0;
  c.policy = policy;
  c.dram_budget = uint64_t{64} << 20;
  return c;
}

// The two paths attend the same K/V (both rounded to kv_type by convert) in a
// different order and precision: f32-level differences only.
void expect_logits_near(const std::vector<float>& device, const std::vector<float>& cpu, int64_t n_tokens,
                        const std::string& what) {
  ASSERT_EQ(device.size(), cpu.size()) << what;
  const double tol = logits_tolerance(device_spec(), n_tokens, max_abs(cpu));
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::abs(double(device[i]) - double(cpu[i]));
    if (!(e <= worst)) worst = e, worst_i = i;
  }
  EXPECT_LE(worst, tol) << what << ": logit " << worst_i;
  EXPECT_GT(max_abs(cpu), 0.0) << what << ": all-zero logits";
}

// Every position's logits of a prefill, concatenated.
std::vector<float> prefill_all(Sequence& seq, const std::vector<int32_t>& tokens) {
  std::vector<float> all;
  PrefillOptions options;
  options.on_logits = [&](int64_t, int64_t, std::span<const float> logits) {
    all.insert(all.end(), logits.begin(), logits.end());
  };
  seq.prefill(tokens, options);
  return all;
}

class DeviceAttentionTest : public ::testing::Test {
 protected:
  // Runs the same prompt and decode tokens on the CPU backend and on a fresh
  // fake device; compares every prefill position, every decode step and the
  // attended fractions; device_ keeps the device backend for more checks.
  void compare_paths(const HostModel& host, const LongContextConfig& config, const std::vector<int32_t>& prompt,
                     const std::vector<int32_t>& steps, const std::string& what) {
    const Transformer model = upload_model(host, cpu_);
    Sequence on_cpu(cpu_, model, config, &topology());
    device_ = std::make_unique<FakeDeviceBackend>(cpu_);
    Sequence on_device(*device_, model, config, &topology());
    ASSERT_FALSE(on_cpu.uses_device_attention());
    ASSERT_TRUE(on_device.uses_device_attention()) << what;
    EXPECT_EQ(on_device.device_declined(), "") << what;
    const int64_t n = int64_t(prompt.size());
    expect_logits_near(prefill_all(on_device, prompt), prefill_all(on_cpu, prompt), n, what + " prefill");
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string step = what + " step " + std::to_string(i);
      expect_logits_near(on_device.decode(steps[i]), on_cpu.decode(steps[i]), n + int64_t(i) + 1, step);
      EXPECT_DOUBLE_EQ(on_device.stats().last_attended_fraction, on_cpu.stats().last_attended_fraction) << step;
    }
    const FakeDeviceAttention::Calls& calls = device_->attention().calls();
    const int layers = host.spec.n_layers;
    const int chunks = int((n + config.chunk_size - 1) / config.chunk_size);
    EXPECT_EQ(calls.configure, 1) << what;
    EXPECT_EQ(calls.begin_prefill_layer, layers) << what;
    EXPECT_EQ(calls.prefill_chunk, layers * chunks) << what;
    EXPECT_EQ(calls.chunk_kv, layers * chunks) << what;
    EXPECT_EQ(calls.decode_local, layers * int(steps.size())) << what;
    EXPECT_EQ(calls.decode_merge, layers * int(steps.size())) << what;
  }

  cpu::CpuBackend cpu_;
  std::unique_ptr<FakeDeviceBackend> device_;
};

TEST_F(DeviceAttentionTest, PrefillAndDenseDecodeMatchTheCpuPath) {
  const HostModel host = random_host_model(device_spec(), 1);
  // 110 tokens: three chunks of 32 and a partial one of 14.
  const std::vector<int32_t> prompt = random_tokens(110, 64, 2);
  const std::vector<int32_t> steps = random_tokens(6, 64, 3);
  for (DType kv : {DType::kF16, DType::kBF16}) {
    LongContextConfig config = device_config(SelectionPolicy::kDense);
    config.kv_type = kv;
    compare_paths(host, config, prompt, steps, std::string("dense ") + dtype_name(kv));
  }
}

// The device path against the fp64 reference forward pass, with the store's
// rounding in the tolerance (as sequence_test's F16 test).
TEST_F(DeviceAttentionTest, DevicePathMatchesTheReference) {
  const HostModel host = random_host_model(device_spec(), 4);
  const Transformer model = upload_model(host, cpu_);
  FakeDeviceBackend device(cpu_);
  const std::vector<int32_t> tokens = random_tokens(100, 64, 5);
  Sequence seq(device, model, device_config(), &topology());
  const std::vector<float> got = prefill_all(seq, std::vector<int32_t>(tokens.begin(), tokens.end() - 3));
  std::vector<float> decoded;
  for (size_t i = tokens.size() - 3; i < tokens.size(); ++i) {
    const std::vector<float> l = seq.decode(tokens[i]);
    decoded.insert(decoded.end(), l.begin(), l.end());
  }
  const std::vector<double> ref = reference_logits(host, tokens);
  double ref_max = 0;
  for (double x : ref) ref_max = std::max(ref_max, std::abs(x));
  const double tol = logits_tolerance(device_spec(), 100, ref_max, std::ldexp(1.0, -11));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref[i], tol) << "prefill logit " << i;
  for (size_t i = 0; i < decoded.size(); ++i) ASSERT_NEAR(decoded[i], ref[got.size() + i], tol) << "decode logit " << i;
  EXPECT_EQ(device.attention().calls().decode_merge, 2 * 3);
}

// A model whose scores are q.k * attn_scale, attn_scale != 1/sqrt(head_dim):
// the device's prefill and local window and the CPU's sinks + context all
// score with it, so the LSE merge joins parts of one softmax. Dense decode
// and StreamingLLM (16 sinks + 32 recent of 100+ tokens) against the
// reference restricted to their keys; select against the CPU path.
TEST_F(DeviceAttentionTest, ModelAttentionScaleOnBothSidesOfTheMerge) {
  TransformerSpec spec = device_spec();
  spec.attn_scale = 0.25f;  // 1/sqrt(64) = 0.125
  const HostModel host = random_host_model(spec, 40);
  const Transformer model = upload_model(host, cpu_);
  const int64_t n = 110, n_prompt = 100;
  const std::vector<int32_t> tokens = random_tokens(n, 64, 41);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + n_prompt);
  for (SelectionPolicy policy : {SelectionPolicy::kDense, SelectionPolicy::kStreaming}) {
    const LongContextConfig config = device_config(policy);
    const std::string what = selection_policy_name(policy);
    const std::vector<double> ref =
        policy == SelectionPolicy::kDense
            ? reference_logits(host, tokens)
            : reference_logits(host, tokens, streaming_keys(n_prompt, config.initial_len, config.local_windows_len));
    const double tol = logits_tolerance(spec, n, max_abs(ref), std::ldexp(1.0, -11));
    FakeDeviceBackend device(cpu_);
    Sequence seq(device, model, config, &topology());
    ASSERT_TRUE(seq.uses_device_attention()) << what;
    std::vector<float> got = prefill_all(seq, prompt);
    for (int64_t i = n_prompt; i < n; ++i) {
      const std::vector<float> step = seq.decode(tokens[size_t(i)]);
      got.insert(got.end(), step.begin(), step.end());
    }
    ASSERT_EQ(got.size(), ref.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref[i], tol) << what << " logit " << i;
    EXPECT_EQ(device.attention().calls().decode_merge, 2 * (n - n_prompt)) << what;
  }
  compare_paths(host, device_config(SelectionPolicy::kSelect), prompt, random_tokens(6, 64, 42), "select");
}

TEST_F(DeviceAttentionTest, SparsePoliciesMatchTheCpuPath) {
  const HostModel host = random_host_model(device_spec(), 6);
  const std::vector<int32_t> prompt = random_tokens(130, 64, 7);
  const std::vector<int32_t> steps = random_tokens(6, 64, 8);
  compare_paths(host, device_config(SelectionPolicy::kSelect), prompt, steps, "select");
  compare_paths(host, device_config(SelectionPolicy::kStreaming), prompt, steps, "streaming");
  // SnapKV preselection reads the last 32 prompt queries: chunk 24 puts them
  // in two chunks, downloaded from the device.
  LongContextConfig pre = device_config(SelectionPolicy::kSelect);
  pre.chunk_size = 24;
  pre.preselect_block = true;
  pre.preselect_block_count = 4;
  compare_paths(host, pre, prompt, steps, "select preselect");
  LongContextConfig bf16 = device_config(SelectionPolicy::kSelect);
  bf16.kv_type = DType::kBF16;
  bf16.token_step = 2;
  compare_paths(host, bf16, prompt, steps, "select bf16 token_step 2");
}

// Windows longer than the sequence, no sinks, a one-token window, no window:
// the ring's range and the store's local range agree at every length.
TEST_F(DeviceAttentionTest, ShortSequencesAndSmallWindows) {
  const HostModel host = random_host_model(device_spec(), 9);
  struct Case {
    int initial_len, window;
    int64_t prompt, steps;
  };
  for (const Case& c : {Case{16, 32, 5, 50}, Case{0, 8, 3, 20}, Case{4, 1, 2, 10}, Case{3, 0, 4, 6},
                        Case{40, 16, 10, 8}}) {
    LongContextConfig config = device_config(SelectionPolicy::kDense);
    config.initial_len = c.initial_len;
    config.local_windows_len = c.window;
    const std::string what = "initial " + std::to_string(c.initial_len) + " window " + std::to_string(c.window);
    compare_paths(host, config, random_tokens(c.prompt, 64, 10), random_tokens(c.steps, 64, 11), what);
    // Each decode_local attended [max(initial, pos + 1 - window), pos], empty
    // (first = pos + 1) while the sinks hold every token.
    const auto& ranges = device_->attention().local_ranges();
    ASSERT_EQ(ranges.size(), size_t(2 * c.steps)) << what;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const int64_t pos = c.prompt + int64_t(i / 2);
      EXPECT_EQ(ranges[i].first, std::min(std::max<int64_t>(c.initial_len, pos + 1 - c.window), pos + 1))
          << what << " call " << i;
      EXPECT_EQ(ranges[i].second, pos + 1) << what;
    }
  }
  // A streaming policy whose sinks outnumber the tokens.
  LongContextConfig streaming = device_config(SelectionPolicy::kStreaming);
  streaming.initial_len = 20;
  streaming.local_windows_len = 4;
  compare_paths(host, streaming, random_tokens(7, 64, 12), random_tokens(30, 64, 13), "streaming short");
}

// prefill(A), decode, prefill(B): the second prefill gets the cached tokens
// of every layer through begin_prefill_layer.
TEST_F(DeviceAttentionTest, MultiTurnPrefillReadsTheHistory) {
  const HostModel host = random_host_model(device_spec(), 14);
  const Transformer model = upload_model(host, cpu_);
  const std::vector<int32_t> a = random_tokens(60, 64, 15), t = {3, 9, 27, 17}, b = random_tokens(45, 64, 16);
  for (SelectionPolicy policy : {SelectionPolicy::kDense, SelectionPolicy::kSelect}) {
    LongContextConfig config = device_config(policy);
    config.preselect_block = policy == SelectionPolicy::kSelect;
    config.preselect_block_count = 3;
    const std::string what = selection_policy_name(policy);
    FakeDeviceBackend device(cpu_);
    Sequence on_device(device, model, config, &topology());
    Sequence on_cpu(cpu_, model, config, &topology());
    for (Sequence* seq : {&on_device, &on_cpu}) {
      seq->prefill(a);
      for (int32_t token : t) seq->decode(token);
    }
    expect_logits_near(prefill_all(on_device, b), prefill_all(on_cpu, b), 109, what + " second turn");
    EXPECT_EQ(device.attention().history_rows(), (std::vector<int64_t>{0, 0, 64, 64})) << what;
    for (int32_t token : {1, 2, 3})
      expect_logits_near(on_device.decode(token), on_cpu.decode(token), 112, what + " decode after");
    EXPECT_EQ(device.attention().calls().decode_merge, 2 * 7) << what;
  }
}

TEST_F(DeviceAttentionTest, ResetClearsTheDevice) {
  const HostModel host = random_host_model(device_spec(), 17);
  const Transformer model = upload_model(host, cpu_);
  FakeDeviceBackend device(cpu_);
  Sequence seq(device, model, device_config(SelectionPolicy::kSelect), &topology());
  const std::vector<int32_t> prompt = random_tokens(80, 64, 18), steps = random_tokens(5, 64, 19);
  std::vector<std::vector<float>> first;
  first.push_back(prefill_all(seq, prompt));
  for (int32_t token : steps) first.push_back(seq.decode(token));
  seq.reset();
  EXPECT_EQ(device.attention().calls().clear, 1);
  EXPECT_EQ(seq.n_past(), 0);
  // Same run again: the same computation, bit for bit.
  EXPECT_EQ(prefill_all(seq, prompt), first[0]);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(seq.decode(steps[i]), first[i + 1]) << "step " << i;
  EXPECT_EQ(device.attention().calls().decode_merge, 2 * 10);
}

// One turn of a conversation: a prefill of `tokens`, or decode steps of them.
struct Turn {
  bool prefill;
  std::vector<int32_t> tokens;
};

// Runs turn `t` on seq and returns the logits of each call.
std::vector<std::vector<float>> run_turn(Sequence& seq, const Turn& t) {
  std::vector<std::vector<float>> logits;
  if (t.prefill) {
    logits.push_back(seq.prefill(t.tokens));
  } else {
    for (int32_t token : t.tokens) logits.push_back(seq.decode(token));
  }
  return logits;
}

// Two sequences on one device backend take turns: the device belongs to the
// last one that configured it (constructor, prefill), and the other one's
// decode steps run on the CPU path. Each gives the logits it gives alone on
// a device of its own; the fake's decode_merge would throw on a ring that
// holds another sequence's tokens.
TEST_F(DeviceAttentionTest, InterleavedSequencesGiveWhatEachGivesAlone) {
  const HostModel host = random_host_model(device_spec(), 30);
  const Transformer model = upload_model(host, cpu_);
  const LongContextConfig config = device_config(SelectionPolicy::kSelect);
  const std::vector<Turn> turns_a = {{true, random_tokens(90, 64, 31)},
                                     {false, random_tokens(5, 64, 32)},
                                     {true, random_tokens(20, 64, 33)},
                                     {false, random_tokens(4, 64, 34)}};
  const std::vector<Turn> turns_b = {{true, random_tokens(70, 64, 35)},
                                     {false, random_tokens(5, 64, 36)},
                                     {false, random_tokens(4, 64, 37)},
                                     {false, random_tokens(3, 64, 38)}};
  const auto alone = [&](const std::vector<Turn>& turns) {
    FakeDeviceBackend device(cpu_);
    Sequence seq(device, model, config, &topology());
    std::vector<std::vector<std::vector<float>>> logits;
    for (const Turn& t : turns) logits.push_back(run_turn(seq, t));
    EXPECT_EQ(seq.stats().decode_steps_off_device, 0);
    return logits;
  };
  const auto alone_a = alone(turns_a), alone_b = alone(turns_b);

  FakeDeviceBackend device(cpu_);
  Sequence a(device, model, config, &topology());
  Sequence b(device, model, config, &topology());  // configures the device: b's now
  EXPECT_FALSE(a.owns_device());
  EXPECT_TRUE(b.owns_device());
  std::vector<std::vector<std::vector<float>>> got_a, got_b;
  for (size_t i = 0; i < turns_a.size(); ++i) {  // a's turn i, then b's
    got_a.push_back(run_turn(a, turns_a[i]));
    got_b.push_back(run_turn(b, turns_b[i]));
  }
  // a's prefills took the device back, b's first prefill took it again; b's
  // later turns are decodes: a decoded its first turn off the device and its
  // second on it (its second prefill took it), b the other way round.
  EXPECT_EQ(a.stats().decode_steps_off_device, 5);
  EXPECT_EQ(b.stats().decode_steps_off_device, 4 + 3);
  for (size_t i = 0; i < turns_a.size(); ++i) {
    for (size_t j = 0; j < got_a[i].size(); ++j)
      expect_logits_near(got_a[i][j], alone_a[i][j], 120, "a turn " + std::to_string(i) + " call " + std::to_string(j));
    for (size_t j = 0; j < got_b[i].size(); ++j)
      expect_logits_near(got_b[i][j], alone_b[i][j], 90, "b turn " + std::to_string(i) + " call " + std::to_string(j));
  }

  // reset() of a sequence that does not own the device leaves it alone.
  ASSERT_TRUE(a.owns_device());
  const int clears = device.attention().calls().clear;
  b.reset();
  EXPECT_EQ(device.attention().calls().clear, clears);
  EXPECT_TRUE(a.owns_device());
  a.decode(7);
  EXPECT_EQ(a.stats().decode_steps_off_device, 5);
}

// The device cleared behind a loaded sequence's back (a ring gap): its decode
// steps run on the CPU path and give the CPU path's logits; sync_with_store
// takes the device back and refills the rings.
TEST_F(DeviceAttentionTest, ARingGapIsAttendedOnTheCpu) {
  const HostModel host = random_host_model(device_spec(), 40);
  const Transformer model = upload_model(host, cpu_);
  const LongContextConfig config = device_config(SelectionPolicy::kSelect);
  const std::vector<int32_t> prompt = random_tokens(100, 64, 41), steps = random_tokens(6, 64, 42);
  FakeDeviceBackend device(cpu_);
  Sequence seq(device, model, config, &topology());
  Sequence on_cpu(cpu_, model, config, &topology());
  seq.prefill(prompt);
  on_cpu.prefill(prompt);
  device.attention().clear();
  EXPECT_FALSE(seq.owns_device());
  const int merges = device.attention().calls().decode_merge;
  for (size_t i = 0; i < 3; ++i)
    expect_logits_near(seq.decode(steps[i]), on_cpu.decode(steps[i]), 101 + int64_t(i), "gap step " + std::to_string(i));
  EXPECT_EQ(device.attention().calls().decode_merge, merges);
  EXPECT_EQ(seq.stats().decode_steps_off_device, 3);
  seq.sync_with_store();
  on_cpu.sync_with_store();  // the same fresh policy state
  EXPECT_TRUE(seq.owns_device());
  for (size_t i = 3; i < steps.size(); ++i)
    expect_logits_near(seq.decode(steps[i]), on_cpu.decode(steps[i]), 101 + int64_t(i), "step " + std::to_string(i));
  EXPECT_EQ(device.attention().calls().decode_merge, merges + 2 * 3);
  EXPECT_EQ(seq.stats().decode_steps_off_device, 3);
}

// Snapshot of a device sequence, loaded into a new one: sync_with_store
// uploads every layer's K/V (begin_prefill_layer), refilling the rings, and
// decoding continues on the device.
TEST_F(DeviceAttentionTest, SnapshotLoadThenDecode) {
  const HostModel host = random_host_model(device_spec(), 20);
  const Transformer model = upload_model(host, cpu_);
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "device_attention_test.snap").string();
  struct Case {
    int64_t prompt, steps;
  };
  for (const Case& c : {Case{100, 40}, Case{10, 30}}) {
    const LongContextConfig config = device_config(SelectionPolicy::kSelect);
    const std::vector<int32_t> prompt = random_tokens(c.prompt, 64, 21), steps = random_tokens(c.steps, 64, 22);
    {
      FakeDeviceBackend device(cpu_);
      Sequence saved(device, model, config, &topology());
      saved.prefill(prompt);
      kvstore::save_snapshot(saved.store(), path, "device-test");
    }
    FakeDeviceBackend device(cpu_);
    Sequence loaded(device, model, config, &topology());
    kvstore::load_snapshot(loaded.store(), path, "device-test");
    loaded.sync_with_store();
    EXPECT_EQ(loaded.n_past(), c.prompt);
    Sequence on_cpu(cpu_, model, config, &topology());
    on_cpu.prefill(prompt);
    on_cpu.sync_with_store();  // the same fresh policy state
    for (int64_t i = 0; i < c.steps; ++i)
      expect_logits_near(loaded.decode(steps[size_t(i)]), on_cpu.decode(steps[size_t(i)]), c.prompt + i + 1,
                         "prompt " + std::to_string(c.prompt) + " step " + std::to_string(i));
    EXPECT_EQ(device.attention().history_rows(), (std::vector<int64_t>{c.prompt, c.prompt}));
    EXPECT_EQ(device.attention().calls().decode_local, 2 * c.steps);
    EXPECT_EQ(device.attention().calls().decode_merge, 2 * c.steps);
  }
  std::filesystem::remove(path);
}

// Configurations the device does not run stay on the CPU path: no device
// call at all, and the logits of the CPU backend bit for bit.
// The device path's host staging of one layer's K/V (max_seq_len tokens of
// K and V) counts in the DRAM budget: a budget that holds the store alone
// builds a CPU sequence and refuses a device one, naming the staging.
TEST_F(DeviceAttentionTest, HistoryStagingCountsInTheBudget) {
  const HostModel host = random_host_model(device_spec(), 50);
  const Transformer model = upload_model(host, cpu_);
  LongContextConfig config = device_config(SelectionPolicy::kSelect);
  const TransformerSpec s = device_spec();
  const kvstore::Preflight store = kvstore::preflight(kvstore::StoreLayout::make(s.kv_shape(), config),
                                                      config.max_seq_len, std::vector<int>(size_t(s.n_kv_heads), 0));
  const uint64_t staging = 2 * uint64_t(config.max_seq_len) * uint64_t(s.n_kv_heads * s.head_dim) * 2;  // f16
  config.dram_budget = store.total_bytes + staging / 2;
  Sequence on_cpu(cpu_, model, config, &topology());
  FakeDeviceBackend device(cpu_);
  try {
    Sequence on_device(device, model, config, &topology());
    ADD_FAILURE() << "the device sequence fits a budget without its staging";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("host staging of one layer's K/V"), std::string::npos) << e.what();
  }
  EXPECT_EQ(device.attention().calls().total(), 0);
  config.dram_budget = store.total_bytes + staging;
  Sequence fits(device, model, config, &topology());
  EXPECT_TRUE(fits.uses_device_attention());
}

TEST_F(DeviceAttentionTest, UnsupportedConfigurationsStayOnTheCpu) {
  struct Case {
    const char* name;  // what the sequence's device_declined() begins with
    TransformerSpec spec;
    LongContextConfig config;
  };
  std::vector<Case> cases;
  cases.push_back({"policy h2o", device_spec(), device_config(SelectionPolicy::kH2O)});
  cases.push_back({"quoka.enabled", device_spec(), device_config()});
  cases.back().config.quoka.enabled = true;
  cases.back().config.quoka.b_sa = 256;
  cases.push_back({"kv_type f32", device_spec(), device_config()});
  cases.back().config.kv_type = DType::kF32;
  cases.push_back({"head_dim 32", device_spec(), device_config()});
  cases.back().spec.head_dim = 32;
  cases.back().spec.rope.n_rot = 32;
  uint32_t seed = 30;
  for (const Case& c : cases) {
    const HostModel host = random_host_model(c.spec, seed++);
    const Transformer model = upload_model(host, cpu_);
    FakeDeviceBackend device(cpu_);
    Sequence on_device(device, model, c.config, &topology());
    Sequence on_cpu(cpu_, model, c.config, &topology());
    EXPECT_FALSE(on_device.uses_device_attention()) << c.name;
    EXPECT_EQ(on_device.device_declined().rfind(c.name, 0), 0u) << on_device.device_declined();
    EXPECT_EQ(on_cpu.device_declined(), "the backend has no device attention");
    const std::vector<int32_t> prompt = random_tokens(40, 64, seed++);
    EXPECT_EQ(prefill_all(on_device, prompt), prefill_all(on_cpu, prompt)) << c.name;
    for (int32_t token : {5, 6, 7}) EXPECT_EQ(on_device.decode(token), on_cpu.decode(token)) << c.name;
    on_device.reset();
    on_device.sync_with_store();
    EXPECT_EQ(device.attention().calls().total(), 0) << c.name;
  }
}

// The fake's guard: decode_local at a position its ring has not reached
// fails, as on the CUDA backend (so the tests above would catch a scheduler
// that decoded on a device it had not refilled).
TEST_F(DeviceAttentionTest, FakeRejectsADecodeTheRingHasNotReached) {
  FakeDeviceAttention fake;
  DeviceAttention::Shape shape;
  shape.n_layers = 1;
  shape.n_heads = 2;
  shape.n_kv_heads = 1;
  shape.head_dim = 64;
  shape.max_tokens = 64;
  shape.window = 8;
  shape.initial_len = 0;
  fake.configure(shape);
  auto q = cpu_.alloc({1, 2, 64}), k = cpu_.alloc({1, 1, 64}), v = cpu_.alloc({1, 1, 64}), out = cpu_.alloc({1, 2, 64});
  std::vector<float> ones(20 * 64, 1.0f), lse(2, 0.0f);
  cpu_.upload(make_view(ones.data(), DType::kF32, {1, 2, 64}), *q);
  cpu_.upload(make_view(ones.data(), DType::kF32, {1, 1, 64}), *k);
  cpu_.upload(make_view(ones.data(), DType::kF32, {1, 1, 64}), *v);
  const TensorView cpu_out = make_view(ones.data(), DType::kF32, {2, 64});
  const TensorView cpu_lse = make_view(lse.data(), DType::kF32, {2});
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  fake.decode_local(0, 0, *q, *k, *v);
  fake.decode_merge(0, cpu_out, cpu_lse, *out);
  EXPECT_EQ(code_of([&] { fake.decode_local(0, 20, *q, *k, *v); }), ErrorCode::kInvalidArgument);
  fake.clear();
  EXPECT_EQ(code_of([&] { fake.decode_local(0, 1, *q, *k, *v); }), ErrorCode::kInvalidArgument);
  // begin_prefill_layer with 20 history tokens: the ring continues at 20.
  const TensorView history = make_view(ones.data(), DType::kF32, {20, 1, 64});
  fake.begin_prefill_layer(0, history, history);
  fake.decode_local(0, 20, *q, *k, *v);
  fake.decode_merge(0, cpu_out, cpu_lse, *out);
  EXPECT_EQ(fake.local_ranges().back(), (std::pair<int64_t, int64_t>{13, 21}));
}

}  // namespace
}  // namespace longctx::scheduler
