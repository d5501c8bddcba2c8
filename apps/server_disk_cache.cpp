#include "server_disk_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "chat_session.h"
#include "longctx/core/crc32c.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"
#include "longctx/kvstore/snapshot.h"

namespace longctx::server {
namespace {

namespace fs = std::filesystem;

constexpr char kTokensMagic[8] = {'L', 'C', 'T', 'X', 'T', 'O', 'K', 'S'};
constexpr uint32_t kTokensVersion = 1;
constexpr const char* kTag = "longctx-server ";

uint32_t tokens_crc(const std::vector<int32_t>& tokens) {
  return crc32c(tokens.data(), tokens.size() * sizeof(int32_t));
}

std::string entry_name(const std::vector<int32_t>& tokens) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "seq-%08x-%zu", tokens_crc(tokens), tokens.size());
  return buf;
}

template <typename T>
void put(FileSink& out, T v) {
  out.write(&v, sizeof v);  // little-endian hosts only, like the snapshots
}

// The ids of a .tokens file; Error(kCorrupt) unless whole and consistent.
std::vector<int32_t> read_tokens(const std::string& path) {
  const std::vector<std::byte> bytes = read_file(path);
  const size_t head = sizeof kTokensMagic + 4 + 8;
  if (bytes.size() < head + 4 || std::memcmp(bytes.data(), kTokensMagic, sizeof kTokensMagic) != 0)
    fail(ErrorCode::kCorrupt, "'", path, "' is not a token list");
  uint32_t version, stored_crc;
  uint64_t n;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&n, bytes.data() + 12, 8);
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  if (version != kTokensVersion) fail(ErrorCode::kCorrupt, "'", path, "': token list version ", version);
  if (n > (bytes.size() - head - 4) / 4 || head + n * 4 + 4 != bytes.size())
    fail(ErrorCode::kCorrupt, "'", path, "': ", n, " tokens do not fit its ", bytes.size(), " bytes");
  if (crc32c(bytes.data(), bytes.size() - 4) != stored_crc) fail(ErrorCode::kCorrupt, "'", path, "': checksum mismatch");
  std::vector<int32_t> tokens(n);
  std::memcpy(tokens.data(), bytes.data() + head, n * 4);
  return tokens;
}

uint64_t file_bytes(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : uint64_t(n);
}

}  // namespace

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + ptrdiff_t(n), b.begin()).first - a.begin());
}

std::string DiskCache::layout_key(const kvstore::StoreLayout& l) {
  return str_cat("layers=", l.shape.n_layers, "/kv_heads=", l.shape.n_kv_heads, "/head_dim=", l.shape.head_dim,
                 "/kv_type=", dtype_name(l.kv_type), "/block_size=", l.block_size,
                 "/reps=", representative_type_name(l.rep_type), "x", l.rep_num);
}

DiskCache::DiskCache(std::string dir, uint64_t max_bytes, std::string model_fingerprint, std::string layout)
    : dir_(std::move(dir)), max_bytes_(max_bytes), model_fingerprint_(std::move(model_fingerprint)),
      layout_(std::move(layout)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail(ErrorCode::kIo, "--cache-dir ", dir_, ": cannot create it: ", ec.message());
  if (!fs::is_directory(dir_)) fail(ErrorCode::kIo, "--cache-dir ", dir_, ": not a directory");
  const std::string probe = str_cat(dir_, "/.longctx-write-test.", getpid());
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr) fail(ErrorCode::kIo, "--cache-dir ", dir_, " is not writable: ", std::strerror(errno));
  std::fclose(f);
  std::remove(probe.c_str());
  scan();
}

std::string DiskCache::fingerprint(const std::vector<int32_t>& tokens) const {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", tokens_crc(tokens));
  return str_cat(model_fingerprint_, "\n", kTag, "layout=", layout_, " tokens=", tokens.size(), " crc=", crc);
}

void DiskCache::scan() {
  // Stems with a .kv or .tokens file, and their files' newest mtime.
  std::map<std::string, fs::file_time_type> stems;
  for (const auto& item : fs::directory_iterator(dir_)) {
    const std::string file = item.path().filename().string();
    if (!file.starts_with("seq-")) continue;
    if (file.find(".tmp.") != std::string::npos) {  // a write a crash cut short
      std::error_code ec;
      fs::remove(item.path(), ec);
      removed_.push_back(file);
      continue;
    }
    const size_t dot = file.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string ext = file.substr(dot);
    if (ext != ".kv" && ext != ".tokens") continue;
    auto& t = stems[file.substr(0, dot)];
    t = std::max(t, item.last_write_time());
  }
  std::vector<std::pair<fs::file_time_type, Entry>> found;
  for (const auto& [stem, mtime] : stems) {
    const std::string kv = path(stem, ".kv");
    const std::string tokens_path = path(stem, ".tokens");
    try {
      if (!fs::exists(kv) || !fs::exists(tokens_path))
        fail(ErrorCode::kCorrupt, "half an entry (no ", fs::exists(kv) ? ".tokens" : ".kv", ")");
      const std::string stored = kvstore::read_snapshot_fingerprint(kv);
      if (!stored.starts_with(model_fingerprint_ + "\n" + kTag)) continue;  // another model: not ours to judge
      if (stored.find(str_cat("layout=", layout_, " ")) == std::string::npos) continue;  // another KV layout
      Entry e;
      e.tokens = read_tokens(tokens_path);
      if (stored != fingerprint(e.tokens) || stem != entry_name(e.tokens))
        fail(ErrorCode::kCorrupt, "its token list does not match its snapshot");
      e.name = stem;
      e.bytes = file_bytes(kv) + file_bytes(tokens_path);
      found.emplace_back(mtime, std::move(e));
    } catch (const Error& err) {
      remove(stem);
      removed_.push_back(str_cat(stem, " (", err.what(), ")"));
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [mtime, e] : found) {
    e.last_used = ++use_clock_;
    entries_.push_back(std::move(e));
  }
  evict();
}

const DiskCache::Entry* DiskCache::best_match(const std::vector<int32_t>& prompt, size_t& common) const {
  const Entry* best = nullptr;
  common = 0;
  for (const Entry& e : entries_)
    if (const size_t c = common_prefix(prompt, e.tokens); c > common) best = &e, common = c;
  return best;
}

void DiskCache::save(const kvstore::KVStore& store, const std::vector<int32_t>& tokens) {
  const std::string name = entry_name(tokens);
  const std::string tokens_path = path(name, ".tokens");
  // Tokens first: a .tokens without its .kv is removed at the next start.
  write_file_atomically(tokens_path, [&](FileSink& out) {
    std::vector<std::byte> bytes;
    auto append = [&](const void* p, size_t n) {
      bytes.insert(bytes.end(), static_cast<const std::byte*>(p), static_cast<const std::byte*>(p) + n);
    };
    const uint64_t n = tokens.size();
    append(kTokensMagic, sizeof kTokensMagic);
    append(&kTokensVersion, 4);
    append(&n, 8);
    append(tokens.data(), n * 4);
    out.write(bytes.data(), bytes.size());
    put(out, crc32c(bytes.data(), bytes.size()));
  });
  try {
    kvstore::save_snapshot(store, path(name, ".kv"), fingerprint(tokens));
  } catch (...) {
    remove(name);
    throw;
  }
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; }),
                 entries_.end());
  Entry e;
  e.name = name;
  e.tokens = tokens;
  e.bytes = file_bytes(path(name, ".kv")) + file_bytes(tokens_path);
  e.last_used = ++use_clock_;
  entries_.push_back(std::move(e));
  evict();
}

void DiskCache::load(const Entry& entry, kvstore::KVStore& store) {
  const std::string name = entry.name;
  try {
    kvstore::load_snapshot(store, path(name, ".kv"), fingerprint(entry.tokens), kvstore::LoadMode::kRead,
                           /*equal_layers=*/true);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kCorrupt || e.code() == ErrorCode::kIo) {
      remove(name);
      entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.name == name; }),
                     entries_.end());
    }
    throw;
  }
  for (Entry& e : entries_)
    if (e.name == name) e.last_used = ++use_clock_;
}

uint64_t DiskCache::bytes() const {
  uint64_t total = 0;
  for (const Entry& e : entries_) total += e.bytes;
  return total;
}

void DiskCache::remove(const std::string& name) {
  std::error_code ec;
  fs::remove(path(name, ".kv"), ec);  // the snapshot first: without it the tokens are an orphan, never served
  fs::remove(path(name, ".tokens"), ec);
}

void DiskCache::evict() {
  while (!entries_.empty() && bytes() > max_bytes_) {
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
    remove(lru->name);
    entries_.erase(lru);
  }
}

}  // namespace longctx::server
