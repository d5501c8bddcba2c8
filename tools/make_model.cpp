// longctx-make-model: writes one of the standard random-weight test models
// (tools/include/longctx/tools/test_model.h) as a GGUF file.
//
//   longctx-make-model --preset NAME [--seed N] [--weight-type f32|f16|bf16|q8_0|q4_0] --out FILE.gguf
//   longctx-make-model --list
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "longctx/core/error.h"
#include "longctx/tools/test_model.h"

namespace {

using namespace longctx;

constexpr const char* kUsage =
    "usage: longctx-make-model --preset NAME [--seed N] [--weight-type f32|f16|bf16|q8_0|q4_0] --out FILE.gguf\n"
    "       longctx-make-model --list\n";

GgmlType parse_weight_type(const std::string& text) {
  if (text == "f32") return GgmlType::kF32;
  if (text == "f16") return GgmlType::kF16;
  if (text == "bf16") return GgmlType::kBF16;
  if (text == "q8_0") return GgmlType::kQ8_0;
  if (text == "q4_0") return GgmlType::kQ4_0;
  fail(ErrorCode::kInvalidArgument, "--weight-type: expected f32, f16, bf16, q8_0 or q4_0, got '", text, "'");
}

uint64_t parse_seed(const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*text == '\0' || *text == '-' || *end != '\0' || errno == ERANGE)
    fail(ErrorCode::kInvalidArgument, "--seed: expected an unsigned integer, got '", text, "'");
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string preset, out, weight_type;
    const char* seed = nullptr;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      auto value = [&]() -> const char* {
        if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
        return argv[++i];
      };
      if (flag == "--preset") preset = value();
      else if (flag == "--out") out = value();
      else if (flag == "--seed") seed = value();
      else if (flag == "--weight-type") weight_type = value();
      else if (flag == "--list") {
        for (const auto& s : tools::standard_test_models())
          std::printf("%-12s %s, %d layers, %d/%d heads x %d, n_embd %d, n_ff %d, vocab %d, %s%s%s\n",
                      s.name.c_str(), s.arch.c_str(), s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.n_embd,
                      s.n_ff, s.n_vocab, ggml_type_info(s.weight_type).name, s.qkv_bias ? ", qkv bias" : "",
                      s.llama3_rope ? ", llama3 rope" : "");
        return 0;
      } else if (flag == "-h" || flag == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "'\n", kUsage);
    }
    if (preset.empty() || out.empty()) fail(ErrorCode::kInvalidArgument, "--preset and --out are required\n", kUsage);
    tools::TestModelSpec spec = tools::test_model_by_name(preset);
    if (seed) spec.seed = parse_seed(seed);
    if (!weight_type.empty()) spec.weight_type = parse_weight_type(weight_type);
    tools::make_test_model(spec).write(out);
    std::printf("wrote %s: test model '%s', seed %llu, %s weights\n", out.c_str(), spec.name.c_str(),
                static_cast<unsigned long long>(spec.seed), ggml_type_info(spec.weight_type).name);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-make-model: %s: %s\n", error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-make-model: %s\n", e.what());
    return 1;
  }
}
