// longctx-server's side of the OpenAI API: requests parsed and checked into
// CompletionRequest, and errors in OpenAI's shape,
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}.
// Every check names the parameter; nothing here touches the model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/model/tokenizer.h"

namespace longctx::server {

// An answer with an HTTP error status; thrown by the parsers and the engine,
// caught by the HTTP layer, which sends error_body().
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "")
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

// JSON text in which invalid UTF-8 in strings reads as U+FFFD: a model's
// tokens can be bytes that are not UTF-8, and the JSON must stay valid.
std::string json_text(const nlohmann::json& value);

// OpenAI's error JSON for `status`: type invalid_request_error (4xx but the
// ones below), authentication_error (401), not_found_error (404),
// server_overloaded (503), server_error (5xx).
std::string error_body(int status, const std::string& message, const std::string& param = "");

// What the server allows and assumes when a request leaves a field out.
struct RequestLimits {
  std::string model_id;     // the one model served; a request naming another is a 404
  int64_t max_seq_len = 0;  // max_tokens may not exceed it
  SamplingConfig defaults;  // temperature, top_k, top_p, seed, max_tokens
};

struct CompletionRequest {
  bool chat = false;                         // /v1/chat/completions (messages) or /v1/completions (prompt)
  std::vector<model::ChatMessage> messages;  // chat: system / user / assistant, in order
  std::string prompt;                        // completions: the text as is
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  int64_t max_tokens = 0;      // >= 1
  double temperature = 0.0;
  int top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // up to 4 non-empty strings; the answer ends before the first one
};

// Parses a request body. ApiError(400) for malformed JSON (with the byte
// offset), a field of the wrong type or out of range (naming it), no or
// empty messages / prompt, n != 1; ApiError(404) for a model other than
// limits.model_id.
CompletionRequest parse_completion_request(std::string_view body, bool chat, const RequestLimits& limits);

// Holds back what might still become a stop string or is an incomplete UTF-8
// character, so that what is sent is final: pieces in, text out.
class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  // The text that can be sent now. Once a stop string is complete, returns the
  // text before it and stopped() turns true (later pieces are ignored).
  std::string push(const std::string& piece);
  // At the end: whatever is held back.
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace longctx::server
