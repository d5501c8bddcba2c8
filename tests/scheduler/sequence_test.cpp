// Sequence (scheduler/sequence.h) on the CPU backend with small random
// models: logits of prefill and decode against the fp64 reference forward
// pass of reference_forward.h, chunked prefill at several chunk sizes, the
// full-budget sparse decode path against dense, multi-turn prefill, QUOKA
// prefill with a budget covering the history, a model attention scale that
// is not 1/sqrt(head_dim) in every attention, and the argument checks.
#include "longctx/scheduler/sequence.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "scheduler/reference_forward.h"
#include "scheduler/sequence_fixture.h"

namespace longctx::scheduler {
namespace {

using testing::HostModel;
using testing::logits_tolerance;
using testing::max_abs;
using testing::random_host_model;
using testing::random_tokens;
using testing::reference_logits;
using testing::streaming_keys;
using testing::topology;
using testing::upload_model;

TransformerSpec small_spec(bool bias = false, RopeStyle style = RopeStyle::kNormal) {
  TransformerSpec s;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.n_embd = 48;
  s.n_ff = 96;
  s.n_vocab = 64;
  s.rms_eps = 1e-5f;
  s.qkv_bias = bias;
  s.rope.n_rot = 16;
  s.rope.theta = 10000.0f;
  s.rope.style = style;
  return s;
}

// Small f32 store: block 16, 16 sinks, window 32; every layer selecting;
// prefill attention in f32, which the fp64 reference bounds tightly.
LongContextConfig small_config(int chunk_size = 64) {
  LongContextConfig c;
  c.prefill_kernel = PrefillKernelChoice::kF32;
  c.chunk_size = chunk_size;
  c.max_seq_len = 512;
  c.block_size = 16;
  c.initial_len = 16;
  c.local_windows_len = 32;
  c.second_select_num = 4;
  c.kv_type = DType::kF32;
  c.representative_type = RepresentativeType::kQuest;
  c.dense_layer_num = 0;
  c.dram_budget = uint64_t{64} << 20;
  return c;
}

// Every logit of rows [0, n) of `got` within tol of ref rows [ref_row, ref_row + n).
void expect_rows_near(const std::vector<float>& got, const std::vector<double>& ref, int64_t ref_row, int64_t n,
                      int64_t n_vocab, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), size_t(n * n_vocab)) << what;
  double worst = 0.0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < n * n_vocab; ++i) {
    const double e = std::abs(double(got[size_t(i)]) - ref[size_t(ref_row * n_vocab + i)]);
    if (!(e <= worst)) worst = e, worst_i = i;
  }
  EXPECT_LE(worst, tol) << what << ": row " << ref_row + worst_i / n_vocab << " vocab " << worst_i % n_vocab;
  EXPECT_GT(max_abs(std::vector<double>(got.begin(), got.end())), 0.0) << what << ": all-zero logits";
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Prefilled {
  std::vector<float> all;   // [n, n_vocab]
  std::vector<float> last;  // [n_vocab]
};

Prefilled prefill_all(Sequence& seq, const std::vector<int32_t>& tokens) {
  Prefilled r;
  int64_t expected_first = 0;
  PrefillOptions options;
  options.on_logits = [&](int64_t first, int64_t n, std::span<const float> logits) {
    EXPECT_EQ(first, expected_first);
    expected_first += n;
    r.all.insert(r.all.end(), logits.begin(), logits.end());
  };
  r.last = seq.prefill(tokens, options);
  EXPECT_EQ(expected_first, int64_t(tokens.size()));
  return r;
}

class SequenceTest : public ::testing::Test {
 protected:
  cpu::CpuBackend backend_;
};

TEST_F(SequenceTest, PrefillMatchesReferenceForEveryShape) {
  struct Case {
    const char* name;
    TransformerSpec spec;
    bool tied;
  };
  TransformerSpec mha = small_spec();
  mha.n_kv_heads = 4;
  TransformerSpec partial_rot = small_spec(false, RopeStyle::kNeox);
  partial_rot.rope.n_rot = 8;
  TransformerSpec partial_rot_normal = small_spec();  // Llama's pair layout, rope.dimension_count < head_dim
  partial_rot_normal.rope.n_rot = 6;
  TransformerSpec linear = small_spec();
  linear.rope.scaling = RopeScaling::kLinear;
  linear.rope.factor = 4.0f;
  TransformerSpec factors = small_spec();
  factors.rope.freq_factors = {1.f, 1.f, 2.f, 2.f, 4.f, 4.f, 8.f, 8.f};
  const std::vector<Case> cases = {
      {"gqa", small_spec(), false},      {"mha", mha, false},
      {"bias-neox", small_spec(true, RopeStyle::kNeox), false},
      {"tied", small_spec(), true},      {"partial-rot", partial_rot, false},
      {"partial-rot-normal", partial_rot_normal, false},
      {"linear", linear, false},         {"freq-factors", factors, false},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const HostModel host = random_host_model(c.spec, seed++, c.tied);
    const Transformer model = upload_model(host, backend_);
    const std::vector<int32_t> tokens = random_tokens(70, c.spec.n_vocab, seed++);
    const std::vector<double> ref = reference_logits(host, tokens);
    const double tol = logits_tolerance(c.spec, 70, max_abs(ref));

    Sequence seq(backend_, model, small_config(32), &topology());
    const Prefilled got = prefill_all(seq, tokens);
    EXPECT_EQ(seq.n_past(), 70);
    expect_rows_near(got.all, ref, 0, 70, c.spec.n_vocab, tol, c.name);
    expect_rows_near(got.last, ref, 69, 1, c.spec.n_vocab, tol, std::string(c.name) + " last");
  }
}

// An f16 KV store (the default kv_type) rounds K and V once each: within the
// tolerance with the store's unit roundoff added per layer.
TEST_F(SequenceTest, F16StoreStaysWithinItsRounding) {
  const TransformerSpec spec = small_spec();
  const HostModel host = random_host_model(spec, 71);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> tokens = random_tokens(90, spec.n_vocab, 72);
  const std::vector<double> ref = reference_logits(host, tokens);
  LongContextConfig config = small_config(32);
  config.kv_type = DType::kF16;
  Sequence seq(backend_, model, config, &topology());
  expect_rows_near(prefill_all(seq, tokens).all, ref, 0, 90, spec.n_vocab,
                   logits_tolerance(spec, 90, max_abs(ref), std::ldexp(1.0, -11)), "f16 store");
}

TEST_F(SequenceTest, ChunkSizesGiveTheSameLogits) {
  const TransformerSpec spec = small_spec(true);
  const HostModel host = random_host_model(spec, 7);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> tokens = random_tokens(100, spec.n_vocab, 8);
  const std::vector<double> ref = reference_logits(host, tokens);
  const double tol = logits_tolerance(spec, 100, max_abs(ref));

  std::vector<std::vector<float>> results;
  for (int chunk : {1, 17, 512}) {
    LongContextConfig config = small_config(chunk);
    Sequence seq(backend_, model, config, &topology());
    results.push_back(prefill_all(seq, tokens).all);
    expect_rows_near(results.back(), ref, 0, 100, spec.n_vocab, tol, "chunk " + std::to_string(chunk));
  }
  // Each is within tol of the reference, so within 2 tol of each other.
  for (size_t r = 1; r < results.size(); ++r)
    for (size_t i = 0; i < results[0].size(); ++i)
      ASSERT_NEAR(results[r][i], results[0][i], 2 * tol) << "result " << r << " logit " << i;
}

TEST_F(SequenceTest, ProgressCountsTokenLayers) {
  const TransformerSpec spec = small_spec();
  const Transformer model = upload_model(random_host_model(spec, 3), backend_);
  Sequence seq(backend_, model, small_config(16), &topology());
  std::vector<int64_t> done;
  PrefillOptions options;
  options.progress = [&](int64_t d, int64_t total) {
    EXPECT_EQ(total, 2 * 40);
    done.push_back(d);
  };
  seq.prefill(random_tokens(40, spec.n_vocab, 4), options);
  EXPECT_EQ(done, (std::vector<int64_t>{16, 32, 40, 56, 72, 80}));
}

// Greedy decode of 32 tokens: dense policy and a select policy whose budget
// covers every block (and, separately, a reference pass over the generated text).
TEST_F(SequenceTest, GreedyDecodeFullBudgetSparseEqualsDense) {
  const TransformerSpec spec = small_spec();
  const HostModel host = random_host_model(spec, 11);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> prompt = random_tokens(150, spec.n_vocab, 12);

  auto generate = [&](const LongContextConfig& config, std::vector<std::vector<float>>* step_logits,
                      double* attended) {
    Sequence seq(backend_, model, config, &topology());
    std::vector<float> logits = seq.prefill(prompt);
    std::vector<int32_t> out;
    for (int i = 0; i < 32; ++i) {
      out.push_back(argmax(logits));
      logits = seq.decode(out.back());
      step_logits->push_back(logits);
    }
    EXPECT_EQ(seq.n_past(), 150 + 32);
    EXPECT_EQ(seq.stats().decode_tokens, 32);
    *attended = seq.stats().mean_attended_fraction();
    return out;
  };
  LongContextConfig dense = small_config();
  dense.policy = SelectionPolicy::kDense;
  LongContextConfig sparse = small_config();
  sparse.second_select_num = int(dense.max_seq_len / dense.block_size);  // every block
  std::vector<std::vector<float>> dense_logits, sparse_logits;
  double dense_attended = 0, sparse_attended = 0;
  const std::vector<int32_t> a = generate(dense, &dense_logits, &dense_attended);
  const std::vector<int32_t> b = generate(sparse, &sparse_logits, &sparse_attended);
  EXPECT_EQ(a, b);
  EXPECT_DOUBLE_EQ(dense_attended, 1.0);
  EXPECT_DOUBLE_EQ(sparse_attended, 1.0);

  // Decode logits of step i = the reference's logits at position 150 + i.
  std::vector<int32_t> text = prompt;
  text.insert(text.end(), a.begin(), a.end());
  const std::vector<double> ref = reference_logits(host, text);
  const double tol = logits_tolerance(spec, int64_t(text.size()), max_abs(ref));
  for (int i = 0; i < 32; ++i) {
    expect_rows_near(dense_logits[size_t(i)], ref, 150 + i, 1, spec.n_vocab, tol, "dense step " + std::to_string(i));
    expect_rows_near(sparse_logits[size_t(i)], ref, 150 + i, 1, spec.n_vocab, tol,
                     "sparse step " + std::to_string(i));
  }
}

// A small budget attends a fraction of the cache: the stats say so and the
// result differs from dense (the sparse path is really taken).
TEST_F(SequenceTest, SparseDecodeAttendsItsBudget) {
  const TransformerSpec spec = small_spec();
  const Transformer model = upload_model(random_host_model(spec, 13), backend_);
  const std::vector<int32_t> prompt = random_tokens(300, spec.n_vocab, 14);
  LongContextConfig config = small_config();
  config.second_select_num = 2;
  Sequence sparse(backend_, model, config, &topology());
  sparse.prefill(prompt);
  const std::vector<float> s = sparse.decode(5);
  // 16 sinks + 2 chosen blocks of 16 + the 13 context tokens of block 16
  // (the window, from 269, reaches into it: attended, not ranked) + 32
  // local tokens, of 301, per layer and kv head.
  EXPECT_NEAR(sparse.stats().last_attended_fraction, (16.0 + 2 * 16 + 13 + 32) / 301.0, 1e-12);
  // The step's phases were timed, and are parts of it.
  const SequenceStats& st = sparse.stats();
  EXPECT_GT(st.decode_append_seconds, 0.0);
  EXPECT_GT(st.decode_select_seconds, 0.0);
  EXPECT_GT(st.decode_attend_seconds, 0.0);
  EXPECT_LT(st.decode_append_seconds + st.decode_select_seconds + st.decode_attend_seconds, st.decode_seconds);
  config.policy = SelectionPolicy::kStreaming;
  Sequence streaming(backend_, model, config, &topology());
  streaming.prefill(prompt);
  streaming.decode(5);
  EXPECT_NEAR(streaming.stats().last_attended_fraction, (16.0 + 32) / 301.0, 1e-12);
  config.policy = SelectionPolicy::kDense;
  Sequence dense(backend_, model, config, &topology());
  dense.prefill(prompt);
  const std::vector<float> d = dense.decode(5);
  double diff = 0;
  for (size_t i = 0; i < d.size(); ++i) diff = std::max(diff, double(std::abs(d[i] - s[i])));
  EXPECT_GT(diff, 0.0);
}

// prefill(A), decode(t1..t4), prefill(B) = prefill(A t1..t4 B).
TEST_F(SequenceTest, MultiTurnPrefillContinuesAfterDecode) {
  const TransformerSpec spec = small_spec(true, RopeStyle::kNeox);
  const HostModel host = random_host_model(spec, 21);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> a = random_tokens(60, spec.n_vocab, 22);
  const std::vector<int32_t> t = {3, 9, 27, 17};
  const std::vector<int32_t> b = random_tokens(45, spec.n_vocab, 23);
  std::vector<int32_t> all = a;
  all.insert(all.end(), t.begin(), t.end());
  all.insert(all.end(), b.begin(), b.end());
  const std::vector<double> ref = reference_logits(host, all);
  const double tol = logits_tolerance(spec, int64_t(all.size()), max_abs(ref));

  for (SelectionPolicy policy : {SelectionPolicy::kDense, SelectionPolicy::kSelect}) {
    LongContextConfig config = small_config(32);
    config.policy = policy;
    config.second_select_num = 32;  // full budget: same tokens as dense
    config.preselect_block = policy == SelectionPolicy::kSelect;  // the prefill-end hook runs twice
    config.preselect_block_count = 32;
    Sequence seq(backend_, model, config, &topology());
    seq.prefill(a);
    for (int32_t token : t) seq.decode(token);
    const Prefilled second = prefill_all(seq, b);
    EXPECT_EQ(seq.n_past(), int64_t(all.size()));
    expect_rows_near(second.all, ref, int64_t(a.size() + t.size()), int64_t(b.size()), spec.n_vocab, tol,
                     selection_policy_name(policy));
    // Decoding after the second turn still works.
    const std::vector<float> next = seq.decode(1);
    EXPECT_EQ(next.size(), size_t(spec.n_vocab));
  }
}

// QUOKA with b_sa covering the whole history attends what dense prefill does.
TEST_F(SequenceTest, QuokaPrefillWithFullBudgetMatchesReference) {
  const TransformerSpec spec = small_spec();
  const HostModel host = random_host_model(spec, 31);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> tokens = random_tokens(120, spec.n_vocab, 32);
  const std::vector<double> ref = reference_logits(host, tokens);
  LongContextConfig config = small_config(24);
  config.quoka.enabled = true;
  config.quoka.b_sa = 512;
  Sequence seq(backend_, model, config, &topology());
  expect_rows_near(prefill_all(seq, tokens).all, ref, 0, 120, spec.n_vocab,
                   logits_tolerance(spec, 120, max_abs(ref)), "quoka");

  // A small budget changes the result (the restricted path is taken).
  config.quoka.b_sa = 8;
  config.quoka.n_q = 4;
  Sequence sparse(backend_, model, config, &topology());
  const std::vector<float> got = prefill_all(sparse, tokens).all;
  double diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::abs(double(got[i]) - ref[i]));
  EXPECT_GT(diff, logits_tolerance(spec, 120, max_abs(ref)));
}

// A model whose scores are q.k * attn_scale with attn_scale != 1/sqrt(head_dim)
// (<arch>.attention.scale): the prompt and every decode step at that scale,
// against the reference, for dense decode, select / h2o / QUOKA with budgets
// that keep every key, and StreamingLLM (16 sinks + 32 recent of 100+ tokens)
// against the reference restricted to its keys.
TEST_F(SequenceTest, ModelAttentionScaleInPrefillAndDecode) {
  TransformerSpec spec = small_spec();
  spec.attn_scale = 0.5f;  // 1/sqrt(16) = 0.25
  const HostModel host = random_host_model(spec, 41);
  const Transformer model = upload_model(host, backend_);
  const int64_t n = 110, n_prompt = 100;
  const std::vector<int32_t> tokens = random_tokens(n, spec.n_vocab, 42);
  const LongContextConfig base = small_config(32);
  const std::vector<double> full = reference_logits(host, tokens);
  const std::vector<double> streaming =
      reference_logits(host, tokens, streaming_keys(n_prompt, base.initial_len, base.local_windows_len));
  const double tol = logits_tolerance(spec, n, max_abs(full));

  // The scale and the streaming budget each move the decode logits far beyond the tolerance.
  HostModel default_scale = host;
  default_scale.spec.attn_scale = 0.0f;
  const std::vector<double> unscaled = reference_logits(default_scale, tokens);
  double scale_effect = 0, budget_effect = 0;
  for (size_t i = size_t(n_prompt * spec.n_vocab); i < full.size(); ++i) {
    scale_effect = std::max(scale_effect, std::abs(full[i] - unscaled[i]));
    budget_effect = std::max(budget_effect, std::abs(full[i] - streaming[i]));
  }
  EXPECT_GT(scale_effect, 100 * tol);
  EXPECT_GT(budget_effect, 100 * tol);

  struct Case {
    const char* name;
    LongContextConfig config;
    const std::vector<double>& ref;
  };
  std::vector<Case> cases;
  cases.push_back({"dense", base, full});
  cases.back().config.policy = SelectionPolicy::kDense;
  cases.push_back({"select, every block", base, full});
  cases.back().config.second_select_num = 32;
  cases.back().config.preselect_block = true;  // SnapKV votes at the model's scale
  cases.back().config.preselect_block_count = 32;
  cases.push_back({"h2o, nothing evicted", base, full});
  cases.back().config.policy = SelectionPolicy::kH2O;
  cases.back().config.h2o.budget_tokens = 512;
  cases.push_back({"quoka prefill, every key", base, full});
  cases.back().config.policy = SelectionPolicy::kDense;
  cases.back().config.quoka.enabled = true;
  cases.back().config.quoka.b_sa = 512;
  cases.push_back({"streaming", base, streaming});
  cases.back().config.policy = SelectionPolicy::kStreaming;
  for (const Case& c : cases) {
    Sequence seq(backend_, model, c.config, &topology());
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + n_prompt);
    expect_rows_near(prefill_all(seq, prompt).all, c.ref, 0, n_prompt, spec.n_vocab, tol,
                     std::string(c.name) + " prefill");
    for (int64_t i = n_prompt; i < n; ++i)
      expect_rows_near(seq.decode(tokens[size_t(i)]), c.ref, i, 1, spec.n_vocab, tol,
                       std::string(c.name) + " decode at " + std::to_string(i));
  }
}

TEST_F(SequenceTest, BadArgumentsLeaveTheSequenceUsable) {
  const TransformerSpec spec = small_spec();
  const HostModel host = random_host_model(spec, 41);
  const Transformer model = upload_model(host, backend_);
  LongContextConfig config = small_config();
  config.max_seq_len = 64;
  config.local_windows_len = 16;
  Sequence seq(backend_, model, config, &topology());
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of([&] { seq.prefill(std::vector<int32_t>{}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { seq.prefill(std::vector<int32_t>{1, 64}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { seq.prefill(std::vector<int32_t>{-1}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { seq.decode(64); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { seq.prefill(random_tokens(65, spec.n_vocab, 1)); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(seq.n_past(), 0);
  EXPECT_EQ(seq.store().n_tokens(0), 0);
  const std::vector<int32_t> tokens = random_tokens(64, spec.n_vocab, 42);
  seq.prefill(std::span<const int32_t>(tokens).first(60));
  EXPECT_EQ(code_of([&] { seq.prefill(std::span<const int32_t>(tokens).first(5)); }), ErrorCode::kInvalidArgument);
  for (int i = 60; i < 64; ++i) seq.decode(tokens[size_t(i)]);
  EXPECT_EQ(code_of([&] { seq.decode(1); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(seq.n_past(), 64);

  // reset() empties the store; the same prompt gives the same logits again.
  seq.reset();
  EXPECT_EQ(seq.n_past(), 0);
  const std::vector<double> ref = reference_logits(host, tokens);
  expect_rows_near(seq.prefill(tokens), ref, 63, 1, spec.n_vocab, logits_tolerance(spec, 64, max_abs(ref)),
                   "after reset");
}

TEST_F(SequenceTest, SyncWithStoreResumesDecoding) {
  const TransformerSpec spec = small_spec();
  const HostModel host = random_host_model(spec, 51);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> tokens = random_tokens(50, spec.n_vocab, 52);
  Sequence seq(backend_, model, small_config(), &topology());
  seq.prefill(std::span<const int32_t>(tokens).first(49));
  seq.sync_with_store();  // as after a snapshot load: n_past from the store
  EXPECT_EQ(seq.n_past(), 49);
  const std::vector<double> ref = reference_logits(host, tokens);
  expect_rows_near(seq.decode(tokens[49]), ref, 49, 1, spec.n_vocab, logits_tolerance(spec, 50, max_abs(ref)),
                   "resumed");
}

// A prompt that shares a cached prefix: truncate to the prefix's whole
// blocks, prefill the rest; the logits are the new prompt's alone.
TEST_F(SequenceTest, TruncateThenPrefillGivesTheNewPromptsLogits) {
  const TransformerSpec spec = small_spec();
  const HostModel host = random_host_model(spec, 61);
  const Transformer model = upload_model(host, backend_);
  const std::vector<int32_t> first = random_tokens(90, spec.n_vocab, 62);
  std::vector<int32_t> second(first.begin(), first.begin() + 70);  // shares 70 tokens: 4 whole blocks
  const std::vector<int32_t> tail = random_tokens(30, spec.n_vocab, 63);
  second.insert(second.end(), tail.begin(), tail.end());
  std::vector<int32_t> with_next = second;
  with_next.push_back(7);
  const std::vector<double> ref = reference_logits(host, with_next);  // causal: rows of `second` too
  const double tol = logits_tolerance(spec, int64_t(with_next.size()), max_abs(ref));
  for (SelectionPolicy policy : {SelectionPolicy::kDense, SelectionPolicy::kSelect}) {
    LongContextConfig config = small_config();
    config.policy = policy;
    config.second_select_num = 32;  // full budget: the dense reference's tokens
    Sequence seq(backend_, model, config, &topology());
    seq.prefill(first);
    seq.decode(5);
    EXPECT_THROW(seq.truncate(72), Error);   // inside a block
    EXPECT_THROW(seq.truncate(112), Error);  // more than it holds
    EXPECT_EQ(seq.n_past(), 91);
    seq.truncate(64);
    EXPECT_EQ(seq.n_past(), 64);
    const Prefilled again = prefill_all(seq, std::vector<int32_t>(second.begin() + 64, second.end()));
    expect_rows_near(again.all, ref, 64, int64_t(second.size()) - 64, spec.n_vocab, tol,
                     selection_policy_name(policy));
    expect_rows_near(seq.decode(7), ref, int64_t(second.size()), 1, spec.n_vocab, tol, "decode after truncate");
  }
}

TEST_F(SequenceTest, ValidateNamesTheBadWeight) {
  const TransformerSpec spec = small_spec(true);
  const HostModel host = random_host_model(spec, 61);
  auto message_of = [](const Transformer& t) -> std::string {
    try {
      t.validate();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return e.what();
    }
    return "";
  };
  {
    Transformer t = upload_model(host, backend_);
    EXPECT_EQ(message_of(t), "");
    t.weights.layers[1].wk.reset();
    EXPECT_NE(message_of(t).find("layer 1 wk is missing"), std::string::npos) << message_of(t);
  }
  {
    Transformer t = upload_model(host, backend_);
    t.weights.layers[0].w_down = backend_.alloc({spec.n_ff, spec.n_embd});
    EXPECT_NE(message_of(t).find("layer 0 w_down: expected [48, 96], got f32[96, 48]"), std::string::npos)
        << message_of(t);
  }
  {
    Transformer t = upload_model(host, backend_);
    t.spec.qkv_bias = false;
    EXPECT_NE(message_of(t).find("biases"), std::string::npos) << message_of(t);
  }
  {
    Transformer t = upload_model(host, backend_);
    t.spec.n_kv_heads = 3;
    EXPECT_NE(message_of(t).find("n_kv_heads"), std::string::npos) << message_of(t);
  }
}

}  // namespace
}  // namespace longctx::scheduler
