// Writes the seed corpus of the GGUF fuzzer: small valid files that cover
// every metadata type, the tensor types, both versions and a few alignments,
// an SPM and a BPE vocabulary and two whole (tiny) models.
//   longctx_gguf_seeds DIR
// Built with the tests (ctest gguf_fuzz_seeds runs it), so that it keeps
// compiling without the clang fuzz build.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/ggml_types.h"
#include "longctx/model/gguf.h"
#include "longctx/model/gguf_writer.h"
#include "longctx/model/llama.h"
#include "longctx/model/tokenizer.h"
#include "longctx/tools/test_model.h"

using longctx::GgmlType;
using longctx::GgmlTypeInfo;
using namespace longctx::model;

namespace {

std::vector<float> wave(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  return v;
}

// Raw little-endian array payload for set_raw: element type, count, elements.
template <typename T>
std::vector<uint8_t> raw_array(GgufType elem, std::vector<T> values) {
  std::vector<uint8_t> out(12 + values.size() * sizeof(T));
  const uint32_t id = static_cast<uint32_t>(elem);
  const uint64_t count = values.size();
  std::memcpy(out.data(), &id, 4);
  std::memcpy(out.data() + 4, &count, 8);
  if (!values.empty()) std::memcpy(out.data() + 12, values.data(), values.size() * sizeof(T));
  return out;
}

GgufWriter llama_like() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.embedding_length", 32);
  w.set_u32("llama.attention.head_count", 4);
  w.set_u32("llama.attention.head_count_kv", 2);
  w.set_f32("llama.rope.freq_base", 10000.f);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "b"});
  w.set_f32_array("tokenizer.ggml.scores", {0.f, 0.f, 0.f, -1.f, -2.f});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  const auto v = wave(32 * 4);
  w.add_tensor_f32("token_embd.weight", {32, 4}, GgmlType::kQ8_0, v);
  w.add_tensor_f32("blk.0.attn_q.weight", {32, 2}, GgmlType::kF16, std::span(v).first(64));
  w.add_tensor_f32("output_norm.weight", {32}, GgmlType::kF32, std::span(v).first(32));
  return w;
}

GgufWriter every_type() {
  GgufWriter w;
  w.set_u8("t.u8", 7);
  w.set_i8("t.i8", -7);
  w.set_u16("t.u16", 700);
  w.set_i16("t.i16", -700);
  w.set_i32("t.i32", -70000);
  w.set_u64("t.u64", 1ull << 40);
  w.set_i64("t.i64", -(1ll << 40));
  w.set_f64("t.f64", 0.125);
  w.set_raw("a.u64", 9, raw_array<uint64_t>(GgufType::kU64, {1, 2}));
  w.set_raw("a.bool", 9, raw_array<uint8_t>(GgufType::kBool, {0, 1}));
  w.set_raw("a.i16", 9, raw_array<int16_t>(GgufType::kI16, {-1, 1}));
  const auto v = wave(256);
  w.add_tensor_f32("q4_0", {32}, GgmlType::kQ4_0, std::span(v).first(32));
  w.add_tensor_f32("bf16", {8}, GgmlType::kBF16, std::span(v).first(8));
  // Quantized types written from raw blocks (bytes of a sine, scales kept small).
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const GgmlTypeInfo& info = ggml_type_info(type);
    std::vector<uint8_t> block(static_cast<size_t>(info.block_bytes));
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>(i * 37 + 11);
    block[0] = 0x00, block[1] = 0x2C;  // d = 0.0625 in f16 (Q6_K's d is at the end, also set)
    block[block.size() - 2] = 0x00, block[block.size() - 1] = 0x2C;
    w.add_tensor(info.name, {info.block_elems}, type, block);
  }
  return w;
}

// A byte-level BPE vocabulary (Llama-3's pre-tokenizer): printable ASCII,
// which byte-level BPE spells as itself, 'Ġ' and 'Ċ' (its space and
// newline), a few merges, an unknown and a control token. Bytes it has no
// token for become the unknown token.
GgufWriter bpe_vocabulary() {
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "llama-bpe");
  std::vector<std::string> tokens;
  for (char c = '!'; c <= '~'; ++c) tokens.emplace_back(1, c);
  for (const char* t : {"\xC4\xA0", "\xC4\x8A", "he", "ll", "hell", "hello", "\xC4\xA0w", "<unk>", "<|begin_of_text|>"})
    tokens.emplace_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[tokens.size() - 2] = 2;  // unknown
  types.back() = 3;               // control
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"});
  w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(tokens.size() - 2));
  w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(tokens.size() - 1));
  return w;
}

// A whole Llama model, as small as the layout allows: the seed from which the
// fuzzer reaches read_llama_spec's and check_llama_tensors' later checks.
GgufWriter tiny_model(const std::string& arch, bool qkv_bias) {
  longctx::tools::TestModelSpec spec;
  spec.name = "fuzz-seed";
  spec.arch = arch;
  spec.n_layers = 1;
  spec.n_heads = 2;
  spec.n_kv_heads = 1;
  spec.head_dim = 16;
  spec.n_embd = 32;
  spec.n_ff = 32;
  spec.n_vocab = 260;
  spec.qkv_bias = qkv_bias;
  spec.weight_type = GgmlType::kQ8_0;
  return longctx::tools::make_test_model(spec);
}

// Writes a seed and reads it back: each must be a file the reader takes
// whole (every tensor dequantized; a vocabulary builds its tokenizer; a whole
// model passes check_model_file), or the fuzzer would start from inputs that
// only reach the first checks.
void write(const std::filesystem::path& dir, const char* name, const GgufWriter& w, uint32_t version,
           uint32_t alignment, bool whole_model = false) {
  const std::string path = (dir / name).string();
  w.write(path, version, alignment);
  const GgufFile f = GgufFile::open(path);
  if (f.version() != version || f.alignment() != alignment)
    longctx::fail(longctx::ErrorCode::kInternal, path, " reads back as version ", f.version(), ", alignment ",
                  f.alignment(), "; written as ", version, ", ", alignment);
  for (const GgufTensorInfo& tensor : f.tensors()) f.tensor_f32(tensor);
  if (f.has("tokenizer.ggml.model")) {
    const Tokenizer tok = tokenizer_from_gguf(f);
    if (whole_model) check_model_file(f, tok);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: longctx_gguf_seeds DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    write(dir, "empty.gguf", GgufWriter(), 3, 32);
    write(dir, "llama_v3.gguf", llama_like(), 3, 32);
    write(dir, "llama_v2_align8.gguf", llama_like(), 2, 8);
    write(dir, "every_type.gguf", every_type(), 3, 32);
    write(dir, "every_type_align1.gguf", every_type(), 3, 1);
    write(dir, "bpe_vocabulary.gguf", bpe_vocabulary(), 3, 32);
    write(dir, "tiny_llama_q8_0.gguf", tiny_model("llama", false), 3, 32, true);
    write(dir, "tiny_qwen2_bias.gguf", tiny_model("qwen2", true), 3, 32, true);
    return 0;
  } catch (const longctx::Error& e) {
    std::fprintf(stderr, "longctx_gguf_seeds: %s\n", e.what());
    return 1;
  }
}
