// longctx-bench decode / prefill: the whole model on the CPU path, loaded
// through model/ (weights as model.weights says: native GGUF types by
// default) and driven by scheduler::Sequence. Without --model, a generated
// model whose attention is sized like Llama-3-8B's (tools "bench": 32 q
// heads, 8 kv heads, d=128; 2 layers and a small MLP so it runs anywhere);
// `longctx-make-model --preset llama3-8b[-4l]` writes real-size files.
//   decode   tokens/s of decode steps at each context, dense (policy dense)
//            and sparse (policy select, every layer selecting, budget
//            --budget tokens = initial_len 128 + local window 1024 + the
//            selected blocks of 128). The context is filled with random K/V
//            appended straight to the KV store (a model prefill of 128K
//            tokens would take hours on two cores; decode cost does not
//            depend on the values), then every step is a real decode step.
//            Beside tokens/s: the matmuls' share of a step, the weight bytes
//            a step reads and their rate against the read bandwidth measured
//            in the same run, where each step's time goes (matmuls, K/V
//            appends, scoring + selection, attention, the rest) and the
//            process's resident memory.
//   prefill  tokens/s of a dense layer-major chunked prefill of each --tokens
//            count (real forward passes), with the matmuls' time and GFLOP/s
//            against the fp32 FMA and int8 peaks measured in the same run.
//
//   longctx-bench decode [--model FILE.gguf] [--weights native|bf16|f32] [--contexts 4096,32768,131072]
//                        [--budget 4096] [--steps 16] [--kv-type f16] [--quick]
//   longctx-bench prefill [--model FILE.gguf] [--weights native|bf16|f32] [--tokens 4096,16384]
//                         [--quant-prefill auto|int8|bf16-tiles|f32-tiles]
//                         [--chunk 4096] [--quick]

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tbb/info.h>

#include "bench_util.h"
#include "timed_backend.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/quant_matmul.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"
#include "longctx/tools/test_model.h"

namespace longctx::bench {
namespace {

struct DecodeArgs {
  std::string model;  // empty: the generated "bench" preset
  WeightStorage weights = WeightStorage::kNative;
  cpu::QuantPrefill quant_prefill = cpu::QuantPrefill::kAuto;
  std::vector<int64_t> contexts{4096, 32768, 131072};
  int64_t budget_tokens = 4096;
  int steps = 16;
  std::vector<int64_t> prefill_tokens{4096, 16384};
  int64_t chunk_size = 4096;
  DType kv_type = DType::kF16;
};

constexpr int kBlock = 128, kInitial = 128, kLocal = 1024;

LongContextConfig config_for(const DecodeArgs& a, int64_t max_seq_len, bool sparse) {
  LongContextConfig c;
  c.max_seq_len = max_seq_len;
  c.chunk_size = int(a.chunk_size);
  c.block_size = kBlock;
  c.initial_len = kInitial;
  c.local_windows_len = kLocal;
  c.kv_type = a.kv_type;
  c.dense_layer_num = 0;  // the model has 2 layers: both select
  c.policy = sparse ? SelectionPolicy::kSelect : SelectionPolicy::kDense;
  c.second_select_num = second_select_num_for_budget(a.budget_tokens, c);
  return c;
}

// Random K/V in [-1, 1) for tokens [0, n) of every layer: one random chunk
// of 8192 tokens per layer, appended as often as the context needs (an 8B
// model at 128K holds 16 GiB of K/V; drawing every value would dominate).
void fill_store(kvstore::KVStore& store, int64_t n) {
  const kvstore::KVShape& s = store.layout().shape;
  const int64_t chunk = 8192;
  std::vector<float> k(size_t(chunk) * s.n_kv_heads * s.head_dim), v(k.size());
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(state >> 40) * (2.0f / float(1 << 24)) - 1.0f;
  };
  for (int layer = 0; layer < s.n_layers; ++layer) {
    for (size_t i = 0; i < k.size(); ++i) k[i] = next(), v[i] = next();
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t rows = std::min(chunk, n - begin);
      store.append(layer, make_view(k.data(), DType::kF32, {rows, s.n_kv_heads, s.head_dim}),
                   make_view(v.data(), DType::kF32, {rows, s.n_kv_heads, s.head_dim}));
    }
  }
}

// The model under test: --model, or the generated "bench" preset in a temp file.
struct BenchModel {
  std::optional<TempModel> generated;
  cpu::CpuBackend cpu;
  TimedBackend backend{cpu};
  std::unique_ptr<model::Model> model;

  explicit BenchModel(const DecodeArgs& a) : cpu({.weights = a.weights, .quant_prefill = a.quant_prefill}) {
    if (a.model.empty()) generated.emplace("bench");
    model = model::Model::open(a.model.empty() ? generated->path : a.model, backend);
  }
  const scheduler::Transformer& transformer() const { return model->transformer(); }
  std::string name() const { return model->gguf().get_string_or("general.name", "?"); }
};

Record decode_record(const DecodeArgs& a, BenchModel& m, int64_t context, bool sparse, double read_gbps) {
  scheduler::Sequence seq(m.backend, m.transformer(), config_for(a, context + a.steps + 1, sparse));
  fill_store(seq.store(), context);
  seq.sync_with_store();
  int32_t token = 1;
  seq.decode(token);  // warm-up: first selection, workspace allocation
  seq.reset_stats();
  m.backend.reset();
  std::vector<double> seconds;
  for (int i = 0; i < a.steps; ++i) {
    const double start = now_seconds();
    const std::vector<float> logits = seq.decode(token);
    seconds.push_back(now_seconds() - start);
    token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const TimedBackend::Matmuls& mm = m.backend.matmuls();
  const double ms = 1e3 * median(seconds), matmul_ms = 1e3 * mm.seconds / a.steps;
  const double weight_gbps = mm.weight_bytes / mm.seconds / 1e9;
  Record r;
  r.set("bench", "decode").set("model", m.name()).set("weights", weight_storage_name(a.weights));
  r.set("context", context).set("attention", sparse ? "sparse" : "dense");
  r.set("budget", sparse ? a.budget_tokens : int64_t{0}).set("kv_type", dtype_name(a.kv_type)).set("steps", a.steps);
  r.set("ms_per_token", ms).set("tokens_per_s", 1e3 / ms).set("attended", seq.stats().mean_attended_fraction());
  r.set("matmul_ms", matmul_ms).set("weight_bytes_per_token", int64_t(mm.weight_bytes / a.steps));
  r.set("weight_gbps", weight_gbps).set("read_gbps", read_gbps).set("of_bandwidth", weight_gbps / read_gbps);
  // Where a step's time goes (means over the steps, ms per token): the
  // matmuls, the K/V appends, scoring + selection, attention, and the rest
  // (norms, RoPE, SwiGLU, adds, embedding, host copies).
  const scheduler::SequenceStats& st = seq.stats();
  const double mean_ms = 1e3 * st.decode_seconds / double(st.decode_tokens);
  const double append_ms = 1e3 * st.decode_append_seconds / double(st.decode_tokens);
  const double select_ms = 1e3 * st.decode_select_seconds / double(st.decode_tokens);
  const double attend_ms = 1e3 * st.decode_attend_seconds / double(st.decode_tokens);
  r.set("mean_ms", mean_ms).set("append_ms", append_ms).set("select_ms", select_ms).set("attend_ms", attend_ms);
  r.set("other_ms", mean_ms - matmul_ms - append_ms - select_ms - attend_ms);
  r.set("rss_gib", double(resident_bytes()) / double(1 << 30));
  return r;
}

// The compute peaks measured in the run (0 = not on this CPU).
struct Peaks {
  double fma_gflops, int8_gops, bf16_gflops;
};

Record prefill_record(const DecodeArgs& a, BenchModel& m, int64_t n_tokens, const Peaks& peaks) {
  LongContextConfig config = config_for(a, std::max<int64_t>(n_tokens, kInitial + kLocal + kBlock), false);
  scheduler::Sequence seq(m.backend, m.transformer(), config);
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 2654435761u) % uint64_t(m.transformer().spec.n_vocab));
  m.backend.reset();
  const double start = now_seconds();
  seq.prefill(tokens);
  const double seconds = now_seconds() - start;
  const TimedBackend::Matmuls& mm = m.backend.matmuls();
  Record r;
  r.set("bench", "prefill").set("model", m.name()).set("weights", weight_storage_name(a.weights));
  r.set("quant_prefill", cpu::quant_prefill_name(m.cpu.quant_prefill()));
  r.set("quant_prefill_groups", cpu::quant_prefill_name(m.cpu.quant_prefill(cpu::QuantLayout::kRows8)));
  r.set("tokens", n_tokens).set("attention", "dense").set("kv_type", dtype_name(a.kv_type));
  r.set("chunk_size", config.chunk_size).set("seconds", seconds).set("tokens_per_s", double(n_tokens) / seconds);
  const double gflops = mm.flops / mm.seconds / 1e9;
  const auto of = [&](double peak) { return peak > 0 ? gflops / peak : 0.0; };
  r.set("matmul_share", mm.seconds / seconds).set("matmul_gflops", gflops);
  r.set("fma_gflops", peaks.fma_gflops).set("of_fma_peak", of(peaks.fma_gflops));
  r.set("int8_gops", peaks.int8_gops).set("bf16_gflops", peaks.bf16_gflops);
  // A share of a unit's peak only where that unit ran the quantized matmuls (as longctx-bench matmul): the int8
  // kernels, or oneDNN's bf16 tiles (vdpbf16ps or AMX), for the weights in rows or in groups.
  const auto ran = [&](cpu::QuantPrefill path) {
    return mm.quantized_calls > 0 &&
           (m.cpu.quant_prefill() == path || m.cpu.quant_prefill(cpu::QuantLayout::kRows8) == path);
  };
  if (ran(cpu::QuantPrefill::kInt8) && peaks.int8_gops > 0) r.set("of_int8_peak", of(peaks.int8_gops));
  if (ran(cpu::QuantPrefill::kBf16Tiles) && peaks.bf16_gflops > 0) r.set("of_bf16_peak", of(peaks.bf16_gflops));
  r.set("rss_gib", double(resident_bytes()) / double(1 << 30));
  return r;
}

DecodeArgs parse_args(const char* command, const std::vector<std::string>& args) {
  DecodeArgs a;
  const auto option = [&](const char* name) { return str_cat(command, ": ", name); };  // for the lists
  // The smallest context and budget: the sinks, the local window and one selected block.
  constexpr int64_t kSmallest = kInitial + kLocal + kBlock;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, command, ": ", args[i], " needs a value");
      return args[++i];
    };
    // The option's value as an integer in [min, kMaxInt], named with the option.
    auto int_value = [&](int64_t min) {
      const std::string flag = str_cat(command, ": ", args[i]);
      return parse_int_flag(flag, next(), min, kMaxInt);
    };
    if (args[i] == "--model") a.model = next();
    else if (args[i] == "--weights") {
      const auto w = parse_weight_storage(next());
      if (!w) fail(ErrorCode::kInvalidArgument, command, ": --weights must be native, bf16 or f32");
      a.weights = *w;
    } else if (args[i] == "--quant-prefill") {
      const std::string& v = next();
      if (v == "auto") a.quant_prefill = cpu::QuantPrefill::kAuto;
      else if (v == "int8") a.quant_prefill = cpu::QuantPrefill::kInt8;
      else if (v == "bf16-tiles") a.quant_prefill = cpu::QuantPrefill::kBf16Tiles;
      else if (v == "f32-tiles") a.quant_prefill = cpu::QuantPrefill::kF32Tiles;
      else fail(ErrorCode::kInvalidArgument, command,
                ": --quant-prefill must be auto, int8, bf16-tiles or f32-tiles, got '", v, "'");
    } else if (args[i] == "--contexts") a.contexts = parse_list(next(), option("--contexts"), kSmallest);
    else if (args[i] == "--tokens") a.prefill_tokens = parse_list(next(), option("--tokens"), 1);
    else if (args[i] == "--budget") a.budget_tokens = int_value(kSmallest);
    else if (args[i] == "--steps") a.steps = int(int_value(1));
    else if (args[i] == "--chunk") a.chunk_size = int_value(1);
    else if (args[i] == "--kv-type") {
      const auto t = parse_dtype(next());
      if (!t) fail(ErrorCode::kInvalidArgument, command, ": --kv-type must be f16, bf16, f32 or q8_0");
      a.kv_type = *t;
    } else if (args[i] == "--quick") a.contexts = {4096, 32768}, a.steps = 8, a.prefill_tokens = {1024};
    else fail(ErrorCode::kInvalidArgument, command, ": unknown argument '", args[i], "'");
  }
  return a;
}

void print_model_line(const BenchModel& m, const DecodeArgs& a) {
  const scheduler::TransformerSpec& s = m.transformer().spec;
  std::printf("\nModel \"%s\": %d layers, %d q heads, %d kv heads, d=%d, n_embd %d, n_ff %d, vocab %lld, weights %s "
              "(%s); KV %s; %d threads\n",
              m.name().c_str(), s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.n_embd, s.n_ff,
              static_cast<long long>(s.n_vocab), weight_storage_name(a.weights), m.cpu.name().c_str(),
              dtype_name(a.kv_type), tbb::info::default_concurrency());
}

void emit(std::vector<Record>& records, const Record& r) {
  std::printf("%s\n", r.json().c_str());
  std::fflush(stdout);
  records.push_back(r);
}

}  // namespace

int run_decode(const std::vector<std::string>& args) {
  const DecodeArgs a = parse_args("decode", args);
  const double read_gbps = measure_read_gbps(size_t(1) << 30, tbb::info::default_concurrency(), 5);
  BenchModel m(a);
  std::vector<Record> records;
  for (int64_t context : a.contexts)
    for (bool sparse : {false, true}) emit(records, decode_record(a, m, context, sparse, read_gbps));
  print_model_line(m, a);
  std::printf("sparse = %lld-token budget (%d sinks + %d local + blocks of %d); read bandwidth %.1f GB/s; peak RSS %.2f "
              "GiB\n",
              static_cast<long long>(a.budget_tokens), kInitial, kLocal, kBlock, read_gbps,
              double(peak_resident_bytes()) / double(1 << 30));
  print_table(records, {"context", "attention", "ms_per_token", "tokens_per_s", "attended", "matmul_ms", "append_ms",
                        "select_ms", "attend_ms", "other_ms", "of_bandwidth", "rss_gib"});
  return 0;
}

int run_prefill(const std::vector<std::string>& args) {
  const DecodeArgs a = parse_args("prefill", args);
  const int threads = tbb::info::default_concurrency();
  const Peaks peaks{measure_fma_gflops(threads), measure_int8_gops(threads), measure_bf16_gflops(threads)};
  BenchModel m(a);
  std::vector<Record> records;
  for (int64_t n : a.prefill_tokens) emit(records, prefill_record(a, m, n, peaks));
  print_model_line(m, a);
  std::printf("dense attention, chunk %lld; fp32 FMA peak %.0f GFLOP/s, int8 peak %.0f GOP/s (%s), bf16 (vdpbf16ps) "
              "peak %.0f GFLOP/s (measured in this run; 0 = not on this CPU); peak RSS %.2f GiB\n",
              static_cast<long long>(a.chunk_size), peaks.fma_gflops, peaks.int8_gops,
              cpu::quant_isa_name(cpu::best_quant_isa()), peaks.bf16_gflops, double(peak_resident_bytes()) / double(1 << 30));
  print_table(records, {"tokens", "seconds", "tokens_per_s", "matmul_share", "matmul_gflops", "of_fma_peak",
                        "of_int8_peak", "of_bf16_peak", "rss_gib"});
  return 0;
}

}  // namespace longctx::bench
