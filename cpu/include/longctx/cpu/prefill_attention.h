// Prefill attention on the CPU (what a machine without a GPU runs): the
// queries of one chunk, at positions [first_pos, first_pos + n), attend every
// token of the layer up to their own position (causal inside the chunk). The
// chunk's K/V must already be appended to the store. Tiled flash-attention
// style: blocks of queries x blocks of keys, online softmax, fp32 accumulators.
// A variant restricts the history (the tokens before the chunk) to given
// spans per kv head, for sparse prefill (QUOKA).
//
// Four kernels compute the tiles' products (S = Q K^T and O += P V), picked
// at run time (PrefillKernel); the online softmax is f32 in all:
// - kF32: q, k, v and p in f32 on the FMA units (Highway, every CPU).
// - kBf16: AVX512-BF16's vdpbf16ps (Zen 4/5, Sapphire Rapids and later) at
//   twice the FMA rate: q * scale, k and v rounded to bf16 (nearest even);
//   the probabilities exp(s - max) rounded to bf16 after the max is
//   subtracted, for P V only (the row sums l add the f32 values); products
//   accumulated in f32. Rounding adds a relative error of about 2^-9 per
//   operand: logits within 2^-8 sum_c |q_c k_c| * scale of the f32 ones.
// - kOnednn: the same bf16 operands and f32 accumulation through oneDNN's
//   matmul, which runs AMX tiles where the CPU has them (3.7 TFLOP/s per
//   Sapphire Rapids core) and vdpbf16ps elsewhere; the results differ from
//   kBf16's by summation order only.
// - kAmx: the same bf16 operands on AMX tiles (tdpbf16ps) in a kernel of our
//   own that fuses both products and the softmax step of a key tile, 32 rows
//   at a time (prefill_attention_amx.cpp); Sapphire Rapids and later, with
//   Linux's tile permission (cpu_features).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/tensor.h"
#include "longctx/cpu/selection.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::cpu {

enum class PrefillKernel : uint8_t { kF32, kBf16, kOnednn, kAmx };

const char* prefill_kernel_name(PrefillKernel kernel);  // "f32", "bf16", "onednn", "amx"
// The kernels this CPU runs: amx, onednn where it runs on AMX, bf16, onednn
// on AVX512-BF16 alone, and f32, always last.
std::vector<PrefillKernel> supported_prefill_kernels();
// The kernel auto runs: kAmx where AMX is usable, else kBf16 where the CPU
// has AVX512-BF16 and runs vdpbf16ps at kBf16MinOverFma times the FMA rate
// or more (peak_loops.h: bf16_outruns_fma), else kF32.
PrefillKernel best_prefill_kernel();
// Why `kernel` cannot run here (the CPU lacks AVX512-BF16 or usable AMX;
// oneDNN has no bf16 matmul), or "".
std::string prefill_kernel_unsupported_reason(PrefillKernel kernel);
// Whether this is a developer build whose amx kernel runs on emulated tiles
// (cmake -DLONGCTX_AMX_EMULATION=ON): amx then runs, and auto takes it,
// wherever the CPU has AVX512-BF16, at a small fraction of its speed.
bool amx_tiles_emulated();
// What computes a kernel's products here: "vdpbf16ps", "AMX tdpbf16ps", "oneDNN brg:avx512_core_amx", ...
std::string prefill_kernel_engine(PrefillKernel kernel);
// The kernel of the config key prefill_kernel: auto = best_prefill_kernel();
// one this CPU lacks throws Error(kConfig) naming the key and the reason.
PrefillKernel prefill_kernel_for(PrefillKernelChoice choice);

// q: f32 [n, n_q_heads, head_dim]; out: f32 [n, n_q_heads, head_dim];
// lse: f32 [n, n_q_heads]. scale 0 = 1/sqrt(head_dim). Requires
// first_pos + n <= store.n_tokens(layer). A kernel this CPU lacks throws
// Error(kUnsupported) with the reason.
void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const TensorView& q,
                       float scale, const MutableTensorView& out, const MutableTensorView& lse,
                       PrefillKernel kernel = best_prefill_kernel());

// The same with the history restricted: every query of the chunk attends the
// tokens of history.spans[kv_head] (all before first_pos) plus the chunk's
// tokens up to its own position [first_pos, position]. history has one span
// list per kv head, each sorted, non-empty spans, non-overlapping, inside
// [0, first_pos) (an empty list: the chunk only); anything else throws
// Error(kInvalidArgument) naming the head and span. The function above is
// this with the one span [0, first_pos) per head (same code path, same bits);
// keys are tiled in the order of the concatenated spans, so a row's result
// depends only on its query and its key list.
void prefill_attention(const kvstore::KVStore& store, int layer, int64_t first_pos, const Selection& history,
                       const TensorView& q, float scale, const MutableTensorView& out, const MutableTensorView& lse,
                       PrefillKernel kernel = best_prefill_kernel());

}  // namespace longctx::cpu
