#include "longctx/kvstore/kv_store.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <tbb/parallel_for.h>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/local_window.h"
#include "longctx/kvstore/node_executor.h"
#include "longctx/kvstore/snapshot.h"
#include "block_page.h"
#include "representatives.h"

namespace longctx::kvstore {

namespace {

using RT = RepresentativeType;

constexpr size_t kRepPageTargetBytes = size_t{64} << 10;  // rep pages of ~64 KiB stream well
// Tokens of one block written together: their keys are transposed in a
// scratch that stays in cache and copied out with memcpy, because scattering
// 2-byte stores over K^T lines that are not in cache stalls on every line.
constexpr int kSegmentTokens = 128;

size_t round_up_64(size_t bytes) { return (bytes + 63) / 64 * 64; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int slots_of(RT type, int rep_num) {
  switch (type) {
    case RT::kMax:
    case RT::kMean:
      return 1;
    case RT::kQuest:
      return 2;
    case RT::kFix:
    case RT::kDynamic:
      return rep_num;
  }
  fail(ErrorCode::kInvalidArgument, "StoreLayout: unknown representative_type ", int(type));
}


// Per-thread buffers of the write path, grown on demand and kept.
struct WriteScratch {
  std::vector<std::byte> keys;    // [segment][head_dim] kv_type (q8_0: f32, dequantized)
  std::vector<std::byte> k_t;     // [head_dim][segment] kv_type (q8_0: the input rows staged in f32)
  std::vector<float> importance;  // [segment]
  detail::RepScratch reps;
};

WriteScratch& write_scratch() {
  thread_local WriteScratch scratch;
  return scratch;
}

void check_importance(const TensorView& importance, const char* what, int64_t n, int n_kv_heads) {
  check_shape(importance, what, {n, n_kv_heads});
  check_dtype(importance, what, DType::kF32);
  if (n == 0) return;
  check_inner_contiguous(importance, what);
  const float* data = static_cast<const float*>(importance.data);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < n_kv_heads; ++h) {
      const float x = data[t * importance.strides[0] + h * importance.strides[1]];
      if (!std::isfinite(x)) fail(ErrorCode::kInvalidArgument, what, ": value ", x, " at [", t, ", ", h, "] is not finite");
    }
}

// Item -> kv head for per-head loops (parallel_for_heads): item h is head h.
int head_itself(int64_t item) { return int(item); }

// Throws Error(kInvalidArgument) naming the first (position, kv head) whose
// key or value a q8_0 store cannot hold; k, v: [n, n_kv_heads, head_dim] as
// append takes them.
void check_q8_storable(const KVStore& store, int layer, const TensorView& k, const TensorView& v) {
  const int n_heads = store.layout().shape.n_kv_heads;
  const int d = store.layout().shape.head_dim;
  const int64_t n = k.shape[0];
  struct Bad {
    int64_t t = INT64_MAX;
    int channel = 0;
    bool value = false;
    float x = 0.f;
  };
  std::vector<Bad> bad(static_cast<size_t>(n_heads));
  parallel_for_heads(store, n_heads, head_itself, [&](int64_t h) {
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t t = 0; t < n; ++t) {
      for (const TensorView* src : {&k, &v}) {
        const auto* bytes = static_cast<const std::byte*>(src->data) +
                            (t * src->strides[0] + h * src->strides[1]) * int64_t(dtype_size(src->dtype));
        const float* x = row.data();  // f32 rows are checked where they are
        if (src->dtype == DType::kF32) x = reinterpret_cast<const float*>(bytes);
        else convert(bytes, src->dtype, row.data(), DType::kF32, size_t(d));
        const int c = detail::q8_unstorable_channel(x, d);
        if (c >= 0) {
          bad[size_t(h)] = {t, c, src == &v, x[c]};
          return;
        }
      }
    }
  });
  int head = 0;
  for (int h = 1; h < n_heads; ++h)
    if (bad[size_t(h)].t < bad[size_t(head)].t) head = h;
  const Bad& b = bad[size_t(head)];
  if (b.t == INT64_MAX) return;
  fail(ErrorCode::kInvalidArgument, "KV store append (layer ", layer, "): ", b.value ? "value" : "key", " of kv head ",
       head, " at position ", store.n_tokens(layer) + b.t, ", channel ", b.channel, " is ", b.x,
       ": a q8_0 store holds finite values whose group of 32 channels has a scale max|x|/127 within f16's range "
       "(|x| <= 8.3e6); nothing was appended");
}

// The same for an f32, f16 or bf16 store: NaN, +-Inf, or a value that rounds
// to Inf in it (one NaN key would make every later score of its head NaN).
// The keys, then the values, as bit patterns (first_magnitude_above): the
// whole tensor at once when it is contiguous, else row by row.
void check_storable(const KVStore& store, int layer, const TensorView& k, const TensorView& v) {
  const DType kv_type = store.layout().kv_type;
  const int64_t n_heads = store.layout().shape.n_kv_heads;
  const int64_t d = store.layout().shape.head_dim;
  const int64_t n = k.shape[0];
  for (const TensorView* src : {&k, &v}) {
    const uint32_t limit = detail::storable_bits(src->dtype, kv_type);
    const size_t elem = dtype_size(src->dtype);
    const auto row = [&](int64_t t, int64_t h) {
      return static_cast<const std::byte*>(src->data) + size_t(t * src->strides[0] + h * src->strides[1]) * elem;
    };
    int64_t t = 0, h = 0, c = -1;
    if (src->strides[1] == d && src->strides[0] == n_heads * d) {
      // A prefill chunk's megabytes in pieces on every thread; the first piece that has one names it.
      constexpr int64_t kPiece = int64_t(1) << 18;
      const int64_t total = n * n_heads * d, pieces = (total + kPiece - 1) / kPiece;
      std::vector<int64_t> first(size_t(pieces), -1);
      const auto check_piece = [&](int64_t p) {
        const int64_t begin = p * kPiece;
        const int64_t at = first_magnitude_above(static_cast<const std::byte*>(src->data) + size_t(begin) * elem,
                                                    src->dtype, size_t(std::min(kPiece, total - begin)), limit);
        if (at >= 0) first[size_t(p)] = begin + at;
      };
      if (pieces == 1) check_piece(0);  // a decode step's token: no task
      else tbb::parallel_for(int64_t{0}, pieces, check_piece);
      const auto found = std::find_if(first.begin(), first.end(), [](int64_t i) { return i >= 0; });
      if (found != first.end()) t = *found / (n_heads * d), h = *found / d % n_heads, c = *found % d;
    } else {
      for (int64_t r = 0; r < n * n_heads && c < 0; ++r) {
        t = r / n_heads, h = r % n_heads;
        c = first_magnitude_above(row(t, h), src->dtype, size_t(d), limit);
      }
    }
    if (c < 0) continue;
    const char* holds = kv_type == DType::kF32 ? "an f32 store holds finite values"
                        : kv_type == DType::kF16
                            ? "an f16 store holds values that do not round to Inf in it (|x| < 65520; kv_type "
                              "bf16 or f32 holds larger ones)"
                            : "a bf16 store holds values that do not round to Inf in it";
    fail(ErrorCode::kInvalidArgument, "KV store append (layer ", layer, "): ", src == &v ? "value" : "key",
         " of kv head ", h, " at position ", store.n_tokens(layer) + t, ", channel ", c, " is ",
         load_as_f32(row(t, h), src->dtype, size_t(c)), ": ", holds, "; nothing was appended");
  }
}

}  // namespace

// ---- layout and preflight ----------------------------------------------------

StoreLayout StoreLayout::make(const KVShape& shape, const LongContextConfig& config) {
  if (shape.n_layers < 1) fail(ErrorCode::kInvalidArgument, "KV store shape: n_layers is ", shape.n_layers, ", must be >= 1");
  if (shape.n_kv_heads < 1)
    fail(ErrorCode::kInvalidArgument, "KV store shape: n_kv_heads is ", shape.n_kv_heads, ", must be >= 1");
  if (shape.head_dim < 8 || shape.head_dim > kMaxHeadDim || shape.head_dim % 8 != 0)
    fail(ErrorCode::kInvalidArgument, "KV store shape: head_dim is ", shape.head_dim,
         ", must be a multiple of 8 in [8, ", kMaxHeadDim, "]");
  if (config.kv_type == DType::kQ8_0 && shape.head_dim % kQ8Group != 0)
    fail(ErrorCode::kInvalidArgument, "KV store: kv_type q8_0 needs head_dim a multiple of ", kQ8Group,
         " (one scale per 32 channels), the model's is ", shape.head_dim);
  if (config.block_size < 1)
    fail(ErrorCode::kInvalidArgument, "KV store: block_size is ", config.block_size, ", must be >= 1");
  const RT type = config.representative_type;
  if ((type == RT::kFix || type == RT::kDynamic) &&
      (config.representative_num < 1 || config.representative_num > config.block_size))
    fail(ErrorCode::kInvalidArgument, "KV store: representative_num is ", config.representative_num, " for ",
         representative_type_name(type), ", must be in [1, block_size = ", config.block_size, "]");

  StoreLayout l;
  l.shape = shape;
  l.block_size = config.block_size;
  l.kv_type = config.kv_type;
  l.rep_type = type;
  l.rep_num = config.representative_num;
  l.rep_slots = slots_of(type, config.representative_num);
  const size_t bs = size_t(config.block_size);
  const size_t d = size_t(shape.head_dim);
  if (config.kv_type == DType::kQ8_0) {
    const size_t scales = d / kQ8Group * sizeof(uint16_t);  // per token
    l.page_k_scales = bs * d;
    l.page_v = l.page_k_scales + bs * scales;
    const size_t value_rows = (bs + kQ8ValueQuad - 1) / kQ8ValueQuad * kQ8ValueQuad;  // whole quads of tokens
    l.page_v_scales = l.page_v + value_rows * d;
    l.page_bytes = round_up_64(l.page_v_scales + bs * scales);
  } else {
    l.page_v = bs * d * dtype_size(config.kv_type);
    l.page_bytes = round_up_64(2 * bs * kv_vector_bytes(config.kv_type, shape.head_dim));
  }

  size_t end = round_up_64(size_t(l.rep_slots) * kv_vector_bytes(config.kv_type, shape.head_dim));  // keys
  if (type == RT::kMean) {
    l.record_sum_offset = end;
    end = round_up_64(end + d * sizeof(float));
  }
  if (type == RT::kDynamic) {
    l.record_importance_offset = end;
    end = round_up_64(end + bs * sizeof(float));
  }
  if (type == RT::kFix || type == RT::kDynamic) {
    l.record_offsets_offset = end;
    end = round_up_64(end + size_t(l.rep_num) * sizeof(int32_t));
  }
  if (config.tail == TailMode::kEstimate) {
    l.record_tail_offset = end;
    end = round_up_64(end + 3 * d * sizeof(float));
  }
  l.record_bytes = end;
  l.records_per_rep_page = std::max<size_t>(1, kRepPageTargetBytes / l.record_bytes);
  l.rep_page_bytes = l.records_per_rep_page * l.record_bytes;
  return l;
}

Preflight preflight(const StoreLayout& layout, int64_t max_seq_len, const std::vector<int>& head_nodes) {
  if (max_seq_len < 1) fail(ErrorCode::kInvalidArgument, "KV store: max_seq_len is ", max_seq_len, ", must be >= 1");
  if (head_nodes.size() != size_t(layout.shape.n_kv_heads))
    fail(ErrorCode::kInvalidArgument, "KV store preflight: ", head_nodes.size(), " head nodes for ",
         layout.shape.n_kv_heads, " kv heads");
  Preflight p;
  p.layout = layout;
  p.max_seq_len = max_seq_len;
  p.kv_bytes_per_token_per_layer =
      2 * uint64_t(layout.shape.n_kv_heads) * kv_vector_bytes(layout.kv_type, layout.shape.head_dim);
  p.rep_bytes_per_block_per_layer = uint64_t(layout.shape.n_kv_heads) * layout.record_bytes;
  p.blocks_per_head = uint64_t(ceil_div(max_seq_len, layout.block_size));
  const uint64_t rep_pages_per_head = uint64_t(ceil_div(int64_t(p.blocks_per_head), int64_t(layout.records_per_rep_page)));

  int max_node = 0;
  for (int node : head_nodes) {
    if (node < 0) fail(ErrorCode::kInvalidArgument, "KV store preflight: negative node index ", node);
    max_node = std::max(max_node, node);
  }
  std::vector<uint64_t> heads_on(size_t(max_node) + 1, 0);
  for (int node : head_nodes) ++heads_on[size_t(node)];
  p.bytes_per_node.assign(heads_on.size(), 0);
  for (size_t node = 0; node < heads_on.size(); ++node) {
    if (heads_on[node] == 0) continue;
    const uint64_t heads = heads_on[node] * uint64_t(layout.shape.n_layers);
    p.bytes_per_node[node] = BlockPool::slab_bytes_for(size_t(heads * p.blocks_per_head), layout.page_bytes) +
                             BlockPool::slab_bytes_for(size_t(heads * rep_pages_per_head), layout.rep_page_bytes);
    p.total_bytes += p.bytes_per_node[node];
  }
  return p;
}

std::string Preflight::describe() const {
  size_t nodes = 0;
  for (uint64_t b : bytes_per_node) nodes += b > 0 ? 1 : 0;
  return str_cat("KV store for ", max_seq_len, " tokens x ", layout.shape.n_layers, " layers: ", format_bytes(total_bytes),
                 " (", format_bytes(kv_bytes_per_token_per_layer * uint64_t(layout.shape.n_layers)), " per token; ",
                 layout.shape.n_kv_heads, " kv heads x ", layout.shape.head_dim, " dims ", dtype_name(layout.kv_type),
                 " + ", representative_type_name(layout.rep_type), " reps",
                 nodes > 1 ? str_cat(", on ", nodes, " NUMA nodes") : std::string(), ")");
}

// ---- partition ---------------------------------------------------------------

Partition Partition::of(int64_t n_tokens, int64_t initial_end, int64_t local_begin, int block_size) {
  Partition p;
  p.n_tokens = n_tokens;
  p.initial_end = initial_end;
  p.local_begin = local_begin;
  p.first_context_block = initial_end / block_size;
  p.end_context_block = local_begin > initial_end ? ceil_div(local_begin, block_size) : p.first_context_block;
  p.first_ranked_block = std::min(ceil_div(initial_end, block_size), p.end_context_block);
  p.end_ranked_block = std::clamp(local_begin / block_size, p.first_ranked_block, p.end_context_block);
  return p;
}

int64_t Partition::ranked_begin(int block_size) const {
  return first_ranked_block < end_ranked_block ? first_ranked_block * block_size : n_tokens;
}

int64_t Partition::ranked_end(int block_size) const {
  return first_ranked_block < end_ranked_block ? end_ranked_block * block_size : n_tokens;
}

int64_t Partition::context_begin_of(int64_t block, int block_size) const {
  return std::clamp(block * block_size, initial_end, local_begin);
}

int64_t Partition::context_end_of(int64_t block, int block_size) const {
  return std::clamp((block + 1) * block_size, initial_end, local_begin);
}

// ---- the store -----------------------------------------------------------------

KVStore::KVStore(const KVShape& shape, const LongContextConfig& config, MemoryBudget& budget,
                 const NumaTopology& topology)
    : config_(config),
      layout_(StoreLayout::make(shape, config)),
      budget_(budget),
      topology_(topology),
      head_nodes_(place_kv_heads(shape.n_kv_heads, resolve_numa_nodes(config.numa, topology))) {
  if (config.initial_len < 0 || config.local_windows_len < 0)
    fail(ErrorCode::kInvalidArgument, "KV store: initial_len (", config.initial_len, ") and local_windows_len (",
         config.local_windows_len, ") must be >= 0");
  const Preflight plan = preflight(layout_, config.max_seq_len, head_nodes_);
  if (plan.total_bytes > budget.available())
    fail(ErrorCode::kOutOfMemory, plan.describe(), " does not fit: needs ", plan.total_bytes, " bytes, ",
         budget.name(), " has ", format_bytes(budget.available()), " (", budget.available(), " bytes) available of ",
         format_bytes(budget.limit()), "; lower max_seq_len, choose a smaller kv_type or representative_type, "
         "or raise dram_budget");
  // A budget set above the machine's memory lets a store through that cannot
  // fit in it (the process is killed as it fills): said once per process.
  // The machine's memory is read only until the warning is given: the server
  // makes a store per cached sequence.
  static std::atomic<bool> memory_warned{false};
  uint64_t memory = 0;
  if (!memory_warned.load()) {
    try {
      memory = machine_memory_bytes();
    } catch (const Error&) {  // no warning where the machine does not tell
    }
  }
  if (memory != 0 && plan.total_bytes > memory && !memory_warned.exchange(true))
    std::fprintf(stderr, "longctx: warning: %s is more than this machine's memory (%s); dram_budget %s lets it "
                 "through, but it will not fit once filled: lower max_seq_len or choose a smaller kv_type\n",
                 plan.describe().c_str(), format_bytes(memory).c_str(), format_bytes(budget.limit()).c_str());

  const bool bind = config.numa.kind != NumaPolicy::Kind::kNone;  // numa: none lets the OS place pages
  page_pools_.resize(size_t(topology.node_count()));
  rep_pools_.resize(size_t(topology.node_count()));
  for (int node : head_nodes_) {
    if (page_pools_.at(size_t(node))) continue;
    page_pools_[size_t(node)] = std::make_unique<BlockPool>(topology, node, layout_.page_bytes, budget, bind);
    rep_pools_[size_t(node)] = std::make_unique<BlockPool>(topology, node, layout_.rep_page_bytes, budget, bind);
  }
  heads_.resize(size_t(shape.n_layers) * size_t(shape.n_kv_heads));
  n_tokens_.assign(size_t(shape.n_layers), 0);
}

KVStore::~KVStore() {
  try {
    clear();
  } catch (...) {
    // The pools unmap their slabs anyway; nothing else to undo.
  }
}

void KVStore::append(int layer, const TensorView& k, const TensorView& v, const TensorView& importance) {
  const int n_layers = layout_.shape.n_layers;
  const int n_heads = layout_.shape.n_kv_heads;
  const int d = layout_.shape.head_dim;
  if (layer < 0 || layer >= n_layers)
    fail(ErrorCode::kInvalidArgument, "KV store append: layer ", layer, " out of range [0, ", n_layers, ")");
  const CheckName where("KV store append (layer ", layer, "): ");
  const CheckName k_name(where.c_str(), "k"), v_name(where.c_str(), "v");
  check_shape(k, k_name.c_str(), {-1, n_heads, d});
  const int64_t n = k.shape[0];
  if (n < 0) fail(ErrorCode::kInvalidArgument, where.c_str(), "k has ", n, " tokens");
  check_shape(v, v_name.c_str(), {n, n_heads, d});
  const bool has_importance = importance.rank != 0;
  if (has_importance) check_importance(importance, CheckName(where.c_str(), "importance").c_str(), n, n_heads);
  if (n == 0) return;
  check_inner_contiguous(k, k_name.c_str());
  check_inner_contiguous(v, v_name.c_str());
  dtype_size(k.dtype);  // throws for a dtype outside the enum, before anything changes
  dtype_size(v.dtype);
  const int64_t n0 = n_tokens_[size_t(layer)];
  if (n > config_.max_seq_len - n0)
    fail(ErrorCode::kInvalidArgument, where.c_str(), n0, " tokens held + ", n, " appended would exceed max_seq_len ",
         config_.max_seq_len);
  if (layout_.kv_type == DType::kQ8_0) check_q8_storable(*this, layer, k, v);
  else check_storable(*this, layer, k, v);

  // Reserve list capacity, then take every page of every head; only then
  // change anything (the inserts below cannot throw).
  const int bs = layout_.block_size;
  const size_t rpp = layout_.records_per_rep_page;
  const size_t blocks_after = size_t(ceil_div(n0 + n, bs));
  const size_t rep_pages_after = (blocks_after + rpp - 1) / rpp;
  const size_t max_blocks = size_t(ceil_div(config_.max_seq_len, bs));
  for (int h = 0; h < n_heads; ++h) {
    HeadCache& hc = head_cache(layer, h);
    if (hc.pages.capacity() < blocks_after)
      hc.pages.reserve(std::min(max_blocks, std::max(blocks_after, 2 * hc.pages.capacity())));
    if (hc.rep_pages.capacity() < rep_pages_after) hc.rep_pages.reserve(rep_pages_after);
  }
  std::vector<std::vector<std::byte*>> new_pages(static_cast<size_t>(n_heads));
  std::vector<std::vector<std::byte*>> new_rep_pages(static_cast<size_t>(n_heads));
  bool need_pages = false;
  for (int h = 0; h < n_heads; ++h) need_pages = need_pages || blocks_after > head_cache(layer, h).pages.size();
  if (need_pages) {
    // In parallel, each head on its node: pools zero reused pages as they hand them out, outside their lock.
    try {
      parallel_for_heads(*this, n_heads, head_itself, [&](int64_t item) {
        const int h = int(item);
        const HeadCache& hc = head_cache(layer, h);
        if (blocks_after > hc.pages.size()) {
          // New blocks start at a block boundary >= n0, so every new page but
          // a partial last one is overwritten whole by this append: only that
          // one needs zeroing (unfilled slots must read as zero).
          auto& pages = new_pages[size_t(h)];
          pages = page_pool(h).allocate(blocks_after - hc.pages.size(), /*zero=*/false);
          if ((n0 + n) % bs != 0) std::memset(pages.back(), 0, layout_.page_bytes);
          const size_t data_bytes = 2 * size_t(bs) * kv_vector_bytes(layout_.kv_type, d);
          if (data_bytes < layout_.page_bytes)  // the 64-byte round-up tail is never written
            for (std::byte* page : pages) std::memset(page + data_bytes, 0, layout_.page_bytes - data_bytes);
        }
        if (rep_pages_after > hc.rep_pages.size())
          new_rep_pages[size_t(h)] = rep_pool(h).allocate(rep_pages_after - hc.rep_pages.size());
      });
    } catch (...) {
      // parallel_for_heads returns once every task has ended: each list holds what its head got.
      for (int h = 0; h < n_heads; ++h) {
        if (!new_pages[size_t(h)].empty()) page_pool(h).release(new_pages[size_t(h)]);
        if (!new_rep_pages[size_t(h)].empty()) rep_pool(h).release(new_rep_pages[size_t(h)]);
      }
      throw;
    }
  }
  for (int h = 0; h < n_heads; ++h) {
    HeadCache& hc = head_cache(layer, h);
    hc.pages.insert(hc.pages.end(), new_pages[size_t(h)].begin(), new_pages[size_t(h)].end());
    hc.rep_pages.insert(hc.rep_pages.end(), new_rep_pages[size_t(h)].begin(), new_rep_pages[size_t(h)].end());
  }

  const bool use_importance = has_importance && layout_.rep_type == RT::kDynamic;
  parallel_for_heads(*this, n_heads, head_itself, [&](int64_t h) {
    write_head(layer, int(h), n0, k, v, use_importance ? &importance : nullptr);
  });
  n_tokens_[size_t(layer)] = n0 + n;
}

void KVStore::write_head(int layer, int kv_head, int64_t first_token, const TensorView& k, const TensorView& v,
                         const TensorView* importance) {
  const StoreLayout& L = layout_;
  const DType kv = L.kv_type;
  const bool q8 = kv == DType::kQ8_0;
  const size_t es = q8 ? sizeof(float) : dtype_size(kv);  // q8_0: rows staged in f32
  const int bs = L.block_size;
  const int d = L.shape.head_dim;
  const size_t row_bytes = size_t(d) * es;
  const size_t k_es = dtype_size(k.dtype);
  const size_t v_es = dtype_size(v.dtype);
  HeadCache& hc = head_cache(layer, kv_head);
  const int64_t n = k.shape[0];

  WriteScratch& scratch = write_scratch();
  const size_t segment_max = size_t(std::min<int64_t>({kSegmentTokens, bs, n}));
  if (scratch.keys.size() < segment_max * row_bytes) {
    scratch.keys.resize(segment_max * row_bytes);
    scratch.k_t.resize(segment_max * row_bytes);
  }
  if (scratch.importance.size() < segment_max) scratch.importance.resize(segment_max);

  for (int64_t t = 0; t < n;) {
    const int64_t pos = first_token + t;
    const int64_t b = pos / bs;
    const int offset = int(pos % bs);
    const int count = int(std::min<int64_t>({kSegmentTokens, bs - offset, n - t}));
    std::byte* page = hc.pages[size_t(b)];
    const auto* k_src = static_cast<const std::byte*>(k.data) + (t * k.strides[0] + kv_head * k.strides[1]) * int64_t(k_es);
    const auto* v_src = static_cast<const std::byte*>(v.data) + (t * v.strides[0] + kv_head * v.strides[1]) * int64_t(v_es);
    detail::Segment segment;
    segment.offset = offset;
    segment.count = count;
    segment.keys = scratch.keys.data();
    segment.keys_dtype = q8 ? DType::kF32 : kv;
    if (q8) {
      detail::write_q8_segment(L, k_src, k.strides[0] * int64_t(k_es), k.dtype, v_src, v.strides[0] * int64_t(v_es),
                       v.dtype, page, offset, count, reinterpret_cast<float*>(scratch.k_t.data()),
                       reinterpret_cast<float*>(scratch.keys.data()));
    } else {
      detail::write_segment(L, k_src, k.strides[0] * int64_t(k_es), k.dtype, v_src, v.strides[0] * int64_t(v_es), v.dtype,
                    page, offset, count, scratch.keys.data(), scratch.k_t.data());
    }
    if (importance != nullptr) {
      const float* data = static_cast<const float*>(importance->data);
      for (int i = 0; i < count; ++i)
        scratch.importance[size_t(i)] = data[(t + i) * importance->strides[0] + kv_head * importance->strides[1]];
      segment.importance = scratch.importance.data();
    }
    detail::update_record(L, record_of(hc, b), page, segment, scratch.reps);
    t += count;
  }
}

std::byte* KVStore::record_of(const HeadCache& hc, int64_t block) const {
  const size_t rpp = layout_.records_per_rep_page;
  return hc.rep_pages[size_t(block) / rpp] + (size_t(block) % rpp) * layout_.record_bytes;
}

void KVStore::add_importance(int layer, int64_t first_token, const TensorView& importance) {
  const int n_heads = layout_.shape.n_kv_heads;
  if (layout_.rep_type != RT::kDynamic)
    fail(ErrorCode::kInvalidArgument, "KV store add_importance: representative_type is ",
         representative_type_name(layout_.rep_type), ", only DYNAMIC keeps importance");
  check_layer(layer, "add_importance");
  const CheckName what("KV store add_importance (layer ", layer, "): importance");
  check_shape(importance, what.c_str(), {-1, n_heads});
  const int64_t n = importance.shape[0];
  const int64_t held = n_tokens_[size_t(layer)];
  if (first_token < 0 || first_token > held || n > held - first_token)
    fail(ErrorCode::kInvalidArgument, "KV store add_importance: tokens [", first_token, ", ", first_token + n,
         ") out of range: layer ", layer, " holds ", held, " tokens");
  check_importance(importance, what.c_str(), n, n_heads);
  if (n == 0) return;

  const int bs = layout_.block_size;
  parallel_for_heads(*this, n_heads, head_itself, [&](int64_t item) {
    const int h = int(item);
    const HeadCache& hc = head_cache(layer, h);
    const float* data = static_cast<const float*>(importance.data);
    detail::RepScratch scratch;
    for (int64_t b = first_token / bs; b <= (first_token + n - 1) / bs; ++b) {
      std::byte* record = record_of(hc, b);
      float* stored = detail::record_importance(layout_, record);
      const int64_t begin = std::max(first_token, b * bs);
      const int64_t end = std::min(first_token + n, (b + 1) * bs);
      for (int64_t t = begin; t < end; ++t)
        stored[t - b * bs] += data[(t - first_token) * importance.strides[0] + h * importance.strides[1]];
      const int n_filled = int(std::min<int64_t>(bs, held - b * bs));
      detail::repick_dynamic(layout_, record, hc.pages[size_t(b)], n_filled, scratch);
    }
  });
}

void KVStore::clear() {
  for (int layer = 0; layer < layout_.shape.n_layers; ++layer) {
    for (int h = 0; h < layout_.shape.n_kv_heads; ++h) {
      HeadCache& hc = head_cache(layer, h);
      if (!hc.pages.empty()) page_pool(h).release(hc.pages);
      if (!hc.rep_pages.empty()) rep_pool(h).release(hc.rep_pages);
      hc.pages.clear();
      hc.rep_pages.clear();
    }
    n_tokens_[size_t(layer)] = 0;
  }
}

void KVStore::truncate(int64_t n_tokens) {
  const int bs = layout_.block_size;
  if (n_tokens < 0 || n_tokens % bs != 0)
    fail(ErrorCode::kInvalidArgument, "KV store truncate: ", n_tokens, " tokens is not a whole number of ", bs,
         "-token blocks");
  for (int layer = 0; layer < layout_.shape.n_layers; ++layer)
    if (n_tokens > n_tokens_[size_t(layer)])
      fail(ErrorCode::kInvalidArgument, "KV store truncate: keep ", n_tokens, " tokens, but layer ", layer,
           " holds ", n_tokens_[size_t(layer)]);
  const size_t keep_blocks = size_t(n_tokens / bs);
  const size_t rpp = layout_.records_per_rep_page;
  const size_t keep_rep_pages = (keep_blocks + rpp - 1) / rpp;
  for (int layer = 0; layer < layout_.shape.n_layers; ++layer) {
    for (int h = 0; h < layout_.shape.n_kv_heads; ++h) {
      HeadCache& hc = head_cache(layer, h);
      if (hc.pages.size() > keep_blocks) {
        // The dropped records of the last kept rep page read as a fresh page's: zero.
        if (keep_blocks % rpp != 0) {
          std::byte* first_dropped = record_of(hc, int64_t(keep_blocks));
          std::memset(first_dropped, 0, size_t(hc.rep_pages[keep_rep_pages - 1] + layout_.rep_page_bytes - first_dropped));
        }
        page_pool(h).release({hc.pages.begin() + ptrdiff_t(keep_blocks), hc.pages.end()});
        hc.pages.resize(keep_blocks);
      }
      if (hc.rep_pages.size() > keep_rep_pages) {
        rep_pool(h).release({hc.rep_pages.begin() + ptrdiff_t(keep_rep_pages), hc.rep_pages.end()});
        hc.rep_pages.resize(keep_rep_pages);
      }
    }
    n_tokens_[size_t(layer)] = n_tokens;
  }
}

// ---- reading -------------------------------------------------------------------

void KVStore::check_layer(int layer, const char* what) const {
  if (layer < 0 || layer >= layout_.shape.n_layers)
    fail(ErrorCode::kInvalidArgument, "KV store ", what, ": layer ", layer, " out of range [0, ", layout_.shape.n_layers, ")");
}

void KVStore::check_block(int layer, int kv_head, int64_t block, const char* what) const {
  check_layer(layer, what);
  if (kv_head < 0 || kv_head >= layout_.shape.n_kv_heads)
    fail(ErrorCode::kInvalidArgument, "KV store ", what, ": kv head ", kv_head, " out of range [0, ",
         layout_.shape.n_kv_heads, ") (layer ", layer, ")");
  if (block < 0 || block >= n_blocks(layer))
    fail(ErrorCode::kInvalidArgument, "KV store ", what, ": block ", block, " out of range [0, ", n_blocks(layer),
         ") (layer ", layer, " holds ", n_tokens(layer), " tokens, kv head ", kv_head, ")");
}

int64_t KVStore::n_tokens(int layer) const {
  check_layer(layer, "n_tokens");
  return n_tokens_[size_t(layer)];
}

int64_t KVStore::n_blocks(int layer) const { return ceil_div(n_tokens(layer), layout_.block_size); }

Partition KVStore::partition(int layer) const {
  const int64_t n = n_tokens(layer);
  return Partition::of(n, std::min<int64_t>(config_.initial_len, n),
                       local_window_begin(n, config_.initial_len, config_.local_windows_len), layout_.block_size);
}

BlockView KVStore::block(int layer, int kv_head, int64_t block) const {
  check_block(layer, kv_head, block, "block");
  return view_of_page(layout_, head_cache(layer, kv_head).pages[size_t(block)],
                      int(std::min<int64_t>(layout_.block_size, n_tokens(layer) - block * layout_.block_size)));
}

const std::byte* KVStore::rep_record(int layer, int kv_head, int64_t block) const {
  check_block(layer, kv_head, block, "rep_record");
  return record_of(head_cache(layer, kv_head), block);
}

int KVStore::valid_rep_slots(int layer, int kv_head, int64_t block) const {
  check_block(layer, kv_head, block, "valid_rep_slots");
  const int n_filled = int(std::min<int64_t>(layout_.block_size, n_tokens(layer) - block * layout_.block_size));
  return detail::valid_slots(layout_, n_filled);
}

MemoryStats KVStore::memory_stats() const {
  MemoryStats s;
  s.budget_bytes = budget_.limit();
  s.budget_used_bytes = budget_.used();
  s.reserved_bytes_per_node.assign(page_pools_.size(), 0);
  for (size_t node = 0; node < page_pools_.size(); ++node) {
    for (const auto* pool : {page_pools_[node].get(), rep_pools_[node].get()}) {
      if (pool == nullptr) continue;
      s.reserved_bytes_per_node[node] += pool->reserved_bytes();
      s.used_bytes += uint64_t(pool->pages_in_use()) * pool->page_bytes();
    }
    s.reserved_bytes += s.reserved_bytes_per_node[node];
  }
  return s;
}

// ---- snapshot access -------------------------------------------------------------

namespace {
void check_snapshot_head(const KVStore& s, int kv_head, const char* what) {
  if (kv_head < 0 || kv_head >= s.layout().shape.n_kv_heads)
    fail(ErrorCode::kInvalidArgument, "SnapshotAccess::", what, ": kv head ", kv_head, " out of range [0, ",
         s.layout().shape.n_kv_heads, ")");
}
}  // namespace

void SnapshotAccess::install(KVStore& s, std::vector<std::vector<std::byte*>> pages,
                             std::vector<std::vector<std::byte*>> rep_pages, std::vector<int64_t> n_tokens) {
  const StoreLayout& L = s.layout_;
  const size_t n_lists = size_t(L.shape.n_layers) * size_t(L.shape.n_kv_heads);
  if (pages.size() != n_lists || rep_pages.size() != n_lists || n_tokens.size() != size_t(L.shape.n_layers))
    fail(ErrorCode::kInternal, "SnapshotAccess::install: ", pages.size(), " page lists, ", rep_pages.size(),
         " rep page lists and ", n_tokens.size(), " token counts for ", L.shape.n_layers, " layers x ",
         L.shape.n_kv_heads, " kv heads");
  for (int layer = 0; layer < L.shape.n_layers; ++layer) {
    const int64_t n = n_tokens[size_t(layer)];
    if (n < 0 || n > s.config_.max_seq_len)
      fail(ErrorCode::kInternal, "SnapshotAccess::install: layer ", layer, " has ", n, " tokens, max_seq_len is ",
           s.config_.max_seq_len);
    const size_t blocks = size_t(ceil_div(n, L.block_size));
    const size_t reps = (blocks + L.records_per_rep_page - 1) / L.records_per_rep_page;
    for (int h = 0; h < L.shape.n_kv_heads; ++h) {
      const size_t i = size_t(layer) * size_t(L.shape.n_kv_heads) + size_t(h);
      if (pages[i].size() != blocks || rep_pages[i].size() != reps)
        fail(ErrorCode::kInternal, "SnapshotAccess::install: layer ", layer, " kv head ", h, " gets ", pages[i].size(),
             " pages and ", rep_pages[i].size(), " rep pages for ", n, " tokens (needs ", blocks, " and ", reps, ")");
    }
  }
  s.clear();
  for (size_t i = 0; i < n_lists; ++i) {
    s.heads_[i].pages = std::move(pages[i]);
    s.heads_[i].rep_pages = std::move(rep_pages[i]);
  }
  s.n_tokens_ = std::move(n_tokens);
}

std::vector<std::byte*> SnapshotAccess::allocate_pages(KVStore& s, int kv_head, size_t n) {
  check_snapshot_head(s, kv_head, "allocate_pages");
  return s.page_pool(kv_head).allocate(n);
}

std::vector<std::byte*> SnapshotAccess::allocate_rep_pages(KVStore& s, int kv_head, size_t n) {
  check_snapshot_head(s, kv_head, "allocate_rep_pages");
  return s.rep_pool(kv_head).allocate(n);
}

void SnapshotAccess::release_pages(KVStore& s, int kv_head, const std::vector<std::byte*>& pages) {
  check_snapshot_head(s, kv_head, "release_pages");
  s.page_pool(kv_head).release(pages);
}

void SnapshotAccess::release_rep_pages(KVStore& s, int kv_head, const std::vector<std::byte*>& pages) {
  check_snapshot_head(s, kv_head, "release_rep_pages");
  s.rep_pool(kv_head).release(pages);
}

}  // namespace longctx::kvstore
