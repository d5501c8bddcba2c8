// longctx-bench kernels: one decode step of one layer on the CPU engine —
// dense attention, block scoring (of every kv head, and of RazorAttention's
// retrieval heads alone), selection (policy::select_blocks), sparse
// attention, the LSE merge with the GPU part, and the whole sparse step as
// DecodePolicy::decode runs it, in the runtime's default layout (sparse_step,
// and sparse_step_top_p with budget.mode top_p) and with the budget on
// selected blocks alone (sparse_step_budget; see Layout) — over
// contexts from 4K to 1M tokens, with the bytes each kernel must read and the
// achieved GB/s beside the read bandwidth measured in the same run, for each
// KV type, and each type's time over f16's (the types take turns in every
// repetition, so the ratio sees the same machine load). Then
// prefill attention (cpu::prefill_attention, what a CPU-only prefill runs per
// layer): one chunk of --prefill-chunk queries over --prefill-histories tokens
// of history, f16 K/V, in TFLOP/s beside the fp32 FMA and bf16 (vdpbf16ps)
// peaks measured in the same run (FLOPs = 4 * head_dim * q heads * keys seen,
// summed over the chunk's queries: QK^T and PV, causal inside the chunk).
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "hwy/targets.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
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
  std::string target;    // the Highway target to force ("avx2"); once forced, the one the run uses
};

// The Highway targets this CPU runs, best first, and their names in lower case.
std::vector<std::pair<int64_t, std::string>> runnable_targets() {
  std::vector<std::pair<int64_t, std::string>> targets;
  for (const int64_t t : hwy::SupportedAndGeneratedTargets()) {
    std::string name = hwy::TargetName(t);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    targets.emplace_back(t, name);
  }
  return targets;
}

// Forces one Highway target for its lifetime (Highway's test hook), so that an
// AVX-512 machine times the kernels an AVX2 CPU runs. The kernels chosen by
// CPU features beside Highway (AVX512-VNNI and AVX-VNNI q8_0, AMX) follow
// the CPU, as they would on it within the forced target's code.
class ForcedTarget {
 public:
  explicit ForcedTarget(const std::string& name) {
    if (name.empty()) return;
    std::string names;
    for (const auto& [target, target_name] : runnable_targets()) {
      if (target_name == name) {
        hwy::SetSupportedTargetsForTest(target);
        forced_ = true;
        return;
      }
      names += (names.empty() ? "" : ", ") + target_name;
    }
    fail(ErrorCode::kInvalidArgument, "kernels: --target '", name, "' is not a Highway target this CPU runs (",
         names, ")");
  }
  ~ForcedTarget() {
    if (forced_) hwy::SetSupportedTargetsForTest(0);
  }
  ForcedTarget(const ForcedTarget&) = delete;
  ForcedTarget& operator=(const ForcedTarget&) = delete;

 private:
  bool forced_ = false;
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

// The layouts the decode rows run on.
//   kBudgetOnly  the budget spent on selected blocks alone: no sinks, no local
//                window, one block set per kv head (SEPARATE). The layout of
//                the issue that set the sparse step's targets ("at 128K with
//                a 4096-token budget the whole sparse step"), kept so that
//                those numbers stay comparable; the kernel rows (dense, score,
//                select, sparse) and sparse_step_budget run on it.
//   kDefault     the runtime's defaults (configs/default.yaml: 128 sinks, a
//                4096-token local window, SHARED), with --budget tokens of
//                selected blocks (4096 = the default second_select_num, 32),
//                attended as longctx-chat's CPU path does (include_local):
//                sparse_step runs on it.
enum class Layout { kBudgetOnly, kDefault };

const char* layout_name(Layout layout) { return layout == Layout::kDefault ? "default" : "budget_only"; }

LongContextConfig decode_config(const KernelsArgs& a, int64_t context, DType kv_type, Layout layout) {
  const int64_t blocks = cpu::blocks_for_token_budget(a.budget_tokens, a.block_size);
  const LongContextConfig defaults;
  // The store holds `context` tokens; the defaults' sinks and window need at least their own length of capacity.
  const int64_t capacity =
      layout == Layout::kDefault
          ? std::max(context, defaults.initial_len + defaults.local_windows_len + blocks * a.block_size)
          : context;
  std::vector<std::string> overrides{
      str_cat("max_seq_len=", capacity), str_cat("block_size=", a.block_size),
      str_cat("kv_type=", dtype_name(kv_type)),
      "dense_layer_num=0",  // layer 0 selects
      str_cat("second_select_num=", layout == Layout::kDefault ? blocks : std::min(blocks, context / a.block_size))};
  if (layout == Layout::kBudgetOnly) {
    for (const char* key : {"initial_len=0", "local_windows_len=0", "head_select_mode=SEPARATE"})
      overrides.emplace_back(key);
  }
  return parse_config("", "<longctx-bench kernels>", overrides);
}

// The decode kernels timed, in the order they run per repetition (sparse
// attends over the selection of the select run before it).
enum class DecodeKernel { kDense, kScore, kScoreRetrieval, kSelect, kSparse, kStep, kStepTopP };
constexpr size_t kNumDecodeKernels = size_t(DecodeKernel::kStepTopP) + 1;

// One kv type's layer 0 at one context in one layout, random K/V, and what its decode kernels read and write.
struct DecodeCase {
  DecodeCase(const KernelsArgs& a, int64_t context, DType kv_type, Layout store_layout)
      : dtype(kv_type),
        layout(store_layout),
        config(decode_config(a, context, kv_type, store_layout)),
        topology(kvstore::NumaTopology::detect()),
        budget(kvstore::default_dram_budget()),
        store(kvstore::KVShape{1, a.kv_heads, a.head_dim}, config, budget, topology),
        select(policy::SelectSpec::from_config(config, true)),
        q(size_t(a.q_heads) * a.head_dim),
        out(q.size()),
        lse(size_t(a.q_heads)) {
    fill_store(store, context, a.kv_heads, a.head_dim);
    // RazorAttention's retrieval heads are some 15% of the heads (ALGORITHMS.md:
    // top 14% by induction and 1% by echo): the first ceil(15% of them) here.
    retrieval_heads.assign(size_t(a.kv_heads), 0);
    std::fill_n(retrieval_heads.begin(), (15 * a.kv_heads + 99) / 100, uint8_t{1});
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
    const kvstore::Partition part = store.partition(0);
    n_blocks = part.end_context_block - part.first_context_block;
    scores.resize(size_t(a.kv_heads) * size_t(n_blocks));
    attn.split_tokens = a.split_tokens;
    // The production step: what longctx-chat runs for a layer that re-selects
    // (0: 1/sqrt(head_dim), as the kernels). It splits its attention as the
    // runtime does (its default piece size), whatever --split says.
    decode_policy = std::make_unique<policy::DecodePolicy>(config, store, 0.f);
    // The same step with budget.mode top_p (its default p), at most the
    // budget's blocks: on the default layout, whose sinks and window its
    // exact fixed part covers.
    if (layout == Layout::kDefault) {
      LongContextConfig top_p = config;
      top_p.budget.mode = BudgetConfig::Mode::kTopP;
      top_p.budget.max_blocks = config.second_select_num;
      top_p_policy = std::make_unique<policy::DecodePolicy>(top_p, store, 0.f);
    }
  }

  void run(DecodeKernel kernel, const KernelsArgs& a) {
    const TensorView qv = make_view(q.data(), DType::kF32, {a.q_heads, a.head_dim});
    const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {a.q_heads, a.head_dim});
    const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {a.q_heads});
    const MutableTensorView sv = make_mutable_view(scores.data(), DType::kF32, {a.kv_heads, n_blocks});
    switch (kernel) {
      case DecodeKernel::kDense: return cpu::dense_decode_attention(store, 0, qv, attn, ov, lv);
      case DecodeKernel::kScore: return cpu::score_blocks(store, 0, qv, select.score, sv);
      case DecodeKernel::kScoreRetrieval:
        return cpu::score_blocks(store, 0, qv, select.score, sv, {}, retrieval_heads);
      case DecodeKernel::kSelect: selection = policy::select_blocks(store, 0, qv, select); return;
      case DecodeKernel::kSparse: return cpu::decode_attention(store, 0, qv, selection, attn, ov, lv);
      case DecodeKernel::kStep:
        decode_policy->decode(0, token_index++, qv, /*include_local=*/true, ov, lv);
        step_select_seconds.push_back(decode_policy->last_stats().select_seconds);
        return;
      case DecodeKernel::kStepTopP:
        return top_p_policy->decode(0, token_index++, qv, /*include_local=*/true, ov, lv);
    }
  }

  // The kernels timed on this layout (kDefault: the whole step alone).
  std::vector<DecodeKernel> kernels() const {
    if (layout == Layout::kDefault) return {DecodeKernel::kStep, DecodeKernel::kStepTopP};
    return {DecodeKernel::kDense, DecodeKernel::kScore, DecodeKernel::kScoreRetrieval, DecodeKernel::kSelect,
            DecodeKernel::kSparse, DecodeKernel::kStep};
  }

  DType dtype;
  Layout layout;
  LongContextConfig config;
  kvstore::NumaTopology topology;  // the store keeps references to these two
  kvstore::MemoryBudget budget;
  kvstore::KVStore store;
  policy::SelectSpec select;
  std::unique_ptr<policy::DecodePolicy> decode_policy;
  std::unique_ptr<policy::DecodePolicy> top_p_policy;  // kDefault only
  cpu::DecodeAttentionParams attn;
  cpu::Selection selection;
  std::vector<float> q, out, lse, scores;
  std::vector<uint8_t> retrieval_heads;  // [kv_heads], 1 = scored by score_retrieval
  int64_t n_blocks = 0;
  int64_t token_index = 0;
  std::vector<double> seconds[kNumDecodeKernels];  // per kernel, one per repetition
  std::vector<double> step_select_seconds;         // the step's own scoring and choosing, one per repetition
};

// Runs every kernel of the cases `reps` times. A decode step of one layer
// finds its KV and representatives cold: the other layers ran since
// (evict_caches before every timed run). Every repetition runs each kernel
// once per kv type, one type after the other, so the types' times of a kernel
// are taken seconds apart, under the same load of this shared machine: their
// ratio (over_f16) is then far steadier than times taken minutes apart.
void time_cases(const KernelsArgs& a, std::vector<std::unique_ptr<DecodeCase>>& cases) {
  for (int r = 0; r < a.reps; ++r)
    for (DecodeKernel kernel : cases.front()->kernels())
      for (auto& c : cases) {
        evict_caches();
        c->seconds[size_t(kernel)].push_back(time_runs(1, [&] { c->run(kernel, a); })[0]);
      }
}

int64_t tokens_of(const cpu::Selection& selection, int kv_heads) {
  int64_t tokens = 0;
  for (int h = 0; h < kv_heads; ++h) tokens += selection.tokens(h);
  return tokens;
}

// The decode records of one context for every kv type of `a`: the kernel rows
// and sparse_step_budget on the budget-only layout, then sparse_step on the
// default one. The layouts' stores are built one after the other, so that a
// 1M context needs one layout's memory at a time.
std::vector<Record> run_context(const KernelsArgs& a, int64_t context, int threads, double read_gbps) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  std::vector<std::vector<Record>> by_type(a.dtypes.size());
  auto record = [&](const DecodeCase& c, const char* kernel, double ms_of, double bytes) -> Record& {
    Record r;
    r.set("bench", "kernels").set("kernel", kernel).set("layout", layout_name(c.layout));
    r.set("context", context).set("budget", a.budget_tokens);
    r.set("dtype", dtype_name(c.dtype)).set("threads", threads).set("ms", ms_of).set("bytes", int64_t(bytes));
    r.set("gbps", bytes / (ms_of * 1e-3) / 1e9).set("read_gbps", read_gbps);
    r.set("target", a.target);
    r.set("of_bandwidth", bytes / (ms_of * 1e-3) / 1e9 / read_gbps);
    auto& rows = by_type[size_t(std::find(a.dtypes.begin(), a.dtypes.end(), c.dtype) - a.dtypes.begin())];
    rows.push_back(r);
    return rows.back();
  };
  const auto ms = [](const DecodeCase& c, DecodeKernel kernel) { return 1e3 * median(c.seconds[size_t(kernel)]); };
  // Bytes of one token's K or V vector of one kv head (q8_0: codes + scales).
  const auto vector_bytes = [&](const DecodeCase& c) { return double(kvstore::kv_vector_bytes(c.dtype, a.head_dim)); };
  // Scoring streams every context block's representative record of every kv
  // head; records are padded to 64 bytes and packed, so it reads whole
  // records (q8_0 QUEST: 320 B, of which 272 are the two key slots; f16: 512, no padding).
  const auto score_bytes = [&](const DecodeCase& c, int64_t heads) {
    return double(c.n_blocks) * double(heads) * double(c.store.layout().record_bytes);
  };
  // The whole step's bytes: its scoring and the K and V of what the policy attended.
  const auto step_bytes = [&](const DecodeCase& c) {
    const double attended = double(tokens_of(c.decode_policy->last_selection(), a.kv_heads));
    return score_bytes(c, a.kv_heads) + attended * 2.0 * vector_bytes(c);
  };
  std::vector<double> dense_ms(a.dtypes.size());

  {
    std::vector<std::unique_ptr<DecodeCase>> cases;
    for (DType dtype : a.dtypes) cases.push_back(std::make_unique<DecodeCase>(a, context, dtype, Layout::kBudgetOnly));
    time_cases(a, cases);
    for (size_t t = 0; t < cases.size(); ++t) {
      DecodeCase& c = *cases[t];
      dense_ms[t] = ms(c, DecodeKernel::kDense);
      const double select_ms = ms(c, DecodeKernel::kSelect), sparse_ms = ms(c, DecodeKernel::kSparse);
      const double step_ms = ms(c, DecodeKernel::kStep);
      // The LSE merge of two partial results (CPU part + GPU window), as decode
      // runs it: on results still in cache, so timed hot over many calls.
      std::vector<float>& out = c.out;
      std::vector<float>& lse = c.lse;
      std::vector<float> out_b(out), lse_b(lse);
      constexpr int kMerges = 1000;
      const double merge_ms = 1e3 / kMerges * median(time_runs(a.reps, [&] {
        for (int i = 0; i < kMerges; ++i)
          cpu::merge_attention(out.data(), lse.data(), out_b.data(), lse_b.data(), out.data(), lse.data(),
                               a.q_heads, a.head_dim);
      }));
      const double sparse_bytes = double(tokens_of(c.selection, a.kv_heads)) * 2.0 * vector_bytes(c);
      record(c, "dense", dense_ms[t], 2.0 * a.kv_heads * vector_bytes(c) * double(context))
          .set("split", a.split_tokens);
      record(c, "score", ms(c, DecodeKernel::kScore), score_bytes(c, a.kv_heads));
      // The same scoring of the retrieval heads alone (score_blocks' heads), as RazorAttention selects.
      const int64_t n_retrieval = std::count(c.retrieval_heads.begin(), c.retrieval_heads.end(), uint8_t{1});
      record(c, "score_retrieval", ms(c, DecodeKernel::kScoreRetrieval), score_bytes(c, n_retrieval))
          .set("scored_heads", n_retrieval)
          .set("over_score", ms(c, DecodeKernel::kScoreRetrieval) / ms(c, DecodeKernel::kScore));
      record(c, "select", select_ms, score_bytes(c, a.kv_heads));  // select = score + top-k + spans
      record(c, "sparse", sparse_ms, sparse_bytes).set("split", a.split_tokens);
      // Two parts read, one written.
      record(c, "merge", merge_ms, 3.0 * double(out.size() + lse.size()) * sizeof(float));
      // sparse_step_budget: DecodePolicy::decode on this layout, scoring +
      // selection + attention as they run in a model (select + sparse above
      // are its parts, timed apart); select_share = select / the whole step.
      Record& step = record(c, "sparse_step_budget", step_ms, step_bytes(c)).set("split", int64_t{0});
      step.set("dense_over_sparse", dense_ms[t] / sparse_ms);  // attention kernels over the same cache
      step.set("dense_over_step", dense_ms[t] / step_ms);      // the whole decode step
      step.set("select_share", select_ms / step_ms);
    }
  }
  {
    std::vector<std::unique_ptr<DecodeCase>> cases;
    for (DType dtype : a.dtypes) cases.push_back(std::make_unique<DecodeCase>(a, context, dtype, Layout::kDefault));
    time_cases(a, cases);
    for (size_t t = 0; t < cases.size(); ++t) {
      DecodeCase& c = *cases[t];
      const double step_ms = ms(c, DecodeKernel::kStep);
      // sparse_step: the step as the runtime's defaults run it. Its
      // select_share is the step's own scoring and choosing over the step
      // (DecodePolicy::Stats), medians over the repetitions.
      Record& step = record(c, "sparse_step", step_ms, step_bytes(c)).set("split", int64_t{0});
      step.set("attended_tokens", tokens_of(c.decode_policy->last_selection(), a.kv_heads));
      step.set("dense_over_step", dense_ms[t] / step_ms);  // dense attention (budget-only store) over this step
      step.set("select_share", 1e3 * median(c.step_select_seconds) / step_ms);
      // sparse_step_top_p: the same step choosing by estimated mass; its
      // bytes also count the fixed part's keys, which it reads once more.
      const double top_p_ms = ms(c, DecodeKernel::kStepTopP);
      const int64_t top_p_tokens = tokens_of(c.top_p_policy->last_selection(), a.kv_heads);
      const kvstore::Partition part = c.store.partition(0);
      const double fixed_tokens =
          double(part.ranked_begin(a.block_size) + part.n_tokens - part.ranked_end(a.block_size)) * a.kv_heads;
      const double top_p_bytes =
          score_bytes(c, a.kv_heads) + (double(top_p_tokens) * 2.0 + fixed_tokens) * vector_bytes(c);
      Record& top_p = record(c, "sparse_step_top_p", top_p_ms, top_p_bytes);
      top_p.set("split", int64_t{0}).set("attended_tokens", top_p_tokens);
      top_p.set("over_step", top_p_ms / step_ms);
    }
  }
  std::vector<Record> records;
  for (const std::vector<Record>& rows : by_type) records.insert(records.end(), rows.begin(), rows.end());
// Each kernel's time over f16's in the same repetitions, where f16 ran.
  const auto f16 = std::find(a.dtypes.begin(), a.dtypes.end(), DType::kF16);
  if (f16 != a.dtypes.end()) {
    const std::vector<Record>& f16_rows = by_type[size_t(f16 - a.dtypes.begin())];
    const size_t per_type = f16_rows.size();  // every type has the same rows, in the same order
    for (size_t i = 0; i < records.size(); ++i)
      records[i].set("over_f16", std::stod(records[i].get("ms")) / std::stod(f16_rows[i % per_type].get("ms")));
  }
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
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, "kernels: ", args[i], " needs a value");
      return args[++i];
    };
    // The option's value as an integer in [min, kMaxInt], named with the option.
    auto int_value = [&](int64_t min) {
      const std::string flag = "kernels: " + args[i];
      return parse_int_flag(flag, next(), min, kMaxInt);
    };
    if (args[i] == "--contexts") a.contexts = parse_list(next(), "kernels: --contexts", 1);
    else if (args[i] == "--prefill-histories")
      a.prefill_histories = parse_list(next(), "kernels: --prefill-histories", 0);
    else if (args[i] == "--prefill-chunk") a.prefill_chunk = int_value(1);
    else if (args[i] == "--prefill-reps") a.prefill_reps = int(int_value(1));
    else if (args[i] == "--no-prefill") a.prefill_histories.clear();
    else if (args[i] == "--reps") a.reps = int(int_value(1));
    else if (args[i] == "--budget") a.budget_tokens = int_value(0);
    else if (args[i] == "--split") a.split_tokens = int_value(0);
    else if (args[i] == "--q-heads") a.q_heads = int(int_value(1));
    else if (args[i] == "--kv-heads") a.kv_heads = int(int_value(1));
    else if (args[i] == "--head-dim") a.head_dim = int(int_value(1));
    else if (args[i] == "--target") a.target = next();
    else if (args[i] == "--dtype") a.dtypes = parse_kv_types(next(), "kernels: --dtype");
    else if (args[i] == "--quick") {
      a.contexts = {4096, 32768}, a.dtypes = {DType::kF16}, a.reps = 3;
      a.prefill_histories = {8192}, a.prefill_chunk = 1024;
    } else fail(ErrorCode::kInvalidArgument, "kernels: unknown argument '", args[i], "'");
  }
  if (a.q_heads % a.kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, "kernels: --q-heads (", a.q_heads, ") must be a positive multiple of --kv-heads (",
         a.kv_heads, ")");
  const ForcedTarget forced(a.target);
  a.target = runnable_targets().front().second;  // the forced one, or the best this CPU runs
  const int all = tbb::info::default_concurrency();
  std::vector<int> thread_counts{1};
  if (all > 1) thread_counts.push_back(all);
  std::vector<Record> records;
  for (int threads : thread_counts) {
    const double read_gbps = measure_read_gbps(size_t(1) << 30, threads, 5);
    Record r;
    r.set("bench", "kernels").set("kernel", "read_bandwidth").set("threads", threads).set("gbps", read_gbps);
    std::printf("%s\n", r.json().c_str());
    for (int64_t context : a.contexts)
      for (Record& rec : run_context(a, context, threads, read_gbps)) {
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
  std::printf("\nCPU decode step, one layer: %d q heads, %d kv heads, d=%d, block %d, %lld tokens of selected blocks; "
              "layout budget_only: no sinks, no local window, SEPARATE; default: the runtime's defaults, 128 sinks + "
              "the blocks + a 4096-token local window, SHARED\n",
              a.q_heads, a.kv_heads, a.head_dim, a.block_size, static_cast<long long>(a.budget_tokens));
  print_table(records, {"kernel", "layout", "context", "dtype", "threads", "ms", "over_f16", "gbps", "of_bandwidth",
                        "dense_over_sparse", "dense_over_step", "select_share"});
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
