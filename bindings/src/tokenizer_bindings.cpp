// longctx.Tokenizer: the tokenizer of a GGUF file built from its tokenizer.*
// keys alone (model::open_tokenizer), so a vocabulary-only GGUF (no tensors)
// will do and the architecture is not looked at. It tokenizes as
// longctx.Model.tokenize does for the same file.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "longctx/model/tokenizer.h"

namespace longctx::bindings {
namespace {

struct PyTokenizer {
  std::shared_ptr<const model::Tokenizer> tok;  // immutable: shared by copies, used without the GIL
  std::string path;
};

PyTokenizer open_tokenizer(py::handle path) {
  const std::string file = py::str(py::module_::import("os").attr("fspath")(path));
  py::gil_scoped_release nogil;
  return PyTokenizer{std::make_shared<const model::Tokenizer>(model::open_tokenizer(file)), file};
}

std::vector<int32_t> ids_arg(py::handle obj) {
  try {
    return obj.cast<std::vector<int32_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error("ids: expected a list of int32 token ids");
  }
}

}  // namespace

void bind_tokenizer(py::module_& mod) {
  py::class_<PyTokenizer>(mod, "Tokenizer",
                          "The tokenizer of a GGUF file, from its tokenizer.* keys alone: a vocabulary-only GGUF "
                          "(no tensors) will do, whatever its architecture. SentencePiece (tokenizer.ggml.model "
                          "llama) and byte-level BPE (gpt2) with every pre-tokenizer llama.cpp b4747 names.")
      .def(py::init(&open_tokenizer), py::arg("path"),
           "path: the GGUF file (str or os.PathLike). Raises longctx.Error when its tokenizer cannot be built "
           "(an unknown tokenizer.ggml.pre is named).")
      .def(
          "tokenize",
          [](const PyTokenizer& t, const std::string& text, bool add_bos, bool parse_special) {
            py::gil_scoped_release nogil;
            return t.tok->encode(text, add_bos, parse_special);
          },
          py::arg("text"), py::arg("add_bos") = true, py::arg("parse_special") = true,
          "Token ids of text, as longctx.Model.tokenize: add_bos adds BOS (and EOS) where the vocabulary asks; "
          "parse_special matches control tokens such as <s> in the text. llama.cpp's tokenizer tests use "
          "add_bos=False, parse_special=False.")
      .def(
          "detokenize", [](const PyTokenizer& t, py::handle ids) { return utf8(t.tok->decode(ids_arg(ids))); },
          py::arg("ids"), "The text of ids (control tokens print nothing).")
      .def(
          "token_text", [](const PyTokenizer& t, int32_t id) { return utf8(t.tok->token_to_piece(id)); },
          py::arg("id"), "The text of one token ('' for control tokens; a partial UTF-8 character is replaced).")
      .def(
          "token_bytes", [](const PyTokenizer& t, int32_t id) { return py::bytes(t.tok->token_to_piece(id)); },
          py::arg("id"))
      .def("is_end_of_generation", [](const PyTokenizer& t, int32_t id) { return t.tok->is_end_of_generation(id); },
           py::arg("id"))
      .def_property_readonly("bos", [](const PyTokenizer& t) { return t.tok->bos(); })
      .def_property_readonly("eos", [](const PyTokenizer& t) { return t.tok->eos(); })
      .def_property_readonly("n_vocab", [](const PyTokenizer& t) { return t.tok->n_vocab(); })
      .def_property_readonly(
          "kind", [](const PyTokenizer& t) { return t.tok->vocab().kind == model::TokenizerKind::kSpm ? "spm" : "bpe"; },
          "'spm' (tokenizer.ggml.model llama) or 'bpe' (gpt2).")
      .def_property_readonly(
          "pre_tokenizer",
          [](const PyTokenizer& t) -> py::object {
            if (t.tok->vocab().kind != model::TokenizerKind::kBpe) return py::none();
            return py::str(model::pre_tokenizer_info(t.tok->vocab().pre).name);
          },
          "The pre-tokenizer type of a BPE vocabulary by its main name ('deepseek-r1-qwen' reads as 'qwen2'); "
          "None for SentencePiece.")
      .def_property_readonly("path", [](const PyTokenizer& t) { return t.path; })
      .def("__repr__", [](const PyTokenizer& t) {
        return "<longctx.Tokenizer " + t.path + ": " + std::to_string(t.tok->n_vocab()) + " tokens>";
      });
}

}  // namespace longctx::bindings
