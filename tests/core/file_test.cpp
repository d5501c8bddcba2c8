#include "longctx/core/file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "longctx-file-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Names of every file left in the directory.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    return names;
  }

  static void write_plain(const std::string& file, const std::string& content) {
    std::ofstream out(file, std::ios::binary);
    out << content;
  }

  static std::string as_string(const std::vector<std::byte>& bytes) {
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  fs::path dir_;
};

// Returns the Error(kIo) that `call` must throw.
template <typename F>
Error expect_io_error(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error(ErrorCode::kInternal, "");
}

TEST_F(FileTest, AtomicWriteCreatesAndReplaces) {
  const std::string target = path("snapshot.bin");
  write_file_atomically(target, [](FileSink& sink) {
    sink.write("hello ", 6);
    sink.write("world", 5);
    sink.write("", 0);
  });
  EXPECT_EQ(as_string(read_file(target)), "hello world");

  write_file_atomically(target, [](FileSink& sink) { sink.write("replaced", 8); });
  EXPECT_EQ(as_string(read_file(target)), "replaced");
  EXPECT_EQ(listing(), std::vector<std::string>{"snapshot.bin"}) << "a temporary file was left behind";
}

TEST_F(FileTest, AtomicWriteOfManyMegabytes) {
  const std::string target = path("big.bin");
  std::vector<unsigned char> data(9 * 1024 * 1024 + 13);
  std::mt19937 rng(test_seed(11));
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  write_file_atomically(target, [&](FileSink& sink) {
    sink.write(data.data(), 1000);
    sink.write(data.data() + 1000, data.size() - 1000);
  });
  const MappedFile mapped(target);
  ASSERT_EQ(mapped.size(), data.size());
  EXPECT_EQ(std::memcmp(mapped.data(), data.data(), data.size()), 0);
}

TEST_F(FileTest, ThrowingBodyLeavesOldFileAndNoTemporary) {
  const std::string target = path("config.yaml");
  write_plain(target, "old content");
  EXPECT_THROW(write_file_atomically(target,
                                     [](FileSink& sink) {
                                       sink.write("new partial", 11);
                                       throw std::runtime_error("body failed");
                                     }),
               std::runtime_error);
  EXPECT_EQ(as_string(read_file(target)), "old content");
  EXPECT_EQ(listing(), std::vector<std::string>{"config.yaml"});

  // Without an old file, nothing at all remains.
  const std::string fresh = path("fresh.bin");
  EXPECT_THROW(write_file_atomically(fresh, [](FileSink&) { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_EQ(listing().size(), 1u);
}

TEST_F(FileTest, WriteIntoMissingDirectoryNamesThePath) {
  const std::string target = path("no/such/dir/out.bin");
  const Error e = expect_io_error([&] { write_file_atomically(target, [](FileSink& sink) { sink.write("x", 1); }); });
  EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
}

TEST_F(FileTest, MissingFileNamesThePath) {
  const std::string missing = path("missing.gguf");
  Error e = expect_io_error([&] { MappedFile file(missing); });
  EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  e = expect_io_error([&] { read_file(missing); });
  EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
}

TEST_F(FileTest, DirectoryIsNotARegularFile) {
  const Error e = expect_io_error([&] { MappedFile file(dir_.string()); });
  EXPECT_NE(std::string(e.what()).find(dir_.string()), std::string::npos) << e.what();
  expect_io_error([&] { read_file(dir_.string()); });
}

TEST_F(FileTest, FifoIsRefusedWithoutWaitingForAWriter) {
  // Opened without O_NONBLOCK, a FIFO with no writer blocks the open forever.
  const std::string fifo = path("pipe.gguf");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  Error e = expect_io_error([&] { MappedFile file(fifo); });
  EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  e = expect_io_error([&] { read_file(fifo); });
  EXPECT_NE(std::string(e.what()).find(fifo), std::string::npos) << e.what();
}

TEST_F(FileTest, AtomicWriteRefusesToReplaceWhatIsNotARegularFile) {
  const std::string fifo = path("pipe.kv");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const std::string& target : {fifo, dir_.string()}) {
    const Error e = expect_io_error([&] { write_file_atomically(target, [](FileSink& sink) { sink.write("x", 1); }); });
    EXPECT_EQ(std::string(e.what()), "cannot write '" + target + "': it exists and is not a regular file");
  }
  struct stat info;
  ASSERT_EQ(::stat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
}

TEST_F(FileTest, ReadFileRefusesMoreThanItsLimit) {
  const std::string target = path("limit.bin");
  write_plain(target, std::string(100, 'x'));
  EXPECT_EQ(read_file(target, 100).size(), 100u);
  const Error e = expect_io_error([&] { read_file(target, 99); });
  EXPECT_EQ(std::string(e.what()), "'" + target + "' is larger than 99 B, the most its reader takes");
  // A file whose size fstat does not know is stopped as it is read.
  if (!fs::exists("/proc/self/status")) GTEST_SKIP() << "no /proc";
  expect_io_error([&] { read_file("/proc/self/status", 8); });
}

TEST_F(FileTest, ReadFileAndMappedFileRoundTrip) {
  const std::string target = path("data.bin");
  std::string content;
  for (int i = 0; i < 10000; ++i) content += static_cast<char>(i * 7 + 3);
  write_plain(target, content);
  EXPECT_EQ(as_string(read_file(target)), content);

  MappedFile mapped(target);
  EXPECT_EQ(mapped.path(), target);
  ASSERT_EQ(mapped.size(), content.size());
  EXPECT_EQ(std::memcmp(mapped.data(), content.data(), content.size()), 0);

  // Moving hands over the mapping; the moved-from object holds nothing.
  MappedFile moved(std::move(mapped));
  EXPECT_EQ(moved.size(), content.size());
  EXPECT_EQ(mapped.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(mapped.size(), 0u);       // NOLINT(bugprone-use-after-move)
  const std::string other_path = path("other.bin");
  write_plain(other_path, "xy");
  MappedFile other(other_path);
  other = std::move(moved);
  EXPECT_EQ(other.size(), content.size());
  EXPECT_EQ(other.path(), target);
  EXPECT_EQ(std::memcmp(other.data(), content.data(), content.size()), 0);
}

TEST_F(FileTest, EmptyFiles) {
  const std::string target = path("empty.bin");
  write_file_atomically(target, [](FileSink&) {});
  ASSERT_TRUE(fs::exists(target));
  EXPECT_EQ(fs::file_size(target), 0u);
  EXPECT_TRUE(read_file(target).empty());
  const MappedFile mapped(target);
  EXPECT_EQ(mapped.size(), 0u);
}

TEST_F(FileTest, ReadsFilesWhoseSizeIsUnknown) {
  // /proc files report size 0 but have content: read_file reads to the end.
  if (!fs::exists("/proc/self/status")) GTEST_SKIP() << "no /proc";
  const std::string status = as_string(read_file("/proc/self/status"));
  EXPECT_NE(status.find("Name:"), std::string::npos);
}

}  // namespace
}  // namespace longctx
