// Llama-family loading (model/llama.h): the generated test models of
// tools/test_model.h load onto the CPU backend and their logits (prefill and
// decode) match the fp64 reference forward pass of
// tests/scheduler/reference_forward.h, fed with the file's own tensors and
// the hyperparameters of the TestModelSpec (not the loader's reading of
// them); metadata and tensor errors name the key or tensor.
#include "longctx/model/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/quant_matmul.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/scheduler/sequence.h"
#include "longctx/tools/test_model.h"
#include "error_message.h"
#include "model/gguf_test_util.h"
#include "scheduler/reference_forward.h"
#include "scheduler/sequence_fixture.h"

namespace longctx::model {
namespace {

using scheduler::TransformerSpec;
using tools::TestModelSpec;
using longctx::testing::every_block_config;
using longctx::testing::max_abs;
using longctx::testing::topology;

// The spec as the generator documents it, independent of read_llama_spec.
TransformerSpec documented_spec(const TestModelSpec& t, const GgufFile& file) {
  TransformerSpec s;
  s.arch = t.arch;
  s.n_layers = t.n_layers;
  s.n_heads = t.n_heads;
  s.n_kv_heads = t.n_kv_heads;
  s.head_dim = t.head_dim;
  s.n_embd = t.n_embd;
  s.n_ff = t.n_ff;
  s.n_vocab = t.n_vocab;
  s.rms_eps = t.rms_eps;
  s.attn_scale = t.attn_scale;
  s.qkv_bias = t.qkv_bias;
  s.rope.n_rot = t.head_dim;
  s.rope.theta = t.rope_theta;
  s.rope.style = t.arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kNormal;
  if (t.llama3_rope) s.rope.freq_factors = file.tensor_f32(*file.find_tensor("rope_freqs.weight"));
  if (t.yarn_factor > 0) {
    s.rope.scaling = RopeScaling::kYarn;
    s.rope.factor = t.yarn_factor;
    s.rope.original_context = t.yarn_original_context;
  }
  s.context_length = t.context_length;
  return s;
}

// The file's tensors as host arrays ([out, in] row-major is GGUF's data order).
longctx::testing::HostModel host_model(const TransformerSpec& spec, const GgufFile& f) {
  auto get = [&](const std::string& name) { return f.tensor_f32(*f.find_tensor(name)); };
  longctx::testing::HostModel m;
  m.spec = spec;
  m.token_embd = get("token_embd.weight");
  m.output_norm = get("output_norm.weight");
  if (f.find_tensor("output.weight")) m.output = get("output.weight");
  for (int l = 0; l < spec.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    longctx::testing::HostLayer L;
    L.attn_norm = get(p + "attn_norm.weight");
    L.wq = get(p + "attn_q.weight");
    L.wk = get(p + "attn_k.weight");
    L.wv = get(p + "attn_v.weight");
    if (spec.qkv_bias) {
      L.bq = get(p + "attn_q.bias");
      L.bk = get(p + "attn_k.bias");
      L.bv = get(p + "attn_v.bias");
    }
    L.wo = get(p + "attn_output.weight");
    L.ffn_norm = get(p + "ffn_norm.weight");
    L.w_gate = get(p + "ffn_gate.weight");
    L.w_up = get(p + "ffn_up.weight");
    L.w_down = get(p + "ffn_down.weight");
    m.layers.push_back(std::move(L));
  }
  return m;
}

// Logits of `model` for 40 prompt tokens in chunks of 16, then 4 decode steps
// (43 rows of n_vocab: the last decode's logits are not needed).
std::vector<float> run_logits(cpu::CpuBackend& backend, const scheduler::Transformer& model,
                              const std::vector<int32_t>& tokens,
                              const LongContextConfig& config = every_block_config(DType::kF32)) {
  scheduler::Sequence seq(backend, model, config, &topology());
  std::vector<float> logits;
  scheduler::PrefillOptions options;
  options.on_logits = [&](int64_t, int64_t, std::span<const float> l) { logits.insert(logits.end(), l.begin(), l.end()); };
  seq.prefill(std::span<const int32_t>(tokens).first(40), options);
  for (int i = 40; i < 44; ++i) {
    const std::vector<float> step = seq.decode(tokens[size_t(i)]);
    if (i < 43) logits.insert(logits.end(), step.begin(), step.end());
  }
  EXPECT_EQ(logits.size(), size_t(43) * size_t(model.spec.n_vocab));
  return logits;
}

// Preset t loaded on `backend` and run with `config` (run_logits), and the
// fp64 reference's logits of the same tokens.
struct PresetLogits {
  std::vector<float> got;
  std::vector<double> ref;
  int n_layers = 0;
};

PresetLogits preset_logits(const TestModelSpec& t, cpu::CpuBackend& backend, const LongContextConfig& config) {
  const std::vector<uint8_t> bytes = tools::make_test_model(t).to_bytes();
  const GgufFile file = GgufFile::from_bytes(bytes, t.name);
  const scheduler::Transformer model = load_llama(file, backend);
  const std::vector<int32_t> tokens = longctx::testing::random_tokens(44, t.n_vocab, uint32_t(t.seed) + 5);
  PresetLogits r;
  r.ref = longctx::testing::reference_logits(host_model(documented_spec(t, file), file), tokens);
  r.got = run_logits(backend, model, tokens, config);
  r.n_layers = model.spec.n_layers;
  return r;
}

// Logits within a normalized squared error of the reference (sum of squared
// errors / sum of squared reference logits <= bound), and the greedy token
// equal wherever the reference's top-2 margin exceeds 8 RMS errors. Prints
// and returns the NMSE.
double expect_logits_within_nmse(const std::vector<float>& got, const std::vector<double>& ref, size_t vocab,
                                 double bound, const std::string& name) {
  EXPECT_LE(got.size(), ref.size());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    err2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  const double nmse = err2 / ref2;
  EXPECT_LE(nmse, bound);
  const double rms_error = std::sqrt(err2 / double(got.size()));
  int decided = 0;
  for (size_t row = 0; row < got.size() / vocab; ++row) {
    const auto ref_row = ref.begin() + std::ptrdiff_t(row * vocab);
    std::vector<double> sorted(ref_row, ref_row + std::ptrdiff_t(vocab));
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] < 8 * rms_error) continue;
    const auto got_row = got.begin() + std::ptrdiff_t(row * vocab);
    EXPECT_EQ(std::max_element(got_row, got_row + std::ptrdiff_t(vocab)) - got_row,
              std::max_element(ref_row, ref_row + std::ptrdiff_t(vocab)) - ref_row)
        << "greedy token of row " << row;
    ++decided;
  }
  std::printf("%s: NMSE %.3g (bound %.3g), greedy token compared on %d of %zu rows\n", name.c_str(), nmse, bound,
              decided, got.size() / vocab);
  return nmse;
}

// The largest |got - want| over got's logits (the first rows of want).
double worst_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_LE(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  }
  return worst;
}

// Every preset with its weights widened to f32 (WeightStorage::kF32), and
// gqa-128 with an attention scale (llama.attention.scale 0.05, not
// 1/sqrt(128)): the fp32 forward pass against the fp64 reference of the same
// (dequantized) weights.
TEST(Llama, GeneratedModelsMatchTheReference) {
  cpu::CpuBackend backend({.weights = WeightStorage::kF32});
  std::vector<TestModelSpec> models = tools::standard_test_models();
  models.push_back(tools::test_model_by_name("gqa-128"));
  models.back().name = "gqa-128 attention.scale";
  models.back().attn_scale = 0.05f;
  for (const TestModelSpec& t : models) {
    if (t.name == "bench") continue;  // 160 MB; same code paths as gqa-128
    SCOPED_TRACE(t.name);
    const std::vector<uint8_t> bytes = tools::make_test_model(t).to_bytes();
    const GgufFile file = GgufFile::from_bytes(bytes, t.name);
    const scheduler::Transformer model = load_llama(file, backend);
    const TransformerSpec expected = documented_spec(t, file);
    const TransformerSpec& s = model.spec;
    EXPECT_EQ(s.arch, expected.arch);
    EXPECT_EQ(s.n_layers, expected.n_layers);
    EXPECT_EQ(s.n_heads, expected.n_heads);
    EXPECT_EQ(s.n_kv_heads, expected.n_kv_heads);
    EXPECT_EQ(s.head_dim, expected.head_dim);
    EXPECT_EQ(s.n_embd, expected.n_embd);
    EXPECT_EQ(s.n_ff, expected.n_ff);
    EXPECT_EQ(s.n_vocab, expected.n_vocab);
    EXPECT_EQ(s.rms_eps, expected.rms_eps);
    EXPECT_EQ(s.attn_scale, expected.attn_scale);
    EXPECT_EQ(s.qkv_bias, expected.qkv_bias);
    EXPECT_EQ(s.rope.n_rot, expected.rope.n_rot);
    EXPECT_EQ(s.rope.theta, expected.rope.theta);
    EXPECT_EQ(s.rope.style, expected.rope.style);
    EXPECT_EQ(s.rope.scaling, expected.rope.scaling);
    EXPECT_EQ(s.rope.factor, expected.rope.factor);
    EXPECT_EQ(s.rope.attn_factor, expected.rope.attn_factor);
    if (s.rope.scaling == RopeScaling::kYarn) {
      EXPECT_EQ(s.rope.original_context, expected.rope.original_context);
    }
    EXPECT_EQ(s.rope.freq_factors, expected.rope.freq_factors);
    EXPECT_EQ(model.weights.output == nullptr, t.tie_embeddings);

    const std::vector<int32_t> tokens = longctx::testing::random_tokens(44, t.n_vocab, uint32_t(t.seed) + 5);
    const std::vector<double> ref = longctx::testing::reference_logits(host_model(expected, file), tokens);
    const double tol = longctx::testing::logits_tolerance(expected, 44, max_abs(ref));
    EXPECT_LE(worst_error(run_logits(backend, model, tokens), ref), tol);
    EXPECT_GT(max_abs(ref), 0.5);  // logits of real size, not a degenerate model
  }
}

// The bf16 prefill attention kernel (prefill_kernel: bf16) in the f32
// forward pass of every preset, against the fp64 reference. Each attention
// rounds q * scale, k, v and the probabilities to bf16, each a relative
// error of mean square eps^2 = 2^-16 / 3; with unit sensitivity of the layer
// to each, the normalized squared error of the logits stays below
// 4 n_layers eps^2 (the bound allows 4x that); a wrong pairing, mask or
// scale gives errors of order 1. And the greedy choice agrees wherever the
// reference's margin exceeds 8 RMS errors.
TEST(Llama, Bf16PrefillAttentionStaysWithinItsRounding) {
  const std::string unsupported = cpu::prefill_kernel_unsupported_reason(cpu::PrefillKernel::kBf16);
  if (!unsupported.empty()) GTEST_SKIP() << unsupported;
  cpu::CpuBackend backend({.weights = WeightStorage::kF32});
  LongContextConfig config = every_block_config(DType::kF32);
  config.prefill_kernel = PrefillKernelChoice::kBf16;
  const double eps2 = std::ldexp(1.0, -16) / 3;
  for (const TestModelSpec& t : tools::standard_test_models()) {
    if (t.name == "bench") continue;
    SCOPED_TRACE(t.name);
    const PresetLogits r = preset_logits(t, backend, config);
    const double nmse = expect_logits_within_nmse(r.got, r.ref, size_t(t.n_vocab), 16.0 * r.n_layers * eps2, t.name);
    EXPECT_GT(nmse, 0.0) << "no bf16 rounding: did the f32 kernel run?";
  }
}

// q8_0 KV (kv_type: q8_0) in the f32 forward pass of every preset whose
// head_dim is a multiple of 32, against the fp64 reference. Each key and value
// is rounded to a step s = max|x| / 127 of its group of 32: noise of RMS
// s / sqrt(12), at most sqrt(32) times the group's RMS / (127 sqrt(12))
// relative, eps^2 <= 32 / (127^2 * 12) = 1.65e-4. Two roundings per layer (K
// and V): the normalized squared error of the logits stays below
// 2 n_layers eps^2 where the network does not amplify it (the bound allows
// (2 n_layers + 1) eps^2); a wrong scale, group or layout gives errors of
// order 1. And the greedy choice agrees wherever the reference's margin
// exceeds 8 RMS errors.
TEST(Llama, Q8KvCacheStaysWithinItsQuantization) {
  cpu::CpuBackend backend({.weights = WeightStorage::kF32});
  const double eps2 = 32.0 / (127.0 * 127.0 * 12.0);
  int tested = 0;
  for (const TestModelSpec& t : tools::standard_test_models()) {
    if (t.name == "bench" || t.head_dim % kvstore::kQ8Group != 0) continue;
    SCOPED_TRACE(t.name);
    const PresetLogits r = preset_logits(t, backend, every_block_config(DType::kQ8_0));
    expect_logits_within_nmse(r.got, r.ref, size_t(t.n_vocab), (2.0 * r.n_layers + 1) * eps2, t.name);
    ++tested;
  }
  EXPECT_GE(tested, 5);
}

// Presets with quantized weights computed natively (int8 activations,
// cpu/quant_matmul.h) against the fp64 reference of the dequantized weights
// with exact activations. Rounding an activation block to int8 adds noise of
// RMS d / sqrt(12) (d = absmax / 127) to each value: at most sqrt(block)
// times the block's RMS / (127 sqrt(12)) relative, eps^2 <= 1.7e-4 for
// blocks of 32 (block 256 is coarser: 1.4e-3). Each of the 7 matmuls of a
// layer and the output head adds it once, so the normalized squared error of
// the logits stays below (7 layers + 1) eps^2 where the network does not
// amplify it; a wrong scale, block or row gives errors of order 1. And the
// greedy choice agrees wherever the reference's margin exceeds 8 RMS errors.
TEST(Llama, NativeQuantizedWeightsMatchTheReferenceWithinActivationRounding) {
  cpu::CpuBackend backend;  // WeightStorage::kNative
  int tested = 0;
  for (const TestModelSpec& t : tools::standard_test_models()) {
    if (!cpu::is_quant_matmul_type(t.weight_type)) continue;
    SCOPED_TRACE(t.name);
    const std::vector<uint8_t> bytes = tools::make_test_model(t).to_bytes();
    const GgufFile file = GgufFile::from_bytes(bytes, t.name);
    const scheduler::Transformer model = load_llama(file, backend);
    EXPECT_TRUE(model.weights.layers[0].wq->quantized()) << model.weights.layers[0].wq->describe();
    const TransformerSpec expected = documented_spec(t, file);
    const std::vector<int32_t> tokens = longctx::testing::random_tokens(44, t.n_vocab, uint32_t(t.seed) + 5);
    const std::vector<double> ref = longctx::testing::reference_logits(host_model(expected, file), tokens);
    const std::vector<float> got = run_logits(backend, model, tokens);
    const double block = double(cpu::quant_act_block(t.weight_type));
    const double eps2 = block / (127.0 * 127.0 * 12.0);
    expect_logits_within_nmse(got, ref, size_t(t.n_vocab), (7.0 * expected.n_layers + 1) * eps2, t.name);
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

TEST(Llama, ModelOpenReadsTokenizerAndFingerprint) {
  cpu::CpuBackend backend;
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  TestModelSpec t = tools::test_model_by_name("mha-64");
  const std::string a = (dir / "longctx_llama_test_a.gguf").string();
  const std::string b = (dir / "longctx_llama_test_b.gguf").string();
  tools::make_test_model(t).write(a);
  t.seed = 2;
  tools::make_test_model(t).write(b);
  const auto ma = Model::open(a, backend);
  const auto mb = Model::open(b, backend);
  EXPECT_EQ(ma->tokenizer().n_vocab(), ma->spec().n_vocab);
  EXPECT_EQ(ma->fingerprint(), model_fingerprint(GgufFile::open(a)));
  EXPECT_NE(ma->fingerprint(), mb->fingerprint());
  const std::vector<int32_t> ids = ma->tokenizer().encode("hello world", true, false);
  ASSERT_FALSE(ids.empty());
  scheduler::Sequence seq(backend, ma->transformer(), every_block_config(DType::kF32), &topology());
  EXPECT_EQ(seq.prefill(ids).size(), size_t(ma->spec().n_vocab));
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// ---- errors ----

std::string load_error(const std::vector<uint8_t>& bytes, ErrorCode code) {
  cpu::CpuBackend backend;
  return error_message([&] { load_llama(GgufFile::from_bytes(bytes, "m.gguf"), backend); }, code);
}

// The GGUF tensor-info record of `name`: [u64 len][name][u32 n_dims][u64 dims...][u32 type][u64 offset].
size_t info_of(const std::vector<uint8_t>& bytes, const std::string& name) {
  std::string needle(8, '\0');
  const uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  return testing::find_unique(bytes, needle + name) + 8 + name.size();
}

TEST(Llama, MissingTensorIsNamed) {
  std::vector<uint8_t> bytes = tools::make_test_model(tools::test_model_by_name("mha-64")).to_bytes();
  const size_t at = info_of(bytes, "blk.1.attn_k.weight");
  bytes[at - 1] = 'x';  // renamed "blk.1.attn_k.weighx": the loader does not find it
  EXPECT_EQ(load_error(bytes, ErrorCode::kCorrupt), "m.gguf: tensor 'blk.1.attn_k.weight' is missing");
}

TEST(Llama, MisshapedTensorIsNamed) {
  std::vector<uint8_t> bytes = tools::make_test_model(tools::test_model_by_name("mha-64")).to_bytes();
  const size_t at = info_of(bytes, "blk.0.ffn_up.weight");  // [256, 512] -> [512, 256]: same size
  testing::patch<uint64_t>(bytes, at + 4, 512);
  testing::patch<uint64_t>(bytes, at + 12, 256);
  EXPECT_EQ(load_error(bytes, ErrorCode::kCorrupt),
            "m.gguf: tensor 'blk.0.ffn_up.weight': expected [256, 512], got f32[512, 256]");
}

TEST(Llama, NonWeightTypeIsNamed) {
  std::vector<uint8_t> bytes = tools::make_test_model(tools::test_model_by_name("mha-64")).to_bytes();
  const size_t at = info_of(bytes, "blk.1.ffn_norm.weight");  // f32 [256] -> i32 [256]: same size
  testing::patch<uint32_t>(bytes, at + 4 + 8, uint32_t(GgmlType::kI32));
  const std::string message = load_error(bytes, ErrorCode::kCorrupt);
  EXPECT_NE(message.find("'blk.1.ffn_norm.weight' has type i32"), std::string::npos) << message;
}

TEST(Llama, NonFiniteBlockScaleIsNamed) {
  std::vector<uint8_t> bytes = tools::make_test_model(tools::test_model_by_name("q8")).to_bytes();
  size_t at = 0;
  {
    const GgufFile file = GgufFile::from_bytes(bytes, "m.gguf");
    const GgufTensorInfo& info = *file.find_tensor("blk.1.ffn_up.weight");
    EXPECT_EQ(info.type, GgmlType::kQ8_0);
    at = size_t(file.tensor_data(info).data() - bytes.data()) + 3 * 34;  // the scale of block 3
  }
  testing::patch<uint16_t>(bytes, at, 0x7C00);  // +inf
  const std::string message = load_error(bytes, ErrorCode::kCorrupt);
  EXPECT_NE(message.find("m.gguf: weight 'blk.1.ffn_up.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("block 3"), std::string::npos) << message;
}

// An internlm2 file is Llama's layout under another name: the same weights
// give the same logits, bit for bit, as the file named llama, and match the
// fp64 reference.
TEST(Llama, Internlm2RunsAsLlama) {
  cpu::CpuBackend backend({.weights = WeightStorage::kF32});
  TestModelSpec t = tools::test_model_by_name("gqa-128");
  const std::vector<int32_t> tokens = longctx::testing::random_tokens(44, t.n_vocab, 11);
  std::vector<std::vector<float>> logits;
  for (const char* arch : {"llama", "internlm2"}) {
    SCOPED_TRACE(arch);
    t.arch = arch;
    const std::vector<uint8_t> bytes = tools::make_test_model(t).to_bytes();
    const GgufFile file = GgufFile::from_bytes(bytes, t.name);
    const scheduler::Transformer model = load_llama(file, backend);
    EXPECT_EQ(model.spec.arch, arch);
    EXPECT_EQ(model.spec.rope.style, RopeStyle::kNormal);
    logits.push_back(run_logits(backend, model, tokens));
    const TransformerSpec expected = documented_spec(t, file);
    const std::vector<double> ref = longctx::testing::reference_logits(host_model(expected, file), tokens);
    EXPECT_LE(worst_error(logits.back(), ref), longctx::testing::logits_tolerance(model.spec, 44, max_abs(ref)));
  }
  EXPECT_EQ(logits[0], logits[1]);
}

// Llama-3.1's per-frequency factors and YaRN would scale the same
// frequencies twice: refused, naming both.
TEST(Llama, RopeFreqsWithYarnIsRefused) {
  GgufWriter w = tools::make_test_model(tools::test_model_by_name("llama3-rope"));
  w.set_string("llama.rope.scaling.type", "yarn");
  w.set_f32("llama.rope.scaling.factor", 4.0f);
  EXPECT_EQ(load_error(w.to_bytes(), ErrorCode::kCorrupt),
            "m.gguf: tensor 'rope_freqs.weight' given together with 'llama.rope.scaling.type' (yarn)");
}

// Keys each within its own range can still leave f32 once the backend
// combines them (a denormal factor divides the frequencies past f32's range),
// or be refused by it once narrowed to f32 (1e-300 becomes 0): refused at
// load, naming the file and the RoPE keys, not as NaN logits later.
TEST(Llama, RopeKeysTheBackendCannotRunAreRefusedAtLoad) {
  const struct {
    const char* what;
    std::function<void(GgufWriter&)> set;
  } cases[] = {
      {"inverse frequency of pair 0", [](GgufWriter& w) { w.set_f32("llama.rope.scaling.factor", 1.4e-45f); }},
      {"scaling factor must be positive", [](GgufWriter& w) { w.set_f64("llama.rope.scaling.factor", 1e-300); }},
      {"attn_factor must be positive", [](GgufWriter& w) { w.set_f64("llama.rope.scaling.attn_factor", 1e-300); }},
      {"n_rot must be positive", nullptr},  // rope.dimension_count 0, in range for the key itself
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    GgufWriter w = tools::make_test_model(tools::test_model_by_name("gqa-128"));
    if (c.set) c.set(w);
    std::vector<uint8_t> bytes = w.to_bytes();
    if (!c.set) {  // the key's u32 value follows its name and type
      const std::string key = "llama.rope.dimension_count";
      std::memset(&bytes[testing::find_unique(bytes, key) + key.size() + 4], 0, 4);
    }
    const std::string message = load_error(bytes, ErrorCode::kCorrupt);
    EXPECT_EQ(message.rfind("m.gguf: the RoPE keys of 'llama.rope.*'", 0), 0u) << message;
    EXPECT_NE(message.find(c.what), std::string::npos) << message;
  }
}

TEST(Llama, MissingBiasOfOneLayerIsNamed) {
  TestModelSpec t = tools::test_model_by_name("qwen2-bias");
  std::vector<uint8_t> bytes = tools::make_test_model(t).to_bytes();
  const size_t at = info_of(bytes, "blk.1.attn_v.bias");
  bytes[at - 1] = 'z';
  EXPECT_EQ(load_error(bytes, ErrorCode::kCorrupt), "m.gguf: tensor 'blk.1.attn_v.bias' is missing");
}

// A file with only the metadata keys and the embedding, for read_llama_spec:
// u32 keys (without the "<arch>." prefix) to set or change, and `extra` for others.
struct MetaFile {
  std::string arch;
  std::map<std::string, uint32_t> u32 = {{"block_count", 2},
                                         {"embedding_length", 64},
                                         {"feed_forward_length", 128},
                                         {"attention.head_count", 4},
                                         {"attention.head_count_kv", 2}};
  std::function<void(GgufWriter&)> extra;
  explicit MetaFile(std::string a = "llama") : arch(std::move(a)) {}
  TransformerSpec read() const {
    GgufWriter w;
    w.set_string("general.architecture", arch);
    for (const auto& [key, value] : u32) w.set_u32(arch + "." + key, value);
    if (extra) extra(w);
    std::vector<float> embd(64 * 10, 0.5f);
    w.add_tensor_f32("token_embd.weight", {64, 10}, GgmlType::kF32, embd);
    const std::vector<uint8_t> bytes = w.to_bytes();
    return read_llama_spec(GgufFile::from_bytes(bytes, "meta.gguf"));
  }
};

TEST(Llama, SpecDefaultsAndScaling) {
  MetaFile m;
  TransformerSpec s = m.read();
  EXPECT_EQ(s.head_dim, 16);  // embedding_length / head_count
  EXPECT_EQ(s.rope.n_rot, 16);
  EXPECT_EQ(s.rope.theta, 10000.0f);
  EXPECT_EQ(s.rms_eps, 1e-5f);
  EXPECT_EQ(s.n_vocab, 10);
  EXPECT_EQ(s.rope.style, RopeStyle::kNormal);
  EXPECT_EQ(s.attn_scale, 0.0f);  // no llama.attention.scale: 1/sqrt(head_dim)
  m.extra = [](GgufWriter& w) {
    w.set_string("llama.rope.scaling.type", "linear");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
  };
  m.u32["rope.dimension_count"] = 8;
  s = m.read();
  EXPECT_EQ(s.rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(s.rope.factor, 4.0f);
  EXPECT_EQ(s.rope.n_rot, 8);

  MetaFile old_key;
  old_key.extra = [](GgufWriter& w) { w.set_f32("llama.rope.scale_linear", 2.0f); };
  EXPECT_EQ(old_key.read().rope.factor, 2.0f);
  // As llama.cpp reads the type: absent is linear, "none" never scales.
  MetaFile untyped;
  untyped.extra = [](GgufWriter& w) { w.set_f32("llama.rope.scaling.factor", 3.0f); };
  EXPECT_EQ(untyped.read().rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(untyped.read().rope.factor, 3.0f);
  MetaFile none;
  none.extra = [](GgufWriter& w) {
    w.set_string("llama.rope.scaling.type", "none");
    w.set_f32("llama.rope.scaling.factor", 3.0f);
    w.set_f32("llama.rope.scale_linear", 2.0f);
  };
  EXPECT_EQ(none.read().rope.scaling, RopeScaling::kNone);
  MetaFile bad_linear;
  bad_linear.extra = [](GgufWriter& w) { w.set_f32("llama.rope.scale_linear", -2.0f); };
  EXPECT_NE(error_message([&] { bad_linear.read(); }, ErrorCode::kCorrupt).find("'llama.rope.scale_linear' is -2"),
            std::string::npos);
  EXPECT_EQ(MetaFile("qwen2").read().rope.style, RopeStyle::kNeox);
  EXPECT_EQ(MetaFile("internlm2").read().rope.style, RopeStyle::kNormal);
  EXPECT_EQ(MetaFile("internlm2").read().arch, "internlm2");

  MetaFile scaled;
  scaled.extra = [](GgufWriter& w) { w.set_f32("llama.attention.scale", 0.05f); };
  EXPECT_EQ(scaled.read().attn_scale, 0.05f);
}

// YaRN as Qwen2.5's converter writes it (type, factor, original context),
// and llama.cpp's fallbacks: no factor is 1, no original context is the
// trained one, attn_factor 1 unless given.
TEST(Llama, SpecReadsYarnScaling) {
  MetaFile m("qwen2");
  m.u32["context_length"] = 131072;
  m.extra = [](GgufWriter& w) {
    w.set_string("qwen2.rope.scaling.type", "yarn");
    w.set_f32("qwen2.rope.scaling.factor", 4.0f);
    w.set_u32("qwen2.rope.scaling.original_context_length", 32768);
  };
  TransformerSpec s = m.read();
  EXPECT_EQ(s.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(s.rope.factor, 4.0f);
  EXPECT_EQ(s.rope.original_context, 32768);
  EXPECT_EQ(s.rope.attn_factor, 1.0f);
  EXPECT_EQ(s.rope.beta_fast, 32.0f);
  EXPECT_EQ(s.rope.beta_slow, 1.0f);
  EXPECT_EQ(s.context_length, 131072);

  m.extra = [](GgufWriter& w) {
    w.set_string("qwen2.rope.scaling.type", "yarn");
    w.set_f32("qwen2.rope.scaling.attn_factor", 0.5f);
  };
  s = m.read();
  EXPECT_EQ(s.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(s.rope.factor, 1.0f);
  EXPECT_EQ(s.rope.original_context, 131072);  // context_length
  EXPECT_EQ(s.rope.attn_factor, 0.5f);

  MetaFile plain;  // attn_factor without a scaling type: llama.cpp applies it all the same
  plain.extra = [](GgufWriter& w) { w.set_f32("llama.rope.scaling.attn_factor", 1.5f); };
  s = plain.read();
  EXPECT_EQ(s.rope.scaling, RopeScaling::kNone);
  EXPECT_EQ(s.rope.attn_factor, 1.5f);
}

// Each bad YaRN key (and attn_factor, which any scaling takes) is refused
// naming it; without any original context the message names both keys it
// looked for.
TEST(Llama, BadYarnScalingIsRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const double factor : {0.5, 0.0, -4.0, nan, 1e300}) {
    SCOPED_TRACE(factor);
    MetaFile m;
    m.extra = [factor](GgufWriter& w) {
      w.set_string("llama.rope.scaling.type", "yarn");
      w.set_f64("llama.rope.scaling.factor", factor);
      w.set_u32("llama.rope.scaling.original_context_length", 4096);
    };
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt)
                  .find("'llama.rope.scaling.factor'"),
              std::string::npos);
  }
  for (const double attn_factor : {0.0, -1.0, nan}) {
    SCOPED_TRACE(attn_factor);
    MetaFile m;
    m.extra = [attn_factor](GgufWriter& w) { w.set_f64("llama.rope.scaling.attn_factor", attn_factor); };
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt).find("'llama.rope.scaling.attn_factor'"),
              std::string::npos);
  }
  {
    MetaFile m;
    m.extra = [](GgufWriter& w) {
      w.set_string("llama.rope.scaling.type", "yarn");
      w.set_u32("llama.rope.scaling.original_context_length", 0);
    };
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt)
                  .find("'llama.rope.scaling.original_context_length'"),
              std::string::npos);
  }
  {
    MetaFile m;
    m.extra = [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "yarn"); };
    const std::string message = error_message([&] { m.read(); }, ErrorCode::kCorrupt);
    EXPECT_NE(message.find("'llama.rope.scaling.original_context_length' or 'llama.context_length'"),
              std::string::npos)
        << message;
  }
}

// attention.scale must be a finite f32 value > 0; the message names the key.
TEST(Llama, BadAttentionScaleIsRefused) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {0.0, -0.125, inf, -inf, std::numeric_limits<double>::quiet_NaN(), 1e300}) {
    SCOPED_TRACE(bad);
    MetaFile m;
    m.extra = [bad](GgufWriter& w) { w.set_f64("llama.attention.scale", bad); };
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt).find("'llama.attention.scale'"), std::string::npos);
  }
}

TEST(Llama, SpecErrorsNameTheKey) {
  {
    MetaFile m("gptneox");
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kUnsupported).find("architecture 'gptneox'"),
              std::string::npos);
  }
  {
    MetaFile m;
    m.extra = [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); };
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kUnsupported).find("'llama.rope.scaling.type' is 'longrope'"),
              std::string::npos);
  }
  {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.embedding_length", 64);
    const std::vector<uint8_t> bytes = w.to_bytes();
    const std::string message =
        error_message([&] { read_llama_spec(GgufFile::from_bytes(bytes, "x.gguf")); }, ErrorCode::kCorrupt);
    EXPECT_NE(message.find("llama.block_count"), std::string::npos) << message;
  }
  {
    MetaFile m;
    m.u32["attention.head_count"] = 3;
    m.u32["attention.key_length"] = 16;
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt).find("head_count_kv"), std::string::npos);
  }
  {
    MetaFile m;
    m.u32["rope.dimension_count"] = 7;
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt).find("rope.dimension_count"), std::string::npos);
  }
  {
    MetaFile m;
    m.u32["attention.value_length"] = 32;
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kUnsupported).find("value_length"), std::string::npos);
  }
  {
    MetaFile m;
    m.u32["vocab_size"] = 11;
    EXPECT_NE(error_message([&] { m.read(); }, ErrorCode::kCorrupt).find("vocab_size"), std::string::npos);
  }
}

}  // namespace
}  // namespace longctx::model
