// Transformer: checks of the hyperparameters and of every weight's shape.
#include "longctx/scheduler/transformer.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::scheduler {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void check_weight(const std::unique_ptr<BackendTensor>& tensor, const std::string& name,
                  const std::vector<int64_t>& shape) {
  if (!tensor) fail(ErrorCode::kInvalidArgument, "Transformer: weight ", name, " is missing");
  if (tensor->shape() != shape)
    fail(ErrorCode::kInvalidArgument, "Transformer: weight ", name, ": expected ", shape_text(shape), ", got ",
         tensor->describe());
}

void check_positive(int64_t value, const char* field) {
  if (value < 1) fail(ErrorCode::kInvalidArgument, "TransformerSpec: ", field, " must be >= 1, got ", value);
}

}  // namespace

void TransformerSpec::validate() const {
  check_positive(n_layers, "n_layers");
  check_positive(n_heads, "n_heads");
  check_positive(n_kv_heads, "n_kv_heads");
  check_positive(head_dim, "head_dim");
  check_positive(n_embd, "n_embd");
  check_positive(n_ff, "n_ff");
  check_positive(n_vocab, "n_vocab");
  if (n_vocab > INT32_MAX)
    fail(ErrorCode::kInvalidArgument, "TransformerSpec: n_vocab ", n_vocab, " does not fit 32-bit token ids");
  if (n_heads % n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, "TransformerSpec: n_heads ", n_heads, " is not a multiple of n_kv_heads ",
         n_kv_heads);
  if (rope.n_rot < 0 || rope.n_rot > head_dim || rope.n_rot % 2 != 0)
    fail(ErrorCode::kInvalidArgument, "TransformerSpec: rope.n_rot ", rope.n_rot,
         " must be even and in [0, head_dim = ", head_dim, "]");
  if (!(rope.theta > 0.0f))
    fail(ErrorCode::kInvalidArgument, "TransformerSpec: rope.theta must be > 0, got ", rope.theta);
  if (!rope.freq_factors.empty() && rope.freq_factors.size() != size_t(rope.n_rot / 2))
    fail(ErrorCode::kInvalidArgument, "TransformerSpec: rope.freq_factors has ", rope.freq_factors.size(),
         " values, expected n_rot / 2 = ", rope.n_rot / 2);
  if (!(rms_eps > 0.0f)) fail(ErrorCode::kInvalidArgument, "TransformerSpec: rms_eps must be > 0, got ", rms_eps);
  if (!(attn_scale >= 0.0f) || std::isinf(attn_scale))
    fail(ErrorCode::kInvalidArgument, "TransformerSpec: attn_scale must be finite and >= 0, got ", attn_scale);
}

void Transformer::validate() const {
  spec.validate();
  const TransformerSpec& s = spec;
  const int64_t d = s.n_embd, q = s.q_dim(), kv = s.kv_dim(), ff = s.n_ff;
  check_weight(weights.token_embd, "token_embd", {s.n_vocab, d});
  check_weight(weights.output_norm, "output_norm", {d});
  if (weights.output) check_weight(weights.output, "output", {s.n_vocab, d});
  if (weights.layers.size() != size_t(s.n_layers))
    fail(ErrorCode::kInvalidArgument, "Transformer: ", weights.layers.size(), " layers of weights, spec has ",
         s.n_layers);
  for (int i = 0; i < s.n_layers; ++i) {
    const LayerWeights& l = weights.layers[size_t(i)];
    const std::string p = "layer " + std::to_string(i) + " ";
    check_weight(l.attn_norm, p + "attn_norm", {d});
    check_weight(l.wq, p + "wq", {q, d});
    check_weight(l.wk, p + "wk", {kv, d});
    check_weight(l.wv, p + "wv", {kv, d});
    if (s.qkv_bias) {
      check_weight(l.bq, p + "bq", {q});
      check_weight(l.bk, p + "bk", {kv});
      check_weight(l.bv, p + "bv", {kv});
    } else if (l.bq || l.bk || l.bv) {
      fail(ErrorCode::kInvalidArgument, "Transformer: ", p, "has q/k/v biases but spec.qkv_bias is false");
    }
    check_weight(l.wo, p + "wo", {d, q});
    check_weight(l.ffn_norm, p + "ffn_norm", {d});
    check_weight(l.w_gate, p + "w_gate", {ff, d});
    check_weight(l.w_up, p + "w_up", {ff, d});
    check_weight(l.w_down, p + "w_down", {d, ff});
  }
}

}  // namespace longctx::scheduler
