// The GGUF reader on untrusted input: a catalogue of corruption classes, each
// made from a valid file (GgufWriter) by patching bytes or written by hand,
// each rejected with its error code and a message naming the file, the key or
// tensor, and the offset. Truncation at every offset of a small file.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "gguf_test_util.h"
#include "longctx/model/gguf.h"
#include "longctx/model/gguf_writer.h"
#include "test_seed.h"

namespace longctx::model {
namespace {

using namespace longctx::model::testing;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr ErrorCode kCorrupt = ErrorCode::kCorrupt;

// A small valid file with every structure the reader validates.
GgufWriter base_writer() {
  std::mt19937 rng(test_seed(5));
  std::normal_distribution<float> normal;
  std::vector<float> values(64);
  for (auto& v : values) v = normal(rng);
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "a", "bc"});
  w.set_f32_array("tokenizer.ggml.scores", {0.f, -1.f, -2.f});
  w.set_bool("some.flag", true);
  w.set_u8("dup.a", 1);
  w.set_u8("dup.b", 2);
  w.add_tensor_f32("tensor.q1", {32, 2}, GgmlType::kQ8_0, values);
  w.add_tensor_f32("tensor.f2", {8}, GgmlType::kF32, std::span(values).first(8));
  w.add_tensor_f32("tensor.h3", {4, 2}, GgmlType::kF16, std::span(values).first(8));
  return w;
}

std::vector<uint8_t> base_file() { return base_writer().to_bytes(); }

// Offsets of the fields of a tensor info, found by the tensor's name.
struct TensorInfoAt {
  size_t n_dims, dims, type, offset;
};
TensorInfoAt tensor_at(const std::vector<uint8_t>& bytes, std::string_view name, uint32_t n_dims) {
  const size_t n = find_unique(bytes, name) + name.size();
  return {n, n + 4, n + 4 + 8 * n_dims, n + 4 + 8 * n_dims + 4};
}
// Offset of the type id of a key, and of its value.
size_t key_type_at(const std::vector<uint8_t>& bytes, std::string_view key) {
  return find_unique(bytes, key) + key.size();
}

std::string parse_error(const std::vector<uint8_t>& bytes, ErrorCode code, std::vector<std::string> parts) {
  parts.push_back("bad.gguf");
  return expect_error([&] { GgufFile::from_bytes(bytes, "bad.gguf"); }, code, std::move(parts));
}

// Little-endian bytes written by hand, for files the writer refuses to make.
struct Raw {
  std::vector<uint8_t> bytes;
  Raw& u32(uint32_t v) { return put(&v, 4); }
  Raw& u64(uint64_t v) { return put(&v, 8); }
  Raw& str(std::string_view s) {
    u64(s.size());
    return put(s.data(), s.size());
  }
  Raw& put(const void* p, size_t n) {
    bytes.insert(bytes.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return *this;
  }
  Raw& header(uint64_t tensors, uint64_t kvs) { return put("GGUF", 4).u32(3).u64(tensors).u64(kvs); }
};

TEST(GgufCorrupt, BaseFileIsValid) {
  const auto bytes = base_file();
  const GgufFile f = GgufFile::from_bytes(bytes, "base.gguf");
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().size(), 7u);
}

TEST(GgufCorrupt, BadMagic) {
  auto bytes = base_file();
  bytes[0] = 'X';
  parse_error(bytes, kCorrupt, {"not a GGUF file", "bad magic", "offset 0"});
  for (size_t n : {0, 1, 3}) parse_error(std::vector<uint8_t>(bytes.begin() + 1, bytes.begin() + 1 + n), kCorrupt, {"bad magic"});
  parse_error({'G', 'G', 'U', 'F'}, kCorrupt, {"version", "offset 4"});
  std::vector<uint8_t> lower = {'g', 'g', 'u', 'f', 3, 0, 0, 0};
  parse_error(lower, kCorrupt, {"bad magic"});
}

TEST(GgufCorrupt, Version) {
  auto bytes = base_file();
  patch<uint32_t>(bytes, 4, 1);
  parse_error(bytes, ErrorCode::kUnsupported, {"version 1", "offset 4"});
  for (uint32_t v : {0u, 4u, 0xFFFFFFFFu}) {
    patch<uint32_t>(bytes, 4, v);
    parse_error(bytes, kCorrupt, {"unknown GGUF version " + std::to_string(v), "offset 4"});
  }
  patch<uint32_t>(bytes, 4, 0x03000000u);  // version 3 written big-endian
  parse_error(bytes, ErrorCode::kUnsupported, {"big-endian"});
  patch<uint32_t>(bytes, 4, 2);
  EXPECT_EQ(GgufFile::from_bytes(bytes, "v2").version(), 2u);
}

TEST(GgufCorrupt, HugeCounts) {
  const auto good = base_file();
  for (uint64_t kvs : {kU64Max, kU64Max / 14, uint64_t(1) << 40, uint64_t(good.size())}) {
    auto bytes = good;
    patch<uint64_t>(bytes, 16, kvs);
    parse_error(bytes, kCorrupt, {"metadata count " + std::to_string(kvs), "cannot fit", "offset 16"});
  }
  for (uint64_t tensors : {kU64Max, uint64_t(1) << 33, uint64_t(good.size() / 33)}) {
    auto bytes = good;
    patch<uint64_t>(bytes, 8, tensors);
    parse_error(bytes, kCorrupt, {"tensor count " + std::to_string(tensors), "cannot fit", "offset 8"});
  }
  // Counts that pass the size bound but exceed what the file holds fail
  // while reading the extra entries.
  for (auto [at, delta] : {std::pair{16, 1}, {8, 1}, {16, -1}}) {
    auto bytes = good;
    patch<uint64_t>(bytes, size_t(at), peek<uint64_t>(good, size_t(at)) + uint64_t(int64_t(delta)));
    parse_error(bytes, kCorrupt, {});
  }
}

TEST(GgufCorrupt, HugeStringLengths) {
  const auto good = base_file();
  for (uint64_t len : {kU64Max, uint64_t(1) << 63, uint64_t(good.size())}) {
    auto bytes = good;
    patch<uint64_t>(bytes, 24, len);  // the first key's length
    parse_error(bytes, kCorrupt, {"key #0", "string length " + std::to_string(len), "offset 24", "exceeds"});

    bytes = good;
    const size_t value = key_type_at(good, "general.architecture") + 4;
    patch<uint64_t>(bytes, value, len);
    parse_error(bytes, kCorrupt, {"key 'general.architecture'", "string length", "offset " + std::to_string(value)});

    bytes = good;  // the second token of the vocabulary
    const size_t token = find_unique(good, "<unk>") + 5;
    patch<uint64_t>(bytes, token, len);
    parse_error(bytes, kCorrupt, {"key 'tokenizer.ggml.tokens'", "string length", "offset " + std::to_string(token)});

    bytes = good;
    const size_t name = find_unique(good, "tensor.f2") - 8;
    patch<uint64_t>(bytes, name, len);
    parse_error(bytes, kCorrupt, {"tensor #1", "string length", "offset " + std::to_string(name)});
  }
}

TEST(GgufCorrupt, HugeArrayCounts) {
  const auto good = base_file();
  const size_t count_at = key_type_at(good, "tokenizer.ggml.scores") + 8;
  ASSERT_EQ(peek<uint64_t>(good, count_at), 3u);
  for (uint64_t count : {kU64Max, kU64Max / 4 + 1, uint64_t(good.size())}) {
    auto bytes = good;
    patch<uint64_t>(bytes, count_at, count);
    parse_error(bytes, kCorrupt, {"key 'tokenizer.ggml.scores'", "array of " + std::to_string(count) + " f32",
                                  "cannot fit", "offset " + std::to_string(count_at)});
  }
  auto bytes = good;
  const size_t tokens_at = key_type_at(good, "tokenizer.ggml.tokens") + 8;
  patch<uint64_t>(bytes, tokens_at, kU64Max / 8 + 1);
  parse_error(bytes, kCorrupt, {"'tokenizer.ggml.tokens'", "array of", "string"});
}

TEST(GgufCorrupt, ValueTypes) {
  const auto good = base_file();
  for (uint32_t id : {13u, 100u, 0xFFFFFFFFu}) {
    auto bytes = good;
    const size_t at = key_type_at(good, "some.flag");
    patch<uint32_t>(bytes, at, id);
    parse_error(bytes, kCorrupt, {"key 'some.flag'", "unknown value type id " + std::to_string(id),
                                  "offset " + std::to_string(at)});
    bytes = good;
    const size_t elem_at = key_type_at(good, "tokenizer.ggml.scores") + 4;
    patch<uint32_t>(bytes, elem_at, id);
    parse_error(bytes, kCorrupt, {"'tokenizer.ggml.scores'", "unknown array element type id",
                                  "offset " + std::to_string(elem_at)});
  }
  auto bytes = good;
  patch<uint8_t>(bytes, key_type_at(good, "some.flag") + 4, 2);
  parse_error(bytes, kCorrupt, {"key 'some.flag'", "bool value 2"});

  GgufWriter nested;  // an array of arrays of u8
  nested.set_raw("n.arr", 9, Raw().u32(9).u64(1).u32(0).u64(1).put("x", 1).bytes);
  parse_error(nested.to_bytes(), ErrorCode::kUnsupported, {"key 'n.arr'", "arrays of arrays"});

  GgufWriter bools;  // a bool array with a 7 in it
  bools.set_raw("b.arr", 9, Raw().u32(7).u64(3).put("\1\0\7", 3).bytes);
  parse_error(bools.to_bytes(), kCorrupt, {"key 'b.arr'", "bool value 7"});

  GgufWriter truncated_value;  // a u64 with 4 bytes
  truncated_value.set_raw("short.u64", 10, {1, 2, 3, 4});
  parse_error(truncated_value.to_bytes(), kCorrupt, {"key 'short.u64'", "needs 8 bytes"});
}

TEST(GgufCorrupt, EmptyAndDuplicateKeys) {
  parse_error(Raw().header(0, 1).str("").u32(0).put("\1\0", 2).bytes, kCorrupt, {"key #0", "empty key", "offset 24"});
  const std::string message =
      parse_error(Raw().header(0, 1).str(std::string(70000, 'k')).u32(0).put("\1", 1).bytes, kCorrupt,
                  {"65535", "(70000 bytes)"});
  EXPECT_LT(message.size(), 300u) << "the name from the file is cut in messages";

  auto bytes = base_file();
  const size_t b = find_unique(bytes, "dup.b");
  bytes[b + 4] = 'a';
  parse_error(bytes, kCorrupt, {"key 'dup.a'", "duplicate key", "offset " + std::to_string(b - 8)});

  bytes = base_file();
  const size_t t = find_unique(bytes, "tensor.h3");
  std::memcpy(bytes.data() + t, "tensor.f2", 9);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.f2'", "duplicate tensor name", "offset " + std::to_string(t - 8)});

  parse_error(Raw().header(1, 0).str("").u32(1).u64(1).u32(0).u64(0).u64(0).u64(0).bytes, kCorrupt, {"tensor #0", "empty tensor name"});
}

// Names go into messages and longctx-info's listing as they are: one with a
// control byte (a NUL cut the message there, ESC drove the terminal) is
// refused by index, the byte named, without printing the name.
TEST(GgufCorrupt, NamesWithControlBytes) {
  for (const std::string& name : {std::string("a\0b", 3), std::string("\x1b[2J"), std::string("ok\x7f")}) {
    const std::string message = parse_error(Raw().header(0, 1).str(name).u32(0).put("\1\0", 2).bytes, kCorrupt,
                                            {"key #0: the name's byte", "is the control byte 0x", "offset 24"});
    EXPECT_EQ(message.find(name), std::string::npos) << message;
  }
  auto bytes = base_file();
  const size_t t = find_unique(bytes, "tensor.h3");
  bytes[t + 6] = '\n';
  parse_error(bytes, kCorrupt, {"tensor #", "the name's byte 6 is the control byte 0x0a"});
}

TEST(GgufCorrupt, Alignment) {
  GgufWriter wrong_type = base_writer();
  wrong_type.set_raw("general.alignment", 10, Raw().u64(32).bytes);
  parse_error(wrong_type.to_bytes(), kCorrupt, {"key 'general.alignment'", "type u64", "expected u32"});

  const auto good = base_writer().to_bytes(3, 64);
  const size_t value = key_type_at(good, "general.alignment") + 4;
  ASSERT_EQ(peek<uint32_t>(good, value), 64u);
  for (uint32_t bad : {0u, 3u, 48u, 0xFFFFFFFFu}) {
    auto bytes = good;
    patch<uint32_t>(bytes, value, bad);
    parse_error(bytes, kCorrupt, {"general.alignment", "alignment " + std::to_string(bad) + " is not a power of two",
                                  "offset " + std::to_string(value)});
  }
  // A larger power of two is valid but leaves the tensors misaligned.
  auto bytes = good;
  patch<uint32_t>(bytes, value, 1u << 31);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.f2'", "not a multiple of the alignment 2147483648"});
}

TEST(GgufCorrupt, Dimensions) {
  const auto good = base_file();
  const auto q1 = tensor_at(good, "tensor.q1", 2);
  for (uint32_t n_dims : {0u, 5u, 1000u}) {
    auto bytes = good;
    patch<uint32_t>(bytes, q1.n_dims, n_dims);
    parse_error(bytes, kCorrupt, {"tensor 'tensor.q1'", std::to_string(n_dims) + " dimensions",
                                  "offset " + std::to_string(q1.n_dims)});
  }
  for (uint64_t dim : {uint64_t(0), uint64_t(1) << 63, kU64Max}) {
    auto bytes = good;
    patch<uint64_t>(bytes, q1.dims + 8, dim);
    parse_error(bytes, kCorrupt, {"tensor 'tensor.q1'", "dimension 1 = " + std::to_string(dim), "out of range",
                                  "offset " + std::to_string(q1.dims + 8)});
  }
  // Element count overflowing int64: 2^32 * 2^32.
  auto bytes = good;
  patch<uint64_t>(bytes, q1.dims, uint64_t(1) << 32);
  patch<uint64_t>(bytes, q1.dims + 8, uint64_t(1) << 32);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.q1'", "element count overflows"});
  // Element count fits int64 but the byte size overflows u64: 2^62 f32.
  const auto h3 = tensor_at(good, "tensor.h3", 2);
  bytes = good;
  patch<uint32_t>(bytes, h3.type, 0);  // f32
  patch<uint64_t>(bytes, h3.dims, uint64_t(1) << 31);
  patch<uint64_t>(bytes, h3.dims + 8, uint64_t(1) << 31);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.h3'", "byte size", "overflows"});
  // Huge but representable: the size check against the file catches it.
  bytes = good;
  patch<uint64_t>(bytes, h3.dims, uint64_t(1) << 30);
  patch<uint64_t>(bytes, h3.dims + 8, uint64_t(1) << 30);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.h3'", "ends past the end of the file"});
  // A q8_0 row must be whole blocks (same element count, rows of 16).
  bytes = good;
  patch<uint64_t>(bytes, q1.dims, 16);
  patch<uint64_t>(bytes, q1.dims + 8, 4);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.q1'", "row length 16", "block size 32"});
}

TEST(GgufCorrupt, TensorTypes) {
  const auto good = base_file();
  const auto f2 = tensor_at(good, "tensor.f2", 1);
  for (uint32_t id : {4u, 31u, 1000u, 0xFFFFFFFFu}) {
    auto bytes = good;
    patch<uint32_t>(bytes, f2.type, id);
    parse_error(bytes, kCorrupt, {"tensor 'tensor.f2'", "unknown ggml type id " + std::to_string(id),
                                  "offset " + std::to_string(f2.type)});
  }
  auto bytes = good;
  patch<uint32_t>(bytes, f2.type, 16);  // iq2_xxs: real, but not read by longctx
  parse_error(bytes, ErrorCode::kUnsupported, {"tensor 'tensor.f2'", "id 16", "not supported"});
}

TEST(GgufCorrupt, TensorPlacement) {
  const auto good = base_file();
  const GgufFile f = GgufFile::from_bytes(good, "base.gguf");
  ASSERT_EQ(f.tensors()[0].n_bytes, 68u);  // padded to 96
  const auto f2 = tensor_at(good, "tensor.f2", 1);
  const auto h3 = tensor_at(good, "tensor.h3", 2);
  const uint64_t f2_offset = peek<uint64_t>(good, f2.offset);
  ASSERT_EQ(f2_offset, 96u);

  auto bytes = good;
  patch<uint64_t>(bytes, f2.offset, f2_offset + 4);
  parse_error(bytes, kCorrupt, {"tensor 'tensor.f2'", "data offset 100", "not a multiple of the alignment 32",
                                "offset " + std::to_string(f2.offset)});

  for (uint64_t offset : {uint64_t(1) << 20, kU64Max - 31, kU64Max - 31 - 96}) {
    bytes = good;
    patch<uint64_t>(bytes, f2.offset, offset);
    parse_error(bytes, kCorrupt, {"tensor 'tensor.f2'", "ends past the end of the file"});
  }
  // Overlaps: the same offset as another tensor, and inside another tensor.
  bytes = good;
  patch<uint64_t>(bytes, f2.offset, 0);
  parse_error(bytes, kCorrupt, {"'tensor.q1'", "'tensor.f2'", "overlap"});
  bytes = good;
  patch<uint64_t>(bytes, h3.offset, f2_offset);
  parse_error(bytes, kCorrupt, {"'tensor.f2'", "'tensor.h3'", "overlap"});
  bytes = good;  // q1 grows into f2's bytes: 4 rows of 32 q8_0 = 136 bytes > 96
  const auto q1 = tensor_at(good, "tensor.q1", 2);
  patch<uint64_t>(bytes, q1.dims + 8, 4);
  parse_error(bytes, kCorrupt, {"'tensor.q1'", "'tensor.f2'", "overlap"});

  // Alignment 1 packs the tensors back to back (valid); one byte more is an overlap.
  const auto packed = base_writer().to_bytes(3, 1);
  const auto f2p = tensor_at(packed, "tensor.f2", 1);
  ASSERT_EQ(peek<uint64_t>(packed, f2p.offset), 68u);
  EXPECT_NO_THROW(GgufFile::from_bytes(packed, "packed.gguf"));
  bytes = packed;
  patch<uint64_t>(bytes, f2p.offset, 67);
  parse_error(bytes, kCorrupt, {"'tensor.q1'", "'tensor.f2'", "overlap"});
}

// Cutting the file anywhere before the end of the last tensor's data is an
// error (never a crash or an over-read: ASan checks the latter in CI); the
// trailing padding may go.
TEST(GgufCorrupt, TruncationAtEveryOffset) {
  for (uint32_t alignment : {32u, 1u}) {
    const auto good = base_writer().to_bytes(3, alignment);
    const GgufFile f = GgufFile::from_bytes(good, "base.gguf");
    const auto& last = f.tensors().back();
    const size_t end = size_t(f.tensor_data(last).data() - good.data()) + last.n_bytes;
    for (size_t n = 0; n < good.size(); ++n) {
      // A copy of exactly n bytes so that ASan sees any read past the end.
      const std::vector<uint8_t> prefix(good.begin(), good.begin() + ptrdiff_t(n));
      if (n < end) {
        try {
          GgufFile::from_bytes(prefix, "cut.gguf");
          ADD_FAILURE() << "a file cut at " << n << " of " << good.size() << " bytes was accepted";
        } catch (const Error& e) {
          ASSERT_EQ(e.code(), kCorrupt) << e.what();
          ASSERT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
          ASSERT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
        }
      } else {
        EXPECT_EQ(GgufFile::from_bytes(prefix, "cut.gguf").tensors().size(), 3u) << n;
      }
    }
  }
}

// Random byte flips of the base file: whatever they do, the reader either
// accepts the file (and then every tensor lies inside it) or throws Error.
TEST(GgufCorrupt, RandomByteFlips) {
  const auto good = base_file();
  std::mt19937 rng(test_seed(99));
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto bytes = good;
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) bytes[rng() % bytes.size()] ^= uint8_t(1 + rng() % 255);
    try {
      const GgufFile f = GgufFile::from_bytes(bytes, "flip.gguf");
      for (const auto& t : f.tensors()) {
        const auto data = f.tensor_data(t);
        ASSERT_GE(data.data(), bytes.data());
        ASSERT_LE(data.data() + data.size(), bytes.data() + bytes.size());
      }
      for (const auto& kv : f.metadata())
        if (kv.value.type == GgufType::kArray && kv.value.array_type == GgufType::kString)
          f.get_string_array(kv.key);
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find("flip.gguf"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace longctx::model
