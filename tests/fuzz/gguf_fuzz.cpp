// libFuzzer entry for the GGUF reader: any input must either be rejected with
// longctx::Error or give a file whose every accessor works within the input.
// Anything else (a crash, a sanitizer report, another exception such as
// std::bad_alloc from an unchecked count) is a finding. See CMakeLists.txt.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "longctx/core/error.h"
#include "longctx/model/gguf.h"

namespace {

using namespace longctx;
using namespace longctx::model;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

// Calls the getters that match the value's type, and some that do not
// (those must throw Error, never crash).
void exercise_value(const GgufFile& f, const GgufKeyValue& kv) {
  const GgufValue& v = kv.value;
  check(f.find(kv.key) == &v, "find() returns the listed value");
  auto tolerate = [](auto&& call) {
    try {
      call();
    } catch (const Error&) {
    }
  };
  tolerate([&] { f.get_uint(kv.key); });
  tolerate([&] { f.get_int(kv.key); });
  tolerate([&] { f.get_float(kv.key); });
  tolerate([&] { f.get_bool(kv.key); });
  tolerate([&] { f.get_string(kv.key); });
  tolerate([&] {
    const auto s = f.get_string_array(kv.key);
    check(s.size() == v.array_count, "string array count");
  });
  tolerate([&] {
    const auto x = f.get_f32_array(kv.key);
    check(x.size() == v.array_count, "f32 array count");
  });
  tolerate([&] { f.get_i32_array(kv.key); });
}

void exercise(const GgufFile& f, std::span<const uint8_t> input) {
  check(f.version() == 2 || f.version() == 3, "version");
  check(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment");
  for (const auto& kv : f.metadata()) exercise_value(f, kv);
  for (const auto& t : f.tensors()) {
    check(f.find_tensor(t.name) == &t, "find_tensor() returns the listed tensor");
    check(t.offset % f.alignment() == 0, "aligned offset");
    const auto data = f.tensor_data(t);
    check(data.data() >= input.data() && data.data() + data.size() <= input.data() + input.size(),
          "tensor data inside the input");
    check(data.size() == t.n_bytes, "tensor size");
    (void)t.describe();
    if (ggml_type_info(t.type).dequantizable && t.n_elements <= (1 << 16)) {
      const auto values = f.tensor_f32(t);
      check(values.size() == static_cast<size_t>(t.n_elements), "dequantized size");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  try {
    const GgufFile f = GgufFile::from_bytes(input, "fuzz.gguf");
    exercise(f, input);
  } catch (const Error&) {
    // Rejected: the expected outcome for most inputs.
  }
  return 0;
}
