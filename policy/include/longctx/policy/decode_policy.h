// Every decode-time policy selectable from the config: a thin orchestrator
// over the policy building blocks (policy/*.h) and the engine (selection.h,
// attention.h). It holds the per-layer state the policies need (SnapKV
// preselected sets, H2O states, saved selections for reuse, RazorAttention
// compensation sums) and, per decode call, attends what config.policy says:
//   dense      dense_decode_attention (select_all(.., false) when the local
//              window is attended elsewhere)
//   streaming  streaming_selection: initial_len sinks + local_windows_len recent
//   h2o        one H2OState per layer: init_from_prefill at on_prefill_end, step()
//   select     layers below dense_layer_num attend everything; the others
//              re-select or reuse as ReuseSchedule/SelectionCache decide. A
//              re-selection is select_blocks (select.h) with the config's
//              SelectSpec and the layer's preselected blocks. With RazorAttention
//              (retrieval heads given or razor.retrieval_heads naming a file)
//              the blocks are chosen by the retrieval heads' scores alone
//              (SelectSpec::choosing_heads: the heads that are retrieval
//              heads in some layer of the group sharing the selection) and
//              razor_decode_attention compresses the others. Without it,
//              a SEPARATE re-selection attends each kv head from the task
//              that chose its blocks (select_blocks' head_selected), so the
//              attention runs beside the other heads' scoring rather than
//              in a parallel pass of its own.
// One DecodePolicy serves one sequence of one store; not thread-safe (layers
// are decoded one call at a time).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/policy/h2o.h"
#include "longctx/policy/razor.h"
#include "longctx/policy/reuse.h"
#include "longctx/policy/select.h"

namespace longctx::policy {

class DecodePolicy {
 public:
  // What the last decode() did.
  struct Stats {
    int64_t attended_tokens = 0;  // tokens attended exactly, summed over kv heads
                                  // (RazorAttention's compensation tokens not counted)
    bool reselected = false;      // select policy: this call chose blocks (not dense, not reused)
    double select_seconds = 0;    // select policy: scoring and choosing (or reusing) the blocks
    double attend_seconds = 0;    // the attention over the selection (everything else of the call)
    // budget.mode top_p, when this call chose blocks: each kv head's estimated
    // share of its attention mass that the selection attends (policy/top_p.h).
    std::vector<double> estimated_mass;
    // tail: estimate, select policy (not dense layers): per kv head, the
    // estimated share of the merged attention mass that came from the
    // unselected blocks' estimate (mean over the group's query heads; 0 when
    // every context block was selected), and the blocks it covered, summed
    // over kv heads (policy/tail.h).
    std::vector<double> tail_mass;
    int64_t tail_blocks = 0;
    // speculate: this call reused its layer's last selection because the
    // query stayed close to the one that made it (not a reselect).
    bool speculated = false;
  };

  // `store` must outlive the policy; it is written only by on_prefill_end
  // (DYNAMIC representatives fed with the SnapKV votes). attn_scale: the
  // model's score scale (TransformerSpec::attn_scale; 0 = 1/sqrt(head_dim)),
  // used by every attention the policy computes and by the SnapKV and H2O
  // probabilities, so that a part attended here merges by LSE with a part
  // attended elsewhere at the same scale. `heads`: the
  // retrieval heads for RazorAttention; when empty (default-constructed) and
  // config.razor.retrieval_heads names a file, the file is loaded; when both
  // are empty RazorAttention is off. Throws Error(kConfig) for a config that
  // validate_config rejects, and Error(kInvalidArgument) naming the key when
  // config and store disagree (block_size, kv_type, representative_type,
  // representative_num, initial_len, local_windows_len) or heads' shape is
  // not the store's or attn_scale is negative or not finite, and naming both
  // when heads are given with tail: estimate (as validate_config refuses
  // tail: estimate with razor.retrieval_heads).
  DecodePolicy(const LongContextConfig& config, kvstore::KVStore& store, float attn_scale,
               RetrievalHeads heads = {});

  // End of prefill of `layer` (every prompt token appended). window_q: f32
  // [w, n_q_heads, head_dim], the queries of the last w prompt tokens
  // (w = preselect.window, or fewer for a short prompt). select policy: with
  // preselect_block, SnapKV preselection of the layer's blocks; with DYNAMIC
  // representatives, preselect_block or not, feed_dynamic with the window's
  // votes before pooling (preselect.pool_kernel pools preselection's only);
  // h2o policy: H2OState::init_from_prefill. Otherwise (and for dense
  // layers) nothing.
  void on_prefill_end(int layer, const TensorView& window_q);

  // Decode step token_idx (0 = first generated token; its token already
  // appended to `layer`) of `layer`: q f32 [n_q_heads, head_dim], out f32
  // [n_q_heads, head_dim], lse f32 [n_q_heads], as decode_attention.
  // select policy: a layer whose on_prefill_end was not called selects from
  // every context block; a saved selection made with the other include_local
  // is not reused (the layer selects anew, reselected = true).
  // include_local = false: the local window is attended elsewhere (GPU) and
  // left out here (the h2o policy attends its recent tokens on the CPU and
  // requires true: Error(kInvalidArgument)).
  void decode(int layer, int64_t token_idx, const TensorView& q, bool include_local, const MutableTensorView& out,
              const MutableTensorView& lse);

  Stats last_stats() const { return stats_; }
  // The tokens the last decode() attended exactly, per kv head.
  const cpu::Selection& last_selection() const { return last_selection_; }
  bool razor_enabled() const { return heads_.n_layers() > 0; }
  const LongContextConfig& config() const { return config_; }
  float attn_scale() const { return attention_.scale; }

 private:
  void check_layer(int layer, const char* what) const;
  // head_selected: passed to select_blocks when the layer re-selects (not
  // with rerank, which changes the selection after it).
  cpu::Selection selection_for(int layer, int64_t token_idx, const TensorView& q, bool include_local,
                               const HeadSelected& head_selected = {});
  void attend_dense(int layer, const TensorView& q, bool include_local, const MutableTensorView& out,
                    const MutableTensorView& lse);
  // RazorAttention: the retrieval heads over the selection, the others compressed.
  void attend_razor(int layer, const TensorView& q, const cpu::Selection& selection, bool include_local,
                    const MutableTensorView& out, const MutableTensorView& lse);
  // tail: estimate: the unselected context blocks' estimate merged into out/lse.
  void add_tail(int layer, const TensorView& q, const cpu::Selection& selection, const MutableTensorView& out,
                const MutableTensorView& lse);

  LongContextConfig config_;
  kvstore::KVStore& store_;
  cpu::DecodeAttentionParams attention_;  // the model's scale, for every attention call
  RetrievalHeads heads_;  // n_layers() == 0: RazorAttention off
  ReuseSchedule schedule_;
  SelectionCache cache_;
  std::vector<std::optional<Preselected>> preselected_;                        // [layer]
  std::vector<std::optional<H2OState>> h2o_;                                   // [layer]
  std::vector<std::optional<RazorCompensation>> razor_;                        // [layer]
  // [group leader]: SelectSpec::choosing_heads of the group's selection; empty without RazorAttention
  std::vector<std::vector<uint8_t>> choosing_heads_;
  std::vector<std::vector<float>> speculated_q_;  // [layer]: speculate: the query of its saved selection
  Stats stats_;
  cpu::Selection last_selection_;
};

}  // namespace longctx::policy
