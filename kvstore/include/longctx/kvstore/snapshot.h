// Snapshots: the whole KV store in one file, saved once, loaded many times.
// The format is described in docs/snapshot-format.md.
#pragma once

#include <string>

#include "longctx/kvstore/kv_store.h"

namespace longctx::kvstore {

enum class LoadMode { kRead, kMmap };

// Writes every layer, block, representative record, token count, the layout
// and `fingerprint` (an identifier of the model, chosen by the caller) to
// `path`, atomically (temp file, fsync, rename). Error(kIo) on failure, and
// `path` is then untouched.
void save_snapshot(const KVStore& store, const std::string& path, const std::string& fingerprint);

// The fingerprint save_snapshot wrote at `path`, once the header checks out
// (size, magic, version, header checksum, fields: load_snapshot's first
// steps), without reading the blocks: a caller can compare it with its own
// before loading. Error(kIo) when unreadable, kCorrupt or kUnsupported as
// load_snapshot says them.
std::string read_snapshot_fingerprint(const std::string& path);

// Replaces the content of `store` with the snapshot at `path`. Every size,
// offset and checksum is validated, and the layout and fingerprint are checked
// against the store and `expected_fingerprint`, before the store is touched:
// on any error (kIo, kCorrupt, kInvalidArgument for a mismatch, kOutOfMemory)
// the store is byte-identical to before. With equal_layers the snapshot must
// hold as many tokens in every layer, as the store of a model's Sequence
// does (Sequence::sync_with_store refuses anything else, but only after the
// load): kInvalidArgument otherwise, before the store is touched.
void load_snapshot(KVStore& store, const std::string& path, const std::string& expected_fingerprint,
                   LoadMode mode = LoadMode::kRead, bool equal_layers = false);

// Lets snapshot code reach the store's pages (the only code that may).
class SnapshotAccess {
 public:
  static const std::vector<std::byte*>& pages(const KVStore& s, int layer, int kv_head) {
    return s.head_cache(layer, kv_head).pages;
  }
  static const std::vector<std::byte*>& rep_pages(const KVStore& s, int layer, int kv_head) {
    return s.head_cache(layer, kv_head).rep_pages;
  }
  // Replaces layer/head page lists and token counts wholesale (pages must come
  // from the store's pools, via allocate_pages); old pages are released.
  static void install(KVStore& s, std::vector<std::vector<std::byte*>> pages,
                      std::vector<std::vector<std::byte*>> rep_pages, std::vector<int64_t> n_tokens);
  // Allocates pages for kv head `kv_head` from its node's pools (all or nothing).
  static std::vector<std::byte*> allocate_pages(KVStore& s, int kv_head, size_t n);
  static std::vector<std::byte*> allocate_rep_pages(KVStore& s, int kv_head, size_t n);
  static void release_pages(KVStore& s, int kv_head, const std::vector<std::byte*>& pages);
  static void release_rep_pages(KVStore& s, int kv_head, const std::vector<std::byte*>& pages);
};

}  // namespace longctx::kvstore
