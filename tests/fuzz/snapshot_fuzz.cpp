// libFuzzer entry for the KV store snapshot loader (kvstore/src/snapshot.cpp).
//
// Input byte 0 chooses the mode:
//   raw (flags % 4 == 0): the bytes after byte 1 are the file; byte 1 chooses
//     the target store's config. Reaches the header checks.
//   structured (otherwise): a valid snapshot of a small store with random K/V
//     (config byte 1, token counts byte 3) is patched by 13-byte records
//     (kind u8, offset u32, value u64), then, unless flags say not to, resized
//     to the size its (patched) header implies, its block CRCs, trailer and
//     header CRC recomputed the way save_snapshot writes them, so that the
//     field and content checks behind the checksums are reached.
// The file is loaded (kRead or kMmap) into a fresh store of the same config
// or another one (byte 2), empty or holding tokens, with the expected
// fingerprint either the saved one or what read_snapshot_fingerprint returns
// (as longctx-chat --load-kv does).
//
// Expected: longctx::Error (not kInternal) with the store unchanged, or a
// store whose every block, value and record reads back within bounds, that
// saves back to the same bytes (up to the version field) and that takes
// appends / add_importance. Anything else (crash, sanitizer report, another
// exception such as std::bad_alloc, a store changed by a failed load, an
// allocation over -rss_limit_mb) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/crc32c.h"
#include "longctx/core/error.h"
#include "longctx/kvstore/snapshot.h"
#include "../kvstore/snapshot_store.h"

namespace {

using namespace longctx;
using namespace longctx::kvstore;
using namespace longctx::kvstore::snapshot_testing;
using RT = RepresentativeType;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "snapshot_fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

const char* const kFingerprint = "fuzz-model";

// ---- configs -------------------------------------------------------------------

constexpr int kNumConfigs = 160;

struct StoreSpec {
  KVShape shape;
  LongContextConfig cfg;
};

StoreSpec spec_of(int index, bool small_capacity) {
  index %= kNumConfigs;
  static const DType kTypes[] = {DType::kF16, DType::kBF16, DType::kF32, DType::kQ8_0};
  static const RT kReps[] = {RT::kQuest, RT::kMean, RT::kDynamic, RT::kMax, RT::kFix};
  static const int kBlockSizes[] = {4, 3, 8, 1};
  StoreSpec s;
  const DType kv = kTypes[index % 4];
  const RT rep = kReps[(index / 4) % 5];
  const bool tail = (index / 20) % 2 == 1;
  const int bs = kBlockSizes[(index / 40) % 4];
  s.shape = KVShape{2, 2, kv == DType::kQ8_0 ? 32 : 8};
  s.cfg = small_config(rep, kv, bs, small_capacity ? 16 : 64);
  if (rep == RT::kFix || rep == RT::kDynamic) s.cfg.representative_num = std::min(3, bs);  // blocks of 1 to 3 tokens
  s.cfg.tail = tail ? TailMode::kEstimate : TailMode::kDrop;
  return s;
}

MemoryBudget& budget() {
  static MemoryBudget b(uint64_t{1} << 30);
  return b;
}

std::unique_ptr<KVStore> make_store(const StoreSpec& s) {
  return std::make_unique<KVStore>(s.shape, s.cfg, budget(), topology());
}

// ---- files ---------------------------------------------------------------------

std::string temp_path(const char* tag) { return "/tmp/longctx_snapfuzz_" + std::to_string(::getpid()) + tag; }

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) finding("cannot write the temp file " + path);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) finding("short write");
  std::fclose(f);
}

constexpr int kNumTokenVariants = 4;
const int64_t kTokens[kNumTokenVariants][2] = {{13, 6}, {0, 0}, {8, 8}, {1, 17}};

// A valid snapshot of a store of config `config` holding token variant `variant` (cached).
const std::vector<uint8_t>& valid_snapshot(int config, int variant) {
  static std::map<int, std::vector<uint8_t>> cache;
  const int key = config * kNumTokenVariants + variant;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const StoreSpec spec = spec_of(config, false);
  auto store = make_store(spec);
  for (int layer = 0; layer < 2; ++layer) {
    const int64_t n = kTokens[variant][layer];
    append_random(*store, layer, n / 2, uint32_t(key * 7 + layer));
    append_random(*store, layer, n - n / 2, uint32_t(key * 7 + layer + 3));
  }
  const std::string path = temp_path(".seed");
  save_snapshot(*store, path, kFingerprint);
  auto bytes = read_all(path);
  std::remove(path.c_str());
  return cache.emplace(key, std::move(bytes)).first->second;
}

// ---- checksum repair (get_le, put_le: snapshot_store.h) ----------------------------

// Header fields: offset and width (docs/snapshot-format.md).
struct Field {
  size_t at;
  int width;
};
constexpr Field kFields[] = {{8, 4},  {12, 4}, {16, 4}, {20, 4}, {24, 4}, {28, 4}, {32, 4}, {36, 4}, {40, 4},
                             {44, 4}, {48, 8}, {56, 8}, {64, 8}, {72, 8}, {80, 8}, {88, 4}};
constexpr int kNumFields = sizeof kFields / sizeof kFields[0];

struct Plan {
  bool ok = false;
  uint64_t header_bytes = 0, page_bytes = 0, record_bytes = 0, file_bytes = 0;
  std::vector<uint64_t> block_offsets;  // only those inside the limit
};

// The body the header describes (as plan_body does), with blocks up to `limit` bytes.
Plan plan_of(const std::vector<uint8_t>& f, uint64_t limit) {
  Plan p;
  if (f.size() < 104) return p;
  p.header_bytes = get_le(f, 12, 4);
  const uint64_t n_layers = get_le(f, 16, 4), n_heads = get_le(f, 20, 4), bs = get_le(f, 28, 4);
  p.page_bytes = get_le(f, 48, 8);
  p.record_bytes = get_le(f, 56, 8);
  const uint64_t fp = get_le(f, 88, 4);
  if (n_layers == 0 || n_layers > 4096 || n_heads == 0 || n_heads > 4096 || bs == 0 || fp > 4096) return p;
  if (p.header_bytes != 92 + fp + 8 * n_layers + 4 || p.header_bytes > f.size()) return p;
  if (p.page_bytes > (uint64_t{1} << 32) || p.record_bytes > (uint64_t{1} << 32)) return p;
  const uint64_t stride = p.page_bytes + p.record_bytes + 4;
  uint64_t offset = p.header_bytes;
  for (uint64_t layer = 0; layer < n_layers; ++layer) {
    const uint64_t n_tokens = get_le(f, 92 + fp + 8 * layer, 8);
    if (n_tokens > (uint64_t{1} << 40)) return p;
    const uint64_t n_blocks = (n_tokens + bs - 1) / bs;
    for (uint64_t h = 0; h < n_heads; ++h) {
      for (uint64_t b = 0; b < n_blocks; ++b) {
        if (offset + stride > limit) return p;
        p.block_offsets.push_back(offset);
        offset += stride;
      }
    }
  }
  p.file_bytes = offset + 16;
  p.ok = true;
  return p;
}

void fix_header_crc(std::vector<uint8_t>& f) {
  if (f.size() < 16) return;
  const uint64_t hb = get_le(f, 12, 4);
  if (hb < 8 || hb > f.size()) return;
  put_le(f, size_t(hb - 4), crc32c(f.data(), size_t(hb - 4)), 4);
}

void fix_body(std::vector<uint8_t>& f, bool resize, bool fix_blocks) {
  constexpr uint64_t kMaxFile = uint64_t{4} << 20;
  Plan p = plan_of(f, resize ? kMaxFile : f.size());
  if (resize && p.ok && p.file_bytes <= kMaxFile) {
    f.resize(size_t(p.file_bytes), 0);
    std::memcpy(f.data() + f.size() - 16, "LCTXEND.", 8);
    put_le(f, f.size() - 8, f.size(), 8);
  }
  if (!fix_blocks) return;
  for (uint64_t at : p.block_offsets) {
    const uint64_t end = at + p.page_bytes + p.record_bytes + 4;
    if (end > f.size()) break;
    uint8_t offset_le[8];
    for (int i = 0; i < 8; ++i) offset_le[i] = uint8_t(at >> (8 * i));
    const uint32_t crc = crc32c(offset_le, 8, crc32c(f.data() + at, size_t(p.page_bytes + p.record_bytes)));
    put_le(f, size_t(at + p.page_bytes + p.record_bytes), crc, 4);
  }
}

// Value patterns that bring NaN, Inf and odd integers into pages and records.
uint64_t special_value(uint64_t v) {
  static const uint64_t kSpecial[] = {
      0x7E00,      0x7C00,       0xFC00,     0x7FFF,     0x7FC00000, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
      0x7FC0,      0xFF80,       0x7F80,     0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x00000100, 0x7BFF,
      0x0001,      0x3C00,       0x4F800000, 0xCF000000, 0x7FC07FC0, 0x0000007F, 0x00000080, 0x7E007E00};
  return kSpecial[v % (sizeof kSpecial / sizeof kSpecial[0])];
}

void apply_patch(std::vector<uint8_t>& f, const uint8_t* rec) {
  const uint8_t kind = rec[0];
  uint32_t off;
  uint64_t value;
  std::memcpy(&off, rec + 1, 4);
  std::memcpy(&value, rec + 5, 8);
  switch (kind % 9) {
    case 0:  // one byte
      if (!f.empty()) f[off % f.size()] = uint8_t(value);
      break;
    case 1:  // u32
      if (f.size() >= 4) put_le(f, off % (f.size() - 3), value, 4);
      break;
    case 2:  // u64
      if (f.size() >= 8) put_le(f, off % (f.size() - 7), value, 8);
      break;
    case 3: {  // a header field, or n_tokens of a layer
      const uint32_t which = off % (kNumFields + 2);
      if (which < uint32_t(kNumFields)) {
        const Field fl = kFields[which];
        if (fl.at + size_t(fl.width) <= f.size()) put_le(f, fl.at, (kind & 0x80) ? value % 512 : value, fl.width);
      } else if (f.size() >= 104) {
        const uint64_t fp = get_le(f, 88, 4), n_layers = get_le(f, 16, 4);
        if (fp <= 4096 && n_layers > 0) {
          const size_t at = size_t(92 + fp + 8 * ((off >> 8) % n_layers));
          if (at + 8 <= f.size()) put_le(f, at, (kind & 0x80) ? value % 80 : value, 8);
        }
      }
      break;
    }
    case 4: {  // a special value somewhere
      const uint64_t s = special_value(value);
      const int width = s > 0xFFFF ? 4 : 2;
      if (f.size() >= 4) put_le(f, off % (f.size() - 3), s, width);
      break;
    }
    case 5:  // resize
      f.resize(size_t(value % (2 * f.size() + 64)), uint8_t(value >> 32));
      break;
    case 6: {  // a value at an offset inside one block (page + record)
      const Plan p = plan_of(f, f.size());
      if (!p.block_offsets.empty()) {
        const uint64_t at = p.block_offsets[(off >> 16) % p.block_offsets.size()];
        const uint64_t in = (off & 0xFFFF) % (p.page_bytes + p.record_bytes);
        const uint64_t v = (kind & 0x80) ? special_value(value) : value;
        const int width = 1 << ((kind >> 4) & 3);  // 1, 2, 4, 8
        if (at + in + uint64_t(width) <= f.size()) put_le(f, size_t(at + in), v, width);
      }
      break;
    }
    case 7: {  // insert or erase bytes in the middle
      if (f.empty()) break;
      const size_t at = off % f.size();
      const size_t n = size_t(value % 256);
      if (kind & 0x80) f.erase(f.begin() + ptrdiff_t(at), f.begin() + ptrdiff_t(std::min(f.size(), at + n)));
      else f.insert(f.begin() + ptrdiff_t(at), n, uint8_t(value >> 8));
      break;
    }
    case 8: {  // a value inside a record at one of the header's record offsets
      const Plan p = plan_of(f, f.size());
      if (!p.block_offsets.empty() && f.size() >= 88) {
        const uint64_t at = p.block_offsets[(off >> 8) % p.block_offsets.size()] + p.page_bytes;
        const uint64_t base = get_le(f, 64 + 8 * ((off >> 4) % 3), 8);
        const uint64_t in = base + 4 * (off & 0xF);
        const uint64_t v = (kind & 0x80) ? special_value(value) : value;
        if (in + 4 <= p.record_bytes && at + in + 4 <= f.size()) put_le(f, size_t(at + in), v, 4);
      }
      break;
    }
  }
}

// ---- the store's state -------------------------------------------------------------

// Reads every block's K, V and record through the public API.
void read_everything(const KVStore& store) {
  const StoreLayout& l = store.layout();
  const size_t d = size_t(l.shape.head_dim);
  std::vector<float> keys(d * size_t(l.block_size)), values(d * size_t(l.block_size));
  std::vector<std::byte> record(l.record_bytes);
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    for (int head = 0; head < l.shape.n_kv_heads; ++head) {
      for (int64_t b = 0; b < store.n_blocks(layer); ++b) {
        const BlockView view = store.block(layer, head, b);
        if (view.n_filled < 1 || view.n_filled > l.block_size) finding("n_filled out of range");
        read_keys_t(l, view, 0, view.n_filled, keys.data(), size_t(view.n_filled));
        read_values(l, view, 0, view.n_filled, values.data(), d);
        std::memcpy(record.data(), store.rep_record(layer, head, b), l.record_bytes);
        const int valid = store.valid_rep_slots(layer, head, b);
        if (valid < 0 || valid > l.rep_slots) finding("valid_rep_slots out of range");
      }
    }
  }
}

void expect_no_internal(const Error& e, const char* when) {
  if (e.code() == ErrorCode::kInternal) finding(std::string("kInternal error ") + when + ": " + e.what());
}

// After a successful load: reads, saves back, keeps appending.
void exercise_loaded(KVStore& store, const std::vector<uint8_t>& file, const std::string& fingerprint) {
  read_everything(store);
  try {
    const std::string again = temp_path(".again");
    save_snapshot(store, again, fingerprint);
    std::vector<uint8_t> saved = read_all(again);
    std::remove(again.c_str());
    std::vector<uint8_t> loaded = file;
    if (loaded.size() >= 12) put_le(loaded, 8, 5, 4);  // saved as version 5
    fix_header_crc(loaded);
    if (saved != loaded) finding("a loaded store does not save back to the file it was loaded from");
  } catch (const Error& e) {
    expect_no_internal(e, "saving a loaded store");
  }
  const StoreLayout& l = store.layout();
  for (int layer = 0; layer < l.shape.n_layers; ++layer) {
    try {
      const int64_t room = store.config().max_seq_len - store.n_tokens(layer);
      append_random(store, layer, std::min<int64_t>(room, 3), uint32_t(layer + 11));
    } catch (const Error& e) {
      expect_no_internal(e, "appending to a loaded store");
    }
  }
  if (l.rep_type == RT::kDynamic) {
    try {
      const int64_t n = store.n_tokens(0);
      std::vector<float> imp(size_t(n) * size_t(l.shape.n_kv_heads), 0.5f);
      if (n > 0) store.add_importance(0, 0, make_view(imp.data(), DType::kF32, {n, l.shape.n_kv_heads}));
    } catch (const Error& e) {
      expect_no_internal(e, "add_importance on a loaded store");
    }
  }
  read_everything(store);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  const bool raw = flags % 4 == 0;
  const LoadMode mode = (flags & 0x04) ? LoadMode::kMmap : LoadMode::kRead;
  const bool prefill_target = flags & 0x08;
  const bool mismatch = flags & 0x10;
  const bool keep_header_crc = flags & 0x20;
  const bool keep_block_crcs = flags & 0x40;
  const bool keep_size = flags & 0x80;

  std::vector<uint8_t> file;
  int target_config = data[1] % kNumConfigs;
  bool small_capacity = false;
  bool chat_fingerprint = false;
  if (raw) {
    file.assign(data + 2, data + size);
    chat_fingerprint = flags & 0x10;
  } else {
    if (size < 4) return 0;
    const int config = data[1] % kNumConfigs;
    const int variant = data[3] % kNumTokenVariants;
    chat_fingerprint = data[3] & 0x80;
    if (mismatch) target_config = data[2] % kNumConfigs;
    small_capacity = data[2] & 0x80 && mismatch;
    try {
      file = valid_snapshot(config, variant);
    } catch (const Error& e) {
      finding(std::string("cannot make a seed snapshot: ") + e.what());
    }
    for (size_t at = 4; at + 13 <= size && at < 4 + 13 * 16; at += 13) apply_patch(file, data + at);
    fix_body(file, !keep_size, !keep_block_crcs);
    if (!keep_header_crc) fix_header_crc(file);
  }

  const std::string path = temp_path(".snap");
  write_all(path, file);
  std::unique_ptr<KVStore> store;
  try {
    store = make_store(spec_of(target_config, small_capacity));
    if (prefill_target) {
      append_random(*store, 0, 5, 1);
      append_random(*store, 1, 9, 2);
    }
  } catch (const Error& e) {
    finding(std::string("cannot make the target store: ") + e.what());
  }

  std::string expected = kFingerprint;
  if (chat_fingerprint) {
    try {
      expected = read_snapshot_fingerprint(path);
    } catch (const Error& e) {
      expect_no_internal(e, "in read_snapshot_fingerprint");
    } catch (const std::exception& e) {
      finding(std::string("read_snapshot_fingerprint threw a non-Error exception: ") + e.what());
    }
  }

  const StoreImage before = image_of(*store);
  bool loaded = false;
  try {
    load_snapshot(*store, path, expected, mode);
    loaded = true;
    if (std::getenv("LONGCTX_SNAPSHOT_VERBOSE")) std::fprintf(stderr, "loaded\n");
  } catch (const Error& e) {
    if (std::getenv("LONGCTX_SNAPSHOT_VERBOSE")) std::fprintf(stderr, "refused: %s\n", e.what());
    expect_no_internal(e, "from load_snapshot");
    if (!(image_of(*store) == before)) finding(std::string("a failed load changed the store: ") + e.what());
  } catch (const std::exception& e) {
    finding(std::string("load_snapshot threw a non-Error exception: ") + e.what());
  }
  if (loaded) {
    try {
      exercise_loaded(*store, file, expected);
    } catch (const std::exception& e) {
      finding(std::string("using a loaded store threw a non-Error exception: ") + e.what());
    }
  }
  store.reset();
  std::remove(path.c_str());
  return 0;
}

// LONGCTX_SNAPSHOT_SEEDS=DIR: writes the seed corpus and exits. Raw-mode seeds
// hold valid snapshots (kv_type f16, bf16, f32, q8_0 x QUEST, MEAN, DYNAMIC x
// tail drop, estimate; block_size 4 and 3), structured seeds the same configs
// unpatched.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("LONGCTX_SNAPSHOT_SEEDS");
  if (dir == nullptr) return 0;
  int n = 0;
  for (int bs_index : {0, 1}) {
    for (int tail : {0, 1}) {
      for (int rep : {0, 1, 2}) {
        for (int kv = 0; kv < 4; ++kv) {
          const int config = kv + 4 * rep + 20 * tail + 40 * bs_index;
          const std::vector<uint8_t>& snap = valid_snapshot(config, 0);
          std::vector<uint8_t> raw = {0x00, uint8_t(config)};
          raw.insert(raw.end(), snap.begin(), snap.end());
          write_all(std::string(dir) + "/raw_" + std::to_string(config), raw);
          const std::vector<uint8_t> structured = {0x01, uint8_t(config), 0, uint8_t(n % kNumTokenVariants)};
          write_all(std::string(dir) + "/struct_" + std::to_string(config), structured);
          ++n;
        }
      }
    }
  }
  std::fprintf(stderr, "wrote %d seeds x 2 to %s\n", n, dir);
  std::exit(0);
}
