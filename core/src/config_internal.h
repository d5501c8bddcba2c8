// Internals of the config loader, shared by core/src/config*.cpp (the
// overview is at the top of config.cpp). Private to core/src.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/config.h"

namespace longctx::config_detail {

using Config = LongContextConfig;

// ---- YAML values (config_values.cpp) --------------------------------------------

// A value that cannot be used. The loader adds where it is and which key;
// `inner` points inside the value (an element of a list) when that is more precise.
struct BadValue {
  std::string problem;
  std::optional<YAML::Mark> inner;
};

[[noreturn]] void bad_value(std::string problem);
std::string lower(std::string_view text);
std::string_view trim(std::string_view text);
std::string shown(std::string_view text);
std::string describe(const YAML::Node& node);
std::string scalar_text(const YAML::Node& node, std::string_view expected, bool quoted_ok);
std::string range_text(int64_t lo, int64_t hi, bool has_max);
int64_t read_integer(const YAML::Node& node, int64_t lo, int64_t hi, bool has_max);
double read_number(const YAML::Node& node);
bool read_bool(const YAML::Node& node);

inline constexpr std::string_view kByteUnitsHelp =
    "B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)";

uint64_t read_bytes(const YAML::Node& node);
std::string bytes_yaml(uint64_t bytes);
std::string yaml_quote(std::string_view text);
std::string number_yaml(double value);

// ---- the key table (config_keys.cpp) ---------------------------------------------

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

// The maps that hold longctx's own settings; every other key is top level.
struct Section {
  std::string_view name;   // "" for the top level
  std::string_view title;  // heading in the reference
};

inline constexpr Section kSections[] = {
    {"", "Top level: KTransformers' long-context keys and longctx's own"},
    {"preselect", "`preselect`: SnapKV-style preselection (with `preselect_block`)"},
    {"budget", "`budget`: per-kv-head block budgets (Ada-KV)"},
    {"razor", "`razor`: retrieval heads (RazorAttention)"},
    {"quoka", "`quoka`: sparse prefill (QUOKA)"},
    {"h2o", "`h2o`: the H2O baseline (`policy: h2o`)"},
    {"model", "`model`: the model file and its chat template (longctx-chat)"},
    {"sampling", "`sampling`: how longctx-chat picks each token"},
};

bool is_section(std::string_view name);
std::string_view section_of(std::string_view path);
const std::vector<Key>& keys();
const Key* find_key(std::string_view name);  // by path or alias

// ---- combination rules and checks (config_validate.cpp) ---------------------------

struct Rule {
  std::vector<std::string_view> keys;  // involved keys; the first is named when none was written
  std::string doc;                     // for the reference
  std::function<std::string(const Config&)> problem;  // empty, or what is wrong
};

const std::vector<Rule>& rules();

// Where a key was written, for messages.
struct Origin {
  std::string place;    // "FILE:LINE:COL" of the value, or "override 'k=v'"
  std::string spelled;  // the key as written (an alias stays an alias)
  int64_t order = 0;    // written later = larger; overrides come after the file
};

// Origins by canonical key path.
using Origins = std::map<std::string, Origin, std::less<>>;

// Throws Error(kConfig) for the first key out of range, then the first rule
// broken; `origins` (may be null) says where each key was written.
void check_config(const Config& config, const Origins* origins);

}  // namespace longctx::config_detail
