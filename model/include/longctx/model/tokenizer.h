// Tokenizers read from GGUF metadata (tokenizer.ggml.*): SentencePiece-style
// ("llama": score-driven merges over UTF-8 characters, "▁" for spaces, byte
// fallback to <0xXX> tokens) and byte-level BPE ("gpt2": pre-tokenizer
// regexes, GPT-2 byte-to-unicode mapping, rank-ordered merges; every
// pre-tokenizer llama.cpp b4747 names, PCRE2 for the Unicode classes).
// Special (control / user-defined) tokens are matched whole in the text when
// asked. Chat templates for llama2, llama3, chatml (Qwen2) and InternLM2.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace longctx::model {

class GgufFile;

enum class TokenizerKind : uint8_t { kSpm, kBpe };
// Pre-tokenizer of a BPE vocabulary (tokenizer.ggml.pre): one per rule set of
// llama.cpp b4747 (its LLAMA_VOCAB_PRE_TYPE_*), each with the split regexes
// llama.cpp runs for it. Where a type has several regexes they run in turn:
// each splits the pieces of the one before. The names of the file map to a
// type by parse_pre_tokenizer(); several names share one type (gpt-2, phi-2,
// roberta-bpe, ... -> kGpt2). The tokenizer does not depend on the model's
// architecture: any type goes with any architecture.
enum class PreTokenizer : uint8_t {
  kGpt2, kLlama3, kQwen2,  // first: tests walk these three by number
  kDefault, kDeepseekLlm, kDeepseekCoder, kDeepseekV3, kFalcon, kMpt, kStarcoder, kRefact, kCommandR, kStablelm2,
  kOlmo, kDbrx, kSmaug, kPoro, kChatglm4, kViking, kJais, kTekken, kSmollm, kCodeshell, kBloom, kGpt3Finnish,
  kExaone, kChameleon, kMinerva,
};
inline constexpr int kPreTokenizerCount = int(PreTokenizer::kMinerva) + 1;

// What a pre-tokenizer type means besides its regexes (llama.cpp's flags).
struct PreTokenizerInfo {
  const char* name;    // the type's main name, as llama.cpp's converter writes it
  bool ignore_merges;  // a word that is a token is taken whole (Llama-3, Tekken)
  bool add_bos;        // BOS added when tokenizer.ggml.add_bos_token is absent
};
const PreTokenizerInfo& pre_tokenizer_info(PreTokenizer pre);
// The type of a tokenizer.ggml.pre value, as llama.cpp b4747 reads it ("" is
// absent: kDefault). An unknown name throws Error(kUnsupported) naming it.
PreTokenizer parse_pre_tokenizer(std::string_view name);
// Every name parse_pre_tokenizer accepts, with its type, in llama.cpp's order.
std::vector<std::pair<std::string_view, PreTokenizer>> pre_tokenizer_names();

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct Vocab {
  TokenizerKind kind = TokenizerKind::kSpm;
  PreTokenizer pre = PreTokenizer::kGpt2;  // BPE only
  std::vector<std::string> tokens;
  std::vector<float> scores;          // SPM merge priorities (empty: all 0)
  std::vector<TokenType> types;       // empty: all normal
  std::vector<std::string> merges;    // BPE: "a b" in rank order
  int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;  // -1: none
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;       // SPM: prepend "▁" to the text
  std::string chat_template;          // tokenizer.chat_template (may be empty)
};

// Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,
// bos_token_id,eos_token_id,eot_token_id,unknown_token_id,padding_token_id,
// add_bos_token,add_eos_token,add_space_prefix} and tokenizer.chat_template.
// Throws Error(kCorrupt) naming the key: arrays of different lengths, a
// special token id outside [0, n_vocab), a merge naming unknown tokens, an
// unknown tokenizer model or pre-tokenizer (Error(kUnsupported)). Absent
// flags default as in llama.cpp: add_bos_token true for llama and for the
// BPE types whose PreTokenizerInfo says so (Llama-3, Tekken, Chameleon),
// false for other gpt2 vocabularies; add_space_prefix true for llama. An SPM
// vocabulary's tokenizer.ggml.pre is not read (llama.cpp ignores it too).
Vocab vocab_from_gguf(const GgufFile& file);

class Tokenizer {
 public:
  // Validates the vocabulary (Error(kCorrupt)) and builds the lookup tables.
  explicit Tokenizer(Vocab vocab);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // parse_special: control (and unknown) token texts in `text` become their
  // ids (chat templates need this); otherwise they are plain text. User-defined
  // tokens (added words such as Qwen's <tool_call>) are always matched whole,
  // as Hugging Face tokenizers and llama.cpp do. Matching is leftmost-longest.
  // add_bos: add BOS (and EOS) where the vocabulary's add_bos / add_eos ask.
  // SPM with add_space_prefix puts "▁" before the text and after each special
  // token.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // The bytes of token `id` as text (SPM "▁" -> " ", byte tokens -> their
  // byte, BPE byte-unicode mapped back); control tokens give "". May be an
  // incomplete UTF-8 sequence: streaming callers concatenate pieces.
  // Throws Error(kInvalidArgument) for an id outside [0, n_vocab).
  std::string token_to_piece(int32_t id) const;
  // The pieces concatenated; SPM with add_space_prefix drops one leading
  // space (the prefix encode() added), so decode(encode(s, ...)) == s for text
  // without special tokens.
  std::string decode(std::span<const int32_t> ids) const;

  int64_t n_vocab() const;
  const Vocab& vocab() const;
  int32_t bos() const;
  int32_t eos() const;
  // End of generation: eos, eot, or a control token such as <|im_end|>, <|eot_id|>.
  bool is_end_of_generation(int32_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The tokenizer of a GGUF file from its tokenizer.* keys alone, by
// vocab_from_gguf's rules: a vocabulary-only GGUF (no tensors) will do, and
// general.architecture is not read. Errors name the file and the key.
Tokenizer tokenizer_from_gguf(const GgufFile& file);
// Opens and validates the GGUF at `path`, then tokenizer_from_gguf.
Tokenizer open_tokenizer(const std::string& path);

// The words the pre-tokenizer regexes split `text` into (BPE), in order; they
// concatenate to `text` (text no match covers, such as invalid UTF-8, forms
// words of its own). For tests and debugging: compiles the patterns per call.
std::vector<std::string> pre_tokenize(PreTokenizer pre, std::string_view text);

enum class ChatTemplate : uint8_t { kRaw, kLlama2, kLlama3, kChatml, kInternLM2 };
// "raw", "llama2", "llama3", "chatml", "internlm2"; Error(kConfig) otherwise.
ChatTemplate parse_chat_template(std::string_view name);
const char* chat_template_name(ChatTemplate chat_template);
// From the Jinja text of tokenizer.chat_template by its markers
// (<|start_header_id|> -> llama3, <|im_start|> -> chatml, [INST] -> llama2,
// <|im_start|> with InternLM2's bos/<s> -> internlm2); kRaw when unknown.
ChatTemplate detect_chat_template(const Vocab& vocab);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};
// The prompt text of `messages`, exactly as the model's Jinja template renders
// it (Llama-2-chat, Llama-3-Instruct, ChatML without a default system message,
// InternLM2-chat; kRaw: the contents concatenated). The text already holds the
// BOS token where the template writes it (llama2, llama3, internlm2): encode
// it with add_bos = false and parse_special = true. add_generation_prompt
// appends the assistant header (llama2 has none). llama2 requires alternating
// user/assistant roles after an optional system message
// (Error(kInvalidArgument) otherwise, as the template raises).
std::string apply_chat_template(ChatTemplate chat_template, std::span<const ChatMessage> messages,
                                bool add_generation_prompt);

}  // namespace longctx::model
