// The test-model generator (tools/test_model.h): every standard preset opens
// with GgufFile and holds exactly the documented keys, tensors and shapes;
// files are byte-identical for a seed and differ between seeds, and the same
// on disk as in memory; weights have the documented statistics and values;
// the SentencePiece and Llama-3 vocabularies are usable; the q4_k_m / q5_k_m
// mixes follow llama.cpp's rule (checked on the 32-layer Llama-3-8B layout
// without generating it); rope_freqs follows the Llama-3.1 rule; bad specs
// are rejected.
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
#include "longctx/core/file.h"
#include "longctx/core/random.h"
#include "longctx/model/gguf.h"
#include "longctx/model/tokenizer.h"
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

// The documented type of a 2-D weight of a mixed spec (q2_k .. q5_k_m) of
// fewer than 80 layers whose rows are multiples of 256: Q6_K for
// output.weight; q4_k_m / q5_k_m: Q6_K for attn_v / ffn_down of the
// use_more_bits layers; q3_k_m: attn_v Q5_K in layers 0 and 1, else Q4_K,
// ffn_down Q5_K below n/16, else Q4_K, attn_output Q4_K; q2_k: attn_v Q4_K
// at GQA 4 or more (else Q3_K), ffn_down and attn_output Q3_K; else the base type.
GgmlType mixed_type(const TestModelSpec& s, const std::string& name, GgmlType plain) {
  if (!s.k_mix || plain == GgmlType::kF32) return plain;
  if (name == "output.weight") return GgmlType::kQ6_K;
  const int n = s.n_layers;
  for (int i = 0; i < n; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool v = name == p + "attn_v.weight", down = name == p + "ffn_down.weight";
    const bool out = name == p + "attn_output.weight";
    if (plain == GgmlType::kQ3_K) {
      if (v) return i < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      if (down) return i < n / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      if (out) return GgmlType::kQ4_K;
    } else if (plain == GgmlType::kQ2_K) {
      if (v) return s.n_heads >= 4 * s.n_kv_heads ? GgmlType::kQ4_K : GgmlType::kQ3_K;
      if (down || out) return GgmlType::kQ3_K;
    } else {
      const bool more_bits = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
      if (more_bits && (v || down)) return GgmlType::kQ6_K;
    }
  }
  return plain;
}

int utf8_chars(const std::string& s) {
  return static_cast<int>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

TEST(TestModel, PresetsAreTheDocumentedShapes) {
  std::map<std::string, TestModelSpec> by_name;
  for (const auto& s : standard_test_models()) by_name[s.name] = s;
  ASSERT_EQ(by_name.size(), 14u);
  EXPECT_EQ(by_name["mha-64"].n_heads, by_name["mha-64"].n_kv_heads);
  EXPECT_EQ(by_name["mha-64"].head_dim, 64);
  EXPECT_EQ(by_name["gqa-128"].n_heads, 4 * by_name["gqa-128"].n_kv_heads);
  EXPECT_EQ(by_name["gqa-128"].head_dim, 128);
  EXPECT_NE(by_name["gqa-128"].n_embd, by_name["gqa-128"].n_heads * by_name["gqa-128"].head_dim);
  EXPECT_TRUE(by_name["qwen2-bias"].qkv_bias);
  EXPECT_EQ(by_name["qwen2-bias"].arch, "qwen2");
  EXPECT_EQ(by_name["qwen2-yarn"].arch, "qwen2");
  EXPECT_EQ(by_name["qwen2-yarn"].yarn_factor, 4.0f);
  EXPECT_EQ(by_name["qwen2-yarn"].yarn_original_context, 32768);
  EXPECT_EQ(by_name["q8"].weight_type, GgmlType::kQ8_0);
  EXPECT_EQ(by_name["f16"].weight_type, GgmlType::kF16);
  EXPECT_TRUE(by_name["llama3-rope"].llama3_rope);
  for (const char* format : {"q4_0", "q6_k", "q4_k_m", "q5_k_m", "q3_k_m", "q2_k"}) {
    const TestModelSpec& q = by_name[format];
    EXPECT_EQ(weight_format_name(q), format);
    EXPECT_EQ(q.head_dim, 128);
    EXPECT_EQ(q.n_embd % 256 + q.n_ff % 256 + q.n_heads * q.head_dim % 256, 0) << format;
  }
  EXPECT_EQ(by_name["q4_k_m"].n_layers, 3);
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
  const TestModelSpec l3 = test_model_by_name("llama3-8b");
  EXPECT_EQ(l3.n_layers, 32);
  EXPECT_EQ(l3.n_embd, 4096);
  EXPECT_EQ(l3.n_heads, 32);
  EXPECT_EQ(l3.n_kv_heads, 8);
  EXPECT_EQ(l3.head_dim, 128);
  EXPECT_EQ(l3.n_ff, 14336);
  EXPECT_EQ(l3.n_vocab, 128256);
  EXPECT_TRUE(l3.llama3_vocab);
  EXPECT_TRUE(l3.llama3_rope);
  EXPECT_EQ(l3.rope_theta, 500000.0f);
  EXPECT_EQ(l3.context_length, 131072);
  EXPECT_EQ(weight_format_name(l3), "q4_k_m");
  TestModelSpec l4 = test_model_by_name("llama3-8b-4l");
  EXPECT_EQ(l4.n_layers, 4);
  l4.n_layers = 32, l4.name = l3.name;
  EXPECT_EQ(weight_format_name(l4), weight_format_name(l3));
  const TestModelSpec qw = test_model_by_name("qwen2.5-7b");
  EXPECT_EQ(qw.arch, "qwen2");
  EXPECT_EQ(qw.n_layers, 28);
  EXPECT_EQ(qw.n_embd, 3584);
  EXPECT_EQ(qw.n_heads, 28);
  EXPECT_EQ(qw.n_kv_heads, 4);
  EXPECT_EQ(qw.head_dim, 128);
  EXPECT_EQ(qw.n_ff, 18944);
  EXPECT_EQ(qw.n_vocab, 152064);
  EXPECT_TRUE(qw.qkv_bias);
  EXPECT_EQ(qw.yarn_factor, 4.0f);
  EXPECT_EQ(qw.yarn_original_context, 32768);
  EXPECT_EQ(weight_format_name(qw), "q4_k_m");
  EXPECT_EQ(test_model_by_name("qwen2.5-7b-4l").n_layers, 4);
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
  const GgmlType w = s.weight_type, f = GgmlType::kF32;  // plain formats only
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
    EXPECT_EQ(f.get_uint("general.quantization_version"), 2u);
    const std::map<std::string, uint64_t> file_types = {{"f32", 0},     {"f16", 1},      {"q8_0", 7},
                                                        {"q4_0", 2},    {"q6_k", 18},    {"q4_k_m", 15},
                                                        {"q5_k_m", 17}, {"q3_k_m", 12}, {"q2_k", 10}};
    EXPECT_EQ(f.get_uint("general.file_type"), file_types.at(weight_format_name(s)));

    const auto expected = expected_tensors(s);
    EXPECT_EQ(f.tensors().size(), expected.size());
    for (const auto& t : f.tensors()) {
      const auto it = expected.find(t.name);
      ASSERT_NE(it, expected.end()) << "unexpected tensor " << t.name;
      EXPECT_EQ(t.dims, it->second.first) << t.name;
      EXPECT_EQ(t.type, mixed_type(s, t.name, it->second.second)) << t.name;
      EXPECT_EQ(t.type, tensor_type(s, t.name)) << t.name;
    }
  }
}

// The mixes on Llama-3-8B's layout (32 layers), as llama-quantize makes them:
// attn_v and ffn_down in Q6_K on layers 0-3, 6, 9, ..., 27 and 28-31
// (llama.cpp's use_more_bits), output in Q6_K, the rest in the base type;
// the llama.cpp fallbacks for rows that are not multiples of 256.
TEST(TestModel, KQuantMixesFollowLlamaCpp) {
  TestModelSpec s = test_model_by_name("llama3-8b");
  const std::set<int> six = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  for (const char* format : {"q4_k_m", "q5_k_m"}) {
    set_weight_format(s, format);
    const GgmlType base = std::string(format) == "q4_k_m" ? GgmlType::kQ4_K : GgmlType::kQ5_K;
    EXPECT_EQ(tensor_type(s, "output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(tensor_type(s, "token_embd.weight"), base);
    EXPECT_EQ(tensor_type(s, "output_norm.weight"), GgmlType::kF32);
    EXPECT_EQ(tensor_type(s, "rope_freqs.weight"), GgmlType::kF32);
    for (int i = 0; i < 32; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      const GgmlType v = six.count(i) ? GgmlType::kQ6_K : base;
      EXPECT_EQ(tensor_type(s, p + "attn_v.weight"), v) << format << " " << i;
      EXPECT_EQ(tensor_type(s, p + "ffn_down.weight"), v) << format << " " << i;
      for (const char* t : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
        EXPECT_EQ(tensor_type(s, p + t), base) << p << t;
      EXPECT_EQ(tensor_type(s, p + "attn_norm.weight"), GgmlType::kF32);
    }
  }
  set_weight_format(s, "q4_k_m");
  s.n_layers = 4;  // llama3-8b-4l: layers 2 and 3
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(tensor_type(s, "blk." + std::to_string(i) + ".attn_v.weight"), i >= 2 ? GgmlType::kQ6_K : GgmlType::kQ4_K);
  s.n_layers = 80;  // llama.cpp's 70B (GQA): the other attn_v move up to Q5_K
  EXPECT_EQ(tensor_type(s, "blk.40.attn_v.weight"), GgmlType::kQ5_K);
  EXPECT_EQ(tensor_type(s, "blk.42.attn_v.weight"), GgmlType::kQ6_K);  // (42 - 80/8) % 3 == 2
  s.n_layers = 32;
  s.tie_embeddings = true;  // the embedding is the output
  EXPECT_EQ(tensor_type(s, "token_embd.weight"), GgmlType::kQ6_K);
  s.tie_embeddings = false;
  s.n_ff = 14336 + 32;  // ffn_down rows not a multiple of 256: Q4_K -> Q5_0, Q6_K -> Q8_0
  EXPECT_EQ(tensor_type(s, "blk.4.ffn_down.weight"), GgmlType::kQ5_0);
  EXPECT_EQ(tensor_type(s, "blk.0.ffn_down.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(tensor_type(s, "blk.4.ffn_gate.weight"), GgmlType::kQ4_K);
  s.n_ff = 14336 + 16;  // not a multiple of 32 either: F16
  EXPECT_EQ(tensor_type(s, "blk.4.ffn_down.weight"), GgmlType::kF16);
  set_weight_format(s, "q5_k_m");
  s.n_embd = 4096 + 32;  // Q5_K -> Q5_1; the output goes to Q8_0
  EXPECT_EQ(tensor_type(s, "blk.4.attn_q.weight"), GgmlType::kQ5_1);
  EXPECT_EQ(tensor_type(s, "output.weight"), GgmlType::kQ8_0);
  s.n_embd = 4096 + 16;  // and Q8_0 output rows must be multiples of 32, as llama.cpp requires
  try {
    tensor_type(s, "output.weight");
    ADD_FAILURE() << "output rows of 4112 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'output.weight'"), std::string::npos) << e.what();
  }
  // q3_k_m and q2_k on the 32 layers (GQA 4): Q5_K attn_v in layers 0-1 and
  // ffn_down in layers 0-1 (32 / 16), Q4_K attn_v, ffn_down, attn_output
  // after; q2_k: Q4_K attn_v, Q3_K ffn_down and attn_output.
  const TestModelSpec before = s;
  s = test_model_by_name("llama3-8b");
  for (const char* format : {"q3_k_m", "q2_k"}) {
    set_weight_format(s, format);
    const bool q3 = std::string(format) == "q3_k_m";
    const GgmlType base = q3 ? GgmlType::kQ3_K : GgmlType::kQ2_K;
    EXPECT_EQ(tensor_type(s, "output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(tensor_type(s, "token_embd.weight"), base);
    for (int i = 0; i < 32; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      const GgmlType q5_early = i < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
      EXPECT_EQ(tensor_type(s, p + "attn_v.weight"), q3 ? q5_early : GgmlType::kQ4_K) << format << " " << i;
      EXPECT_EQ(tensor_type(s, p + "ffn_down.weight"), q3 ? q5_early : GgmlType::kQ3_K) << format << " " << i;
      EXPECT_EQ(tensor_type(s, p + "attn_output.weight"), q3 ? GgmlType::kQ4_K : GgmlType::kQ3_K) << format;
      for (const char* t : {"attn_q.weight", "attn_k.weight", "ffn_gate.weight", "ffn_up.weight"})
        EXPECT_EQ(tensor_type(s, p + t), base) << p << t;
    }
  }
  s.n_kv_heads = 16;  // GQA 2: q2_k's attn_v stays Q3_K
  EXPECT_EQ(tensor_type(s, "blk.5.attn_v.weight"), GgmlType::kQ3_K);
  s.n_kv_heads = 8;
  s.n_layers = 80;  // 70B: Q3_K and Q4_K attn_v move up to Q5_K
  EXPECT_EQ(tensor_type(s, "blk.40.attn_v.weight"), GgmlType::kQ5_K);
  set_weight_format(s, "q3_k_m");
  EXPECT_EQ(tensor_type(s, "blk.40.attn_v.weight"), GgmlType::kQ5_K);
  EXPECT_EQ(tensor_type(s, "blk.4.ffn_down.weight"), GgmlType::kQ5_K);  // 4 < 80 / 16
  s.n_layers = 32;
  s.n_embd = 4096 + 32;  // Q3_K rows that are not whole blocks: llama.cpp's IQ4_NL, refused
  try {
    tensor_type(s, "blk.4.attn_q.weight");
    ADD_FAILURE() << "q3_k rows of 4128 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.4.attn_q.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("IQ4_NL"), std::string::npos) << e.what();
  }
  s = before;
  set_weight_format(s, "q4_k");  // a plain format refuses, naming the tensor
  s.n_embd = 4096;
  try {
    tensor_type(s, "blk.3.ffn_down.weight");
    ADD_FAILURE() << "q4_k rows of 14352 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.3.ffn_down.weight' has rows of 14352"), std::string::npos) << e.what();
  }
  for (const char* format : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"}) {
    set_weight_format(s, format);
    EXPECT_EQ(weight_format_name(s), format);
    EXPECT_EQ(ggml_type_info(tensor_type(s, "output.weight")).name, std::string(format));
  }
}

TEST(TestModel, VocabularyIsAUsableSentencePieceVocab) {
  TestModelSpec s = test_model_by_name("mha-64");
  for (const int n_vocab : {259, 320, 4096, 152064}) {  // 152064: Qwen2.5's size, four-letter pieces
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

// The Llama-3 layout of the vocabulary: bytes, merges, specials; it loads,
// round-trips text, splits digits in threes, parses the chat markers.
TEST(TestModel, Llama3VocabularyIsAUsableBpeVocab) {
  TestModelSpec s = test_model_by_name("llama3-8b");
  s.n_layers = 1, s.n_embd = 32, s.n_ff = 32, s.n_heads = 1, s.n_kv_heads = 1, s.head_dim = 32;
  set_weight_format(s, "q8_0");
  const auto bytes = make_test_model(s).to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, "llama3");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "llama-bpe");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto types = f.get_i32_array("tokenizer.ggml.token_type");
  const auto merges = f.get_string_array("tokenizer.ggml.merges");
  ASSERT_EQ(tokens.size(), 128256u);
  ASSERT_EQ(merges.size(), 128000u - 256);
  EXPECT_EQ(tokens[0], "!");
  EXPECT_EQ(tokens[220], "\u0120");  // GPT-2's space
  EXPECT_EQ(std::set<std::string_view>(tokens.begin(), tokens.begin() + 256).size(), 256u);
  for (size_t r = 0; r < merges.size(); ++r) {  // token 256 + r is merge r
    std::string joined(merges[r]);
    joined.erase(joined.find(' ', 1), 1);
    ASSERT_EQ(joined, tokens[256 + r]) << r;
  }
  const std::map<int, std::string> specials = {{128000, "<|begin_of_text|>"}, {128001, "<|end_of_text|>"},
                                                {128006, "<|start_header_id|>"}, {128007, "<|end_header_id|>"},
                                                {128008, "<|eom_id|>"}, {128009, "<|eot_id|>"},
                                                {128010, "<|python_tag|>"}, {128255, "<|reserved_special_token_247|>"}};
  for (const auto& [id, text] : specials) EXPECT_EQ(tokens[size_t(id)], text);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(types[i], i < 128000 ? 1 : 3) << i;

  const model::Tokenizer tok(model::vocab_from_gguf(f));
  EXPECT_EQ(tok.bos(), 128000);
  EXPECT_EQ(tok.eos(), 128009);
  EXPECT_TRUE(tok.is_end_of_generation(128009));
  EXPECT_EQ(model::detect_chat_template(tok.vocab()), model::ChatTemplate::kLlama3);
  const std::string text = "Hello world, the quick brown fox jumps over 1234567 lazy dogs.\n\nZebra café!";
  const std::vector<int32_t> ids = tok.encode(text, true, false);
  ASSERT_GT(ids.size(), 1u);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(tok.decode(std::span(ids).subspan(1)), text);
  EXPECT_LT(ids.size(), text.size() / 2) << "words merge into few tokens";
  const std::vector<int32_t> the = tok.encode(" the", false, false);
  EXPECT_EQ(the.size(), 1u);
  const std::vector<int32_t> digits = tok.encode("1234567", false, false);
  ASSERT_EQ(digits.size(), 3u);
  EXPECT_EQ(tok.token_to_piece(digits[0]), "123");
  const std::vector<int32_t> chat = tok.encode("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", false, true);
  EXPECT_EQ(chat.front(), 128006);
  EXPECT_EQ(chat.back(), 128009);
  EXPECT_NE(std::find(chat.begin(), chat.end(), 128007), chat.end());
}

// A tensor larger than one generation chunk (4M values) holds exactly the
// documented values: element i of tensor T is mean + std * Box-Muller over
// outputs 2i, 2i + 1 of SplitMix64(SplitMix64(seed).next() ^ fnv1a64(T)).
// Quantized, it is those values quantized as a whole; on disk, the bytes of
// to_bytes().
TEST(TestModel, ChunkedTensorsHoldTheDocumentedValues) {
  TestModelSpec s = test_model_by_name("gqa-128");
  s.n_layers = 1, s.n_vocab = 9000;  // token_embd: 512 x 9000 = 4.6M values
  const auto bytes = make_test_model(s).to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, "f32");
  const std::vector<float> x = f.tensor_f32(*f.find_tensor("token_embd.weight"));
  ASSERT_EQ(x.size(), 512u * 9000);
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const char c : std::string("token_embd.weight")) h = (h ^ uint8_t(c)) * 0x100000001B3ULL;
  SplitMix64 rng(SplitMix64(s.seed).next() ^ h);
  for (size_t i = 0; i < x.size(); ++i) {
    const double u1 = rng.uniform_open(), u2 = rng.uniform_open();
    const float expect = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
    ASSERT_EQ(x[i], expect) << i;
  }
  set_weight_format(s, "q4_k_m");
  const auto q_bytes = make_test_model(s).to_bytes();
  const GgufFile q = GgufFile::from_bytes(q_bytes, "q4_k_m");
  const auto data = q.tensor_data(*q.find_tensor("token_embd.weight"));
  const std::vector<uint8_t> expect = quantize(GgmlType::kQ4_K, x);
  ASSERT_EQ(data.size(), expect.size());
  EXPECT_TRUE(std::equal(expect.begin(), expect.end(), data.begin(), data.end()));
  const auto path = (std::filesystem::temp_directory_path() / "longctx_test_model_chunks.gguf").string();
  make_test_model(s).write(path);
  const auto on_disk = read_file(path);
  EXPECT_TRUE(std::equal(on_disk.begin(), on_disk.end(), q_bytes.begin(), q_bytes.end(),
                         [](std::byte a, uint8_t b) { return uint8_t(a) == b; }));
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
  s.weight_type = GgmlType::kQ8_K;
  rejects(s, "weight type without a quantizer");
  s = test_model_by_name("mha-64");
  s.weight_type = GgmlType::kQ8_0, s.k_mix = true;
  rejects(s, "a k-quant mix over Q8_0");
  s = test_model_by_name("q4_k_m");
  s.n_embd = 500;
  rejects(s, "q4_k_m output rows of 500");
  s = test_model_by_name("mha-64");
  s.llama3_vocab = true;
  rejects(s, "a Llama-3 vocabulary of 320 tokens");
  try {
    set_weight_format(s, "q3_k");
    ADD_FAILURE() << "q3_k accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q5_k_m"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace longctx::tools
