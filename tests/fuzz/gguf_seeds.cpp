// Writes the seed corpus of the GGUF fuzzer: small valid files that cover
// every metadata type, the tensor types, both versions and a few alignments.
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

// Writes a seed and reads it back: each must be a file the reader takes
// whole (every tensor dequantized), or the fuzzer would start from inputs
// that only reach the reader's first checks.
void write(const std::filesystem::path& dir, const char* name, const GgufWriter& w, uint32_t version,
           uint32_t alignment) {
  const std::string path = (dir / name).string();
  w.write(path, version, alignment);
  const GgufFile f = GgufFile::open(path);
  if (f.version() != version || f.alignment() != alignment)
    longctx::fail(longctx::ErrorCode::kInternal, path, " reads back as version ", f.version(), ", alignment ",
                  f.alignment(), "; written as ", version, ", ", alignment);
  for (const GgufTensorInfo& tensor : f.tensors()) f.tensor_f32(tensor);
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
    return 0;
  } catch (const longctx::Error& e) {
    std::fprintf(stderr, "longctx_gguf_seeds: %s\n", e.what());
    return 1;
  }
}
