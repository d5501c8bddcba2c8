// gpu/attention.h in a build without CUDA: every entry point refuses clearly.
#include "longctx/core/error.h"
#include "longctx/gpu/attention.h"

namespace longctx::gpu {

void prefill_attention(const PrefillAttentionParams&, void*) {
  fail(ErrorCode::kUnsupported, "prefill_attention: this longctx was built without CUDA");
}

void local_window_attention(const LocalAttentionParams&, void*) {
  fail(ErrorCode::kUnsupported, "local_window_attention: this longctx was built without CUDA");
}

void store_kv(const StoreKVParams&, void*) {
  fail(ErrorCode::kUnsupported, "store_kv: this longctx was built without CUDA");
}

void prefill_attention_host(const PrefillAttentionParams&) {
  fail(ErrorCode::kUnsupported, "prefill_attention_host: this longctx was built without CUDA");
}

void local_window_attention_host(const LocalAttentionParams&) {
  fail(ErrorCode::kUnsupported, "local_window_attention_host: this longctx was built without CUDA");
}

void store_kv_host(const StoreKVParams&) {
  fail(ErrorCode::kUnsupported, "store_kv_host: this longctx was built without CUDA");
}

}  // namespace longctx::gpu
