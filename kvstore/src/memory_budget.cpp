#include "longctx/kvstore/memory_budget.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>

#include "longctx/core/error.h"

namespace longctx::kvstore {

namespace {

// "2.00 MiB (2097152 bytes)": readable, and exact for whoever needs the number.
std::string bytes_text(uint64_t bytes) {
  return str_cat(format_bytes(bytes), " (", bytes, " bytes)");
}

// The memory limit of our cgroup (v2 or v1), or 0 when there is none. A
// container's limit is often far below the machine's memory, and exceeding it
// gets the process killed instead of a clean budget error.
uint64_t cgroup_memory_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream file(path);
    std::string text;
    if (!(file >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
      continue;  // missing, "max" or unreadable: no limit from this file
    }
    try {
      return std::stoull(text);
    } catch (const std::exception&) {
      continue;  // out of range: as good as no limit
    }
  }
  return 0;
}

}  // namespace

MemoryBudget::MemoryBudget(uint64_t limit_bytes, std::string name)
    : limit_(limit_bytes), name_(std::move(name)) {}

void MemoryBudget::reserve(uint64_t bytes, std::string_view what) {
  uint64_t used_now = used_.load(std::memory_order_relaxed);
  // used_ never exceeds limit_, so limit_ - used_now cannot wrap.
  do {
    if (bytes > limit_ - used_now) {
      fail(ErrorCode::kOutOfMemory, what, ": requested ", bytes_text(bytes), ", ",
           bytes_text(limit_ - used_now), " available (", name_, " ", bytes_text(limit_), ", ",
           bytes_text(used_now), " in use)");
    }
  } while (!used_.compare_exchange_weak(used_now, used_now + bytes, std::memory_order_relaxed));
}

void MemoryBudget::release(uint64_t bytes) {
  uint64_t used_now = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > used_now) {
      fail(ErrorCode::kInternal, name_, ": releasing ", bytes_text(bytes), " but only ",
           bytes_text(used_now), " are reserved (a bug in the caller)");
    }
  } while (!used_.compare_exchange_weak(used_now, used_now - bytes, std::memory_order_relaxed));
}

uint64_t MemoryBudget::available() const { return limit_ - used(); }

uint64_t machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) {
    fail(ErrorCode::kInternal, "cannot read the machine's physical memory size (sysconf failed); "
                               "set 'dram_budget' in the config");
  }
  uint64_t memory = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  const uint64_t cgroup_limit = cgroup_memory_limit();
  if (cgroup_limit != 0 && cgroup_limit < memory) memory = cgroup_limit;
  return memory;
}

uint64_t default_dram_budget() { return machine_memory_bytes() / 10 * 9; }

}  // namespace longctx::kvstore
