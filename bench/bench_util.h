// Shared helpers of longctx-bench: timing, medians, JSON lines, tables, and
// the machine's copy bandwidth measured in the same run.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/dtype.h"

namespace longctx::bench {

double now_seconds();

// Runs fn `reps` times and returns each run's seconds.
std::vector<double> time_runs(int reps, const std::function<void()>& fn);
double median(std::vector<double> values);

// One measurement: printed as a JSON line and kept for the table.
class Record {
 public:
  Record& set(const std::string& key, const std::string& value);
  Record& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Record& set(const std::string& key, double value);
  Record& set(const std::string& key, int64_t value);
  Record& set(const std::string& key, int value) { return set(key, int64_t{value}); }
  std::string json() const;
  std::string get(const std::string& key) const;  // "" when absent

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // value already JSON-encoded
};

// Value of "key" in one compact JSON line ({"a":1,"b":"x"}, as tools/bench_sdpa.py
// prints with separators=(",", ":")), a string unquoted as Record::get gives
// it; "" when absent. Not a JSON parser: no escapes, no nesting.
std::string json_field(const std::string& line, const std::string& key);

// Whether a prefill_attention record of longctx-bench gpu and a line of
// tools/bench_sdpa.py measured the same case: the same dtype and history
// (prefill_vs_sdpa rows pair them).
bool same_prefill_case(const Record& ours, const std::string& sdpa_line);

// Prints records as an aligned table of the given columns.
void print_table(const std::vector<Record>& records, const std::vector<std::string>& columns);

// The path of the project's script tools/`name`: under the current
// directory when it has one (run from a tree, e.g. a copy with a carried
// build on a lent GPU machine, where the tree it was built from is absent),
// else under the source tree this binary was built from. Throws Error(kIo)
// naming both places when neither has it.
std::string tools_script(const std::string& name);

// The largest value of an int option (parse_int_flag's upper bound for the
// options assigned to int fields).
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

// "4096,32768" -> {4096, 32768} (a benchmark's list options), each value an
// integer in [min, kMaxInt] (parse_int_flag, naming `option`); so is an empty item.
std::vector<int64_t> parse_list(const std::string& list, const std::string& option, int64_t min);

// "f16,q8_0" -> the KV types it names, in order (a benchmark's KV type list);
// an unknown or repeated name, or none, throws kInvalidArgument naming
// `option` ("kernels: --dtype").
std::vector<DType> parse_kv_types(const std::string& list, const std::string& option);

// second_select_num for a decode step that attends `budget_tokens` in all:
// the config's sinks (initial_len) and local window, and as many whole blocks
// as fit the rest (cpu::blocks_for_token_budget), at least one and at most the
// blocks of max_seq_len. longctx-bench decode and gpu size their steps with it.
int second_select_num_for_budget(int64_t budget_tokens, const LongContextConfig& config);

// A generated test model (tools/test_model.h preset `preset`) in a temporary
// GGUF file, removed when this goes out of scope.
struct TempModel {
  std::string path;
  explicit TempModel(const std::string& preset);
  ~TempModel();
  TempModel(const TempModel&) = delete;
  TempModel& operator=(const TempModel&) = delete;
};

// memcpy bandwidth over `bytes` (source read + destination write counted,
// like every gbps field of longctx-bench), median of `reps`, with `threads`
// threads each copying a contiguous slice.
double measure_copy_gbps(size_t bytes, int threads, int reps);

// Reads a buffer of twice the last-level cache (256 MiB at least) on every
// core of the current thread limit, so that the next timed call reads its
// data from DRAM, as a decode step of one layer finds its K/V and
// representatives after the other layers ran, and finds the thread pool
// awake: evicting on one thread lets the pool's workers fall asleep, and the
// timed call then pays for waking them, which a real step does not. A fixed
// 256 MiB left a 480 MiB L3 (a 2-core Xeon VM with AMX, 2026-12-02) holding
// much of the data: the 128K sparse attention took 2.1 ms on one thread
// after it and 5-6.7 ms after 1.5 GiB. Reads, not writes: the previous
// layers leave clean lines, and dirty ones would add their write-backs to
// the timed call.
void evict_caches();

// Read-only bandwidth over `bytes` (the roofline of read-bound kernels such
// as decode attention), median of `reps`, `threads` threads each summing a slice.
double measure_read_gbps(size_t bytes, int threads, int reps);

// Resident memory of this process now and at its peak (VmRSS, VmHWM of
// /proc/self/status), in bytes; 0 where the file is not there.
uint64_t resident_bytes();
uint64_t peak_resident_bytes();

// The rate of `loop` run on `threads` threads at once (loop(t) returns the
// operations thread t did): a warm-up, then the median of 3 timed runs, in
// billions of operations per second. The peak measurements below use it.
double measure_parallel_rate(int threads, const std::function<double(int thread)>& loop);

// fp32 FMA throughput of `threads` threads on the best vector target
// (cpu::fma_peak_loop): the roofline of compute-bound fp32 kernels.
double measure_fma_gflops(int threads);

// int8 multiply-add throughput (2 ops per byte product) of the instructions
// the quantized matmul kernels use on this CPU (peak_int8.cpp: vpmaddubsw +
// vpmaddwd, or vpdpbusd with VNNI); 0 where they run the generic kernels.
double measure_int8_gops(int threads);

// bf16 dot-product throughput (vdpbf16ps, 2 FLOP per product; cpu::vdpbf16ps_peak_loop)
// of `threads` threads: the roofline of oneDNN's bf16 matmul on AVX512-BF16
// CPUs without AMX; 0 where the CPU has no AVX512-BF16.
double measure_bf16_gflops(int threads);

// AMX bf16 tile throughput (tdpbf16ps, 2 FLOP per product; peak_amx.cpp) of
// `threads` threads: the roofline of the amx prefill kernel; 0 where AMX bf16
// is not usable.
double measure_amx_bf16_gflops(int threads);

// oneDNN's bf16 matmul rate, one call per thread at a time as the onednn
// prefill kernel makes them (peak_onednn.cpp): AMX tiles where the CPU has
// them; 0 where oneDNN has no bf16 matmul.
double measure_onednn_bf16_gflops(int threads);
// Where the onednn prefill kernel's time can go, per thread with every thread
// busy: oneDNN bf16 matmuls of its tile shapes (and larger ones), the softmax
// step and P's rounding of a 512 x 128 tile (peak_onednn.cpp). Empty where
// oneDNN has no bf16 matmul.
std::vector<Record> onednn_tile_pieces(int threads);

}  // namespace longctx::bench
