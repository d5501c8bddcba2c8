// longctx-bench kernels: one decode step of one layer on the CPU engine —
// dense attention, block scoring, selection (policy::select_blocks), sparse
// attention, the LSE merge with the GPU part, and the whole sparse step as
// DecodePolicy::decode runs it — over
// contexts from 4K to 1M tokens, with the bytes each kernel must read and the
// achieved GB/s beside the read bandwidth measured in the same run. Then
// prefill attention (cpu::prefill_attention, what a CPU-only prefill runs per
// layer): one chunk of --prefill-chunk queries over --prefill-histories tokens
// of history, f16 K/V, in TFLOP/s beside the fp32 FMA and bf16 (vdpbf16ps)
// peaks measured in the same run (FLOPs = 4 * head_dim * q heads * keys seen,
// summed over the chunk's queries: QK^T and PV, causal inside the chunk).
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <optional>
#include <vector>

#include "bench_util.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/select.h"

namespace longctx::bench {
namespace {

struct KernelsArgs {
  std::vector<int64_t> contexts{4096, 16384, 32768, 131072, 1048576};
  std::vector<DType> dtypes{DType::kF16, DType::kBF16, DType::kQ8_0};
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int block_size = 128;
  int64_t budget_tokens = 4096;
  int reps = 5;
  int64_t split_tokens = 0;  // decode_attention's flash-decoding piece size; 0 = its default
  std::vector<int64_t> prefill_histories{32768, 131072};  // empty: no prefill rows
  int64_t prefill_chunk = 4096;
  int prefill_reps = 1;  // a 4096-query chunk over 128K takes tens of seconds on 2 cores
};

// Fills `layer` 0 of the store with random keys/values, a chunk at a time so
// the f32 staging buffer stays small.
void fill_store(kvstore::KVStore& store, int64_t n_tokens, int kv_heads, int head_dim) {
  const int64_t chunk = 8192;
  std::vector<float> k(size_t(chunk) * kv_heads * head_dim), v(k.size());
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(state >> 40) * (2.0f / float(1 << 24)) - 1.0f;
  };
  for (int64_t begin = 0; begin < n_tokens; begin += chunk) {
    const int64_t n = std::min(chunk, n_tokens - begin);
    for (size_t i = 0; i < size_t(n) * kv_heads * head_dim; ++i) k[i] = next(), v[i] = next();
    store.append(0, make_view(k.data(), DType::kF32, {n, kv_heads, head_dim}),
                 make_view(v.data(), DType::kF32, {n, kv_heads, head_dim}));
  }
}

std::vector<Record> run_context(const KernelsArgs& a, int64_t context, DType dtype, int threads,
                                double read_gbps) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  LongContextConfig config;
  config.max_seq_len = context;
  config.block_size = a.block_size;
  config.initial_len = 0;  // the budget is spent on selected blocks only
  config.local_windows_len = 0;
  config.kv_type = dtype;
  config.representative_type = RepresentativeType::kQuest;
  config.representative_num = 2;
  config.head_select_mode = HeadSelectMode::kSeparate;
  config.dense_layer_num = 0;  // layer 0 selects
  const int64_t blocks = cpu::blocks_for_token_budget(a.budget_tokens, a.block_size);
  config.second_select_num = int(std::min<int64_t>(blocks, context / a.block_size));
  const kvstore::KVShape shape{1, a.kv_heads, a.head_dim};
  const auto topology = kvstore::NumaTopology::detect();
  kvstore::MemoryBudget budget(kvstore::default_dram_budget());
  kvstore::KVStore store(shape, config, budget, topology);
  fill_store(store, context, a.kv_heads, a.head_dim);

  std::vector<float> q(size_t(a.q_heads) * a.head_dim), out(q.size()), lse(a.q_heads);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
  const TensorView qv = make_view(q.data(), DType::kF32, {a.q_heads, a.head_dim});
  const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {a.q_heads, a.head_dim});
  const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {a.q_heads});
  cpu::DecodeAttentionParams attn;
  attn.split_tokens = a.split_tokens;
  const kvstore::Partition part = store.partition(0);
  const int64_t n_blocks = part.end_context_block - part.first_context_block;
  std::vector<float> scores(size_t(a.kv_heads) * n_blocks);
  const MutableTensorView sv = make_mutable_view(scores.data(), DType::kF32, {a.kv_heads, n_blocks});
  const policy::SelectSpec select = policy::SelectSpec::from_config(config, true);
  cpu::Selection selection;
  // The production step: what longctx-chat runs for a layer that re-selects.
  policy::DecodePolicy decode_policy(config, store, 0.f);  // 0: 1/sqrt(head_dim), as the kernels above

  // A decode step of one layer finds its KV and representatives cold: the
  // other layers ran since (evict_caches, before every timed run).
  auto cold = [&](const std::function<void()>& fn) {
    std::vector<double> seconds;
    for (int r = 0; r < a.reps; ++r) {
      evict_caches();
      seconds.push_back(time_runs(1, fn)[0]);
    }
    return 1e3 * median(seconds);
  };
  // Bytes of one token's K or V vector of one kv head (q8_0: codes + scales), of one representative element.
  const double vector_bytes = double(kvstore::kv_vector_bytes(dtype, a.head_dim));
  // Bytes of one representative record's key slots (q8_0: codes and scales).
  const double rep_bytes =
      double(store.layout().rep_slots) * double(kvstore::kv_vector_bytes(dtype, a.head_dim));
  const double kv_bytes_per_token = 2.0 * a.kv_heads * vector_bytes;
  const double dense_ms = cold([&] { cpu::dense_decode_attention(store, 0, qv, attn, ov, lv); });
  const double score_ms = cold([&] { cpu::score_blocks(store, 0, qv, select.score, sv); });
  const double select_ms = cold([&] { selection = policy::select_blocks(store, 0, qv, select); });
  const double sparse_ms = cold([&] { cpu::decode_attention(store, 0, qv, selection, attn, ov, lv); });
  int64_t token_idx = 0;
  const double step_ms = cold([&] { decode_policy.decode(0, token_idx++, qv, true, ov, lv); });
  // The LSE merge of two partial results (CPU part + GPU window), as decode
  // runs it: on results still in cache, so timed hot over many calls.
  std::vector<float> out_b(out), lse_b(lse);
  constexpr int kMerges = 1000;
  const double merge_ms = 1e3 / kMerges * median(time_runs(a.reps, [&] {
    for (int i = 0; i < kMerges; ++i)
      cpu::merge_attention(out.data(), lse.data(), out_b.data(), lse_b.data(), out.data(), lse.data(), a.q_heads,
                           a.head_dim);
  }));
  int64_t selected_tokens = 0;
  for (int h = 0; h < a.kv_heads; ++h) selected_tokens += selection.tokens(h);

  const double dense_bytes = kv_bytes_per_token * double(context);
  const double score_bytes = double(n_blocks) * a.kv_heads * rep_bytes;
  const double sparse_bytes = double(selected_tokens) * 2.0 * vector_bytes;
  std::vector<Record> records;
  auto add = [&](const char* kernel, double ms, double bytes) {
    Record r;
    r.set("bench", "kernels").set("kernel", kernel).set("context", context).set("budget", a.budget_tokens);
    r.set("dtype", dtype_name(dtype)).set("threads", threads).set("ms", ms).set("bytes", int64_t(bytes));
    r.set("gbps", bytes / (ms * 1e-3) / 1e9).set("read_gbps", read_gbps);
    r.set("of_bandwidth", bytes / (ms * 1e-3) / 1e9 / read_gbps);
    records.push_back(r);
  };
  add("dense", dense_ms, dense_bytes);
  add("score", score_ms, score_bytes);
  add("select", select_ms, score_bytes);  // select = score + top-k + spans
  add("sparse", sparse_ms, sparse_bytes);
  add("merge", merge_ms, 3.0 * double(out.size() + lse.size()) * sizeof(float));  // two parts read, one written
  // sparse_step: DecodePolicy::decode, scoring + selection + attention as
  // they run in a model (select + sparse above are its parts, timed apart).
  Record step;
  step.set("bench", "kernels").set("kernel", "sparse_step").set("context", context).set("budget", a.budget_tokens);
  step.set("dtype", dtype_name(dtype)).set("threads", threads).set("ms", step_ms);
  step.set("bytes", int64_t(score_bytes + sparse_bytes)).set("gbps", (score_bytes + sparse_bytes) / (step_ms * 1e-3) / 1e9);
  step.set("read_gbps", read_gbps).set("of_bandwidth", (score_bytes + sparse_bytes) / (step_ms * 1e-3) / 1e9 / read_gbps);
  step.set("dense_over_sparse", dense_ms / sparse_ms);  // attention kernels over the same cache
  step.set("dense_over_step", dense_ms / step_ms);      // the whole decode step
  step.set("select_share", select_ms / step_ms);
  records.push_back(step);
  return records;
}

// Prefill attention of one chunk over `history` tokens with `kernel`, every thread of the machine.
// The peaks of this run (GFLOP/s, 0 where the CPU lacks the unit), every thread busy.
struct Peaks {
  double fma = 0, bf16 = 0, onednn = 0, amx = 0;
};

Record run_prefill_attention(const KernelsArgs& a, int64_t history, cpu::PrefillKernel kernel, const Peaks& peaks) {
  const int64_t n = a.prefill_chunk;
  LongContextConfig config;
  config.max_seq_len = history + n;
  config.block_size = a.block_size;
  config.kv_type = DType::kF16;
  const kvstore::KVShape shape{1, a.kv_heads, a.head_dim};
  const auto topology = kvstore::NumaTopology::detect();  // the store keeps a reference
  kvstore::MemoryBudget budget(kvstore::default_dram_budget());
  kvstore::KVStore store(shape, config, budget, topology);
  fill_store(store, history + n, a.kv_heads, a.head_dim);  // the chunk's own K/V are in the store first
  const size_t q_size = size_t(n) * a.q_heads * a.head_dim;
  std::vector<float> q(q_size), out(q_size), lse(size_t(n) * a.q_heads);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i % 100003));
  const TensorView qv = make_view(q.data(), DType::kF32, {n, a.q_heads, a.head_dim});
  const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {n, a.q_heads, a.head_dim});
  const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {n, a.q_heads});
  const double ms =
      1e3 * median(time_runs(a.prefill_reps,
                             [&] { cpu::prefill_attention(store, 0, history, qv, 0.f, ov, lv, kernel); }));
  // Query i sees history + i + 1 keys.
  const double keys_seen = double(n) * double(history) + double(n) * double(n + 1) / 2;
  const double flops = 4.0 * a.head_dim * a.q_heads * keys_seen;
  const double gflops = flops / (ms * 1e-3) / 1e9;
  Record r;
  r.set("bench", "kernels").set("kernel", "prefill_attention").set("path", cpu::prefill_kernel_name(kernel));
  r.set("history", history).set("chunk", n);
  r.set("q_heads", a.q_heads).set("kv_heads", a.kv_heads).set("head_dim", a.head_dim).set("dtype", "f16");
  r.set("threads", int64_t(tbb::info::default_concurrency())).set("ms", ms).set("tflops", gflops / 1e3);
  r.set("fma_gflops", peaks.fma).set("of_fma_peak", gflops / peaks.fma);
  r.set("bf16_gflops", peaks.bf16).set("of_bf16_peak", peaks.bf16 > 0 ? gflops / peaks.bf16 : 0.0);
  r.set("onednn_gflops", peaks.onednn).set("of_onednn_peak", peaks.onednn > 0 ? gflops / peaks.onednn : 0.0);
  r.set("amx_gflops", peaks.amx).set("of_amx_peak", peaks.amx > 0 ? gflops / peaks.amx : 0.0);
  r.set("engine", cpu::prefill_kernel_engine(kernel));
  return r;
}

}  // namespace

int run_kernels(const std::vector<std::string>& args) {
  KernelsArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, args[i], " needs a value");
      return args[++i];
    };
    if (args[i] == "--contexts") a.contexts = parse_list(next());
    else if (args[i] == "--prefill-histories") a.prefill_histories = parse_list(next());
    else if (args[i] == "--prefill-chunk") a.prefill_chunk = std::stoll(next());
    else if (args[i] == "--prefill-reps") a.prefill_reps = std::stoi(next());
    else if (args[i] == "--no-prefill") a.prefill_histories.clear();
    else if (args[i] == "--reps") a.reps = std::stoi(next());
    else if (args[i] == "--budget") a.budget_tokens = std::stoll(next());
    else if (args[i] == "--split") a.split_tokens = std::stoll(next());
    else if (args[i] == "--q-heads") a.q_heads = std::stoi(next());
    else if (args[i] == "--kv-heads") a.kv_heads = std::stoi(next());
    else if (args[i] == "--head-dim") a.head_dim = std::stoi(next());
    else if (args[i] == "--dtype") {
      const std::string& name = next();
      const std::optional<DType> t = parse_dtype(name);
      if (!t) fail(ErrorCode::kInvalidArgument, "kernels: --dtype must be f16, bf16, f32 or q8_0, got '", name, "'");
      a.dtypes = {*t};
    }
    else if (args[i] == "--quick") {
      a.contexts = {4096, 32768}, a.dtypes = {DType::kF16}, a.reps = 3;
      a.prefill_histories = {8192}, a.prefill_chunk = 1024;
    } else fail(ErrorCode::kInvalidArgument, "kernels: unknown argument '", args[i], "'");
  }
  if (a.kv_heads < 1 || a.q_heads < a.kv_heads || a.q_heads % a.kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, "kernels: --q-heads (", a.q_heads, ") must be a positive multiple of --kv-heads (",
         a.kv_heads, ")");
  if (a.prefill_chunk < 1 || a.prefill_reps < 1)
    fail(ErrorCode::kInvalidArgument, "kernels: --prefill-chunk and --prefill-reps must be >= 1");
  for (int64_t h : a.prefill_histories)
    if (h < 0) fail(ErrorCode::kInvalidArgument, "kernels: --prefill-histories must be >= 0, got ", h);
  const int all = tbb::info::default_concurrency();
  std::vector<int> thread_counts{1};
  if (all > 1) thread_counts.push_back(all);
  std::vector<Record> records;
  for (int threads : thread_counts) {
    const double read_gbps = measure_read_gbps(size_t(1) << 30, threads, 5);
    Record r;
    r.set("bench", "kernels").set("kernel", "read_bandwidth").set("threads", threads).set("gbps", read_gbps);
    std::printf("%s\n", r.json().c_str());
    for (DType dtype : a.dtypes)
      for (int64_t context : a.contexts)
        for (Record& rec : run_context(a, context, dtype, threads, read_gbps)) {
          std::printf("%s\n", rec.json().c_str());
          std::fflush(stdout);
          records.push_back(rec);
        }
  }
  std::vector<Record> prefill;
  if (!a.prefill_histories.empty()) {
    const Peaks peaks{measure_fma_gflops(all), measure_bf16_gflops(all), measure_onednn_bf16_gflops(all),
                      measure_amx_bf16_gflops(all)};
    for (const Record& piece : onednn_tile_pieces(all)) std::printf("%s\n", piece.json().c_str());
    for (int64_t history : a.prefill_histories) {
      const size_t first = prefill.size();
      for (cpu::PrefillKernel kernel : cpu::supported_prefill_kernels())
        prefill.push_back(run_prefill_attention(a, history, kernel, peaks));
      // Each path against the f32 one (listed last) at the same history.
      const double f32_ms = std::stod(prefill.back().get("ms"));
      for (size_t i = first; i < prefill.size(); ++i) {
        prefill[i].set("over_f32", f32_ms / std::stod(prefill[i].get("ms")));
        std::printf("%s\n", prefill[i].json().c_str());
      }
      std::fflush(stdout);
    }
  }
  std::printf("\nCPU decode step, one layer: %d q heads, %d kv heads, d=%d, block %d, budget %lld tokens\n",
              a.q_heads, a.kv_heads, a.head_dim, a.block_size, static_cast<long long>(a.budget_tokens));
  print_table(records, {"kernel", "context", "dtype", "threads", "ms", "gbps", "of_bandwidth", "dense_over_sparse",
                        "dense_over_step", "select_share"});
  if (!prefill.empty()) {
    std::printf("\nCPU prefill attention, one layer, one chunk of %lld queries, f16 K/V, %d threads (peaks measured in "
                "this run: FMA, vdpbf16ps, AMX tdpbf16ps, and oneDNN's bf16 matmul)\n",
                static_cast<long long>(a.prefill_chunk), all);
    print_table(prefill, {"path", "engine", "history", "chunk", "ms", "tflops", "of_fma_peak", "of_bf16_peak",
                          "of_onednn_peak", "of_amx_peak", "over_f32"});
  }
  return 0;
}

}  // namespace longctx::bench
