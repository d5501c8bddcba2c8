// longctx-bench accuracy: shared pieces of the decode workloads
// (bench_accuracy.cpp) and the QUOKA prefill workload (accuracy_prefill.cpp).
//
// Workloads are built on workloads::make_synthetic (sinks, recency, RoPE,
// channel spread; synthetic.h) with its needles placed but left neutral (strength 0),
// then turned into needles of *questions*: question j has its own query q_j
// (a fresh random direction on the non-sink channels, the generator's sink
// channels, the same logit std as the generator's query) and its own needle
// spans, whose keys in the needle kv heads are pushed along q_j's group
// direction until their mean q_j.k is needle_strength sigma (the generator's
// rule, applied per question). Question 0's query is the generator's own.
// Needle values are 4x (the generator's), so the output shows whether a
// needle was attended.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "longctx/cpu/selection.h"

namespace longctx::bench::accuracy {

// Model shape and the fixed parts of every configuration.
struct Shape {
  int q_heads = 8;
  int kv_heads = 2;
  int head_dim = 128;
  int block_size = 16;     // Quest's page size: budgets of 0.5% of 16K still hold blocks
  int initial_len = 16;    // one block: the 4 generator sinks are always attended
  int local_len = 32;      // local window = the generator's recency-biased tokens
  int n_sinks = 4;
  float needle_strength = 7.f;      // mean q.k of a needle token, in sigma (synthetic.h)
  std::vector<int> needle_heads{0}; // kv heads whose keys hold the needles ("retrieval heads")
  int window = 32;                  // last prompt queries (SnapKV votes, H2O's initial scores)
  // RoPE base. Not the generator's 5e5: with it the sink pairs (the d/16
  // lowest-frequency pairs) turn by up to 1.35 rad over 128K tokens and the
  // sinks lose their attention (0.4% of a needle head's mass at 128K, 57% at
  // 16K). Llama 3.1 reaches 128K by dividing those frequencies by 8 (rope
  // scaling); 5e6 turns the sink pairs about as little (0.17 rad at 128K).
  double rope_theta = 5e6;
  // KV storage of the policies' stores (f16 or q8_0); the dense references
  // (probabilities, output) stay on f16, so q8_0 rows include its rounding.
  DType kv_type = DType::kF16;
};

struct Question {
  std::vector<float> q;                // [q_heads][head_dim], post-RoPE
  std::vector<int64_t> needle_tokens;  // sorted
  std::vector<int64_t> needle_blocks;  // sorted, unique
};

struct Workload {
  Shape shape;
  int64_t n_tokens = 0;
  std::vector<float> k;  // [n_tokens][kv_heads][head_dim], rounded to f16 (what the store holds)
  std::vector<float> v;  // [n_tokens][kv_heads][head_dim]
  std::vector<Question> questions;
  std::vector<float> window_q;  // [window][q_heads][head_dim]: variations of question 0
  std::vector<double> pair_energy;  // [kv_heads][head_dim]: s_c^2 estimated from ordinary keys
  double sigma = 0;                 // std of q.k over ordinary keys (logit_std * sqrt(d))
};

// Question i gets spans[i] needle spans of 4 tokens (0: a question without
// needles). No needle lies in the last `needle_free_tail` tokens (nor in the
// local window or the sinks' block).
Workload make_workload(const Shape& shape, int64_t n_tokens, const std::vector<int>& spans, int64_t needle_free_tail,
                       uint64_t seed);

// A query near q ([q_heads][head_dim]): Gaussian noise of relative size eps
// on the non-sink channels, rescaled to the workload's logit std.
std::vector<float> vary_query(const Workload& w, const std::vector<float>& q, double eps, uint64_t seed);

// ---- metrics beyond metrics.h ----

// Fraction of (needle head, needle token) pairs the selection attends.
double needle_recall(const cpu::Selection& selection, const std::vector<int>& heads,
                     const std::vector<int64_t>& tokens);
// The selection restricted to `heads` (for metrics.h's block_recall on the needle heads).
cpu::Selection heads_only(const cpu::Selection& selection, const std::vector<int>& heads);
// Mean over query heads of the dense probability mass outside the selection.
double missed_mass(const std::vector<double>& probs, int q_heads, int64_t n_tokens, const cpu::Selection& selection);
// Mean attended tokens per kv head.
double mean_tokens(const cpu::Selection& selection);

// x with 4 significant digits (tables stay readable; JSON gets the same value).
double sig4(double x);
// "0.5", "2" for a percentage.
std::string pct_name(double pct);

// ---- the prefill (QUOKA) workload, accuracy_prefill.cpp ----

struct PrefillOptions {
  Shape shape;
  int chunk = 64;  // prefill chunk (QUOKA's B_CP), queries
  int n_q = 16;    // QUOKA's retained queries
  int seeds = 1;
  std::vector<std::string> policies;  // empty = all
};

std::vector<Record> run_prefill(const PrefillOptions& options, int64_t context, const std::vector<double>& budgets);

}  // namespace longctx::bench::accuracy
