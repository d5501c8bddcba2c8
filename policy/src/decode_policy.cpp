// DecodePolicy: config -> the policy building blocks (see decode_policy.h).
#include "longctx/policy/decode_policy.h"
#include "longctx/policy/rerank.h"
#include "longctx/policy/tail.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/policy/preselect.h"
#include "longctx/policy/select.h"
#include "longctx/policy/streaming.h"

namespace longctx::policy {

using cpu::decode_attention;
using cpu::DecodeAttentionParams;
using cpu::dense_decode_attention;
using cpu::select_all;
using cpu::Selection;
using kvstore::Partition;

namespace {

// The store was built from its own config; the policy's must describe the same layout and ranges.
void check_matches_store(const LongContextConfig& config, const kvstore::KVStore& store) {
  const LongContextConfig& built = store.config();
  const kvstore::StoreLayout& layout = store.layout();
  auto mismatch = [](const char* key, auto policy_value, auto store_value) {
    fail(ErrorCode::kInvalidArgument, "DecodePolicy: config key '", key, "' is ", policy_value,
         " but the KV store was built with ", store_value);
  };
  if (config.block_size != layout.block_size) mismatch("block_size", config.block_size, layout.block_size);
  if (config.kv_type != layout.kv_type) mismatch("kv_type", dtype_name(config.kv_type), dtype_name(layout.kv_type));
  if (config.representative_type != layout.rep_type)
    mismatch("representative_type", representative_type_name(config.representative_type),
             representative_type_name(layout.rep_type));
  if (config.representative_num != built.representative_num)
    mismatch("representative_num", config.representative_num, built.representative_num);
  if (config.initial_len != built.initial_len) mismatch("initial_len", config.initial_len, built.initial_len);
  if (config.local_windows_len != built.local_windows_len)
    mismatch("local_windows_len", config.local_windows_len, built.local_windows_len);
  if (config.tail == TailMode::kEstimate && layout.record_tail_offset == 0)
    mismatch("tail", "estimate", "tail: drop (its records keep no tail sums)");
}

// The retrieval heads RazorAttention uses (none: off), after checking the config against the store.
RetrievalHeads checked_heads(const LongContextConfig& config, const kvstore::KVStore& store, RetrievalHeads heads) {
  validate_config(config);
  check_matches_store(config, store);
  const kvstore::KVShape& shape = store.layout().shape;
  if (heads.n_layers() == 0 && heads.n_kv_heads() == 0) {
    if (config.razor.retrieval_heads.empty()) return heads;  // RazorAttention off
    return load_retrieval_heads(config.razor.retrieval_heads, shape.n_layers, shape.n_kv_heads);
  }
  if (heads.n_layers() != shape.n_layers || heads.n_kv_heads() != shape.n_kv_heads)
    fail(ErrorCode::kInvalidArgument, "DecodePolicy: retrieval heads for ", heads.n_layers(), " layers x ",
         heads.n_kv_heads(), " kv heads, but the KV store has ", shape.n_layers, " layers x ", shape.n_kv_heads,
         " kv heads");
  // validate_config refuses these with razor.retrieval_heads; heads given here bypass it.
  if (config.tail == TailMode::kEstimate)
    fail(ErrorCode::kInvalidArgument, "DecodePolicy: tail: estimate with RazorAttention (retrieval heads given): "
         "RazorAttention already compensates what its heads drop; use one or the other");
  if (config.rerank != RerankMode::kNone)
    fail(ErrorCode::kInvalidArgument, "DecodePolicy: rerank: tokens with RazorAttention (retrieval heads given): "
         "RazorAttention selects its own tokens; use one or the other");
  return heads;
}

// The attention parameters of every call: the model's scale, checked once here.
DecodeAttentionParams attention_params(float attn_scale) {
  if (!std::isfinite(attn_scale) || attn_scale < 0.f)
    fail(ErrorCode::kInvalidArgument, "DecodePolicy: attn_scale is ", attn_scale,
         ", must be finite and >= 0 (0 = 1/sqrt(head_dim))");
  DecodeAttentionParams params;
  params.scale = attn_scale;
  return params;
}

// H2O's budget from the config, its probabilities at the model's scale.
H2OParams h2o_params(const LongContextConfig& config, float attn_scale) {
  H2OParams params = H2OParams::from_config(config);
  params.scale = attn_scale;
  return params;
}

int64_t attended_tokens(const Selection& selection) {
  int64_t total = 0;
  for (size_t h = 0; h < selection.spans.size(); ++h) total += selection.tokens(static_cast<int>(h));
  return total;
}

}  // namespace

DecodePolicy::DecodePolicy(const LongContextConfig& config, kvstore::KVStore& store, float attn_scale,
                           RetrievalHeads heads)
    : config_(config),
      store_(store),
      attention_(attention_params(attn_scale)),
      heads_(checked_heads(config, store, std::move(heads))),
      schedule_(config),
      cache_(store.layout().shape.n_layers) {
  const auto n_layers = static_cast<size_t>(store.layout().shape.n_layers);
  preselected_.resize(n_layers);
  h2o_.resize(n_layers);
  razor_.resize(n_layers);
  speculated_q_.resize(n_layers);
  choosing_heads_.resize(n_layers);
  if (!razor_enabled()) return;
  // A group's selection serves every layer of it: the heads that are
  // retrieval heads in any of them choose.
  const int n_kv_heads = store.layout().shape.n_kv_heads;
  for (int layer = 0; layer < int(n_layers); ++layer) {
    if (schedule_.is_dense(layer)) continue;
    std::vector<uint8_t>& choosing = choosing_heads_[size_t(schedule_.group_of(layer))];
    choosing.resize(size_t(n_kv_heads), 0);
    for (int h = 0; h < n_kv_heads; ++h)
      if (heads_.is_retrieval(layer, h)) choosing[size_t(h)] = 1;
  }
}

void DecodePolicy::check_layer(int layer, const char* what) const {
  if (layer < 0 || layer >= store_.layout().shape.n_layers)
    fail(ErrorCode::kInvalidArgument, "DecodePolicy::", what, ": layer ", layer, " out of range [0, ",
         store_.layout().shape.n_layers, ")");
}

void DecodePolicy::on_prefill_end(int layer, const TensorView& window_q) {
  check_layer(layer, "on_prefill_end");
  if (config_.policy == SelectionPolicy::kH2O) {
    h2o_[size_t(layer)].emplace(store_.layout().shape.n_kv_heads, h2o_params(config_, attention_.scale));
    h2o_[size_t(layer)]->init_from_prefill(store_, layer, window_q);
    return;
  }
  // DYNAMIC representatives are the keys the window votes for, with or
  // without preselection: nothing else gives them importance.
  const bool dynamic = config_.representative_type == RepresentativeType::kDynamic;
  if (config_.policy != SelectionPolicy::kSelect || schedule_.is_dense(layer)) return;
  if (!config_.preselect_block && !dynamic) return;

  SnapKVParams params;
  params.pool_kernel = config_.preselect.pool_kernel;
  params.pool = config_.preselect.pool == PoolType::kMax ? Reduce::kMax : Reduce::kMean;
  params.gqa_reduce = config_.preselect.gqa_reduce;
  params.scale = attention_.scale;
  std::vector<float> votes;  // pooled: preselection ranks blocks
  if (config_.preselect_block) {
    votes = snapkv_token_votes(store_, layer, window_q, params);
    const int n_kv_heads = store_.layout().shape.n_kv_heads;
    const Partition partition = store_.partition(layer);
    // Only the heads that choose vote (RazorAttention: the retrieval heads), as they alone choose later.
    const std::vector<int> choosers =
        choosing_head_list(choosing_heads_[size_t(schedule_.group_of(layer))], n_kv_heads);
    if (!choosers.empty()) {
      std::vector<float> block_scores = block_votes(votes, n_kv_heads, partition, config_.block_size);
      const bool every_head = int(choosers.size()) == n_kv_heads;
      if (!every_head)
        block_scores = rows_of(block_scores, partition.end_context_block - partition.first_context_block, choosers);
      std::vector<std::vector<int64_t>> lists =
          preselect_blocks(block_scores, int(choosers.size()), partition, config_.preselect_block_count,
                           config_.head_select_mode, config_.budget);
      if (!every_head) lists = for_every_head(std::move(lists), choosers, n_kv_heads, config_.head_select_mode);
      preselected_[size_t(layer)] =
          Preselected{std::move(lists), config_.preselect_block_count, partition.end_ranked_block};
    }
  }
  if (!dynamic) return;
  // Representatives are tokens: pooling would spread a peak over kernel/2
  // neighbours each side, and the tie-break would pick the first of them.
  // Unpooled votes cost a second pass over the window when pooling is on,
  // once per layer at the end of a prefill.
  if (votes.empty() || params.pool_kernel != 1) {
    params.pool_kernel = 1;
    votes = snapkv_token_votes(store_, layer, window_q, params);
  }
  feed_dynamic(store_, layer, votes);
}

namespace {

// Whether, for every kv head, the mean over its query heads of cos(q_h,
// last_h) reaches `threshold`; false when nothing was saved (last empty).
bool queries_close(const TensorView& q, const std::vector<float>& last, int n_kv_heads, double threshold) {
  const int64_t n_q = q.shape[0], d = q.shape[1], group = n_q / n_kv_heads;
  if (last.size() != size_t(n_q * d)) return false;
  for (int g = 0; g < n_kv_heads; ++g) {
    double cos_sum = 0.0;
    for (int64_t j = 0; j < group; ++j) {
      const int64_t h = g * group + j;
      const float* a = static_cast<const float*>(q.data) + h * q.strides[0];
      const float* b = last.data() + h * d;
      double ab = 0.0, aa = 0.0, bb = 0.0;
      for (int64_t c = 0; c < d; ++c) ab += double(a[c]) * b[c], aa += double(a[c]) * a[c], bb += double(b[c]) * b[c];
      cos_sum += aa > 0.0 && bb > 0.0 ? ab / std::sqrt(aa * bb) : 0.0;
    }
    if (cos_sum / double(group) < threshold) return false;
  }
  return true;
}

}  // namespace

Selection DecodePolicy::selection_for(int layer, int64_t token_idx, const TensorView& q, bool include_local,
                                      const HeadSelected& head_selected) {
  const Partition partition = store_.partition(layer);
  switch (decide(schedule_, cache_, layer, token_idx)) {
    case ReuseAction::kDense:  // decode() handles dense layers before asking
      return select_all(store_, layer, include_local);
    case ReuseAction::kReuse: {
      const SavedSelection& saved = *cache_.get(schedule_.group_of(layer));
      if (saved.include_local == include_local) return reused_selection(saved, partition);
      break;  // saved for the other placement of the local window: select anew
    }
    case ReuseAction::kSelect:
      break;
  }
  // speculate: the layer's last selection, made with the query saved beside
  // it, while every kv group's queries stay that close to it. New tokens and
  // tokens that left the local window are attended anyway (reused_selection).
  std::vector<float>& last_q = speculated_q_[size_t(layer)];
  if (config_.speculate) {
    const SavedSelection* saved = cache_.get(schedule_.group_of(layer));
    if (saved != nullptr && saved->include_local == include_local &&
        queries_close(q, last_q, store_.layout().shape.n_kv_heads, config_.speculate_cosine)) {
      stats_.speculated = true;
      return reused_selection(*saved, partition);
    }
  }
  const auto& preselected = preselected_[size_t(layer)];
  SelectSpec spec = SelectSpec::from_config(config_, include_local, attention_.scale);
  spec.choosing_heads = choosing_heads_[size_t(schedule_.group_of(layer))];  // empty without RazorAttention
  const bool rerank = config_.rerank == RerankMode::kTokens;
  if (rerank) spec.blocks *= config_.rerank_candidates;  // candidates, whose tokens are reranked
  // The query this selection is made with, rows packed, copied first: the
  // attention of head_selected may write an out that aliases q.
  std::vector<float> query;
  if (config_.speculate) {
    const int64_t n_q = q.shape[0], d = q.shape[1];
    query.resize(size_t(n_q * d));
    for (int64_t h = 0; h < n_q; ++h)
      std::copy_n(static_cast<const float*>(q.data) + h * q.strides[0], d, query.data() + h * d);
  }
  Selection selection = select_blocks(store_, layer, q, spec, preselected ? &*preselected : nullptr,
                                      &stats_.estimated_mass, rerank ? HeadSelected{} : head_selected);
  if (rerank)
    selection = rerank_tokens(store_, layer, q, selection,
                              int64_t{config_.second_select_num} * store_.layout().block_size, config_.gqa_reduce);
  cache_.put(schedule_.group_of(layer), SavedSelection{selection, partition, include_local});
  if (config_.speculate) last_q = std::move(query);
  stats_.reselected = true;
  return selection;
}

void DecodePolicy::attend_dense(int layer, const TensorView& q, bool include_local, const MutableTensorView& out,
                                const MutableTensorView& lse) {
  last_selection_ = select_all(store_, layer, include_local);
  if (include_local)
    dense_decode_attention(store_, layer, q, attention_, out, lse);
  else
    decode_attention(store_, layer, q, last_selection_, attention_, out, lse);
}

void DecodePolicy::attend_razor(int layer, const TensorView& q, const Selection& selection, bool include_local,
                                const MutableTensorView& out, const MutableTensorView& lse) {
  auto& comp = razor_[size_t(layer)];
  if (!comp) comp.emplace(store_, layer, heads_, razor_params(config_));
  comp->update(store_);
  last_selection_ = razor_selection(store_, layer, selection, heads_, *comp, include_local);
  razor_decode_attention(store_, layer, q, selection, heads_, *comp, RazorDecodeParams{attention_, include_local}, out,
                         lse);
}

void DecodePolicy::add_tail(int layer, const TensorView& q, const Selection& selection, const MutableTensorView& out,
                            const MutableTensorView& lse) {
  const TailEstimate tail = estimate_tail(store_, layer, q, selection, attention_.scale);
  const std::vector<double> share = merge_tail(tail, out, lse);
  const size_t n_kv = selection.spans.size(), group = share.size() / n_kv;
  stats_.tail_mass.assign(n_kv, 0.0);
  for (size_t h = 0; h < share.size(); ++h) stats_.tail_mass[h / group] += share[h] / double(group);
  stats_.tail_blocks = tail.tail_blocks;
}

void DecodePolicy::decode(int layer, int64_t token_idx, const TensorView& q, bool include_local,
                          const MutableTensorView& out, const MutableTensorView& lse) {
  check_layer(layer, "decode");
  if (token_idx < 0) fail(ErrorCode::kInvalidArgument, "DecodePolicy::decode: token_idx ", token_idx, " < 0");
  stats_ = Stats{};
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  switch (config_.policy) {
    case SelectionPolicy::kDense:
      attend_dense(layer, q, include_local, out, lse);
      break;
    case SelectionPolicy::kStreaming:
      last_selection_ = streaming_selection(store_, layer, include_local);
      decode_attention(store_, layer, q, last_selection_, attention_, out, lse);
      break;
    case SelectionPolicy::kH2O: {
      if (!include_local)
        fail(ErrorCode::kInvalidArgument, "DecodePolicy::decode: policy h2o attends its recent tokens on the CPU; "
             "include_local must be true (layer ", layer, ")");
      auto& state = h2o_[size_t(layer)];
      if (!state) state.emplace(store_.layout().shape.n_kv_heads, h2o_params(config_, attention_.scale));
      // step() attends the kept set plus the tokens it has not seen yet, then evicts.
      last_selection_ = extend_with_new_tokens(state->selection(), state->n_seen(), store_.n_tokens(layer));
      state->step(store_, layer, q, out, lse);
      break;
    }
    case SelectionPolicy::kSelect: {
      if (schedule_.is_dense(layer)) {  // dense layers attend everything, RazorAttention or not
        attend_dense(layer, q, include_local, out, lse);
        break;
      }
      // A re-selection whose heads choose from their own scores attends each
      // kv head as soon as its spans are chosen (select_blocks'
      // head_selected); any other selection attends after it, with the query
      // prepared once either way. RazorAttention attends after it too.
      std::optional<cpu::HeadwiseDecodeAttention> headwise;
      if (!razor_enabled()) headwise.emplace(store_, layer, q, attention_, out, lse);
      std::atomic<bool> attended{false};
      std::atomic<double> last_chosen{0.0};  // seconds to the last head's choice
      const HeadSelected attend_head = [&](int h, const std::vector<cpu::TokenSpan>& spans) {
        const double chosen_at = seconds();
        for (double was = last_chosen.load(); was < chosen_at && !last_chosen.compare_exchange_weak(was, chosen_at);) {
        }
        headwise->attend_head(h, spans);
        attended = true;
      };
      const Selection selection =
          selection_for(layer, token_idx, q, include_local, headwise ? attend_head : HeadSelected{});
      // Where the heads' attention ran beside the choice, select_seconds
      // ends at the last head's choice and attend_seconds holds the rest.
      stats_.select_seconds = attended.load() ? last_chosen.load() : seconds();
      if (headwise) {
        if (!attended.load()) headwise->attend(selection);
        last_selection_ = selection;
      } else {
        attend_razor(layer, q, selection, include_local, out, lse);
      }
      if (config_.tail == TailMode::kEstimate) add_tail(layer, q, selection, out, lse);
      break;
    }
  }
  stats_.attended_tokens = attended_tokens(last_selection_);
  stats_.attend_seconds = seconds() - stats_.select_seconds;
}

}  // namespace longctx::policy
