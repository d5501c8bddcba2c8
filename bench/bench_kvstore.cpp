// longctx-bench kvstore: append throughput of the KV store for one prefill
// chunk through every layer, beside the memcpy bandwidth of the same run.
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "longctx/core/config.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/kvstore/kv_store.h"

namespace longctx::bench {
namespace {

struct KvstoreArgs {
  int tokens = 4096;
  int layers = 32;
  int kv_heads = 8;
  int head_dim = 128;
  std::vector<DType> kv_types{DType::kF16};
  std::vector<DType> src_types{DType::kF16, DType::kF32};
  std::vector<RepresentativeType> reps{RepresentativeType::kQuest, RepresentativeType::kDynamic};
  int reps_count = 5;
};

// Random activations of one layer in the source dtype, as a projection would
// produce them (uniform in [-2, 2), from a cheap deterministic generator).
std::vector<std::byte> random_activations(size_t n, DType dtype, uint64_t seed) {
  std::vector<float> values(n);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = float(state >> 40) * (4.0f / float(1 << 24)) - 2.0f;
  }
  std::vector<std::byte> out(n * dtype_size(dtype));
  convert(values.data(), DType::kF32, out.data(), dtype, n);
  return out;
}

// Per-layer K and V source buffers of one dtype.
struct Source {
  DType dtype;
  std::vector<std::vector<std::byte>> k, v;
};

Source make_source(const KvstoreArgs& a, DType dtype) {
  const size_t n = size_t(a.tokens) * a.kv_heads * a.head_dim;
  Source s{dtype, {}, {}};
  for (int l = 0; l < a.layers; ++l) {
    s.k.push_back(random_activations(n, dtype, 2 * l + 1));
    s.v.push_back(random_activations(n, dtype, 2 * l + 2));
  }
  return s;
}

Record run_append(const KvstoreArgs& a, DType kv_type, const Source& src, RepresentativeType rep, int threads,
                  double copy_gbps) {
  const DType src_type = src.dtype;
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  // The runtime's defaults for this representative type (DYNAMIC keeps 4 per block, QUEST 2), as a config file
  // naming only the type gives.
  LongContextConfig config =
      parse_config("", "<kvstore bench>", {str_cat("representative_type=", representative_type_name(rep))});
  config.max_seq_len = a.tokens;
  config.chunk_size = a.tokens;
  config.local_windows_len = std::min(config.local_windows_len, a.tokens / 2);
  config.initial_len = std::min(config.initial_len, a.tokens / 4);
  config.second_select_num = 1;
  config.kv_type = kv_type;
  const kvstore::KVShape shape{a.layers, a.kv_heads, a.head_dim};
  const auto topology = kvstore::NumaTopology::detect();
  const auto layout = kvstore::StoreLayout::make(shape, config);
  const auto nodes = kvstore::resolve_numa_nodes(config.numa, topology);
  const auto plan = kvstore::preflight(layout, config.max_seq_len, kvstore::place_kv_heads(a.kv_heads, nodes));
  kvstore::MemoryBudget budget(plan.total_bytes);
  kvstore::KVStore store(shape, config, budget, topology);

  const size_t n = size_t(a.tokens) * a.kv_heads * a.head_dim;
  auto append_all = [&] {
    for (int l = 0; l < a.layers; ++l)
      store.append(l, make_view(src.k[l].data(), src_type, {a.tokens, a.kv_heads, a.head_dim}),
                   make_view(src.v[l].data(), src_type, {a.tokens, a.kv_heads, a.head_dim}));
  };
  const double cold_s = time_runs(1, append_all)[0];  // maps slabs, faults pages in
  const double warm_s = median(time_runs(a.reps_count, [&] {
    store.clear();
    append_all();
  }));
  const double read_bytes = 2.0 * n * a.layers * dtype_size(src_type);
  const double vector_bytes = double(kvstore::kv_vector_bytes(kv_type, a.head_dim));  // q8_0: codes and scales
  const double written_bytes = 2.0 * a.tokens * a.kv_heads * a.layers * vector_bytes;
  const double gbps = (read_bytes + written_bytes) / warm_s / 1e9;
  Record r;
  r.set("bench", "kvstore").set("kernel", "append").set("tokens", a.tokens).set("layers", a.layers);
  r.set("kv_heads", a.kv_heads).set("head_dim", a.head_dim).set("src_dtype", dtype_name(src_type));
  r.set("dtype", dtype_name(kv_type)).set("rep", representative_type_name(rep));
  r.set("rep_num", config.representative_num).set("threads", threads);
  r.set("ms", warm_s * 1e3).set("cold_ms", cold_s * 1e3).set("bytes", int64_t(read_bytes + written_bytes));
  r.set("gbps", gbps).set("memcpy_gbps", copy_gbps).set("of_memcpy", gbps / copy_gbps);
  r.set("tokens_per_s", a.tokens / warm_s);  // one chunk through every layer
  return r;
}

}  // namespace

int run_kvstore(const std::vector<std::string>& args) {
  KvstoreArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    auto next = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, "kvstore: ", args[i], " needs a value");
      return args[++i];
    };
    // The option's value as an integer in [min, kMaxInt], named with the option.
    auto int_value = [&](int64_t min) {
      const std::string flag = "kvstore: " + args[i];
      return parse_int_flag(flag, next(), min, kMaxInt);
    };
    if (args[i] == "--tokens") a.tokens = int(int_value(1));
    else if (args[i] == "--layers") a.layers = int(int_value(1));
    else if (args[i] == "--kv-heads") a.kv_heads = int(int_value(1));
    else if (args[i] == "--head-dim") a.head_dim = int(int_value(1));
    else if (args[i] == "--reps") a.reps_count = int(int_value(1));
    else if (args[i] == "--kv-type") a.kv_types = parse_kv_types(next(), "kvstore: --kv-type");
    else if (args[i] == "--quick") a.layers = 4, a.reps_count = 3;
    else fail(ErrorCode::kInvalidArgument, "kvstore: unknown argument '", args[i], "'");
  }
  const int all = tbb::info::default_concurrency();
  std::vector<int> thread_counts{1};
  if (all > 1) thread_counts.push_back(all);

  const size_t copy_bytes = size_t(a.tokens) * a.kv_heads * a.head_dim * 2 * 2 * a.layers;
  std::vector<Record> records;
  std::vector<Source> sources;
  for (DType dtype : a.src_types) sources.push_back(make_source(a, dtype));
  for (int threads : thread_counts) {
    const double copy_gbps = measure_copy_gbps(copy_bytes, threads, a.reps_count);
    Record c;
    c.set("bench", "kvstore").set("kernel", "memcpy").set("threads", threads).set("bytes", int64_t(2 * copy_bytes));
    c.set("gbps", copy_gbps);
    std::printf("%s\n", c.json().c_str());
    for (DType kv_type : a.kv_types)
      for (const Source& src : sources)
        for (RepresentativeType rep : a.reps) {
          records.push_back(run_append(a, kv_type, src, rep, threads, copy_gbps));
          std::printf("%s\n", records.back().json().c_str());
          std::fflush(stdout);
        }
  }
  std::printf("\nKV store append: %d tokens x %d layers x %d kv heads x %d dims\n", a.tokens, a.layers, a.kv_heads,
              a.head_dim);
  print_table(records,
              {"dtype", "src_dtype", "rep", "rep_num", "threads", "ms", "cold_ms", "gbps", "memcpy_gbps", "of_memcpy"});
  return 0;
}

}  // namespace longctx::bench
