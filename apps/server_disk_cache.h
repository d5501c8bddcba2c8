// longctx-server's prompt cache on disk (--cache-dir): sequences that left
// DRAM, kept as KV snapshots with the tokens they hold, within a byte budget,
// least recently used out first; read back at the next start.
//
// An entry is two files named after its tokens, "seq-<crc32c>-<n>":
//   .tokens  "LCTXTOKS", u32 version 1, u64 n, n x i32 token ids, u32 CRC32C
//            of everything before it;
//   .kv      a KV snapshot (docs/snapshot-format.md, checksummed) whose
//            fingerprint is the model's, a newline, and
//            "longctx-server layout=<kv layout> tokens=<n> crc=<crc32c of the ids>".
// Both are written atomically (temp file, fsync, rename), tokens first; an
// entry counts only when both are there and agree. A start removes what a
// crash left (temp files, a .tokens without its .kv, either half damaged), so
// a torn entry is never served; entries of another model or KV layout are
// left alone and not counted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/kvstore/kv_store.h"

namespace longctx::server {

// How many tokens two lists share from the start: how the prompt cache, in
// DRAM and on disk, measures what a cached sequence can give a prompt.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

class DiskCache {
 public:
  struct Entry {
    std::string name;  // "seq-<crc>-<n>", the files' stem
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;      // both files
    uint64_t last_used = 0;  // order of use; loaded entries start at their files' mtime order
  };

  // Creates `dir` if missing and checks that it is writable (Error(kIo)
  // naming it otherwise), then reads its entries. `model_fingerprint` and
  // `layout` identify what this server's snapshots hold (layout_key()).
  DiskCache(std::string dir, uint64_t max_bytes, std::string model_fingerprint, std::string layout);

  // What a store's snapshot must match to load into it: its kv type, block
  // size, representatives and shape.
  static std::string layout_key(const kvstore::StoreLayout& layout);

  // The entry sharing the longest token prefix with `prompt` (null if none
  // shares a token); `common` gets that length.
  const Entry* best_match(const std::vector<int32_t>& prompt, size_t& common) const;
  // Writes `store` holding `tokens` as an entry (replacing one with the same
  // tokens), then removes least recently used entries while over the budget.
  // Error(kIo) when it cannot be written; the cache is then as before.
  void save(const kvstore::KVStore& store, const std::vector<int32_t>& tokens);
  // Loads the entry into `store` and marks it used. A damaged entry is removed
  // and the error (kCorrupt, kIo) rethrown; `store` is then unchanged.
  void load(const Entry& entry, kvstore::KVStore& store);

  uint64_t bytes() const;
  size_t size() const { return entries_.size(); }
  const std::string& dir() const { return dir_; }
  // Files removed at the start as torn or damaged (for the log).
  const std::vector<std::string>& removed() const { return removed_; }

 private:
  std::string path(const std::string& name, const char* ext) const { return dir_ + "/" + name + ext; }
  std::string fingerprint(const std::vector<int32_t>& tokens) const;
  void scan();
  void remove(const std::string& name);
  void evict();

  std::string dir_;
  uint64_t max_bytes_;
  std::string model_fingerprint_, layout_;
  std::vector<Entry> entries_;
  std::vector<std::string> removed_;
  uint64_t use_clock_ = 0;
};

}  // namespace longctx::server
