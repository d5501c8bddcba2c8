// Pass-key haystack documents for the demo model (demo_model.h): filler
// sentences, the key sentence at a chosen depth, and the question at the end,
// deterministic from a seed. The sidecar JSON records what was hidden where
// so that tests and benchmarks check answers automatically.
#pragma once

#include <cstdint>
#include <string>

#include "longctx/model/tokenizer.h"

namespace longctx::tools {

struct HaystackSpec {
  int64_t tokens = 32768;  // upper bound on the document's tokens (BOS included)
  double depth = -1.0;     // where the key sentence starts, in [0, 1] of the filler; < 0: drawn from the seed
  uint64_t seed = 1;       // filler order, the key, and the depth when not given
  bool question = true;    // end the text with demo_question()
};

struct Haystack {
  std::string text;       // the document (one line, no trailing newline)
  std::string key;        // the hidden pass key (demo key length, first digit non-zero)
  std::string question;   // demo_question(), whether or not it is in the text
  double depth = 0.0;     // the depth used
  int64_t n_tokens = 0;   // tokenizer.encode(text, add_bos = true).size()
  int64_t key_token = 0;  // index in those tokens of the key's first digit
};

// Builds the document with `tokenizer` (the demo vocabulary) counting tokens;
// Error(kInvalidArgument) when spec.tokens cannot hold the key sentence and
// the question, or depth > 1.
Haystack make_haystack(const HaystackSpec& spec, const model::Tokenizer& tokenizer);

// {"key": "73912", "depth": 0.37, "tokens": 32760, "key_token": 12121, "seed": 1, "question": "..."}
std::string haystack_json(const Haystack& haystack, uint64_t seed);

}  // namespace longctx::tools
