// longctx-bench accuracy: every selection policy x token budget x context on
// synthetic workloads, against dense attention.
//
//   longctx-bench accuracy [--contexts 16384,131072] [--budgets 0.5,1,2,5,10]
//       [--workloads needle,multiquery,prefill] [--policies quest,h2o,...]
//       [--seeds 1] [--needle-heads 0] [--rope-theta 5e6] [--chunk 64] [--quick]
//
// Shape: one layer, 8 query heads, 2 kv heads (GQA 4), head_dim 128, f16
// store, block 16 (Quest's page size), 16 initial tokens (the sinks' block),
// 32-token local window, RoPE theta 5e6 (accuracy.h says why). Needles live
// in kv head 0 only (--needle-heads): it is the "retrieval head"; kv head 1
// attends sinks, recent tokens and noise. That is what gives Ada-KV and
// RazorAttention something to exploit, and it tells RazorAttention its
// retrieval heads.
//
// Policies (DecodePolicy from a LongContextConfig, except streaming):
//   dense        policy: dense (the reference output; ms = dense decode)
//   quest        QUEST, SHARED
//   quest-sep    QUEST, SEPARATE, uniform budgets   } Ada-KV vs uniform at
//   adakv-sep    QUEST, SEPARATE, adaptive, alpha 0.2 } the same total
//   topp95-sep   QUEST, SEPARATE, budget.mode top_p, p 0.95 (topp50-sep: 0.5), at
//                most the budget's blocks per kv head: fewer where the mass allows
//   quest-tail   quest, with the unselected blocks estimated from their mean key
//                and value (tail: estimate; topp95-tail: topp95-sep's selection)
//   quest-spec   quest with speculate (cosine 0.9): a step reuses the last selection
//                while the query stays close to the one that made it
//   quest-rerank quest's selection with 4x the blocks (quest-rerank16: 16x), then
//                their best tokens by exact scores of the stored keys, the same
//                token budget (rerank: tokens)
//   quest+pre    QUEST + SnapKV preselection of 2x second_select_num blocks
//   dynamic+pre  DYNAMIC (4 reps, max) + the same preselection (its votes pick the reps)
//   snapkv       preselection of second_select_num blocks, used as is (SnapKV)
//   infllm-mean  MEAN representatives; infllm-fix: FIX, 4 per block
//   razor        QUEST for the needle heads, sinks + buffer + compensation for the others
//   streaming    StreamingLLM (streaming_selection + decode_attention)
//   h2o          policy: h2o
// Decode steps append no token: every question runs over the prompt's cache
// (one store per representative type serves all policies).
//
// Budget: b% of the context's tokens, per kv head, in total. Block selection
// attends initial + local + second_select_num blocks with second_select_num =
// floor((budget - initial - local) / block); StreamingLLM the 16 sinks + the
// last (budget - 16) tokens; H2O h2o.budget_tokens = budget (half heavy
// hitters, half recent); RazorAttention's non-retrieval heads sinks + a buffer
// of budget - 16 (+ the compensation token). attended_pct reports what each
// attended.
//
// Workloads (accuracy.h builds the questions):
//   needle      one question whose 4 needle spans (4 tokens, 7 sigma) hide in
//               random blocks; the prompt's last 32 queries (SnapKV votes,
//               H2O's first scores) are variations of the question. Five
//               decode steps ask it (metrics: the first; time: median).
//   multiquery  4 questions asked one after the other (decode steps 0..3),
//               each aimed at its own needle span; the prompt ends with
//               question 0. A policy that fixes its tokens at the end of the
//               prompt (H2O, SnapKV as is, preselection) answers question 0
//               and misses the later ones (RazorAttention, Figure 2). Needle
//               recall per question index: q0..q3.
//   prefill     QUOKA: a prefill chunk after the history (accuracy_prefill.cpp).
//
// Metrics per question (averaged over seeds): needle = fraction of the
// question's needle tokens the needle heads attend; block = metrics.h
// block_recall of the needle blocks in the needle heads; top10 (top100) = top-10 (top-100)
// token recall; rel_err = relative L2 error of the output vs dense; l1 =
// Ada-KV's L1 loss (mean over query heads of ||o - o_dense||_1); missed = the
// dense attention mass the selection leaves out (mean over query heads;
// RazorAttention's compensation token not counted); ms = one decode step of
// the layer (DecodePolicy::decode: scoring, selection, attention), median;
// attend_ms = the attention alone over the step's selection (what a step
// would cost with its selection hidden), median. Both start with the caches
// evicted, as a layer's step finds them after the other layers ran.
#include <tbb/info.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accuracy.h"
#include "bench_util.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/cpu/attention.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/razor.h"
#include "longctx/policy/razor.h"
#include "longctx/policy/streaming.h"
#include "longctx/policy/streaming.h"
#include "longctx/workloads/metrics.h"

namespace longctx::bench {
namespace {

using accuracy::Question;
using accuracy::Shape;
using accuracy::Workload;

struct AccuracyArgs {
  std::vector<int64_t> contexts{16384, 131072};
  std::vector<double> budgets{0.5, 1, 2, 5, 10};
  std::vector<std::string> workloads{"needle", "multiquery", "prefill"};
  std::vector<std::string> policies;  // empty = all
  int seeds = 1;
  int questions = 4;   // multiquery
  int needles = 4;     // needle workload: spans of its one question
  int steps = 5;       // needle workload: decode steps timed
  Shape shape;
};

struct Budget {
  double pct = 0;
  int64_t tokens = 0;  // per kv head, in total
  int64_t blocks = 0;  // second_select_num
};

// A policy as the harness configures it for a budget.
struct Policy {
  const char* name;
  RepresentativeType rep;
  bool streaming = false;  // attended with streaming_selection (its window follows the budget, the store's cannot)
  bool razor = false;      // retrieval heads = the workload's needle heads
  std::function<void(LongContextConfig&, const Budget&)> tune;
  bool tail = false;  // tail: estimate (its store keeps the tail sums)
};

using RT = RepresentativeType;

const std::vector<Policy>& all_policies() {
  static const std::vector<Policy> list = [] {
    auto blocks = [](LongContextConfig& c, const Budget& b) { c.second_select_num = int(b.blocks); };
    auto preselect = [](LongContextConfig& c, int64_t count) {
      c.preselect_block = true;
      c.preselect_block_count = int(std::max<int64_t>(1, count));
    };
    std::vector<Policy> p;
    p.push_back({"dense", RT::kQuest, false, false, [](LongContextConfig& c, const Budget&) {
                   c.policy = SelectionPolicy::kDense;
                 }});
    p.push_back({"quest", RT::kQuest, false, false, blocks});
    p.push_back({"quest-sep", RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   c.head_select_mode = HeadSelectMode::kSeparate;
                 }});
    p.push_back({"adakv-sep", RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   c.head_select_mode = HeadSelectMode::kSeparate;
                   c.budget.policy = BudgetConfig::Policy::kAdaptive;
                   c.budget.alpha = 0.2;
                 }});
    // top_p: each kv head the fewest blocks reaching p of its estimated mass,
    // never more than the budget's blocks (attended_pct says how many fewer).
    for (const auto& [name, p_mass] : {std::pair{"topp95-sep", 0.95}, std::pair{"topp50-sep", 0.50}}) {
      p.push_back({name, RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                     blocks(c, b);
                     c.head_select_mode = HeadSelectMode::kSeparate;
                     c.budget.mode = BudgetConfig::Mode::kTopP;
                     c.budget.p = p_mass;
                     c.budget.min_blocks = 1;
                     c.budget.max_blocks = std::max<int64_t>(1, b.blocks);
                   }});
    }
    // The unselected blocks estimated from their means (tail: estimate), on
    // quest's and topp95-sep's selections.
    p.push_back({"quest-tail", RT::kQuest, false, false, blocks, true});
    p.push_back({"topp95-tail", RT::kQuest, false, false,
                 [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   c.head_select_mode = HeadSelectMode::kSeparate;
                   c.budget.mode = BudgetConfig::Mode::kTopP;
                   c.budget.p = 0.95;
                   c.budget.min_blocks = 1;
                   c.budget.max_blocks = std::max<int64_t>(1, b.blocks);
                 },
                 true});
    // Speculative selection: quest, reusing a layer's selection while the query's cosine stays >= 0.9.
    p.push_back({"quest-spec", RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   c.speculate = true;
                   c.speculate_cosine = 0.9;
                 }});
    // Token rerank: 4x (16x) the blocks as candidates, their best tokens kept (the same token budget).
    for (const auto& [name, factor] : {std::pair{"quest-rerank", 4}, std::pair{"quest-rerank16", 16}}) {
      p.push_back({name, RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                     blocks(c, b);
                     c.rerank = RerankMode::kTokens;
                     c.rerank_candidates = factor;
                   }});
    }
    p.push_back({"quest+pre", RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   preselect(c, 2 * b.blocks);
                 }});
    p.push_back({"dynamic+pre", RT::kDynamic, false, false, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   preselect(c, 2 * b.blocks);
                 }});
    p.push_back({"snapkv", RT::kQuest, false, false, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   preselect(c, b.blocks);  // second_select_num >= count: the preselected set as is
                 }});
    p.push_back({"infllm-mean", RT::kMean, false, false, blocks});
    p.push_back({"infllm-fix", RT::kFix, false, false, blocks});
    p.push_back({"razor", RT::kQuest, false, true, [=](LongContextConfig& c, const Budget& b) {
                   blocks(c, b);
                   c.razor.sinks = c.initial_len;
                   c.razor.buffer_min = int(b.tokens - c.initial_len);
                   c.razor.buffer_ratio = INT_MAX;  // N / C = 0: the buffer is the budget's
                 }});
    p.push_back({"streaming", RT::kQuest, true, false, [](LongContextConfig& c, const Budget&) {
                   c.policy = SelectionPolicy::kStreaming;
                 }});
    p.push_back({"h2o", RT::kQuest, false, false, [](LongContextConfig& c, const Budget& b) {
                   c.policy = SelectionPolicy::kH2O;
                   c.h2o.budget_tokens = int(b.tokens);
                   c.h2o.heavy_ratio = 0.5;
                 }});
    return p;
  }();
  return list;
}

int representative_num(RT rep) {
  switch (rep) {
    case RT::kMax:
    case RT::kMean:
      return 1;
    case RT::kQuest:
      return 2;
    case RT::kFix:
    case RT::kDynamic:
      return 4;
  }
  return 1;
}

LongContextConfig base_config(const Shape& s, int64_t n_tokens, RT rep) {
  LongContextConfig c;
  c.max_seq_len = n_tokens;
  c.block_size = s.block_size;
  c.initial_len = s.initial_len;
  c.local_windows_len = s.local_len;
  c.kv_type = s.kv_type;
  c.representative_type = rep;
  c.representative_num = representative_num(rep);
  c.dense_layer_num = 0;  // the one layer selects
  c.second_select_num = 0;
  c.preselect.window = s.window;
  return c;
}

// One store per representative type (and tail mode), filled with the workload. Decode steps
// append nothing (the questions run over the prompt's cache), so a store
// serves every policy; a DYNAMIC store is refilled for each use because
// on_prefill_end adds the SnapKV votes to its importance.
class Stores {
 public:
  explicit Stores(const Workload& w)
      : w_(w), budget_(kvstore::default_dram_budget()), topology_(kvstore::NumaTopology::detect()) {}

  // The store of representative type `rep` in the workload's kv_type, or
  // (reference) a QUEST store in f16, what the dense references attend.
  kvstore::KVStore& get(RT rep, bool reference = false, bool tail = false) {
    auto& slot = reference ? reference_ : stores_[2 * int(rep) + int(tail)];
    if (slot && rep != RT::kDynamic) return *slot;
    if (!slot) {
      const kvstore::KVShape shape{1, w_.shape.kv_heads, w_.shape.head_dim};
      LongContextConfig config = base_config(w_.shape, w_.n_tokens, rep);
      if (reference) config.kv_type = DType::kF16;
      if (tail) config.tail = TailMode::kEstimate;
      slot = std::make_unique<kvstore::KVStore>(shape, config, budget_, topology_);
    }
    slot->clear();
    const Shape& s = w_.shape;
    slot->append(0, make_view(w_.k.data(), DType::kF32, {w_.n_tokens, s.kv_heads, s.head_dim}),
                 make_view(w_.v.data(), DType::kF32, {w_.n_tokens, s.kv_heads, s.head_dim}));
    return *slot;
  }

 private:
  const Workload& w_;
  kvstore::MemoryBudget budget_;
  kvstore::NumaTopology topology_;
  std::map<int, std::unique_ptr<kvstore::KVStore>> stores_;
  std::unique_ptr<kvstore::KVStore> reference_;
};

// Dense references of one question.
struct Reference {
  std::vector<double> probs;  // [q_heads][n_tokens], fp64
  std::vector<float> out;     // [q_heads][head_dim], dense_decode_attention on the store
};

struct QuestionMetrics {
  double needle = 0, block = 0, top10 = 0, top100 = 0, rel_err = 0, l1 = 0, missed = 0, attended = 0;
  void add(const QuestionMetrics& o) {
    needle += o.needle, block += o.block, top10 += o.top10, top100 += o.top100, rel_err += o.rel_err, l1 += o.l1;
    missed += o.missed, attended += o.attended;
  }
};

QuestionMetrics measure(const Workload& w, const Question& question, const Reference& ref,
                        const cpu::Selection& selection, const std::vector<float>& out) {
  const Shape& s = w.shape;
  QuestionMetrics m;
  m.needle = accuracy::needle_recall(selection, s.needle_heads, question.needle_tokens);
  m.block = workloads::block_recall(accuracy::heads_only(selection, s.needle_heads), question.needle_blocks,
                                    s.block_size, w.n_tokens);
  m.top10 = workloads::topk_token_recall(ref.probs, s.q_heads, w.n_tokens, selection, 10);
  m.top100 = workloads::topk_token_recall(ref.probs, s.q_heads, w.n_tokens, selection, 100);
  m.rel_err = workloads::relative_l2_error(out.data(), ref.out.data(), int64_t(out.size()));
  m.l1 = workloads::l1_loss(out.data(), ref.out.data(), s.q_heads, s.head_dim);
  m.missed = accuracy::missed_mass(ref.probs, s.q_heads, w.n_tokens, selection);
  m.attended = 100.0 * accuracy::mean_tokens(selection) / double(w.n_tokens);
  return m;
}

// Results of one (policy, budget) summed over seeds.
struct Accum {
  std::vector<QuestionMetrics> per_question;
  std::vector<double> ms, attend_ms, prefill_end_ms;
  int seeds = 0;
};

// Runs one policy at one budget on a workload: decode steps ask `asked`
// (question indices, one per step), each measured against its reference.
void run_policy(const Policy& policy, const Budget& budget, const Workload& w, Stores& stores,
                const std::vector<Reference>& refs, const std::vector<int>& asked, Accum& acc) {
  const Shape& s = w.shape;
  LongContextConfig config = base_config(s, w.n_tokens, policy.rep);
  policy.tune(config, budget);
  if (policy.tail) config.tail = TailMode::kEstimate;
  kvstore::KVStore& store = stores.get(policy.rep, /*reference=*/false, policy.tail);
  std::vector<float> out(size_t(s.q_heads) * size_t(s.head_dim)), lse(size_t(s.q_heads));
  const MutableTensorView ov = make_mutable_view(out.data(), DType::kF32, {s.q_heads, s.head_dim});
  const MutableTensorView lv = make_mutable_view(lse.data(), DType::kF32, {s.q_heads});

  std::unique_ptr<policy::DecodePolicy> decode;
  double prefill_end_ms = 0;
  if (!policy.streaming) {
    policy::RetrievalHeads heads;
    if (policy.razor) {
      heads = policy::RetrievalHeads(1, s.kv_heads);
      for (int kv : s.needle_heads) heads.set(0, kv, true);
    }
    // Scale 0 = 1/sqrt(head_dim), as the references here (dense_probabilities, dense_decode_attention).
    decode = std::make_unique<policy::DecodePolicy>(config, store, /*attn_scale=*/0.f, heads);
    const double start = now_seconds();
    decode->on_prefill_end(0, make_view(w.window_q.data(), DType::kF32, {s.window, s.q_heads, s.head_dim}));
    prefill_end_ms = 1e3 * (now_seconds() - start);
  }

  if (acc.per_question.empty()) acc.per_question.resize(asked.size());
  for (size_t step = 0; step < asked.size(); ++step) {
    const Question& question = w.questions[size_t(asked[step])];
    const TensorView qv = make_view(question.q.data(), DType::kF32, {s.q_heads, s.head_dim});
    cpu::Selection selection;
    evict_caches();
    const double start = now_seconds();
    if (decode) {
      decode->decode(0, int64_t(step), qv, true, ov, lv);
      acc.ms.push_back(1e3 * (now_seconds() - start));
      selection = decode->last_selection();
    } else {
      selection = policy::streaming_selection(w.n_tokens, s.initial_len, budget.tokens - s.initial_len, s.kv_heads);
      cpu::decode_attention(store, 0, qv, selection, {}, ov, lv);
      acc.ms.push_back(1e3 * (now_seconds() - start));
    }
    acc.per_question[step].add(measure(w, question, refs[size_t(asked[step])], selection, out));
    // The attention alone, into scratch outputs (out holds the step's result, measured above).
    std::vector<float> attend_out(out.size()), attend_lse(lse.size());
    evict_caches();
    const double attend_start = now_seconds();
    cpu::decode_attention(store, 0, qv, selection, {},
                          make_mutable_view(attend_out.data(), DType::kF32, {s.q_heads, s.head_dim}),
                          make_mutable_view(attend_lse.data(), DType::kF32, {s.q_heads}));
    acc.attend_ms.push_back(1e3 * (now_seconds() - attend_start));
  }
  acc.prefill_end_ms.push_back(prefill_end_ms);
  ++acc.seeds;
}

Budget make_budget(const Shape& s, int64_t n, double pct) {
  Budget b;
  b.pct = pct;
  b.tokens = std::max<int64_t>(1, std::llround(pct / 100.0 * double(n)));
  b.blocks = std::max<int64_t>(0, (b.tokens - s.initial_len - s.local_len) / s.block_size);
  return b;
}

bool wanted(const std::vector<std::string>& list, const std::string& name) {
  return list.empty() || std::find(list.begin(), list.end(), name) != list.end();
}

// The needle (multi = false) or multi-query workload at one context.
std::vector<Record> run_decode_workload(const AccuracyArgs& a, int64_t n, bool multi) {
  const Shape& s = a.shape;
  const char* name = multi ? "multiquery" : "needle";
  std::vector<int> spans, asked;
  if (multi) {
    spans.assign(size_t(a.questions), 1);
    for (int j = 0; j < a.questions; ++j) asked.push_back(j);
  } else {
    spans = {a.needles};
    asked.assign(size_t(a.steps), 0);
  }
  std::vector<Budget> budgets;
  for (double pct : a.budgets) {
    const Budget b = make_budget(s, n, pct);
    if (b.tokens < s.initial_len + s.local_len) {
      std::fprintf(stderr,
                   "accuracy: %s %lld tokens: budget %g%% = %lld tokens is below initial + local (%d), skipped\n", name,
                   static_cast<long long>(n), pct, static_cast<long long>(b.tokens), s.initial_len + s.local_len);
      continue;
    }
    budgets.push_back(b);
  }
  std::vector<const Policy*> policies;
  for (const Policy& p : all_policies())
    if (wanted(a.policies, p.name)) policies.push_back(&p);

  // [policy][budget]; dense has one budget (everything).
  std::vector<std::vector<Accum>> acc(policies.size(), std::vector<Accum>(budgets.size()));
  // Where question 0's dense attention goes: [needle heads, other heads] x [sinks, needles, local, rest].
  double mass[2][4] = {};
  int mass_heads[2] = {0, 0};
  for (int seed = 1; seed <= a.seeds; ++seed) {
    double start = now_seconds();
    const Workload w = accuracy::make_workload(s, n, spans, 0, uint64_t(seed) + uint64_t(n));
    Stores stores(w);
    std::vector<Reference> refs(w.questions.size());
    for (size_t j = 0; j < refs.size(); ++j) {
      refs[j].probs = workloads::dense_probabilities(w.questions[j].q.data(), w.k.data(), s.q_heads, s.kv_heads,
                                                     s.head_dim, n);
      refs[j].out.resize(size_t(s.q_heads) * size_t(s.head_dim));
      std::vector<float> lse(size_t(s.q_heads));
      cpu::dense_decode_attention(stores.get(RT::kQuest, /*reference=*/true), 0,
                                  make_view(w.questions[j].q.data(), DType::kF32, {s.q_heads, s.head_dim}), {},
                                  make_mutable_view(refs[j].out.data(), DType::kF32, {s.q_heads, s.head_dim}),
                                  make_mutable_view(lse.data(), DType::kF32, {s.q_heads}));
    }
    const int g = s.q_heads / s.kv_heads;
    for (int h = 0; h < (multi ? 0 : s.q_heads); ++h) {
      const bool needle_head = std::find(s.needle_heads.begin(), s.needle_heads.end(), h / g) != s.needle_heads.end();
      const double* p = refs[0].probs.data() + size_t(h) * size_t(n);
      double part[3] = {0, 0, 0};
      for (int64_t t = 0; t < s.n_sinks; ++t) part[0] += p[t];
      for (int64_t t : w.questions[0].needle_tokens) part[1] += p[t];
      for (int64_t t = n - s.local_len; t < n; ++t) part[2] += p[t];
      double* m = mass[needle_head ? 0 : 1];
      for (int i = 0; i < 3; ++i) m[i] += part[i];
      m[3] += 1.0 - part[0] - part[1] - part[2];
      ++mass_heads[needle_head ? 0 : 1];
    }
    std::fprintf(stderr, "accuracy: %s %lld tokens seed %d: workload and references %.1f s\n", name,
                 static_cast<long long>(n), seed, now_seconds() - start);
    start = now_seconds();
    for (size_t p = 0; p < policies.size(); ++p) {
      const bool dense = std::string(policies[p]->name) == "dense";
      for (size_t b = 0; b < (dense ? std::min<size_t>(1, budgets.size()) : budgets.size()); ++b)
        run_policy(*policies[p], budgets[b], w, stores, refs, asked, acc[p][b]);
    }
    std::fprintf(stderr, "accuracy: %s %lld tokens seed %d: policies %.1f s\n", name, static_cast<long long>(n), seed,
                 now_seconds() - start);
  }

  std::vector<Record> records;
  for (int kind = 0; kind < 2; ++kind) {
    if (mass_heads[kind] == 0) continue;
    Record rec;
    rec.set("bench", "accuracy").set("workload", std::string(name) + "-dense-mass").set("context", n);
    rec.set("heads", kind == 0 ? "needle" : "other").set("question", 0);
    const char* parts[4] = {"sinks", "needles", "local", "rest"};
    for (int i = 0; i < 4; ++i) rec.set(parts[i], accuracy::sig4(mass[kind][i] / mass_heads[kind]));
    records.push_back(rec);
  }
  for (size_t p = 0; p < policies.size(); ++p) {
    for (size_t b = 0; b < budgets.size(); ++b) {
      const Accum& r = acc[p][b];
      if (r.seeds == 0) continue;
      const bool dense = std::string(policies[p]->name) == "dense";
      QuestionMetrics mean;  // over questions and seeds
      for (const QuestionMetrics& q : r.per_question) mean.add(q);
      const double count = double(r.per_question.size()) * r.seeds;
      Record rec;
      rec.set("bench", "accuracy").set("workload", name).set("policy", policies[p]->name).set("context", n);
      rec.set("kv_type", dtype_name(s.kv_type));
      rec.set("budget_pct", dense ? 100.0 : budgets[b].pct).set("budget_tokens", dense ? n : budgets[b].tokens);
      rec.set("second_select_num", dense ? int64_t{0} : budgets[b].blocks);
      // needle workload: every step asks the same question, step 0 is reported (later steps only time).
      const QuestionMetrics& m = multi ? mean : r.per_question[0];
      const double mc = multi ? count : double(r.seeds);
      rec.set("attended_pct", accuracy::sig4(m.attended / mc));
      if (multi) {
        double later = 0;
        for (size_t j = 0; j < r.per_question.size(); ++j) {
          rec.set(std::string("q").append(std::to_string(j)), accuracy::sig4(r.per_question[j].needle / r.seeds));
          if (j > 0) later += r.per_question[j].needle / r.seeds;
        }
        rec.set("later", accuracy::sig4(later / double(std::max<size_t>(1, r.per_question.size() - 1))));
      }
      rec.set("needle", accuracy::sig4(m.needle / mc)).set("block", accuracy::sig4(m.block / mc));
      rec.set("top10", accuracy::sig4(m.top10 / mc)).set("top100", accuracy::sig4(m.top100 / mc)).set("rel_err", accuracy::sig4(m.rel_err / mc));
      rec.set("l1", accuracy::sig4(m.l1 / mc)).set("missed", accuracy::sig4(m.missed / mc));
      rec.set("ms", accuracy::sig4(median(r.ms))).set("attend_ms", accuracy::sig4(median(r.attend_ms)));
      rec.set("prefill_end_ms", accuracy::sig4(median(r.prefill_end_ms)));
      rec.set("seeds", r.seeds);
      records.push_back(rec);
    }
  }
  return records;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) out.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

std::string accuracy_policy_names() {
  std::string names;
  for (const Policy& p : all_policies()) names.append(names.empty() ? "" : ", ").append(p.name);
  return names + " (decode workloads); dense-bf16, quoka, quoka-mean, sinks+recent (prefill workload)";
}

int run_accuracy(const std::vector<std::string>& args) {
  AccuracyArgs a;
  int chunk = 64;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, "accuracy: ", args[i], " needs a value");
      return args[++i];
    };
    // The option's value as an integer in [min, kMaxInt], named with the option.
    auto int_value = [&](int64_t min) {
      const std::string flag = "accuracy: " + args[i];
      return parse_int_flag(flag, next(), min, kMaxInt);
    };
    if (args[i] == "--contexts") {
      a.contexts = parse_list(next(), "accuracy: --contexts", 1024);
    } else if (args[i] == "--budgets") {
      a.budgets.clear();
      for (const std::string& x : split(next()))
        a.budgets.push_back(parse_number_flag("accuracy: --budgets", x, 0, 100));
    } else if (args[i] == "--workloads") {
      a.workloads = split(next());
    } else if (args[i] == "--policies") {
      a.policies = split(next());
    } else if (args[i] == "--needle-heads") {
      a.shape.needle_heads.clear();
      for (const int64_t kv : parse_list(next(), "accuracy: --needle-heads", 0)) {
        if (kv >= a.shape.kv_heads)
          fail(ErrorCode::kInvalidArgument, "accuracy: needle head ", kv, " outside [0, ", a.shape.kv_heads, ")");
        a.shape.needle_heads.push_back(int(kv));
      }
    } else if (args[i] == "--rope-theta") {
      a.shape.rope_theta = parse_number_flag("accuracy: --rope-theta", next(), 1, 1e12);
    } else if (args[i] == "--seeds") {
      a.seeds = int(int_value(1));
    } else if (args[i] == "--chunk") {
      chunk = int(int_value(1));
    } else if (args[i] == "--kv-type") {
      const std::string& name = next();
      const std::optional<DType> t = parse_dtype(name);
      if (!t || (*t != DType::kF16 && *t != DType::kQ8_0))
        fail(ErrorCode::kInvalidArgument, "accuracy: --kv-type must be f16 or q8_0, got '", name, "'");
      a.shape.kv_type = *t;
    } else if (args[i] == "--quick") {
      a.contexts = {16384};
      a.budgets = {1, 2, 5};
    } else {
      fail(ErrorCode::kInvalidArgument, "accuracy: unknown argument '", args[i], "'");
    }
  }
  for (double pct : a.budgets)
    if (pct == 0) fail(ErrorCode::kInvalidArgument, "accuracy: --budgets: a budget of 0% attends nothing; must be > 0");
  for (const std::string& w : a.workloads)
    if (w != "needle" && w != "multiquery" && w != "prefill")
      fail(ErrorCode::kInvalidArgument, "accuracy: unknown workload '", w, "' (needle, multiquery, prefill)");
  for (const std::string& p : a.policies) {
    bool known = p == "dense-bf16" || p == "quoka" || p == "quoka-mean" || p == "sinks+recent";
    for (const Policy& policy : all_policies()) known = known || p == policy.name;
    if (!known) fail(ErrorCode::kInvalidArgument, "accuracy: unknown policy '", p, "'");
  }

  const Shape& s = a.shape;
  std::string needle_heads;
  for (int kv : s.needle_heads) needle_heads.append(needle_heads.empty() ? "" : ",").append(std::to_string(kv));
  Record setup;
  setup.set("bench", "accuracy").set("workload", "setup").set("layers", 1).set("q_heads", s.q_heads);
  setup.set("kv_heads", s.kv_heads).set("head_dim", s.head_dim).set("kv_type", dtype_name(s.kv_type));
  setup.set("block_size", s.block_size);
  setup.set("initial_len", s.initial_len).set("local_windows_len", s.local_len).set("needle_heads", needle_heads);
  setup.set("needle_strength", double(s.needle_strength)).set("window", s.window).set("seeds", a.seeds);
  setup.set("rope_theta", s.rope_theta);
  setup.set("threads", int64_t(tbb::info::default_concurrency()));
  std::printf("%s\n", setup.json().c_str());

  std::map<std::string, std::vector<Record>> by_workload;
  for (int64_t n : a.contexts) {
    for (const std::string& workload : a.workloads) {
      std::vector<Record> records;
      if (workload == "prefill") {
        accuracy::PrefillOptions options;
        options.shape = s;
        options.chunk = chunk;
        options.seeds = a.seeds;
        options.policies = a.policies;
        records = accuracy::run_prefill(options, n, a.budgets);
      } else {
        records = run_decode_workload(a, n, workload == "multiquery");
      }
      for (const Record& r : records) std::printf("%s\n", r.json().c_str());
      std::fflush(stdout);
      for (const Record& r : records) by_workload[r.get("workload")].push_back(r);
    }
  }

  std::printf("\nOne layer, %d q heads, %d kv heads, d=%d, %s K/V, block %d, initial %d, local %d, RoPE theta %g; "
              "needles (4 tokens, %.0f sigma) in kv heads {%s}; %d seed(s); %d threads\n",
              s.q_heads, s.kv_heads, s.head_dim, dtype_name(s.kv_type), s.block_size, s.initial_len, s.local_len,
              s.rope_theta,
              double(s.needle_strength), needle_heads.c_str(), a.seeds, tbb::info::default_concurrency());
  if (by_workload.count("needle")) {
    std::printf("\nneedle: one question, %d needle spans\n", a.needles);
    print_table(by_workload["needle"], {"policy", "kv_type", "context", "budget_pct", "attended_pct", "needle", "block", "top10",
                                        "top100", "rel_err", "l1", "missed", "ms", "attend_ms"});
  }
  if (by_workload.count("needle-dense-mass")) {
    std::printf("\nneedle workload, where dense attention goes (mass on the %d sinks, the needle tokens, the local "
                "window, the rest; mean over the query heads of each kind)\n",
                s.n_sinks);
    print_table(by_workload["needle-dense-mass"], {"context", "heads", "sinks", "needles", "local", "rest"});
  }
  if (by_workload.count("multiquery")) {
    std::printf("\nmultiquery: %d questions in sequence, one needle span each; q<j> = needle recall of question j\n",
                a.questions);
    std::vector<std::string> columns{"policy", "kv_type", "context", "budget_pct", "attended_pct"};
    for (int j = 0; j < a.questions; ++j) columns.push_back(std::string("q").append(std::to_string(j)));
    for (const char* c : {"later", "top10", "top100", "rel_err", "l1", "ms", "attend_ms"}) columns.push_back(c);
    print_table(by_workload["multiquery"], columns);
  }
  if (by_workload.count("prefill")) {
    std::printf("\nprefill: a %d-query chunk after the history, f16 K/V whatever --kv-type; budget = B_SA as %% of "
                "the history; needle = the question rows' needle tokens kept\n",
                chunk);
    print_table(by_workload["prefill"], {"policy", "kernel", "context", "budget_pct", "attended_pct", "needle",
                                         "top10", "rel_err", "l1", "missed", "ms"});
  }
  return 0;
}

}  // namespace longctx::bench
