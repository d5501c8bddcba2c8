// Reading and writing YAML scalars for the config loader: integers, numbers,
// booleans, byte counts, quoted strings; a value that cannot be used throws
// BadValue (config_internal.h).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <iterator>
#include <limits>
#include <string>

#include "config_internal.h"
#include "longctx/core/error.h"

namespace longctx::config_detail {

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

[[noreturn]] void bad_value(std::string problem) { throw BadValue{std::move(problem), std::nullopt}; }

namespace {

// In yaml-cpp a quoted scalar has the tag "!", a plain one "?".
bool is_quoted(const YAML::Node& node) { return node.Tag() == "!"; }

}  // namespace

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
  // Without an upper bound, "must be >= 1, got 99999999999999999999" would not say what is wrong.
  if (error == std::errc::result_out_of_range && !has_max && digits[0] != '-')
    bad_value(str_cat("must be ", range_text(lo, hi, has_max), " and fit a 64-bit integer, got ", shown(text)));
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
  if (error == std::errc::invalid_argument || stop != end)
    bad_value(str_cat("expected a number, got ", describe(node)));
  if (error == std::errc::result_out_of_range)
    bad_value(str_cat("got ", shown(text), ", beyond a double's range (magnitudes from about 1e-308 to 1e308, or 0)"));
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

namespace {

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

[[noreturn]] void not_a_byte_count(const std::string& text) {
  bad_value(str_cat("expected a whole number of bytes with an optional unit (", kByteUnitsHelp,
                    ") or 'auto', got '", shown(text), "'"));
}

}  // namespace

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

}  // namespace longctx::config_detail

namespace longctx {

uint64_t parse_byte_count(const std::string& text, const std::string& what) {
  if (config_detail::lower(config_detail::trim(text)) == "auto") fail(ErrorCode::kInvalidArgument, what, ": expected a byte count, got 'auto'");
  try {
    return config_detail::read_bytes(YAML::Node(text));
  } catch (const config_detail::BadValue& e) {
    fail(ErrorCode::kInvalidArgument, what, ": ", e.problem);
  }
}

}  // namespace longctx
