// Files from outside are untrusted: these helpers give bounds-checked access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace longctx {

// A read-only memory mapping of a whole file. Move-only; unmaps on destruction.
class MappedFile {
 public:
  // Throws Error(kIo) naming the path when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the resident pages of bytes [offset, offset + length) from this
  // process (they stay in the page cache and read back the same if touched
  // again): once a loader has copied them, they need not count twice.
  void drop_pages(size_t offset, size_t length) const;

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole regular file into memory: Error(kIo) naming the path when it
// cannot, or when the file holds more than max_bytes (before that much
// memory is taken: a file that is not what the caller reads may be huge).
std::vector<std::byte> read_file(const std::string& path, size_t max_bytes = SIZE_MAX);

// Writes a file atomically: the bytes go to "<path>.tmp.<pid>", which is
// fsync'ed and renamed over `path`, and the directory is fsync'ed. On any
// failure the temp file is removed, `path` is untouched, and Error(kIo) is thrown.
// `write_body` is called with a sink that appends bytes.
class FileSink {
 public:
  virtual ~FileSink() = default;
  virtual void write(const void* data, size_t n) = 0;
};
template <typename F>
void write_file_atomically(const std::string& path, F&& write_body);

namespace detail {
class AtomicFileWriter : public FileSink {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter() override;  // removes the temp file unless committed
  void write(const void* data, size_t n) override;
  void commit();  // fsync, rename, fsync dir
 private:
  std::string path_, tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};
}  // namespace detail

template <typename F>
void write_file_atomically(const std::string& path, F&& write_body) {
  detail::AtomicFileWriter writer(path);
  write_body(static_cast<FileSink&>(writer));
  writer.commit();
}

}  // namespace longctx
