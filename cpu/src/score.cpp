// score_blocks: scores every context block of a layer against a decode query.
//
// All five representative types reduce to dot products of prepared f32
// queries with the key slots at the start of each record (score_kernels.h):
//   MAX/MEAN     one slot (the representative), query q_h;
//   QUEST        one slot of 2*head_dim (max then min, contiguous in the
//                record), query [max(q_h, 0); min(q_h, 0)]: since max >= min,
//                max(q*M, q*m) is q*M where q >= 0 and q*m where q < 0;
//   FIX/DYNAMIC  the valid slots, query q_h, max (or mean) over the slots.
// Where the score is linear in q (every type with gqa sum, except FIX/DYNAMIC
// with a max over slots) the g queries of a group are summed first, so each
// record costs one dot product: scoring then streams the records at memory speed.
//
// Work is cut into pieces of consecutive records of one kv head, about
// kPiecesPerThread per thread, run in parallel with oneTBB; the kernel scores
// a piece one rep page at a time and prefetches across into the next page.
#include <algorithm>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "longctx/core/error.h"
#include "longctx/core/head_mask.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/node_executor.h"
#include "quant_dot.h"
#include "score_kernels.h"

namespace longctx::cpu {
namespace {

using kvstore::KVStore;
using kvstore::Partition;
using kvstore::StoreLayout;

// A piece holds at least this many records where the layer has them (the
// prefetch's cold start and the task's cost stay small next to its reads),
// at most kMaxRecordsPerPiece (the threads share the work), and about
// kPiecesPerThread pieces go to each thread in between.
constexpr int64_t kMinRecordsPerPiece = 64;
constexpr int64_t kMaxRecordsPerPiece = 1024;
constexpr int64_t kPiecesPerThread = 4;

// One piece of work: records [begin, end) of kv head `head`.
struct Piece {
  int head = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// How the records of a layer are scored; the per-head queries are in `queries`.
struct ScorePlan {
  int n_queries = 0;  // per kv head: 1 when the group was summed, else g
  int slot_len = 0;
  int slots_full = 0;  // valid slots of a full block
  Reduce slot_reduce = Reduce::kMax;
  Reduce query_reduce = Reduce::kSum;
  std::vector<float> queries;  // [n_kv_heads][n_queries][slot_len]
  // q8_0 stores: `queries` as 16-bit codes and their scales (score_kernels.h)
  std::vector<int16_t> query_codes;  // [n_kv_heads][n_queries][slot_len]
  std::vector<float> query_scales;   // [n_kv_heads][n_queries][slot_len / 32]
};

ScorePlan make_plan(const StoreLayout& layout, const TensorView& q, const ScoreParams& params) {
  using RT = RepresentativeType;
  const int head_dim = layout.shape.head_dim;
  const int n_kv_heads = layout.shape.n_kv_heads;
  const int group = int(q.shape[0]) / n_kv_heads;
  const bool quest = layout.rep_type == RT::kQuest;
  const bool slots_max = (layout.rep_type == RT::kFix || layout.rep_type == RT::kDynamic) &&
                         params.dynamic_reduce == Reduce::kMax;

  ScorePlan plan;
  plan.n_queries = params.gqa_reduce == Reduce::kSum && !slots_max ? 1 : group;
  plan.slot_len = quest ? 2 * head_dim : head_dim;
  plan.slots_full = quest ? 1 : layout.rep_slots;
  plan.slot_reduce = params.dynamic_reduce;
  plan.query_reduce = params.gqa_reduce;
  plan.queries.assign(size_t(n_kv_heads) * plan.n_queries * plan.slot_len, 0.f);
  for (int qh = 0; qh < int(q.shape[0]); ++qh) {
    const auto* row = static_cast<const float*>(q.element({qh, 0}));
    const int kv_head = qh / group;
    const int slot = plan.n_queries == 1 ? 0 : qh % group;
    float* prepared = plan.queries.data() + (size_t(kv_head) * plan.n_queries + slot) * plan.slot_len;
    for (int c = 0; c < head_dim; ++c) {
      if (quest) {
        prepared[c] += std::max(row[c], 0.f);
        prepared[head_dim + c] += std::min(row[c], 0.f);
      } else {
        prepared[c] += row[c];
      }
    }
  }
  if (layout.kv_type == DType::kQ8_0) {
    const int64_t groups = int64_t(plan.queries.size()) / kvstore::kQ8Group;
    plan.query_codes.resize(plan.queries.size());
    plan.query_scales.resize(size_t(groups));
    detail::quantize_act_blocks(plan.queries.data(), groups, kvstore::kQ8Group, plan.query_codes.data(),
                                plan.query_scales.data());
  }
  return plan;
}

void check_reduce(Reduce value, Reduce allowed_a, Reduce allowed_b, const char* field) {
  if (value != allowed_a && value != allowed_b)
    fail(ErrorCode::kInvalidArgument, "score_blocks: ScoreParams::", field, " is ", reduce_name(value),
         ", must be ", reduce_name(allowed_a), " or ", reduce_name(allowed_b));
}

}  // namespace

void check_decode_query(const KVStore& store, int layer, const TensorView& q, const char* what) {
  const StoreLayout& layout = store.layout();
  if (layer < 0 || layer >= layout.shape.n_layers)
    fail(ErrorCode::kInvalidArgument, what, ": layer ", layer, " out of range [0, ", layout.shape.n_layers, ")");
  const CheckName q_name(what, ": q");
  check_dtype(q, q_name.c_str(), DType::kF32);
  check_shape(q, q_name.c_str(), {-1, layout.shape.head_dim});
  check_inner_contiguous(q, q_name.c_str());
  const int n_kv_heads = layout.shape.n_kv_heads;
  if (q.shape[0] < n_kv_heads || q.shape[0] % n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, what, ": q has ", q.shape[0], " query heads, must be a positive multiple of ",
         n_kv_heads, " kv heads");
}

void score_blocks(const KVStore& store, int layer, const TensorView& q, const ScoreParams& params,
                  const MutableTensorView& scores, const std::function<void(int)>& head_scored,
                  const std::vector<uint8_t>& heads) {
  const StoreLayout& layout = store.layout();
  const int n_kv_heads = layout.shape.n_kv_heads;
  check_decode_query(store, layer, q, "score_blocks");
  check_reduce(params.gqa_reduce, Reduce::kSum, Reduce::kMax, "gqa_reduce");
  check_reduce(params.dynamic_reduce, Reduce::kMax, Reduce::kMean, "dynamic_reduce");
  check_head_mask(heads, n_kv_heads, "score_blocks", "heads");

  const Partition part = store.partition(layer);
  const int64_t n_context = part.end_context_block - part.first_context_block;
  const TensorView scores_view = as_const(scores);
  check_dtype(scores_view, "score_blocks: scores", DType::kF32);
  check_shape(scores_view, "score_blocks: scores", {n_kv_heads, n_context});
  if (n_context == 0) return;
  check_inner_contiguous(scores_view, "score_blocks: scores");

  const ScorePlan plan = make_plan(layout, q, params);
  const int64_t rpp = int64_t(layout.records_per_rep_page);
  const int64_t last_block = store.n_blocks(layer) - 1;
  // Only the last block of a layer can be partial, and only FIX/DYNAMIC have
  // fewer valid slots then.
  const int last_block_slots = plan.slots_full == 1 ? 1 : store.valid_rep_slots(layer, 0, last_block);

  int64_t n_scored = 0;
  for (int h = 0; h < n_kv_heads; ++h) n_scored += head_in_mask(heads, h);
  if (n_scored == 0) return;
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t per_piece = std::clamp(n_context * n_scored / (kPiecesPerThread * threads), kMinRecordsPerPiece,
                                       kMaxRecordsPerPiece);
  std::vector<Piece> pieces;
  for (int h = 0; h < n_kv_heads; ++h) {
    if (!head_in_mask(heads, h)) continue;
    for (int64_t b = part.first_context_block; b < part.end_context_block; b += per_piece)
      pieces.push_back({h, b, std::min(part.end_context_block, b + per_piece)});
  }

  const auto kv_head_of = [&](int64_t i) { return pieces[size_t(i)].head; };
  kvstore::parallel_for_heads(store, int64_t(pieces.size()), kv_head_of, [&](int64_t i) {
    const Piece& piece = pieces[size_t(i)];
    // The end of the run that starts at record b: the records of one rep
    // page, the partial last block (fewer valid FIX/DYNAMIC slots) a run of its own.
    const auto run_end = [&](int64_t b) {
      const int64_t end = std::min(piece.end, (b / rpp + 1) * rpp);
      return end - 1 == last_block && last_block_slots != plan.slots_full && end - 1 > b ? end - 1 : end;
    };
    detail::ScoreRun run;
    run.rep_dtype = layout.kv_type;  // the records' keys are kept in kv_type
    run.scales_offset = size_t(layout.rep_slots) * size_t(layout.shape.head_dim);  // q8_0: after every code
    const size_t first_query = size_t(piece.head) * size_t(plan.n_queries);
    run.queries = plan.queries.data() + first_query * size_t(plan.slot_len);
    if (layout.kv_type == DType::kQ8_0) {
      run.query_codes = plan.query_codes.data() + first_query * size_t(plan.slot_len);
      run.query_scales = plan.query_scales.data() + first_query * size_t(plan.slot_len / kvstore::kQ8Group);
    }
    run.n_queries = plan.n_queries;
    run.slot_len = plan.slot_len;
    run.slot_reduce = plan.slot_reduce;
    run.query_reduce = plan.query_reduce;
    run.record_bytes = layout.record_bytes;
    auto* out_row = static_cast<float*>(scores.element({piece.head, 0}));  // block first_context_block
    const std::byte* first_record = store.rep_record(layer, piece.head, piece.begin);
    for (int64_t begin = piece.begin, end = run_end(begin); begin < piece.end;) {
      const int64_t next_end = end < piece.end ? run_end(end) : end;
      run.first_record = first_record;
      run.n_slots = begin == last_block ? last_block_slots : plan.slots_full;
      run.n_records = end - begin;
      run.out = out_row + (begin - part.first_context_block);
      run.next_first_record = end < piece.end ? store.rep_record(layer, piece.head, end) : nullptr;
      run.next_n_records = next_end - end;
      detail::score_records(run);
      first_record = run.next_first_record;
      begin = end;
      end = next_end;
    }
  }, head_scored);
}

}  // namespace longctx::cpu
