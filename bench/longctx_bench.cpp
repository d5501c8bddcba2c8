// longctx-bench: the benchmark harness. Each subcommand prints one JSON line
// per measurement, then a human table.
//
//   longctx-bench kvstore [--tokens 4096] [--layers 32] [--kv-heads 8] [--head-dim 128] [--reps 5] [--quick]
//   longctx-bench kernels [--contexts 4096,32768] [--dtype f16] [--budget 4096] [--reps 5] [--quick]
#include <cstdio>
#include <string>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::bench {
int run_kvstore(const std::vector<std::string>& args);
int run_kernels(const std::vector<std::string>& args);
int run_accuracy(const std::vector<std::string>& args);
int run_decode(const std::vector<std::string>& args);
}

int main(int argc, char** argv) {
  const char* usage =
      "usage: longctx-bench SUBCOMMAND [options]\n"
      "  kvstore   KV store append throughput vs memcpy bandwidth\n"
      "  kernels   CPU decode kernels (dense, score, select, sparse) vs read bandwidth\n"
      "  accuracy  selection policies x budgets x contexts: recall, output error, time per step\n"
      "  decode    generated model: prefill and decode tokens/s, dense vs sparse attention\n";
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "kvstore") return longctx::bench::run_kvstore(args);
    if (command == "kernels") return longctx::bench::run_kernels(args);
    if (command == "accuracy") return longctx::bench::run_accuracy(args);
    if (command == "decode") return longctx::bench::run_decode(args);
    std::fprintf(stderr, "longctx-bench: unknown subcommand '%s'\n%s", command.c_str(), usage);
    return 2;
  } catch (const longctx::Error& e) {
    std::fprintf(stderr, "longctx-bench: %s: %s\n", longctx::error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-bench: %s\n", e.what());
    return 1;
  }
}
