// What a Python longctx.KVStore holds: a KV store that is either its own
// (KVStore(config, ...)) or a Model's sequence store (Model.store), and the
// mutex that serializes every computation on it (the GIL is released while
// they run, and the C++ objects are not thread-safe).
//
// Lock order: release the GIL first, then take `mutex` (never wait for the
// mutex while holding the GIL, never take the GIL while holding the mutex).
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/numa.h"

namespace longctx::scheduler {
class Sequence;
}

namespace longctx::bindings {

struct StoreHandle {
  std::shared_ptr<void> owner;          // keeps `store` (and `sequence`) alive
  kvstore::KVStore* store = nullptr;
  std::shared_ptr<std::mutex> mutex;
  // Set for Model.store, whose writes go through the model: clear() calls
  // reset_owner (Model.reset) and load() then sync_owner (n_past from the
  // store). Both run with `mutex` held.
  scheduler::Sequence* sequence = nullptr;
  std::function<void()> reset_owner, sync_owner;
};

// The machine's NUMA topology, detected once and never destroyed (stores
// reference it and may outlive any other object).
const kvstore::NumaTopology& machine_topology();

}  // namespace longctx::bindings
