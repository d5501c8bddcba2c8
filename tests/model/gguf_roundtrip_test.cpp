// GgufWriter -> GgufFile round trips: every metadata type (scalars at their
// limits, strings, arrays of every element type), every tensor type, both
// versions and several alignments; typed getters and their errors; files on
// disk; tensors produced while writing; writer argument checks.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <limits>
#include <random>

#include "gguf_test_util.h"
#include "longctx/core/file.h"
#include "longctx/model/gguf.h"
#include "longctx/model/gguf_writer.h"
#include "test_seed.h"

namespace longctx::model {
namespace {

using namespace longctx::model::testing;

// Payload of an array value for set_raw: element type, count, raw elements.
template <typename T>
std::vector<uint8_t> raw_array(GgufType elem, const std::vector<T>& values) {
  std::vector<uint8_t> out(12 + values.size() * sizeof(T));
  const uint32_t type_id = static_cast<uint32_t>(elem);
  const uint64_t count = values.size();
  std::memcpy(out.data(), &type_id, 4);
  std::memcpy(out.data() + 4, &count, 8);
  if (!values.empty()) std::memcpy(out.data() + 12, values.data(), values.size() * sizeof(T));
  return out;
}

GgufWriter all_metadata_types() {
  GgufWriter w;
  w.set_u8("t.u8", 255);
  w.set_i8("t.i8", -128);
  w.set_u16("t.u16", 65535);
  w.set_i16("t.i16", -32768);
  w.set_u32("t.u32", 4294967295u);
  w.set_i32("t.i32", std::numeric_limits<int32_t>::min());
  w.set_u64("t.u64", std::numeric_limits<uint64_t>::max());
  w.set_i64("t.i64", std::numeric_limits<int64_t>::min());
  w.set_f32("t.f32", -1.5e-3f);
  w.set_f64("t.f64", 1e300);
  w.set_bool("t.true", true);
  w.set_bool("t.false", false);
  w.set_string("t.str", std::string("h\xC3\xA9llo\0world", 12));
  w.set_string("t.empty", "");
  w.set_string_array("a.str", {"", "<s>", "\xE2\x96\x81the", std::string(300, 'x')});
  w.set_f32_array("a.f32", {0.f, -2.5f, 1e-30f});
  w.set_i32_array("a.i32", {-7, 0, std::numeric_limits<int32_t>::max()});
  w.set_raw("a.u8", 9, raw_array<uint8_t>(GgufType::kU8, {0, 200}));
  w.set_raw("a.i8", 9, raw_array<int8_t>(GgufType::kI8, {-128, 127}));
  w.set_raw("a.u16", 9, raw_array<uint16_t>(GgufType::kU16, {65535}));
  w.set_raw("a.i16", 9, raw_array<int16_t>(GgufType::kI16, {-300, 300}));
  w.set_raw("a.u32", 9, raw_array<uint32_t>(GgufType::kU32, {1, 2, 3}));
  w.set_raw("a.u64", 9, raw_array<uint64_t>(GgufType::kU64, {5}));
  w.set_raw("a.i64", 9, raw_array<int64_t>(GgufType::kI64, {-5, 1LL << 31}));
  w.set_raw("a.f64", 9, raw_array<double>(GgufType::kF64, {0.25}));
  w.set_raw("a.bool", 9, raw_array<uint8_t>(GgufType::kBool, {1, 0, 1}));
  w.set_raw("a.empty", 9, raw_array<uint32_t>(GgufType::kU32, {}));
  return w;
}

TEST(GgufRoundTrip, EveryMetadataType) {
  for (uint32_t version : {2u, 3u}) {
    const auto bytes = all_metadata_types().to_bytes(version);
    const GgufFile f = GgufFile::from_bytes(bytes, "meta.gguf");
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.file_size(), bytes.size());
    EXPECT_TRUE(f.tensors().empty());
    ASSERT_EQ(f.metadata().size(), 27u);
    EXPECT_EQ(f.metadata()[0].key, "t.u8");  // insertion order is kept
    EXPECT_EQ(f.metadata()[26].key, "a.empty");

    EXPECT_EQ(f.find("t.u8")->type, GgufType::kU8);
    EXPECT_EQ(f.get_uint("t.u8"), 255u);
    EXPECT_EQ(f.get_int("t.i8"), -128);
    EXPECT_EQ(f.get_uint("t.u16"), 65535u);
    EXPECT_EQ(f.get_int("t.i16"), -32768);
    EXPECT_EQ(f.get_uint("t.u32"), 4294967295u);
    EXPECT_EQ(f.get_int("t.u32"), 4294967295);
    EXPECT_EQ(f.get_int("t.i32"), std::numeric_limits<int32_t>::min());
    EXPECT_EQ(f.get_uint("t.u64"), std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f.get_float("t.f32"), double(-1.5e-3f));
    EXPECT_EQ(f.find("t.f32")->type, GgufType::kF32);
    EXPECT_EQ(f.get_float("t.f64"), 1e300);
    EXPECT_TRUE(f.get_bool("t.true"));
    EXPECT_FALSE(f.get_bool("t.false"));
    EXPECT_EQ(f.get_string("t.str"), std::string("h\xC3\xA9llo\0world", 12));
    EXPECT_EQ(f.get_string("t.empty"), "");

    const auto strs = f.get_string_array("a.str");
    ASSERT_EQ(strs.size(), 4u);
    EXPECT_EQ(strs[0], "");
    EXPECT_EQ(strs[2], "\xE2\x96\x81the");
    EXPECT_EQ(strs[3], std::string(300, 'x'));
    EXPECT_EQ(f.get_f32_array("a.f32"), (std::vector<float>{0.f, -2.5f, 1e-30f}));
    EXPECT_EQ(f.get_i32_array("a.i32"), (std::vector<int32_t>{-7, 0, std::numeric_limits<int32_t>::max()}));
    EXPECT_EQ(f.get_i32_array("a.u8"), (std::vector<int32_t>{0, 200}));
    EXPECT_EQ(f.get_i32_array("a.i8"), (std::vector<int32_t>{-128, 127}));
    EXPECT_EQ(f.get_i32_array("a.u16"), (std::vector<int32_t>{65535}));
    EXPECT_EQ(f.get_i32_array("a.i16"), (std::vector<int32_t>{-300, 300}));
    EXPECT_EQ(f.get_i32_array("a.u32"), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(f.get_i32_array("a.u64"), (std::vector<int32_t>{5}));
    EXPECT_TRUE(f.get_i32_array("a.empty").empty());
    for (auto [key, type, count] : {std::tuple{"a.f64", GgufType::kF64, 1u}, {"a.bool", GgufType::kBool, 3u},
                                    {"a.i64", GgufType::kI64, 2u}, {"a.str", GgufType::kString, 4u}}) {
      const GgufValue* v = f.find(key);
      ASSERT_NE(v, nullptr) << key;
      EXPECT_EQ(v->type, GgufType::kArray);
      EXPECT_EQ(v->array_type, type) << key;
      EXPECT_EQ(v->array_count, count) << key;
    }
    // file_offset points at the value: the first element of an f64 array.
    const GgufValue* f64 = f.find("a.f64");
    EXPECT_EQ(peek<double>(bytes, f64->file_offset), 0.25);
    EXPECT_EQ(f.find("missing"), nullptr);
    EXPECT_FALSE(f.has("t.u8 "));
  }
}

TEST(GgufRoundTrip, GettersWithDefaults) {
  const auto bytes = all_metadata_types().to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, "meta.gguf");
  EXPECT_EQ(f.get_string_or("nope", "fallback"), "fallback");
  EXPECT_EQ(f.get_string_or("t.empty", "fallback"), "");
  EXPECT_EQ(f.get_uint_or("nope", 7), 7u);
  EXPECT_EQ(f.get_uint_or("t.u16", 7), 65535u);
  EXPECT_EQ(f.get_float_or("nope", 0.5), 0.5);
  EXPECT_EQ(f.get_float_or("t.f64", 0.5), 1e300);
  EXPECT_TRUE(f.get_bool_or("nope", true));
  EXPECT_FALSE(f.get_bool_or("t.false", true));
  // A present key of the wrong type is an error even with a default.
  expect_error([&] { f.get_uint_or("t.str", 7); }, ErrorCode::kCorrupt, {"t.str", "string"});
  expect_error([&] { f.get_string_or("t.u8", "x"); }, ErrorCode::kCorrupt, {"t.u8", "u8", "expected string"});
}

TEST(GgufRoundTrip, TypedGetterErrors) {
  const auto bytes = all_metadata_types().to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, "meta.gguf");
  const ErrorCode c = ErrorCode::kCorrupt;
  expect_error([&] { f.get_string("absent.key"); }, c, {"meta.gguf", "missing key 'absent.key'"});
  expect_error([&] { f.get_string("t.u32"); }, c, {"meta.gguf", "'t.u32'", "type u32", "expected string", "offset"});
  expect_error([&] { f.get_uint("t.str"); }, c, {"'t.str'", "type string", "integer"});
  expect_error([&] { f.get_uint("t.i8"); }, c, {"'t.i8'", "-128", "negative"});
  expect_error([&] { f.get_int("t.u64"); }, c, {"'t.u64'", "18446744073709551615", "int64"});
  expect_error([&] { f.get_uint("t.f32"); }, c, {"'t.f32'", "type f32"});
  expect_error([&] { f.get_float("t.u32"); }, c, {"'t.u32'", "f32 or f64"});
  expect_error([&] { f.get_bool("t.u8"); }, c, {"'t.u8'", "expected bool"});
  expect_error([&] { f.get_string("a.str"); }, c, {"'a.str'", "array of string"});
  expect_error([&] { f.get_string_array("a.i32"); }, c, {"'a.i32'", "array of i32", "array of string"});
  expect_error([&] { f.get_string_array("t.str"); }, c, {"'t.str'", "type string"});
  expect_error([&] { f.get_f32_array("a.f64"); }, c, {"'a.f64'", "array of f64", "array of f32"});
  expect_error([&] { f.get_i32_array("a.f32"); }, c, {"'a.f32'", "array of f32", "integers"});
  expect_error([&] { f.get_i32_array("a.bool"); }, c, {"'a.bool'", "array of bool"});
  expect_error([&] { f.get_i32_array("a.i64"); }, c, {"'a.i64'", "element 1", "2147483648", "int32"});
  expect_error([&] { f.get_i32_array("a.str"); }, c, {"'a.str'"});
}

TEST(GgufRoundTrip, EveryTensorTypeVersionAndAlignment) {
  std::mt19937 rng(test_seed(42));
  const GgmlType all[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                          GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
                          GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K, GgmlType::kI8,
                          GgmlType::kI16,  GgmlType::kI32,  GgmlType::kI64,  GgmlType::kF64,  GgmlType::kBF16};
  for (uint32_t version : {2u, 3u}) {
    for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
      GgufWriter w;
      w.set_string("general.architecture", "llama");
      std::vector<std::vector<uint8_t>> datas;
      std::vector<std::vector<int64_t>> shapes;
      for (GgmlType type : all) {
        const int64_t block = ggml_type_info(type).block_elems;
        std::vector<int64_t> dims = {block * int64_t(1 + rng() % 3)};
        for (int d = 1, n = int(rng() % 4); d <= n; ++d) dims.push_back(1 + rng() % 3);
        int64_t n = 1;
        for (auto d : dims) n *= d;
        auto data = random_blocks(type, size_t(n / block), rng);
        w.add_tensor(std::string("t.") + ggml_type_info(type).name, dims, type, data);
        datas.push_back(std::move(data));
        shapes.push_back(dims);
      }
      const auto bytes = w.to_bytes(version, alignment);
      const GgufFile f = GgufFile::from_bytes(bytes, "tensors.gguf");
      EXPECT_EQ(f.alignment(), alignment);
      EXPECT_EQ(f.has("general.alignment"), alignment != 32);
      ASSERT_EQ(f.tensors().size(), std::size(all));
      for (size_t i = 0; i < std::size(all); ++i) {
        const GgufTensorInfo& t = f.tensors()[i];
        SCOPED_TRACE(t.name + " alignment " + std::to_string(alignment));
        EXPECT_EQ(f.find_tensor(t.name), &t);
        EXPECT_EQ(t.type, all[i]);
        EXPECT_EQ(t.dims, shapes[i]);
        EXPECT_EQ(t.n_bytes, datas[i].size());
        EXPECT_EQ(t.offset % alignment, 0u);
        const auto data = f.tensor_data(t);
        ASSERT_EQ(data.size(), datas[i].size());
        EXPECT_EQ(std::memcmp(data.data(), datas[i].data(), data.size()), 0);
        EXPECT_EQ(size_t(data.data() - bytes.data()) % alignment, 0u) << "file position not aligned";
        if (ggml_type_info(t.type).dequantizable) {
          std::vector<float> expected(size_t(t.n_elements));
          dequantize(t.type, datas[i], expected);
          const auto values = f.tensor_f32(t);
          ASSERT_EQ(values.size(), expected.size());
          EXPECT_EQ(std::memcmp(values.data(), expected.data(), 4 * values.size()), 0);
        } else {
          expect_error([&] { f.tensor_f32(t); }, ErrorCode::kUnsupported, {t.name, ggml_type_info(t.type).name});
        }
      }
      EXPECT_EQ(f.find_tensor("t.nope"), nullptr);
    }
  }
}

TEST(GgufRoundTrip, DescribeAndQuantizedAdd) {
  GgufWriter w;
  std::vector<float> values(64 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(float(i));
  w.add_tensor_f32("w", {64, 3}, GgmlType::kQ8_0, values);
  w.add_tensor_f32("v", {64, 3}, GgmlType::kF32, values);
  const auto bytes = w.to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes, "x.gguf");
  EXPECT_EQ(f.tensors()[0].describe(), "q8_0[64, 3]");
  EXPECT_EQ(f.tensors()[0].n_elements, 192);
  EXPECT_EQ(f.tensor_f32(*f.find_tensor("v")), values);
  const auto q = f.tensor_f32(*f.find_tensor("w"));
  for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(q[i], values[i], 1.0 / 127);
}

TEST(GgufRoundTrip, FileOnDisk) {
  std::string dir = (std::filesystem::temp_directory_path() / "longctx-gguf-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/m.gguf";
  GgufWriter w;
  w.set_u32("llama.block_count", 2);
  w.add_tensor_f32("x", {4}, GgmlType::kF16, std::vector<float>{1, 2, 3, 4});
  w.write(path, 3, 64);
  {
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.name(), path);
    EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
    GgufFile moved = std::move(f);
    EXPECT_EQ(moved.tensor_f32(moved.tensors().at(0)), (std::vector<float>{1, 2, 3, 4}));
  }
  expect_error([&] { GgufFile::open(dir + "/absent.gguf"); }, ErrorCode::kIo, {"absent.gguf"});
  // A failing to_bytes() creates no file.
  GgufWriter bad;
  expect_error([&] { bad.write(dir + "/bad.gguf", 4); }, ErrorCode::kInvalidArgument, {"version"});
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad.gguf"));
  std::filesystem::remove_all(dir);
}

// Tensors produced while the file is written: the same bytes as tensors
// given whole, in to_bytes() and on disk; a producer that writes too few or
// too many bytes is named, and write() then leaves no file.
TEST(GgufRoundTrip, StreamedTensors) {
  std::string dir = (std::filesystem::temp_directory_path() / "longctx-gguf-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  std::vector<uint8_t> data(3 * 34);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7);
  GgufWriter whole, streamed;
  whole.add_tensor("a", {32, 3}, GgmlType::kQ8_0, data);
  whole.add_tensor("b", {5}, GgmlType::kF16, std::vector<uint8_t>(10, 1));
  streamed.add_tensor_stream("a", {32, 3}, GgmlType::kQ8_0, [&](FileSink& sink) {
    for (size_t at = 0; at < data.size(); at += 34) sink.write(data.data() + at, 34);  // one block per call
  });
  streamed.add_tensor_stream("b", {5}, GgmlType::kF16, [](FileSink& sink) {
    const std::vector<uint8_t> ones(10, 1);
    sink.write(ones.data(), 4);
    sink.write(ones.data(), 6);
  });
  for (uint32_t alignment : {1u, 32u, 4096u}) {
    const auto bytes = whole.to_bytes(3, alignment);
    EXPECT_EQ(streamed.to_bytes(3, alignment), bytes);
    streamed.write(dir + "/s.gguf", 3, alignment);
    const auto on_disk = read_file(dir + "/s.gguf");
    EXPECT_TRUE(std::equal(on_disk.begin(), on_disk.end(), bytes.begin(), bytes.end(),
                           [](std::byte x, uint8_t y) { return uint8_t(x) == y; }));
  }
  for (const size_t n : {size_t(33), size_t(35)}) {
    GgufWriter bad;
    bad.add_tensor_stream("short_or_long", {32}, GgmlType::kQ8_0,
                          [n](FileSink& sink) { sink.write(std::vector<uint8_t>(n).data(), n); });
    expect_error([&] { bad.to_bytes(); }, ErrorCode::kInvalidArgument, {"'short_or_long'", "34"});
    expect_error([&] { bad.write(dir + "/bad.gguf"); }, ErrorCode::kInvalidArgument, {"'short_or_long'"});
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1) << "only s.gguf: no file left behind";
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufRoundTrip, MinimalFile) {
  const auto bytes = GgufWriter().to_bytes();
  EXPECT_EQ(bytes.size(), 24u);  // magic, version, two counts
  const GgufFile f = GgufFile::from_bytes(bytes, "empty.gguf");
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufWriterArgs, Rejected) {
  const ErrorCode c = ErrorCode::kInvalidArgument;
  GgufWriter w;
  w.set_u32("k", 1);
  expect_error([&] { w.set_string("k", "again"); }, c, {"duplicate", "'k'"});
  expect_error([&] { w.set_u32("", 1); }, c, {"empty"});
  w.add_tensor("t", {32}, GgmlType::kF32, std::vector<uint8_t>(128));
  expect_error([&] { w.add_tensor("t", {32}, GgmlType::kF32, std::vector<uint8_t>(128)); }, c, {"duplicate", "'t'"});
  expect_error([&] { w.add_tensor("u", {32}, GgmlType::kF32, std::vector<uint8_t>(127)); }, c, {"'u'", "128", "127"});
  expect_error([&] { w.add_tensor("u", {16}, GgmlType::kQ8_0, std::vector<uint8_t>(17)); }, c, {"'u'", "block"});
  expect_error([&] { w.add_tensor("u", {}, GgmlType::kF32, {}); }, c, {"'u'", "dimensions"});
  expect_error([&] { w.add_tensor("u", {1, 1, 1, 1, 1}, GgmlType::kF32, std::vector<uint8_t>(4)); }, c, {"dimensions"});
  expect_error([&] { w.add_tensor("u", {0}, GgmlType::kF32, {}); }, c, {"'u'", "dimension"});
  expect_error([&] { w.add_tensor("", {1}, GgmlType::kF32, std::vector<uint8_t>(4)); }, c, {"empty"});
  expect_error([&] { w.to_bytes(1); }, c, {"version 1"});
  expect_error([&] { w.to_bytes(3, 0); }, c, {"alignment 0"});
  expect_error([&] { w.to_bytes(3, 48); }, c, {"alignment 48"});
  GgufWriter aligned;
  aligned.set_u32("general.alignment", 64);
  EXPECT_EQ(GgufFile::from_bytes(aligned.to_bytes(3, 64), "a").alignment(), 64u);
  expect_error([&] { aligned.to_bytes(3, 32); }, c, {"general.alignment", "64", "32"});
}

}  // namespace
}  // namespace longctx::model
