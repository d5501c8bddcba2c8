// longctx-make-model: writes one of the standard random-weight test models
// (tools/include/longctx/tools/test_model.h) as a GGUF file.
//
//   longctx-make-model --preset NAME [--seed N] [--weight-type FORMAT] [--attn-scale S] [--arch A] --out FILE.gguf
//   longctx-make-model --list
// FORMAT: a weight format of test_model.h (f32 ... q6_k, and llama.cpp's
// per-tensor mixes q2_k, q3_k_m, q4_k_m, q5_k_m); the preset's when absent. S > 0: scores
// are q.k * S, written as <arch>.attention.scale (absent: 1/sqrt(head_dim)).
// A: llama, qwen2 or internlm2, the name the same tensors are written under
// (qwen2 rotates halves); the preset's when absent.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "longctx/core/error.h"
#include "longctx/tools/test_model.h"

namespace {

using namespace longctx;

std::string usage() {
  return "usage: longctx-make-model --preset NAME [--seed N] [--weight-type FORMAT] [--attn-scale S]\n"
         "                          [--arch llama|qwen2|internlm2] --out FILE.gguf\n"
         "       longctx-make-model --list\n"
         "FORMAT: " + tools::weight_format_names() + "\n"
         "S: attention score scale > 0, written as <arch>.attention.scale (default: none, 1/sqrt(head_dim))\n";
}

uint64_t parse_seed(const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*text == '\0' || *text == '-' || *end != '\0' || errno == ERANGE)
    fail(ErrorCode::kInvalidArgument, "--seed: expected an unsigned integer, got '", text, "'");
  return value;
}

float parse_attn_scale(const char* text) {
  char* end = nullptr;
  errno = 0;
  const float value = std::strtof(text, &end);
  if (*text == '\0' || *end != '\0' || errno == ERANGE || !(value > 0.0f) || std::isinf(value))
    fail(ErrorCode::kInvalidArgument, "--attn-scale: expected a finite number > 0, got '", text, "'");
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string preset, out, weight_type, arch;
    const char* seed = nullptr;
    const char* attn_scale = nullptr;
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
      else if (flag == "--attn-scale") attn_scale = value();
      else if (flag == "--arch") arch = value();
      else if (flag == "--list") {
        for (const auto& list : {tools::standard_test_models(), tools::full_size_models()})
          for (const auto& s : list)
            std::printf("%-13s %s, %d layers, %d/%d heads x %d, n_embd %d, n_ff %d, vocab %d%s, %s%s%s%s\n",
                        s.name.c_str(), s.arch.c_str(), s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.n_embd,
                        s.n_ff, s.n_vocab, s.llama3_vocab ? " (llama3 bpe)" : "", tools::weight_format_name(s).c_str(),
                        s.qkv_bias ? ", qkv bias" : "", s.llama3_rope ? ", llama3 rope" : "",
                        s.yarn_factor > 0 ? str_cat(", yarn x", s.yarn_factor).c_str() : "");
        return 0;
      } else if (flag == "-h" || flag == "--help") {
        std::fputs(usage().c_str(), stdout);
        return 0;
      } else fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "'\n", usage());
    }
    if (preset.empty() || out.empty()) fail(ErrorCode::kInvalidArgument, "--preset and --out are required\n", usage());
    tools::TestModelSpec spec = tools::test_model_by_name(preset);
    if (seed) spec.seed = parse_seed(seed);
    if (!weight_type.empty()) tools::set_weight_format(spec, weight_type);
    if (attn_scale) spec.attn_scale = parse_attn_scale(attn_scale);
    if (!arch.empty()) spec.arch = arch;  // make_test_model refuses an unknown one
    tools::make_test_model(spec).write(out);
    std::printf("wrote %s: test model '%s' (%s), seed %llu, %s weights%s\n", out.c_str(), spec.name.c_str(),
                spec.arch.c_str(), static_cast<unsigned long long>(spec.seed), tools::weight_format_name(spec).c_str(),
                spec.attn_scale > 0 ? str_cat(", attention scale ", spec.attn_scale).c_str() : "");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-make-model: %s: %s\n", error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-make-model: %s\n", e.what());
    return 1;
  }
}
