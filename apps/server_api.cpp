#include "server_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "chat_output.h"
#include "longctx/core/error.h"

namespace longctx::server {
namespace {

using json = nlohmann::json;

const char* error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 503) return "server_overloaded";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

const char* type_name(const json& v) { return v.type_name(); }

bool get_bool(const json& body, const char* key, bool fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_boolean()) bad(key, str_cat("'", key, "' must be a boolean, got ", type_name(body[key])));
  return body[key].get<bool>();
}

double get_number(const json& body, const char* key, double fallback, double lo, double hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number()) bad(key, str_cat("'", key, "' must be a number, got ", type_name(body[key])));
  const double v = body[key].get<double>();
  if (!(v >= lo && v <= hi)) bad(key, str_cat("'", key, "' is ", v, "; it must be in [", lo, ", ", hi, "]"));
  return v;
}

int64_t get_integer(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& v = body[key];
  if (!v.is_number_integer())
    bad(key, str_cat("'", key, "' must be an integer, got ", v.is_number() ? json_text(v) : type_name(v)));
  // Unsigned values above int64 come out negative from get<int64_t>: compare as what they are.
  const bool in_range = v.is_number_unsigned()
                            ? v.get<uint64_t>() <= uint64_t(hi) && (lo <= 0 || v.get<uint64_t>() >= uint64_t(lo))
                            : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!in_range)
    bad(key, str_cat("'", key, "' is ", json_text(v), "; it must be in [", lo, ", ", hi, "]"));
  return v.get<int64_t>();
}

// A message's content: a string, or OpenAI's array of {"type": "text", "text": ...} parts.
std::string message_content(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(param, str_cat("'", param, "' must be a string or an array of text parts, got ",
                                              type_name(content)));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = str_cat(param, "[", i, "]");
    const bool text_part = part.is_object() && part.contains("type") && part["type"] == "text" &&
                           part.contains("text") && part["text"].is_string();
    if (!text_part)
      bad(where, str_cat("'", where, "' must be {\"type\": \"text\", \"text\": \"...\"} (only text is supported)"));
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::string json_text(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(int status, const std::string& message, const std::string& param) {
  json error = {{"message", message}, {"type", error_type(status)}, {"code", nullptr}};
  error["param"] = param.empty() ? json(nullptr) : json(param);
  return json_text(json{{"error", error}});
}

CompletionRequest parse_completion_request(std::string_view text, bool chat, const RequestLimits& limits) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::parse_error& e) {
    bad("", str_cat("malformed JSON at byte ", e.byte, ": ", e.what()));
  } catch (const json::exception& e) {  // valid syntax it cannot hold, e.g. a number past a double
    bad("", str_cat("unreadable JSON: ", e.what()));
  }
  if (!body.is_object()) bad("", str_cat("the request body must be a JSON object, got ", type_name(body)));

  CompletionRequest r;
  r.chat = chat;
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) bad("model", str_cat("'model' must be a string, got ", type_name(body["model"])));
    const std::string model = body["model"].get<std::string>();
    if (model != limits.model_id)
      throw ApiError(404, str_cat("the model '", model, "' does not exist; this server serves '", limits.model_id,
                                  "' (GET /v1/models)"),
                     "model");
  }
  if (chat) {
    if (!body.contains("messages")) bad("messages", "'messages' is required");
    const json& messages = body["messages"];
    if (!messages.is_array()) bad("messages", str_cat("'messages' must be an array, got ", type_name(messages)));
    if (messages.empty()) bad("messages", "'messages' is empty: give at least one message");
    for (size_t i = 0; i < messages.size(); ++i) {
      const json& m = messages[i];
      const std::string where = str_cat("messages[", i, "]");
      if (!m.is_object()) bad(where, str_cat("'", where, "' must be an object, got ", type_name(m)));
      if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role", str_cat("'", where, ".role' must be a string"));
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer")
        bad(where + ".role", str_cat("'", where, ".role' is '", role, "'; it must be system, user or assistant"));
      if (!m.contains("content") || m["content"].is_null())
        bad(where + ".content", str_cat("'", where, ".content' is required"));
      r.messages.push_back({role == "developer" ? "system" : role, message_content(m["content"], where + ".content")});
    }
  } else {
    if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
    const json& prompt = body["prompt"];
    if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) r.prompt = prompt[0].get<std::string>();
    else if (prompt.is_string()) r.prompt = prompt.get<std::string>();
    else bad("prompt", "'prompt' must be a string (or an array of one string)");
    if (r.prompt.empty()) bad("prompt", "'prompt' is empty");
  }
  if (get_integer(body, "n", 1, 1, 1) != 1) bad("n", "'n' must be 1");
  r.stream = get_bool(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    if (!body["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = get_bool(body["stream_options"], "include_usage", false);
  }
  // max_completion_tokens is the newer name of max_tokens (null: not given).
  const bool newer = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null();
  const char* max_key = newer ? "max_completion_tokens" : "max_tokens";
  r.max_tokens = get_integer(body, max_key, std::min<int64_t>(limits.defaults.max_tokens, limits.max_seq_len), 1,
                             limits.max_seq_len);
  r.temperature = get_number(body, "temperature", limits.defaults.temperature, 0.0, 2.0);
  r.top_p = get_number(body, "top_p", limits.defaults.top_p, 0.0, 1.0);
  r.top_k = int(get_integer(body, "top_k", limits.defaults.top_k, 0, std::numeric_limits<int>::max()));
  r.seed = uint64_t(get_integer(body, "seed", limits.defaults.seed, std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max()));
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& stop = body["stop"];
    if (stop.is_string()) {
      r.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array() && stop.size() <= 4) {
      for (const json& s : stop) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or an array of up to 4 strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of up to 4 strings");
    }
    if (std::any_of(r.stop.begin(), r.stop.end(), [](const std::string& s) { return s.empty(); }))
      bad("stop", "'stop' strings must not be empty");
  }
  return r;
}

std::string StopFilter::push(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  size_t first_stop = std::string::npos;
  for (const std::string& s : stop_) first_stop = std::min(first_stop, pending_.find(s));
  if (first_stop != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first_stop);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that begins a stop string.
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  const size_t send = std::min(pending_.size() - hold, chat::complete_utf8_prefix(pending_));
  std::string out = pending_.substr(0, send);
  pending_.erase(0, send);
  return out;
}

std::string StopFilter::finish() {
  std::string out = stopped_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

}  // namespace longctx::server
