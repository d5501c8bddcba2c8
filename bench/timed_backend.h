// A backend wrapper for benchmarks: forwards every op and accounts the
// matmuls (wall time, flops 2 n k out, weight bytes read), so a benchmark of
// a whole model can say how much of a prefill or decode step the GEMMs take
// and at what rate they ran. The CPU backend is synchronous, so the time of
// a call is the time of its work.
#pragma once

#include <cstdint>

#include "bench_util.h"
#include "longctx/core/backend.h"
#include "longctx/core/backend_args.h"
#include "longctx/core/forwarding_backend.h"

namespace longctx::bench {

class TimedBackend final : public ForwardingBackend {
 public:
  struct Matmuls {
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;
    double weight_bytes = 0;
    int64_t quantized_calls = 0;  // weights of a block-quantized type (Q8_0, Q4_K, ...): the quant_prefill paths
  };
  using ForwardingBackend::ForwardingBackend;

  void matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) override {
    const double start = now_seconds();
    ForwardingBackend::matmul(x, w, bias, y);
    synchronize();
    matmuls_.seconds += now_seconds() - start;
    matmuls_.calls += 1;
    matmuls_.flops += 2.0 * double(x.shape()[0]) * double(backend_row_length(x)) * double(w.shape()[0]);
    matmuls_.weight_bytes += double(ggml_bytes(w.type(), w.numel()).value_or(0));
    if (!dtype_of(w.type())) matmuls_.quantized_calls += 1;
  }
  const Matmuls& matmuls() const { return matmuls_; }
  void reset() { matmuls_ = {}; }

 private:
  Matmuls matmuls_;
};

}  // namespace longctx::bench
