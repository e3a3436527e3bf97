// tandem.Tokenizer: the tokenizers `tandem tokenize` encodes with (SentencePiece .model files,
// Hugging Face tokenizer.json of GPT-2's, Llama 3's and Llama 2's kinds), from Python.
#include "tandem/data/tokenizer.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"

namespace tandem::python {

void bind_tokenizer(py::module_& m) {
  using data::Tokenizer;
  py::class_<Tokenizer>(m, "Tokenizer",
                        "A tokenizer `tandem tokenize` and `tandem sample` use: a SentencePiece "
                        ".model file, or a Hugging Face tokenizer.json (GPT-2's or Llama 3's "
                        "byte-level BPE, Llama 2's SentencePiece BPE). A missing or malformed "
                        "file raises tandem.Error naming it.")
      .def(py::init([](const py::object& path) {
             return Tokenizer::load(
                 py::module_::import("os").attr("fspath")(path).cast<std::string>());
           }),
           py::arg("path"), "Loads the tokenizer at `path` (a .json path: tokenizer.json).")
      .def(
          "encode",
          [](const Tokenizer& t, const std::string& text, bool document_start) {
            py::gil_scoped_release nogil;
            return t.encode(text, document_start ? Tokenizer::Start::kDocument
                                                 : Tokenizer::Start::kAfterLineEnd);
          },
          py::arg("text"), py::arg("document_start") = true,
          "The ids of `text` (no bos or eos added: bos_id and eos_id say which to put around a "
          "document). document_start=False encodes text that continues a document after a line "
          "end (Llama 2's tokenizers put their '▁' prefix before a document only).")
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids) {
            std::string text;
            {
              py::gil_scoped_release nogil;
              text = t.decode(ids);
            }
            // Ids cut inside a character decode to part of its bytes: shown as U+FFFD.
            return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(
                text.data(), static_cast<py::ssize_t>(text.size()), "replace"));
          },
          py::arg("ids"),
          "The text of `ids` (bos and eos decode to nothing; bytes that are not whole UTF-8 "
          "characters as U+FFFD).")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("eos_id", &Tokenizer::eos_id,
                             "The id appended after each document; -1: none.")
      .def_property_readonly("bos_id", &Tokenizer::bos_id,
                             "The id put before each document; -1: none.")
      .def_property_readonly("sha256", &Tokenizer::sha256, "The tokenizer file's SHA-256.")
      .def_property_readonly("source", &Tokenizer::source, "The file it was loaded from.")
      .def("__repr__", [](const Tokenizer& t) {
        return "<tandem.Tokenizer '" + t.source() + "', " + std::to_string(t.vocab_size()) +
               " tokens>";
      });
}

}  // namespace tandem::python
