// longctx._core: the pybind11 module. It exposes the build and machine report,
// configs (config_bindings.cpp), tensors through DLPack (dlpack.cpp), the KV
// store (store_bindings.cpp), the CPU attention engine and decode policies
// (attention_bindings.cpp), the model runner (model_bindings.cpp), tokenizers
// of GGUF files (tokenizer_bindings.cpp) and GGUF files (gguf_bindings.cpp).
// C++ errors become longctx.Error (a RuntimeError) carrying the C++ message;
// wrong Python types are TypeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common.h"
#include "longctx/core/config.h"
#include "longctx/core/cpu_features.h"
#include "longctx/core/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "longctx native module";
  static py::exception<longctx::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const longctx::Error& e) {
      error(e.what());
    }
  });

  m.def("version", [] { return std::string(LONGCTX_VERSION); });
  m.def("cpu_features", [] {
    const auto& f = longctx::cpu_features();
    py::dict d;
    d["brand"] = f.brand;
    d["avx2"] = f.avx2, d["fma"] = f.fma, d["f16c"] = f.f16c;
    d["avx512f"] = f.avx512f, d["avx512bw"] = f.avx512bw, d["avx512vl"] = f.avx512vl;
    d["avx512bf16"] = f.avx512bf16, d["avx512fp16"] = f.avx512fp16;
    d["simd_target"] = longctx::highway_target_name();
    return d;
  });
  m.def(
      "load_config",
      [](const std::string& path, const std::vector<std::string>& overrides) {
        return longctx::config_to_yaml(longctx::load_config_file(path, overrides));
      },
      py::arg("path"), py::arg("overrides") = std::vector<std::string>{},
      "Loads and validates a YAML config; returns it normalized as YAML text.");

  longctx::bindings::bind_tensor(m);
  longctx::bindings::bind_config(m);
  longctx::bindings::bind_store(m);
  longctx::bindings::bind_attention(m);
  longctx::bindings::bind_model(m);
  longctx::bindings::bind_tokenizer(m);
  longctx::bindings::bind_gguf(m);
}
