// The CPU attention engine over a KVStore (cpu/attention.h,
// cpu/prefill_attention.h) and the decode policies (policy/decode_policy.h).
// Queries come in through DLPack; results are new NumPy f32 arrays unless an
// out= tensor is given. Every computation runs without the GIL.
#include <pybind11/stl.h>

#include "common.h"
#include "longctx/core/error.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/gpu/cuda_backend.h"
#include "longctx/gpu/device.h"
#include "longctx/policy/decode_policy.h"
#include "longctx/scheduler/device_layer_attention.h"
#include "longctx/scheduler/layer_attention.h"
#include "store_handle.h"

namespace longctx::bindings {
namespace {

// An output: the caller's out= tensor (checked, written in place) or a new array.
struct Out {
  py::object object;  // what is returned
  Arg arg;            // keeps an imported out= alive
  MutableTensorView view;
};

Out output(py::handle given, const char* what, const std::vector<int64_t>& shape) {
  Out o;
  if (given.is_none()) {
    py::array_t<float> a = new_f32(shape);
    o.view = view_of(a);
    o.object = std::move(a);
  } else {
    o.arg = tensor_arg(given, what, std::vector<Dim>(shape.begin(), shape.end()), kF32Only);
    o.view = o.arg.view;
    o.object = py::reinterpret_borrow<py::object>(given);
  }
  return o;
}

template <typename F>
void run_locked(const StoreHandle& h, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(*h.mutex);
  f();
}

// One of the config key prefill_kernel's values ("auto", "f32", "bf16", ...).
cpu::PrefillKernel prefill_kernel_arg(const std::string& name) {
  for (PrefillKernelChoice choice : {PrefillKernelChoice::kAuto, PrefillKernelChoice::kF32, PrefillKernelChoice::kBf16,
                                     PrefillKernelChoice::kOnednn, PrefillKernelChoice::kAmx})
    if (name == prefill_kernel_choice_name(choice)) return cpu::prefill_kernel_for(choice);
  fail(ErrorCode::kInvalidArgument,
       "prefill_attention: kernel must be 'auto', 'f32', 'bf16', 'onednn' or 'amx', got '", name, "'");
}

py::tuple prefill_attention(const StoreHandle& h, int layer, int64_t first_pos, py::handle q, float scale,
                            py::handle out, py::handle lse, const std::string& kernel_name) {
  const cpu::PrefillKernel kernel = prefill_kernel_arg(kernel_name);
  const int d = h.store->layout().shape.head_dim;
  const Arg qa = tensor_arg(q, "q", {"n", "n_q_heads", d}, kF32Only);
  const int64_t n = qa.view.shape[0], heads = qa.view.shape[1];
  Out o = output(out, "out", {n, heads, d});
  Out l = output(lse, "lse", {n, heads});
  run_locked(h, [&] { cpu::prefill_attention(*h.store, layer, first_pos, qa.cview(), scale, o.view, l.view, kernel); });
  return py::make_tuple(o.object, l.object);
}

cpu::Selection selection_arg(py::handle obj, int n_kv_heads) {
  cpu::Selection s;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> lists;
  try {
    lists = obj.cast<decltype(lists)>();
  } catch (const py::cast_error&) {
    throw py::type_error("selection: expected a list (one per kv head) of lists of (begin, end) int pairs");
  }
  if (int(lists.size()) != n_kv_heads)
    fail(ErrorCode::kInvalidArgument, "selection: expected one span list per kv head (", n_kv_heads, "), got ",
         lists.size());
  for (const auto& spans : lists) {
    s.spans.emplace_back();
    for (const auto& [b, e] : spans) s.spans.back().push_back(cpu::TokenSpan{b, e});
  }
  return s;
}

py::list selection_list(const cpu::Selection& s) {
  py::list out;
  for (const auto& spans : s.spans) {
    py::list l;
    for (const cpu::TokenSpan& t : spans) l.append(py::make_tuple(t.begin, t.end));
    out.append(l);
  }
  return out;
}

py::tuple decode_attention(const StoreHandle& h, int layer, py::handle q, py::handle selection, float scale,
                           py::handle out, py::handle lse) {
  const int d = h.store->layout().shape.head_dim;
  const Arg qa = tensor_arg(q, "q", {"n_q_heads", d}, kF32Only);
  const int64_t heads = qa.view.shape[0];
  Out o = output(out, "out", {heads, d});
  Out l = output(lse, "lse", {heads});
  cpu::DecodeAttentionParams params;
  params.scale = scale;
  if (selection.is_none()) {
    run_locked(h, [&] { cpu::dense_decode_attention(*h.store, layer, qa.cview(), params, o.view, l.view); });
  } else {
    const cpu::Selection sel = selection_arg(selection, h.store->layout().shape.n_kv_heads);
    run_locked(h, [&] { cpu::decode_attention(*h.store, layer, qa.cview(), sel, params, o.view, l.view); });
  }
  return py::make_tuple(o.object, l.object);
}

py::tuple merge_attention(py::handle out_a, py::handle lse_a, py::handle out_b, py::handle lse_b) {
  // Any leading shape: lse [...], out [..., head_dim]; contiguous, the kernel takes pointers.
  auto oa_t = ImportedTensor::import(out_a, "out_a");
  const int rank = oa_t->ndim();
  if (rank < 1 || rank > kMaxTensorRank)
    fail(ErrorCode::kInvalidArgument, "out_a: expected [..., head_dim] f32 of rank 1 to ", kMaxTensorRank, ", got ",
         oa_t->describe());
  std::vector<Dim> out_dims(oa_t->shape().begin(), oa_t->shape().end());
  std::vector<Dim> lse_dims(out_dims.begin(), out_dims.end() - 1);
  const Arg oa = check_arg(std::move(oa_t), "out_a", out_dims, kF32Only, /*contiguous=*/true);
  const Arg la = tensor_arg(lse_a, "lse_a", lse_dims, kF32Only, true);
  const Arg ob = tensor_arg(out_b, "out_b", out_dims, kF32Only, true);
  const Arg lb = tensor_arg(lse_b, "lse_b", lse_dims, kF32Only, true);
  std::vector<int64_t> shape(oa.view.shape.begin(), oa.view.shape.begin() + rank);
  py::array_t<float> out = new_f32(shape);
  shape.pop_back();
  py::array_t<float> lse = new_f32(shape);
  const int head_dim = int(oa.view.shape[size_t(rank - 1)]);
  const int n_heads = int(la.view.numel());  // so also with head_dim 0, whose lse still merge
  float* op = out.mutable_data();
  float* lp = lse.mutable_data();
  {
    py::gil_scoped_release nogil;
    cpu::merge_attention(static_cast<const float*>(oa.view.data), static_cast<const float*>(la.view.data),
                         static_cast<const float*>(ob.view.data), static_cast<const float*>(lb.view.data), op, lp,
                         n_heads, head_dim);
  }
  return py::make_tuple(out, lse);
}

// longctx.DecodePolicy: the policy and the store it reads (kept alive).
struct Policy {
  StoreHandle store;
  std::unique_ptr<policy::DecodePolicy> policy;
};

Policy make_policy(py::handle config, const StoreHandle& store, py::handle retrieval_heads, float scale) {
  const LongContextConfig c = config.is_none() ? store.store->config() : config_arg(config);
  policy::RetrievalHeads heads;
  if (!retrieval_heads.is_none()) {
    const kvstore::KVShape shape = store.store->layout().shape;
    heads = policy::RetrievalHeads(shape.n_layers, shape.n_kv_heads);
    std::vector<std::pair<int, int>> pairs;
    try {
      pairs = retrieval_heads.cast<decltype(pairs)>();
    } catch (const py::cast_error&) {
      throw py::type_error("retrieval_heads: expected a list of (layer, kv_head) int pairs");
    }
    for (const auto& [layer, head] : pairs) heads.set(layer, head, true);
  }
  Policy p{store, nullptr};
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(*store.mutex);
  p.policy = std::make_unique<policy::DecodePolicy>(c, *store.store, scale, std::move(heads));
  return p;
}

py::dict stats_dict(const StoreHandle& store, const policy::DecodePolicy& p) {
  // A copy under the store's mutex: a decode() in another thread (GIL released) rewrites them.
  policy::DecodePolicy::Stats st;
  run_locked(store, [&] { st = p.last_stats(); });
  py::dict d;
  d["attended_tokens"] = st.attended_tokens;
  d["reselected"] = st.reselected;
  d["estimated_mass"] = st.estimated_mass;  // per kv head; [] unless top_p
  d["tail_mass"] = st.tail_mass;            // per kv head; [] unless tail: estimate
  d["tail_blocks"] = st.tail_blocks;
  d["speculated"] = st.speculated;          // speculate: reused the last selection
  return d;
}

// The CUDA path of a longctx.LayerAttention (use_cuda): a CUDA backend of its
// own, whose DeviceAttention attends the prefill chunks and the decode window
// of tensors that live on that device (PyTorch's, taken through DLPack and
// ordered with the caller's stream), and the host staging of a layer's
// history, counted in the store's budget.
struct CudaPath {
  int device = 0;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<scheduler::DeviceLayerAttention> step;
  kvstore::MemoryBudget* budget = nullptr;
  uint64_t reserved = 0;
  ~CudaPath() {
    step.reset();
    backend.reset();
    if (budget != nullptr) budget->release(reserved);
  }
};

// longctx.LayerAttention: scheduler::LayerAttention and the store it attends
// (kept alive), and the CUDA path when use_cuda was called (destroyed first:
// it refers to both).
struct PyLayerAttention {
  StoreHandle store;
  std::unique_ptr<scheduler::LayerAttention> attention;
  // Set by use_cuda holding the GIL and the store's mutex, so that readers
  // holding either (the device calls, restart) see it whole.
  std::unique_ptr<CudaPath> cuda;
};

PyLayerAttention make_layer_attention(py::handle config, const StoreHandle& store, float scale) {
  if (store.sequence != nullptr)
    fail(ErrorCode::kInvalidArgument,
         "LayerAttention: this store is a Model's (Model.store), which the model attends itself; make a KVStore "
         "of your own");
  const LongContextConfig c = config.is_none() ? store.store->config() : config_arg(config);
  PyLayerAttention a{store, nullptr, nullptr};
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(*store.mutex);
  a.attention = std::make_unique<scheduler::LayerAttention>(*store.store, c, scale);
  return a;
}

py::tuple layer_prefill_chunk(PyLayerAttention& a, int layer, int64_t first_pos, py::handle q, py::handle k,
                              py::handle v, py::handle out, py::handle lse) {
  const kvstore::KVShape shape = a.store.store->layout().shape;
  const Arg qa = tensor_arg(q, "q", {"n", "n_q_heads", shape.head_dim}, kF32Only);
  const int64_t n = qa.view.shape[0], heads = qa.view.shape[1];
  const Arg ka = tensor_arg(k, "k", {n, shape.n_kv_heads, shape.head_dim}, kKVTypes);
  const Arg va = tensor_arg(v, "v", {n, shape.n_kv_heads, shape.head_dim}, kKVTypes);
  Out o = output(out, "out", {n, heads, shape.head_dim});
  Out l = output(lse, "lse", {n, heads});
  run_locked(a.store,
             [&] { a.attention->prefill_chunk(layer, first_pos, qa.cview(), ka.cview(), va.cview(), o.view, l.view); });
  return py::make_tuple(o.object, l.object);
}

py::tuple layer_decode(PyLayerAttention& a, int layer, py::handle q, py::handle k, py::handle v, bool include_local,
                       py::handle out, py::handle lse) {
  const kvstore::KVShape shape = a.store.store->layout().shape;
  const Arg qa = tensor_arg(q, "q", {"n_q_heads", shape.head_dim}, kF32Only);
  const int64_t heads = qa.view.shape[0];
  const Arg ka = tensor_arg(k, "k", {1, shape.n_kv_heads, shape.head_dim}, kKVTypes);
  const Arg va = tensor_arg(v, "v", {1, shape.n_kv_heads, shape.head_dim}, kKVTypes);
  Out o = output(out, "out", {heads, shape.head_dim});
  Out l = output(lse, "lse", {heads});
  run_locked(a.store,
             [&] { a.attention->decode(layer, qa.cview(), ka.cview(), va.cview(), include_local, o.view, l.view); });
  return py::make_tuple(o.object, l.object);
}

// Why this attention cannot take the CUDA path ("" when it can).
std::string cuda_declined(const PyLayerAttention& a) {
  std::string why;
  if (gpu::list_devices(&why).empty()) return str_cat("no CUDA device: ", why);
  return scheduler::DeviceLayerAttention::declined(a.attention->policy().config(),
                                                   a.store.store->layout().shape.head_dim);
}

void use_cuda(PyLayerAttention& a, int n_heads, int device) {
  const kvstore::KVShape shape = a.store.store->layout().shape;
  if (n_heads <= 0 || n_heads % shape.n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, "LayerAttention.use_cuda: n_heads ", n_heads,
         " is not a positive multiple of the store's ", shape.n_kv_heads, " kv heads");
  if (a.cuda) fail(ErrorCode::kInvalidArgument, "LayerAttention.use_cuda: already on CUDA device ", a.cuda->device);
  const std::string why = cuda_declined(a);
  if (!why.empty()) fail(ErrorCode::kUnsupported, "LayerAttention.use_cuda: attention cannot run on CUDA: ", why);
  // Built holding the GIL and the store's lock, both: the check above and
  // the path's arrival are one step for any other thread, whichever of the
  // two it holds. (Threads in run_locked take the lock without the GIL and
  // give it back before they wait for the GIL: no deadlock.)
  const std::lock_guard<std::mutex> lock(*a.store.mutex);
  auto path = std::make_unique<CudaPath>();
  path->device = device;
  gpu::CudaBackendOptions options;
  options.device = device;
  path->backend = gpu::make_cuda_backend(options);
  const DeviceAttention::Shape ds = scheduler::DeviceLayerAttention::shape_for(
      a.attention->policy().config(), shape.n_layers, n_heads, shape.n_kv_heads, shape.head_dim,
      a.attention->policy().attn_scale());
  const uint64_t bytes = scheduler::DeviceLayerAttention::history_bytes(ds);
  a.store.store->budget().reserve(bytes, "LayerAttention.use_cuda: host staging of one layer's K/V for the device");
  path->budget = &a.store.store->budget();
  path->reserved = bytes;
  path->step = std::make_unique<scheduler::DeviceLayerAttention>(*path->backend->device_attention(), ds,
                                                                 *a.store.store, *a.attention);
  path->step->sync_with_store();  // the store may hold tokens already (a loaded snapshot)
  a.cuda = std::move(path);
}

CudaPath& cuda_path(PyLayerAttention& a, const char* what) {
  if (!a.cuda) fail(ErrorCode::kInvalidArgument, "LayerAttention.", what, ": call use_cuda() first");
  return *a.cuda;
}

// A tensor on the path's CUDA device: f32, contiguous, these dims.
Arg device_arg(const CudaPath& path, py::handle obj, const char* what, const std::vector<Dim>& dims) {
  std::shared_ptr<ImportedTensor> t = ImportedTensor::import(obj, what, /*any_device=*/true);
  if (t->device().device_type != kDLCUDA || t->device().device_id != path.device)
    fail(ErrorCode::kInvalidArgument, what, ": expected a tensor on cuda:", path.device, ", got ",
         device_name(t->device()));
  return check_arg(std::move(t), what, dims, kF32Only, /*contiguous=*/true);
}

std::unique_ptr<BackendTensor> wrap(const CudaPath& path, const Arg& arg, const char* what) {
  const MutableTensorView& v = arg.view;
  const int64_t rows = v.shape[0];
  return gpu::wrap_device_memory(*path.backend, v.data, {rows, v.numel() / std::max<int64_t>(rows, 1)},
                                 DType::kF32, what);
}

// Runs f(q, k, v, out) on the path's backend, with the tensors wrapped as its
// [rows, heads * head_dim] tensors and the store locked, between the
// hand-offs with the caller's stream: the backend waits for what the stream
// queued (q/k/v written), the stream then waits for what the backend queued
// (out written), even when f throws.
template <typename F>
void on_device(PyLayerAttention& a, CudaPath& path, uintptr_t stream, const Arg& q, const Arg& k, const Arg& v,
               const Arg& out, F&& f) {
  // Joins the caller's stream on the way out, throwing only when nothing else is in flight.
  struct Join {
    CudaPath& path;
    uintptr_t stream;
    ~Join() noexcept(false) {
      if (std::uncaught_exceptions() == 0) {
        gpu::join_stream(*path.backend, stream);
      } else {
        try {
          gpu::join_stream(*path.backend, stream);
        } catch (...) {  // the error in flight is the one to report
        }
      }
    }
  };
  run_locked(a.store, [&] {
    auto qt = wrap(path, q, "q"), kt = wrap(path, k, "k"), vt = wrap(path, v, "v"), ot = wrap(path, out, "out");
    gpu::wait_for_stream(*path.backend, stream);
    const Join join{path, stream};
    f(*qt, *kt, *vt, *ot);
  });
}

void device_prefill_chunk(PyLayerAttention& a, int layer, int64_t first_pos, py::handle q, py::handle k,
                          py::handle v, py::handle out, uintptr_t stream) {
  CudaPath& path = cuda_path(a, "device_prefill_chunk");
  const DeviceAttention::Shape& s = path.step->shape();
  const Arg qa = device_arg(path, q, "q", {"n", s.n_heads, s.head_dim});
  const int64_t n = qa.view.shape[0];
  const Arg ka = device_arg(path, k, "k", {n, s.n_kv_heads, s.head_dim});
  const Arg va = device_arg(path, v, "v", {n, s.n_kv_heads, s.head_dim});
  const Arg oa = device_arg(path, out, "out", {n, s.n_heads, s.head_dim});
  on_device(a, path, stream, qa, ka, va, oa, [&](auto& qt, auto& kt, auto& vt, auto& ot) {
    path.step->prefill_chunk(layer, first_pos, qt, kt, vt, ot);
  });
}

void device_decode(PyLayerAttention& a, int layer, py::handle q, py::handle k, py::handle v, py::handle out,
                   uintptr_t stream) {
  CudaPath& path = cuda_path(a, "device_decode");
  const DeviceAttention::Shape& s = path.step->shape();
  const Arg qa = device_arg(path, q, "q", {1, s.n_heads, s.head_dim});
  const Arg ka = device_arg(path, k, "k", {1, s.n_kv_heads, s.head_dim});
  const Arg va = device_arg(path, v, "v", {1, s.n_kv_heads, s.head_dim});
  const Arg oa = device_arg(path, out, "out", {1, s.n_heads, s.head_dim});
  on_device(a, path, stream, qa, ka, va, oa, [&](auto& qt, auto& kt, auto& vt, auto& ot) {
    if (layer < 0 || layer >= s.n_layers)
      fail(ErrorCode::kInvalidArgument, "LayerAttention.device_decode: layer ", layer, " outside [0, ", s.n_layers,
           ")");
    path.step->decode(layer, a.store.store->n_tokens(layer), qt, kt, vt, ot);
  });
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("prefill_attention", &prefill_attention, py::arg("store"), py::arg("layer"), py::arg("first_pos"),
        py::arg("q"), py::arg("scale") = 0.0f, py::arg("out") = py::none(), py::arg("lse") = py::none(),
        py::arg("kernel") = "auto",
        "Attention of a chunk's queries q f32 [n, n_q_heads, head_dim] at positions first_pos.. over every "
        "earlier token of `layer` and the chunk causally (its K/V appended first). Returns (out f32 [n, "
        "n_q_heads, head_dim], lse f32 [n, n_q_heads]); scale 0 = 1/sqrt(head_dim). kernel: 'f32', 'bf16' "
        "(q, k, v, p rounded to bf16; AVX512-BF16 CPUs), 'onednn' (the same through oneDNN: AMX tiles where the "
        "CPU has them), 'amx' (the same on AMX tiles, fused with the softmax) or 'auto', as the config key "
        "prefill_kernel.");
  m.def(
      "prefill_kernels",
      [] {
        std::vector<std::string> names;
        for (cpu::PrefillKernel k : cpu::supported_prefill_kernels()) names.push_back(cpu::prefill_kernel_name(k));
        return names;
      },
      "The prefill attention kernels this CPU runs, by instruction set, e.g. ['amx', 'onednn', 'bf16', 'f32'] "
      "(AMX), ['bf16', 'onednn', 'f32'] (AVX512-BF16) or ['f32']; auto_prefill_kernel() says which one auto runs.");
  m.def(
      "auto_prefill_kernel", [] { return std::string(cpu::prefill_kernel_name(cpu::best_prefill_kernel())); },
      "The prefill attention kernel that kernel='auto' and the config key prefill_kernel: auto run here: 'amx' "
      "where AMX is usable, else 'bf16' where vdpbf16ps runs at 1.25x the FMA rate or more (measured once), else "
      "'f32'.");
  m.def(
      "dense_decode_attention",
      [](const StoreHandle& h, int layer, py::handle q, float scale, py::handle out, py::handle lse) {
        return decode_attention(h, layer, q, py::none(), scale, out, lse);
      },
      py::arg("store"), py::arg("layer"), py::arg("q"), py::arg("scale") = 0.0f, py::arg("out") = py::none(),
      py::arg("lse") = py::none(),
      "One decode query per head, q f32 [n_q_heads, head_dim], over every token of `layer`. Returns (out, lse).");
  m.def("decode_attention", &decode_attention, py::arg("store"), py::arg("layer"), py::arg("q"),
        py::arg("selection"), py::arg("scale") = 0.0f, py::arg("out") = py::none(), py::arg("lse") = py::none(),
        "As dense_decode_attention over the tokens `selection` lists: one list of (begin, end) spans per kv head.");
  m.def("merge_attention", &merge_attention, py::arg("out_a"), py::arg("lse_a"), py::arg("out_b"), py::arg("lse_b"),
        "Merges two partial results by their log-sum-exp: out [..., head_dim], lse [...] f32. An empty part "
        "(lse -inf) leaves the other unchanged. Returns (out, lse).");

  py::class_<Policy>(m, "DecodePolicy",
                     "The decode-time selection policy of a config (select, dense, streaming, h2o; RazorAttention) "
                     "over one store: policy/decode_policy.h.")
      .def(py::init(&make_policy), py::arg("config"), py::arg("store"), py::arg("retrieval_heads") = py::none(),
           py::arg("scale") = 0.0f,
           "config: Config, path, dict, or None for the store's config. retrieval_heads: optional list of "
           "(layer, kv_head) pairs (RazorAttention); else config razor.retrieval_heads. scale: the model's "
           "score scale, used by every attention the policy computes (0 = 1/sqrt(head_dim)).")
      .def(
          "on_prefill_end",
          [](Policy& p, int layer, py::handle window_q) {
            const int d = p.store.store->layout().shape.head_dim;
            const Arg q = tensor_arg(window_q, "window_q", {"w", "n_q_heads", d}, kF32Only);
            run_locked(p.store, [&] { p.policy->on_prefill_end(layer, q.cview()); });
          },
          py::arg("layer"), py::arg("window_q"),
          "End of the prefill of `layer`: window_q f32 [w, n_q_heads, head_dim], the last prompt queries.")
      .def(
          "decode",
          [](Policy& p, int layer, int64_t token_idx, py::handle q, bool include_local, py::handle out,
             py::handle lse) {
            const int d = p.store.store->layout().shape.head_dim;
            const Arg qa = tensor_arg(q, "q", {"n_q_heads", d}, kF32Only);
            const int64_t heads = qa.view.shape[0];
            Out o = output(out, "out", {heads, d});
            Out l = output(lse, "lse", {heads});
            run_locked(p.store, [&] { p.policy->decode(layer, token_idx, qa.cview(), include_local, o.view, l.view); });
            return py::make_tuple(o.object, l.object);
          },
          py::arg("layer"), py::arg("token_idx"), py::arg("q"), py::arg("include_local") = true,
          py::arg("out") = py::none(), py::arg("lse") = py::none(),
          "Decode step token_idx (0 = first generated token, already appended) of `layer`: q f32 [n_q_heads, "
          "head_dim]. Returns (out, lse).")
      .def("last_selection",
           [](const Policy& p) {
             cpu::Selection sel;  // copied under the store's mutex: decode() in another thread writes it
             run_locked(p.store, [&] { sel = p.policy->last_selection(); });
             return selection_list(sel);
           },
           "Per kv head, the (begin, end) token spans the last decode attended exactly.")
      .def("last_stats", [](const Policy& p) { return stats_dict(p.store, *p.policy); },
           "What the last decode did: attended_tokens (summed over kv heads), reselected, with "
           "budget.mode top_p estimated_mass (per kv head, the estimated share of its attention attended), and "
           "with tail: estimate tail_mass (per kv head, the share of the merged attention mass the unselected "
           "blocks' estimate carries) and tail_blocks, and with speculate whether it reused its layer's last "
           "selection (speculated).")
      .def_property_readonly("razor_enabled", [](const Policy& p) { return p.policy->razor_enabled(); })
      .def_property_readonly("config", [](const Policy& p) { return PyConfig{p.policy->config()}; })
      .def_property_readonly("scale", [](const Policy& p) { return p.policy->attn_scale(); })
      .def_property_readonly("store", [](const Policy& p) { return p.store; });

  py::class_<PyLayerAttention>(m, "LayerAttention",
                               "What a layer does with its q/k/v over a KV store, as longctx-chat runs it "
                               "(scheduler/layer_attention.h): append + prefill attention (QUOKA when "
                               "quoka.enabled), the policy's prefill-end window, the decode step.")
      .def(py::init(&make_layer_attention), py::arg("config"), py::arg("store"), py::arg("scale") = 0.0f,
           "config: Config, path, dict, or None for the store's config. scale: the model's score scale for every "
           "attention, prefill and decode (0 = 1/sqrt(head_dim)).")
      .def("prefill_chunk", &layer_prefill_chunk, py::arg("layer"), py::arg("first_pos"), py::arg("q"), py::arg("k"),
           py::arg("v"), py::arg("out") = py::none(), py::arg("lse") = py::none(),
           "A chunk of `layer` at first_pos (= the tokens it holds): k, v [n, n_kv_heads, head_dim] (f32, f16 or "
           "bf16) are appended, q f32 [n, n_q_heads, head_dim] attends every earlier token and the chunk "
           "causally. Returns (out f32 [n, n_q_heads, head_dim], lse f32 [n, n_q_heads]).")
      .def(
          "end_prefill",
          [](PyLayerAttention& a, int layer, py::handle window_q) {
            const int d = a.store.store->layout().shape.head_dim;
            const Arg q = tensor_arg(window_q, "window_q", {"w", "n_q_heads", d}, kF32Only);
            run_locked(a.store, [&] { a.attention->end_prefill(layer, q.cview()); });
          },
          py::arg("layer"), py::arg("window_q"),
          "The end of `layer`'s prefill: window_q f32 [w, n_q_heads, head_dim], its last w <= preselect.window "
          "prompt queries (w may be 0); the layer's next decode is its first step.")
      .def("decode", &layer_decode, py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("include_local") = true, py::arg("out") = py::none(), py::arg("lse") = py::none(),
           "A decode step of `layer`: k, v [1, n_kv_heads, head_dim] appended, q f32 [n_q_heads, head_dim] "
           "attends what the config's policy selects. Returns (out, lse).")
      .def(
          "restart",
          [](PyLayerAttention& a) {
            run_locked(a.store, [&] {
              a.attention->restart();
              if (a.cuda) a.cuda->step->sync_with_store();  // the device's tokens become the store's
            });
          },
          "A new sequence over the store as it is now (clear it first for an empty one): a fresh policy; on the "
          "CUDA path the device's window is refilled from the store.")
      .def("cuda_declined", &cuda_declined,
           "Why use_cuda would refuse: no CUDA device (and why), or a config the device path does not run "
           "(kv_type, head_dim, policy h2o, quoka); '' when it would not.")
      .def("use_cuda", &use_cuda, py::arg("n_heads"), py::arg("device") = 0,
           "From now on the device_* calls attend on CUDA device `device` (a backend of this object's own): "
           "prefill chunks and the decode local window there, the rest of a decode step on the CPU as decode "
           "does, merged on the device. n_heads: query heads. Reserves the host staging of one layer's K/V "
           "in the store's budget.")
      .def("device_prefill_chunk", &device_prefill_chunk, py::arg("layer"), py::arg("first_pos"), py::arg("q"),
           py::arg("k"), py::arg("v"), py::arg("out"), py::arg("stream") = 0,
           "prefill_chunk with q [n, n_q_heads, head_dim], k, v [n, n_kv_heads, head_dim] and out f32 tensors "
           "on the CUDA device (contiguous), attended there; call device_begin_layer at the start of a layer's "
           "turn. stream: the caller's cudaStream_t (torch.cuda.current_stream().cuda_stream): the device "
           "reads q/k/v after what it queued and it reads out after the attention.")
      .def(
          "device_begin_layer",
          [](PyLayerAttention& a, int layer) {
            CudaPath& path = cuda_path(a, "device_begin_layer");
            run_locked(a.store, [&] { path.step->begin_layer(layer); });
          },
          py::arg("layer"),
          "The start of `layer`'s prefill turn on the CUDA path: its cached K/V go to the device as the "
          "history of the chunks that follow.")
      .def("device_decode", &device_decode, py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("out"), py::arg("stream") = 0,
           "decode on the CUDA path: q, out [1, n_q_heads, head_dim], k, v [1, n_kv_heads, head_dim] f32 on "
           "the device; the local window attended there, the rest on the CPU, merged into out. stream as in "
           "device_prefill_chunk.")
      .def_property_readonly("cuda_device", [](const PyLayerAttention& a) -> py::object {
        return a.cuda ? py::object(py::int_(a.cuda->device)) : py::object(py::none());
      }, "The CUDA device index of use_cuda, None before.")
      .def("last_stats", [](const PyLayerAttention& a) { return stats_dict(a.store, a.attention->policy()); },
           "As DecodePolicy.last_stats, for the last decode step.")
      .def("last_selection",
           [](const PyLayerAttention& a) {
             cpu::Selection sel;
             run_locked(a.store, [&] { sel = a.attention->policy().last_selection(); });
             return selection_list(sel);
           },
           "As DecodePolicy.last_selection.")
      .def_property_readonly("scale", [](const PyLayerAttention& a) { return a.attention->policy().attn_scale(); })
      .def_property_readonly("store", [](const PyLayerAttention& a) { return a.store; });
}

}  // namespace longctx::bindings
