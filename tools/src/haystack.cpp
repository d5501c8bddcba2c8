// Pass-key haystacks (see haystack.h). Every sentence after the first is
// joined with one space, and every demo-vocabulary token that spans a space
// starts with it, so the document's token count is the sum of its sentences'
// counts (checked against one encode of the whole text at the end).
#include "longctx/tools/haystack.h"

#include <cmath>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/random.h"
#include "longctx/tools/demo_model.h"

namespace longctx::tools {
namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

Haystack make_haystack(const HaystackSpec& spec, const model::Tokenizer& tokenizer) {
  if (!(spec.depth <= 1.0))
    fail(ErrorCode::kInvalidArgument, "haystack: depth must be in [0, 1] (or negative for random), got ", spec.depth);
  SplitMix64 rng(spec.seed);
  Haystack h;
  h.key = std::to_string(1 + rng.below(9));
  for (int i = 1; i < DemoModelShape::kKeyDigits; ++i) h.key += std::to_string(rng.below(10));
  h.depth = spec.depth >= 0.0 ? spec.depth : rng.uniform();
  h.question = demo_question();

  // Tokens of a sentence as it appears after a space (encode adds the "▁").
  std::unordered_map<std::string, int64_t> cache;
  auto count = [&](const std::string& sentence) {
    auto it = cache.find(sentence);
    if (it == cache.end())
      it = cache.emplace(sentence, int64_t(tokenizer.encode(sentence, false, false).size())).first;
    return it->second;
  };
  const std::string key_sentence = demo_key_sentence(h.key);
  const int64_t fixed = 1 + count(key_sentence) + (spec.question ? count(h.question) : 0);
  if (spec.tokens < fixed)
    fail(ErrorCode::kInvalidArgument, "haystack: ", spec.tokens, " tokens cannot hold the key sentence and question (",
         fixed, " tokens)");

  const auto& fillers = demo_filler_sentences();
  std::vector<const std::string*> filler;
  int64_t used = fixed;
  for (;;) {
    const std::string& s = fillers[rng.below(fillers.size())];
    if (used + count(s) > spec.tokens) break;
    used += count(s);
    filler.push_back(&s);
  }
  const auto at = static_cast<size_t>(std::llround(h.depth * double(filler.size())));

  int64_t before = 1;  // BOS
  for (size_t i = 0; i < filler.size(); ++i) {
    if (i == at) break;
    before += count(*filler[i]);
    h.text += *filler[i] + " ";
  }
  // The first digit follows "The pass key is" and the "▁" before the number.
  h.key_token = before + count("The pass key is") + 1;
  h.text += key_sentence;
  for (size_t i = at; i < filler.size(); ++i) h.text += " " + *filler[i];
  if (spec.question) h.text += " " + h.question;

  const std::vector<int32_t> tokens = tokenizer.encode(h.text, true, false);
  h.n_tokens = int64_t(tokens.size());
  if (h.n_tokens != used || tokenizer.token_to_piece(tokens[size_t(h.key_token)]) != h.key.substr(0, 1))
    fail(ErrorCode::kInternal, "haystack: the tokenizer is not the demo vocabulary (", h.n_tokens,
         " tokens, expected ", used, ")");
  return h;
}

std::string haystack_json(const Haystack& h, uint64_t seed) {
  char depth[32];
  std::snprintf(depth, sizeof(depth), "%.6g", h.depth);
  return "{\"key\": \"" + h.key + "\", \"depth\": " + depth + ", \"tokens\": " + std::to_string(h.n_tokens) +
         ", \"key_token\": " + std::to_string(h.key_token) + ", \"seed\": " + std::to_string(seed) +
         ", \"question\": \"" + json_escape(h.question) + "\"}\n";
}

}  // namespace longctx::tools
