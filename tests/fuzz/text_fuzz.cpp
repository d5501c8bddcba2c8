// libFuzzer entry for longctx's text inputs. The first byte picks what the
// rest of the input is:
//   0-3  a prompt, encoded by the tokenizer fixtures of tests/model/data
//        (Llama-3 and Qwen2.5 BPE, Mistral and InternLM2 SPM): ids in range,
//        decode(encode(text)) == text without special-token parsing, and the
//        pre-tokenizer's words concatenate to the text;
//   4    a YAML config, then after a NUL byte one override per line: parsed,
//        or refused with longctx::Error; a parsed config's YAML parses to the
//        same YAML;
//   5    chat messages "role\x1fcontent" separated by \x1e, rendered by every
//        template: text, or Error(kInvalidArgument) for llama2's role order;
//   6    a request body for longctx-server (the second byte picks chat or
//        completion): parsed within the limits, or ApiError 400/404; what it
//        answers is valid JSON (json_text, error_body);
//   7    stop strings, a \x1d, then pieces separated by \x1e through the
//        server's StopFilter: what it sends is the text up to the first stop
//        string, once a piece completes one.
// Anything else (a crash, a sanitizer report, another exception) is a
// finding. See CMakeLists.txt.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../model/tokenizer_fixture.h"
#include "server_api.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/model/tokenizer.h"

namespace {

using namespace longctx;
using namespace longctx::model;

void check(bool ok, const char* what, std::string_view input) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s (input of %zu bytes)\n", what, input.size());
    std::abort();
  }
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  for (size_t at = 0;;) {
    const size_t end = s.find(sep, at);
    parts.push_back(s.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
    if (end == std::string_view::npos) return parts;
    at = end + 1;
  }
}

const std::vector<Tokenizer>& tokenizers() {
  static const std::vector<Tokenizer> toks = [] {
    std::vector<Tokenizer> t;
    for (const char* name : {"tokenizer_llama3_bpe.txt", "tokenizer_qwen25_bpe.txt", "tokenizer_mistral_spm.txt",
                             "tokenizer_internlm2_spm.txt"})
      t.emplace_back(model::testing::load_tokenizer_fixture(name).vocab);
    return t;
  }();
  return toks;
}

void fuzz_tokenizer(const Tokenizer& tok, std::string_view text) {
  const std::vector<int32_t> plain = tok.encode(text, /*add_bos=*/true, /*parse_special=*/false);
  for (const int32_t id : plain) check(id >= 0 && id < tok.n_vocab(), "id in range", text);
  check(tok.decode(plain) == text, "decode(encode(text)) == text", text);
  const std::vector<int32_t> special = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
  for (const int32_t id : special) {
    check(id >= 0 && id < tok.n_vocab(), "id in range (parse_special)", text);
    (void)tok.token_to_piece(id);
  }
  if (tok.vocab().kind == TokenizerKind::kBpe) {
    std::string joined;
    for (const std::string& w : pre_tokenize(tok.vocab().pre, text)) joined += w;
    check(joined == text, "pre-tokenizer words concatenate to the text", text);
  }
}

void fuzz_config(std::string_view input) {
  const size_t nul = input.find('\0');
  const std::string yaml(input.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos)
    for (std::string_view line : split(input.substr(nul + 1), '\n')) overrides.emplace_back(line);
  LongContextConfig config;
  try {
    config = parse_config(yaml, "<fuzz>", overrides);
  } catch (const Error&) {
    return;
  }
  const std::string text = config_to_yaml(config);
  std::string again;
  try {
    again = config_to_yaml(parse_config(text, "<round trip>"));
  } catch (const Error& e) {
    std::fprintf(stderr, "config_to_yaml wrote a config parse_config refuses: %s\n%s\n", e.what(), text.c_str());
    std::abort();
  }
  check(again == text, "config_to_yaml round-trips", input);
}

void fuzz_chat(std::string_view input) {
  std::vector<ChatMessage> messages;
  for (std::string_view m : split(input, '\x1e')) {
    const size_t sep = m.find('\x1f');
    messages.push_back(sep == std::string_view::npos ? ChatMessage{"user", std::string(m)}
                                                     : ChatMessage{std::string(m.substr(0, sep)),
                                                                   std::string(m.substr(sep + 1))});
  }
  for (const ChatTemplate t : {ChatTemplate::kRaw, ChatTemplate::kLlama2, ChatTemplate::kLlama3,
                               ChatTemplate::kChatml, ChatTemplate::kInternLM2}) {
    for (const bool generation_prompt : {false, true}) {
      try {
        (void)apply_chat_template(t, messages, generation_prompt);
      } catch (const Error& e) {
        check(e.code() == ErrorCode::kInvalidArgument, "a template refuses with kInvalidArgument", input);
      }
    }
  }
}

void fuzz_request(std::string_view input) {
  if (input.empty()) return;
  const bool chat = input[0] & 1;
  const std::string_view body = input.substr(1);
  server::RequestLimits limits;
  limits.model_id = "longctx";
  limits.max_seq_len = 4096;
  limits.defaults.max_tokens = 256;
  server::CompletionRequest r;
  try {
    r = server::parse_completion_request(body, chat, limits);
  } catch (const server::ApiError& e) {
    check(e.status() == 400 || e.status() == 404, "a refused request is a 400 or a 404", input);
    const std::string answer = server::error_body(e.status(), e.what(), e.param());
    check(nlohmann::json::accept(answer), "error_body is JSON", input);
    return;
  }
  check(r.chat == chat, "the endpoint's kind", input);
  check(r.max_tokens >= 1 && r.max_tokens <= limits.max_seq_len, "max_tokens within 1..max_seq_len", input);
  check(r.stop.size() <= 4, "at most four stop strings", input);
  for (const std::string& stop : r.stop) check(!stop.empty(), "stop strings are not empty", input);
  check(chat ? !r.messages.empty() : !r.prompt.empty(), "something to answer", input);
  nlohmann::json echo = {{"prompt", r.prompt}, {"stop", r.stop}};
  for (const model::ChatMessage& m : r.messages) echo["messages"].push_back({{"role", m.role}, {"content", m.content}});
  check(nlohmann::json::accept(server::json_text(echo)), "json_text writes JSON", input);
}

void fuzz_stop_filter(std::string_view input) {
  const size_t sep = input.find('\x1d');
  if (sep == std::string_view::npos) return;
  std::vector<std::string> stops;
  for (std::string_view s : split(input.substr(0, sep), '\x1e'))
    if (!s.empty() && stops.size() < 4) stops.emplace_back(s);  // what parse_completion_request lets through
  // The reference: after each piece, the text so far ends before the
  // earliest stop string in it (llama.cpp's server also takes the earliest
  // start among the stop strings a token completes).
  server::StopFilter filter(stops);
  std::string text, sent;
  size_t stop_at = std::string::npos;
  for (std::string_view piece : split(input.substr(sep + 1), '\x1e')) {
    text += piece;
    sent += filter.push(std::string(piece));
    for (const std::string& s : stops) stop_at = std::min(stop_at, text.find(s));
    if (stop_at != std::string::npos) break;
  }
  sent += filter.finish();
  check(sent == text.substr(0, stop_at), "StopFilter sends the text before the first stop string", input);
  check(filter.stopped() == (stop_at != std::string::npos), "StopFilter stopped iff a stop string occurs", input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const unsigned mode = data[0] % 8;
  try {
    if (mode < 4) fuzz_tokenizer(tokenizers()[mode], rest);
    else if (mode == 4) fuzz_config(rest);
    else if (mode == 5) fuzz_chat(rest);
    else if (mode == 6) fuzz_request(rest);
    else fuzz_stop_filter(rest);
  } catch (const Error& e) {
    std::fprintf(stderr, "unexpected longctx::Error (mode %u): %s\n", mode, e.what());
    std::abort();
  }
  return 0;
}
