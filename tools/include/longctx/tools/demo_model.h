// The embedded demo model: a 2-layer Llama-architecture GGUF whose weights are
// written down analytically (no training) so that its greedy answer to a
// pass-key haystack ("... The pass key is 73912. ... The pass key is") is
// " 73912" followed by </s>, wherever the key sits in up to 2^20 tokens.
// Every answer digit is retrieved by a decode step from far away, so the
// answer needs long-range attention: full attention and QUEST selection find
// it, sinks + a local window (StreamingLLM) answer " " and stop.
// tools/DEMO_MODEL.md derives the weights and the margins; in short:
//   layer 0, head h (h < 5): attends the bare "▁" token exactly h+1 positions
//     back (a RoPE "offset detector" on the 11 fast pairs), writing slot tag
//     h+1 into the residual stream: digit i of a number gets tag i.
//   layer 1, head 0: the query of a token with slot tag s (the "▁" itself has
//     s = 0) matches keys with tag s+1 on the 5 slowest RoPE pairs (theta 1e10:
//     they turn < 0.15 rad over 2^20 positions); the value carries the digit.
//   output: the retrieved digit if any; </s> after a tagged token with no
//     digit retrieved; "▁" otherwise (so any prompt starts the answer).
// The file uses the standard layout of tools/test_model.h (llama.cpp tensor
// names and keys, SPM vocabulary, llama2 chat template), f32 tensors whose
// values are all bf16-exact, so a bf16 backend computes with the same weights.
#pragma once

#include <string>
#include <vector>

#include "longctx/model/gguf_writer.h"
#include "longctx/model/tokenizer.h"

namespace longctx::tools {

// Shape and constants of the construction (see DEMO_MODEL.md).
struct DemoModelShape {
  static constexpr int kKeyDigits = 5;    // digits of a pass key (= layer-0 slot heads)
  static constexpr int kLayers = 2;
  static constexpr int kHeads = 5;        // = kKeyDigits; kv heads the same (MHA)
  static constexpr int kHeadDim = 32;     // 16 RoPE pairs
  static constexpr int kEmbd = 32;
  static constexpr int kFf = 32;          // MLP weights are zero: SwiGLU adds 0
  static constexpr float kRopeTheta = 1e10f;
  static constexpr int kFastPairs = 11;   // pairs 0..10 form the offset detector
  static constexpr int kFirstSlowPair = 11;  // pairs 11..15 carry slot content
  static constexpr int64_t kContextLength = int64_t{1} << 20;
  // Residual stream dimensions (explicit feature slots).
  static constexpr int kBiasDim = 0;      // constant kBias in every token: keeps RMSNorm ~fixed
  static constexpr int kMarkerDim = 1;    // the bare "▁" token (slot tag 0)
  static constexpr int kDigitDim = 2;     // 2..11: digit one-hot
  static constexpr int kTagDim = 12;      // 12..16: slot tag 1..5 (written by layer 0)
  static constexpr int kRetrievedDim = 17;  // 17..26: retrieved digit (written by layer 1)
  static constexpr float kBias = 16.0f;
};

// The demo tokenizer: <unk> <s> </s>, the 256 byte tokens, "▁", the printable
// ASCII characters, "▁" + each printable non-digit character (so a bare "▁"
// appears only before a digit), then the prefixes "▁w", "▁wo", ... "▁word"
// of the words of the haystack text, question and chat template. Digits are
// single tokens.
model::Vocab demo_vocab();

// The model as a GGUF writer (call .write(path) or .to_bytes()). Deterministic.
model::GgufWriter make_demo_model();

// The sentences the haystack generator uses (demo_vocab covers their words).
const std::vector<std::string>& demo_filler_sentences();
std::string demo_key_sentence(const std::string& key);  // "The pass key is K. Remember it. K is the pass key."
const std::string& demo_question();                     // "What is the pass key? The pass key is"

}  // namespace longctx::tools
