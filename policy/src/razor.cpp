// RazorAttention: retrieval-head lists, the compensation token of
// non-retrieval heads, razor decode attention, and the retrieval-head search
// over the probe's attention probabilities (see policy/razor.h).
#include "longctx/policy/razor.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <random>
#include <string_view>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"
#include "longctx/kvstore/node_executor.h"

namespace longctx::policy {

using cpu::decode_attention;
using cpu::merge_attention;
using cpu::Selection;
using cpu::TokenSpan;

namespace {

constexpr float kEmpty = -std::numeric_limits<float>::infinity();

// ---- head-list file -------------------------------------------------------------------

// Splits a line into blank-separated fields (space, tab, CR).
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t begin = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > begin) fields.push_back(line.substr(begin, i - begin));
  }
  return fields;
}

// A field as an index in [0, limit), or Error(kConfig) "path:line: ...".
int parse_index(std::string_view field, const char* what, int limit, const std::string& path, int line_no) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec == std::errc::result_out_of_range) {
    fail(ErrorCode::kConfig, path, ":", line_no, ": ", what, " ", field, " out of range [0, ", limit, ")");
  }
  if (ec != std::errc() || end != field.data() + field.size()) {
    fail(ErrorCode::kConfig, path, ":", line_no, ": ", what, " '", field, "' is not a decimal integer");
  }
  if (value < 0 || value >= limit) {
    fail(ErrorCode::kConfig, path, ":", line_no, ": ", what, " ", value, " out of range [0, ", limit, ")");
  }
  return int(value);
}

// ---- search ---------------------------------------------------------------------------

// Uniform integer in [0, bound) from a 64-bit engine by rejection, so the
// draw is the same on every standard library (std::uniform_int_distribution's
// algorithm is implementation-defined).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % bound;
}

// round(fraction * n), halves up, >= 1 when fraction > 0, <= n.
int64_t top_count(double fraction, int64_t n) {
  if (fraction <= 0) return 0;
  return std::min(n, std::max<int64_t>(1, std::llround(fraction * double(n))));
}

// Indices of the `count` largest scores, ties: lower index first.
std::vector<size_t> top_indices(const std::vector<double>& scores, int64_t count) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  order.resize(size_t(count));
  return order;
}

}  // namespace

// ---- RetrievalHeads --------------------------------------------------------------------

RetrievalHeads::RetrievalHeads(int n_layers, int n_kv_heads) : n_layers_(n_layers), n_kv_heads_(n_kv_heads) {
  if (n_layers < 1 || n_kv_heads < 1) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeads: n_layers ", n_layers, " and n_kv_heads ", n_kv_heads,
         " must be >= 1");
  }
  retrieval_.assign(size_t(n_layers) * size_t(n_kv_heads), 0);
}

RetrievalHeads RetrievalHeads::all(int n_layers, int n_kv_heads) {
  RetrievalHeads heads(n_layers, n_kv_heads);
  std::fill(heads.retrieval_.begin(), heads.retrieval_.end(), uint8_t{1});
  return heads;
}

size_t RetrievalHeads::index(int layer, int kv_head) const {
  if (layer < 0 || layer >= n_layers_ || kv_head < 0 || kv_head >= n_kv_heads_) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeads: layer ", layer, " kv head ", kv_head,
         " out of range (", n_layers_, " layers, ", n_kv_heads_, " kv heads)");
  }
  return size_t(layer) * size_t(n_kv_heads_) + size_t(kv_head);
}

bool RetrievalHeads::is_retrieval(int layer, int kv_head) const { return retrieval_[index(layer, kv_head)] != 0; }

void RetrievalHeads::set(int layer, int kv_head, bool retrieval) {
  retrieval_[index(layer, kv_head)] = retrieval ? 1 : 0;
}

int64_t RetrievalHeads::count() const { return std::count(retrieval_.begin(), retrieval_.end(), uint8_t{1}); }

RetrievalHeads load_retrieval_heads(const std::string& path, int n_layers, int n_kv_heads) {
  if (path.empty()) return RetrievalHeads::all(n_layers, n_kv_heads);
  RetrievalHeads heads(n_layers, n_kv_heads);
  const std::vector<std::byte> bytes = read_file(path);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  int line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t newline = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, newline - pos);
    pos = newline + 1;
    ++line_no;
    line = line.substr(0, std::min(line.find('#'), line.size()));
    const std::vector<std::string_view> fields = fields_of(line);
    if (fields.empty()) continue;
    if (fields.size() != 2) {
      fail(ErrorCode::kConfig, path, ":", line_no, ": expected '<layer> <kv_head>', got ", fields.size(),
           " fields");
    }
    const int layer = parse_index(fields[0], "layer", n_layers, path, line_no);
    const int kv_head = parse_index(fields[1], "kv_head", n_kv_heads, path, line_no);
    if (heads.is_retrieval(layer, kv_head)) {
      fail(ErrorCode::kConfig, path, ":", line_no, ": layer ", layer, " kv_head ", kv_head,
           " is listed twice");
    }
    heads.set(layer, kv_head, true);
  }
  return heads;
}

void save_retrieval_heads(const std::string& path, const RetrievalHeads& heads, const std::string& comment) {
  std::string text = "# RazorAttention retrieval heads: one '<layer> <kv_head>' pair per line\n";
  text += str_cat("# model: ", heads.n_layers(), " layers x ", heads.n_kv_heads(), " kv heads; ", heads.count(),
                  " retrieval heads\n");
  for (size_t pos = 0; pos < comment.size();) {
    const size_t newline = std::min(comment.find('\n', pos), comment.size());
    text += "# " + comment.substr(pos, newline - pos) + "\n";
    pos = newline + 1;
  }
  for (int layer = 0; layer < heads.n_layers(); ++layer)
    for (int h = 0; h < heads.n_kv_heads(); ++h)
      if (heads.is_retrieval(layer, h)) text += str_cat(layer, " ", h, "\n");
  write_file_atomically(path, [&](FileSink& sink) { sink.write(text.data(), text.size()); });
}

// ---- ranges ------------------------------------------------------------------------------

RazorParams razor_params(const LongContextConfig& config) {
  RazorParams params;
  params.sinks = config.razor.sinks;
  params.buffer_min = config.razor.buffer_min;
  params.buffer_ratio = config.razor.buffer_ratio;
  params.local_window = config.local_windows_len;
  return params;
}

RazorRanges razor_ranges(int64_t n_tokens, const RazorParams& params) {
  if (n_tokens < 0 || params.sinks < 0 || params.buffer_min < 0 || params.local_window < 0) {
    fail(ErrorCode::kInvalidArgument, "razor: negative n_tokens ", n_tokens, ", sinks ", params.sinks,
         ", buffer_min ", params.buffer_min, " or local_window ", params.local_window);
  }
  if (params.buffer_ratio < 1) {
    fail(ErrorCode::kInvalidArgument, "razor: buffer_ratio ", params.buffer_ratio, " must be >= 1");
  }
  const int64_t buffer = std::max({params.buffer_min, n_tokens / params.buffer_ratio, params.local_window});
  RazorRanges r;
  r.n_tokens = n_tokens;
  r.sinks_end = std::min(params.sinks, n_tokens);
  r.buffer_begin = std::max(r.sinks_end, n_tokens - buffer);
  return r;
}

std::vector<TokenSpan> non_retrieval_spans(const RazorRanges& ranges, int64_t end) {
  end = std::clamp<int64_t>(end, 0, ranges.n_tokens);
  std::vector<TokenSpan> spans;
  const int64_t sinks_end = std::min(ranges.sinks_end, end);
  if (sinks_end > 0) spans.push_back({0, sinks_end});
  const int64_t buffer_begin = std::min(ranges.buffer_begin, end);
  if (buffer_begin < end) {
    if (!spans.empty() && spans.back().end == buffer_begin) {
      spans.back().end = end;
    } else {
      spans.push_back({buffer_begin, end});
    }
  }
  return spans;
}

// ---- RazorCompensation -------------------------------------------------------------------

RazorCompensation::RazorCompensation(const kvstore::KVStore& store, int layer, const RetrievalHeads& heads,
                                     const RazorParams& params)
    : layer_(layer), params_(params), shape_(store.layout().shape) {
  razor_ranges(0, params);  // validates params
  if (layer < 0 || layer >= shape_.n_layers) {
    fail(ErrorCode::kInvalidArgument, "RazorCompensation: layer ", layer, " out of range [0, ", shape_.n_layers,
         ")");
  }
  if (heads.n_layers() != shape_.n_layers || heads.n_kv_heads() != shape_.n_kv_heads) {
    fail(ErrorCode::kInvalidArgument, "RazorCompensation: retrieval heads for ", heads.n_layers(), " layers x ",
         heads.n_kv_heads(), " kv heads, the store has ", shape_.n_layers, " x ", shape_.n_kv_heads);
  }
  tracked_.resize(size_t(shape_.n_kv_heads));
  for (int h = 0; h < shape_.n_kv_heads; ++h) tracked_[size_t(h)] = heads.is_retrieval(layer, h) ? 0 : 1;
  reset();
}

void RazorCompensation::reset() {
  ranges_ = razor_ranges(0, params_);
  key_sum_.assign(size_t(shape_.n_kv_heads) * size_t(shape_.head_dim), 0.0);
  value_sum_.assign(size_t(shape_.n_kv_heads) * size_t(shape_.head_dim), 0.0);
}

bool RazorCompensation::tracks(int kv_head) const {
  return kv_head >= 0 && kv_head < shape_.n_kv_heads && tracked_[size_t(kv_head)] != 0;
}

void RazorCompensation::check_store(const kvstore::KVStore& store) const {
  const kvstore::KVShape& s = store.layout().shape;
  if (s.n_layers != shape_.n_layers || s.n_kv_heads != shape_.n_kv_heads || s.head_dim != shape_.head_dim) {
    fail(ErrorCode::kInvalidArgument, "RazorCompensation: store shape ", s.n_layers, " layers x ", s.n_kv_heads,
         " kv heads x ", s.head_dim, " dims differs from the one it was built for (", shape_.n_layers, " x ",
         shape_.n_kv_heads, " x ", shape_.head_dim, ")");
  }
}

void RazorCompensation::check_tracked(int kv_head, const char* what) const {
  if (!tracks(kv_head)) {
    fail(ErrorCode::kInvalidArgument, "RazorCompensation::", what, ": kv head ", kv_head, " of layer ", layer_,
         " is not a tracked non-retrieval head (", shape_.n_kv_heads, " kv heads)");
  }
}

void RazorCompensation::update(const kvstore::KVStore& store) {
  check_store(store);
  const RazorRanges next = razor_ranges(store.n_tokens(layer_), params_);
  const bool grows = next.n_tokens >= ranges_.n_tokens &&
                     (ranges_.n_dropped() == 0 ||
                      (next.sinks_end == ranges_.sinks_end && next.buffer_begin >= ranges_.buffer_begin));
  if (!grows) reset();
  // After a reset ranges_ is empty: everything dropped is added.
  const int64_t begin = ranges_.n_dropped() == 0 ? next.sinks_end : ranges_.buffer_begin;
  if (next.buffer_begin > begin) {
    try {
      add_range(store, begin, next.buffer_begin);
    } catch (...) {
      reset();  // partly added sums are of no use
      throw;
    }
  }
  ranges_ = next;
}

// Adds tokens [begin, end) of every tracked head, in token order per channel
// (the same order whatever the update steps, so incremental sums equal sums
// built at once bit for bit).
void RazorCompensation::add_range(const kvstore::KVStore& store, int64_t begin, int64_t end) {
  const kvstore::StoreLayout& layout = store.layout();
  const int block_size = layout.block_size;
  const size_t dim = size_t(shape_.head_dim);
  std::vector<int> heads;
  for (int h = 0; h < shape_.n_kv_heads; ++h)
    if (tracked_[size_t(h)]) heads.push_back(h);
  kvstore::parallel_for_heads(
      store, int64_t(heads.size()), [&](int64_t i) { return heads[size_t(i)]; },
      [&](int64_t i) {
        const int h = heads[size_t(i)];
        double* key_sum = &key_sum_[size_t(h) * dim];
        double* value_sum = &value_sum_[size_t(h) * dim];
        std::vector<float> keys(dim * size_t(block_size)), values(dim * size_t(block_size));  // [channel][token], [token][channel]
        for (int64_t block = begin / block_size; block * block_size < end; ++block) {
          const int64_t block_begin = block * block_size;
          const size_t t0 = size_t(std::max(begin, block_begin) - block_begin);
          const size_t n = size_t(std::min(end, block_begin + block_size) - block_begin) - t0;
          const kvstore::BlockView view = store.block(layer_, h, block);
          kvstore::read_keys_t(layout, view, int(t0), int(n), keys.data(), n);
          kvstore::read_values(layout, view, int(t0), int(n), values.data(), dim);
          for (size_t t = 0; t < n; ++t)
            for (size_t c = 0; c < dim; ++c) {
              key_sum[c] += double(keys[c * n + t]);
              value_sum[c] += double(values[t * dim + c]);
            }
        }
      });
}

std::vector<double> RazorCompensation::mean_key(int kv_head) const {
  check_tracked(kv_head, "mean_key");
  const int64_t n = n_dropped();
  if (n == 0) return {};
  const size_t dim = size_t(shape_.head_dim);
  std::vector<double> mean(key_sum_.begin() + ptrdiff_t(size_t(kv_head) * dim),
                           key_sum_.begin() + ptrdiff_t(size_t(kv_head + 1) * dim));
  for (double& x : mean) x /= double(n);
  return mean;
}

std::vector<double> RazorCompensation::mean_value(int kv_head) const {
  check_tracked(kv_head, "mean_value");
  const int64_t n = n_dropped();
  if (n == 0) return {};
  const size_t dim = size_t(shape_.head_dim);
  std::vector<double> mean(value_sum_.begin() + ptrdiff_t(size_t(kv_head) * dim),
                           value_sum_.begin() + ptrdiff_t(size_t(kv_head + 1) * dim));
  for (double& x : mean) x /= double(n);
  return mean;
}

void RazorCompensation::compensation_partial(int kv_head, const float* q, int g, float scale, float* out,
                                             float* lse) const {
  check_tracked(kv_head, "compensation_partial");
  if (g < 1) fail(ErrorCode::kInvalidArgument, "RazorCompensation::compensation_partial: g ", g, " must be >= 1");
  const size_t dim = size_t(shape_.head_dim);
  const int64_t n = n_dropped();
  if (n == 0) {
    std::fill(out, out + size_t(g) * dim, 0.f);
    std::fill(lse, lse + g, kEmpty);
    return;
  }
  const std::vector<double> k_mean = mean_key(kv_head);
  const std::vector<double> v_mean = mean_value(kv_head);
  for (size_t j = 0; j < size_t(g); ++j) {
    double dot = 0;
    for (size_t c = 0; c < dim; ++c) dot += double(q[j * dim + c]) * k_mean[c];
    lse[j] = float(double(scale) * dot + std::log(double(n)));
    for (size_t c = 0; c < dim; ++c) out[j * dim + c] = float(v_mean[c]);
  }
}

// ---- razor decode attention --------------------------------------------------------------

Selection razor_selection(const kvstore::KVStore& store, int layer, const Selection& retrieval_selection,
                          const RetrievalHeads& heads, const RazorCompensation& comp, bool include_local) {
  const kvstore::KVShape& shape = store.layout().shape;
  if (layer < 0 || layer >= shape.n_layers) {
    fail(ErrorCode::kInvalidArgument, "razor_selection: layer ", layer, " out of range [0, ", shape.n_layers, ")");
  }
  if (heads.n_layers() != shape.n_layers || heads.n_kv_heads() != shape.n_kv_heads) {
    fail(ErrorCode::kInvalidArgument, "razor_selection: retrieval heads for ", heads.n_layers(), " layers x ",
         heads.n_kv_heads(), " kv heads, the store has ", shape.n_layers, " x ", shape.n_kv_heads);
  }
  if (retrieval_selection.spans.size() != size_t(shape.n_kv_heads)) {
    fail(ErrorCode::kInvalidArgument, "razor_selection retrieval_selection: spans for ",
         retrieval_selection.spans.size(), " kv heads, the store has ", shape.n_kv_heads);
  }
  if (comp.layer() != layer) {
    fail(ErrorCode::kInvalidArgument, "razor_selection: compensation of layer ", comp.layer(), " given for layer ",
         layer);
  }
  const int64_t n_tokens = store.n_tokens(layer);
  if (comp.n_tokens() != n_tokens) {
    fail(ErrorCode::kInvalidArgument, "razor_selection: compensation of layer ", layer, " covers ",
         comp.n_tokens(), " tokens, the layer holds ", n_tokens, " (call update)");
  }
  for (int h = 0; h < shape.n_kv_heads; ++h) {
    if (!heads.is_retrieval(layer, h) && !comp.tracks(h)) {
      fail(ErrorCode::kInvalidArgument, "razor_selection: kv head ", h, " of layer ", layer,
           " is a non-retrieval head the compensation does not track");
    }
  }
  const int64_t end = include_local ? n_tokens : store.partition(layer).local_begin;
  const std::vector<TokenSpan> compressed = non_retrieval_spans(comp.ranges(), end);
  Selection selection;
  selection.spans.resize(size_t(shape.n_kv_heads));
  for (int h = 0; h < shape.n_kv_heads; ++h)
    selection.spans[size_t(h)] = heads.is_retrieval(layer, h) ? retrieval_selection.spans[size_t(h)] : compressed;
  return selection;
}

void merge_compensation(const RazorCompensation& comp, const RetrievalHeads& heads, const float* q, int n_q_heads,
                        float scale, const MutableTensorView& out, const MutableTensorView& lse) {
  const int n_kv_heads = comp.shape().n_kv_heads;
  const int dim = comp.shape().head_dim;
  if (heads.n_layers() != comp.shape().n_layers || heads.n_kv_heads() != n_kv_heads) {
    fail(ErrorCode::kInvalidArgument, "merge_compensation: retrieval heads for ", heads.n_layers(), " layers x ",
         heads.n_kv_heads(), " kv heads, the compensation's store has ", comp.shape().n_layers, " x ", n_kv_heads);
  }
  if (n_q_heads < 1 || n_q_heads % n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "merge_compensation: ", n_q_heads,
         " query heads is not a positive multiple of ", n_kv_heads, " kv heads");
  }
  const int g = n_q_heads / n_kv_heads;
  check_dtype(as_const(out), "merge_compensation out", DType::kF32);
  check_shape(as_const(out), "merge_compensation out", {n_q_heads, dim});
  check_inner_contiguous(as_const(out), "merge_compensation out");
  check_dtype(as_const(lse), "merge_compensation lse", DType::kF32);
  check_shape(as_const(lse), "merge_compensation lse", {n_q_heads});
  check_inner_contiguous(as_const(lse), "merge_compensation lse");
  std::vector<float> comp_out(size_t(g) * size_t(dim));
  std::vector<float> comp_lse(static_cast<size_t>(g));
  for (int h = 0; h < n_kv_heads; ++h) {
    if (heads.is_retrieval(comp.layer(), h)) continue;
    comp.compensation_partial(h, q + size_t(h) * size_t(g) * size_t(dim), g, scale, comp_out.data(),
                              comp_lse.data());
    for (int j = 0; j < g; ++j) {
      const int64_t head = int64_t(h) * g + j;
      float* out_row = static_cast<float*>(out.element({head, 0}));
      float* lse_head = static_cast<float*>(lse.element({head}));
      merge_attention(out_row, lse_head, &comp_out[size_t(j) * size_t(dim)], &comp_lse[size_t(j)], out_row,
                      lse_head, 1, dim);
    }
  }
}

void razor_decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q,
                            const Selection& retrieval_selection, const RetrievalHeads& heads,
                            const RazorCompensation& comp, const RazorDecodeParams& params,
                            const MutableTensorView& out, const MutableTensorView& lse) {
  const Selection selection = razor_selection(store, layer, retrieval_selection, heads, comp, params.include_local);
  // Copy q before decode_attention writes out, which may alias it.
  const int head_dim = store.layout().shape.head_dim;
  check_dtype(q, "razor_decode_attention q", DType::kF32);
  check_shape(q, "razor_decode_attention q", {-1, head_dim});
  check_inner_contiguous(q, "razor_decode_attention q");
  const int64_t n_q_heads = q.shape[0];
  std::vector<float> q_rows(size_t(n_q_heads) * size_t(head_dim));
  for (int64_t j = 0; j < n_q_heads; ++j) {
    const float* row = static_cast<const float*>(q.element({j, 0}));
    std::copy(row, row + head_dim, &q_rows[size_t(j) * size_t(head_dim)]);
  }
  decode_attention(store, layer, q, selection, params.attention, out, lse);
  const float scale = params.attention.scale != 0.f ? params.attention.scale : 1.f / std::sqrt(float(head_dim));
  merge_compensation(comp, heads, q_rows.data(), int(n_q_heads), scale, out, lse);
}

// ---- retrieval-head search ---------------------------------------------------------------

Probe make_probe_tokens(int n_random, int repeats, int vocab, uint64_t seed, int bos) {
  const bool has_bos = bos >= 0;
  const int64_t candidates = int64_t(vocab) - (has_bos && bos < vocab ? 1 : 0);
  if (n_random < 1 || repeats < 2 || vocab < 1 || candidates < n_random) {
    fail(ErrorCode::kInvalidArgument, "make_probe_tokens: need n_random >= 1 (got ", n_random,
         "), repeats >= 2 (got ", repeats, ") and at least n_random ids in a vocabulary of ", vocab,
         (has_bos ? " besides the BOS id" : ""));
  }
  // Partial Fisher-Yates over the ids without bos: n_random distinct ids.
  std::vector<int32_t> ids;
  ids.reserve(size_t(candidates));
  for (int id = 0; id < vocab; ++id)
    if (id != bos) ids.push_back(id);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < size_t(n_random); ++i) {
    const size_t j = i + size_t(uniform_below(rng, uint64_t(ids.size() - i)));
    std::swap(ids[i], ids[j]);
  }
  Probe probe;
  probe.first = has_bos ? 1 : 0;
  probe.period = n_random;
  probe.repeats = repeats;
  if (has_bos) probe.tokens.push_back(bos);
  for (int r = 0; r < repeats; ++r) probe.tokens.insert(probe.tokens.end(), ids.begin(), ids.begin() + n_random);
  return probe;
}

RetrievalHeadSearch::RetrievalHeadSearch(int n_layers, int n_q_heads, int n_kv_heads, const Probe& probe)
    : n_layers_(n_layers),
      n_q_heads_(n_q_heads),
      n_kv_heads_(n_kv_heads),
      first_(probe.first),
      period_(probe.period),
      n_tokens_(int64_t(probe.tokens.size())) {
  if (n_layers < 1 || n_kv_heads < 1 || n_q_heads < 1 || n_q_heads % n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch: ", n_layers, " layers, ", n_q_heads,
         " query heads, ", n_kv_heads, " kv heads: need counts >= 1 and query heads a multiple of kv heads");
  }
  if (first_ < 0 || period_ < 1 || n_tokens_ < first_ + period_) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch: probe of ", n_tokens_, " tokens with first ", first_,
         " and period ", period_, " is not a repeated-tokens probe");
  }
  const size_t n_heads = size_t(n_layers) * size_t(n_q_heads);
  echo_sum_.assign(n_heads, 0.0);
  induction_sum_.assign(n_heads, 0.0);
  rows_.assign(n_heads, 0);
  seen_.assign(n_heads * size_t(n_tokens_), 0);
}

size_t RetrievalHeadSearch::head_index(int layer, int q_head, const char* what) const {
  if (layer < 0 || layer >= n_layers_ || q_head < 0 || q_head >= n_q_heads_) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch::", what, ": layer ", layer, " query head ", q_head,
         " out of range (", n_layers_, " layers, ", n_q_heads_, " query heads)");
  }
  return size_t(layer) * size_t(n_q_heads_) + size_t(q_head);
}

void RetrievalHeadSearch::accumulate_row(int layer, int q_head, int64_t i, const float* probs_row) {
  const size_t head = head_index(layer, q_head, "accumulate_row");
  if (i < 0 || i >= n_tokens_) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch::accumulate_row: row ", i, " of layer ", layer,
         " query head ", q_head, " out of range [0, ", n_tokens_, ")");
  }
  if (i < first_ + period_) return;  // no earlier copy: not scored
  uint8_t& seen = seen_[head * size_t(n_tokens_) + size_t(i)];
  if (seen) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch::accumulate_row: row ", i, " of layer ", layer,
         " query head ", q_head, " given twice");
  }
  double echo = 0, induction = 0;
  for (int64_t j = i - period_; j >= first_; j -= period_) {
    echo += double(probs_row[j]);
    induction += double(probs_row[j + 1]);  // j + 1 <= i - period + 1 <= i
  }
  if (!std::isfinite(echo) || !std::isfinite(induction)) {
    fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch::accumulate_row: row ", i, " of layer ", layer,
         " query head ", q_head, " holds a non-finite probability");
  }
  seen = 1;
  echo_sum_[head] += echo;
  induction_sum_[head] += induction;
  ++rows_[head];
}

void RetrievalHeadSearch::accumulate_matrix(int layer, int q_head, const float* probs) {
  for (int64_t i = 0; i < n_tokens_; ++i) accumulate_row(layer, q_head, i, probs + size_t(i) * size_t(n_tokens_));
}

double RetrievalHeadSearch::echo_score(int layer, int q_head) const {
  const size_t head = head_index(layer, q_head, "echo_score");
  return rows_[head] > 0 ? echo_sum_[head] / double(rows_[head]) : 0.0;
}

double RetrievalHeadSearch::induction_score(int layer, int q_head) const {
  const size_t head = head_index(layer, q_head, "induction_score");
  return rows_[head] > 0 ? induction_sum_[head] / double(rows_[head]) : 0.0;
}

int64_t RetrievalHeadSearch::scoring_rows(int layer, int q_head) const {
  return rows_[head_index(layer, q_head, "scoring_rows")];
}

HeadScores RetrievalHeadSearch::kv_head_scores() const {
  const int g = n_q_heads_ / n_kv_heads_;
  HeadScores scores;
  scores.n_layers = n_layers_;
  scores.n_kv_heads = n_kv_heads_;
  for (int layer = 0; layer < n_layers_; ++layer)
    for (int h = 0; h < n_kv_heads_; ++h) {
      double echo = -std::numeric_limits<double>::infinity(), induction = echo;
      for (int q_head = h * g; q_head < (h + 1) * g; ++q_head) {
        if (scoring_rows(layer, q_head) == 0) {
          fail(ErrorCode::kInvalidArgument, "RetrievalHeadSearch: layer ", layer, " query head ", q_head,
               " got no row with an earlier copy (rows ", first_ + period_, " to ", n_tokens_ - 1, ")");
        }
        echo = std::max(echo, echo_score(layer, q_head));
        induction = std::max(induction, induction_score(layer, q_head));
      }
      scores.echo.push_back(echo);
      scores.induction.push_back(induction);
    }
  return scores;
}

RetrievalHeads select_retrieval_heads(const HeadScores& scores, double induction_fraction, double echo_fraction) {
  if (!(induction_fraction >= 0 && induction_fraction <= 1) || !(echo_fraction >= 0 && echo_fraction <= 1)) {
    fail(ErrorCode::kInvalidArgument, "select_retrieval_heads: induction_fraction ", induction_fraction,
         " and echo_fraction ", echo_fraction, " must lie in [0, 1]");
  }
  RetrievalHeads heads(scores.n_layers, scores.n_kv_heads);
  const size_t n = size_t(scores.n_layers) * size_t(scores.n_kv_heads);
  if (scores.echo.size() != n || scores.induction.size() != n) {
    fail(ErrorCode::kInvalidArgument, "select_retrieval_heads: ", scores.echo.size(), " echo and ",
         scores.induction.size(), " induction scores for ", n, " heads");
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(scores.echo[i]) || !std::isfinite(scores.induction[i])) {
      fail(ErrorCode::kInvalidArgument, "select_retrieval_heads: layer ", i / size_t(scores.n_kv_heads),
           " kv head ", i % size_t(scores.n_kv_heads), " has a non-finite score");
    }
  }
  const auto mark = [&](const std::vector<double>& s, double fraction) {
    for (size_t i : top_indices(s, top_count(fraction, int64_t(n))))
      heads.set(int(i / size_t(scores.n_kv_heads)), int(i % size_t(scores.n_kv_heads)), true);
  };
  mark(scores.induction, induction_fraction);
  mark(scores.echo, echo_fraction);
  return heads;
}

}  // namespace longctx::policy
