// bf16 tile products of prefill attention through oneDNN's matmul
// (prefill_attention_kernels.h), for PrefillKernel::kOnednn: oneDNN runs them
// on AMX tiles where the CPU has AMX (Sapphire Rapids and later) and on
// AVX512-BF16's vdpbf16ps elsewhere, picking its kernel at run time; we
// never write the tile instructions ourselves.
//
// The calls come from oneTBB's workers, one tile at a time, so each thread
// has its own oneDNN stream, primitive cache and scratchpad (user-managed:
// primitives executed concurrently never share one), and runs oneDNN on one
// OpenMP thread (omp_set_num_threads(1) around the call, restored after it:
// the same thread, the caller's included, may later run the CPU backend's
// oneDNN matmuls on every core): the parallelism is TBB's, over tiles, as for
// the other kernels.
#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/cpu/prefill_attention_kernels.h"

namespace longctx::cpu::detail {
namespace {

using dt = dnnl::memory::data_type;

// A primitive per shape; a thread's cache beyond this many is dropped whole.
constexpr size_t kMaxCachedPrimitives = 64;

struct Shape {
  int64_t rows, cols, depth, lda, ldb, ldc;
  auto tie() const { return std::tie(rows, cols, depth, lda, ldb, ldc); }
  bool operator<(const Shape& other) const { return tie() < other.tie(); }
};

const dnnl::engine& engine() {
  static const dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

dnnl::memory::desc matrix(int64_t rows, int64_t cols, dt type, int64_t ld) {
  return dnnl::memory::desc({rows, cols}, type, dnnl::memory::dims{ld, 1});
}

dnnl::matmul::primitive_desc describe(const Shape& s) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::desc desc(matrix(s.rows, s.depth, dt::bf16, s.lda), matrix(s.depth, s.cols, dt::bf16, s.ldb),
                                matrix(s.rows, s.cols, dt::f32, s.ldc));
  return dnnl::matmul::primitive_desc(desc, attr, engine());
}

struct Cached {
  dnnl::matmul primitive;
  size_t scratchpad_bytes = 0;
};

struct ThreadState {
  ThreadState() : stream(engine()) {}
  dnnl::stream stream;
  std::map<Shape, Cached> primitives;
  std::vector<uint8_t> scratchpad;

  Cached& primitive(const Shape& s) {
    auto it = primitives.find(s);
    if (it != primitives.end()) return it->second;
    if (primitives.size() >= kMaxCachedPrimitives) primitives.clear();
    try {
      const dnnl::matmul::primitive_desc pd = describe(s);
      return primitives.emplace(s, Cached{dnnl::matmul(pd), pd.scratchpad_desc().get_size()}).first->second;
    } catch (const dnnl::error& e) {
      fail(ErrorCode::kUnsupported, "prefill attention (onednn): oneDNN has no bf16 matmul for [", s.rows, ", ",
           s.depth, "] x [", s.depth, ", ", s.cols, "]: ", e.what());
    }
  }
};

}  // namespace

std::string onednn_bf16_implementation() {
  try {
    return describe({64, 64, 64, 64, 64, 64}).impl_info_str();
  } catch (const dnnl::error&) {
    return "";  // no bf16 matmul on this CPU (AVX2 only)
  }
}

void gemm_bf16_onednn(size_t rows, size_t cols, size_t depth, const uint16_t* a, size_t lda, const uint16_t* b,
                      size_t ldb, float* c, size_t ldc) {
  if (rows == 0 || cols == 0) return;
  thread_local ThreadState state;
  const Shape s{int64_t(rows), int64_t(cols), int64_t(depth), int64_t(lda), int64_t(ldb), int64_t(ldc)};
  Cached& cached = state.primitive(s);
  if (state.scratchpad.size() < cached.scratchpad_bytes) state.scratchpad.resize(cached.scratchpad_bytes);
  const dnnl::engine& e = engine();
  dnnl::memory src(matrix(s.rows, s.depth, dt::bf16, s.lda), e, const_cast<uint16_t*>(a));
  dnnl::memory wei(matrix(s.depth, s.cols, dt::bf16, s.ldb), e, const_cast<uint16_t*>(b));
  dnnl::memory dst(matrix(s.rows, s.cols, dt::f32, s.ldc), e, c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (cached.scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(dnnl::memory::desc({int64_t(cached.scratchpad_bytes)}, dt::u8, dnnl::memory::dims{1}),
                              e, state.scratchpad.data()));
  const int omp_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  try {
    cached.primitive.execute(state.stream, args);
    state.stream.wait();
  } catch (const dnnl::error& error) {
    omp_set_num_threads(omp_threads);
    fail(ErrorCode::kInternal, "prefill attention (onednn): matmul [", s.rows, ", ", s.depth, "] x [", s.depth, ", ",
         s.cols, "] failed: ", error.what());
  }
  omp_set_num_threads(omp_threads);
}

}  // namespace longctx::cpu::detail
