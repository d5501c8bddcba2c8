// longctx-chat's terminal output: the answer streamed as whole UTF-8
// characters, and the prefill progress (a bar on a terminal, lines otherwise).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace longctx::chat {

// Writes token pieces to `out` as they come, holding back a UTF-8 sequence
// that a piece left incomplete until the next piece completes it.
class Utf8Stream {
 public:
  explicit Utf8Stream(std::FILE* out) : out_(out) {}
  void write(const std::string& piece);
  // Writes whatever is held back (an invalid or cut sequence, as bytes).
  void finish();

 private:
  std::FILE* out_;
  std::string pending_;
};

// The length of the longest prefix of `bytes` that does not end inside a
// UTF-8 sequence (an invalid byte counts as complete: it is written as is).
size_t complete_utf8_prefix(const std::string& bytes);

// Prefill progress on `out` (stderr): on a terminal one line redrawn with \r,
// "prefill [#####.....] layer 1/2, 12288/32768 tokens  2450 tok/s  ETA 8s";
// otherwise a plain line at every 10%. Prefill runs each layer over the
// whole prompt, so the line names the layer and the token in it; the rate is
// in prompt tokens (the prompt through every layer counts once).
class Progress {
 public:
  Progress(std::FILE* out, int64_t tokens);
  // done/total in the Sequence's units (token-layers).
  void update(int64_t done, int64_t total);
  void finish();

 private:
  // "layer 2/32, 8192/131075 tokens" (only the tokens for one layer), built
  // only for a line that is drawn.
  std::string position(int64_t done, int64_t total) const;

  std::FILE* out_;
  bool tty_;
  int64_t tokens_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int last_decile_ = -1;
  bool drawn_ = false;
};

// "12.3 MiB"
std::string format_bytes(uint64_t bytes);

}  // namespace longctx::chat
