// longctx.Config: the YAML configuration of core/config.h, loaded from a file,
// YAML text or a Python dict, validated by the C++ loader (so every error
// names the source and the key), and read back as YAML, a dict or properties.
#include <pybind11/stl.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>

#include "common.h"
#include "longctx/core/error.h"

namespace longctx::bindings {
namespace {

constexpr const char* kDictSource = "<dict>";

// A YAML double-quoted scalar (JSON escapes are valid YAML).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// A scalar or list value as YAML flow text; `key` names it in TypeErrors.
std::string scalar_yaml(py::handle v, const std::string& key) {
  if (v.is_none()) return "null";
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::int_>(v)) return py::str(v);
  if (py::isinstance<py::float_>(v)) return py::repr(v);
  if (py::isinstance<py::str>(v)) return quoted(v.cast<std::string>());
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string s = "[";
    size_t i = 0;
    for (py::handle e : v) {
      if (py::isinstance<py::list>(e) || py::isinstance<py::tuple>(e) || py::isinstance<py::dict>(e))
        throw py::type_error(str_cat("Config.from_dict: key '", key, "': nested lists and maps are not config values"));
      s += (i++ ? ", " : "") + scalar_yaml(e, key);
    }
    return s + "]";
  }
  throw py::type_error(str_cat("Config.from_dict: key '", key, "': a ", std::string(py::str(py::type::handle_of(v).attr("__name__"))),
                               " is not a config value (expected bool, int, float, str, list, dict or None)"));
}

// A dict as a YAML block mapping, sections indented.
void dict_yaml(const py::dict& d, const std::string& prefix, int indent, std::string& out) {
  for (auto [k, v] : d) {
    if (!py::isinstance<py::str>(k))
      throw py::type_error(str_cat("Config.from_dict: keys must be str, got ", std::string(py::repr(k)),
                                   prefix.empty() ? "" : " in section '" + prefix + "'"));
    const std::string key = k.cast<std::string>();
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    out.append(size_t(indent), ' ').append(quoted(key)).append(":");
    if (py::isinstance<py::dict>(v)) {
      out += "\n";
      dict_yaml(v.cast<py::dict>(), path, indent + 2, out);
    } else {
      out.append(" ").append(scalar_yaml(v, path)).append("\n");
    }
  }
}

// A scalar of config_to_yaml's output as the Python value it stands for.
py::object scalar_value(const YAML::Node& n) {
  if (n.IsNull()) return py::none();
  if (n.IsSequence()) {
    py::list l;
    for (const YAML::Node& e : n) l.append(scalar_value(e));
    return l;
  }
  if (n.IsMap()) {
    py::dict d;
    for (const auto& kv : n) d[py::str(kv.first.Scalar())] = scalar_value(kv.second);
    return d;
  }
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return utf8(s);  // quoted: a string whatever it looks like
  if (s == "true") return py::bool_(true);
  if (s == "false") return py::bool_(false);
  int64_t i = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i); ec == std::errc() && p == s.data() + s.size())
    return py::int_(i);
  double f = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), f); ec == std::errc() && p == s.data() + s.size())
    return py::float_(f);
  return utf8(s);
}

std::vector<std::string> overrides_arg(py::handle overrides) {
  if (overrides.is_none()) return {};
  if (py::isinstance<py::str>(overrides))
    throw py::type_error("overrides: expected a list of 'key=value' strings, got one str");
  try {
    return overrides.cast<std::vector<std::string>>();
  } catch (const py::cast_error&) {
    throw py::type_error("overrides: expected a list of 'key=value' strings");
  }
}

PyConfig from_dict(const py::dict& d, py::handle overrides) {
  std::string text;
  dict_yaml(d, "", 0, text);
  return PyConfig{parse_config(text, kDictSource, overrides_arg(overrides))};
}

py::dict to_dict(const LongContextConfig& c) {
  const YAML::Node root = YAML::Load(config_to_yaml(c));
  return scalar_value(root).cast<py::dict>();
}

bool is_path(py::handle obj) {
  return py::isinstance<py::str>(obj) || py::hasattr(obj, "__fspath__");
}

std::string path_arg(py::handle obj) {
  py::object p = py::module_::import("os").attr("fspath")(obj);
  if (!py::isinstance<py::str>(p)) throw py::type_error("config path: expected str or os.PathLike of str");
  return p.cast<std::string>();
}

}  // namespace

LongContextConfig config_arg(py::handle obj) {
  if (obj.is_none()) return parse_config("", "<defaults>");
  if (py::isinstance<PyConfig>(obj)) return obj.cast<const PyConfig&>().config;
  if (is_path(obj)) return load_config_file(path_arg(obj));
  if (py::isinstance<py::dict>(obj)) return from_dict(obj.cast<py::dict>(), py::none()).config;
  throw py::type_error(str_cat("config: expected a longctx.Config, a path to a YAML file, a dict or None, got ",
                               std::string(py::str(py::type::handle_of(obj).attr("__name__")))));
}

void bind_config(py::module_& m) {
  py::class_<PyConfig> cls(m, "Config",
                           "A validated longctx configuration (docs/config.md). Build it with Config() "
                           "(defaults), Config.load(path), Config.from_dict(d) or Config.from_yaml(text).");
  cls.def(py::init([] { return PyConfig{parse_config("", "<defaults>")}; }))
      .def_static(
          "load",
          [](py::handle path, py::handle overrides) {
            return PyConfig{load_config_file(path_arg(path), overrides_arg(overrides))};
          },
          py::arg("path"), py::arg("overrides") = py::none(),
          "Loads a YAML file; overrides are 'key=value' / 'section.key=value' strings.")
      .def_static("from_dict", &from_dict, py::arg("d"), py::arg("overrides") = py::none(),
                  "From a dict of the YAML keys (sections as nested dicts); errors name '<dict>' and the key.")
      .def_static(
          "from_yaml",
          [](const std::string& text, py::handle overrides) {
            return PyConfig{parse_config(text, "<string>", overrides_arg(overrides))};
          },
          py::arg("text"), py::arg("overrides") = py::none())
      .def(
          "with_overrides",
          [](const PyConfig& c, py::handle overrides) {
            return PyConfig{parse_config(config_to_yaml(c.config), "<config>", overrides_arg(overrides))};
          },
          py::arg("overrides"), "A copy with 'key=value' overrides applied.")
      .def("to_yaml", [](const PyConfig& c) { return config_to_yaml(c.config); })
      .def("to_dict", [](const PyConfig& c) { return to_dict(c.config); })
      .def("__eq__",
           [](const PyConfig& a, py::handle b) {
             return py::isinstance<PyConfig>(b) && config_to_yaml(a.config) == config_to_yaml(b.cast<const PyConfig&>().config);
           })
      .def("__repr__", [](const PyConfig& c) { return "longctx.Config(\n" + config_to_yaml(c.config) + ")"; })
      .def(py::pickle([](const PyConfig& c) { return config_to_yaml(c.config); },
                      [](const std::string& text) { return PyConfig{parse_config(text, "<pickle>")}; }));
  cls.attr("__hash__") = py::none();

  // Read-only properties of the main keys (everything else: to_dict()).
#define LONGCTX_PROP(name) cls.def_property_readonly(#name, [](const PyConfig& c) { return c.config.name; })
  LONGCTX_PROP(chunk_size);
  LONGCTX_PROP(max_seq_len);
  LONGCTX_PROP(block_size);
  LONGCTX_PROP(local_windows_len);
  LONGCTX_PROP(initial_len);
  LONGCTX_PROP(second_select_num);
  LONGCTX_PROP(threads_num);
  LONGCTX_PROP(representative_num);
  LONGCTX_PROP(dense_layer_num);
  LONGCTX_PROP(preselect_block);
  LONGCTX_PROP(preselect_block_count);
  LONGCTX_PROP(layer_step);
  LONGCTX_PROP(token_step);
  LONGCTX_PROP(dram_budget);
#undef LONGCTX_PROP
  cls.def_property_readonly("kv_type", [](const PyConfig& c) { return std::string(dtype_name(c.config.kv_type)); })
      .def_property_readonly("representative_type",
                             [](const PyConfig& c) { return representative_type_name(c.config.representative_type); })
      .def_property_readonly("head_select_mode",
                             [](const PyConfig& c) { return head_select_mode_name(c.config.head_select_mode); })
      .def_property_readonly("policy", [](const PyConfig& c) { return selection_policy_name(c.config.policy); })
      .def_property_readonly("prefill_kernel",
                             [](const PyConfig& c) { return prefill_kernel_choice_name(c.config.prefill_kernel); })
      .def_property_readonly("model_path", [](const PyConfig& c) { return c.config.model.path; })
      .def_property_readonly("chat_template", [](const PyConfig& c) { return c.config.model.chat_template; });
}

}  // namespace longctx::bindings
