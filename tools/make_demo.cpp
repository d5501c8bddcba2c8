// longctx-make-demo: writes the embedded demo pass-key model
// (tools/include/longctx/tools/demo_model.h, tools/DEMO_MODEL.md) as a GGUF file.
//
//   longctx-make-demo --out FILE.gguf
#include <cstdio>
#include <string>

#include "longctx/core/error.h"
#include "longctx/tools/demo_model.h"

namespace {

constexpr const char* kUsage = "usage: longctx-make-demo --out FILE.gguf\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace longctx;
  try {
    std::string out;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--out") {
        if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, "--out needs a value");
        out = argv[++i];
      } else if (flag == "-h" || flag == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else {
        fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "'\n", kUsage);
      }
    }
    if (out.empty()) fail(ErrorCode::kInvalidArgument, "--out is required\n", kUsage);
    tools::make_demo_model().write(out);
    std::printf("wrote %s: longctx demo pass-key model (%d layers, %d heads x %d, vocab %zu)\n", out.c_str(),
                tools::DemoModelShape::kLayers, tools::DemoModelShape::kHeads, tools::DemoModelShape::kHeadDim,
                tools::demo_vocab().tokens.size());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-make-demo: %s: %s\n", error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-make-demo: %s\n", e.what());
    return 1;
  }
}
