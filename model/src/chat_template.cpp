// Chat templates: C++ renderings of the models' Jinja templates
// (tokenizer.chat_template), producing the same text byte for byte.
//   llama2:    meta-llama/Llama-2-*-chat-hf
//   llama3:    meta-llama/Meta-Llama-3-*-Instruct
//   chatml:    the plain ChatML template (Qwen2's, given a system message)
//   internlm2: internlm/internlm2-chat-* (BOS, then ChatML)
#include <string>
#include <string_view>

#include "longctx/core/error.h"
#include "longctx/model/tokenizer.h"

namespace longctx::model {
namespace {

// Python's str.isspace() for one code point (Jinja's strip() and trim).
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Decodes the well-formed UTF-8 sequence of `n` bytes at s[i]; ~0u if it is not one.
uint32_t code_point(std::string_view s, size_t i, size_t n) {
  if (i + n > s.size()) return ~0u;
  const auto b0 = uint8_t(s[i]);
  uint32_t cp = n == 1 ? b0 : b0 & (0xFFu >> (n + 1));
  for (size_t k = 1; k < n; ++k) {
    const auto b = uint8_t(s[i + k]);
    if ((b & 0xC0) != 0x80) return ~0u;
    cp = (cp << 6) | (b & 0x3F);
  }
  return cp;
}

// Python's str.strip(): removes Unicode whitespace at both ends.
std::string strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const auto b = uint8_t(s[begin]);
    const size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    if (!is_python_space(code_point(s, begin, n))) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back to the lead byte, at most 3 continuation bytes
    while (start > begin && end - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    if (!is_python_space(code_point(s, start, end - start))) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

std::string llama2(std::span<const ChatMessage> messages) {
  size_t first = 0;
  const std::string* system = nullptr;
  if (!messages.empty() && messages[0].role == "system") {
    system = &messages[0].content;
    first = 1;
  }
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const size_t k = i - first;  // loop.index0
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (k % 2 == 0))
      fail(ErrorCode::kInvalidArgument, "llama2 chat template: conversation roles must alternate "
           "user/assistant/user/assistant/... (message ", i, " has role '", m.role, "')");
    const std::string content =
        k == 0 && system != nullptr ? "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + m.content : m.content;
    if (m.role == "user") {
      out += "<s>[INST] ";  // appended piecewise: GCC 12 warns (-Wrestrict) on "literal" + string&&
      out += strip(content);
      out += " [/INST]";
    } else if (m.role == "assistant") {
      out += " ";
      out += strip(content);
      out += " </s>";
    }  // other roles print nothing, as in the template
  }
  return out;
}

std::string llama3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += "<|begin_of_text|>";
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" + strip(messages[i].content) +
           "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string chatml(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

ChatTemplate parse_chat_template(std::string_view name) {
  for (const ChatTemplate t : {ChatTemplate::kRaw, ChatTemplate::kLlama2, ChatTemplate::kLlama3,
                               ChatTemplate::kChatml, ChatTemplate::kInternLM2})
    if (name == chat_template_name(t)) return t;
  fail(ErrorCode::kConfig, "unknown chat template '", name, "' (raw, llama2, llama3, chatml, internlm2)");
}

const char* chat_template_name(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::kRaw: return "raw";
    case ChatTemplate::kLlama2: return "llama2";
    case ChatTemplate::kLlama3: return "llama3";
    case ChatTemplate::kChatml: return "chatml";
    case ChatTemplate::kInternLM2: return "internlm2";
  }
  return "unknown";
}

ChatTemplate detect_chat_template(const Vocab& vocab) {
  const std::string_view t = vocab.chat_template;
  if (t.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate::kLlama3;
  if (t.find("<|im_start|>") != std::string_view::npos) {
    // InternLM2 writes its BOS before the first turn; Qwen's ChatML does not.
    const bool bos = t.find("bos_token") != std::string_view::npos || t.find("<s>") != std::string_view::npos;
    return bos ? ChatTemplate::kInternLM2 : ChatTemplate::kChatml;
  }
  if (t.find("[INST]") != std::string_view::npos) return ChatTemplate::kLlama2;
  return ChatTemplate::kRaw;
}

std::string apply_chat_template(ChatTemplate chat_template, std::span<const ChatMessage> messages,
                                bool add_generation_prompt) {
  switch (chat_template) {
    case ChatTemplate::kRaw: {
      std::string out;
      for (const ChatMessage& m : messages) out += m.content;
      return out;
    }
    case ChatTemplate::kLlama2: return llama2(messages);
    case ChatTemplate::kLlama3: return llama3(messages, add_generation_prompt);
    case ChatTemplate::kChatml: return chatml(messages, add_generation_prompt);
    case ChatTemplate::kInternLM2: return "<s>" + chatml(messages, add_generation_prompt);
  }
  fail(ErrorCode::kInvalidArgument, "apply_chat_template: unknown template ", int(chat_template));
}

}  // namespace longctx::model
