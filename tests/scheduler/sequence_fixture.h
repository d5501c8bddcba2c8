// Fixtures of the tests that run scheduler::Sequence (in scheduler/, model/
// and gpu/): this machine's NUMA topology, a small config whose decode
// attends every block, and the largest |x| of logits (for the tolerance of
// reference_forward.h and to reject all-zero outputs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/kvstore/numa.h"

namespace longctx::testing {

// The NUMA topology of this machine, detected once.
inline const kvstore::NumaTopology& topology() {
  static const kvstore::NumaTopology detected = kvstore::NumaTopology::detect();
  return detected;
}

// Chunk 16, block 16, 16 sinks, window 32, up to 256 tokens in 64 MiB, every
// layer selecting; second_select_num 16 is every block, so decode attends
// everything and the logits compare with the dense reference. Prefill
// attention in f32 (the bf16 kernel has its own tests and tolerance).
inline LongContextConfig every_block_config(DType kv_type) {
  LongContextConfig c;
  c.prefill_kernel = PrefillKernelChoice::kF32;
  c.chunk_size = 16;
  c.max_seq_len = 256;
  c.block_size = 16;
  c.initial_len = 16;
  c.local_windows_len = 32;
  c.second_select_num = 16;  // every block: decode attends everything
  c.kv_type = kv_type;
  c.dense_layer_num = 0;
  c.dram_budget = uint64_t{64} << 20;
  return c;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

}  // namespace longctx::testing
