// Typed configuration of the long-context engine, loaded from YAML.
//
// Keys follow KTransformers' long-context mode (flat, top level); longctx's own
// settings live in the nested maps `preselect`, `budget`, `razor`, `quoka`
// and `h2o`; the applications' settings (longctx-chat) in `model` and
// `sampling`. Every key
// has a default, documented in docs/config.md (generated from the same table
// the loader uses, see config_reference_markdown()). Unknown keys, wrong
// types, out-of-range values and impossible combinations are rejected with
// an Error(kConfig) whose message reads "FILE:LINE:COL: key 'NAME': PROBLEM".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/dtype.h"

namespace longctx {

// How a block of keys is summarized for scoring (ALGORITHMS.md).
enum class RepresentativeType { kMax, kMean, kQuest, kFix, kDynamic };
const char* representative_type_name(RepresentativeType type);

// SHARED: one block set per layer; SEPARATE: one block set per kv head.
enum class HeadSelectMode { kShared, kSeparate };
const char* head_select_mode_name(HeadSelectMode mode);

// How several scores are combined into one (GQA groups, QUOKA steps, DYNAMIC).
enum class Reduce { kSum, kMax, kMean };
const char* reduce_name(Reduce reduce);

// Which tokens a decode step attends (ALGORITHMS.md):
//   kSelect     block selection as configured (representatives, preselection,
//               reuse steps, budgets, RazorAttention)
//   kDense      every token (baseline)
//   kStreaming  StreamingLLM: initial_len sinks + the last local_windows_len tokens
//   kH2O        H2O: heavy hitters by accumulated attention + recent tokens,
//               evicted permanently (section `h2o`)
enum class SelectionPolicy { kSelect, kDense, kStreaming, kH2O };
const char* selection_policy_name(SelectionPolicy policy);

// The products of the CPU's prefill attention (cpu::PrefillKernel): auto =
// bf16 where the CPU multiplies bf16 in hardware (AVX512-BF16), else f32.
enum class PrefillKernelChoice { kAuto, kF32, kBf16, kOnednn, kAmx };
const char* prefill_kernel_choice_name(PrefillKernelChoice choice);

// What a select step does with the context blocks it does not select: drop
// them (their attention mass counts as zero), or estimate their part from
// each block's key mean and variance and value mean (after RetroInfer;
// policy/tail.h), merged with the exact part by LSE. estimate keeps the sums
// these come from in the store's records.
enum class TailMode { kDrop, kEstimate };
const char* tail_mode_name(TailMode mode);

// A second pass of a select step (after ParisKV2; policy/rerank.h): none, or
// tokens = choose rerank_candidates times the blocks, then keep the best
// second_select_num * block_size of their tokens per kv head by their
// stored keys' exact scores (8-bit keys on a q8_0 store).
enum class RerankMode { kNone, kTokens };
const char* rerank_mode_name(RerankMode mode);

// Pooling of the SnapKV votes along the token axis.
enum class PoolType { kMax, kAvg };
const char* pool_type_name(PoolType pool);

// Where the KV store places its memory.
struct NumaPolicy {
  enum class Kind { kAuto, kNone, kNodes };
  Kind kind = Kind::kAuto;  // auto: spread kv heads over every NUMA node
  std::vector<int> nodes;   // kNodes: spread over exactly these node indices
};

// SnapKV-style preselection at the end of prefill (used when preselect_block).
struct PreselectConfig {
  int window = 32;                  // last prompt queries that vote
  int pool_kernel = 7;              // odd; 1 = no pooling (stride 1, padding kernel / 2)
  PoolType pool = PoolType::kMax;
  Reduce gqa_reduce = Reduce::kSum; // votes of a GQA group's query heads: sum or max
};

// H2O baseline (policy h2o). Per layer and kv head the kept set holds at most
// budget tokens: the last (budget - heavy) tokens and `heavy` heavy hitters,
// heavy = floor(heavy_ratio * budget).
struct H2OConfig {
  double heavy_ratio = 0.5;  // share of the budget given to heavy hitters
  int budget_tokens = 0;     // 0 = initial_len + second_select_num * block_size + local_windows_len
};

struct BudgetConfig {
  enum class Policy { kUniform, kAdaptive };
  // How many blocks a decode step keeps per kv head: top_k = second_select_num;
  // top_p = the fewest whose estimated attention mass (with the sinks and the
  // local window) reaches p, within [min_blocks, max_blocks] (policy/top_p.h).
  enum class Mode { kTopK, kTopP };
  Policy policy = Policy::kUniform;  // adaptive = Ada-KV per-kv-head budgets
  double alpha = 0.2;                // adaptive: each head keeps >= alpha * uniform share
  Mode mode = Mode::kTopK;
  double p = 0.95;           // top_p: the estimated mass to reach, in [0, 1]
  int64_t min_blocks = 1;    // top_p: at least this many context blocks per kv head
  int64_t max_blocks = 0;    // top_p: at most this many; 0 = no limit
};

struct RazorConfig {
  std::string retrieval_heads;  // file listing retrieval heads; empty = RazorAttention off
  int sinks = 4;                // sink tokens kept by non-retrieval heads
  int buffer_min = 4000;        // S0: recent buffer is max(buffer_min, n_tokens / buffer_ratio)
  int buffer_ratio = 5;         // C
};

struct QuokaConfig {
  bool enabled = false;           // sparse prefill
  int n_q = 64;                   // queries of a chunk that score the cache
  int b_sa = 2048;                // cached keys each chunk attends (besides sinks, previous chunk)
  int b_cp = 0;                   // chunk length for QUOKA; 0 = chunk_size
  Reduce query_reduce = Reduce::kMax;   // over the retained queries
  Reduce head_reduce = Reduce::kMean;   // over the query heads of a kv group
};

// The model an application runs (longctx-chat); not used by the engine.
struct ModelConfig {
  std::string path;                   // GGUF file; empty = given on the command line
  std::string chat_template = "auto"; // auto (from the GGUF), raw, llama2, llama3, chatml, internlm2
  std::string system_prompt;          // empty = no system message
  std::string backend = "auto";       // auto (cuda when built with CUDA and a GPU is present), cpu, cuda
  std::string weights = "native";     // native (each tensor in its GGUF type), bf16 or f32 (parse_weight_storage)
};

// Token sampling of longctx-chat: temperature, then top-k, then top-p
// (model/sampler.h).
struct SamplingConfig {
  double temperature = 0.0;  // 0 = greedy (argmax)
  int top_k = 40;            // keep the k most probable tokens; 0 = all
  double top_p = 0.95;       // then the smallest set with probability >= top_p; 1 = all
  int64_t seed = 0;          // random seed (same seed, same answer)
  int max_tokens = 512;      // tokens generated per answer at most
};

struct LongContextConfig {
  // ---- KTransformers long-context keys ----
  int chunk_size = 4096;             // prefill chunk, tokens
  int64_t max_seq_len = 131072;      // capacity of the KV store, tokens
  int block_size = 128;              // tokens per KV block
  int local_windows_len = 4096;      // last tokens always attended (GPU window)
  int initial_len = 128;             // first tokens always attended (sinks)
  int second_select_num = 32;        // context blocks selected per step
  int threads_num = 0;               // CPU threads; 0 = every core
  RepresentativeType representative_type = RepresentativeType::kQuest;  // alias anchor_type
  int representative_num = 2;        // alias anchor_num; default depends on the type
  DType kv_type = DType::kF16;       // storage dtype of the KV store
  int dense_layer_num = 2;           // layers below this attend everything
  bool preselect_block = false;      // SnapKV-style preselection at the end of prefill
  int preselect_block_count = 32;    // blocks kept by preselection
  HeadSelectMode head_select_mode = HeadSelectMode::kShared;
  int layer_step = 1;                // re-select every layer_step layers
  int token_step = 1;                // re-select every token_step tokens

  // ---- longctx's own ----
  SelectionPolicy policy = SelectionPolicy::kSelect;
  Reduce gqa_reduce = Reduce::kSum;      // query heads of a GQA group -> one block score
  Reduce dynamic_reduce = Reduce::kMax;  // DYNAMIC: max over representatives (mean = InfLLM)
  NumaPolicy numa;
  uint64_t dram_budget = 0;              // bytes for the KV store; 0 = 90% of physical memory
  PrefillKernelChoice prefill_kernel = PrefillKernelChoice::kAuto;  // CPU prefill attention products
  TailMode tail = TailMode::kDrop;       // unselected context blocks: dropped or estimated
  RerankMode rerank = RerankMode::kNone;  // tokens: rerank the tokens of more candidate blocks
  int rerank_candidates = 4;             // rerank: tokens: candidate blocks = this x second_select_num
  // Speculative selection (after FreeKV; policy/decode_policy.h): a select
  // step reuses the selection its layer made at its last select step, with
  // that step's query, when every kv group's queries are at least
  // speculate_cosine close to that query (cosine, mean over the group).
  bool speculate = false;
  double speculate_cosine = 0.95;
  PreselectConfig preselect;
  BudgetConfig budget;
  RazorConfig razor;
  QuokaConfig quoka;
  H2OConfig h2o;

  // ---- applications ----
  ModelConfig model;
  SamplingConfig sampling;
};

// The H2O budget in tokens: h2o.budget_tokens, or when 0 what block selection
// attends, initial_len + second_select_num * block_size + local_windows_len.
int64_t h2o_budget_tokens(const LongContextConfig& config);

// A byte count as dram_budget takes it: "123456", "256MiB", "4 GB" (units
// B, KiB..TiB, KB..TB, any case). Error(kInvalidArgument) starting with `what`
// (a flag's name, say) otherwise; "auto" is not accepted.
uint64_t parse_byte_count(const std::string& text, const std::string& what);

// Parses YAML text; `source` names it in error messages (a path or "<string>").
// `overrides` are "key=value" or "section.key=value" strings applied on top of
// the file (value parsed as YAML), as from a command line; errors name them.
LongContextConfig parse_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});

// Reads and parses a YAML file (Error kIo if it cannot be read).
LongContextConfig load_config_file(const std::string& path,
                                   const std::vector<std::string>& overrides = {});

// Checks ranges and combinations of an already-built config (parse_config
// calls it); throws Error(kConfig) naming the key.
void validate_config(const LongContextConfig& config);

// The reference of every key (meaning, type, default, range) as Markdown;
// docs/config.md is this text.
std::string config_reference_markdown();

// The config as YAML text that parse_config accepts and that round-trips.
std::string config_to_yaml(const LongContextConfig& config);

}  // namespace longctx
