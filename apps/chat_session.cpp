#include "chat_session.h"

#include <cstdio>
#include <cstring>

#include "longctx/core/crc32c.h"
#include "longctx/core/error.h"

namespace longctx::chat {
namespace {

// Placeholders rendered in place of the document and of the newest question,
// then cut out of the text (\x01: not whitespace, which templates strip).
constexpr const char* kDocument = "\x01" "longctx-document" "\x01";
constexpr const char* kQuestion = "\x01" "longctx-question" "\x01";
constexpr const char* kAnswer = "\x01" "longctx-answer" "\x01";
constexpr const char* kStateTag = "longctx-chat ";

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

void replace_first(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

Conversation::Conversation(model::ChatTemplate chat_template, std::string system_prompt)
    : template_(chat_template), system_prompt_(std::move(system_prompt)) {}

bool template_writes_bos(model::ChatTemplate chat_template) {
  return chat_template == model::ChatTemplate::kLlama2 || chat_template == model::ChatTemplate::kLlama3 ||
         chat_template == model::ChatTemplate::kInternLM2;
}

std::string Conversation::render(const std::vector<model::ChatMessage>& messages) const {
  return model::apply_chat_template(template_, messages, /*add_generation_prompt=*/true);
}

std::string Conversation::context(const std::string& document) {
  has_document_ = !trimmed(document).empty();
  if (!system_prompt_.empty()) messages_.push_back({"system", system_prompt_});
  // Render the first user message as placeholders; the context is what comes
  // before the question's placeholder.
  std::vector<model::ChatMessage> probe = messages_;
  probe.push_back({"user", std::string(has_document_ ? kDocument : "") + kQuestion});
  const std::string text = render(probe);
  rendered_ = text.substr(0, text.find(kQuestion));
  std::string out = rendered_;
  replace_first(out, kDocument, trimmed(document));
  return out;
}

std::string Conversation::question(const std::string& question) {
  const std::string q = trimmed(question);
  std::vector<model::ChatMessage> next = messages_;
  std::string content;
  if (turns_ == 0) {
    content = has_document_ ? std::string(kDocument) + (q.empty() ? "" : "\n\n") + kQuestion : kQuestion;
  } else {
    // Raw text has no turn markers: a line break separates the turns.
    content = template_ == model::ChatTemplate::kRaw ? std::string("\n") + kQuestion : kQuestion;
  }
  // After an answer the KV store holds it as it was generated, which the
  // template may render otherwise (it strips answers, puts a space before
  // them): the answer is rendered as a placeholder, and the turn is what
  // comes after it. The first turn extends the context's rendering.
  if (turns_ > 0) next.back().content = kAnswer;
  next.push_back({"user", content});
  std::string text = render(next);
  size_t start = 0;
  if (turns_ > 0) {
    start = text.find(kAnswer) + std::strlen(kAnswer);
  } else {
    while (start < text.size() && start < rendered_.size() && text[start] == rendered_[start]) ++start;
  }
  replace_first(text, kQuestion, q);
  std::string segment = text.substr(start);
  if (turns_ > 0) next[next.size() - 2].content = messages_.back().content;
  replace_first(next.back().content, kQuestion, q);
  messages_ = std::move(next);
  ++turns_;
  return segment;
}

void Conversation::answer(const std::string& text) { messages_.push_back({"assistant", text}); }

std::string Conversation::state(int64_t context_tokens) const {
  return str_cat(kStateTag, "template=", model::chat_template_name(template_), " document=", has_document_ ? 1 : 0,
                 " system=", hex32(crc32c(system_prompt_.data(), system_prompt_.size())),
                 " context_tokens=", context_tokens);
}

std::string snapshot_fingerprint(const std::string& model_fingerprint, const std::string& state) {
  return model_fingerprint + "\n" + state;
}

SnapshotChatState check_snapshot_fingerprint(const std::string& path, const std::string& stored,
                                             const std::string& model_fingerprint,
                                             model::ChatTemplate chat_template, const std::string& system_prompt) {
  const size_t cut = stored.rfind(std::string("\n") + kStateTag);
  const std::string stored_model = cut == std::string::npos ? stored : stored.substr(0, cut);
  if (stored_model != model_fingerprint)
    fail(ErrorCode::kInvalidArgument, "--load-kv ", path, ": the snapshot was made with another model ('",
         stored_model.substr(0, 200), "'), this model is '", model_fingerprint,
         "'; make a new snapshot of this model with --save-kv");
  if (cut == std::string::npos)
    fail(ErrorCode::kInvalidArgument, "--load-kv ", path,
         ": the snapshot was not written by longctx-chat (no chat state); make one with --save-kv");
  const std::string state = stored.substr(cut + 1);
  // Same template and system prompt, else the text around the context would differ.
  Conversation probe(chat_template, system_prompt);
  probe.context("");
  const std::string expected = probe.state(0);
  const auto field = [](const std::string& s, const char* name) {
    const size_t at = s.find(std::string(" ") + name + "=");
    if (at == std::string::npos) return std::string();
    const size_t begin = at + std::strlen(name) + 2;
    return s.substr(begin, s.find(' ', begin) - begin);
  };
  if (field(state, "template") != field(expected, "template"))
    fail(ErrorCode::kInvalidArgument, "--load-kv ", path, ": the snapshot was made with chat template '",
         field(state, "template"), "', this run uses '", field(expected, "template"),
         "' (set model.chat_template, or --raw, as when it was saved)");
  if (field(state, "system") != field(expected, "system"))
    fail(ErrorCode::kInvalidArgument, "--load-kv ", path,
         ": the snapshot was made with another system prompt (model.system_prompt); use the same one");
  SnapshotChatState out;
  out.has_document = field(state, "document") == "1";
  const std::string tokens = field(state, "context_tokens");
  char* end = nullptr;
  out.context_tokens = std::strtoll(tokens.c_str(), &end, 10);
  if (tokens.empty() || *end != '\0' || out.context_tokens < 0)
    fail(ErrorCode::kCorrupt, "--load-kv ", path, ": bad chat state '", state.substr(0, 200), "'");
  return out;
}

}  // namespace longctx::chat
