// libFuzzer entry for the GGUF reader: any input must either be rejected with
// longctx::Error or give a file whose every accessor works within the input;
// and the tokenizer and model checks built from its metadata must either
// refuse it with longctx::Error or work.
// Anything else (a crash, a sanitizer report, another exception such as
// std::bad_alloc from an unchecked count) is a finding. See CMakeLists.txt.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/gguf.h"
#include "longctx/model/llama.h"
#include "longctx/model/tokenizer.h"

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

// What a model file's metadata feeds beyond the reader: the tokenizer (its
// vocabulary checks, then a round trip of a short prompt) and the Llama
// hyperparameters and tensor checks Model::open runs before loading a weight.
void exercise_model_metadata(const GgufFile& f) {
  std::optional<Tokenizer> tok;
  try {
    tok.emplace(tokenizer_from_gguf(f));
  } catch (const Error&) {
  }
  if (tok) {
    // A built tokenizer encodes any text, or refuses a byte its vocabulary
    // has no token for (and no unknown token) with kInvalidArgument.
    try {
      const std::vector<int32_t> ids = tok->encode("Hello world, 12 abc\n", true, false);
      for (const int32_t id : ids) check(id >= 0 && id < tok->n_vocab(), "token id in range");
      (void)tok->decode(ids);
      (void)tok->encode("<s>[INST] x <|im_end|>", false, true);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) {
        std::fprintf(stderr, "a built tokenizer refused text: %s\n", e.what());
        std::abort();
      }
    }
  }
  try {
    scheduler::TransformerSpec spec = read_llama_spec(f);
    check(spec.n_layers > 0 && spec.head_dim > 0, "a read spec has layers and heads");
    check_llama_tensors(f, spec);
    if (tok) (void)check_model_file(f, *tok);
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  try {
    const GgufFile f = GgufFile::from_bytes(input, "fuzz.gguf");
    exercise(f, input);
    exercise_model_metadata(f);
  } catch (const Error&) {
    // Rejected: the expected outcome for most inputs.
  }
  return 0;
}
