#include "longctx/core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "longctx/core/error.h"

namespace longctx {
namespace {

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

std::string errno_text(int error) { return std::strerror(error); }

// Opens `path` for reading and checks it is a regular file; returns fd and size.
// O_NONBLOCK: opening a FIFO for reading would wait for a writer (forever, for
// a path given by mistake); it is refused as not a regular file instead. On a
// regular file the flag changes nothing.
int open_regular_file(const std::string& path, size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(ErrorCode::kIo, "cannot open '", path, "': ", errno_text(errno));
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail(ErrorCode::kIo, "cannot stat '", path, "': ", errno_text(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail(ErrorCode::kIo, "'", path, "' is not a regular file");
  }
  *size = static_cast<size_t>(info.st_size);
  return fd;
}

// The directory holding `path`, for fsync after a rename.
std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  size_t size = 0;
  const int fd = open_regular_file(path, &size);
  FdCloser closer(fd);
  if (size == 0) return;  // mmap cannot map zero bytes; an empty file is valid
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) {
    const int error = errno;
    fail(ErrorCode::kIo, "cannot map '", path, "' (", format_bytes(size), "): ", errno_text(error));
  }
  data_ = static_cast<const std::byte*>(mapping);
  size_ = size;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::drop_pages(size_t offset, size_t length) const {
  if (offset >= size_ || length == 0) return;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + std::min(length, size_ - offset));
  // A private read-only file mapping: MADV_DONTNEED only unmaps, the file keeps the bytes.
  ::madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::vector<std::byte> read_file(const std::string& path, size_t max_bytes) {
  size_t expected_size = 0;
  const int fd = open_regular_file(path, &expected_size);
  FdCloser closer(fd);
  const auto too_large = [&] {
    fail(ErrorCode::kIo, "'", path, "' is larger than ", format_bytes(max_bytes), ", the most its reader takes");
  };
  if (expected_size > max_bytes) too_large();
  // Read until end of file: the size from fstat is only a hint (the file may
  // change). One spare byte lets the final read see end of file without growing.
  std::vector<std::byte> bytes(expected_size + 1);
  size_t filled = 0;
  while (true) {
    if (filled == bytes.size()) bytes.resize(2 * bytes.size());
    const ssize_t got = ::read(fd, bytes.data() + filled, bytes.size() - filled);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, "cannot read '", path, "' at offset ", filled, ": ", errno_text(errno));
    }
    if (got == 0) break;
    filled += static_cast<size_t>(got);
    if (filled > max_bytes) too_large();  // it grew, or fstat did not know its size
  }
  bytes.resize(filled);
  return bytes;
}

namespace detail {

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), tmp_path_(path + ".tmp." + std::to_string(::getpid())) {
  // The rename at commit replaces whatever is at `path`: a FIFO or a device
  // (--save-kv /dev/null) would become a regular file.
  struct stat info;
  if (::stat(path_.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    fail(ErrorCode::kIo, "cannot write '", path_, "': it exists and is not a regular file");
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    fail(ErrorCode::kIo, "cannot write '", path_, "': cannot create temporary file '", tmp_path_,
         "': ", errno_text(errno));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

// After a failed write the descriptor is closed (fd_ = -1), so every later
// write() or commit() fails too and a partial file is never committed.
void AtomicFileWriter::write(const void* data, size_t n) {
  if (fd_ < 0) fail(ErrorCode::kIo, "cannot write '", path_, "': an earlier write or commit failed");
  const auto* bytes = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t written = ::write(fd_, bytes, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(std::exchange(fd_, -1));
      fail(ErrorCode::kIo, "cannot write '", tmp_path_, "' (temporary file for '", path_,
           "'): ", errno_text(error));
    }
    bytes += written;
    n -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) fail(ErrorCode::kIo, "cannot commit '", path_, "': an earlier write or commit failed");
  if (::fsync(fd_) != 0) {
    const int error = errno;
    ::close(std::exchange(fd_, -1));
    fail(ErrorCode::kIo, "cannot fsync '", tmp_path_, "' (temporary file for '", path_, "'): ",
         errno_text(error));
  }
  // close() can report a delayed write error (e.g. on NFS).
  if (::close(std::exchange(fd_, -1)) != 0) {
    fail(ErrorCode::kIo, "cannot close '", tmp_path_, "' (temporary file for '", path_, "'): ",
         errno_text(errno));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    fail(ErrorCode::kIo, "cannot rename '", tmp_path_, "' to '", path_, "': ", errno_text(errno));
  }
  committed_ = true;

  // Make the rename itself durable. Some file systems cannot fsync a
  // directory (EINVAL); the rename has happened, so that is not an error.
  const std::string directory = parent_directory(path_);
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    fail(ErrorCode::kIo, "wrote '", path_, "' but cannot open its directory '", directory,
         "' to fsync it: ", errno_text(errno));
  }
  FdCloser closer(dir_fd);
  if (::fsync(dir_fd) != 0 && errno != EINVAL) {
    fail(ErrorCode::kIo, "wrote '", path_, "' but cannot fsync its directory '", directory, "': ",
         errno_text(errno));
  }
}

}  // namespace detail
}  // namespace longctx
