// longctx-bench accuracy, prefill workload: one prefill chunk of `chunk`
// queries at positions [n, n + chunk) after an n-token history, attended
// densely (prefill_attention over everything, causal in the chunk), with
// QUOKA's kept keys (quoka_prefill_attention: sinks + previous chunk + the
// top B_SA history keys), and with the baseline of the same size (sinks +
// the last B_SA + chunk history tokens, i.e. StreamingLLM for prefill).
// "dense" is the f32 kernel: the reference of rel_err and l1. "dense-bf16"
// (on CPUs with AVX512-BF16) is the same attention on the bf16 kernel: the
// error its rounding alone adds. QUOKA and sinks+recent run on the kernel
// prefill_kernel: auto picks (best_prefill_kernel, the "kernel" field).
//
// The history holds 4 questions' needle spans (accuracy.h), none in the last
// two chunks. Chunk rows r with r % 8 == 7 ask question (r / 8) % 4
// (variations of its query, relative noise 0.3); the other rows are
// variations (noise 0.5) of a query that has no needle, as most tokens of a
// chunk attend sinks and recent text. QUOKA keeps the n_q rows least like the
// chunk's mean: the question rows stand out, so their needles should be kept.
//
// Metrics: needle = fraction of the 4 questions' needle tokens the needle
// heads keep; top10 and missed over 16 rows (the 8 question rows and 8 others)
// against fp64 dense probabilities over the history; rel_err and l1 over the
// whole chunk's output; ms = the chunk's attention (QUOKA: with its key
// selection); attended_pct = history tokens kept per kv head / n.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "accuracy.h"
#include "bench_util.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/quoka.h"
#include "longctx/workloads/metrics.h"

namespace longctx::bench::accuracy {
namespace {

struct Sums {
  double needle = 0, top10 = 0, rel_err = 0, l1 = 0, missed = 0, attended = 0;
  std::vector<double> ms;
  int seeds = 0;
};

constexpr int kQuestions = 4;
constexpr int kQuestionEvery = 8;

bool is_question_row(int r) { return r % kQuestionEvery == kQuestionEvery - 1; }

}  // namespace

std::vector<Record> run_prefill(const PrefillOptions& o, int64_t n, const std::vector<double>& budget_pcts) {
  const Shape& s = o.shape;
  const int C = o.chunk;
  const int64_t total = n + C;
  const bool bf16 = cpu::prefill_kernel_unsupported_reason(cpu::PrefillKernel::kBf16).empty();
  const std::vector<std::string> names{"dense", "dense-bf16", "quoka", "quoka-mean", "sinks+recent"};
  const cpu::PrefillKernel production = cpu::best_prefill_kernel();
  auto wanted = [&](const std::string& name) {
    return o.policies.empty() || std::find(o.policies.begin(), o.policies.end(), name) != o.policies.end();
  };
  std::vector<std::vector<Sums>> sums(names.size(), std::vector<Sums>(budget_pcts.size()));
  const size_t row_elems = size_t(s.q_heads) * size_t(s.head_dim);

  for (int seed = 1; seed <= o.seeds; ++seed) {
    double start = now_seconds();
    // Questions 0..3 with one needle span each; question 4 has none (the ordinary rows).
    std::vector<int> spans(kQuestions + 1, 1);
    spans.back() = 0;
    const Workload w = make_workload(s, total, spans, 2 * int64_t(C), uint64_t(seed) + uint64_t(total) * 3);
    const std::vector<float>& plain = w.questions[kQuestions].q;
    std::vector<float> q(size_t(C) * row_elems);
    for (int r = 0; r < C; ++r) {
      const std::vector<float> row =
          is_question_row(r) ? vary_query(w, w.questions[size_t((r / kQuestionEvery) % kQuestions)].q, 0.3,
                                          uint64_t(seed) * 1000003 + uint64_t(r))
                             : vary_query(w, plain, 0.5, uint64_t(seed) * 1000003 + uint64_t(r));
      std::copy(row.begin(), row.end(), q.begin() + std::ptrdiff_t(size_t(r) * row_elems));
    }
    const TensorView qv = make_view(q.data(), DType::kF32, {C, s.q_heads, s.head_dim});

    LongContextConfig config;
    config.max_seq_len = total;
    config.block_size = s.block_size;
    config.initial_len = s.initial_len;
    config.local_windows_len = s.local_len;
    config.kv_type = DType::kF16;
    config.chunk_size = C;
    kvstore::MemoryBudget budget(kvstore::default_dram_budget());
    const kvstore::NumaTopology topology = kvstore::NumaTopology::detect();
    kvstore::KVStore store(kvstore::KVShape{1, s.kv_heads, s.head_dim}, config, budget, topology);
    store.append(0, make_view(w.k.data(), DType::kF32, {total, s.kv_heads, s.head_dim}),
                 make_view(w.v.data(), DType::kF32, {total, s.kv_heads, s.head_dim}));

    std::vector<float> dense(q.size()), out(q.size()), lse(size_t(C) * size_t(s.q_heads));
    const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {C, s.q_heads});
    double t0 = now_seconds();
    cpu::prefill_attention(store, 0, n, qv, 0.f,
                           make_mutable_view(dense.data(), DType::kF32, {C, s.q_heads, s.head_dim}), lv,
                           cpu::PrefillKernel::kF32);
    const double dense_ms = 1e3 * (now_seconds() - t0);

    // fp64 probabilities over the history of the evaluated rows.
    std::vector<int> rows;
    for (int r = 0; r < C && rows.size() < 16; ++r)
      if (is_question_row(r)) rows.push_back(r);
    for (int r = 0, plain_rows = 0; r < C && plain_rows < 8; ++r)
      if (!is_question_row(r)) rows.push_back(r), ++plain_rows;
    std::vector<std::vector<double>> probs;
    for (int r : rows)
      probs.push_back(workloads::dense_probabilities(q.data() + size_t(r) * row_elems, w.k.data(), s.q_heads,
                                                     s.kv_heads, s.head_dim, n));
    std::vector<int64_t> needles;
    for (const Question& question : w.questions)
      needles.insert(needles.end(), question.needle_tokens.begin(), question.needle_tokens.end());
    std::sort(needles.begin(), needles.end());
    std::fprintf(stderr, "accuracy: prefill %lld tokens seed %d: workload and references %.1f s\n",
                 static_cast<long long>(n), seed, now_seconds() - start);
    start = now_seconds();

    auto record = [&](Sums& sum, const cpu::Selection& history, double ms) {
      sum.needle += needle_recall(history, s.needle_heads, needles);
      double top10 = 0, missed = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        top10 += workloads::topk_token_recall(probs[i], s.q_heads, n, history, 10);
        missed += missed_mass(probs[i], s.q_heads, n, history);
      }
      sum.top10 += top10 / double(rows.size());
      sum.missed += missed / double(rows.size());
      sum.rel_err += workloads::relative_l2_error(out.data(), dense.data(), int64_t(out.size()));
      sum.l1 += workloads::l1_loss(out.data(), dense.data(), C * s.q_heads, s.head_dim);
      sum.attended += 100.0 * mean_tokens(history) / double(n);
      sum.ms.push_back(ms);
      ++sum.seeds;
    };
    const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {C, s.q_heads, s.head_dim});
    for (size_t b = 0; b < budget_pcts.size(); ++b) {
      const int64_t b_sa = std::max<int64_t>(1, std::llround(budget_pcts[b] / 100.0 * double(n)));
      for (size_t p = 0; p < names.size(); ++p) {
        const bool all_keys = names[p] == "dense" || names[p] == "dense-bf16";
        if (!wanted(names[p]) || (all_keys && b > 0) || (names[p] == "dense-bf16" && !bf16)) continue;
        cpu::Selection history;
        if (names[p] == "dense") {
          out = dense;
          history.spans.assign(size_t(s.kv_heads), {cpu::TokenSpan{0, n}});
          record(sums[p][b], history, dense_ms);
        } else if (names[p] == "dense-bf16") {
          history.spans.assign(size_t(s.kv_heads), {cpu::TokenSpan{0, n}});
          t0 = now_seconds();
          cpu::prefill_attention(store, 0, n, qv, 0.f, ov, lv, cpu::PrefillKernel::kBf16);
          record(sums[p][b], history, 1e3 * (now_seconds() - t0));
        } else if (names[p] == "sinks+recent") {
          const int64_t sinks = std::min<int64_t>(s.initial_len, n);
          const int64_t recent = std::max(sinks, n - C - b_sa);
          std::vector<cpu::TokenSpan> kept;
          if (sinks > 0) kept.push_back({0, sinks});
          if (recent < n) {
            if (!kept.empty() && kept.back().end == recent) kept.back().end = n;
            else kept.push_back({recent, n});
          }
          history.spans.assign(size_t(s.kv_heads), kept);
          t0 = now_seconds();
          cpu::prefill_attention(store, 0, n, history, qv, 0.f, ov, lv, production);
          record(sums[p][b], history, 1e3 * (now_seconds() - t0));
        } else {
          QuokaConfig qc;
          qc.enabled = true;
          qc.n_q = o.n_q;
          qc.b_sa = int(b_sa);
          qc.b_cp = C;
          qc.query_reduce = names[p] == "quoka" ? Reduce::kMax : Reduce::kMean;
          qc.head_reduce = Reduce::kMean;
          t0 = now_seconds();
          history = policy::quoka_prefill_attention(store, 0, n, qv, qc, s.initial_len, C, 0.f, ov, lv, production);
          record(sums[p][b], history, 1e3 * (now_seconds() - t0));
        }
      }
    }
    std::fprintf(stderr, "accuracy: prefill %lld tokens seed %d: policies %.1f s\n", static_cast<long long>(n), seed,
                 now_seconds() - start);
  }

  std::vector<Record> records;
  for (size_t p = 0; p < names.size(); ++p) {
    for (size_t b = 0; b < budget_pcts.size(); ++b) {
      const Sums& sum = sums[p][b];
      if (sum.seeds == 0) continue;
      const double k = sum.seeds;
      const bool dense = names[p] == "dense" || names[p] == "dense-bf16";
      const cpu::PrefillKernel kernel = names[p] == "dense"        ? cpu::PrefillKernel::kF32
                                        : names[p] == "dense-bf16" ? cpu::PrefillKernel::kBf16
                                                                   : production;
      Record r;
      r.set("bench", "accuracy").set("workload", "prefill").set("policy", names[p]).set("context", n);
      r.set("kernel", cpu::prefill_kernel_name(kernel));
      r.set("chunk", C).set("n_q", o.n_q);
      r.set("budget_pct", dense ? 100.0 : budget_pcts[b]);
      r.set("budget_tokens", dense ? n : std::max<int64_t>(1, std::llround(budget_pcts[b] / 100.0 * double(n))));
      r.set("attended_pct", sig4(sum.attended / k)).set("needle", sig4(sum.needle / k));
      r.set("top10", sig4(sum.top10 / k)).set("rel_err", sig4(sum.rel_err / k)).set("l1", sig4(sum.l1 / k));
      r.set("missed", sig4(sum.missed / k)).set("ms", sig4(median(sum.ms))).set("seeds", sum.seeds);
      records.push_back(r);
    }
  }
  return records;
}

}  // namespace longctx::bench::accuracy
