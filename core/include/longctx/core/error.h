// The one error type of longctx. Library code throws longctx::Error on bad
// input or exhausted resources; it never calls exit() or abort(). Each
// operation that throws leaves the object it was called on as it was (strong
// guarantee) unless its comment says otherwise.
#pragma once

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace longctx {

enum class ErrorCode {
  kInvalidArgument,  // a caller passed a value outside the documented range
  kConfig,           // a configuration file or key is wrong
  kOutOfMemory,      // a budget (DRAM, pinned, GPU) or the OS refused memory
  kIo,               // a file could not be opened, read, written or renamed
  kCorrupt,          // a file's content fails validation (size, offset, checksum)
  kUnsupported,      // valid request this build or machine cannot serve
  kInternal,         // a broken invariant inside longctx (a bug)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Concatenates anything streamable: str_cat("block ", b, " of ", n).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

// A name for the check_* functions (tensor.h), joined from text and integers
// into a fixed buffer (cut at 127 characters): checks that run on every
// decode call name their subject with it, where str_cat's ostringstream took
// some 10 us per call with the caches cold, as a layer finds them after the
// other layers ran.
class CheckName {
 public:
  template <typename... Parts>
  explicit CheckName(const Parts&... parts) {
    (add(parts), ...);
  }
  const char* c_str() const { return text_; }

 private:
  void add(std::string_view text) {
    const size_t n = std::min(text.size(), sizeof(text_) - 1 - size_);
    std::memcpy(text_ + size_, text.data(), n);
    size_ += n;
    text_[size_] = '\0';
  }
  template <std::integral T>
  void add(T value) {
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof(digits), value).ptr;
    add(std::string_view(digits, size_t(end - digits)));
  }

  char text_[128] = {};
  size_t size_ = 0;
};

// Throws Error(code, str_cat(args...)).
template <typename... Args>
[[noreturn]] void fail(ErrorCode code, Args&&... args) {
  throw Error(code, str_cat(std::forward<Args>(args)...));
}

// Human-readable byte count: "1.50 GiB".
std::string format_bytes(unsigned long long bytes);

}  // namespace longctx
