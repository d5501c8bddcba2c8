// longctx-chat's conversation: which text goes into the KV store, turn by
// turn, and the chat state stored in a KV snapshot's fingerprint.
//
// Where the document goes: at the start of the first user message, then a
// blank line, then the first question (llama2 with a system prompt: after the
// <<SYS>> block, as the template puts it). The text is fed in segments, each
// tokenized on its own with special tokens parsed:
//   1. the context: the template's header (BOS, system prompt, the first user
//      header) and the document — prefilled once; --save-kv snapshots the KV
//      store right after it, so any question can follow it later;
//   2. per question: the rest of the user message and the assistant header
//      (first turn), or the end of the previous answer and the next user
//      message (later turns).
// A later turn is what the template's rendering of the whole conversation
// puts after the last answer, rendered as a placeholder: the KV store holds
// that answer as it was generated, which the template may render otherwise
// (stripped, after a space). Every turn appends to the same sequence and
// nothing is prefilled twice.
#pragma once

#include <string>
#include <vector>

#include "longctx/model/tokenizer.h"

namespace longctx::chat {

// Whether a template writes BOS itself (llama2, llama3, internlm2); otherwise
// the tokenizer adds it where the vocabulary asks for it.
bool template_writes_bos(model::ChatTemplate chat_template);

class Conversation {
 public:
  Conversation(model::ChatTemplate chat_template, std::string system_prompt);

  // The context segment (may be empty: raw template, no document). Call once,
  // first. Whitespace at both ends of the document is dropped (templates strip it).
  std::string context(const std::string& document);
  // The segment of the next question (after context() or answer()).
  std::string question(const std::string& question);
  // The answer as generated (pieces concatenated); its tokens are in the KV store.
  void answer(const std::string& text);

  bool has_document() const { return has_document_; }
  model::ChatTemplate chat_template() const { return template_; }
  bool template_writes_bos() const { return chat::template_writes_bos(template_); }

  // The chat state after context(), for a snapshot's fingerprint:
  // "longctx-chat template=llama2 document=1 system=1a2b3c4d context_tokens=123".
  std::string state(int64_t context_tokens) const;

 private:
  std::string render(const std::vector<model::ChatMessage>& messages) const;

  model::ChatTemplate template_;
  std::string system_prompt_;
  bool has_document_ = false;
  int turns_ = 0;
  std::vector<model::ChatMessage> messages_;  // the document is a placeholder in them
  std::string rendered_;                      // the context's rendering (the document's placeholder included)
};

// The fingerprint stored in longctx-chat's snapshots: the model's, a newline,
// Conversation::state().
std::string snapshot_fingerprint(const std::string& model_fingerprint, const std::string& state);

// The chat state of a snapshot, checked against this run: Error(kInvalidArgument)
// with a message a user can act on when the snapshot is from another model, was
// not made by longctx-chat, or used another chat template or system prompt.
// Returns the number of context tokens it holds and whether it has a document.
struct SnapshotChatState {
  int64_t context_tokens = 0;
  bool has_document = false;
};
SnapshotChatState check_snapshot_fingerprint(const std::string& path, const std::string& stored,
                                             const std::string& model_fingerprint,
                                             model::ChatTemplate chat_template, const std::string& system_prompt);

}  // namespace longctx::chat
