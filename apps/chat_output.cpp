#include "chat_output.h"

#include <unistd.h>

#include <algorithm>

#include "longctx/core/error.h"

namespace longctx::chat {

size_t complete_utf8_prefix(const std::string& bytes) {
  // Look at most 3 bytes back for the lead byte of a sequence still open.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto b = static_cast<unsigned char>(bytes[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    const size_t len = b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

void Utf8Stream::write(const std::string& piece) {
  pending_ += piece;
  const size_t n = complete_utf8_prefix(pending_);
  if (n == 0) return;
  std::fwrite(pending_.data(), 1, n, out_);
  std::fflush(out_);
  pending_.erase(0, n);
}

void Utf8Stream::finish() {
  if (!pending_.empty()) std::fwrite(pending_.data(), 1, pending_.size(), out_);
  pending_.clear();
  std::fflush(out_);
}

Progress::Progress(std::FILE* out, int64_t tokens)
    : out_(out), tty_(isatty(fileno(out)) != 0), tokens_(tokens), start_(std::chrono::steady_clock::now()) {}

std::string Progress::position(int64_t done, int64_t total) const {
  // Prefill runs layer by layer over the whole prompt, so done counts
  // token-layers: where it stands is a layer and a token of that layer.
  if (tokens_ > 0 && total % tokens_ == 0) {
    const int64_t layers = total / tokens_;
    // 0-based; the end of a layer (done = k * tokens_) still counts as that layer
    const int64_t layer = std::clamp<int64_t>((done - 1) / tokens_, 0, layers - 1);
    const std::string tokens = str_cat(done - layer * tokens_, "/", tokens_, " tokens");
    return layers > 1 ? str_cat("layer ", layer + 1, "/", layers, ", ", tokens) : tokens;
  }
  return str_cat(static_cast<int64_t>(double(done) / double(total) * double(tokens_)), "/", tokens_, " tokens");
}

void Progress::update(int64_t done, int64_t total) {
  if (total <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double fraction = double(done) / double(total);
  // The rate in prompt tokens: the whole prompt through every layer counts once.
  const double rate = seconds > 0 ? fraction * double(tokens_) / seconds : 0.0;
  const double eta = fraction > 0 ? seconds * (1 - fraction) / fraction : 0.0;
  if (tty_) {
    // Redraw at most 10 times a second, and at the end.
    if (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\rprefill [%s] %s  %.0f tok/s  ETA %.0fs   ", bar.c_str(), position(done, total).c_str(),
                 rate, eta);
    std::fflush(out_);
    drawn_ = true;
    last_draw_ = now;
    return;
  }
  const int decile = static_cast<int>(fraction * 10);
  if (decile == last_decile_ || decile == 0) return;
  last_decile_ = decile;
  std::fprintf(out_, "prefill: %d%% (%s, %.0f tok/s, ETA %.0f s)\n", decile * 10, position(done, total).c_str(),
               rate, eta);
  std::fflush(out_);
}

void Progress::finish() {
  if (tty_ && drawn_) std::fputc('\n', out_);
  std::fflush(out_);
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace longctx::chat
