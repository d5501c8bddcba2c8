// YAML configuration of the long-context engine.
//
// One table of key descriptors (keys()) and one table of combination rules
// (rules()) drive everything: parsing, range checks, the Markdown reference
// (docs/config.md) and config_to_yaml. A key is described once, here.
//
// Parsing happens in three steps: collect the settings (key -> YAML node and
// where it was written) from the file, let the overrides replace some of
// them, then convert every node into the struct and validate the result.
// An overridden file value is therefore never looked at.
#include "longctx/core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "longctx/core/error.h"

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

const char* pool_type_name(PoolType pool) {
  switch (pool) {
    case PoolType::kMax: return "max";
    case PoolType::kAvg: return "avg";
  }
  return "invalid";
}

int64_t h2o_budget_tokens(const LongContextConfig& config) {
  if (config.h2o.budget_tokens > 0) return config.h2o.budget_tokens;
  return int64_t{config.initial_len} + int64_t{config.second_select_num} * config.block_size +
         config.local_windows_len;
}

namespace {

using Config = LongContextConfig;

const char* budget_policy_name(BudgetConfig::Policy policy) {
  switch (policy) {
    case BudgetConfig::Policy::kUniform: return "uniform";
    case BudgetConfig::Policy::kAdaptive: return "adaptive";
  }
  return "invalid";
}

// representative_num when the key is absent: what the type keeps per block.
int default_representative_num(RepresentativeType type) {
  switch (type) {
    case RepresentativeType::kMax:
    case RepresentativeType::kMean: return 1;
    case RepresentativeType::kQuest: return 2;
    case RepresentativeType::kFix:
    case RepresentativeType::kDynamic: return 4;
  }
  return 1;
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  const auto not_space = text.find_first_not_of(" \t\r\n");
  if (not_space == std::string_view::npos) return {};
  return text.substr(not_space, text.find_last_not_of(" \t\r\n") - not_space + 1);
}

// ---- reading YAML values ---------------------------------------------------

// A value that cannot be used. The loader adds where it is and which key;
// `inner` points inside the value (an element of a list) when that is more precise.
struct BadValue {
  std::string problem;
  std::optional<YAML::Mark> inner;
};

[[noreturn]] void bad_value(std::string problem) { throw BadValue{std::move(problem), std::nullopt}; }

// In yaml-cpp a quoted scalar has the tag "!", a plain one "?".
bool is_quoted(const YAML::Node& node) { return node.Tag() == "!"; }

// A value as quoted in a message: a long one is cut, it came from an untrusted file.
std::string shown(std::string_view text) {
  constexpr size_t kMaxShown = 64;
  if (text.size() <= kMaxShown) return std::string(text);
  return str_cat(text.substr(0, kMaxShown), "... (", text.size(), " characters)");
}

// "'abc'", "the quoted string '12'", "a list", ...: what a value is, for messages.
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return "nothing";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: break;
  }
  return str_cat(is_quoted(node) ? "the quoted string '" : "'", shown(node.Scalar()), "'");
}

// The text of a scalar; `quoted_ok` says whether a quoted string is accepted.
std::string scalar_text(const YAML::Node& node, std::string_view expected, bool quoted_ok) {
  if (!node.IsScalar() || (!quoted_ok && is_quoted(node))) {
    bad_value(str_cat("expected ", expected, ", got ", describe(node)));
  }
  return node.Scalar();
}

std::string range_text(int64_t lo, int64_t hi, bool has_max) {
  return has_max ? str_cat(lo, "..", hi) : str_cat(">= ", lo);
}

// A plain decimal integer in lo..hi. Values beyond int64 are reported as out of
// range, like any other, without ever being stored.
int64_t read_integer(const YAML::Node& node, int64_t lo, int64_t hi, bool has_max) {
  const std::string text = scalar_text(node, "an integer", /*quoted_ok=*/false);
  std::string_view digits = text;
  if (digits.size() > 1 && digits[0] == '+' && digits[1] != '-') digits.remove_prefix(1);
  int64_t value = 0;
  const char* end = digits.data() + digits.size();
  const auto [stop, error] = std::from_chars(digits.data(), end, value);
  if (error == std::errc::invalid_argument || stop != end) {
    bad_value(str_cat("expected an integer, got ", describe(node)));
  }
  if (error == std::errc::result_out_of_range || value < lo || value > hi) {
    bad_value(str_cat("must be ", has_max ? "in " : "", range_text(lo, hi, has_max), ", got ", shown(text)));
  }
  return value;
}

double read_number(const YAML::Node& node) {
  const std::string text = scalar_text(node, "a number", /*quoted_ok=*/false);
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) bad_value(str_cat("expected a number, got ", describe(node)));
  return value;
}

// YAML 1.2 booleans only: "yes", "on" or 1 are rejected.
bool read_bool(const YAML::Node& node) {
  const std::string text = scalar_text(node, "true or false", /*quoted_ok=*/false);
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  bad_value(str_cat("expected true or false, got ", describe(node)));
}

// ---- byte counts (dram_budget) ---------------------------------------------

struct ByteUnit {
  std::string_view name;
  uint64_t bytes;
};
constexpr ByteUnit kByteUnits[] = {
    {"B", 1},
    {"KiB", uint64_t{1} << 10}, {"MiB", uint64_t{1} << 20},
    {"GiB", uint64_t{1} << 30}, {"TiB", uint64_t{1} << 40},
    {"KB", 1000}, {"MB", 1000 * 1000},
    {"GB", 1000 * 1000 * 1000}, {"TB", uint64_t{1000} * 1000 * 1000 * 1000},
};
constexpr std::string_view kByteUnitsHelp =
    "B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)";

[[noreturn]] void not_a_byte_count(const std::string& text) {
  bad_value(str_cat("expected a whole number of bytes with an optional unit (", kByteUnitsHelp,
                    ") or 'auto', got '", shown(text), "'"));
}

// "auto", 0, 123456, "256MiB", "4 GB" (units in any case); 0 means auto.
uint64_t read_bytes(const YAML::Node& node) {
  const std::string text = scalar_text(node, "a byte count", /*quoted_ok=*/true);
  const std::string_view spec = trim(text);
  if (lower(spec) == "auto") return 0;
  if (!spec.empty() && spec[0] == '-') bad_value(str_cat("must not be negative, got '", shown(text), "'"));
  uint64_t count = 0;
  const auto [stop, error] = std::from_chars(spec.data(), spec.data() + spec.size(), count);
  if (error == std::errc::invalid_argument) {
    not_a_byte_count(text);
  }
  const size_t digits = static_cast<size_t>(stop - spec.data());
  const std::string_view unit_text = trim(spec.substr(digits));
  if (!unit_text.empty() && !std::isalpha(static_cast<unsigned char>(unit_text[0]))) {
    not_a_byte_count(text);
  }
  uint64_t unit = 1;
  if (!unit_text.empty()) {
    const auto* found = std::find_if(std::begin(kByteUnits), std::end(kByteUnits),
                                     [&](const ByteUnit& u) { return lower(u.name) == lower(unit_text); });
    if (found == std::end(kByteUnits)) {
      bad_value(str_cat("unknown unit '", shown(unit_text), "' in '", shown(text), "'; use ",
                        kByteUnitsHelp));
    }
    unit = found->bytes;
  }
  if (error == std::errc::result_out_of_range || count > std::numeric_limits<uint64_t>::max() / unit) {
    bad_value(str_cat("'", shown(text), "' is more than 2^64-1 bytes"));
  }
  return count * unit;
}

// The largest binary unit that divides the count exactly: "256MiB", "1000".
std::string bytes_yaml(uint64_t bytes) {
  if (bytes == 0) return "auto";
  for (int i = 4; i >= 1; --i) {
    if (bytes % kByteUnits[i].bytes == 0) return str_cat(bytes / kByteUnits[i].bytes, kByteUnits[i].name);
  }
  return std::to_string(bytes);
}

// ---- writing YAML values ---------------------------------------------------

// A double-quoted YAML scalar that reads back as exactly `text`.
std::string yaml_quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[byte >> 4];
      out += hex[byte & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double.
std::string number_yaml(double value) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, result.ptr);
}

// ---- the key table -----------------------------------------------------------

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

struct Key {
  std::string path;         // "block_size", or "budget.alpha" inside a section
  std::string alias;        // KTransformers' other spelling, or empty
  std::string type;         // for the reference: "integer", "bool", ...
  std::string values;       // allowed range or values, for the reference
  std::string meaning;      // one line: the reference and config_to_yaml's comment
  std::string default_doc;  // the reference's default when it is not config_to_yaml's text
  std::function<void(const YAML::Node&, Config&)> parse;  // throws BadValue
  std::function<std::string(const Config&)> check;        // empty, or what is wrong
  std::function<std::string(const Config&)> emit;         // the value as YAML text
};

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
  key.values = "f32, f16, bf16 (any case; also fp32, fp16, float32, float16, bfloat16)";
  key.meaning = "storage dtype of the KV store";
  key.parse = [](const YAML::Node& node, Config& c) {
    const std::string text = scalar_text(node, "a dtype", /*quoted_ok=*/true);
    const std::optional<DType> dtype = parse_dtype(text);
    if (!dtype) bad_value(str_cat("expected one of f32, f16, bf16, got ", describe(node)));
    c.kv_type = *dtype;
  };
  key.check = [](const Config& c) -> std::string {
    if (c.kv_type == DType::kF32 || c.kv_type == DType::kF16 || c.kv_type == DType::kBF16) return {};
    return str_cat("must be one of f32, f16, bf16, got dtype code ", static_cast<int>(c.kv_type));
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

// The maps that hold longctx's own settings; every other key is top level.
struct Section {
  std::string_view name;   // "" for the top level
  std::string_view title;  // heading in the reference
};
constexpr Section kSections[] = {
    {"", "Top level: KTransformers' long-context keys and longctx's own"},
    {"preselect", "`preselect`: SnapKV-style preselection (with `preselect_block`)"},
    {"budget", "`budget`: per-kv-head block budgets (Ada-KV)"},
    {"razor", "`razor`: retrieval heads (RazorAttention)"},
    {"quoka", "`quoka`: sparse prefill (QUOKA)"},
    {"h2o", "`h2o`: the H2O baseline (`policy: h2o`)"},
    {"model", "`model`: the model file and its chat template (longctx-chat)"},
    {"sampling", "`sampling`: how longctx-chat picks each token"},
};

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
                        "context blocks selected per step",
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
    k.push_back(enum_key<Reduce>("gqa_reduce", field(&Config::gqa_reduce),
                                 {{"sum", Reduce::kSum}, {"max", Reduce::kMax}}, 2, reduce_name,
                                 "combines the block scores of a GQA group's query heads"));
    k.push_back(enum_key<Reduce>("dynamic_reduce", field(&Config::dynamic_reduce),
                                 {{"max", Reduce::kMax}, {"mean", Reduce::kMean}}, 2, reduce_name,
                                 "DYNAMIC: combines q.k over the representatives (mean = InfLLM)"));
    k.push_back(numa_key());
    k.push_back(dram_budget_key());
    // preselect
    k.push_back(int_key("preselect.window", field(&Config::preselect, &PreselectConfig::window), 1, kIntMax,
                        "last prompt queries that vote for earlier tokens"));
    k.push_back(odd_int_key("preselect.pool_kernel", field(&Config::preselect, &PreselectConfig::pool_kernel), 1,
                            kIntMax, "pooling window of the votes, tokens (stride 1, padding kernel / 2)",
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

// ---- combination rules -----------------------------------------------------

struct Rule {
  std::vector<std::string_view> keys;  // involved keys; the first is named when none was written
  std::string doc;                     // for the reference
  std::function<std::string(const Config&)> problem;  // empty, or what is wrong
};

std::string representative_num_problem(const Config& c) {
  const char* type = representative_type_name(c.representative_type);
  const int num = c.representative_num;
  switch (c.representative_type) {
    case RepresentativeType::kMax:
    case RepresentativeType::kMean:
      if (num == 1) return {};
      return str_cat(type, " keeps one representative per block; representative_num must be 1, got ", num);
    case RepresentativeType::kQuest:
      if (num == 2) return {};
      return str_cat("QUEST keeps two representatives (channel-wise min and max); "
                     "representative_num must be 2, got ", num);
    case RepresentativeType::kFix:
    case RepresentativeType::kDynamic:
      if (num >= 1 && num <= c.block_size) return {};
      return str_cat(type, " keeps representative_num keys of a block of block_size = ", c.block_size,
                     " tokens; representative_num must be in 1..", c.block_size, ", got ", num);
  }
  return {};  // an invalid type is reported by its own key
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = [] {
    std::vector<Rule> r;
    r.push_back({{"local_windows_len", "max_seq_len"},
                 "`local_windows_len` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   if (c.local_windows_len <= c.max_seq_len) return {};
                   return str_cat("the local window (local_windows_len = ", c.local_windows_len,
                                  ") is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"initial_len", "local_windows_len", "max_seq_len"},
                 "`initial_len` + `local_windows_len` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t always = int64_t{c.initial_len} + c.local_windows_len;
                   if (always <= c.max_seq_len) return {};
                   return str_cat("initial_len + local_windows_len = ", c.initial_len, " + ",
                                  c.local_windows_len, " = ", always, " tokens is larger than max_seq_len (",
                                  c.max_seq_len, ")");
                 }});
    r.push_back({{"second_select_num", "block_size", "max_seq_len"},
                 "`second_select_num` * `block_size` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t tokens = int64_t{c.second_select_num} * c.block_size;
                   if (tokens <= c.max_seq_len) return {};
                   return str_cat("selection larger than what exists: second_select_num * block_size = ",
                                  c.second_select_num, " * ", c.block_size, " = ", tokens,
                                  " tokens is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"preselect_block_count", "preselect_block", "block_size", "max_seq_len"},
                 "with `preselect_block`: `preselect_block_count` * `block_size` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t tokens = int64_t{c.preselect_block_count} * c.block_size;
                   if (!c.preselect_block || tokens <= c.max_seq_len) return {};
                   return str_cat("preselection larger than what exists: preselect_block_count * block_size = ",
                                  c.preselect_block_count, " * ", c.block_size, " = ", tokens,
                                  " tokens is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"representative_num", "representative_type", "block_size"},
                 "`representative_num` is 1 for MAX and MEAN, 2 for QUEST, 1..`block_size` for FIX "
                 "and DYNAMIC",
                 representative_num_problem});
    r.push_back({{"preselect_block", "policy"},
                 "`preselect_block` only with `policy: select` or `dense` (StreamingLLM and H2O choose "
                 "their own tokens)",
                 [](const Config& c) -> std::string {
                   const bool own_tokens = c.policy == SelectionPolicy::kStreaming || c.policy == SelectionPolicy::kH2O;
                   if (!c.preselect_block || !own_tokens) return {};
                   return str_cat("policy ", selection_policy_name(c.policy),
                                  " chooses its own tokens and cannot use preselect_block: true; set "
                                  "preselect_block: false or policy: select");
                 }});
    r.push_back({{"h2o.budget_tokens", "policy", "initial_len", "second_select_num", "block_size",
                  "local_windows_len", "max_seq_len"},
                 "with `policy: h2o`: the H2O budget (`h2o.budget_tokens`, or its default) <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t budget = h2o_budget_tokens(c);
                   if (c.policy != SelectionPolicy::kH2O || budget <= c.max_seq_len) return {};
                   return str_cat("H2O cannot keep more tokens than exist: its budget (", budget, " tokens",
                                  c.h2o.budget_tokens == 0
                                      ? str_cat(" = initial_len + second_select_num * block_size + local_windows_len")
                                      : std::string(),
                                  ") is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"quoka.b_sa", "quoka.enabled", "max_seq_len"},
                 "with `quoka.enabled`: `quoka.b_sa` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   if (!c.quoka.enabled || c.quoka.b_sa <= c.max_seq_len) return {};
                   return str_cat("QUOKA cannot keep more cached keys than exist: quoka.b_sa (", c.quoka.b_sa,
                                  ") is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    return r;
  }();
  return table;
}

// ---- where settings come from ------------------------------------------------

// Where a key was written, for messages.
struct Origin {
  std::string place;    // "FILE:LINE:COL" of the value, or "override 'k=v'"
  std::string spelled;  // the key as written (an alias stays an alias)
  int64_t order = 0;    // written later = larger; overrides come after the file
};

// One key's value before conversion.
struct Setting {
  const Key* key = nullptr;
  YAML::Node value;
  Origin origin;
  std::string source;  // the file, for marks inside the value; empty for overrides
};

// Settings and origins by canonical key path.
using Settings = std::map<std::string, Setting, std::less<>>;
using Origins = std::map<std::string, Origin, std::less<>>;

std::string place(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return str_cat(source, ":1:1");
  return str_cat(source, ":", mark.line + 1, ":", mark.column + 1);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean 'block_size'?)" for a close key, else "". A key's name
// without its section counts as one edit away ("alpha" -> "budget.alpha").
std::string suggestion(std::string_view name) {
  const std::string typed = lower(name);
  size_t best = std::max<size_t>(2, typed.size() / 3) + 1;
  std::string best_name;
  const auto consider = [&](const std::string& candidate) {
    if (candidate.empty()) return;
    size_t distance = edit_distance(typed, candidate);
    const size_t dot = candidate.find('.');
    if (dot != std::string::npos) {
      distance = std::min(distance, edit_distance(typed, std::string_view(candidate).substr(dot + 1)) + 1);
    }
    if (distance < best) {
      best = distance;
      best_name = candidate;
    }
  };
  for (const Key& key : keys()) {
    consider(key.path);
    consider(key.alias);
  }
  return best_name.empty() ? std::string() : str_cat(" (did you mean '", best_name, "'?)");
}

// Records one `name: value` pair of the file.
void add_file_setting(const std::string& name, const YAML::Node& key_node, const YAML::Node& value,
                      const std::string& source, Settings& settings) {
  const Key* key = find_key(name);
  if (key == nullptr) {
    fail(ErrorCode::kConfig, place(source, key_node.Mark()), ": unknown key '", shown(name), "'",
         suggestion(name));
  }
  if (const auto it = settings.find(key->path); it != settings.end()) {
    const std::string& first = it->second.origin.spelled;
    if (first == name) {
      fail(ErrorCode::kConfig, place(source, key_node.Mark()), ": key '", name, "' is given twice (also at ",
           it->second.origin.place, ")");
    }
    fail(ErrorCode::kConfig, place(source, key_node.Mark()), ": keys '", first, "' and '", name,
         "' are both given; they are two names of one setting, keep one");
  }
  Setting setting;
  setting.key = key;
  setting.value = value;
  // A missing value (`key:`) has no useful mark of its own: point at the key.
  setting.origin.place = place(source, value.IsNull() ? key_node.Mark() : value.Mark());
  setting.origin.spelled = name;
  setting.origin.order = key_node.Mark().pos;
  setting.source = source;
  settings.emplace(key->path, std::move(setting));
}

std::string key_name(const YAML::Node& key_node, const std::string& source) {
  if (!key_node.IsScalar()) {
    fail(ErrorCode::kConfig, place(source, key_node.Mark()), ": expected a key name, got ",
         describe(key_node));
  }
  return key_node.Scalar();
}

void read_file_settings(const std::string& yaml_text, const std::string& source, Settings& settings) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    fail(ErrorCode::kConfig, place(source, e.mark), ": YAML syntax error: ", e.msg);
  }
  // A second document would be silently ignored by a reader of the first.
  for (size_t i = 1; i < documents.size(); ++i) {
    if (!documents[i].IsNull()) {
      fail(ErrorCode::kConfig, place(source, documents[i].Mark()),
           ": a config is one YAML document; this is a second one (remove the '---' before it)");
    }
  }
  if (documents.empty() || documents[0].IsNull()) return;  // an empty file: every default
  const YAML::Node& root = documents[0];
  if (!root.IsMap()) {
    fail(ErrorCode::kConfig, place(source, root.Mark()),
         ": the top level must be a map of keys (key: value), got ", describe(root));
  }
  std::set<std::string> sections_seen;
  for (const auto& entry : root) {
    const std::string name = key_name(entry.first, source);
    if (!is_section(name)) {
      // "budget.alpha: 0.3" at the top level: the dotted form is for overrides only.
      if (name.find('.') != std::string::npos && find_key(name) != nullptr) {
        fail(ErrorCode::kConfig, place(source, entry.first.Mark()), ": key '", name,
             "' must be written inside its section: '", section_of(name), ":' then '  ",
             name.substr(name.find('.') + 1), ": ...'");
      }
      add_file_setting(name, entry.first, entry.second, source, settings);
      continue;
    }
    if (!sections_seen.insert(name).second) {
      fail(ErrorCode::kConfig, place(source, entry.first.Mark()), ": section '", name, "' is given twice");
    }
    if (entry.second.IsNull()) continue;  // `budget:` with nothing under it
    if (!entry.second.IsMap()) {
      fail(ErrorCode::kConfig, place(source, entry.second.Mark()), ": key '", name, "': expected a map of ",
           name, ".* keys, got ", describe(entry.second));
    }
    for (const auto& inner : entry.second) {
      add_file_setting(str_cat(name, ".", key_name(inner.first, source)), inner.first, inner.second, source,
                       settings);
    }
  }
}

// "key=value" or "section.key=value"; replaces whatever the file said.
void read_override(const std::string& text, size_t index, Settings& settings) {
  const std::string where = str_cat("override '", shown(text), "'");
  const size_t equals = text.find('=');
  if (equals == std::string::npos) {
    fail(ErrorCode::kConfig, where, ": expected key=value or section.key=value");
  }
  const std::string name(trim(std::string_view(text).substr(0, equals)));
  if (is_section(name)) {
    fail(ErrorCode::kConfig, where, ": key '", name, "' is a section; override its keys one by one, as '",
         name, ".KEY=VALUE'");
  }
  const Key* key = find_key(name);
  if (key == nullptr) fail(ErrorCode::kConfig, where, ": unknown key '", shown(name), "'", suggestion(name));
  Setting setting;
  setting.key = key;
  try {
    setting.value = YAML::Load(text.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    fail(ErrorCode::kConfig, where, ": key '", name, "': YAML syntax error in the value: ", e.msg);
  }
  setting.origin = {where, name, std::numeric_limits<int64_t>::max() / 2 + static_cast<int64_t>(index)};
  settings.insert_or_assign(key->path, std::move(setting));
}

// Throws Error(kConfig) for `problem`, naming the involved key written last
// (and where), or the first involved key when none was written.
[[noreturn]] void fail_for(const std::vector<std::string_view>& involved, const std::string& problem,
                           const Origins* origins) {
  const Origin* latest = nullptr;
  if (origins != nullptr) {
    for (const std::string_view name : involved) {
      const auto it = origins->find(name);
      if (it == origins->end()) continue;
      if (latest == nullptr || it->second.order > latest->order) latest = &it->second;
    }
  }
  if (latest != nullptr) fail(ErrorCode::kConfig, latest->place, ": key '", latest->spelled, "': ", problem);
  fail(ErrorCode::kConfig, "key '", involved.front(), "': ", problem);
}

void check_config(const Config& config, const Origins* origins) {
  for (const Key& key : keys()) {
    if (const std::string problem = key.check(config); !problem.empty()) {
      fail_for({key.path}, problem, origins);
    }
  }
  for (const Rule& rule : rules()) {
    if (const std::string problem = rule.problem(config); !problem.empty()) {
      fail_for(rule.keys, problem, origins);
    }
  }
}

// Markdown table cell: a '|' would end the cell.
std::string cell(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

LongContextConfig parse_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  Settings settings;
  read_file_settings(yaml_text, source, settings);
  for (size_t i = 0; i < overrides.size(); ++i) read_override(overrides[i], i, settings);

  // Convert in the order the settings were written, so the first bad one is reported.
  std::vector<const Setting*> in_order;
  for (const auto& [path, setting] : settings) in_order.push_back(&setting);
  std::sort(in_order.begin(), in_order.end(),
            [](const Setting* a, const Setting* b) { return a->origin.order < b->origin.order; });

  LongContextConfig config;
  Origins origins;
  for (const Setting* setting : in_order) {
    try {
      setting->key->parse(setting->value, config);
    } catch (const BadValue& bad) {
      const std::string where = bad.inner && !setting->source.empty() ? place(setting->source, *bad.inner)
                                                                      : setting->origin.place;
      fail(ErrorCode::kConfig, where, ": key '", setting->origin.spelled, "': ", bad.problem);
    }
    origins.emplace(setting->key->path, setting->origin);
  }
  if (!settings.contains("representative_num")) {
    config.representative_num = default_representative_num(config.representative_type);
  }
  check_config(config, &origins);
  return config;
}

LongContextConfig load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    fail(ErrorCode::kIo, "cannot read config file '", path, "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kIo, "cannot read config file '", path, "': ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(ErrorCode::kIo, "cannot read config file '", path, "': read failed");
  return parse_config(text.str(), path, overrides);
}

void validate_config(const LongContextConfig& config) { check_config(config, nullptr); }

std::string config_to_yaml(const LongContextConfig& config) {
  // "key: value" lines with their meaning as a comment, aligned.
  struct Line {
    std::string text, comment;
  };
  std::vector<Line> lines;
  for (const Section& section : kSections) {
    if (!section.name.empty()) lines.push_back({str_cat(section.name, ":"), ""});
    for (const Key& key : keys()) {
      if (section_of(key.path) != section.name) continue;
      const std::string leaf = section.name.empty() ? key.path : key.path.substr(section.name.size() + 1);
      lines.push_back({str_cat(section.name.empty() ? "" : "  ", leaf, ": ", key.emit(config)), key.meaning});
    }
  }
  size_t width = 0;
  for (const Line& line : lines) width = std::max(width, line.text.size());
  std::string out;
  for (const Line& line : lines) {
    out += line.text;
    if (!line.comment.empty()) {
      out += str_cat(std::string(width - line.text.size() + 2, ' '), "# ", line.comment);
    }
    out += '\n';
  }
  return out;
}

std::string config_reference_markdown() {
  const Config defaults;
  std::string md =
      "# Configuration reference\n"
      "\n"
      "<!-- Generated by config_reference_markdown() in core/src/config.cpp; do not edit by hand.\n"
      "     Regenerate: LONGCTX_REGENERATE_DOCS=1 build/bin/longctx_core_tests --gtest_filter='ConfigDocs.*' -->\n"
      "\n"
      "A longctx configuration is one YAML map (see `configs/`). The keys of KTransformers'\n"
      "long-context mode are flat at the top level; longctx's own settings for preselection,\n"
      "adaptive budgets, RazorAttention, QUOKA and the H2O baseline live in the maps\n"
      "`preselect`, `budget`, `razor`, `quoka` and `h2o`; `longctx-chat`'s model and sampling\n"
      "settings in `model` and `sampling` (the engine ignores them).\n"
      "Every key is optional: an empty file gives every default below. `configs/default.yaml`\n"
      "lists every key with its default.\n"
      "\n"
      "Loading rejects, with `Error(kConfig)`, an unknown key, a value of the wrong type, a\n"
      "value out of range and an impossible combination of values. The message names the\n"
      "file, the line and column (1-based) and the key:\n"
      "\n"
      "```\n"
      "configs/x.yaml:3:13: key 'block_size': expected an integer, got 'abc'\n"
      "configs/x.yaml:2:1: unknown key 'blok_size' (did you mean 'block_size'?)\n"
      "```\n"
      "\n"
      "Integers are plain decimal integers (`1.5` and `\"128\"` are rejected), booleans are\n"
      "`true` or `false`, enum values are matched in any case.\n"
      "\n"
      "Overrides, as from a command line (`longctx-info --config FILE --set KEY=VALUE`), are\n"
      "`key=value` or `section.key=value` strings applied on top of the file before\n"
      "validation; the value is parsed as YAML (`numa=[0, 1]`). Errors in an override name it:\n"
      "`override 'block_size=0': key 'block_size': must be in 1..1024, got 0`.\n";
  for (const Section& section : kSections) {
    md += str_cat("\n## ", section.title, "\n\n");
    md += "| Key | Type | Default | Values | Meaning |\n";
    md += "|---|---|---|---|---|\n";
    for (const Key& key : keys()) {
      if (section_of(key.path) != section.name) continue;
      const std::string name = key.alias.empty() ? str_cat("`", key.path, "`")
                                                 : str_cat("`", key.path, "` (alias `", key.alias, "`)");
      const std::string default_text =
          key.default_doc.empty() ? str_cat("`", key.emit(defaults), "`") : key.default_doc;
      md += str_cat("| ", name, " | ", key.type, " | ", cell(default_text), " | ", cell(key.values), " | ",
                    cell(key.meaning), " |\n");
    }
  }
  md += "\n## Combinations that are rejected\n\n";
  for (const Rule& rule : rules()) md += str_cat("- ", rule.doc, "\n");
  md +=
      "\nA combination error points at the involved key written last, e.g.\n"
      "`x.yaml:4:20: key 'local_windows_len': the local window (local_windows_len = 8192) is\n"
      "larger than max_seq_len (4096)`. `anchor_type` and `representative_type` (and\n"
      "`anchor_num` and `representative_num`) are two names of one setting: give one.\n";
  return md;
}

}  // namespace longctx
