// Decode attention over the KV store: argument checks, the flash-decoding
// plan (pieces of each kv head's selected tokens), the parallel run of the
// pieces (attention_hwy.cpp) and their LSE merge.
#include "longctx/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <tbb/parallel_for.h>

#include "attention_kernel.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/error.h"
#include "longctx/core/lse_merge.h"
#include "longctx/kvstore/node_executor.h"
#include "quant_dot.h"

namespace longctx::cpu {

static_assert(detail::kQ8VnniGroup == kvstore::kQ8Group);
static_assert(detail::kQ8VnniQuad == kvstore::kQ8KeyQuad && detail::kQ8VnniQuad == kvstore::kQ8ValueQuad);

bool detail::has_q8_vnni_kernels() {
  static const bool has = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
  }();
  return has;
}

bool detail::has_q8_avx2_kernels() {
  static const bool has = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx2 && f.fma && f.f16c;
  }();
  return has;
}

bool detail::has_q8_avx_vnni_kernels() {
  static const bool has = has_q8_avx2_kernels() && cpu_features().avx_vnni;
  return has;
}

const char* q8_decode_kernel_description() {
  if (detail::has_q8_vnni_kernels()) return "integer dot products on AVX512-VNNI (int8 q.k, 16-bit P.V weights)";
  if (detail::has_q8_avx_vnni_kernels()) return "int8 q.k on AVX-VNNI, P.V with the codes widened to f32";
  if (detail::has_q8_avx2_kernels()) return "int8 q.k on AVX2 (vpmaddubsw), P.V with the codes widened to f32";
  return "codes widened to f32, q quantized to int8";
}

// A piece: n_tokens consecutive selected tokens of one kv head, from token
// `token` of its span `span` on (the spans walked in order).
struct detail::DecodePiece {
  int kv_head = 0;
  size_t span = 0;
  int64_t token = 0;
  int64_t n_tokens = 0;
};

namespace {

using Piece = detail::DecodePiece;

// Default piece size (params.split_tokens == 0). It depends only on the
// selection, never on the thread count, so the result is bit-identical
// whatever the number of threads: about kTargetPieces pieces over all kv
// heads (enough to keep a large machine busy even with one kv head), at least
// kMinPieceTokens tokens each (so the per-piece work of reading q, writing
// and merging g x head_dim outputs, and the cold start of the prefetch at the
// first page of a piece, stay small next to the K/V it reads: 256-token
// pieces ran a 4096-token sparse step at ~60% of the speed of 1024-token ones),
// rounded to kPieceAlign tokens so block-aligned selections cut at block ends.
constexpr int64_t kTargetPieces = 256;
constexpr int64_t kMinPieceTokens = 1024;
constexpr int64_t kPieceAlign = 128;
// A tiny params.split_tokens over a long selection is raised so that the
// pieces' outputs (g x head_dim floats each) stay a bounded scratch.
constexpr int64_t kMaxPieces = 65536;

// The piece size of a kv head that selected head_tokens tokens: the rules
// above applied as if every kv head had selected as many. It depends on that
// head's selection alone, so a head can be planned and run before the other
// heads are selected (HeadwiseDecodeAttention::attend_head), with the same
// bits as when all heads run together.
int64_t split_tokens_of_head(const DecodeAttentionParams& params, int64_t head_tokens, int n_kv_heads) {
  const int64_t all_heads = head_tokens * n_kv_heads;
  if (params.split_tokens > 0) return std::max(params.split_tokens, (all_heads + kMaxPieces - 1) / kMaxPieces);
  const int64_t per_piece = std::max(kMinPieceTokens, (all_heads + kTargetPieces - 1) / kTargetPieces);
  return (per_piece + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
}

void check_query_and_outputs(const kvstore::KVStore& store, int layer, const TensorView& q,
                             const DecodeAttentionParams& params, const MutableTensorView& out,
                             const MutableTensorView& lse) {
  const kvstore::KVShape& shape = store.layout().shape;
  if (layer < 0 || layer >= shape.n_layers) {
    fail(ErrorCode::kInvalidArgument, "decode_attention: layer ", layer, " out of range [0, ", shape.n_layers, ")");
  }
  check_dtype(q, "decode_attention q", DType::kF32);
  check_shape(q, "decode_attention q", {-1, shape.head_dim});
  check_inner_contiguous(q, "decode_attention q");
  const int64_t n_q_heads = q.shape[0];
  if (n_q_heads < 1 || n_q_heads % shape.n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "decode_attention q: ", n_q_heads,
         " query heads is not a positive multiple of the store's ", shape.n_kv_heads, " kv heads");
  }
  check_finite(q, "decode_attention q");  // a NaN query gave out 0 and lse -inf, as if no key were attended
  check_dtype(as_const(out), "decode_attention out", DType::kF32);
  check_shape(as_const(out), "decode_attention out", {n_q_heads, shape.head_dim});
  check_inner_contiguous(as_const(out), "decode_attention out");
  check_dtype(as_const(lse), "decode_attention lse", DType::kF32);
  check_shape(as_const(lse), "decode_attention lse", {n_q_heads});
  check_inner_contiguous(as_const(lse), "decode_attention lse");
  if (!(std::isfinite(params.scale) && params.scale >= 0.f)) {  // as prefill_attention and the policies take it
    fail(ErrorCode::kInvalidArgument, "decode_attention params.scale: ", params.scale,
         " must be finite and >= 0 (0 = 1/sqrt(head_dim))");
  }
  if (params.split_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "decode_attention params.split_tokens: ", params.split_tokens,
         " is negative (0 chooses automatically)");
  }
}

void check_head_spans(const kvstore::KVStore& store, int layer, size_t h, const std::vector<TokenSpan>& spans) {
  const int64_t n_tokens = store.n_tokens(layer);
  for (size_t i = 0; i < spans.size(); ++i) {
    const TokenSpan& s = spans[i];
    if (s.begin < 0 || s.end > n_tokens || s.begin >= s.end) {
      fail(ErrorCode::kInvalidArgument, "decode_attention selection: kv head ", h, " span ", i, " [", s.begin,
           ", ", s.end, ") is empty or outside the tokens [0, ", n_tokens, ") of layer ", layer);
    }
    if (i > 0 && s.begin < spans[i - 1].end) {
      fail(ErrorCode::kInvalidArgument, "decode_attention selection: kv head ", h, " span ", i, " [", s.begin,
           ", ", s.end, ") starts before the end of span ", i - 1, " [", spans[i - 1].begin, ", ",
           spans[i - 1].end, "); spans must be sorted and non-overlapping");
    }
  }
}

// Appends the pieces of kv head h's selected tokens, cut in order into
// pieces of split_tokens tokens (the last may be shorter). Arithmetic on the
// spans only: the pages of a piece are looked up by the task that runs it
// (piece_slices), so those scattered reads are spread over the threads.
void plan_head_pieces(int h, const std::vector<TokenSpan>& spans, int64_t split_tokens, std::vector<Piece>& pieces) {
  int64_t in_piece = split_tokens;  // tokens in the last piece; full: the next token opens one
  for (size_t i = 0; i < spans.size(); ++i) {
    for (int64_t t = spans[i].begin; t < spans[i].end;) {
      if (in_piece == split_tokens) {
        pieces.push_back({h, i, t, 0});
        in_piece = 0;
      }
      const int64_t take = std::min(spans[i].end - t, split_tokens - in_piece);
      pieces.back().n_tokens += take;
      in_piece += take;
      t += take;
    }
  }
}

// The block slices of a piece of a head whose spans are `spans`: its tokens
// cut at block ends, each slice one block page's [begin, end). With
// max_slices, only the first ones.
void piece_slices(const kvstore::KVStore& store, int layer, const std::vector<TokenSpan>& spans, const Piece& piece,
                  std::vector<detail::BlockSlice>& slices, size_t max_slices = SIZE_MAX) {
  const int block_size = store.layout().block_size;
  slices.clear();
  size_t span = piece.span;
  int64_t t = piece.token;
  for (int64_t left = piece.n_tokens; left > 0 && slices.size() < max_slices;) {
    const int64_t block = t / block_size;
    const int64_t block_begin = block * block_size;
    const int64_t end = std::min({spans[span].end, block_begin + block_size, t + left});
    const kvstore::BlockView view = store.block(layer, piece.kv_head, block);
    slices.push_back({view.k_t, view.v, int(t - block_begin), int(end - block_begin), view.k_scales, view.v_scales});
    left -= end - t;
    t = end;
    if (t == spans[span].end && ++span < spans.size()) t = spans[span].begin;
  }
}

// Writes the g rows of kv head h from its `count` pieces (their outputs
// [count][g][dim] at head_out, lse [count][g] at head_lse) by one LSE merge
// of them all (core/lse_merge.h), in piece order; no piece: rows of 0 and
// lse -inf.
void write_head(const float* head_out, const float* head_lse, size_t count, int h, int g, int dim,
                const MutableTensorView& out, const MutableTensorView& lse) {
  for (int i = 0; i < g; ++i) {
    const int qh = h * g + i;
    float* out_row = static_cast<float*>(out.data) + qh * out.strides[0];
    float* lse_at = static_cast<float*>(lse.data) + qh * lse.strides[0];
    std::fill(out_row, out_row + dim, 0.f);
    *lse_at = -INFINITY;
    if (count == 0) continue;
    const LseMerge m = lse_merge(head_lse + i, int(count), size_t(g));
    *lse_at = m.lse;
    if (m.weight_sum == 0.f) continue;  // every piece empty
    for (size_t p = 0; p < count; ++p) {
      const float weight = lse_weight(head_lse[p * size_t(g) + size_t(i)], m.max_lse);
      if (weight == 0.f) continue;  // an empty piece is not read
      const float coefficient = weight / m.weight_sum;
      const float* row = head_out + (p * size_t(g) + size_t(i)) * size_t(dim);
      for (int c = 0; c < dim; ++c) out_row[c] += coefficient * row[c];
    }
  }
}

}  // namespace

HeadwiseDecodeAttention::HeadwiseDecodeAttention(const kvstore::KVStore& store, int layer, const TensorView& q,
                                                 const DecodeAttentionParams& params, const MutableTensorView& out,
                                                 const MutableTensorView& lse)
    : store_(store), layer_(layer), params_(params), out_(out), lse_(lse) {
  check_query_and_outputs(store, layer, q, params, out, lse);
  const kvstore::StoreLayout& layout = store.layout();
  const int n_q_heads = int(q.shape[0]);
  dim_ = layout.shape.head_dim;
  g_ = n_q_heads / layout.shape.n_kv_heads;
  const float scale = params.scale != 0.f ? params.scale : 1.f / std::sqrt(float(dim_));

  // q times the scale, contiguous (also makes out aliasing q harmless).
  q_scaled_.resize(size_t(n_q_heads) * size_t(dim_));
  for (int h = 0; h < n_q_heads; ++h) {
    const float* row = static_cast<const float*>(q.data) + h * q.strides[0];
    for (int c = 0; c < dim_; ++c) q_scaled_[size_t(h) * size_t(dim_) + size_t(c)] = row[c] * scale;
  }
  // q8_0 keys: q quantized per 32 channels too, so the dot products of codes
  // are integers (as in ggml's q8_0 x q8_0 dot). quantize_act_blocks itself:
  // quantize_acts adds the matmul kernels' sums in five more vectors, which
  // took about 4 us of every call (32 x 128, Zen 4).
  if (layout.kv_type == DType::kQ8_0) {
    const size_t n = q_scaled_.size(), groups = n / kvstore::kQ8Group;
    q_codes_.resize(n);
    q_scales_.resize(groups);
    detail::quantize_act_blocks(q_scaled_.data(), int64_t(groups), kvstore::kQ8Group, q_codes_.data(),
                                q_scales_.data());
    q_code_sums_.assign(groups, 0);
    for (size_t i = 0; i < n; ++i) {
      q_scaled_[i] = float(q_codes_[i]);
      q_code_sums_[i / kvstore::kQ8Group] += q_codes_[i];
    }
  }
}

void HeadwiseDecodeAttention::attend_piece(const std::vector<TokenSpan>& spans, const Piece& piece,
                                           const std::vector<TokenSpan>* following_spans, const Piece* following,
                                           float* piece_out, float* piece_lse) const {
  const kvstore::StoreLayout& layout = store_.layout();
  const int h = piece.kv_head;
  std::vector<detail::BlockSlice> slices, following_slices;
  piece_slices(store_, layer_, spans, piece, slices);
  if (following != nullptr) piece_slices(store_, layer_, *following_spans, *following, following_slices, 1);
  const size_t piece_floats = size_t(g_) * size_t(dim_);
  detail::PieceArgs args;
  args.q = q_scaled_.data() + size_t(h) * piece_floats;
  if (!q_codes_.empty()) {
    const size_t piece_groups = piece_floats / kvstore::kQ8Group;
    args.q_codes = q_codes_.data() + size_t(h) * piece_floats;
    args.q_scales = q_scales_.data() + size_t(h) * piece_groups;
    args.q_code_sums = q_code_sums_.data() + size_t(h) * piece_groups;
  }
  args.g = g_;
  args.head_dim = dim_;
  args.block_size = layout.block_size;
  args.kv_type = layout.kv_type;
  args.slices = slices.data();
  args.n_slices = slices.size();
  if (!following_slices.empty()) args.following = following_slices.data();
  args.out = piece_out;
  args.lse = piece_lse;
  detail::attend_piece(args);
}

void HeadwiseDecodeAttention::attend_head(int kv_head, const std::vector<TokenSpan>& spans) const {
  const int n_kv_heads = store_.layout().shape.n_kv_heads;
  if (kv_head < 0 || kv_head >= n_kv_heads) {
    fail(ErrorCode::kInvalidArgument, "decode_attention: kv head ", kv_head, " out of range [0, ", n_kv_heads, ")");
  }
  check_head_spans(store_, layer_, size_t(kv_head), spans);
  std::vector<Piece> pieces;
  plan_head_pieces(kv_head, spans, split_tokens_of_head(params_, span_tokens(spans), n_kv_heads), pieces);
  const size_t piece_floats = size_t(g_) * size_t(dim_);
  std::vector<float> piece_out(pieces.size() * piece_floats);
  std::vector<float> piece_lse(pieces.size() * size_t(g_));
  // The caller's task runs inside the arena of the head's node
  // (parallel_for_heads), and so do the pieces.
  tbb::parallel_for(size_t{0}, pieces.size(), [&](size_t p) {
    attend_piece(spans, pieces[p], &spans, p + 1 < pieces.size() ? &pieces[p + 1] : nullptr,
                 piece_out.data() + p * piece_floats, piece_lse.data() + p * size_t(g_));
  });
  write_head(piece_out.data(), piece_lse.data(), pieces.size(), kv_head, g_, dim_, out_, lse_);
}

void HeadwiseDecodeAttention::attend(const Selection& selection) const {
  const int n_kv_heads = store_.layout().shape.n_kv_heads;
  if (selection.spans.size() != size_t(n_kv_heads)) {
    fail(ErrorCode::kInvalidArgument, "decode_attention selection: spans for ", selection.spans.size(),
         " kv heads, the store has ", n_kv_heads);
  }
  for (size_t h = 0; h < selection.spans.size(); ++h) check_head_spans(store_, layer_, h, selection.spans[h]);

  // Every head's pieces in one parallel run; each kv head's pieces are
  // consecutive: [head_first[h], head_first[h + 1]).
  std::vector<Piece> pieces;
  std::vector<size_t> head_first(size_t(n_kv_heads) + 1);
  for (int h = 0; h < n_kv_heads; ++h) {
    const std::vector<TokenSpan>& spans = selection.spans[size_t(h)];
    head_first[size_t(h)] = pieces.size();
    plan_head_pieces(h, spans, split_tokens_of_head(params_, span_tokens(spans), n_kv_heads), pieces);
  }
  head_first[size_t(n_kv_heads)] = pieces.size();
  for (int h = 0; h < n_kv_heads; ++h) {  // no token selected: rows of 0, lse -inf
    if (head_first[size_t(h)] == head_first[size_t(h) + 1]) write_head(nullptr, nullptr, 0, h, g_, dim_, out_, lse_);
  }

  const size_t piece_floats = size_t(g_) * size_t(dim_);
  std::vector<float> piece_out(pieces.size() * piece_floats);
  std::vector<float> piece_lse(pieces.size() * size_t(g_));
  const auto kv_head_of = [&](int64_t p) { return pieces[size_t(p)].kv_head; };
  // The task that finishes a kv head's last piece merges the head's pieces
  // and writes its rows: no merge waits for the other heads.
  kvstore::parallel_for_heads(store_, int64_t(pieces.size()), kv_head_of, [&](int64_t item) {
    const size_t p = size_t(item);
    const Piece& piece = pieces[p];
    const Piece* following = p + 1 < pieces.size() ? &pieces[p + 1] : nullptr;  // maybe the next head's
    attend_piece(selection.spans[size_t(piece.kv_head)], piece,
                 following != nullptr ? &selection.spans[size_t(following->kv_head)] : nullptr, following,
                 piece_out.data() + p * piece_floats, piece_lse.data() + p * size_t(g_));
  }, [&](int h) {
    const size_t first = head_first[size_t(h)];
    write_head(piece_out.data() + first * piece_floats, piece_lse.data() + first * size_t(g_),
               head_first[size_t(h) + 1] - first, h, g_, dim_, out_, lse_);
  });
}

void decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q, const Selection& selection,
                      const DecodeAttentionParams& params, const MutableTensorView& out,
                      const MutableTensorView& lse) {
  HeadwiseDecodeAttention(store, layer, q, params, out, lse).attend(selection);
}

void dense_decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q,
                            const DecodeAttentionParams& params, const MutableTensorView& out,
                            const MutableTensorView& lse) {
  const int n_layers = store.layout().shape.n_layers;
  if (layer < 0 || layer >= n_layers) {
    fail(ErrorCode::kInvalidArgument, "dense_decode_attention: layer ", layer, " out of range [0, ", n_layers, ")");
  }
  const int64_t n_tokens = store.n_tokens(layer);
  Selection all;
  all.spans.resize(size_t(store.layout().shape.n_kv_heads));
  if (n_tokens > 0) {
    for (auto& spans : all.spans) spans.push_back({0, n_tokens});
  }
  decode_attention(store, layer, q, all, params, out, lse);
}

}  // namespace longctx::cpu
