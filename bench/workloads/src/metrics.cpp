// Quality metrics of a selection against dense attention.
#include "longctx/workloads/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "longctx/core/error.h"
#include "tbb/parallel_for.h"

namespace longctx::workloads {

using cpu::Selection;
using cpu::TokenSpan;

namespace {

// Query heads per kv head of `selection`, checked.
int group_size(const Selection& selection, int n_q_heads, const char* what) {
  const int n_kv = int(selection.spans.size());
  if (n_kv < 1 || n_q_heads < 1 || n_q_heads % n_kv != 0) {
    fail(ErrorCode::kInvalidArgument, what, ": n_q_heads ", n_q_heads, " must be a positive multiple of the ",
         n_kv, " kv heads of the selection");
  }
  return n_q_heads / n_kv;
}

// Whether a token lies in one of the spans (sorted by begin, non-overlapping).
bool attends(const std::vector<TokenSpan>& spans, int64_t token) {
  auto after = std::upper_bound(spans.begin(), spans.end(), token,
                                [](int64_t t, const TokenSpan& s) { return t < s.begin; });
  return after != spans.begin() && token < std::prev(after)->end;
}

}  // namespace

double topk_token_recall(const std::vector<double>& probs, int n_q_heads, int64_t n_tokens,
                         const Selection& selection, int k) {
  const int g = group_size(selection, n_q_heads, "topk_token_recall");
  if (n_tokens < 0 || probs.size() != size_t(n_q_heads) * size_t(n_tokens)) {
    fail(ErrorCode::kInvalidArgument, "topk_token_recall: probs has ", probs.size(), " entries, expected n_q_heads ",
         n_q_heads, " x n_tokens ", n_tokens);
  }
  if (k < 1) fail(ErrorCode::kInvalidArgument, "topk_token_recall: k = ", k, " must be >= 1");
  if (n_tokens == 0) return 1.0;
  const int64_t top = std::min<int64_t>(k, n_tokens);

  std::vector<int64_t> order(static_cast<size_t>(n_tokens));
  double recall_sum = 0;
  for (int h = 0; h < n_q_heads; ++h) {
    const double* p = probs.data() + size_t(h) * size_t(n_tokens);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [p](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    const std::vector<TokenSpan>& spans = selection.spans[size_t(h / g)];
    int64_t hits = 0;
    for (int64_t i = 0; i < top; ++i) hits += attends(spans, order[size_t(i)]) ? 1 : 0;
    recall_sum += double(hits) / double(top);
  }
  return recall_sum / double(n_q_heads);
}

double relative_l2_error(const float* out_sparse, const float* out_dense, int64_t n) {
  double diff = 0;
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = double(out_sparse[i]) - double(out_dense[i]);
    diff += e * e;
    ref += double(out_dense[i]) * double(out_dense[i]);
  }
  if (ref == 0) return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / ref);
}

double l1_loss(const float* out_sparse, const float* out_dense, int n_q_heads, int head_dim) {
  if (n_q_heads < 1 || head_dim < 1) {
    fail(ErrorCode::kInvalidArgument, "l1_loss: n_q_heads ", n_q_heads, " and head_dim ", head_dim,
         " must be >= 1");
  }
  double sum = 0;
  for (int64_t i = 0; i < int64_t(n_q_heads) * head_dim; ++i) {
    sum += std::fabs(double(out_sparse[i]) - double(out_dense[i]));
  }
  return sum / double(n_q_heads);
}

double block_recall(const Selection& selection, const std::vector<int64_t>& blocks, int block_size,
                    int64_t n_tokens) {
  if (block_size < 1) fail(ErrorCode::kInvalidArgument, "block_recall: block_size ", block_size, " must be >= 1");
  if (blocks.empty()) return 1.0;
  const int64_t n_blocks = n_tokens <= 0 ? 0 : (n_tokens + block_size - 1) / block_size;
  int64_t recalled = 0;
  for (int64_t b : blocks) {
    if (b < 0 || b >= n_blocks) {
      fail(ErrorCode::kInvalidArgument, "block_recall: block ", b, " outside [0, ", n_blocks, ") for ", n_tokens,
           " tokens in blocks of ", block_size);
    }
    const int64_t begin = b * block_size;
    const int64_t end = std::min(begin + block_size, n_tokens);
    bool every_head = true;
    for (const std::vector<TokenSpan>& spans : selection.spans) {
      int64_t covered = 0;  // spans do not overlap, so overlaps add up
      for (const TokenSpan& s : spans) covered += std::max<int64_t>(0, std::min(end, s.end) - std::max(begin, s.begin));
      every_head = every_head && covered == end - begin;
    }
    recalled += every_head ? 1 : 0;
  }
  return double(recalled) / double(blocks.size());
}

std::vector<double> dense_probabilities(const float* q, const float* k, int n_q_heads, int n_kv_heads,
                                        int head_dim, int64_t n_tokens, double scale) {
  if (n_q_heads < 1 || n_kv_heads < 1 || head_dim < 1 || n_tokens < 1 || n_q_heads % n_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "dense_probabilities: n_q_heads ", n_q_heads, ", n_kv_heads ", n_kv_heads,
         ", head_dim ", head_dim, ", n_tokens ", n_tokens,
         ": sizes must be >= 1 and n_q_heads a multiple of n_kv_heads");
  }
  if (scale == 0) scale = 1.0 / std::sqrt(double(head_dim));
  const int g = n_q_heads / n_kv_heads;
  const size_t d = size_t(head_dim);
  const size_t n = size_t(n_tokens);
  std::vector<double> probs(size_t(n_q_heads) * n);
  tbb::parallel_for(0, n_q_heads, [&](int h) {
    std::vector<double> qh(q + size_t(h) * d, q + size_t(h + 1) * d);
    double* p = probs.data() + size_t(h) * n;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (size_t t = 0; t < n; ++t) {
      const float* kt = k + (t * size_t(n_kv_heads) + size_t(h / g)) * d;
      double partial[4] = {0, 0, 0, 0};  // independent chains: 4x the throughput of one
      size_t c = 0;
      for (; c + 4 <= d; c += 4) {
        for (size_t j = 0; j < 4; ++j) partial[j] += qh[c + j] * double(kt[c + j]);
      }
      for (; c < d; ++c) partial[0] += qh[c] * double(kt[c]);
      p[t] = ((partial[0] + partial[1]) + (partial[2] + partial[3])) * scale;
      max_logit = std::max(max_logit, p[t]);
    }
    double sum = 0;
    for (size_t t = 0; t < n; ++t) sum += (p[t] = std::exp(p[t] - max_logit));
    for (size_t t = 0; t < n; ++t) p[t] /= sum;
  });
  return probs;
}

std::vector<double> dense_probabilities(const SyntheticWorkload& workload, double scale) {
  const SyntheticSpec& s = workload.spec;
  const size_t kv_elems = size_t(std::max<int64_t>(s.n_tokens, 0)) * size_t(std::max(s.n_kv_heads, 0)) *
                          size_t(std::max(s.head_dim, 0));
  if (workload.k.size() != kv_elems || workload.q.size() != size_t(std::max(s.n_q_heads, 0)) * size_t(std::max(s.head_dim, 0))) {
    fail(ErrorCode::kInvalidArgument, "dense_probabilities: workload arrays (k ", workload.k.size(), ", q ",
         workload.q.size(), " floats) do not match its spec (", s.n_tokens, " tokens, ", s.n_q_heads, " q heads, ",
         s.n_kv_heads, " kv heads, head_dim ", s.head_dim, ")");
  }
  return dense_probabilities(workload.q.data(), workload.k.data(), s.n_q_heads, s.n_kv_heads, s.head_dim,
                             s.n_tokens, scale);
}

}  // namespace longctx::workloads
