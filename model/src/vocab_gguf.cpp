// tokenizer_from_gguf / vocab_from_gguf: the tokenizer.ggml.* metadata of a
// GGUF file as a Vocab, validated by building a Tokenizer from it, so that
// every error names the file and the key. Only tokenizer.* keys are read.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/model/gguf.h"
#include "longctx/model/tokenizer.h"

namespace longctx::model {
namespace {

int32_t special_id(const GgufFile& file, const char* key, size_t n_vocab) {
  if (!file.has(key)) return -1;
  const int64_t id = file.get_int(key);
  if (id < 0 || uint64_t(id) >= n_vocab)
    fail(ErrorCode::kCorrupt, file.name(), ": ", key, " is ", id, ", outside [0, ", n_vocab, ")");
  return int32_t(id);
}

// The tokenizer.* keys as a Vocab, before the Tokenizer's own checks.
Vocab read_vocab(const GgufFile& file) {
  Vocab v;
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model == "llama") {
    v.kind = TokenizerKind::kSpm;
  } else if (model == "gpt2") {
    v.kind = TokenizerKind::kBpe;
  } else {
    fail(ErrorCode::kUnsupported, file.name(), ": tokenizer.ggml.model '", model,
         "' is not supported (llama, gpt2)");
  }
  if (v.kind == TokenizerKind::kBpe) {
    const std::string pre = file.get_string_or("tokenizer.ggml.pre", "");
    try {
      v.pre = parse_pre_tokenizer(pre);
    } catch (const Error& e) {
      fail(e.code(), file.name(), ": ", e.what());
    }
  }

  for (const std::string_view token : file.get_string_array("tokenizer.ggml.tokens")) v.tokens.emplace_back(token);
  const size_t n = v.tokens.size();
  if (file.has("tokenizer.ggml.scores")) {
    v.scores = file.get_f32_array("tokenizer.ggml.scores");
    if (v.scores.size() != n)
      fail(ErrorCode::kCorrupt, file.name(), ": tokenizer.ggml.scores has ", v.scores.size(),
           " entries, tokenizer.ggml.tokens has ", n);
  }
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<int32_t> types = file.get_i32_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      fail(ErrorCode::kCorrupt, file.name(), ": tokenizer.ggml.token_type has ", types.size(),
           " entries, tokenizer.ggml.tokens has ", n);
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      // 0 is the converters' "undefined": treated as normal.
      if (types[i] < 0 || types[i] > int32_t(TokenType::kByte))
        fail(ErrorCode::kCorrupt, file.name(), ": tokenizer.ggml.token_type[", i, "] is ", types[i],
             ", not a token type (0..6)");
      v.types.push_back(types[i] == 0 ? TokenType::kNormal : TokenType(types[i]));
    }
  }
  if (file.has("tokenizer.ggml.merges"))
    for (const std::string_view merge : file.get_string_array("tokenizer.ggml.merges")) v.merges.emplace_back(merge);

  v.bos = special_id(file, "tokenizer.ggml.bos_token_id", n);
  v.eos = special_id(file, "tokenizer.ggml.eos_token_id", n);
  v.eot = special_id(file, "tokenizer.ggml.eot_token_id", n);
  v.unk = special_id(file, "tokenizer.ggml.unknown_token_id", n);
  v.pad = special_id(file, "tokenizer.ggml.padding_token_id", n);
  // Defaults as in llama.cpp: SPM, Llama-3, Tekken and Chameleon add BOS, other BPE models do not.
  const bool bos_default = v.kind == TokenizerKind::kSpm || pre_tokenizer_info(v.pre).add_bos;
  v.add_bos = file.get_bool_or("tokenizer.ggml.add_bos_token", bos_default);
  v.add_eos = file.get_bool_or("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = file.get_bool_or("tokenizer.ggml.add_space_prefix", v.kind == TokenizerKind::kSpm);
  v.chat_template = file.get_string_or("tokenizer.chat_template", "");
  return v;
}

}  // namespace

Tokenizer tokenizer_from_gguf(const GgufFile& file) {
  Vocab v = read_vocab(file);
  try {
    return Tokenizer(std::move(v));  // every remaining rule (merges, byte tokens, ...)
  } catch (const Error& e) {
    fail(e.code(), file.name(), ": ", e.what());
  }
}

Vocab vocab_from_gguf(const GgufFile& file) { return tokenizer_from_gguf(file).vocab(); }

Tokenizer open_tokenizer(const std::string& path) { return tokenizer_from_gguf(GgufFile::open(path)); }

}  // namespace longctx::model
