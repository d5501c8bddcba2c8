// longctx.KVStore: the block KV store of kvstore/kv_store.h with its
// snapshots, fed with tensors from PyTorch or NumPy (DLPack, no copy).
#include <pybind11/stl.h>

#include "common.h"
#include "longctx/core/error.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/snapshot.h"
#include "store_handle.h"

namespace longctx::bindings {

const kvstore::NumaTopology& machine_topology() {
  static const kvstore::NumaTopology* const topology = new kvstore::NumaTopology(kvstore::NumaTopology::detect());
  return *topology;
}

namespace {

// A store of its own: the budget it draws from lives and dies with it.
struct OwnedStore {
  std::unique_ptr<kvstore::MemoryBudget> budget;
  std::unique_ptr<kvstore::KVStore> store;
};

StoreHandle make_store(py::handle config_obj, int n_layers, int n_kv_heads, int head_dim) {
  const LongContextConfig config = config_arg(config_obj);
  auto owned = std::make_shared<OwnedStore>();
  owned->budget = std::make_unique<kvstore::MemoryBudget>(config.dram_budget != 0 ? config.dram_budget
                                                                                  : kvstore::default_dram_budget());
  owned->store = std::make_unique<kvstore::KVStore>(kvstore::KVShape{n_layers, n_kv_heads, head_dim}, config,
                                                    *owned->budget, machine_topology());
  StoreHandle h;
  h.store = owned->store.get();
  h.owner = std::move(owned);
  h.mutex = std::make_shared<std::mutex>();
  return h;
}

// Runs f on the store without the GIL, holding the store's mutex.
template <typename F>
auto locked(const StoreHandle& h, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(*h.mutex);
  return f(*h.store);
}

void append(const StoreHandle& h, int layer, py::handle k, py::handle v, py::handle importance) {
  if (h.sequence != nullptr)
    fail(ErrorCode::kInvalidArgument,
         "KVStore.append: this store is a Model's (Model.store) and only the model writes it "
         "(Model.prefill / Model.decode); make a KVStore of your own to append to");
  const kvstore::KVShape shape = h.store->layout().shape;
  const Arg ka = tensor_arg(k, "k", {"n", shape.n_kv_heads, shape.head_dim}, kKVTypes);
  const Arg va = tensor_arg(v, "v", {ka.view.shape[0], shape.n_kv_heads, shape.head_dim}, kKVTypes);
  Arg ia;
  if (!importance.is_none()) ia = tensor_arg(importance, "importance", {ka.view.shape[0], shape.n_kv_heads}, kF32Only);
  const TensorView iv = importance.is_none() ? TensorView{} : ia.cview();
  locked(h, [&](kvstore::KVStore& s) {
    s.append(layer, ka.cview(), va.cview(), iv);
    return 0;
  });
}

py::dict memory_stats(const StoreHandle& h) {
  const kvstore::MemoryStats st = locked(h, [](kvstore::KVStore& s) { return s.memory_stats(); });
  py::dict d;
  d["reserved_bytes"] = st.reserved_bytes;
  d["used_bytes"] = st.used_bytes;
  d["budget_bytes"] = st.budget_bytes;
  d["budget_used_bytes"] = st.budget_used_bytes;
  d["reserved_bytes_per_node"] = st.reserved_bytes_per_node;
  return d;
}

py::dict partition(const StoreHandle& h, int layer) {
  const kvstore::Partition p = locked(h, [&](kvstore::KVStore& s) { return s.partition(layer); });
  py::dict d;
  d["n_tokens"] = p.n_tokens;
  d["initial_end"] = p.initial_end;
  d["local_begin"] = p.local_begin;
  d["first_context_block"] = p.first_context_block;
  d["end_context_block"] = p.end_context_block;
  d["first_ranked_block"] = p.first_ranked_block;
  d["end_ranked_block"] = p.end_ranked_block;
  return d;
}

// Every token of a layer as f32 [n_tokens, n_kv_heads, head_dim] K and V.
// The arrays are made with the GIL held and outside the store's lock, then
// filled under it: when another thread appended (or cleared) in between, the
// count has changed and the read starts again, a few times at most.
py::tuple read_layer(const StoreHandle& h, int layer) {
  const kvstore::StoreLayout& lay = h.store->layout();
  const int H = lay.shape.n_kv_heads, D = lay.shape.head_dim, B = lay.block_size;
  constexpr int kTries = 8;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    const int64_t n = locked(h, [&](kvstore::KVStore& s) { return s.n_tokens(layer); });
    py::array_t<float> k = new_f32({n, H, D}), v = new_f32({n, H, D});
    float* kp = k.mutable_data();
    float* vp = v.mutable_data();
    std::vector<float> keys_t;  // one block's K^T, f32
    const bool read = locked(h, [&](kvstore::KVStore& s) {
      if (s.n_tokens(layer) != n) return false;
      for (int head = 0; head < H; ++head) {
        for (int64_t b = 0; b < s.n_blocks(layer); ++b) {
          const kvstore::BlockView blk = s.block(layer, head, b);
          // Rows of token t, kv head `head` in the [n, H, D] outputs: H * D floats apart.
          const size_t first = (size_t(b * B) * size_t(H) + size_t(head)) * size_t(D);
          kvstore::read_values(lay, blk, 0, blk.n_filled, vp + first, size_t(H) * size_t(D));
          keys_t.resize(size_t(D) * size_t(blk.n_filled));
          kvstore::read_keys_t(lay, blk, 0, blk.n_filled, keys_t.data(), size_t(blk.n_filled));
          for (int t = 0; t < blk.n_filled; ++t)
            for (int c = 0; c < D; ++c)
              kp[first + size_t(t) * size_t(H) * size_t(D) + size_t(c)] =
                  keys_t[size_t(c) * size_t(blk.n_filled) + size_t(t)];
        }
      }
      return true;
    });
    if (read) return py::make_tuple(k, v);
  }
  fail(ErrorCode::kInvalidArgument, "KVStore.read: layer ", layer, " changed during each of ", kTries,
       " reads (other threads append to it)");
}

}  // namespace

void bind_store(py::module_& m) {
  py::class_<StoreHandle>(m, "KVStore",
                          "The block KV cache of one sequence in DRAM (kvstore/kv_store.h): n_layers x n_kv_heads "
                          "x blocks of block_size tokens in kv_type, with representatives for block selection.")
      .def(py::init(&make_store), py::arg("config"), py::arg("n_layers"), py::arg("n_kv_heads"), py::arg("head_dim"),
           "config: longctx.Config, YAML path, dict or None (defaults). Checks that max_seq_len tokens fit the DRAM "
           "budget before allocating anything.")
      .def("append", &append, py::arg("layer"), py::arg("k"), py::arg("v"), py::arg("importance") = py::none(),
           "Appends n tokens to `layer`: k, v [n, n_kv_heads, head_dim] f32/f16/bf16 (innermost dimension "
           "contiguous), importance optional f32 [n, n_kv_heads] (DYNAMIC). On error the store is unchanged.")
      .def("n_tokens", [](const StoreHandle& h, int layer) { return locked(h, [&](kvstore::KVStore& s) { return s.n_tokens(layer); }); },
           py::arg("layer"))
      .def("n_blocks", [](const StoreHandle& h, int layer) { return locked(h, [&](kvstore::KVStore& s) { return s.n_blocks(layer); }); },
           py::arg("layer"))
      .def("partition", &partition, py::arg("layer"),
           "initial / context / local token ranges of a layer (kvstore::Partition) as a dict.")
      .def("read", &read_layer, py::arg("layer"),
           "(k, v): copies of every token of `layer` as f32 [n_tokens, n_kv_heads, head_dim] (tests, debugging).")
      .def("clear",
           [](const StoreHandle& h) {
             py::gil_scoped_release nogil;
             std::lock_guard<std::mutex> lock(*h.mutex);
             if (h.sequence != nullptr) h.reset_owner();
             else h.store->clear();
           },
           "Drops every token (for Model.store: Model.reset()).")
      .def(
          "save",
          [](const StoreHandle& h, const std::string& path, const std::string& fingerprint) {
            locked(h, [&](kvstore::KVStore& s) {
              kvstore::save_snapshot(s, path, fingerprint);
              return 0;
            });
          },
          py::arg("path"), py::arg("fingerprint") = "",
          "Writes a snapshot (docs/snapshot-format.md) atomically; on error `path` is untouched.")
      .def(
          "load",
          [](const StoreHandle& h, const std::string& path, const std::string& fingerprint, bool mmap) {
            locked(h, [&](kvstore::KVStore& s) {
              kvstore::load_snapshot(s, path, fingerprint, mmap ? kvstore::LoadMode::kMmap : kvstore::LoadMode::kRead,
                                     /*equal_layers=*/h.sequence != nullptr);  // a model's store
              if (h.sequence != nullptr) h.sync_owner();
              return 0;
            });
          },
          py::arg("path"), py::arg("fingerprint") = "", py::arg("mmap") = false,
          "Replaces the content with a snapshot of the same layout and fingerprint; on error the store is unchanged.")
      .def("memory_stats", &memory_stats)
      .def_property_readonly("shape",
                             [](const StoreHandle& h) {
                               const kvstore::KVShape s = h.store->layout().shape;
                               return py::make_tuple(s.n_layers, s.n_kv_heads, s.head_dim);
                             },
                             "(n_layers, n_kv_heads, head_dim)")
      .def_property_readonly("n_layers", [](const StoreHandle& h) { return h.store->layout().shape.n_layers; })
      .def_property_readonly("n_kv_heads", [](const StoreHandle& h) { return h.store->layout().shape.n_kv_heads; })
      .def_property_readonly("head_dim", [](const StoreHandle& h) { return h.store->layout().shape.head_dim; })
      .def_property_readonly("block_size", [](const StoreHandle& h) { return h.store->layout().block_size; })
      .def_property_readonly("kv_type", [](const StoreHandle& h) { return std::string(dtype_name(h.store->layout().kv_type)); })
      .def_property_readonly("config", [](const StoreHandle& h) { return PyConfig{h.store->config()}; })
      .def("__repr__", [](const StoreHandle& h) {
        const kvstore::StoreLayout& l = h.store->layout();
        return str_cat("longctx.KVStore(n_layers=", l.shape.n_layers, ", n_kv_heads=", l.shape.n_kv_heads,
                       ", head_dim=", l.shape.head_dim, ", block_size=", l.block_size, ", kv_type=",
                       dtype_name(l.kv_type), ")");
      });
}

}  // namespace longctx::bindings
