// RazorAttention (ALGORITHMS.md): most kv heads need only the first tokens,
// a recent buffer and one compensation token standing for everything else;
// a few "retrieval" heads keep normal block selection.
//
// (a) Decode for a non-retrieval kv head of a layer holding N tokens:
//     sinks    [0, sinks_end)              sinks_end = min(sinks, N)
//     dropped  [sinks_end, buffer_begin)   N_d = buffer_begin - sinks_end tokens
//     buffer   [buffer_begin, N)           buffer_begin = max(sinks_end, N - buffer)
//     buffer = max(buffer_min, floor(N / buffer_ratio), local_window)
//   It attends sinks + buffer exactly, plus one compensation token with key
//   k^ = mean of the dropped keys and value v^ = mean of the dropped values,
//   weighted by N_d (paper form): its partial result per query head is
//   out = v^, lse = scale * q.k^ + ln(N_d), merged by LSE with the attention
//   over sinks + buffer. Nothing is deleted from the KV store.
//   The buffer covers at least the local window (local_window =
//   local_windows_len) so that a local window attended elsewhere (GPU) never
//   holds a dropped token.
//   The dropped range only grows as tokens arrive: its end
//   N - max(S0, floor(N/C), W) = min(N - S0, N - floor(N/C), N - W) is a
//   minimum of non-decreasing functions of N (floor(N/C) grows by at most 1
//   per token), and its begin is `sinks` whenever it is non-empty. So the
//   compensation sums are updated by adding only the newly dropped tokens.
//
// (b) Retrieval-head search over the attention probabilities of the
//   repeated-random-tokens probe: echo score (attention to earlier copies of
//   the query's token) and induction score (attention to the token after an
//   earlier copy), max over a GQA group's query heads, retrieval heads = top
//   14% by induction U top 1% by echo over all (layer, kv head).
//
// Head-list file (razor.retrieval_heads), text, one retrieval head per line:
//     # comment to the end of the line; blank lines are ignored
//     <layer> <kv_head>          two decimal integers separated by blanks
//   e.g. "12 3" marks kv head 3 of layer 12. Every number is checked against
//   the model (0 <= layer < n_layers, 0 <= kv_head < n_kv_heads); a repeated
//   pair, a missing or extra field is an error naming file:line. Heads not
//   listed are non-retrieval. An empty list is valid (every head compressed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

// ---- retrieval heads ------------------------------------------------------------------

// The set of retrieval (layer, kv head) pairs of a model.
class RetrievalHeads {
 public:
  RetrievalHeads() = default;
  // No head is a retrieval head.
  RetrievalHeads(int n_layers, int n_kv_heads);
  // Every head is a retrieval head: RazorAttention off.
  static RetrievalHeads all(int n_layers, int n_kv_heads);

  // Throw Error(kInvalidArgument) naming layer/kv head and the limits when out of range.
  bool is_retrieval(int layer, int kv_head) const;
  void set(int layer, int kv_head, bool retrieval);

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int64_t count() const;  // retrieval heads
  bool operator==(const RetrievalHeads&) const = default;

 private:
  size_t index(int layer, int kv_head) const;  // checked
  int n_layers_ = 0;
  int n_kv_heads_ = 0;
  std::vector<uint8_t> retrieval_;  // [layer][kv head], 1 = retrieval
};

// Reads a head-list file (format above). path empty: every head is a
// retrieval head (RazorAttention off). Throws Error(kIo) when the file cannot
// be read and Error(kConfig) "path:line: ..." for a malformed line, a number
// out of range or a repeated pair; n_layers, n_kv_heads must be >= 1.
RetrievalHeads load_retrieval_heads(const std::string& path, int n_layers, int n_kv_heads);

// Writes `heads` as a head-list file (atomically), pairs in (layer, kv head)
// order after a comment header; `comment` lines (may be empty) are written as
// "# ..." lines first. Error(kIo) on failure.
void save_retrieval_heads(const std::string& path, const RetrievalHeads& heads, const std::string& comment);

// ---- compensation (non-retrieval heads) ----------------------------------------------

struct RazorParams {
  int64_t sinks = 4;          // razor.sinks
  int64_t buffer_min = 4000;  // S0, razor.buffer_min
  int64_t buffer_ratio = 5;   // C, razor.buffer_ratio (>= 1)
  int64_t local_window = 0;   // W: the buffer is never shorter (local_windows_len)
};

// The params of a config: razor.sinks/buffer_min/buffer_ratio, local_windows_len.
RazorParams razor_params(const LongContextConfig& config);

// The token ranges of a non-retrieval head of a layer holding n_tokens (see top).
struct RazorRanges {
  int64_t n_tokens = 0;
  int64_t sinks_end = 0;     // [0, sinks_end): sinks
  int64_t buffer_begin = 0;  // [sinks_end, buffer_begin): dropped; [buffer_begin, n_tokens): buffer
  int64_t n_dropped() const { return buffer_begin - sinks_end; }
};

// Throws Error(kInvalidArgument) naming the field for negative values or
// buffer_ratio < 1.
RazorRanges razor_ranges(int64_t n_tokens, const RazorParams& params);

// Spans a non-retrieval head attends exactly: sinks and buffer, both clipped
// to [0, end) (end = n_tokens, or the local window's begin when the local
// window is attended elsewhere), adjacent spans merged, empty ones left out.
std::vector<cpu::TokenSpan> non_retrieval_spans(const RazorRanges& ranges, int64_t end);

// Running sums of the dropped keys and values of the non-retrieval kv heads
// of one layer. Keys and values are read as stored (kv_type), widened to
// f32 exactly and summed in fp64 (not Kahan f32: the error of n additions,
// n * 2^-53 relative to the sum of magnitudes, stays below f32 rounding for
// any n < 2^29 tokens). Each channel is summed in token order whatever the
// update steps, so sums built token by token equal sums built at once bit
// for bit. Not thread-safe for update(); const methods may run concurrently
// with each other.
class RazorCompensation {
 public:
  // Tracks the kv heads of `layer` that `heads` does not list as retrieval
  // heads. Throws Error(kInvalidArgument) when heads' shape differs from the
  // store's, or layer/params are out of range.
  RazorCompensation(const kvstore::KVStore& store, int layer, const RetrievalHeads& heads,
                    const RazorParams& params);

  // Brings the sums up to date with store.n_tokens(layer): adds the tokens
  // that left the buffer since the last update. When the dropped range did
  // not grow from the previous one (fewer tokens than before: the store was
  // cleared) the sums are rebuilt from the store. After clear() and refilling
  // to more tokens than before, call reset() first: the store does not tell.
  // Throws Error(kInvalidArgument) when the store's shape differs from the
  // one given at construction; if reading the store fails midway the sums are
  // reset (as after reset()) before the error propagates.
  void update(const kvstore::KVStore& store);
  // Forgets every sum (as constructed).
  void reset();

  int layer() const { return layer_; }
  const kvstore::KVShape& shape() const { return shape_; }  // of the store it was built for
  const RazorParams& params() const { return params_; }
  bool tracks(int kv_head) const;            // a non-retrieval head of this layer
  const RazorRanges& ranges() const { return ranges_; }  // as of the last update
  int64_t n_tokens() const { return ranges_.n_tokens; }
  int64_t n_dropped() const { return ranges_.n_dropped(); }

  // The compensation token of a tracked kv head, in fp64: k^, v^ = means of
  // the dropped keys, values ([head_dim] each; empty vectors when N_d = 0).
  std::vector<double> mean_key(int kv_head) const;
  std::vector<double> mean_value(int kv_head) const;

  // Partial result of the compensation token for the g query heads of a
  // tracked kv head: q [g][head_dim], out [g][head_dim], lse [g], rows
  // contiguous. out = v^, lse = scale * q.k^ + ln(N_d), computed in fp64 and
  // rounded to f32; N_d = 0: out = 0, lse = -inf. Throws
  // Error(kInvalidArgument) for an untracked head or g < 1.
  void compensation_partial(int kv_head, const float* q, int g, float scale, float* out, float* lse) const;

 private:
  void add_range(const kvstore::KVStore& store, int64_t begin, int64_t end);
  void check_store(const kvstore::KVStore& store) const;
  void check_tracked(int kv_head, const char* what) const;

  int layer_ = 0;
  RazorParams params_;
  kvstore::KVShape shape_;
  std::vector<uint8_t> tracked_;  // [kv head]
  RazorRanges ranges_;            // what the sums cover
  std::vector<double> key_sum_;   // [kv head][head_dim]
  std::vector<double> value_sum_; // [kv head][head_dim]
};

// The tokens each kv head of `layer` attends exactly: retrieval_selection's
// spans for the heads `heads` lists as retrieval heads, non_retrieval_spans
// (end = n_tokens, or partition.local_begin when !include_local) for the
// others. `comp` must be for this layer, track every non-retrieval head and be
// up to date (comp.n_tokens() == store.n_tokens(layer)); otherwise, or when
// shapes disagree, Error(kInvalidArgument).
cpu::Selection razor_selection(const kvstore::KVStore& store, int layer, const cpu::Selection& retrieval_selection,
                               const RetrievalHeads& heads, const RazorCompensation& comp, bool include_local);

// Merges the compensation token of every non-retrieval kv head of comp's
// layer into the partial results of its g query heads (LSE merge; out, lse
// as decode_attention writes them, rows of out and q contiguous, q
// [n_q_heads][head_dim]); retrieval heads are left as they are. q must be
// the query as it was before out was written, if they alias. Error
// (kInvalidArgument) when shapes disagree with comp's store or a
// non-retrieval head is not tracked.
void merge_compensation(const RazorCompensation& comp, const RetrievalHeads& heads, const float* q, int n_q_heads,
                        float scale, const MutableTensorView& out, const MutableTensorView& lse);

struct RazorDecodeParams {
  cpu::DecodeAttentionParams attention;
  bool include_local = true;  // false: [partition.local_begin, N) is attended elsewhere (GPU)
};

// Decode attention of `layer` with RazorAttention: decode_attention over
// razor_selection, then merge_compensation. q, out, lse as in
// decode_attention (out may alias q). Error(kInvalidArgument) for anything
// razor_selection or decode_attention rejects.
void razor_decode_attention(const kvstore::KVStore& store, int layer, const TensorView& q,
                            const cpu::Selection& retrieval_selection, const RetrievalHeads& heads,
                            const RazorCompensation& comp, const RazorDecodeParams& params,
                            const MutableTensorView& out, const MutableTensorView& lse);

// ---- retrieval-head search -------------------------------------------------------------

// The repeated-random-tokens probe: [bos] + (n_random token ids) x repeats.
struct Probe {
  std::vector<int32_t> tokens;  // [first + n_random * repeats]
  int64_t first = 0;            // position of the first random token (1 with a BOS, else 0)
  int64_t period = 0;           // n_random
  int repeats = 0;
};

// n_random distinct ids drawn uniformly from [0, vocab) without `bos`, from a
// mt19937_64 seeded with `seed` (the same tokens on every platform), repeated
// `repeats` times, after `bos` when bos >= 0 (bos < 0: no BOS). The paper uses
// 2500 ids x 4 repeats. Throws Error(kInvalidArgument) when n_random < 1,
// repeats < 2, or vocab holds fewer than n_random ids besides bos.
Probe make_probe_tokens(int n_random, int repeats, int vocab, uint64_t seed, int bos);

// Scores of every (layer, kv head), index layer * n_kv_heads + kv_head.
struct HeadScores {
  int n_layers = 0;
  int n_kv_heads = 0;
  std::vector<double> echo;       // [n_layers * n_kv_heads]
  std::vector<double> induction;  // [n_layers * n_kv_heads]
};

// Accumulates echo and induction scores from the probe's causal attention
// probabilities, one query row at a time. For a query position i with
// earlier copies j = i - k*period >= first (k >= 1):
//   echo(i)      = sum_j p_i[j]        attention to earlier copies of its token
//   induction(i) = sum_j p_i[j + 1]    attention to the token after each copy
// A head's score is the mean over the rows it was given that have an earlier
// copy (i >= first + period); other rows are accepted and ignored. Rows of
// different (layer, q head) may be given from different threads at once.
class RetrievalHeadSearch {
 public:
  // Throws Error(kInvalidArgument) for counts < 1 or n_q_heads not a multiple of n_kv_heads.
  RetrievalHeadSearch(int n_layers, int n_q_heads, int n_kv_heads, const Probe& probe);

  // probs_row: f32 [i + 1], query i's attention probabilities over keys 0..i.
  // Throws Error(kInvalidArgument) naming layer/head/row for an index out of
  // range, a row given twice, or a non-finite probability among those summed.
  void accumulate_row(int layer, int q_head, int64_t i, const float* probs_row);
  // probs: f32 [T][T] row-major (entries above the diagonal ignored), T = probe length.
  void accumulate_matrix(int layer, int q_head, const float* probs);

  // Mean scores of one query head (0 when it got no scoring row).
  double echo_score(int layer, int q_head) const;
  double induction_score(int layer, int q_head) const;
  int64_t scoring_rows(int layer, int q_head) const;

  // Per (layer, kv head): max over the group's query heads. Throws
  // Error(kInvalidArgument) naming the first query head that got no scoring row.
  HeadScores kv_head_scores() const;

 private:
  size_t head_index(int layer, int q_head, const char* what) const;

  int n_layers_, n_q_heads_, n_kv_heads_;
  int64_t first_, period_, n_tokens_;
  std::vector<double> echo_sum_, induction_sum_;  // [layer][q head]
  std::vector<int64_t> rows_;                     // [layer][q head] scoring rows given
  std::vector<uint8_t> seen_;                     // [layer][q head][row]
};

// Retrieval heads = the top round(induction_fraction * n) kv heads by
// induction score U the top round(echo_fraction * n) by echo score, over all
// n = n_layers * n_kv_heads (layer, kv head) pairs. round = nearest integer,
// halves up, at least 1 when the fraction is > 0; ties: lower (layer, kv head)
// first. Throws Error(kInvalidArgument) for a fraction outside [0, 1] or
// scores of the wrong size.
RetrievalHeads select_retrieval_heads(const HeadScores& scores, double induction_fraction = 0.14,
                                      double echo_fraction = 0.01);

}  // namespace longctx::policy
