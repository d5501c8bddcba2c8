// longctx-chat's prefill progress lines (chat_output.h), written to a file as
// they are when stderr is not a terminal.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "chat_output.h"

namespace longctx::chat {
namespace {

// The lines Progress writes for `updates` (done, total), with "tok/s" and
// "ETA" cut off: they depend on the clock.
std::vector<std::string> progress_lines(int64_t tokens, const std::vector<std::pair<int64_t, int64_t>>& updates) {
  std::FILE* file = std::tmpfile();
  EXPECT_NE(file, nullptr);
  if (file == nullptr) return {};
  Progress progress(file, tokens);
  for (const auto& [done, total] : updates) progress.update(done, total);
  progress.finish();
  std::rewind(file);
  std::vector<std::string> lines;
  std::string line;
  for (int c; (c = std::fgetc(file)) != EOF;) {
    if (c != '\n') {
      line += char(c);
      continue;
    }
    const size_t rate = line.find(" tok/s");
    const size_t cut = line.rfind(", ", rate);
    lines.push_back(rate == std::string::npos || cut == std::string::npos ? line : line.substr(0, cut) + ")");
    line.clear();
  }
  std::fclose(file);
  return lines;
}

// Two layers of 1000 tokens, as the Sequence reports them: after each chunk of
// 250, done = layers finished * 1000 + tokens of the current layer.
TEST(ChatProgress, NamesTheLayerAndTheTokenInIt) {
  std::vector<std::pair<int64_t, int64_t>> updates;
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int64_t t = 250; t <= 1000; t += 250) updates.push_back({layer * 1000 + t, 2000});
  const std::vector<std::string> expected = {
      "prefill: 10% (layer 1/2, 250/1000 tokens)",  "prefill: 20% (layer 1/2, 500/1000 tokens)",
      "prefill: 30% (layer 1/2, 750/1000 tokens)",  "prefill: 50% (layer 1/2, 1000/1000 tokens)",
      "prefill: 60% (layer 2/2, 250/1000 tokens)",  "prefill: 70% (layer 2/2, 500/1000 tokens)",
      "prefill: 80% (layer 2/2, 750/1000 tokens)",  "prefill: 100% (layer 2/2, 1000/1000 tokens)",
  };
  EXPECT_EQ(progress_lines(1000, updates), expected);
}

TEST(ChatProgress, OneLayerNamesOnlyTheTokens) {
  EXPECT_EQ(progress_lines(400, {{100, 400}, {400, 400}}),
            (std::vector<std::string>{"prefill: 20% (100/400 tokens)", "prefill: 100% (400/400 tokens)"}));
}

// A total that is not whole layers of the prompt (another caller's units):
// the fraction of the prompt, as tokens.
TEST(ChatProgress, OtherUnitsShowTheFractionOfThePrompt) {
  EXPECT_EQ(progress_lines(1000, {{3, 6}, {6, 6}}),
            (std::vector<std::string>{"prefill: 50% (500/1000 tokens)", "prefill: 100% (1000/1000 tokens)"}));
}

}  // namespace
}  // namespace longctx::chat
