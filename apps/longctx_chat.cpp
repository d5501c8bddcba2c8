// longctx-chat: talk to a local GGUF model about a long document. One-shot
// with --prompt, an interactive multi-turn chat otherwise; see kUsage.
#include <signal.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat_output.h"
#include "chat_session.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"
#include "longctx/cpu/attention.h"
#include "backend_choice.h"
#include "longctx/kvstore/snapshot.h"
#include "longctx/model/llama.h"
#include "longctx/model/sampler.h"
#include "longctx/scheduler/sequence.h"

namespace {

using namespace longctx;

constexpr const char* kUsage =
    "usage: longctx-chat [--config X.yaml] [--model FILE.gguf] [--prompt-file DOC.txt] [--prompt TEXT]\n"
    "                    [--set KEY=VALUE]... [--raw] [--max-tokens N] [--temperature T]\n"
    "                    [--save-kv FILE] [--load-kv FILE]\n"
    "\n"
    "Chat with a GGUF model (model.path in the config, or --model) about a document.\n"
    "With --prompt it answers once and exits; otherwise it reads one question per line\n"
    "from stdin (an empty line is skipped; /exit or end of input quits), every turn\n"
    "appending to the same KV cache, so the document is prefilled only once.\n"
    "\n"
    "  --config X.yaml     long-context, model and sampling keys (docs/config.md)\n"
    "  --set KEY=VALUE     override a config key (repeatable), e.g. --set max_seq_len=32768\n"
    "  --model FILE        the GGUF model (overrides model.path)\n"
    "  --prompt-file F     the document: placed at the start of the first user message,\n"
    "                      a blank line before the first question\n"
    "  --prompt TEXT       the question (may be empty: the document alone is the prompt)\n"
    "  --raw               no chat template: the text as is (model.chat_template=raw)\n"
    "  --max-tokens N      answer length limit (sampling.max_tokens)\n"
    "  --temperature T     0 = greedy, reproducible (sampling.temperature)\n"
    "  --save-kv FILE      after prefilling the document, write the KV cache and chat\n"
    "                      state to FILE (atomically), then go on\n"
    "  --load-kv FILE      start from such a snapshot instead of prefilling a document\n"
    "                      (same model, chat template, system prompt and KV layout;\n"
    "                      not with --prompt-file or --save-kv)\n"
    "\n"
    "The answer streams to stdout; prefill progress and, after each answer, a stats line\n"
    "(prefill and decode tokens/s, KV memory, share of the cache attended per decode\n"
    "step) go to stderr. Ctrl-C stops the current answer (the chat goes on; with --prompt\n"
    "it exits with status 130); twice in a row (at the prompt too), or during a prefill,\n"
    "quits with status 130; during --save-kv, once the snapshot is written. Errors print\n"
    "a message and exit with status 1.\n";

struct Args {
  std::string config_path, model_path, prompt_file, save_kv, load_kv;
  std::optional<std::string> prompt;
  std::vector<std::string> overrides;
  bool raw = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string> flag_overrides;  // applied after --set: the dedicated flags win
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--config") a.config_path = value();
    else if (flag == "--model") a.model_path = value();
    else if (flag == "--prompt-file") a.prompt_file = value();
    else if (flag == "--prompt") a.prompt = value();
    else if (flag == "--set") a.overrides.push_back(value());
    else if (flag == "--raw") a.raw = true;
    else if (flag == "--max-tokens") flag_overrides.push_back("sampling.max_tokens=" + value());
    else if (flag == "--temperature") flag_overrides.push_back("sampling.temperature=" + value());
    else if (flag == "--save-kv") a.save_kv = value();
    else if (flag == "--load-kv") a.load_kv = value();
    else if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "' (see --help)");
    }
  }
  a.overrides.insert(a.overrides.end(), flag_overrides.begin(), flag_overrides.end());
  if (!a.load_kv.empty() && !a.prompt_file.empty())
    fail(ErrorCode::kInvalidArgument, "--load-kv and --prompt-file: the snapshot already holds its document; "
         "give one of them");
  if (!a.load_kv.empty() && !a.save_kv.empty())
    fail(ErrorCode::kInvalidArgument, "--load-kv and --save-kv: --save-kv saves the document's prefill, which a "
         "loaded snapshot skips (the snapshot is that save); give one of them");
  return a;
}

// ---- Ctrl-C ---------------------------------------------------------------------

std::atomic<bool> g_interrupted{false};

std::atomic<bool> g_saving{false};  // a --save-kv in progress, which quits once done

extern "C" void on_sigint(int) {
  // A second Ctrl-C before the first was handled: quit now.
  if (g_interrupted.exchange(true) && !g_saving.load()) _exit(130);
}

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a Ctrl-C at the prompt interrupts the read
  sigaction(SIGINT, &sa, nullptr);
}

struct Interrupted {  // thrown from the prefill progress callback, and after a save
  const char* when;
};

// ---- the chat ---------------------------------------------------------------------

enum class StopReason { kEnd, kMaxTokens, kInterrupted, kContextFull };

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEnd: return "end of generation";
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kInterrupted: return "interrupted";
    case StopReason::kContextFull: return "max_seq_len reached";
  }
  return "?";
}

class Chat {
 public:
  Chat(const LongContextConfig& config, model::Model& model, scheduler::Sequence& seq, model::ChatTemplate tmpl,
       bool interactive)
      : config_(config),
        model_(model),
        seq_(seq),
        conversation_(tmpl, config.model.system_prompt),
        sampler_(model::SamplerParams{config.sampling.temperature, config.sampling.top_k, config.sampling.top_p,
                                      static_cast<uint64_t>(config.sampling.seed)}),
        interactive_(interactive) {}

  // The document (may be empty), prefilled; with a snapshot path, saved after.
  void prefill_context(const std::string& document, const std::optional<std::string>& first_question,
                       const std::string& save_path) {
    const std::string text = conversation_.context(document);
    const std::vector<int32_t> tokens = encode(text, /*first=*/true);
    // With the question known, refuse a prompt that cannot fit before prefilling anything.
    int64_t question_tokens = 0;
    if (first_question) {
      Conversation probe = conversation_;
      question_tokens = static_cast<int64_t>(encode(probe.question(*first_question), tokens.empty()).size());
    }
    if (const std::string p = too_long(static_cast<int64_t>(tokens.size()), question_tokens); !p.empty())
      fail(ErrorCode::kInvalidArgument, p);
    if (!tokens.empty()) last_logits_ = prefill(tokens);
    if (!save_path.empty()) {
      const std::string fingerprint =
          chat::snapshot_fingerprint(model_.fingerprint(), conversation_.state(seq_.n_past()));
      // Ctrl-C does not cut a save short (_exit would leave its temporary
      // file): the save completes, then the chat quits.
      g_saving.store(true);
      kvstore::save_snapshot(seq_.store(), save_path, fingerprint);
      g_saving.store(false);
      if (g_interrupted.load()) throw Interrupted{"during --save-kv, after it completed"};
      std::fprintf(stderr, "saved the KV cache of %lld context tokens to %s\n",
                   static_cast<long long>(seq_.n_past()), save_path.c_str());
    }
  }

  void load_context(const std::string& path) {
    const std::string stored = kvstore::read_snapshot_fingerprint(path);
    const chat::SnapshotChatState state =
        chat::check_snapshot_fingerprint(path, stored, model_.fingerprint(), conversation_.chat_template(),
                                         config_.model.system_prompt);
    kvstore::load_snapshot(seq_.store(), path, stored, kvstore::LoadMode::kRead, /*equal_layers=*/true);
    seq_.sync_with_store();
    if (seq_.n_past() != state.context_tokens)
      fail(ErrorCode::kCorrupt, "--load-kv ", path, ": the snapshot holds ", seq_.n_past(),
           " tokens but its chat state says ", state.context_tokens);
    conversation_.context(state.has_document ? "document" : "");
    std::fprintf(stderr, "loaded the KV cache of %lld context tokens from %s (no prefill)\n",
                 static_cast<long long>(seq_.n_past()), path.c_str());
  }

  // Answers one question. A question that does not fit is an error in
  // one-shot mode; in a chat it is reported and the session stays as it was.
  // Returns why generation stopped.
  StopReason answer(const std::string& question) {
    Conversation next = conversation_;
    const std::vector<int32_t> tokens = encode(next.question(question), seq_.n_past() == 0);
    if (const std::string p = too_long(0, static_cast<int64_t>(tokens.size())); !p.empty()) {
      if (!interactive_) fail(ErrorCode::kInvalidArgument, p);
      std::fprintf(stderr, "longctx-chat: %s\n", p.c_str());
      return StopReason::kEnd;
    }
    if (turns_ > 0) seq_.reset_stats();  // the first turn's stats include the document's prefill
    std::vector<float> logits;
    if (!tokens.empty()) {
      logits = prefill(tokens);
    } else if (!last_logits_.empty()) {
      logits = std::move(last_logits_);  // the document alone is the prompt
    } else {
      fail(ErrorCode::kInvalidArgument, "nothing to answer: the prompt is empty");
    }
    last_logits_.clear();
    conversation_ = std::move(next);
    ++turns_;

    // Generate, streaming whole UTF-8 characters. A Ctrl-C since the prefill's
    // last progress call stops the answer before its first token: it is not
    // cleared here (read_line clears it when a question is read).
    chat::Utf8Stream out(stdout);
    std::string answer_text;
    int64_t generated = 0;
    StopReason reason = StopReason::kMaxTokens;
    const model::Tokenizer& tok = model_.tokenizer();
    while (generated < config_.sampling.max_tokens) {
      if (g_interrupted.load()) {
        reason = StopReason::kInterrupted;
        break;
      }
      const int32_t id = sampler_.sample(logits);
      if (tok.is_end_of_generation(id)) {
        reason = StopReason::kEnd;
        break;
      }
      const std::string piece = tok.token_to_piece(id);
      out.write(piece);
      answer_text += piece;
      ++generated;
      // The last token needs its KV only if another turn may follow.
      const bool last = generated == config_.sampling.max_tokens;
      if (seq_.n_past() >= config_.max_seq_len) {
        reason = StopReason::kContextFull;
        break;
      }
      if (!last || interactive_) logits = seq_.decode(id);
    }
    out.finish();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (reason == StopReason::kInterrupted) std::fprintf(stderr, "[interrupted]\n");
    g_interrupted.store(false);
    conversation_.answer(answer_text);
    print_stats(generated, reason);
    return reason;
  }

 private:
  using Conversation = chat::Conversation;

  std::vector<int32_t> encode(const std::string& text, bool first) const {
    const bool bos = first && !conversation_.template_writes_bos() && model_.tokenizer().vocab().add_bos;
    if (text.empty() && !bos) return {};
    std::vector<int32_t> tokens = model_.tokenizer().encode(text, bos, /*parse_special=*/true);
    // SPM's space prefix belongs at the start of the text only: a segment that
    // continues the sequence drops the bare "▁" it put first, as one
    // tokenization of the whole conversation would have no such token.
    const model::Vocab& vocab = model_.tokenizer().vocab();
    if (!first && vocab.kind == model::TokenizerKind::kSpm && vocab.add_space_prefix && !tokens.empty() &&
        vocab.tokens[size_t(tokens.front())] == "\xE2\x96\x81")
      tokens.erase(tokens.begin());
    return tokens;
  }

  // Empty when the tokens fit in max_seq_len, else the message.
  std::string too_long(int64_t context_tokens, int64_t question_tokens) const {
    const int64_t total = seq_.n_past() + context_tokens + question_tokens;
    if (total <= config_.max_seq_len) return {};
    return str_cat("the prompt is too long: ", total, " tokens (", seq_.n_past(), " already in the cache + ",
                   context_tokens, " of document + ", question_tokens, " of question) > max_seq_len ",
                   config_.max_seq_len, "; raise it with --set max_seq_len=", total + 1024,
                   " (the KV store needs DRAM for it: dram_budget)");
  }

  std::vector<float> prefill(const std::vector<int32_t>& tokens) {
    scheduler::PrefillOptions options;
    std::optional<chat::Progress> progress;
    if (tokens.size() > 512) progress.emplace(stderr, static_cast<int64_t>(tokens.size()));
    options.progress = [&](int64_t done, int64_t total) {
      if (g_interrupted.load()) throw Interrupted{"during prefill"};
      if (progress) progress->update(done, total);
    };
    std::vector<float> logits = seq_.prefill(tokens, options);
    if (progress) progress->finish();
    return logits;
  }

  void print_stats(int64_t generated, StopReason reason) const {
    const scheduler::SequenceStats& st = seq_.stats();
    const kvstore::MemoryStats mem = seq_.store().memory_stats();
    std::fprintf(stderr,
                 "[stats] answer %lld tokens (%s) | prefill %lld tokens, %.1f tokens/s | decode %lld tokens, "
                 "%.1f tokens/s | KV %s for %lld tokens | attended %.2f%% of the cache per step\n",
                 static_cast<long long>(generated), stop_reason_name(reason),
                 static_cast<long long>(st.prefill_tokens), st.prefill_tokens_per_second(),
                 static_cast<long long>(st.decode_tokens), st.decode_tokens_per_second(),
                 chat::format_bytes(mem.used_bytes).c_str(), static_cast<long long>(seq_.n_past()),
                 100.0 * st.mean_attended_fraction());
    if (config_.speculate && st.speculated_selections + st.fresh_selections > 0)
      std::fprintf(stderr, "[stats] speculative selection: %lld of %lld select steps reused the last selection\n",
                   static_cast<long long>(st.speculated_selections),
                   static_cast<long long>(st.speculated_selections + st.fresh_selections));
    if (st.tail_steps > 0)  // tail: estimate
      std::fprintf(stderr, "[stats] the unselected blocks' estimate carried %.2f%% of the attention mass per step\n",
                   100.0 * st.mean_tail_mass());
    std::fflush(stderr);
  }

  const LongContextConfig& config_;
  model::Model& model_;
  scheduler::Sequence& seq_;
  Conversation conversation_;
  model::Sampler sampler_;
  bool interactive_;
  int turns_ = 0;
  std::vector<float> last_logits_;  // of the context's last token, until the first answer
};

// One line of stdin without its newline; nullopt at end of input. A Ctrl-C at
// the prompt gives an empty line and stays pending, so that a second one
// quits (on_sigint); a line read clears it.
std::optional<std::string> read_line() {
  char* buf = nullptr;
  size_t cap = 0;
  errno = 0;
  const ssize_t n = getline(&buf, &cap, stdin);
  std::optional<std::string> line;
  if (n >= 0) {
    g_interrupted.store(false);
    line = std::string(buf, size_t(n));
    while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
  } else if (errno == EINTR) {
    clearerr(stdin);
    std::fputs("\n(Ctrl-C again to quit, or type a question)\n", stderr);
    line = std::string();
  }
  std::free(buf);
  return line;
}

model::ChatTemplate choose_template(const Args& a, const LongContextConfig& config, const model::Model& m) {
  if (a.raw) return model::ChatTemplate::kRaw;
  if (config.model.chat_template == "auto") return model::detect_chat_template(m.tokenizer().vocab());
  return model::parse_chat_template(config.model.chat_template);
}

int run(const Args& a) {
  const LongContextConfig config = a.config_path.empty() ? parse_config("", "<defaults>", a.overrides)
                                                         : load_config_file(a.config_path, a.overrides);
  const std::string model_path = a.model_path.empty() ? config.model.path : a.model_path;
  if (model_path.empty())
    fail(ErrorCode::kInvalidArgument, "no model: set model.path in the config or pass --model FILE.gguf");
  std::string document;
  if (!a.prompt_file.empty()) {
    const std::vector<std::byte> bytes = read_file(a.prompt_file);
    document.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::optional<tbb::global_control> threads;
  if (config.threads_num > 0) threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(config.threads_num));

  const apps::ChosenBackend chosen = apps::choose_backend(config.model);
  Backend& backend = *chosen.backend;
  const auto model = model::Model::open(model_path, backend);
  const model::ChatTemplate tmpl = choose_template(a, config, *model);
  const scheduler::TransformerSpec& spec = model->spec();
  std::fprintf(stderr, "model: %s (%s, %d layers, %d/%d heads, vocab %lld), template %s, policy %s, backend %s\n",
               model_path.c_str(), spec.arch.c_str(), spec.n_layers, spec.n_heads, spec.n_kv_heads,
               static_cast<long long>(spec.n_vocab), model::chat_template_name(tmpl),
               selection_policy_name(config.policy), chosen.description.c_str());

  scheduler::Sequence seq(backend, model->transformer(), config);
  if (backend.device_attention() && !seq.uses_device_attention())
    std::fprintf(stderr, "attention: on the CPU, not the GPU: %s\n", seq.device_declined().c_str());
  if (!seq.uses_device_attention())
    std::fprintf(stderr, "prefill attention: %s products on the CPU (%s)\n", cpu::prefill_kernel_name(seq.prefill_kernel()),
                 cpu::prefill_kernel_engine(seq.prefill_kernel()).c_str());
  if (config.kv_type == DType::kQ8_0)
    std::fprintf(stderr, "q8_0 KV: decode attention on %s\n", cpu::q8_decode_kernel_description());
  const bool interactive = !a.prompt.has_value();
  Chat chat(config, *model, seq, tmpl, interactive);
  install_sigint_handler();
  if (!a.load_kv.empty()) chat.load_context(a.load_kv);
  else chat.prefill_context(document, a.prompt, a.save_kv);

  if (!interactive) {
    // The question on stderr so that stdout holds the answer alone (for scripts).
    if (!a.prompt->empty()) std::fprintf(stderr, "question: %s\n", a.prompt->c_str());
    // A script sees a cut-off answer: 130, as a Ctrl-C that quits.
    return chat.answer(*a.prompt) == StopReason::kInterrupted ? 130 : 0;
  }
  const bool tty = isatty(fileno(stdin)) != 0;
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    const std::optional<std::string> line = read_line();
    if (!line || *line == "/exit" || *line == "/quit") break;
    if (line->find_first_not_of(" \t") == std::string::npos) continue;
    chat.answer(*line);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const Interrupted& interrupted) {
    std::fprintf(stderr, "\nlongctx-chat: interrupted %s\n", interrupted.when);
    return 130;
  } catch (const std::exception& e) {  // longctx::Error included
    std::fprintf(stderr, "longctx-chat: %s\n", e.what());
    return 1;
  }
}
