// The accounted DRAM budget every kvstore allocation is counted against.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace longctx::kvstore {

// Thread-safe counter of reserved bytes under a fixed limit.
class MemoryBudget {
 public:
  // `name` appears in errors, e.g. "DRAM budget".
  explicit MemoryBudget(uint64_t limit_bytes, std::string name = "DRAM budget");
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Reserves `bytes` or throws Error(kOutOfMemory) and reserves nothing:
  // "<what>: requested 2.00 MiB, 1.00 MiB available (DRAM budget 64.00 MiB, 63.00 MiB in use)".
  void reserve(uint64_t bytes, std::string_view what);
  void release(uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t available() const;
  const std::string& name() const { return name_; }

 private:
  const uint64_t limit_;
  const std::string name_;
  std::atomic<uint64_t> used_{0};
};

// The machine's physical memory, or the cgroup's memory limit when lower
// (Error(kInternal) when sysconf cannot tell).
uint64_t machine_memory_bytes();

// The budget used when the config says 0: 90% of machine_memory_bytes().
uint64_t default_dram_budget();

}  // namespace longctx::kvstore
