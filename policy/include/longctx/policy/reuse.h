// Reuse of selections across decode steps and layers (KTransformers'
// token_step / layer_step / dense_layer_num, ALGORITHMS.md).
//
// Definitions:
//   token_idx   the decode step, counted from 0 at the first generated token
//               (the prompt's last token is prefill, not step 0).
//   dense       layer < dense_layer_num: attends every token, never selects.
//   leader      a non-dense layer with layer % layer_step == dense_layer_num %
//               layer_step, i.e. dense_layer_num + m * layer_step (m >= 0).
//               dense_layer_num itself is a leader, so every non-dense layer
//               has a non-dense leader at or below it.
//   group_of(l) the largest leader <= l: the layer whose saved selection l uses.
//   reselects   a leader re-selects when token_idx % token_step == 0; every
//               other (layer, step) uses the selection saved for its group.
// Step 0 is a re-select step for every leader, and layers run in order within
// a step, so a group's selection exists before its other layers need it.
// A caller that starts elsewhere (a cleared cache, decode resumed at
// token_idx > 0) finds no saved selection: decide() then asks the layer to
// select itself and save the result for its group (see decide()).
//
// A saved selection stays valid for the other layers of its group and for
// later steps because spans are token positions and, at decode time, every
// layer holds the same tokens. Tokens that became the CPU's concern since the
// selection was made (new tokens, or tokens that left the device's local
// window) are always attended: reused_selection() adds them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::policy {

class ReuseSchedule {
 public:
  // Reads dense_layer_num, layer_step and token_step (validated by the config
  // loader: steps >= 1, dense_layer_num >= 0).
  explicit ReuseSchedule(const LongContextConfig& config);
  ReuseSchedule(int dense_layer_num, int layer_step, int token_step);

  bool is_dense(int layer) const { return layer < dense_layer_num_; }
  bool is_leader(int layer) const;
  // A leader at a step with token_idx % token_step == 0.
  bool reselects(int layer, int64_t token_idx) const;
  // The leader whose saved selection `layer` uses; throws Error(kInvalidArgument)
  // for a dense layer (it has no group).
  int group_of(int layer) const;

 private:
  int dense_layer_num_;
  int layer_step_;
  int token_step_;
};

// A selection and the partition of the layer when it was made.
struct SavedSelection {
  cpu::Selection selection;
  kvstore::Partition partition;
  bool include_local = true;  // whether `selection` covers the local window
};

// The saved selection of each layer group, indexed by the group's leader.
class SelectionCache {
 public:
  explicit SelectionCache(int n_layers);
  // nullptr when the group has nothing saved (yet, or since clear()).
  const SavedSelection* get(int group) const;
  void put(int group, SavedSelection saved);
  void clear();  // a new sequence
  int n_layers() const { return static_cast<int>(saved_.size()); }

 private:
  std::vector<std::optional<SavedSelection>> saved_;  // [layer]
};

enum class ReuseAction {
  kDense,     // attend every token
  kSelect,    // select now and put the result under group_of(layer)
  kReuse,     // reused_selection(*cache.get(group_of(layer)), ...)
};

// What `layer` does at decode step token_idx: kDense for a dense layer;
// kSelect when it re-selects, or when its group has no saved selection (the
// layer selects for the group, so the group's later layers reuse it); kReuse
// otherwise.
ReuseAction decide(const ReuseSchedule& schedule, const SelectionCache& cache, int layer, int64_t token_idx);

// Every token of the spans plus [old_end, new_end), merged (spans stay sorted,
// disjoint, non-adjacent). Requires old_end <= new_end.
cpu::Selection extend_with_new_tokens(const cpu::Selection& selection, int64_t old_end, int64_t new_end);

// The saved selection as used now, on a layer partitioned as `now`: the CPU's
// range ends at n_tokens when the selection covers the local window, else at
// local_begin; whatever entered that range since the selection was made is
// added. Throws Error(kInvalidArgument) when `now` holds fewer tokens than
// the selection was made on (a saved selection only moves forward).
cpu::Selection reused_selection(const SavedSelection& saved, const kvstore::Partition& now);

}  // namespace longctx::policy
