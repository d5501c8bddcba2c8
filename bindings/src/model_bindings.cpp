// longctx.Model: a GGUF model on the CPU backend with one sequence (its KV
// store and decode policy), as longctx-chat runs it: the same tokenization of
// prompt segments, the same sampler, the same decode loop, so greedy
// generate() gives longctx-chat's tokens for the same segments and config.
#include <pybind11/stl.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <optional>

#include "common.h"
#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/model/llama.h"
#include "longctx/model/sampler.h"
#include "longctx/scheduler/sequence.h"
#include "store_handle.h"

namespace longctx::bindings {
namespace {

struct ModelState {
  LongContextConfig config;
  std::unique_ptr<cpu::CpuBackend> backend;  // declared first: destroyed last
  std::unique_ptr<model::Model> model;
  std::unique_ptr<scheduler::Sequence> seq;
  model::ChatTemplate chat_template = model::ChatTemplate::kRaw;
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::vector<float> last_logits;      // of the last token in the cache; empty after reset
  std::vector<int32_t> last_generated; // tokens of the last generate()
  std::string stop_reason;             // of the last generate()
};

struct PyModel {
  std::shared_ptr<ModelState> s;
};

// Runs f without the GIL, holding the model's mutex, with config.threads_num applied.
template <typename F>
auto compute(ModelState& s, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(*s.mutex);
  std::optional<tbb::global_control> threads;
  if (s.config.threads_num > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(s.config.threads_num));
  return f();
}

PyModel open_model(py::handle path, py::handle config) {
  auto s = std::make_shared<ModelState>();
  s->config = config_arg(config);
  std::string file = s->config.model.path;
  if (!path.is_none()) file = py::str(py::module_::import("os").attr("fspath")(path));
  if (file.empty())
    fail(ErrorCode::kInvalidArgument, "Model: no model file: pass a path or set model.path in the config");
  {
    py::gil_scoped_release nogil;
    s->backend = std::make_unique<cpu::CpuBackend>(
        cpu::CpuBackendOptions{.weights = parse_weight_storage(s->config.model.weights).value()});
    s->model = model::Model::open(file, *s->backend);
    const std::string& name = s->config.model.chat_template;
    s->chat_template = name == "auto" ? model::detect_chat_template(s->model->tokenizer().vocab())
                                      : model::parse_chat_template(name);
    s->seq = std::make_unique<scheduler::Sequence>(*s->backend, s->model->transformer(), s->config);
  }
  return PyModel{std::move(s)};
}

// longctx-chat's Chat::encode: BOS only at the start of the sequence, unless
// the text writes it (chat templates do); a continuing segment drops the bare
// SPM space prefix, as one tokenization of the whole text would have none.
std::vector<int32_t> encode_segment(const ModelState& s, const std::string& text) {
  const model::Tokenizer& tok = s.model->tokenizer();
  const model::Vocab& vocab = tok.vocab();
  const bool first = s.seq->n_past() == 0;
  const bool writes_bos = vocab.bos >= 0 && text.rfind(vocab.tokens[size_t(vocab.bos)], 0) == 0;
  const bool bos = first && !writes_bos && vocab.add_bos;
  if (text.empty() && !bos) return {};
  std::vector<int32_t> tokens = tok.encode(text, bos, /*parse_special=*/true);
  if (!first && vocab.kind == model::TokenizerKind::kSpm && vocab.add_space_prefix && !tokens.empty() &&
      vocab.tokens[size_t(tokens.front())] == "\xE2\x96\x81")
    tokens.erase(tokens.begin());
  return tokens;
}

py::array_t<float> to_array(const std::vector<float>& v) {
  py::array_t<float> a = new_f32({int64_t(v.size())});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

std::vector<int32_t> tokens_arg(py::handle obj) {
  try {
    return obj.cast<std::vector<int32_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error("tokens: expected a list of int32 token ids");
  }
}

// Length of the longest prefix of `bytes` that does not end inside a UTF-8
// sequence (what can be shown now; the rest waits for the next piece).
size_t complete_utf8(const std::string& bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

py::str generate(PyModel& m, py::handle prompt, std::optional<int> max_tokens, std::optional<double> temperature,
                 std::optional<int> top_k, std::optional<double> top_p, std::optional<int64_t> seed,
                 bool stop_at_eos, py::handle on_token) {
  ModelState& s = *m.s;
  const SamplingConfig& sc = s.config.sampling;
  const int limit = max_tokens.value_or(sc.max_tokens);
  if (limit < 0) fail(ErrorCode::kInvalidArgument, "generate: max_tokens must be >= 0, got ", limit);
  model::Sampler sampler(model::SamplerParams{temperature.value_or(sc.temperature), top_k.value_or(sc.top_k),
                                              top_p.value_or(sc.top_p), uint64_t(seed.value_or(sc.seed))});
  if (!on_token.is_none() && !PyCallable_Check(on_token.ptr()))
    throw py::type_error("on_token: expected a callable (token_id, text) or None");

  // The prompt: text (tokenized as longctx-chat does), token ids, or nothing (continue).
  std::optional<std::string> text;
  std::vector<int32_t> tokens;
  if (py::isinstance<py::str>(prompt)) text = prompt.cast<std::string>();
  else if (!prompt.is_none()) tokens = tokens_arg(prompt);
  std::vector<float> logits = compute(s, [&] {
    if (text) tokens = encode_segment(s, *text);
    if (!tokens.empty()) s.last_logits = s.seq->prefill(tokens);
    return s.last_logits;
  });
  s.last_generated.clear();
  s.stop_reason = "max_tokens";
  if (limit == 0) return py::str("");  // prefill only
  if (logits.empty())
    fail(ErrorCode::kInvalidArgument, "generate: nothing to continue: the prompt is empty and the cache holds no "
                                      "token (prefill a prompt first)");

  const model::Tokenizer& tok = s.model->tokenizer();
  std::string answer;
  size_t shown = 0;  // bytes of `answer` passed to on_token
  while (int(s.last_generated.size()) < limit) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C
    const int32_t id = sampler.sample(logits);
    if (stop_at_eos && tok.is_end_of_generation(id)) {
      s.stop_reason = "end of generation";
      break;
    }
    answer += tok.token_to_piece(id);
    s.last_generated.push_back(id);
    bool stop = false;
    if (!on_token.is_none()) {
      const size_t end = std::max(shown, complete_utf8(answer));
      py::object r = on_token(id, utf8(answer.substr(shown, end - shown)));
      shown = end;
      stop = r.is(py::bool_(false));
    }
    // The token goes into the cache (a later generate continues after it) unless it is full,
    // checked under the model's mutex with the decode: another thread may fill the cache between.
    bool full = false;
    logits = compute(s, [&] {
      full = s.seq->n_past() >= s.config.max_seq_len;
      if (!full) s.last_logits = s.seq->decode(id);
      return s.last_logits;
    });
    if (full) {
      s.stop_reason = "max_seq_len reached";
      break;
    }
    if (stop) {
      s.stop_reason = "stopped by on_token";
      break;
    }
  }
  return utf8(answer);
}

py::str apply_template(const PyModel& m, py::handle messages, bool add_generation_prompt, py::handle name) {
  const model::ChatTemplate tmpl =
      name.is_none() ? m.s->chat_template : model::parse_chat_template(name.cast<std::string>());
  std::vector<model::ChatMessage> msgs;
  if (!py::isinstance<py::list>(messages) && !py::isinstance<py::tuple>(messages))
    throw py::type_error("messages: expected a list of {'role': str, 'content': str} dicts");
  for (py::handle item : messages) {
    if (!py::isinstance<py::dict>(item) || !item.contains("role") || !item.contains("content") ||
        !py::isinstance<py::str>(item["role"]) || !py::isinstance<py::str>(item["content"]))
      throw py::type_error("messages: every message must be a dict with str 'role' and 'content', got " +
                           std::string(py::repr(item)));
    msgs.push_back({item["role"].cast<std::string>(), item["content"].cast<std::string>()});
  }
  return utf8(model::apply_chat_template(tmpl, msgs, add_generation_prompt));
}

py::dict spec_dict(const scheduler::TransformerSpec& sp) {
  py::dict d;
  d["arch"] = sp.arch;
  d["n_layers"] = sp.n_layers;
  d["n_heads"] = sp.n_heads;
  d["n_kv_heads"] = sp.n_kv_heads;
  d["head_dim"] = sp.head_dim;
  d["n_embd"] = sp.n_embd;
  d["n_ff"] = sp.n_ff;
  d["n_vocab"] = sp.n_vocab;
  d["rms_eps"] = sp.rms_eps;
  d["attn_scale"] = sp.attn_scale;
  d["rope_n_rot"] = sp.rope.n_rot;
  d["rope_theta"] = sp.rope.theta;
  d["rope_style"] = sp.rope.style == RopeStyle::kNeox ? "neox" : "normal";
  d["rope_freq_factors"] = sp.rope.freq_factors;
  d["rope_scaling"] = rope_scaling_name(sp.rope.scaling);
  d["rope_factor"] = sp.rope.factor;
  d["rope_original_context"] = sp.rope.original_context;
  d["rope_attn_factor"] = sp.rope.attn_factor;
  d["rope_magnitude"] = sp.rope.n_rot > 0 ? rope_magnitude(sp.rope) : 1.0f;
  d["qkv_bias"] = sp.qkv_bias;
  d["context_length"] = sp.context_length;
  return d;
}

py::dict stats_dict(ModelState& s) {
  struct Snapshot {
    scheduler::SequenceStats st;
    int64_t n_past;
    uint64_t used;
  };
  const Snapshot snap = compute(s, [&] { return Snapshot{s.seq->stats(), s.seq->n_past(), s.seq->store().memory_stats().used_bytes}; });
  const scheduler::SequenceStats& st = snap.st;
  py::dict d;
  d["prefill_tokens"] = st.prefill_tokens;
  d["prefill_seconds"] = st.prefill_seconds;
  d["prefill_tokens_per_second"] = st.prefill_tokens_per_second();
  d["decode_tokens"] = st.decode_tokens;
  d["decode_seconds"] = st.decode_seconds;
  d["decode_tokens_per_second"] = st.decode_tokens_per_second();
  d["last_attended_fraction"] = st.last_attended_fraction;
  d["mean_attended_fraction"] = st.mean_attended_fraction();
  d["n_past"] = snap.n_past;
  d["kv_used_bytes"] = snap.used;
  d["stop_reason"] = s.stop_reason;
  return d;
}

StoreHandle store_of(const PyModel& m) {
  ModelState* st = m.s.get();
  StoreHandle h;
  h.owner = m.s;
  h.store = &st->seq->store();
  h.mutex = st->mutex;
  h.sequence = st->seq.get();
  h.reset_owner = [st] {
    st->seq->reset();
    st->last_logits.clear();
  };
  h.sync_owner = [st] {
    st->seq->sync_with_store();
    st->last_logits.clear();
  };
  return h;
}

}  // namespace

void bind_model(py::module_& mod) {
  py::class_<PyModel>(mod, "Model",
                      "A GGUF model (Llama, Mistral, Qwen2 families) on the CPU backend with one sequence: its "
                      "tokenizer, chat template, KV store and decode policy, as longctx-chat runs it.")
      .def(py::init(&open_model), py::arg("path") = py::none(), py::arg("config") = py::none(),
           "path: the GGUF file (None: config model.path). config: Config, YAML path, dict or None (defaults).")
      .def(
          "tokenize",
          [](const PyModel& m, const std::string& text, bool add_bos, bool parse_special) {
            py::gil_scoped_release nogil;  // a long document takes a while; the tokenizer is immutable
            return m.s->model->tokenizer().encode(text, add_bos, parse_special);
          },
          py::arg("text"), py::arg("add_bos") = true, py::arg("parse_special") = true,
          "Token ids of text; add_bos adds BOS (and EOS) where the vocabulary asks; parse_special matches "
          "control tokens such as <s> in the text.")
      .def(
          "detokenize", [](const PyModel& m, py::handle ids) { return utf8(m.s->model->tokenizer().decode(tokens_arg(ids))); },
          py::arg("ids"))
      .def(
          "token_text", [](const PyModel& m, int32_t id) { return utf8(m.s->model->tokenizer().token_to_piece(id)); },
          py::arg("id"), "The text of one token ('' for control tokens; a partial UTF-8 character is replaced).")
      .def(
          "token_bytes", [](const PyModel& m, int32_t id) { return py::bytes(m.s->model->tokenizer().token_to_piece(id)); },
          py::arg("id"))
      .def_property_readonly("eos", [](const PyModel& m) { return m.s->model->tokenizer().eos(); })
      .def_property_readonly("bos", [](const PyModel& m) { return m.s->model->tokenizer().bos(); })
      .def_property_readonly("n_vocab", [](const PyModel& m) { return m.s->model->tokenizer().n_vocab(); })
      .def_property_readonly("n_layers", [](const PyModel& m) { return m.s->model->spec().n_layers; })
      .def_property_readonly("spec", [](const PyModel& m) { return spec_dict(m.s->model->spec()); })
      .def_property_readonly("fingerprint", [](const PyModel& m) { return m.s->model->fingerprint(); })
      .def_property_readonly("config", [](const PyModel& m) { return PyConfig{m.s->config}; })
      .def_property_readonly("chat_template",
                             [](const PyModel& m) { return model::chat_template_name(m.s->chat_template); })
      .def("is_end_of_generation", [](const PyModel& m, int32_t id) { return m.s->model->tokenizer().is_end_of_generation(id); },
           py::arg("id"))
      .def("apply_chat_template", &apply_template, py::arg("messages"), py::arg("add_generation_prompt") = true,
           py::arg("template") = py::none(),
           "The prompt text of messages ([{'role', 'content'}]) in the model's chat template (or `template`: "
           "raw, llama2, llama3, chatml, internlm2). It holds BOS where the template writes it.")
      .def(
          "prefill",
          [](PyModel& m, py::handle tokens) {
            const std::vector<int32_t> t = tokens_arg(tokens);
            ModelState& s = *m.s;
            return to_array(compute(s, [&] { return s.last_logits = s.seq->prefill(t); }));
          },
          py::arg("tokens"), "Appends tokens at n_past; returns the logits of the last one, f32 [n_vocab].")
      .def(
          "decode",
          [](PyModel& m, int32_t token) {
            ModelState& s = *m.s;
            return to_array(compute(s, [&] { return s.last_logits = s.seq->decode(token); }));
          },
          py::arg("token"), "Appends one token; returns the logits that follow it.")
      .def_property_readonly("n_past",
                             [](const PyModel& m) {
                               ModelState& s = *m.s;  // prefill/decode in another thread write it, under the mutex
                               return compute(s, [&] { return s.seq->n_past(); });
                             })
      .def("reset",
           [](PyModel& m) {
             ModelState& s = *m.s;
             compute(s, [&] {
               s.seq->reset();
               s.last_logits.clear();
               return 0;
             });
           },
           "Drops every token of the sequence (stats are kept).")
      .def("generate", &generate, py::arg("prompt") = py::none(), py::arg("max_tokens") = py::none(),
           py::arg("temperature") = py::none(), py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
           py::arg("seed") = py::none(), py::arg("stop_at_eos") = true, py::arg("on_token") = py::none(),
           "Prefills `prompt` after what the cache holds (str: tokenized as longctx-chat does, BOS at the start "
           "of the sequence; list: token ids; None: continue) and generates up to max_tokens tokens with the "
           "config's sampling unless overridden (temperature 0 = greedy). on_token(id, text) is called per token; "
           "returning False stops. Generated tokens stay in the cache. Returns the text.")
      .def_property_readonly("last_generated_tokens", [](const PyModel& m) { return m.s->last_generated; })
      .def_property_readonly("stats", [](PyModel& m) { return stats_dict(*m.s); })
      .def_property_readonly("store", &store_of, "The sequence's KVStore (written by the model only).");
}

}  // namespace longctx::bindings
