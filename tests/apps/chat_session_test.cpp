// longctx-chat's conversation (apps/chat_session.h): the segments fed to the
// KV store, turn by turn, must add up to one rendering of the conversation in
// which each answer appears once, as it was generated.
#include "chat_session.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace longctx::chat {
namespace {

using model::ChatTemplate;

// What the KV store holds after a document, two questions and their answers:
// the segments with each answer as generated between them.
struct Dialogue {
  std::string fed;                    // every segment and answer, in order
  std::vector<std::string> segments;  // context, question 1, question 2
};

Dialogue run(ChatTemplate chat_template, const std::string& answer_1, const std::string& answer_2) {
  Conversation c(chat_template, "");
  Dialogue d;
  d.segments.push_back(c.context("the document"));
  d.segments.push_back(c.question("first?"));
  c.answer(answer_1);
  d.segments.push_back(c.question("second?"));
  c.answer(answer_2);
  d.fed = d.segments[0] + d.segments[1] + answer_1 + d.segments[2] + answer_2;
  return d;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Templates render an earlier answer stripped (llama2 also after a space): an
// answer that starts with two spaces or ends with a newline is not the text
// they render, and the next turn must not feed it again.
TEST(Conversation, LaterTurnsFollowTheAnswerAsGenerated) {
  const std::string answer = "  the key is 12345\n";
  {
    const Dialogue d = run(ChatTemplate::kLlama2, answer, " ok");
    EXPECT_EQ(d.segments[2], " </s><s>[INST] second? [/INST]");
    EXPECT_EQ(count(d.fed, "the key is 12345"), 1u) << d.fed;
  }
  {
    const Dialogue d = run(ChatTemplate::kChatml, answer, "ok");
    EXPECT_EQ(d.segments[2], "<|im_end|>\n<|im_start|>user\nsecond?<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(count(d.fed, "the key is 12345"), 1u) << d.fed;
  }
  {
    const Dialogue d = run(ChatTemplate::kLlama3, answer, "ok");
    EXPECT_EQ(d.segments[2],
              "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nsecond?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    EXPECT_EQ(count(d.fed, "the key is 12345"), 1u) << d.fed;
  }
  for (const ChatTemplate t : {ChatTemplate::kRaw, ChatTemplate::kInternLM2}) {
    SCOPED_TRACE(model::chat_template_name(t));
    const Dialogue d = run(t, answer, "ok");
    EXPECT_EQ(count(d.fed, "the key is 12345"), 1u) << d.fed;
    EXPECT_EQ(count(d.fed, "second?"), 1u) << d.fed;
    EXPECT_EQ(count(d.fed, "the document"), 1u) << d.fed;
  }
}

// The first turn continues the context: the document once, then the question.
TEST(Conversation, FirstTurnContinuesTheContext) {
  Conversation c(ChatTemplate::kLlama2, "be brief");
  const std::string context = c.context("  the document \n");
  EXPECT_EQ(context, "<s>[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nthe document");
  EXPECT_EQ(c.question("what?"), "\n\nwhat? [/INST]");
}

}  // namespace
}  // namespace longctx::chat
