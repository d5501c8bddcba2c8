// longctx-bench gpu: the GPU attention kernels and the GPU prefill path.
//   prefill_attention  TFLOP/s of causal prefill attention, one chunk of
//                      --chunk queries over --histories tokens of history
//                      (n_kv = history + chunk), Llama-8B-like heads (32 q,
//                      8 kv, d=128), f16 and bf16 K/V; FLOPs = 4 * n_q *
//                      mean keys per query * head_dim * n_heads; median of
//                      --reps runs timed with CUDA events. The same shapes
//                      through torch's scaled_dot_product_attention
//                      (tools/bench_sdpa.py, when the Python of $LONGCTX_PYTHON,
//                      else /usr/bin/python3, has torch
//                      with CUDA) and the ratio.
//   local_window       GB/s of K/V read by local_window_attention for each
//                      window (ring of `window` slots, wrapped), single pass
//                      and split-K (workspace), vs the device-to-device
//                      cudaMemcpy bandwidth (read + write counted) measured here.
//   prefill_e2e        tokens/s of a whole prefill of the generated "bench"
//                      model (tools/test_model.h) through scheduler::Sequence
//                      on the CUDA backend, per context.
//   decode_e2e         then decode steps at that depth (QUEST, 4096-token
//                      budget): the median step in ms, and the CPU's part
//                      of it (store append, selection, sparse attention)
//                      while the device attends the local window; and the
//                      same with overlap_decode off (the host waits for the
//                      window's attention before its part: the serial baseline).
//   prefill_turn2      then a second turn of 4096 tokens over that context
//                      (each layer's cached K/V go back to the device first).
// Without a CUDA device it prints {"bench":"gpu","skipped":"no CUDA device: ..."}.
//
//   longctx-bench gpu [--histories 32768,131072] [--chunk 4096] [--windows 4096,8192,16384,32768,65536]
//                     [--contexts 32768,131072] [--reps 5] [--no-sdpa] [--no-e2e] [--quick]

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/core/random.h"
#include "longctx/gpu/attention.h"
#include "longctx/gpu/cuda_backend.h"
#include "longctx/gpu/device_memory.h"
#include "longctx/gpu/device.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"
#include "longctx/tools/test_model.h"


namespace longctx::bench {
namespace {

struct GpuArgs {
  std::vector<int64_t> histories{32768, 131072};
  int64_t chunk = 4096;
  std::vector<int64_t> windows{4096, 8192, 16384, 32768, 65536};
  std::vector<int64_t> contexts{32768, 131072};
  int reps = 5;
  bool sdpa = true;
  bool e2e = true;
};

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;


std::string join(const std::vector<int64_t>& values) {
  std::string s;
  for (int64_t v : values) s.append(s.empty() ? "" : ",").append(std::to_string(v));
  return s;
}

void emit(std::vector<Record>& records, const Record& r) {
  std::printf("%s\n", r.json().c_str());
  std::fflush(stdout);
  records.push_back(r);
}

// One prefill of `context` tokens (tokens/s), then decode steps at that depth
// with QUEST at a 4096-token budget (the device attends the local window, the
// CPU the sinks and the selected blocks): the median step, and where the
// steps' time went. Throws kUnsupported when the CUDA backend is not available.
constexpr int64_t kTurn2 = 4096;  // tokens of the second turn's prefill
constexpr int64_t kDecodeBudget = 4096;  // tokens a decode step attends: sinks, selected blocks, window

std::vector<Record> e2e_records(int64_t context, int reps, bool overlap) {
  const TempModel file("bench");
  gpu::CudaBackendOptions options;
  options.overlap_decode = overlap;
  auto backend = gpu::make_cuda_backend(options);
  const auto model = model::Model::open(file.path, *backend);
  LongContextConfig c;
  c.max_seq_len = context + 64 + kTurn2;
  c.chunk_size = 4096;
  c.block_size = 128;
  c.initial_len = 128;
  c.local_windows_len = 1024;
  c.kv_type = DType::kF16;
  c.dense_layer_num = 0;
  c.policy = SelectionPolicy::kSelect;
  c.second_select_num = second_select_num_for_budget(kDecodeBudget, c);  // as longctx-bench decode: 23 blocks
  scheduler::Sequence seq(*backend, model->transformer(), c);
  std::vector<int32_t> tokens(static_cast<size_t>(context));
  const int64_t vocab = model->spec().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 2654435761u) % uint64_t(vocab));
  const double start = now_seconds();
  seq.prefill(tokens);
  const double seconds = now_seconds() - start;
  Record pre;
  pre.set("bench", "gpu").set("part", "prefill_e2e").set("model", "bench").set("context", context);
  pre.set("backend", backend->name()).set("seconds", seconds).set("tokens_per_s", double(context) / seconds);

  const int warmup = 4, steps = std::max(8, 8 * reps);
  for (int i = 0; i < warmup; ++i) seq.decode(int32_t(i % vocab));
  seq.reset_stats();
  std::vector<double> step_seconds;
  for (int i = 0; i < steps; ++i) {
    const double t0 = now_seconds();
    seq.decode(int32_t((i * 7 + 3) % vocab));
    step_seconds.push_back(now_seconds() - t0);
  }
  const scheduler::SequenceStats& st = seq.stats();
  const double per_step = 1e3 / double(steps);
  Record dec;
  dec.set("bench", "gpu").set("part", "decode_e2e").set("model", "bench").set("context", context);
  dec.set("device_attention", seq.uses_device_attention() ? "yes" : seq.device_declined());
  dec.set("overlap", overlap ? "yes" : "no");
  dec.set("steps", steps).set("step_ms", 1e3 * median(step_seconds));
  dec.set("append_ms", st.decode_append_seconds * per_step).set("select_ms", st.decode_select_seconds * per_step);
  dec.set("cpu_attend_ms", st.decode_attend_seconds * per_step);
  dec.set("attended", st.mean_attended_fraction());

  // A second turn: kTurn2 more tokens prefilled over the cached context, which
  // each layer first uploads back to the device (its history).
  std::vector<int32_t> turn2(static_cast<size_t>(kTurn2));
  for (size_t i = 0; i < turn2.size(); ++i) turn2[i] = int32_t((i * 40503u + 7) % uint64_t(vocab));
  const double t2 = now_seconds();
  seq.prefill(turn2);
  const double turn2_seconds = now_seconds() - t2;
  Record next;
  next.set("bench", "gpu").set("part", "prefill_turn2").set("model", "bench").set("context", context);
  next.set("new_tokens", kTurn2).set("seconds", turn2_seconds).set("tokens_per_s", double(kTurn2) / turn2_seconds);
  return {pre, dec, next};
}


// Random f32 in [-1, 1) rounded into rows [0, rows) of a kv_dtype buffer, via store_kv.
void fill_random(void* dst, DType dtype, int64_t rows, int64_t row_elems, uint64_t seed) {
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{64} << 20) / (row_elems * 4)));
  std::vector<float> host(size_t(chunk * row_elems));
  gpu::DeviceMemory staging(host.size() * sizeof(float));
  SplitMix64 rng(seed);
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    for (size_t i = 0; i < size_t(n * row_elems); ++i) host[i] = float(2.0 * rng.uniform() - 1.0);
    staging.upload(host.data(), size_t(n * row_elems) * 4);
    gpu::StoreKVParams s;
    s.src = staging.get<float>(), s.dst = dst, s.kv_dtype = dtype;
    s.n = n, s.row_elems = row_elems, s.first_pos = begin, s.capacity = rows;
    gpu::store_kv(s, nullptr);
  }
  gpu::synchronize_device();
}

Record prefill_record(const GpuArgs& a, DType dtype, int64_t history) {
  const int64_t n_q = a.chunk, n_kv = history + n_q;
  const int64_t row = int64_t(kKvHeads) * kHeadDim;
  gpu::DeviceMemory k(size_t(n_kv * row) * 2), v(size_t(n_kv * row) * 2);
  gpu::DeviceMemory q(size_t(n_q) * kHeads * kHeadDim * 4), out(size_t(n_q) * kHeads * kHeadDim * 4),
      lse(size_t(n_q) * kHeads * 4);
  fill_random(k.get(), dtype, n_kv, row, 1);
  fill_random(v.get(), dtype, n_kv, row, 2);
  {  // q: f32 in [-1, 1) (store_kv cannot write f32; upload directly)
    std::vector<float> host(size_t(n_q) * kHeads * kHeadDim);
    SplitMix64 rng(3);
    for (float& x : host) x = float(2.0 * rng.uniform() - 1.0);
    q.upload(host.data(), host.size() * 4);
  }
  gpu::PrefillAttentionParams p;
  p.q = q.get<float>(), p.k = k.get(), p.v = v.get(), p.out = out.get<float>(), p.lse = lse.get<float>();
  p.kv_dtype = dtype, p.n_q = n_q, p.n_kv = n_kv, p.q_first_pos = history;
  p.n_heads = kHeads, p.n_kv_heads = kKvHeads, p.head_dim = kHeadDim;
  const double seconds = median(gpu::time_device(a.reps, 1, [&] { gpu::prefill_attention(p, nullptr); }));
  const double mean_keys = double(history) + double(n_q + 1) / 2.0;
  const double flops = 4.0 * double(n_q) * mean_keys * kHeadDim * kHeads;
  Record r;
  r.set("bench", "gpu").set("part", "prefill_attention").set("dtype", dtype_name(dtype));
  r.set("history", history).set("n_q", n_q).set("n_kv", n_kv).set("heads", str_cat(kHeads, "/", kKvHeads, "x", kHeadDim));
  r.set("ms", 1e3 * seconds).set("tflops", flops / seconds / 1e12);
  return r;
}

double measure_d2d_gbps(int reps) {
  const size_t bytes = size_t{512} << 20;
  gpu::DeviceMemory src(bytes), dst(bytes);
  src.fill_bytes(1);
  const double seconds =
      median(gpu::time_device(reps, 1, [&] { gpu::copy_device_to_device(dst.get(), src.get(), bytes); }));
  return 2.0 * double(bytes) / seconds / 1e9;  // read + write
}

Record local_record(const GpuArgs& a, int64_t window, bool split, double copy_gbps) {
  const int64_t row = int64_t(kKvHeads) * kHeadDim;
  gpu::DeviceMemory k(size_t(window * row) * 2), v(size_t(window * row) * 2);
  gpu::DeviceMemory q(size_t(kHeads) * kHeadDim * 4), out(size_t(kHeads) * kHeadDim * 4), lse(size_t(kHeads) * 4);
  const size_t work_bytes = gpu::local_window_workspace_bytes(kHeads, kHeadDim);
  gpu::DeviceMemory work(work_bytes);
  fill_random(k.get(), DType::kF16, window, row, 4);
  fill_random(v.get(), DType::kF16, window, row, 5);
  q.fill_bytes(0);
  gpu::LocalAttentionParams p;
  p.q = q.get<float>(), p.k = k.get(), p.v = v.get(), p.out = out.get<float>(), p.lse = lse.get<float>();
  p.kv_dtype = DType::kF16, p.capacity = window;
  p.last_pos = 3 * window + 17, p.first_pos = p.last_pos + 1 - window;  // a wrapped ring, all slots attended
  p.n_heads = kHeads, p.n_kv_heads = kKvHeads, p.head_dim = kHeadDim;
  if (split) p.workspace = work.get(), p.workspace_bytes = work_bytes;
  const double seconds = median(gpu::time_device(a.reps, 20, [&] { gpu::local_window_attention(p, nullptr); }));
  const double bytes = 2.0 * double(window) * double(row) * 2.0;  // K and V, f16
  Record r;
  r.set("bench", "gpu").set("part", "local_window").set("dtype", "f16").set("window", window);
  r.set("mode", split ? "split" : "single").set("us", 1e6 * seconds).set("gbps", bytes / seconds / 1e9);
  r.set("copy_gbps", copy_gbps).set("of_copy", bytes / seconds / 1e9 / copy_gbps);
  return r;
}

// Runs tools/bench_sdpa.py; returns its JSON lines (or one "skipped" line).
std::vector<std::string> run_sdpa(const GpuArgs& a) {
  // A GPU machine's torch may live in another Python than Debian's.
  const char* env_python = std::getenv("LONGCTX_PYTHON");
  const std::string python = env_python != nullptr && *env_python != '\0' ? env_python : "/usr/bin/python3";
  std::string script;
  try {
    script = tools_script("bench_sdpa.py");
  } catch (const Error& e) {
    Record r;
    r.set("bench", "gpu_sdpa").set("skipped", e.what());
    return {r.json()};
  }
  const std::string command = str_cat(python, " ", script, " --histories ", join(a.histories), " --n-q ", a.chunk,
                                      " --heads ", kHeads, " --kv-heads ", kKvHeads, " --head-dim ", kHeadDim,
                                      " --reps ", a.reps, " 2>/dev/null");
  std::vector<std::string> lines;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    Record r;
    r.set("bench", "gpu_sdpa").set("skipped", str_cat("cannot run ", python));
    return {r.json()};
  }
  std::string line;
  for (int ch; (ch = std::fgetc(pipe)) != EOF;) {
    if (ch != '\n') {
      line += char(ch);
    } else if (!line.empty()) {
      if (line.front() == '{') lines.push_back(line);
      line.clear();
    }
  }
  const int status = pclose(pipe);
  if (lines.empty()) {
    Record r;
    r.set("bench", "gpu_sdpa").set("skipped", str_cat("tools/bench_sdpa.py printed nothing (exit status ", status, ")"));
    lines.push_back(r.json());
  }
  return lines;
}

int run_device(const GpuArgs& a, const gpu::DeviceInfo& device) {
  std::vector<Record> prefill, local, e2e, ratios;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int64_t history : a.histories) emit(prefill, prefill_record(a, dtype, history));

  if (a.sdpa) {
    for (const std::string& line : run_sdpa(a)) {
      std::printf("%s\n", line.c_str());
      if (!json_field(line, "skipped").empty()) continue;
      for (const Record& r : prefill) {
        if (!same_prefill_case(r, line)) continue;
        const double ours = std::strtod(r.get("tflops").c_str(), nullptr);
        const double theirs = std::strtod(json_field(line, "tflops").c_str(), nullptr);
        Record x;
        x.set("bench", "gpu").set("part", "prefill_vs_sdpa").set("dtype", json_field(line, "dtype"));
        x.set("history", int64_t(std::stoll(json_field(line, "history")))).set("tflops", ours).set("sdpa_tflops", theirs);
        x.set("sdpa_backend", json_field(line, "backend")).set("ratio", theirs > 0 ? ours / theirs : 0.0);
        emit(ratios, x);
      }
    }
  }

  const double copy_gbps = measure_d2d_gbps(a.reps);
  for (int64_t window : a.windows)
    for (bool split : {false, true}) emit(local, local_record(a, window, split, copy_gbps));

  std::vector<Record> decode;
  if (a.e2e) {
    for (int64_t context : a.contexts) {
      try {
        // The decode step with the CPU part beside the device's window, then serially.
        for (bool overlap : {true, false}) {
          const std::vector<Record> rows = e2e_records(context, a.reps, overlap);
          if (overlap) emit(e2e, rows[0]), emit(e2e, rows[2]);
          emit(decode, rows[1]);
        }
      } catch (const Error& e) {  // the CUDA backend is missing or failed: report, keep the rest
        Record r;
        r.set("bench", "gpu").set("part", "prefill_e2e").set("context", context).set("skipped", e.what());
        emit(e2e, r);
        break;
      }
    }
  }

  std::printf("\nDevice %s (sm_%d%d, %d SMs); heads %d q / %d kv, d=%d\n", device.name.c_str(), device.sm_major,
              device.sm_minor, device.multiprocessors, kHeads, kKvHeads, kHeadDim);
  print_table(prefill, {"dtype", "history", "n_q", "ms", "tflops"});
  if (!ratios.empty()) {
    std::printf("\n");
    print_table(ratios, {"dtype", "history", "tflops", "sdpa_tflops", "sdpa_backend", "ratio"});
  }
  std::printf("\nlocal window (K+V bytes read / s; copy_gbps = cudaMemcpy D2D, read + write counted)\n");
  print_table(local, {"window", "mode", "us", "gbps", "copy_gbps", "of_copy"});
  if (!e2e.empty()) {
    std::printf("\n");
    print_table(e2e, {"part", "context", "new_tokens", "backend", "seconds", "tokens_per_s", "skipped"});
  }
  if (!decode.empty()) {
    std::printf("\ndecode steps after that prefill (QUEST, 4096-token budget; append/select/cpu_attend: the CPU's part)\n");
    print_table(decode, {"context", "device_attention", "overlap", "step_ms", "append_ms", "select_ms", "cpu_attend_ms", "attended"});
  }
  return 0;
}

}  // namespace

int run_gpu(const std::vector<std::string>& args) {
  GpuArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, "gpu: ", args[i], " needs a value");
      return args[++i];
    };
    // The option's value as an integer in [min, kMaxInt], named with the option.
    auto int_value = [&](int64_t min) {
      const std::string flag = "gpu: " + args[i];
      return parse_int_flag(flag, next(), min, kMaxInt);
    };
    if (args[i] == "--histories") a.histories = parse_list(next(), "gpu: --histories", 0);
    else if (args[i] == "--chunk") a.chunk = int_value(1);
    else if (args[i] == "--windows") a.windows = parse_list(next(), "gpu: --windows", 1);
    else if (args[i] == "--contexts") a.contexts = parse_list(next(), "gpu: --contexts", 2048);
    else if (args[i] == "--reps") a.reps = int(int_value(1));
    else if (args[i] == "--no-sdpa") a.sdpa = false;
    else if (args[i] == "--no-e2e") a.e2e = false;
    else if (args[i] == "--quick") a.histories = {32768}, a.windows = {4096, 65536}, a.contexts = {32768}, a.reps = 3;
    else fail(ErrorCode::kInvalidArgument, "gpu: unknown argument '", args[i], "'");
  }

  std::string why;
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices(&why);
  if (devices.empty()) {
    Record r;
    r.set("bench", "gpu").set("skipped", "no CUDA device: " + why);
    std::printf("%s\n", r.json().c_str());
    return 0;
  }
  return run_device(a, devices.front());
}

}  // namespace longctx::bench
