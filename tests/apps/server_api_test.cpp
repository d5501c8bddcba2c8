// longctx-server's request parsing and stop-string filter, without a server
// (tests/python/test_server.py runs the real one).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "server_api.h"
#include "test_seed.h"

namespace longctx::server {
namespace {

RequestLimits limits() {
  RequestLimits l;
  l.model_id = "demo";
  l.max_seq_len = 4096;
  l.defaults.max_tokens = 512;
  l.defaults.temperature = 0.0;
  l.defaults.top_k = 40;
  l.defaults.top_p = 0.95;
  l.defaults.seed = 7;
  return l;
}

// Runs the parser, expects ApiError(status) naming `param`.
void expect_refused(const std::string& body, bool chat, int status, const std::string& param) {
  try {
    parse_completion_request(body, chat, limits());
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << body << ": " << e.what();
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
  }
}

TEST(ServerApi, ChatRequestTakesItsFieldsAndTheDefaults) {
  const CompletionRequest r = parse_completion_request(
      R"({"model": "demo", "messages": [{"role": "system", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 9, "top_k": 3,
          "stop": ["x", "yz"]})",
      true, limits());
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(r.top_p, 0.95);  // default
  EXPECT_EQ(r.seed, 7u);     // default
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  const CompletionRequest c = parse_completion_request(R"({"prompt": ["once"], "max_completion_tokens": 4096})",
                                                       false, limits());
  EXPECT_EQ(c.prompt, "once");
  EXPECT_EQ(c.max_tokens, 4096);
  EXPECT_EQ(c.max_tokens, limits().max_seq_len);
}

TEST(ServerApi, BadFieldsAreRefusedNamingThem) {
  expect_refused(R"({"messages": [)", true, 400, "");
  expect_refused(R"("text")", true, 400, "");
  expect_refused(R"({"messages": []})", true, 400, "messages");
  expect_refused(R"({"messages": [{"role": "user", "content": 5}]})", true, 400, "messages[0].content");
  expect_refused(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true, 400,
                 "messages[0].content[0]");
  expect_refused(R"({"messages": [{"content": "x"}]})", true, 400, "messages[0].role");
  expect_refused(R"({"model": "other", "messages": [{"role": "user", "content": "x"}]})", true, 404, "model");
  const std::string ok = R"("messages": [{"role": "user", "content": "x"}])";
  for (const char* bad : {R"("max_tokens": 0)", R"("max_tokens": 4097)", R"("max_tokens": -1)",
                          R"("max_tokens": 1.5)", R"("max_tokens": 18446744073709551615)"})
    expect_refused(str_cat("{", ok, ", ", bad, "}"), true, 400, "max_tokens");
  expect_refused(str_cat("{", ok, R"(, "top_p": 1.01})"), true, 400, "top_p");
  expect_refused(str_cat("{", ok, R"(, "top_k": -1})"), true, 400, "top_k");
  expect_refused(str_cat("{", ok, R"(, "seed": "1"})"), true, 400, "seed");
  expect_refused(str_cat("{", ok, R"(, "stop": [""]})"), true, 400, "stop");
  expect_refused(str_cat("{", ok, R"(, "stop": 3})"), true, 400, "stop");
  expect_refused(str_cat("{", ok, R"(, "stream_options": true})"), true, 400, "stream_options");
  expect_refused(R"({"prompt": 3})", false, 400, "prompt");
  expect_refused(R"({"prompt": ["a", "b"]})", false, 400, "prompt");
  // Values of types the parser did not expect are the client's mistake (400), not the server's (500).
  expect_refused(R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})", true, 400,
                 "messages[0].content[0]");
  expect_refused(str_cat("{", ok, R"(, "max_tokens": 1e400})"), true, 400, "");
}

TEST(ServerApi, NullMaxCompletionTokensLeavesMaxTokens) {
  const CompletionRequest r =
      parse_completion_request(R"({"prompt": "x", "max_completion_tokens": null, "max_tokens": 2})", false, limits());
  EXPECT_EQ(r.max_tokens, 2);
}

TEST(ServerApi, ErrorBodyHasOpenAIsShape) {
  EXPECT_EQ(error_body(400, "bad \"x\"", "x"),
            R"({"error":{"code":null,"message":"bad \"x\"","param":"x","type":"invalid_request_error"}})");
  EXPECT_NE(error_body(503, "busy").find(R"("type":"server_overloaded")"), std::string::npos);
  EXPECT_NE(error_body(401, "no").find(R"("param":null)"), std::string::npos);
}

// The filter's output, concatenated, is the text up to the first stop string,
// however the text is cut into pieces; and it never sends a byte it may take back.
TEST(StopFilter, AnyCutIntoPiecesGivesTheTextBeforeTheFirstStop) {
  const std::string text = "The key is 7\xC3\xA9" "12<|end|> and more <|end|>";
  const std::vector<std::vector<std::string>> stops = {{}, {"<|end|>"}, {"12<", "key"}, {"\xC3\xA9"}, {"zz"}};
  std::mt19937 rng(test_seed(3));
  for (const auto& stop : stops) {
    size_t first = std::string::npos;
    for (const auto& s : stop) first = std::min(first, text.find(s));
    const std::string expected = text.substr(0, first);
    for (int trial = 0; trial < 200; ++trial) {
      StopFilter filter(stop);
      std::string out;
      for (size_t at = 0; at < text.size();) {
        const size_t n = std::min(text.size() - at, size_t(1 + rng() % 4));
        const std::string sent = filter.push(text.substr(at, n));
        out += sent;
        at += n;
        // Nothing sent so far goes past the expected text.
        ASSERT_EQ(out, expected.substr(0, out.size()));
        // No cut UTF-8 character (the é's lead byte alone) at the end of what was sent.
        if (!sent.empty()) {
          ASSERT_NE(static_cast<unsigned char>(out.back()), 0xC3u);
        }
      }
      out += filter.finish();
      EXPECT_EQ(out, expected);
      EXPECT_EQ(filter.stopped(), first != std::string::npos);
    }
  }
}

// The stop strings are checked as each piece (a token's text) arrives, so the
// text ends at the first one a piece completes, even where a longer stop
// string that began earlier would have completed a piece later; among those a
// piece completes at once, the earliest to start wins.
TEST(StopFilter, EndsAtTheStopStringAPieceCompletesFirst) {
  const std::vector<std::string> stop = {"ND", "END more"};
  auto filtered = [&](const std::vector<std::string>& pieces) {
    StopFilter filter(stop);
    std::string out;
    for (const std::string& p : pieces) out += filter.push(p);
    return out + filter.finish();
  };
  EXPECT_EQ(filtered({"xEN", "D mo", "re"}), "xE");  // "ND" completes first
  EXPECT_EQ(filtered({"xE", "ND", " more"}), "xE");
  EXPECT_EQ(filtered({"xEN", "D more"}), "x");        // both at once: "END more" starts first
  EXPECT_EQ(filtered({"xEND more"}), "x");
}

}  // namespace
}  // namespace longctx::server
