// The key table of the config loader: one descriptor per key (how it is
// parsed, checked, written back and documented), built once by keys().
#include <algorithm>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config_internal.h"
#include "longctx/core/error.h"

namespace longctx::config_detail {
namespace {

const char* budget_mode_name(BudgetConfig::Mode mode) {
  switch (mode) {
    case BudgetConfig::Mode::kTopK: return "top_k";
    case BudgetConfig::Mode::kTopP: return "top_p";
  }
  return "invalid";
}

const char* budget_policy_name(BudgetConfig::Policy policy) {
  switch (policy) {
    case BudgetConfig::Policy::kUniform: return "uniform";
    case BudgetConfig::Policy::kAdaptive: return "adaptive";
  }
  return "invalid";
}

// Reads and writes one field of the config, possibly inside a section.
template <typename T>
struct Field {
  std::function<T&(Config&)> ref;
  std::function<const T&(const Config&)> cref;
};

template <typename T>
Field<T> field(T Config::*member) {
  return {[member](Config& c) -> T& { return c.*member; },
          [member](const Config& c) -> const T& { return c.*member; }};
}

template <typename Section, typename T>
Field<T> field(Section Config::*section, T Section::*member) {
  return {[=](Config& c) -> T& { return (c.*section).*member; },
          [=](const Config& c) -> const T& { return (c.*section).*member; }};
}

// An integer in lo..hi; hi = the type's maximum means "no upper bound".
template <typename T>
Key int_key(std::string path, Field<T> f, int64_t lo, int64_t hi, std::string meaning,
            std::string values_doc = {}) {
  const bool has_max = hi != std::numeric_limits<T>::max();
  Key key;
  key.path = std::move(path);
  key.type = "integer";
  key.values = values_doc.empty() ? range_text(lo, hi, has_max) : std::move(values_doc);
  key.meaning = std::move(meaning);
  key.parse = [=](const YAML::Node& node, Config& c) {
    f.ref(c) = static_cast<T>(read_integer(node, lo, hi, has_max));
  };
  key.check = [=](const Config& c) -> std::string {
    const int64_t value = f.cref(c);
    if (value >= lo && value <= hi) return {};
    return str_cat("must be ", has_max ? "in " : "", range_text(lo, hi, has_max), ", got ", value);
  };
  key.emit = [=](const Config& c) { return std::to_string(f.cref(c)); };
  return key;
}

Key bool_key(std::string path, Field<bool> f, std::string meaning) {
  Key key;
  key.path = std::move(path);
  key.type = "bool";
  key.values = "true, false";
  key.meaning = std::move(meaning);
  key.parse = [=](const YAML::Node& node, Config& c) { f.ref(c) = read_bool(node); };
  key.check = [](const Config&) { return std::string(); };
  key.emit = [=](const Config& c) { return std::string(f.cref(c) ? "true" : "false"); };
  return key;
}

// A number in [lo, hi]; NaN is never in range.
Key number_key(std::string path, Field<double> f, double lo, double hi, std::string meaning) {
  Key key;
  key.path = std::move(path);
  key.type = "number";
  key.values = str_cat("[", number_yaml(lo), ", ", number_yaml(hi), "]");
  key.meaning = std::move(meaning);
  const auto problem = [range = key.values, lo, hi](double value) -> std::string {
    if (value >= lo && value <= hi) return {};
    return str_cat("must be in ", range, ", got ", number_yaml(value));
  };
  key.parse = [=](const YAML::Node& node, Config& c) {
    const double value = read_number(node);
    if (const std::string p = problem(value); !p.empty()) bad_value(p);
    f.ref(c) = value;
  };
  key.check = [=](const Config& c) { return problem(f.cref(c)); };
  key.emit = [=](const Config& c) { return number_yaml(f.cref(c)); };
  return key;
}

// Any text; an empty value (`key:`) is the empty string.
Key string_key(std::string path, Field<std::string> f, std::string meaning) {
  Key key;
  key.path = std::move(path);
  key.type = "string";
  key.values = "any text";
  key.meaning = std::move(meaning);
  key.parse = [=](const YAML::Node& node, Config& c) {
    f.ref(c) = node.IsNull() ? std::string() : scalar_text(node, "a string", /*quoted_ok=*/true);
  };
  key.check = [](const Config&) { return std::string(); };
  key.emit = [=](const Config& c) { return yaml_quote(f.cref(c)); };
  return key;
}

// One of `choices` (lower-case names), any case; stored lower-case.
Key choice_string_key(std::string path, Field<std::string> f, std::vector<std::string> choices,
                      std::string meaning) {
  std::string listed;
  for (size_t i = 0; i < choices.size(); ++i) listed += str_cat(i ? ", " : "", choices[i]);
  Key key;
  key.path = std::move(path);
  key.type = "enum";
  key.values = str_cat(listed, " (any case)");
  key.meaning = std::move(meaning);
  const auto allowed = [=](const std::string& text) {
    return std::find(choices.begin(), choices.end(), text) != choices.end();
  };
  key.parse = [=](const YAML::Node& node, Config& c) {
    const std::string text = lower(scalar_text(node, str_cat("one of ", listed), /*quoted_ok=*/true));
    if (!allowed(text)) bad_value(str_cat("expected one of ", listed, ", got ", describe(node)));
    f.ref(c) = text;
  };
  key.check = [=](const Config& c) -> std::string {
    if (allowed(f.cref(c))) return {};
    return str_cat("must be one of ", listed, ", got '", shown(f.cref(c)), "'");
  };
  key.emit = [=](const Config& c) { return f.cref(c); };
  return key;
}

template <typename E>
struct Choice {
  std::string_view name;
  E value;
};

// One of `choices`, any case. The first `documented` choices are the names
// written back and listed; the others are accepted spellings (KTransformers').
// The check also rejects values of the enum this key does not allow.
template <typename E>
Key enum_key(std::string path, Field<E> f, std::vector<Choice<E>> choices, size_t documented,
             const char* (*name_of)(E), std::string meaning) {
  std::string listed;
  for (size_t i = 0; i < documented; ++i) listed += str_cat(i ? ", " : "", choices[i].name);
  std::string accepted;
  for (size_t i = documented; i < choices.size(); ++i) {
    accepted += str_cat(accepted.empty() ? "" : ", ", choices[i].name);
  }
  Key key;
  key.path = std::move(path);
  key.type = "enum";
  key.values = accepted.empty() ? str_cat(listed, " (any case)")
                                : str_cat(listed, " (any case; also ", accepted, ")");
  key.meaning = std::move(meaning);
  key.parse = [=](const YAML::Node& node, Config& c) {
    const std::string text = lower(scalar_text(node, str_cat("one of ", listed), /*quoted_ok=*/true));
    for (const Choice<E>& choice : choices) {
      if (lower(choice.name) == text) {
        f.ref(c) = choice.value;
        return;
      }
    }
    bad_value(str_cat("expected one of ", listed, ", got ", describe(node)));
  };
  key.check = [=](const Config& c) -> std::string {
    const E value = f.cref(c);
    for (size_t i = 0; i < documented; ++i) {
      if (choices[i].value == value) return {};
    }
    return str_cat("must be one of ", listed, ", got ", name_of(value));
  };
  key.emit = [=](const Config& c) { return std::string(name_of(f.cref(c))); };
  return key;
}

Key kv_type_key() {
  Key key;
  key.path = "kv_type";
  key.type = "dtype";
  key.values = "f32, f16, bf16, q8_0 (any case; also fp32, fp16, float32, float16, bfloat16)";
  key.meaning = "storage type of the KV store; q8_0 = int8 codes with an f16 scale per 32 values of a token's "
                "head vector (8.5 bits per value, head_dim a multiple of 32; CPU attention only)";
  key.parse = [](const YAML::Node& node, Config& c) {
    const std::string text = scalar_text(node, "a dtype", /*quoted_ok=*/true);
    const std::optional<DType> dtype = parse_dtype(text);
    if (!dtype) bad_value(str_cat("expected one of f32, f16, bf16, q8_0, got ", describe(node)));
    c.kv_type = *dtype;
  };
  key.check = [](const Config& c) -> std::string {
    if (c.kv_type == DType::kF32 || c.kv_type == DType::kF16 || c.kv_type == DType::kBF16 ||
        c.kv_type == DType::kQ8_0)
      return {};
    return str_cat("must be one of f32, f16, bf16, q8_0, got dtype code ", static_cast<int>(c.kv_type));
  };
  key.emit = [](const Config& c) { return std::string(dtype_name(c.kv_type)); };
  return key;
}

// What is wrong with a list of NUMA nodes, or empty.
std::string numa_nodes_problem(const std::vector<int>& nodes) {
  if (nodes.empty()) return "an empty list of NUMA nodes; write 'none' or 'auto' instead";
  std::set<int> seen;
  for (const int node : nodes) {
    if (node < 0) return str_cat("NUMA node index: must be >= 0, got ", node);
    if (!seen.insert(node).second) return str_cat("NUMA node ", node, " is listed twice");
  }
  return {};
}

Key numa_key() {
  Key key;
  key.path = "numa";
  key.type = "numa";
  key.values = "auto, none, or a list of distinct node indices >= 0 such as [0, 1]";
  key.meaning = "NUMA placement of the KV store: auto = spread kv heads over every node";
  key.parse = [](const YAML::Node& node, Config& c) {
    NumaPolicy policy;
    if (node.IsSequence()) {
      policy.kind = NumaPolicy::Kind::kNodes;
      std::set<int> seen;
      for (const YAML::Node& element : node) {
        int index = 0;
        try {
          index = static_cast<int>(read_integer(element, 0, std::numeric_limits<int>::max(), false));
        } catch (BadValue& bad) {
          bad.problem = "NUMA node index: " + bad.problem;
          bad.inner = element.Mark();
          throw;
        }
        if (!seen.insert(index).second) {
          throw BadValue{str_cat("NUMA node ", index, " is listed twice"), element.Mark()};
        }
        policy.nodes.push_back(index);
      }
      if (const std::string p = numa_nodes_problem(policy.nodes); !p.empty()) bad_value(p);
    } else {
      const std::string text = lower(scalar_text(node, "auto, none or a list of node indices", true));
      if (text == "auto") policy.kind = NumaPolicy::Kind::kAuto;
      else if (text == "none") policy.kind = NumaPolicy::Kind::kNone;
      else bad_value(str_cat("expected auto, none or a list of node indices, got ", describe(node)));
    }
    c.numa = std::move(policy);
  };
  key.check = [](const Config& c) -> std::string {
    switch (c.numa.kind) {
      case NumaPolicy::Kind::kAuto:
      case NumaPolicy::Kind::kNone:
        if (c.numa.nodes.empty()) return {};
        return "nodes are listed but the kind is not kNodes; set kind = kNodes or clear the list";
      case NumaPolicy::Kind::kNodes: return numa_nodes_problem(c.numa.nodes);
    }
    return "invalid kind";
  };
  key.emit = [](const Config& c) -> std::string {
    switch (c.numa.kind) {
      case NumaPolicy::Kind::kAuto: return "auto";
      case NumaPolicy::Kind::kNone: return "none";
      case NumaPolicy::Kind::kNodes: break;
    }
    std::string out = "[";
    for (size_t i = 0; i < c.numa.nodes.size(); ++i) out += str_cat(i ? ", " : "", c.numa.nodes[i]);
    return out + "]";
  };
  return key;
}

Key dram_budget_key() {
  Key key;
  key.path = "dram_budget";
  key.type = "bytes";
  key.values = str_cat("auto (or 0), or bytes: 68719476736, 64GiB, 500 GB; units ", kByteUnitsHelp);
  key.meaning = "DRAM for the KV store; auto = 90% of physical memory";
  key.parse = [](const YAML::Node& node, Config& c) { c.dram_budget = read_bytes(node); };
  key.check = [](const Config&) { return std::string(); };
  key.emit = [](const Config& c) { return bytes_yaml(c.dram_budget); };
  return key;
}

// An int_key whose value must also be odd (pooling kernels: centred windows).
Key odd_int_key(std::string path, Field<int> f, int64_t lo, int64_t hi, std::string meaning,
                std::string values_doc) {
  Key key = int_key(std::move(path), f, lo, hi, std::move(meaning), std::move(values_doc));
  const auto odd_problem = [](int64_t value) -> std::string {
    if (value % 2 != 0) return {};
    return str_cat("must be odd (a window centred on each token), got ", value);
  };
  key.parse = [=, parse = key.parse](const YAML::Node& node, Config& c) {
    parse(node, c);
    if (const std::string p = odd_problem(f.cref(c)); !p.empty()) bad_value(p);
  };
  key.check = [=, check = key.check](const Config& c) -> std::string {
    if (std::string p = check(c); !p.empty()) return p;
    return odd_problem(f.cref(c));
  };
  return key;
}

Key with_alias(Key key, std::string alias) {
  key.alias = std::move(alias);
  return key;
}

Key with_default_doc(Key key, std::string default_doc) {
  key.default_doc = std::move(default_doc);
  return key;
}

}  // namespace

bool is_section(std::string_view name) {
  return !name.empty() && std::any_of(std::begin(kSections), std::end(kSections),
                                      [&](const Section& s) { return s.name == name; });
}

std::string_view section_of(std::string_view path) {
  const size_t dot = path.find('.');
  return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

const std::vector<Key>& keys() {
  using RT = RepresentativeType;
  using HM = HeadSelectMode;
  using BP = BudgetConfig::Policy;
  using SP = SelectionPolicy;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  static const std::vector<Key> table = [] {
    std::vector<Key> k;
    // KTransformers' long-context keys.
    k.push_back(int_key("chunk_size", field(&Config::chunk_size), 1, 1048576,
                        "prefill chunk length, tokens"));
    k.push_back(int_key("max_seq_len", field(&Config::max_seq_len), 1, kIntMax,
                        "capacity of the KV store, tokens", "1..2147483647 (2^31-1)"));
    k.push_back(int_key("block_size", field(&Config::block_size), 1, 1024, "tokens per KV block"));
    k.push_back(int_key("local_windows_len", field(&Config::local_windows_len), 0, kIntMax,
                        "last tokens, always attended (GPU window)", "0..max_seq_len"));
    k.push_back(int_key("initial_len", field(&Config::initial_len), 0, kIntMax,
                        "first tokens, always attended (attention sinks)",
                        "0..max_seq_len - local_windows_len"));
    k.push_back(int_key("second_select_num", field(&Config::second_select_num), 0, kIntMax,
                        "context blocks selected per step (blocks partly sinks, window or unfilled are "
                        "attended besides)",
                        ">= 0; second_select_num * block_size <= max_seq_len"));
    k.push_back(int_key("threads_num", field(&Config::threads_num), 0, 4096,
                        "CPU threads; 0 = every core"));
    k.push_back(with_alias(
        enum_key<RT>("representative_type", field(&Config::representative_type),
                     {{"MAX", RT::kMax}, {"MEAN", RT::kMean}, {"QUEST", RT::kQuest}, {"FIX", RT::kFix},
                      {"DYNAMIC", RT::kDynamic}, {"BLOCK_MAX", RT::kMax}, {"BLOCK_MEAN", RT::kMean},
                      {"FIXED", RT::kFix}},
                     5, representative_type_name, "how a block is summarized for scoring"),
        "anchor_type"));
    k.push_back(with_default_doc(
        with_alias(int_key("representative_num", field(&Config::representative_num), 1, 1024,
                           "representatives kept per block and kv head",
                           "MAX, MEAN: 1; QUEST: 2; FIX, DYNAMIC: 1..block_size"),
                   "anchor_num"),
        "by type: MAX, MEAN 1; QUEST 2; FIX, DYNAMIC 4"));
    k.push_back(kv_type_key());
    k.push_back(int_key("dense_layer_num", field(&Config::dense_layer_num), 0, kIntMax,
                        "layers below this attend every token"));
    k.push_back(bool_key("preselect_block", field(&Config::preselect_block),
                         "SnapKV-style preselection of blocks at the end of prefill"));
    k.push_back(int_key("preselect_block_count", field(&Config::preselect_block_count), 1, kIntMax,
                        "blocks kept by preselection",
                        ">= 1; with preselect_block, preselect_block_count * block_size <= max_seq_len"));
    k.push_back(enum_key<HM>("head_select_mode", field(&Config::head_select_mode),
                             {{"SHARED", HM::kShared}, {"SEPARATE", HM::kSeparate}}, 2,
                             head_select_mode_name,
                             "SHARED: one block set per layer; SEPARATE: one per kv head"));
    k.push_back(int_key("layer_step", field(&Config::layer_step), 1, kIntMax,
                        "re-select blocks every layer_step layers"));
    k.push_back(int_key("token_step", field(&Config::token_step), 1, kIntMax,
                        "re-select blocks every token_step tokens"));
    // longctx's own top-level keys.
    k.push_back(enum_key<SP>("policy", field(&Config::policy),
                             {{"select", SP::kSelect}, {"dense", SP::kDense}, {"streaming", SP::kStreaming},
                              {"h2o", SP::kH2O}},
                             4, selection_policy_name,
                             "tokens decode attends: select = blocks; dense; streaming = StreamingLLM "
                             "(initial_len + local_windows_len); h2o = H2O"));
    k.push_back(enum_key<TailMode>("tail", field(&Config::tail),
                                   {{"drop", TailMode::kDrop}, {"estimate", TailMode::kEstimate}}, 2, tail_mode_name,
                                   "policy select: the context blocks not selected are dropped, or their part is "
                                   "estimated from each block's key mean and variance and value mean (after "
                                   "RetroInfer) and merged by LSE"));
    k.push_back(enum_key<RerankMode>("rerank", field(&Config::rerank),
                                     {{"none", RerankMode::kNone}, {"tokens", RerankMode::kTokens}}, 2,
                                     rerank_mode_name,
                                     "policy select: tokens = score the tokens of rerank_candidates x "
                                     "second_select_num candidate blocks with their stored keys and attend the best "
                                     "second_select_num x block_size of them (ParisKV2)"));
    k.push_back(int_key("rerank_candidates", field(&Config::rerank_candidates), 1, 1024,
                        "rerank: tokens: candidate blocks per kv head, as a multiple of second_select_num"));
    k.push_back(bool_key("speculate", field(&Config::speculate),
                         "policy select: reuse the layer's last selection while the query stays close to the one "
                         "that made it (FreeKV)"));
    k.push_back(number_key("speculate_cosine", field(&Config::speculate_cosine), -1.0, 1.0,
                           "speculate: the cosine each kv group's queries (mean over the group) must reach"));
    k.push_back(enum_key<Reduce>("gqa_reduce", field(&Config::gqa_reduce),
                                 {{"sum", Reduce::kSum}, {"max", Reduce::kMax}}, 2, reduce_name,
                                 "combines the block scores of a GQA group's query heads"));
    k.push_back(enum_key<Reduce>("dynamic_reduce", field(&Config::dynamic_reduce),
                                 {{"max", Reduce::kMax}, {"mean", Reduce::kMean}}, 2, reduce_name,
                                 "DYNAMIC: combines q.k over the representatives (mean = InfLLM)"));
    k.push_back(numa_key());
    k.push_back(dram_budget_key());
    k.push_back(enum_key<PrefillKernelChoice>(
        "prefill_kernel", field(&Config::prefill_kernel),
        {{"auto", PrefillKernelChoice::kAuto}, {"f32", PrefillKernelChoice::kF32},
         {"bf16", PrefillKernelChoice::kBf16}, {"onednn", PrefillKernelChoice::kOnednn},
         {"amx", PrefillKernelChoice::kAmx}},
        5, prefill_kernel_choice_name,
        "products of the CPU prefill attention: f32; bf16 = q, k, v and the probabilities rounded to bf16, "
        "f32 accumulation, on AVX512-BF16's vdpbf16ps (1.7x the f32 rate on a Zen 4, 0.63x on a Xeon without "
        "AMX; an error where the CPU lacks it); onednn = the same bf16 products through oneDNN's matmul, on AMX "
        "tiles where the CPU has AMX (an error where oneDNN has no bf16 matmul); amx = the same bf16 products on "
        "AMX tiles in longctx's own kernel, fused with the softmax (an error where AMX is not usable); auto = amx "
        "where AMX is usable, else bf16 where vdpbf16ps runs at 1.25x the FMA rate or more (measured at start), "
        "else f32"));
    // preselect
    k.push_back(int_key("preselect.window", field(&Config::preselect, &PreselectConfig::window), 1, kIntMax,
                        "last prompt queries that vote for earlier tokens (preselection, DYNAMIC "
                        "representatives, H2O's start)"));
    k.push_back(odd_int_key("preselect.pool_kernel", field(&Config::preselect, &PreselectConfig::pool_kernel), 1,
                            kIntMax,
                            "pooling window of the preselection votes, tokens (stride 1, padding kernel / 2); "
                            "DYNAMIC takes them unpooled",
                            "odd, >= 1; 1 = no pooling"));
    k.push_back(enum_key<PoolType>("preselect.pool", field(&Config::preselect, &PreselectConfig::pool),
                                   {{"max", PoolType::kMax}, {"avg", PoolType::kAvg}}, 2, pool_type_name,
                                   "pooling of the votes along the tokens"));
    k.push_back(enum_key<Reduce>("preselect.gqa_reduce", field(&Config::preselect, &PreselectConfig::gqa_reduce),
                                 {{"sum", Reduce::kSum}, {"max", Reduce::kMax}}, 2, reduce_name,
                                 "combines the votes of a GQA group's query heads"));
    // budget
    k.push_back(enum_key<BP>("budget.policy", field(&Config::budget, &BudgetConfig::policy),
                             {{"uniform", BP::kUniform}, {"adaptive", BP::kAdaptive}}, 2,
                             budget_policy_name, "uniform, or adaptive per-kv-head budgets (Ada-KV)"));
    k.push_back(number_key("budget.alpha", field(&Config::budget, &BudgetConfig::alpha), 0.0, 1.0,
                           "adaptive: each kv head keeps >= alpha * its uniform share"));
    k.push_back(enum_key<BudgetConfig::Mode>(
        "budget.mode", field(&Config::budget, &BudgetConfig::mode),
        {{"top_k", BudgetConfig::Mode::kTopK}, {"top_p", BudgetConfig::Mode::kTopP}}, 2, budget_mode_name,
        "blocks per kv head and step: top_k = second_select_num; top_p = the fewest whose estimated attention "
        "mass reaches budget.p"));
    k.push_back(number_key("budget.p", field(&Config::budget, &BudgetConfig::p), 0.0, 1.0,
                           "top_p: the share of the estimated attention mass (sinks and local window included) "
                           "the kept blocks reach"));
    k.push_back(int_key("budget.min_blocks", field(&Config::budget, &BudgetConfig::min_blocks), 0, kIntMax,
                        "top_p: context blocks kept per kv head at least"));
    k.push_back(int_key("budget.max_blocks", field(&Config::budget, &BudgetConfig::max_blocks), 0, kIntMax,
                        "top_p: context blocks kept per kv head at most; 0 = no limit"));
    // razor
    k.push_back(string_key("razor.retrieval_heads", field(&Config::razor, &RazorConfig::retrieval_heads),
                           "file listing the retrieval heads; empty = RazorAttention off"));
    k.push_back(int_key("razor.sinks", field(&Config::razor, &RazorConfig::sinks), 0, kIntMax,
                        "sink tokens kept by non-retrieval heads"));
    k.push_back(int_key("razor.buffer_min", field(&Config::razor, &RazorConfig::buffer_min), 0, kIntMax,
                        "S0: recent buffer = max(buffer_min, tokens / buffer_ratio)"));
    k.push_back(int_key("razor.buffer_ratio", field(&Config::razor, &RazorConfig::buffer_ratio), 1, kIntMax,
                        "C: recent buffer = max(buffer_min, tokens / buffer_ratio)"));
    // quoka
    k.push_back(bool_key("quoka.enabled", field(&Config::quoka, &QuokaConfig::enabled),
                         "sparse prefill: each chunk attends a selection of the cache"));
    k.push_back(int_key("quoka.n_q", field(&Config::quoka, &QuokaConfig::n_q), 1, kIntMax,
                        "queries of a chunk that score the cache"));
    k.push_back(int_key("quoka.b_sa", field(&Config::quoka, &QuokaConfig::b_sa), 1, kIntMax,
                        "cached keys each chunk attends, besides sinks and the previous chunk",
                        ">= 1; when enabled, <= max_seq_len"));
    k.push_back(int_key("quoka.b_cp", field(&Config::quoka, &QuokaConfig::b_cp), 0, kIntMax,
                        "chunk length for QUOKA, tokens; 0 = chunk_size"));
    k.push_back(enum_key<Reduce>("quoka.query_reduce", field(&Config::quoka, &QuokaConfig::query_reduce),
                                 {{"max", Reduce::kMax}, {"mean", Reduce::kMean}}, 2, reduce_name,
                                 "combines key scores over the retained queries"));
    k.push_back(enum_key<Reduce>("quoka.head_reduce", field(&Config::quoka, &QuokaConfig::head_reduce),
                                 {{"max", Reduce::kMax}, {"mean", Reduce::kMean}}, 2, reduce_name,
                                 "combines key scores over the query heads of a kv group"));
    // h2o
    k.push_back(number_key("h2o.heavy_ratio", field(&Config::h2o, &H2OConfig::heavy_ratio), 0.0, 1.0,
                           "heavy hitters = floor(heavy_ratio * budget); the rest is the recent window"));
    k.push_back(with_default_doc(
        int_key("h2o.budget_tokens", field(&Config::h2o, &H2OConfig::budget_tokens), 0, kIntMax,
                "tokens kept per layer and kv head (heavy hitters + recent); 0 = as block selection",
                ">= 0; with policy h2o, the budget <= max_seq_len"),
        "`0` (= initial_len + second_select_num * block_size + local_windows_len)"));
    // model (longctx-chat)
    k.push_back(with_default_doc(
        string_key("model.path", field(&Config::model, &ModelConfig::path),
                   "GGUF model file, relative to the working directory; --model overrides it"),
        "`\"\"` (none: give `--model`)"));
    k.push_back(choice_string_key("model.chat_template", field(&Config::model, &ModelConfig::chat_template),
                                  {"auto", "raw", "llama2", "llama3", "chatml", "internlm2"},
                                  "prompt format; auto = from the GGUF's tokenizer.chat_template (raw when "
                                  "unknown); raw = the text as is"));
    k.push_back(choice_string_key("model.backend", field(&Config::model, &ModelConfig::backend),
                                  {"auto", "cpu", "cuda"},
                                  "device of the dense ops, the chunked prefill attention and the decode local "
                                  "window; auto = cuda when this build has CUDA and a GPU is present, else cpu; "
                                  "cuda = fail without one"));
    k.push_back(choice_string_key("model.weights", field(&Config::model, &ModelConfig::weights),
                                  {"native", "bf16", "f32"},
                                  "how the CPU backend keeps the weights: native = each tensor in its GGUF type "
                                  "(quantized blocks computed with int8 dot products), bf16 / f32 = converted at "
                                  "load (more memory, more bytes per token); the CUDA backend converts to its own "
                                  "dtype"));
    k.push_back(string_key("model.system_prompt", field(&Config::model, &ModelConfig::system_prompt),
                           "system message before the first user message; empty = none"));
    // sampling (longctx-chat)
    k.push_back(number_key("sampling.temperature", field(&Config::sampling, &SamplingConfig::temperature), 0.0,
                           100.0, "logits are divided by it before softmax; 0 = greedy (argmax, reproducible)"));
    k.push_back(int_key("sampling.top_k", field(&Config::sampling, &SamplingConfig::top_k), 0, kIntMax,
                        "keep only the top_k most probable tokens; 0 = every token"));
    k.push_back(number_key("sampling.top_p", field(&Config::sampling, &SamplingConfig::top_p), 0.0, 1.0,
                           "then keep the smallest most-probable set whose probability is >= top_p; 1 = off"));
    k.push_back(int_key("sampling.seed", field(&Config::sampling, &SamplingConfig::seed), 0,
                        std::numeric_limits<int64_t>::max(),
                        "random seed of sampling: the same seed gives the same answer", ">= 0"));
    k.push_back(int_key("sampling.max_tokens", field(&Config::sampling, &SamplingConfig::max_tokens), 1, kIntMax,
                        "tokens generated per answer at most (the answer also ends at end-of-generation)"));
    return k;
  }();
  return table;
}

const Key* find_key(std::string_view name) {
  for (const Key& key : keys()) {
    if (key.path == name || (!key.alias.empty() && key.alias == name)) return &key;
  }
  return nullptr;
}

}  // namespace longctx::config_detail
