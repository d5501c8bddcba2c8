// longctx-bench: the benchmark harness. Each subcommand prints one JSON line
// per measurement, then a human table. `longctx-bench --help` lists the
// subcommands, `longctx-bench SUBCOMMAND --help` its options (usage.cpp).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "longctx/core/error.h"
#include "usage.h"

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
// The end-to-end and server benchmarks drive the real binaries, so they are
// scripts (tools/bench_e2e.py, tools/bench_server.py); this hands one the
// directory of longctx-bench.
int run_script(const std::string& script, const std::vector<std::string>& args) {
  std::vector<char> self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  std::string bin_dir = n > 0 ? std::string(self.data(), size_t(n)) : std::string("build/bin/longctx-bench");
  bin_dir = bin_dir.substr(0, bin_dir.find_last_of('/'));
  std::vector<std::string> argv_s{"/usr/bin/python3", longctx::bench::tools_script(script), "--bin-dir", bin_dir};
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
  const std::string overview = longctx::bench::usage_overview();
  if (argc < 2) {
    std::fputs(overview.c_str(), stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h") {
    std::fputs(overview.c_str(), stdout);
    return 0;
  }
  const bool help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                    std::find(args.begin(), args.end(), "-h") != args.end();
  if (help && command != "e2e" && command != "server") {  // the scripts print their own
    const std::optional<std::string> text = longctx::bench::usage_of(command);
    if (!text) {
      std::fprintf(stderr, "longctx-bench: unknown subcommand '%s'\n%s", command.c_str(), overview.c_str());
      return 2;
    }
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  try {
    if (command == "kvstore") return longctx::bench::run_kvstore(args);
    if (command == "kernels") return longctx::bench::run_kernels(args);
    if (command == "accuracy") return longctx::bench::run_accuracy(args);
    if (command == "decode") return longctx::bench::run_decode(args);
    if (command == "matmul") return longctx::bench::run_matmul(args);
    if (command == "prefill") return longctx::bench::run_prefill(args);
    if (command == "gpu") return longctx::bench::run_gpu(args);
    if (command == "e2e") return run_script("bench_e2e.py", args);
    if (command == "server") return run_script("bench_server.py", args);
    std::fprintf(stderr, "longctx-bench: unknown subcommand '%s'\n%s", command.c_str(), overview.c_str());
    return 2;
  } catch (const longctx::Error& e) {
    std::fprintf(stderr, "longctx-bench: %s: %s\n", longctx::error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-bench: %s\n", e.what());
    return 1;
  }
}
