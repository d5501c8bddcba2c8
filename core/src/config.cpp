// YAML configuration of the long-context engine.
//
// One table of key descriptors (keys()) and one table of combination rules
// (rules()) drive everything: parsing, range checks, the Markdown reference
// (docs/config.md) and config_to_yaml. A key is described once, in config_keys.cpp.
//
// Parsing happens in three steps: collect the settings (key -> YAML node and
// where it was written) from the file, let the overrides replace some of
// them, then convert every node into the struct and validate the result.
// An overridden file value is therefore never looked at.
//
// The files, by responsibility (what they share is in config_internal.h):
//   config.cpp            the names of the enums, h2o_budget_tokens
//   config_values.cpp     reading and writing YAML scalars (integers, numbers,
//                         booleans, byte counts, quoted strings)
//   config_keys.cpp       the key table: how each key is parsed, checked,
//                         written back and documented
//   config_validate.cpp   the combination rules; validate_config
//   config_yaml.cpp       parse_config and load_config_file (settings from the
//                         file and the overrides, FILE:LINE:COL errors),
//                         config_to_yaml
//   config_reference.cpp  config_reference_markdown (docs/config.md)
#include "longctx/core/config.h"

namespace longctx {

const char* representative_type_name(RepresentativeType type) {
  switch (type) {
    case RepresentativeType::kMax: return "MAX";
    case RepresentativeType::kMean: return "MEAN";
    case RepresentativeType::kQuest: return "QUEST";
    case RepresentativeType::kFix: return "FIX";
    case RepresentativeType::kDynamic: return "DYNAMIC";
  }
  return "invalid";
}

const char* head_select_mode_name(HeadSelectMode mode) {
  switch (mode) {
    case HeadSelectMode::kShared: return "SHARED";
    case HeadSelectMode::kSeparate: return "SEPARATE";
  }
  return "invalid";
}

const char* reduce_name(Reduce reduce) {
  switch (reduce) {
    case Reduce::kSum: return "sum";
    case Reduce::kMax: return "max";
    case Reduce::kMean: return "mean";
  }
  return "invalid";
}

const char* selection_policy_name(SelectionPolicy policy) {
  switch (policy) {
    case SelectionPolicy::kSelect: return "select";
    case SelectionPolicy::kDense: return "dense";
    case SelectionPolicy::kStreaming: return "streaming";
    case SelectionPolicy::kH2O: return "h2o";
  }
  return "invalid";
}

const char* rerank_mode_name(RerankMode mode) {
  switch (mode) {
    case RerankMode::kNone: return "none";
    case RerankMode::kTokens: return "tokens";
  }
  return "invalid";
}

const char* tail_mode_name(TailMode mode) {
  switch (mode) {
    case TailMode::kDrop: return "drop";
    case TailMode::kEstimate: return "estimate";
  }
  return "invalid";
}

const char* pool_type_name(PoolType pool) {
  switch (pool) {
    case PoolType::kMax: return "max";
    case PoolType::kAvg: return "avg";
  }
  return "invalid";
}

const char* prefill_kernel_choice_name(PrefillKernelChoice choice) {
  switch (choice) {
    case PrefillKernelChoice::kAuto: return "auto";
    case PrefillKernelChoice::kF32: return "f32";
    case PrefillKernelChoice::kBf16: return "bf16";
    case PrefillKernelChoice::kOnednn: return "onednn";
    case PrefillKernelChoice::kAmx: return "amx";
  }
  return "invalid";
}

int64_t h2o_budget_tokens(const LongContextConfig& config) {
  if (config.h2o.budget_tokens > 0) return config.h2o.budget_tokens;
  return int64_t{config.initial_len} + int64_t{config.second_select_num} * config.block_size +
         config.local_windows_len;
}

}  // namespace longctx
