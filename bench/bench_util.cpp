#include "bench_util.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/cpu/selection.h"
#include "longctx/tools/test_model.h"

namespace longctx::bench {

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::vector<double> time_runs(int reps, const std::function<void()>& fn) {
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const double start = now_seconds();
    fn();
    seconds.push_back(now_seconds() - start);
  }
  return seconds;
}

double measure_parallel_rate(int threads, const std::function<double(int thread)>& loop) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  std::vector<double> ops(static_cast<size_t>(threads));
  auto run = [&] { tbb::parallel_for(0, threads, [&](int t) { ops[size_t(t)] = loop(t); }); };
  run();
  const double seconds = median(time_runs(3, run));
  double total = 0;
  for (double o : ops) total += o;
  return total / seconds / 1e9;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

Record& Record::set(const std::string& key, const std::string& value) {
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  fields_.emplace_back(key, quoted + "\"");
  return *this;
}

Record& Record::set(const std::string& key, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, std::isfinite(value) ? "%.6g" : "null", value);
  fields_.emplace_back(key, buf);
  return *this;
}

Record& Record::set(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}

std::string Record::json() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += "\"" + fields_[i].first + "\": " + fields_[i].second;
  }
  return out + "}";
}

std::string Record::get(const std::string& key) const {
  for (const auto& [k, v] : fields_) {
    if (k != key) continue;
    if (v.size() >= 2 && v.front() == '"') return v.substr(1, v.size() - 2);
    return v;
  }
  return "";
}

std::string json_field(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  const size_t at = line.find(tag);
  if (at == std::string::npos) return "";
  size_t begin = at + tag.size(), end = begin;
  if (begin < line.size() && line[begin] == '"') {
    end = line.find('"', begin + 1);
    return end == std::string::npos ? "" : line.substr(begin + 1, end - begin - 1);
  }
  while (end < line.size() && line[end] != ',' && line[end] != '}') ++end;
  return line.substr(begin, end - begin);
}

bool same_prefill_case(const Record& ours, const std::string& sdpa_line) {
  const std::string dtype = json_field(sdpa_line, "dtype"), history = json_field(sdpa_line, "history");
  return !dtype.empty() && ours.get("dtype") == dtype && ours.get("history") == history;
}

int second_select_num_for_budget(int64_t budget_tokens, const LongContextConfig& config) {
  const int64_t block_tokens = std::max<int64_t>(0, budget_tokens - config.initial_len - config.local_windows_len);
  const int64_t blocks = cpu::blocks_for_token_budget(block_tokens, config.block_size);
  return int(std::clamp<int64_t>(blocks, 1, std::max<int64_t>(1, config.max_seq_len / config.block_size)));
}

void print_table(const std::vector<Record>& records, const std::vector<std::string>& columns) {
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    width[c] = columns[c].size();
    for (const auto& r : records) width[c] = std::max(width[c], r.get(columns[c]).size());
  }
  auto row = [&](auto cell) {
    for (size_t c = 0; c < columns.size(); ++c) std::printf("%s%*s", c ? "  " : "", int(width[c]), cell(c).c_str());
    std::printf("\n");
  };
  row([&](size_t c) { return columns[c]; });
  for (const auto& r : records) row([&](size_t c) { return r.get(columns[c]); });
}

double measure_copy_gbps(size_t bytes, int threads, int reps) {
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);  // fault every page before timing
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, size_t(threads));
  const size_t slice = (bytes + threads - 1) / threads;
  auto copy = [&] {
    tbb::parallel_for(0, threads, [&](int t) {
      const size_t begin = std::min(bytes, size_t(t) * slice), end = std::min(bytes, begin + slice);
      std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
    });
  };
  copy();
  const double seconds = median(time_runs(reps, copy));
  return 2.0 * double(bytes) / seconds / 1e9;
}

void evict_caches() {
  static const std::vector<uint64_t> buffer = [] {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 where the system does not say
    const size_t bytes = std::max(size_t(256) << 20, 2 * size_t(std::max(l3, 0L)));
    return std::vector<uint64_t>(bytes / sizeof(uint64_t), 1);
  }();
  constexpr size_t kWordsPerLine = 64 / sizeof(uint64_t);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, buffer.size(), size_t(1) << 17),
                    [](const tbb::blocked_range<size_t>& range) {
                      uint64_t sum = 0;
                      for (size_t i = range.begin(); i < range.end(); i += kWordsPerLine) sum += buffer[i];
                      asm volatile("" : : "r"(sum));  // keeps the reads
                    });
}

namespace {

// A "Key:   1234 kB" line of /proc/self/status, in bytes.
uint64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return std::stoull(line.substr(prefix.size())) * 1024;
  return 0;
}

}  // namespace

uint64_t resident_bytes() { return status_kib("VmRSS"); }
uint64_t peak_resident_bytes() { return status_kib("VmHWM"); }

std::string tools_script(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ignored;  // an unreadable place counts as not having it
  const fs::path here = fs::current_path(ignored) / "tools" / name;
  if (fs::is_regular_file(here, ignored)) return here.string();
  const fs::path built = fs::path(LONGCTX_SOURCE_DIR) / "tools" / name;
  if (fs::is_regular_file(built, ignored)) return built.string();
  fail(ErrorCode::kIo, "no script ", here.string(), " (the current directory) nor ", built.string(),
       " (the source tree longctx-bench was built from)");
}

std::vector<int64_t> parse_list(const std::string& list, const std::string& option, int64_t min) {
  std::vector<int64_t> values;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    values.push_back(parse_int_flag(option, list.substr(pos, comma - pos), min, kMaxInt));
    pos = comma + 1;
  }
  return values;
}

std::vector<DType> parse_kv_types(const std::string& list, const std::string& option) {
  std::vector<DType> types;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    const std::optional<DType> t = parse_dtype(name);
    if (!t) fail(ErrorCode::kInvalidArgument, option, " must list f16, bf16, f32 or q8_0, got '", name, "'");
    if (std::find(types.begin(), types.end(), *t) != types.end())
      fail(ErrorCode::kInvalidArgument, option, " lists '", name, "' twice");
    types.push_back(*t);
    pos = comma + 1;
  }
  return types;
}

TempModel::TempModel(const std::string& preset) {
  path = (std::filesystem::temp_directory_path() /
          ("longctx-bench-" + preset + "-" + std::to_string(getpid()) + ".gguf"))
             .string();
  tools::make_test_model(tools::test_model_by_name(preset)).write(path);
}

TempModel::~TempModel() {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

}  // namespace longctx::bench
