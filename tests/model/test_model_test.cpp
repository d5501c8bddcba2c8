// The test-model generator (tools/test_model.h): every standard preset opens
// with GgufFile and holds exactly the documented keys, tensors and shapes;
// files are byte-identical for a seed and differ between seeds; weights have
// the documented statistics; the vocabulary is a usable SentencePiece vocab;
// rope_freqs follows the Llama-3.1 rule; bad specs are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/gguf.h"
#include "longctx/tools/test_model.h"

namespace longctx::tools {
namespace {

using longctx::GgmlType;
using model::GgufFile;

// Presets small enough to generate many times under ASan ("bench" is ~160 MB).
std::vector<TestModelSpec> small_presets() {
  std::vector<TestModelSpec> specs;
  for (auto& s : standard_test_models())
    if (s.name != "bench") specs.push_back(s);
  return specs;
}

int utf8_chars(const std::string& s) {
  return static_cast<int>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

TEST(TestModel, PresetsAreTheDocumentedShapes) {
  std::map<std::string, TestModelSpec> by_name;
  for (const auto& s : standard_test_models()) by_name[s.name] = s;
  ASSERT_EQ(by_name.size(), 7u);
  EXPECT_EQ(by_name["mha-64"].n_heads, by_name["mha-64"].n_kv_heads);
  EXPECT_EQ(by_name["mha-64"].head_dim, 64);
  EXPECT_EQ(by_name["gqa-128"].n_heads, 4 * by_name["gqa-128"].n_kv_heads);
  EXPECT_EQ(by_name["gqa-128"].head_dim, 128);
  EXPECT_NE(by_name["gqa-128"].n_embd, by_name["gqa-128"].n_heads * by_name["gqa-128"].head_dim);
  EXPECT_TRUE(by_name["qwen2-bias"].qkv_bias);
  EXPECT_EQ(by_name["qwen2-bias"].arch, "qwen2");
  EXPECT_EQ(by_name["q8"].weight_type, GgmlType::kQ8_0);
  EXPECT_EQ(by_name["f16"].weight_type, GgmlType::kF16);
  EXPECT_TRUE(by_name["llama3-rope"].llama3_rope);
  const TestModelSpec& b = by_name["bench"];
  EXPECT_EQ(b.n_heads, 32);
  EXPECT_EQ(b.n_kv_heads, 8);
  EXPECT_EQ(b.head_dim, 128);
  // f32 parameters: embeddings + output + per layer q, k, v, o and the 3 MLP matrices.
  const int64_t q = int64_t{b.n_heads} * b.head_dim, kv = int64_t{b.n_kv_heads} * b.head_dim;
  const int64_t params = 2 * int64_t{b.n_vocab} * b.n_embd +
                         b.n_layers * (b.n_embd * (2 * q + 2 * kv) + 3 * int64_t{b.n_embd} * b.n_ff);
  EXPECT_LT(params * 4, int64_t{200} << 20);

  EXPECT_EQ(test_model_by_name("q8").weight_type, GgmlType::kQ8_0);
  try {
    test_model_by_name("nope");
    FAIL() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("gqa-128"), std::string::npos) << e.what();
  }
}

// The expected tensor table of a spec, from the header's layout comment.
std::map<std::string, std::pair<std::vector<int64_t>, GgmlType>> expected_tensors(const TestModelSpec& s) {
  const int64_t e = s.n_embd, q = int64_t{s.n_heads} * s.head_dim, kv = int64_t{s.n_kv_heads} * s.head_dim;
  const GgmlType w = s.weight_type, f = GgmlType::kF32;
  std::map<std::string, std::pair<std::vector<int64_t>, GgmlType>> t;
  t["token_embd.weight"] = {{e, s.n_vocab}, w};
  t["output_norm.weight"] = {{e}, f};
  if (!s.tie_embeddings) t["output.weight"] = {{e, s.n_vocab}, w};
  if (s.llama3_rope) t["rope_freqs.weight"] = {{s.head_dim / 2}, f};
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t[p + "attn_norm.weight"] = {{e}, f};
    t[p + "ffn_norm.weight"] = {{e}, f};
    t[p + "attn_q.weight"] = {{e, q}, w};
    t[p + "attn_k.weight"] = {{e, kv}, w};
    t[p + "attn_v.weight"] = {{e, kv}, w};
    if (s.qkv_bias) {
      t[p + "attn_q.bias"] = {{q}, f};
      t[p + "attn_k.bias"] = {{kv}, f};
      t[p + "attn_v.bias"] = {{kv}, f};
    }
    t[p + "attn_output.weight"] = {{q, e}, w};
    t[p + "ffn_gate.weight"] = {{e, s.n_ff}, w};
    t[p + "ffn_up.weight"] = {{e, s.n_ff}, w};
    t[p + "ffn_down.weight"] = {{s.n_ff, e}, w};
  }
  return t;
}

TEST(TestModel, FilesHoldTheDocumentedKeysAndTensors) {
  for (const auto& s : small_presets()) {
    SCOPED_TRACE(s.name);
    const auto bytes = make_test_model(s).to_bytes();
    const GgufFile f = GgufFile::from_bytes(bytes, s.name);
    const std::string a = s.arch;
    EXPECT_EQ(f.get_string("general.architecture"), a);
    EXPECT_EQ(f.get_uint(a + ".context_length"), static_cast<uint64_t>(s.context_length));
    EXPECT_EQ(f.get_uint(a + ".embedding_length"), static_cast<uint64_t>(s.n_embd));
    EXPECT_EQ(f.get_uint(a + ".block_count"), static_cast<uint64_t>(s.n_layers));
    EXPECT_EQ(f.get_uint(a + ".feed_forward_length"), static_cast<uint64_t>(s.n_ff));
    EXPECT_EQ(f.get_uint(a + ".attention.head_count"), static_cast<uint64_t>(s.n_heads));
    EXPECT_EQ(f.get_uint(a + ".attention.head_count_kv"), static_cast<uint64_t>(s.n_kv_heads));
    EXPECT_EQ(f.get_uint(a + ".attention.key_length"), static_cast<uint64_t>(s.head_dim));
    EXPECT_EQ(f.get_uint(a + ".attention.value_length"), static_cast<uint64_t>(s.head_dim));
    EXPECT_EQ(f.get_uint(a + ".rope.dimension_count"), static_cast<uint64_t>(s.head_dim));
    EXPECT_EQ(f.get_uint(a + ".vocab_size"), static_cast<uint64_t>(s.n_vocab));
    EXPECT_EQ(f.get_float(a + ".attention.layer_norm_rms_epsilon"), s.rms_eps);
    EXPECT_EQ(f.get_float(a + ".rope.freq_base"), s.rope_theta);
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 1u);
    EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 2u);
    EXPECT_EQ(f.get_uint("tokenizer.ggml.unknown_token_id"), 0u);
    EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
    EXPECT_NE(f.get_string("tokenizer.chat_template").find("[INST]"), std::string::npos);

    const auto expected = expected_tensors(s);
    EXPECT_EQ(f.tensors().size(), expected.size());
    for (const auto& t : f.tensors()) {
      const auto it = expected.find(t.name);
      ASSERT_NE(it, expected.end()) << "unexpected tensor " << t.name;
      EXPECT_EQ(t.dims, it->second.first) << t.name;
      EXPECT_EQ(t.type, it->second.second) << t.name;
    }
  }
}

TEST(TestModel, VocabularyIsAUsableSentencePieceVocab) {
  TestModelSpec s = test_model_by_name("mha-64");
  for (const int n_vocab : {259, 320, 4096}) {
    SCOPED_TRACE(n_vocab);
    s.n_vocab = n_vocab, s.n_layers = 1, s.n_embd = 32, s.n_ff = 32, s.n_heads = 1, s.n_kv_heads = 1, s.head_dim = 32;
    const auto bytes = make_test_model(s).to_bytes();
    const GgufFile f = GgufFile::from_bytes(bytes, "vocab");
    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    const auto scores = f.get_f32_array("tokenizer.ggml.scores");
    const auto types = f.get_i32_array("tokenizer.ggml.token_type");
    ASSERT_EQ(tokens.size(), static_cast<size_t>(n_vocab));
    ASSERT_EQ(scores.size(), tokens.size());
    ASSERT_EQ(types.size(), tokens.size());
    EXPECT_EQ(tokens[0], "<unk>");
    EXPECT_EQ(tokens[1], "<s>");
    EXPECT_EQ(tokens[2], "</s>");
    EXPECT_EQ(types[0], 2);
    EXPECT_EQ(types[1], 3);
    EXPECT_EQ(types[2], 3);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      EXPECT_EQ(tokens[3 + b], name);
      EXPECT_EQ(types[3 + b], 6);
    }
    const std::set<std::string_view> vocab(tokens.begin(), tokens.end());
    EXPECT_EQ(vocab.size(), tokens.size()) << "duplicate pieces";
    for (size_t i = 259; i < tokens.size(); ++i) {
      const std::string piece(tokens[i]);
      EXPECT_EQ(types[i], 1) << piece;
      if (i > 259) {
        EXPECT_LT(scores[i], scores[i - 1]) << piece;
      }
      // SentencePiece BPE builds a piece by merging two adjacent pieces.
      if (utf8_chars(piece) < 2) continue;
      bool reachable = false;
      for (size_t cut = 1; cut < piece.size() && !reachable; ++cut)
        reachable = vocab.count(piece.substr(0, cut)) && vocab.count(piece.substr(cut));
      EXPECT_TRUE(reachable) << "piece '" << piece << "' is no concatenation of two pieces";
    }
    if (n_vocab >= 320) {
      for (const char* p : {"▁", "▁the", "e", "z", "he"}) EXPECT_TRUE(vocab.count(p)) << p;
    }
  }
}

TEST(TestModel, DeterministicForASeedAndDifferentAcrossSeeds) {
  for (const auto& s : small_presets()) {
    SCOPED_TRACE(s.name);
    const auto a = make_test_model(s).to_bytes();
    EXPECT_EQ(a, make_test_model(s).to_bytes());
    TestModelSpec other = s;
    other.seed = s.seed + 1;
    const auto b = make_test_model(other).to_bytes();
    ASSERT_EQ(a.size(), b.size());  // same layout, other values
    const GgufFile fa = GgufFile::from_bytes(a, "a"), fb = GgufFile::from_bytes(b, "b");
    for (const auto& t : fa.tensors()) {
      if (t.name == "rope_freqs.weight") continue;  // computed, not random
      const auto da = fa.tensor_data(t), db = fb.tensor_data(*fb.find_tensor(t.name));
      EXPECT_FALSE(std::equal(da.begin(), da.end(), db.begin(), db.end())) << t.name;
    }
  }
  // The file the CLI path writes is the same bytes, and it opens from disk.
  const TestModelSpec s = test_model_by_name("q8");
  const auto path = (std::filesystem::temp_directory_path() / "longctx_test_model_q8.gguf").string();
  make_test_model(s).write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.file_size(), make_test_model(s).to_bytes().size());
  std::filesystem::remove(path);
}

// Sample mean and standard deviation of a tensor's values.
std::pair<double, double> moments(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (const float x : v) sum += x, sq += double{x} * x;
  const double mean = sum / v.size();
  return {mean, std::sqrt(sq / v.size() - mean * mean)};
}

TEST(TestModel, WeightsHaveTheDocumentedScales) {
  const TestModelSpec s = test_model_by_name("gqa-128");
  const auto bytes = make_test_model(s).to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, s.name);
  // For n normal samples of std sigma, the sample mean has std sigma/sqrt(n)
  // and the sample std has std sigma/sqrt(2n): allow 5 of those.
  auto expect_normal = [&](const std::string& name, double mean, double sigma) {
    const auto v = f.tensor_f32(*f.find_tensor(name));
    const auto [m, sd] = moments(v);
    const double n = static_cast<double>(v.size());
    EXPECT_NEAR(m, mean, 5 * sigma / std::sqrt(n)) << name;
    EXPECT_NEAR(sd, sigma, 5 * sigma / std::sqrt(2 * n)) << name;
  };
  const double q_dim = static_cast<double>(s.n_heads) * s.head_dim;
  expect_normal("token_embd.weight", 0, 1);
  expect_normal("output.weight", 0, 2 / std::sqrt(static_cast<double>(s.n_embd)));
  expect_normal("output_norm.weight", 1, 0.1);
  expect_normal("blk.1.attn_q.weight", 0, 1 / std::sqrt(static_cast<double>(s.n_embd)));
  expect_normal("blk.1.attn_k.weight", 0, 1 / std::sqrt(static_cast<double>(s.n_embd)));
  expect_normal("blk.0.attn_output.weight", 0, 1 / std::sqrt(q_dim));
  expect_normal("blk.0.ffn_up.weight", 0, 1 / std::sqrt(static_cast<double>(s.n_embd)));
  expect_normal("blk.0.ffn_down.weight", 0, 1 / std::sqrt(static_cast<double>(s.n_ff)));
  expect_normal("blk.0.ffn_norm.weight", 1, 0.1);
  const TestModelSpec q = test_model_by_name("qwen2-bias");
  const auto qbytes = make_test_model(q).to_bytes();
  const GgufFile qf = GgufFile::from_bytes(qbytes, q.name);
  const auto bias = qf.tensor_f32(*qf.find_tensor("blk.0.attn_q.bias"));
  EXPECT_NEAR(moments(bias).second, 0.2, 5 * 0.2 / std::sqrt(2.0 * bias.size()));
}

TEST(TestModel, QuantizedWeightsAreTheF32WeightsRounded) {
  // Same seed, so the same values before storage: Q8_0 rounds each value to
  // the nearest multiple of d = absmax(block of 32) / 127 (d itself stored as
  // f16, relative error <= 2^-11, i.e. <= 127 * 2^-11 * d on the largest q),
  // F16 to 11 significant bits.
  TestModelSpec s = test_model_by_name("q8");
  s.n_layers = 1;
  const auto q_bytes = make_test_model(s).to_bytes();
  TestModelSpec h = s;
  h.weight_type = GgmlType::kF16;
  const auto h_bytes = make_test_model(h).to_bytes();
  s.weight_type = GgmlType::kF32;
  const auto f_bytes = make_test_model(s).to_bytes();
  const GgufFile qf = GgufFile::from_bytes(q_bytes, "q8"), hf = GgufFile::from_bytes(h_bytes, "f16"),
                 ff = GgufFile::from_bytes(f_bytes, "f32");
  for (const char* name : {"token_embd.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight"}) {
    SCOPED_TRACE(name);
    const auto q = qf.tensor_f32(*qf.find_tensor(name));
    const auto h16 = hf.tensor_f32(*hf.find_tensor(name));
    const auto x = ff.tensor_f32(*ff.find_tensor(name));
    ASSERT_EQ(q.size(), x.size());
    for (size_t b = 0; b < x.size(); b += 32) {
      float absmax = 0;
      for (size_t i = b; i < b + 32; ++i) absmax = std::max(absmax, std::fabs(x[i]));
      const double d = absmax / 127.0;
      for (size_t i = b; i < b + 32; ++i) {
        ASSERT_LE(std::fabs(q[i] - x[i]), d * (0.5 + 127 * 0x1p-11 + 1e-6)) << i;
        ASSERT_LE(std::fabs(h16[i] - x[i]), std::fabs(x[i]) * 0x1p-11 + 0x1p-25) << i;  // + half an f16 subnormal step
      }
    }
  }
}

TEST(TestModel, RopeFreqsFollowTheLlama31Rule) {
  const TestModelSpec s = test_model_by_name("llama3-rope");
  const auto bytes = make_test_model(s).to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, s.name);
  const auto factors = f.tensor_f32(*f.find_tensor("rope_freqs.weight"));
  ASSERT_EQ(factors.size(), static_cast<size_t>(s.head_dim / 2));
  // Meta's apply_scaling (Llama 3.1 reference code): scale 8, low 1, high 4, old context 8192.
  int n_one = 0, n_eight = 0;
  for (int i = 0; i < s.head_dim / 2; ++i) {
    const double inv_freq = 1.0 / std::pow(double{s.rope_theta}, 2.0 * i / s.head_dim);
    const double wavelen = 2 * std::numbers::pi / inv_freq;
    double expect;
    if (wavelen < 8192.0 / 4) expect = 1, ++n_one;
    else if (wavelen > 8192.0 / 1) expect = 8, ++n_eight;
    else {
      // smoothed frequency = (1 - smooth) * inv_freq / 8 + smooth * inv_freq; the factor is inv_freq / that.
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      expect = inv_freq / ((1 - smooth) * inv_freq / 8 + smooth * inv_freq);
    }
    EXPECT_NEAR(factors[i], expect, expect * 0x1p-23) << i;
    if (i > 0) {
      EXPECT_GE(factors[i], factors[i - 1]);
    }
  }
  // The preset exercises all three regimes.
  EXPECT_GT(n_one, 0);
  EXPECT_GT(n_eight, 0);
  EXPECT_LT(n_one + n_eight, s.head_dim / 2);
}

TEST(TestModel, BadSpecsAreRejected) {
  auto rejects = [](TestModelSpec s, const char* what) {
    try {
      make_test_model(s);
      ADD_FAILURE() << what << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
    }
  };
  TestModelSpec s = test_model_by_name("mha-64");
  s.arch = "gpt2";
  rejects(s, "arch gpt2");
  s = test_model_by_name("gqa-128");
  s.n_kv_heads = 3;
  rejects(s, "8 heads over 3 kv heads");
  s = test_model_by_name("mha-64");
  s.n_vocab = 258;
  rejects(s, "n_vocab 258");
  s.n_vocab = 1 << 20;
  rejects(s, "vocab larger than the generated pieces");
  s = test_model_by_name("q8");
  s.n_embd = 48;
  rejects(s, "Q8_0 rows of 48");
  s = test_model_by_name("mha-64");
  s.head_dim = 63;
  rejects(s, "odd head_dim");
  s = test_model_by_name("mha-64");
  s.weight_type = GgmlType::kQ4_K;
  rejects(s, "weight type without a quantizer");
}

}  // namespace
}  // namespace longctx::tools
