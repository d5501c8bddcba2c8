// What `longctx-bench --help` and `longctx-bench SUBCOMMAND --help` print:
// every subcommand's options with their defaults, in one place.
#include "usage.h"

#include <array>

namespace longctx::bench {

std::string accuracy_policy_names();  // bench_accuracy.cpp

namespace {

struct Usage {
  const char* name;
  const char* summary;
  const char* options;
};

const std::array<Usage, 9> kUsages{{
    {"kvstore", "KV store append throughput vs memcpy bandwidth",
     "  --tokens N       tokens in the appended chunk (4096)\n"
     "  --layers N       layers (32)\n"
     "  --kv-heads N     kv heads per layer (8)\n"
     "  --head-dim N     head dimension (128)\n"
     "  --kv-type LIST   store KV types: f16, bf16, f32, q8_0 (f16)\n"
     "  --reps N         repetitions, the median is reported (5)\n"
     "  --quick          4 layers, 3 repetitions\n"},
    {"kernels", "CPU decode kernels (dense, score, select, sparse, merge, the whole sparse step: sparse_step in the "
                "runtime's default layout, sparse_step_budget with the budget on selected blocks alone) vs read "
                "bandwidth; "
                "prefill attention TFLOP/s vs the FMA and bf16 peaks",
     "  --contexts LIST  context lengths in tokens (4096,16384,32768,131072,1048576)\n"
     "  --dtype LIST     KV types: f16, bf16, f32, q8_0 (f16,bf16,q8_0); each repetition runs them in turn,\n"
     "                   and over_f16 is a type's median time over f16's\n"
     "  --budget N       tokens of selected blocks (4096: 32 blocks, the config's default); sparse_step attends\n"
     "                   the default 128 sinks and 4096-token local window besides\n"
     "  --split N        the dense and sparse rows' flash-decoding piece in tokens (0 = its default); the step rows\n"
     "                   split as the runtime does (the default), and every row says its split\n"
     "  --reps N         repetitions, the median is reported (5)\n"
     "  --q-heads N      query heads (32)\n"
     "  --kv-heads N     kv heads (8)\n"
     "  --head-dim N     head dimension (128); the demo model is --q-heads 5 --kv-heads 5 --head-dim 32\n"
     "  --target NAME    a Highway target to force, e.g. avx2 on an AVX-512 CPU (default: the best it runs)\n"
     "  --prefill-histories LIST  prefill attention: history lengths before the chunk (32768,131072)\n"
     "  --prefill-chunk N queries of the prefill attention chunk (4096)\n"
     "  --prefill-reps N repetitions of each prefill attention row (1)\n"
     "  --no-prefill     no prefill attention rows\n"
     "  --quick          contexts 4096,32768, f16, 3 repetitions; prefill: history 8192, chunk 1024\n"},
    {"accuracy", "selection policies x budgets x contexts: recall, output error, time per step",
     "  --contexts LIST  context lengths in tokens, >= 1024 (16384,131072)\n"
     "  --budgets LIST   token budgets in percent of the context (0.5,1,2,5,10)\n"
     "  --workloads LIST needle, multiquery, prefill (all three)\n"
     "  --policies LIST  a subset of the policies below (all)\n"
     "  --seeds N        seeds per point (1)\n"
     "  --needle-heads L kv heads holding the needles (0)\n"
     "  --rope-theta X   RoPE base of the synthetic keys (5e6)\n"
     "  --chunk N        prefill chunk of the prefill workload (64)\n"
     "  --kv-type T      f16 or q8_0: the decode workloads' KV store (f16); the dense references stay f16\n"
     "  --quick          context 16384, budgets 1,2,5\n"},
    {"decode", "a model: decode tokens/s at depth, dense vs sparse, weight GB/s, where each step's time goes, RSS",
     "  --model FILE     a GGUF model (default: the generated 'bench' model)\n"
     "  --weights W      native, bf16 or f32: how weights are kept (native)\n"
     "  --contexts LIST  depths in tokens, filled with random K/V (4096,32768,131072)\n"
     "  --budget N       sparse budget in tokens: 128 sinks + 1024 local + blocks of 128 (4096)\n"
     "  --steps N        decode steps timed per depth (16)\n"
     "  --kv-type T      f16, bf16, f32 or q8_0 (f16)\n"
     "  --quick          contexts 4096,32768, 8 steps\n"},
    {"prefill", "a model: prefill tokens/s, matmul GFLOP/s vs the FMA, int8 and bf16 peaks measured in the run",
     "  --model FILE     a GGUF model (default: the generated 'bench' model)\n"
     "  --weights W      native, bf16 or f32 (native)\n"
     "  --quant-prefill P auto, int8, bf16-tiles or f32-tiles: how quantized weights multiply prefill rows (auto)\n"
     "  --tokens LIST    prompt lengths (4096,16384)\n"
     "  --chunk N        prefill chunk (4096)\n"
     "  --kv-type T      f16, bf16, f32 or q8_0 (f16)\n"
     "  --quick          1024 tokens\n"},
    {"matmul", "CPU matmul per weight type: GB/s for decode rows (caches evicted first), GFLOP/s for prefill rows",
     "  --types LIST     f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k\n"
     "                   (q4_0,q8_0,q4_k,q6_k,f16,f32)\n"
     "  --shapes LIST    NxK weight shapes (4096x4096,14336x4096,4096x14336)\n"
     "  --rows LIST      rows of x per product (1,4,512)\n"
     "  --reps N         repetitions, the median is reported (5)\n"
     "  --quick          shape 4096x4096, rows 1,128, 3 repetitions\n"},
    {"gpu", "GPU attention kernels (TFLOP/s, GB/s vs D2D copy, vs torch SDPA) and GPU prefill tokens/s",
     "  --histories LIST prefill attention history lengths (32768,131072)\n"
     "  --chunk N        prefill attention chunk (4096)\n"
     "  --windows LIST   local-window sizes (4096,8192,16384,32768,65536)\n"
     "  --contexts LIST  end-to-end prefill lengths (32768,131072)\n"
     "  --reps N         repetitions, the median is reported (5)\n"
     "  --no-sdpa        skip the torch SDPA comparison (tools/bench_sdpa.py with $LONGCTX_PYTHON, else\n"
     "                   /usr/bin/python3)\n"
     "  --no-e2e         skip the end-to-end prefill\n"
     "  --quick          history 32768, windows 4096,65536, context 32768, 3 repetitions\n"},
    {"e2e", "the demo pass-key model through longctx-chat: accuracy over depths, tokens/s, plot",
     "  runs tools/bench_e2e.py (of the current directory, else of the source tree) with /usr/bin/python3;\n"
     "  `longctx-bench e2e --help` prints its options\n"},
    {"server", "longctx-server: time to first token cached vs not, decode tokens/s vs longctx-chat, load",
     "  runs tools/bench_server.py (of the current directory, else of the source tree) with /usr/bin/python3;\n"
     "  `longctx-bench server --help` prints its options\n"},
}};

}  // namespace

std::string usage_overview() {
  std::string text = "usage: longctx-bench SUBCOMMAND [options]   (longctx-bench SUBCOMMAND --help: its options)\n";
  for (const Usage& u : kUsages) text.append("  ").append(u.name).append(10 - std::string(u.name).size(), ' ')
                                      .append(u.summary).append("\n");
  text += "Every subcommand prints one JSON line per measurement, then a table.\n";
  return text;
}

std::optional<std::string> usage_of(const std::string& subcommand) {
  for (const Usage& u : kUsages) {
    if (subcommand != u.name) continue;
    std::string text = std::string("usage: longctx-bench ") + u.name + " [options]\n" + u.summary + "\n" + u.options;
    if (subcommand == "accuracy") text += "policies: " + accuracy_policy_names() + "\n";
    return text;
  }
  return std::nullopt;
}

}  // namespace longctx::bench
