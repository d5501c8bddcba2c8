// The tokenizers of the test models (test_model.h), as tokenizer.ggml.*
// metadata: a SentencePiece vocabulary of any size and a Llama-3 byte-level
// BPE vocabulary. Internal to tools/.
#pragma once

#include "longctx/model/gguf_writer.h"

namespace longctx::tools::detail {

// <unk> <s> </s>, the byte tokens <0x00>..<0xFF>, then scored pieces of
// English text up to n_vocab tokens (>= kSpmMinVocab); the Llama-2 chat
// template.
constexpr int kSpmMinVocab = 3 + 256;
void add_spm_tokenizer(model::GgufWriter& w, int n_vocab);

// Llama-3's layout (tokenizer.ggml.model "gpt2", pre "llama-bpe"): 128256
// tokens = 256 byte tokens (GPT-2 byte-to-unicode characters, in its
// order), 127744 tokens each built by one merge (rank = id - 256) of a
// shorter token and one character (spaces, digit groups, English letter
// n-grams with and without a leading space), then the 256 special tokens of
// Llama 3.1 at 128000.. (<|begin_of_text|>, <|end_of_text|>,
// <|start_header_id|>, <|end_header_id|>, <|eom_id|>, <|eot_id|>,
// <|python_tag|>, <|finetune_right_pad_id|>, reserved ones); BOS 128000,
// EOS = EOT 128009 (<|eot_id|>, as the Instruct models); the Llama-3 chat
// template.
constexpr int kLlama3VocabSize = 128256;
void add_llama3_tokenizer(model::GgufWriter& w);

}  // namespace longctx::tools::detail
