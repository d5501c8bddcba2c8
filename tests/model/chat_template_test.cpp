// Chat templates against the models' own Jinja templates rendered by an
// independent Jinja engine (transformers.js; data/chat_templates.txt, written
// by make_tokenizer_fixtures.js): Llama-2-chat, Llama-3-Instruct, ChatML
// (plain and Qwen2.5's), InternLM2-chat, over conversations with whitespace to
// strip, Unicode, empty contents, and role orders Llama-2 rejects.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/tokenizer.h"
#include "model/tokenizer_fixture.h"

namespace longctx::model {
namespace {

using testing::read_lines;
using testing::split_spaces;
using testing::unescape_field;

struct ChatCase {
  ChatTemplate chat_template = ChatTemplate::kRaw;
  bool add_generation_prompt = false;
  std::vector<ChatMessage> messages;
  bool error = false;
  std::string expected;
};

struct ChatData {
  std::vector<std::pair<ChatTemplate, std::string>> jinja;
  std::vector<ChatCase> cases;
};

ChatData load_chat_data() {
  ChatData d;
  for (const std::string& line : read_lines(testing::data_path("chat_templates.txt"))) {
    const std::vector<std::string> w = split_spaces(line);
    if (w.at(0) == "jinja") {
      d.jinja.push_back({parse_chat_template(w.at(1)), unescape_field(w.at(2))});
    } else if (w.at(0) == "case") {
      d.cases.push_back({parse_chat_template(w.at(1)), w.at(2) == "1", {}, false, {}});
    } else if (w.at(0) == "message") {
      d.cases.back().messages.push_back({w.at(1), unescape_field(w.at(2))});
    } else if (w.at(0) == "expect") {
      d.cases.back().expected = unescape_field(w.at(1));
    } else if (w.at(0) == "error") {
      d.cases.back().error = true;
    } else {
      ADD_FAILURE() << "unknown line " << line;
    }
  }
  return d;
}

TEST(ChatTemplate, MatchesJinjaRendering) {
  const ChatData d = load_chat_data();
  ASSERT_GE(d.cases.size(), 80u);
  int errors = 0;
  for (size_t i = 0; i < d.cases.size(); ++i) {
    const ChatCase& c = d.cases[i];
    SCOPED_TRACE(std::string("case ") + std::to_string(i) + " " + chat_template_name(c.chat_template));
    if (c.error) {
      ++errors;
      try {
        apply_chat_template(c.chat_template, c.messages, c.add_generation_prompt);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("alternate"), std::string::npos) << e.what();
      }
    } else {
      EXPECT_EQ(apply_chat_template(c.chat_template, c.messages, c.add_generation_prompt), c.expected);
    }
  }
  EXPECT_EQ(errors, 4);  // llama2: user,user and system,assistant, with and without the generation prompt
}

TEST(ChatTemplate, DetectsRealTemplates) {
  const ChatData d = load_chat_data();
  ASSERT_EQ(d.jinja.size(), 5u);
  for (const auto& [expected, jinja] : d.jinja) {
    Vocab v;
    v.chat_template = jinja;
    EXPECT_EQ(detect_chat_template(v), expected) << jinja;
  }
  EXPECT_EQ(detect_chat_template(Vocab{}), ChatTemplate::kRaw);
  Vocab v;
  v.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
  EXPECT_EQ(detect_chat_template(v), ChatTemplate::kRaw);
}

TEST(ChatTemplate, Names) {
  for (const ChatTemplate t : {ChatTemplate::kRaw, ChatTemplate::kLlama2, ChatTemplate::kLlama3, ChatTemplate::kChatml,
                               ChatTemplate::kInternLM2})
    EXPECT_EQ(parse_chat_template(chat_template_name(t)), t);
  for (const char* bad : {"", "Llama3", "mistral", "chatml "}) {
    try {
      parse_chat_template(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig);
    }
  }
}

// Llama-2 with an empty system message, as Python's Jinja2 renders it: ''
// differs from false, so the <<SYS>> block is written (the data file leaves
// this case out: transformers.js's Jinja takes '' == false).
TEST(ChatTemplate, Llama2EmptySystemMessage) {
  const std::vector<ChatMessage> messages = {{"system", ""}, {"user", ""}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kLlama2, messages, true), "<s>[INST] <<SYS>>\n\n<</SYS>> [/INST]");
}

TEST(ChatTemplate, RawConcatenatesContents) {
  const std::vector<ChatMessage> messages = {{"system", "A "}, {"user", " b"}, {"assistant", "c\n"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kRaw, messages, true), "A  bc\n");
  EXPECT_EQ(apply_chat_template(ChatTemplate::kRaw, {}, false), "");
}

// The rendered prompt goes through the model's tokenizer with parse_special:
// every marker becomes its control token.
TEST(ChatTemplate, EncodesToControlTokens) {
  const Tokenizer llama3(testing::load_tokenizer_fixture("tokenizer_llama3_bpe.txt").vocab);
  const std::vector<ChatMessage> messages = {{"user", "Hi!"}};
  const std::vector<int32_t> ids =
      llama3.encode(apply_chat_template(ChatTemplate::kLlama3, messages, false), false, true);
  // <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>, as in the fixture.
  EXPECT_EQ(ids, (std::vector<int32_t>{128000, 128006, 882, 128007, 271, 13347, 0, 128009}));
}

}  // namespace
}  // namespace longctx::model
