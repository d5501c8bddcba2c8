// longctx-make-haystack: writes a pass-key haystack document for the demo
// model (tools/include/longctx/tools/haystack.h) and its JSON sidecar
// {"key", "depth", "tokens", "key_token", "seed", "question"}.
//
//   longctx-make-haystack [--tokens N] [--depth D] [--seed N] [--no-question]
//                         --out DOC.txt [--json FILE]
// --tokens: at most this many demo-model tokens, BOS included (default 32768);
// --depth: where the key sits, 0 = start, 1 = end (default: drawn from the
// seed); --no-question leaves the question out of the text (it is still in
// the JSON); --json defaults to DOC with its extension replaced by .json.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "longctx/core/error.h"
#include "longctx/core/file.h"
#include "longctx/core/flag.h"
#include "longctx/tools/demo_model.h"
#include "longctx/tools/haystack.h"

namespace {

using namespace longctx;

constexpr const char* kUsage =
    "usage: longctx-make-haystack [--tokens N] [--depth D] [--seed N] [--no-question] --out DOC.txt [--json FILE]\n";

void write_text(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](FileSink& sink) { sink.write(text.data(), text.size()); });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    tools::HaystackSpec spec;
    std::string out, json;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      auto value = [&]() -> const char* {
        if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
        return argv[++i];
      };
      if (flag == "--tokens") spec.tokens = parse_int_flag(flag, value(), 0, INT64_MAX);
      else if (flag == "--depth") spec.depth = parse_number_flag(flag, value(), 0, 1);
      else if (flag == "--seed") spec.seed = static_cast<uint64_t>(parse_int_flag(flag, value(), 0, INT64_MAX));
      else if (flag == "--no-question") spec.question = false;
      else if (flag == "--out") out = value();
      else if (flag == "--json") json = value();
      else if (flag == "-h" || flag == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "'\n", kUsage);
    }
    if (out.empty()) fail(ErrorCode::kInvalidArgument, "--out is required\n", kUsage);
    if (json.empty()) json = std::filesystem::path(out).replace_extension(".json").string();
    if (json == out) fail(ErrorCode::kInvalidArgument, "--json must differ from --out");

    const model::Tokenizer tokenizer(tools::demo_vocab());
    const tools::Haystack h = tools::make_haystack(spec, tokenizer);
    write_text(out, h.text);
    write_text(json, tools::haystack_json(h, spec.seed));
    std::printf("wrote %s (%lld tokens, key %s at depth %.3f, token %lld) and %s\n", out.c_str(),
                static_cast<long long>(h.n_tokens), h.key.c_str(), h.depth, static_cast<long long>(h.key_token),
                json.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-make-haystack: %s: %s\n", error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-make-haystack: %s\n", e.what());
    return 1;
  }
}
