// longctx-bench: the benchmark harness. Each subcommand prints one JSON line
// per measurement, then a human table.
//
//   longctx-bench kvstore [--tokens 4096] [--layers 32] [--kv-heads 8] [--head-dim 128] [--reps 5] [--quick]
//   longctx-bench kernels [--contexts 4096,32768] [--dtype f16] [--budget 4096] [--reps 5] [--quick]
//   longctx-bench matmul [--types q4_k,...] [--shapes NxK,...] [--rows 1,4,512] [--reps 5] [--quick]
//   longctx-bench gpu [--histories 32768,131072] [--windows 4096,...,65536] [--reps 5] [--quick] (bench_gpu.cpp)
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::bench {
int run_kvstore(const std::vector<std::string>& args);
int run_kernels(const std::vector<std::string>& args);
int run_accuracy(const std::vector<std::string>& args);
int run_decode(const std::vector<std::string>& args);
int run_matmul(const std::vector<std::string>& args);
int run_prefill(const std::vector<std::string>& args);
int run_gpu(const std::vector<std::string>& args);
}

namespace {
// The end-to-end benchmark drives the real binaries, so it is a script
// (tools/bench_e2e.py); this hands it the directory of longctx-bench.
int run_e2e_script(const std::vector<std::string>& args) {
  std::vector<char> self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  std::string bin_dir = n > 0 ? std::string(self.data(), size_t(n)) : std::string("build/bin/longctx-bench");
  bin_dir = bin_dir.substr(0, bin_dir.find_last_of('/'));
  std::vector<std::string> argv_s{"/usr/bin/python3", LONGCTX_SOURCE_DIR "/tools/bench_e2e.py", "--bin-dir", bin_dir};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv_c;
  for (std::string& a : argv_s) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  execv(argv_c[0], argv_c.data());
  std::fprintf(stderr, "longctx-bench: cannot run %s: %s\n", argv_s[1].c_str(), std::strerror(errno));
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: longctx-bench SUBCOMMAND [options]\n"
      "  kvstore   KV store append throughput vs memcpy bandwidth\n"
      "  kernels   CPU decode kernels (dense, score, select, sparse) vs read bandwidth\n"
      "  accuracy  selection policies x budgets x contexts: recall, output error, time per step\n"
      "  decode    a model (--model FILE.gguf, or a generated one): decode tokens/s at depth, dense vs sparse,\n"
      "            weight GB/s, RSS\n"
      "  prefill   a model: prefill tokens/s, matmul GFLOP/s vs the measured FMA peak\n"
      "  matmul    CPU matmul per weight type (GGUF quantized, f16, f32): GB/s for decode rows, GFLOP/s for prefill\n"
      "  gpu       GPU attention kernels (TFLOP/s, GB/s vs D2D copy, vs torch SDPA) and GPU prefill tokens/s\n"
      "  e2e       demo pass-key model through longctx-chat: accuracy over depths, tokens/s, plot\n"
      "            (runs tools/bench_e2e.py with /usr/bin/python3; see its --help)\n";
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
    if (command == "matmul") return longctx::bench::run_matmul(args);
    if (command == "prefill") return longctx::bench::run_prefill(args);
    if (command == "gpu") return longctx::bench::run_gpu(args);
    if (command == "e2e") return run_e2e_script(args);
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
