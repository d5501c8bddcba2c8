// Loading a config: the settings (key -> YAML node and where it was written)
// from the file, then the overrides, converted in the order written and
// checked, every error naming FILE:LINE:COL and the key; and config_to_yaml.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/eventhandler.h>

#include "config_internal.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"

namespace longctx {

using namespace config_detail;

namespace {

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

// ---- where settings come from ------------------------------------------------

// One key's value before conversion.
struct Setting {
  const Key* key = nullptr;
  YAML::Node value;
  Origin origin;
  std::string source;  // the file, for marks inside the value; empty for overrides
};

// Settings by canonical key path.
using Settings = std::map<std::string, Setting, std::less<>>;

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

// Where a document starts and where its first value is (none: empty).
struct DocumentScan : YAML::EventHandler {
  YAML::Mark start;
  std::optional<YAML::Mark> first_value;
  void OnDocumentStart(const YAML::Mark& mark) override {
    start = mark;
    first_value.reset();
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { saw(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    saw(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    saw(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    saw(mark);
  }
  void OnMapEnd() override {}
  void saw(const YAML::Mark& mark) {
    if (!first_value) first_value = mark;
  }
};

// The first YAML document of the text (null if it is empty). Not
// YAML::LoadAll: yaml-cpp 0.7's never returns on text such as a lone ','
// (each round yields an empty document without consuming the token, until
// memory runs out; yaml-cpp issue #1040), so the documents are walked here
// and one that does not advance is a syntax error.
YAML::Node first_document(const std::string& yaml_text, const std::string& source) {
  try {
    std::istringstream in(yaml_text);
    YAML::Parser parser(in);
    DocumentScan doc;
    std::optional<YAML::Mark> previous_start;
    for (int index = 0; parser.HandleNextDocument(doc); ++index) {
      if (previous_start && doc.start.pos == previous_start->pos) {
        std::string_view rest = std::string_view(yaml_text).substr(std::min(size_t(doc.start.pos), yaml_text.size()));
        rest = rest.substr(0, rest.find('\n'));
        fail(ErrorCode::kConfig, place(source, doc.start), ": YAML syntax error: cannot read a value from '",
             shown(rest), "'");
      }
      // A second document would be silently ignored by a reader of the first.
      if (index > 0 && doc.first_value) {
        fail(ErrorCode::kConfig, place(source, *doc.first_value),
             ": a config is one YAML document; this is a second one (remove the '---' before it)");
      }
      previous_start = doc.start;
    }
    return YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail(ErrorCode::kConfig, place(source, e.mark), ": YAML syntax error: ", e.msg);
  }
}

void read_file_settings(const std::string& yaml_text, const std::string& source, Settings& settings) {
  const YAML::Node root = first_document(yaml_text, source);
  if (root.IsNull()) return;  // an empty file: every default
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
  // Configs are a few KiB: a larger file is something else given by mistake
  // (a model as --config), which would otherwise be read whole into memory.
  constexpr size_t kMaxConfigBytes = size_t(1) << 20;
  std::vector<std::byte> bytes;
  try {
    bytes = read_file(path, kMaxConfigBytes);
  } catch (const Error& e) {
    fail(ErrorCode::kIo, "cannot read config file: ", e.what());
  }
  return parse_config(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path, overrides);
}

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

}  // namespace longctx
