// longctx-bench decode: the whole model on the CPU path. A generated GGUF
// model whose attention is sized like Llama-3-8B's (tools "bench": 32 q
// heads, 8 kv heads, d=128; 2 layers and a small MLP so it runs here) is
// loaded through model/ and driven by scheduler::Sequence:
//   prefill  tokens/s of a dense layer-major chunked prefill of --prefill
//            tokens (real forward passes);
//   decode   tokens/s of decode steps at each context, dense (policy dense)
//            and sparse (policy select, every layer selecting, budget
//            --budget tokens = initial_len 128 + local window 1024 + the
//            selected blocks of 128). The context is filled with random K/V
//            appended straight to the KV store (a model prefill of 128K
//            tokens would take hours on two cores; decode cost does not
//            depend on the values), then every step is a real decode step.
//
//   longctx-bench decode [--contexts 4096,32768,131072] [--budget 4096] [--steps 16]
//                        [--prefill 4096] [--kv-type f16] [--quick]

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/selection.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"
#include "longctx/tools/test_model.h"

namespace longctx::bench {
namespace {

struct DecodeArgs {
  std::vector<int64_t> contexts{4096, 32768, 131072};
  int64_t budget_tokens = 4096;
  int steps = 16;
  int64_t prefill_tokens = 4096;
  DType kv_type = DType::kF16;
};

constexpr int kBlock = 128, kInitial = 128, kLocal = 1024;

LongContextConfig config_for(const DecodeArgs& a, int64_t max_seq_len, bool sparse) {
  LongContextConfig c;
  c.max_seq_len = max_seq_len;
  c.chunk_size = 4096;
  c.block_size = kBlock;
  c.initial_len = kInitial;
  c.local_windows_len = kLocal;
  c.kv_type = a.kv_type;
  c.dense_layer_num = 0;  // the model has 2 layers: both select
  c.policy = sparse ? SelectionPolicy::kSelect : SelectionPolicy::kDense;
  const int64_t blocks = cpu::blocks_for_token_budget(a.budget_tokens - kInitial - kLocal, kBlock);
  c.second_select_num = int(std::clamp<int64_t>(blocks, 1, max_seq_len / kBlock));
  return c;
}

// Random K/V in [-1, 1) for tokens [0, n) of every layer, a chunk at a time.
void fill_store(kvstore::KVStore& store, int64_t n) {
  const kvstore::KVShape& s = store.layout().shape;
  const int64_t chunk = 8192;
  std::vector<float> k(size_t(chunk) * s.n_kv_heads * s.head_dim), v(k.size());
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(state >> 40) * (2.0f / float(1 << 24)) - 1.0f;
  };
  for (int layer = 0; layer < s.n_layers; ++layer)
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t rows = std::min(chunk, n - begin);
      for (size_t i = 0; i < size_t(rows) * s.n_kv_heads * s.head_dim; ++i) k[i] = next(), v[i] = next();
      store.append(layer, make_view(k.data(), DType::kF32, {rows, s.n_kv_heads, s.head_dim}),
                   make_view(v.data(), DType::kF32, {rows, s.n_kv_heads, s.head_dim}));
    }
}

Record decode_record(const DecodeArgs& a, const scheduler::Transformer& model, Backend& backend, int64_t context,
                     bool sparse) {
  scheduler::Sequence seq(backend, model, config_for(a, context + a.steps + 1, sparse));
  fill_store(seq.store(), context);
  seq.sync_with_store();
  int32_t token = 1;
  seq.decode(token);  // warm-up: first selection, workspace allocation
  seq.reset_stats();
  std::vector<double> seconds;
  for (int i = 0; i < a.steps; ++i) {
    const double start = now_seconds();
    const std::vector<float> logits = seq.decode(token);
    seconds.push_back(now_seconds() - start);
    token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const double ms = 1e3 * median(seconds);
  Record r;
  r.set("bench", "decode").set("phase", "decode").set("context", context);
  r.set("attention", sparse ? "sparse" : "dense").set("budget", sparse ? a.budget_tokens : int64_t{0});
  r.set("kv_type", dtype_name(a.kv_type)).set("steps", a.steps).set("ms_per_token", ms);
  r.set("tokens_per_s", 1e3 / ms).set("attended", seq.stats().mean_attended_fraction());
  return r;
}

Record prefill_record(const DecodeArgs& a, const scheduler::Transformer& model, Backend& backend) {
  LongContextConfig config = config_for(a, std::max<int64_t>(a.prefill_tokens, kInitial + kLocal + kBlock), false);
  scheduler::Sequence seq(backend, model, config);
  std::vector<int32_t> tokens(size_t(a.prefill_tokens));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 2654435761u) % uint64_t(model.spec.n_vocab));
  const double start = now_seconds();
  seq.prefill(tokens);
  const double seconds = now_seconds() - start;
  Record r;
  r.set("bench", "decode").set("phase", "prefill").set("context", a.prefill_tokens).set("attention", "dense");
  r.set("kv_type", dtype_name(a.kv_type)).set("chunk_size", config.chunk_size).set("seconds", seconds);
  r.set("ms_per_token", 1e3 * seconds / double(a.prefill_tokens)).set("tokens_per_s", double(a.prefill_tokens) / seconds);
  return r;
}


}  // namespace

int run_decode(const std::vector<std::string>& args) {
  DecodeArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, args[i], " needs a value");
      return args[++i];
    };
    if (args[i] == "--contexts") a.contexts = parse_list(next());
    else if (args[i] == "--budget") a.budget_tokens = std::stoll(next());
    else if (args[i] == "--steps") a.steps = std::stoi(next());
    else if (args[i] == "--prefill") a.prefill_tokens = std::stoll(next());
    else if (args[i] == "--kv-type") {
      const auto t = parse_dtype(next());
      if (!t) fail(ErrorCode::kInvalidArgument, "decode: --kv-type must be f32, f16 or bf16");
      a.kv_type = *t;
    } else if (args[i] == "--quick") a.contexts = {4096, 32768}, a.steps = 8, a.prefill_tokens = 1024;
    else fail(ErrorCode::kInvalidArgument, "decode: unknown argument '", args[i], "'");
  }
  if (a.steps < 1 || a.prefill_tokens < 1 || a.budget_tokens < kInitial + kLocal + kBlock)
    fail(ErrorCode::kInvalidArgument, "decode: --steps and --prefill must be >= 1 and --budget >= ",
         kInitial + kLocal + kBlock);
  for (int64_t c : a.contexts)
    if (c < kInitial + kLocal + kBlock) fail(ErrorCode::kInvalidArgument, "decode: context ", c, " is too small");

  const TempModel file("bench");
  cpu::CpuBackend backend;
  const auto model = model::Model::open(file.path, backend);
  const scheduler::TransformerSpec& s = model->spec();

  std::vector<Record> records;
  auto emit = [&](const Record& r) {
    std::printf("%s\n", r.json().c_str());
    std::fflush(stdout);
    records.push_back(r);
  };
  emit(prefill_record(a, model->transformer(), backend));
  for (int64_t context : a.contexts)
    for (bool sparse : {false, true}) emit(decode_record(a, model->transformer(), backend, context, sparse));

  std::printf("\nModel \"bench\": %d layers, %d q heads, %d kv heads, d=%d, n_embd %d, n_ff %d, vocab %lld; "
              "KV %s; sparse = %lld-token budget (%d sinks + %d local + blocks of %d)\n",
              s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.n_embd, s.n_ff, static_cast<long long>(s.n_vocab),
              dtype_name(a.kv_type), static_cast<long long>(a.budget_tokens), kInitial, kLocal, kBlock);
  print_table(records, {"phase", "context", "attention", "ms_per_token", "tokens_per_s", "attended"});
  return 0;
}

}  // namespace longctx::bench
