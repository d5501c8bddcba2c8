// longctx-server: an OpenAI-compatible HTTP server over one GGUF model, with
// a prompt cache (a document prefilled once answers many questions) and a
// chat page at /. See kUsage; the engine is server_engine.h, the API's
// parsing server_api.h.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "backend_choice.h"
#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/core/flag.h"
#include "longctx/model/llama.h"
#include "server_api.h"
#include "server_engine.h"

namespace longctx::server {
extern const char* const kChatPage;  // server_page.cpp, generated from server_page.html
}

namespace {

using namespace longctx;
using namespace longctx::server;
using json = nlohmann::json;

constexpr const char* kUsage =
    "usage: longctx-server [--config X.yaml] [--model FILE.gguf] [--set KEY=VALUE]...\n"
    "                      [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
    "                      [--max-queued 64] [--max-body-bytes 32MiB] [--grace-seconds 10]\n"
    "                      [--cache-dir DIR] [--cache-bytes 16GiB]\n"
    "\n"
    "Serves the model (model.path in the config, or --model) over an OpenAI-compatible API:\n"
    "  POST /v1/chat/completions, POST /v1/completions (stream: server-sent events),\n"
    "  GET /v1/models, GET /health, GET /metrics (Prometheus), and a chat page at /.\n"
    "A request whose prompt begins with an earlier request's tokens (the same document)\n"
    "prefills only the rest: usage.prompt_tokens_details.cached_tokens says how many came\n"
    "from the cache. Requests run one at a time in arrival order; --max-queued more wait,\n"
    "beyond that the answer is 503 with Retry-After.\n"
    "\n"
    "  --config X.yaml       long-context, model and sampling keys (docs/config.md);\n"
    "                        sampling.* are the defaults of requests that leave them out\n"
    "  --set KEY=VALUE       override a config key (repeatable)\n"
    "  --model FILE          the GGUF model (overrides model.path)\n"
    "  --host H              address to listen on (127.0.0.1: this machine only)\n"
    "  --port P              0 picks a free port (printed)\n"
    "  --api-key KEY         /v1/* and /metrics require 'Authorization: Bearer KEY'\n"
    "  --max-queued N        requests waiting beyond the running one\n"
    "  --max-body-bytes N    larger request bodies get 413 (units as dram_budget: 64MiB)\n"
    "  --cache-dir DIR       keep the prompt cache's sequences on disk as they leave DRAM\n"
    "                        and at exit (KV snapshots); a restart reads them back\n"
    "  --cache-bytes N       the disk cache's budget, least recently used out first\n"
    "  --grace-seconds S     on SIGTERM/SIGINT: stop accepting, let running and queued\n"
    "                        requests finish for S seconds, cancel the rest, exit 0\n";

struct Args {
  std::string config_path, model_path, host = "127.0.0.1", api_key, cache_dir;
  uint64_t cache_bytes = uint64_t{16} << 30;
  std::vector<std::string> overrides;
  int port = 8080;
  size_t max_queued = 64;
  size_t max_body_bytes = size_t{32} << 20;
  double grace_seconds = 10.0;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--config") a.config_path = value();
    else if (flag == "--model") a.model_path = value();
    else if (flag == "--set") a.overrides.push_back(value());
    else if (flag == "--host") a.host = value();
    else if (flag == "--port") a.port = int(parse_int_flag(flag, value(), 0, 65535));
    else if (flag == "--api-key") a.api_key = value();
    else if (flag == "--max-queued") a.max_queued = size_t(parse_int_flag(flag, value(), 0, 1 << 20));
    else if (flag == "--max-body-bytes") a.max_body_bytes = size_t(parse_byte_count(value(), flag));
    else if (flag == "--cache-dir") a.cache_dir = value();
    else if (flag == "--cache-bytes") a.cache_bytes = parse_byte_count(value(), flag);
    else if (flag == "--grace-seconds") a.grace_seconds = double(parse_int_flag(flag, value(), 0, 3600));
    else if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "' (see --help)");
    }
  }
  return a;
}

std::string model_id_of(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? "longctx" : name;
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "") {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "5");
  res.set_content(error_body(status, message, param), "application/json");
}

// Compares in time that depends on the lengths only, not on where the texts differ.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  return diff == 0;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// longctx's own numbers next to usage (as llama-server's "timings").
json timings_json(const Usage& u) {
  return {{"prefill_tokens_per_second", u.prefill_tokens_per_second},
          {"decode_tokens_per_second", u.decode_tokens_per_second},
          {"attended_fraction", u.attended_fraction},
          {"cached_tokens", u.cached_tokens}};
}

// Counts of answered requests by path and status, for /metrics. Only the
// server's own paths are labels, every other one counts as "other": a label
// taken from the request would let a client add series without bound, and
// write lines of its own into /metrics through quotes and newlines.
class RequestCounts {
 public:
  void add(const std::string& path, int status) {
    static constexpr std::array<const char*, 6> kPaths = {"/", "/health", "/metrics", "/v1/models",
                                                          "/v1/chat/completions", "/v1/completions"};
    const bool known = std::find(kPaths.begin(), kPaths.end(), path) != kPaths.end();
    std::lock_guard lock(mutex_);
    ++counts_[{known ? path : "other", status}];
  }
  std::map<std::pair<std::string, int>, int64_t> get() const {
    std::lock_guard lock(mutex_);
    return counts_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> counts_;
};

std::string metrics_text(const Metrics& m, const RequestCounts& counts) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    char number[32];
    std::snprintf(number, sizeof number, "%.10g", value);
    out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", number, "\n");
  };
  out += "# HELP longctx_requests_total HTTP requests answered, by path and status.\n"
         "# TYPE longctx_requests_total counter\n";
  for (const auto& [key, n] : counts.get())
    out += str_cat("longctx_requests_total{path=\"", key.first, "\",status=\"", key.second, "\"} ", n, "\n");
  metric("longctx_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", double(m.prompt_tokens));
  metric("longctx_cached_tokens_total", "counter", "Prompt tokens taken from the prompt cache, not prefilled.",
         double(m.cached_tokens));
  metric("longctx_generated_tokens_total", "counter", "Tokens generated.", double(m.generated_tokens));
  metric("longctx_cancelled_requests_total", "counter", "Requests stopped because their client went away (or at shutdown).",
         double(m.cancelled));
  metric("longctx_prefill_tokens_per_second", "gauge", "Prefill rate over every request so far.",
         m.prefill_seconds > 0 ? double(m.prefilled_tokens) / m.prefill_seconds : 0.0);
  metric("longctx_decode_tokens_per_second", "gauge", "Decode rate over every request so far.",
         m.decode_seconds > 0 ? double(m.decoded_tokens) / m.decode_seconds : 0.0);
  metric("longctx_kv_dram_bytes", "gauge", "DRAM reserved by the cached sequences' KV stores.", double(m.kv_dram_bytes));
  metric("longctx_cached_sequences", "gauge", "Sequences kept in the prompt cache in DRAM.", double(m.cached_sequences));
  metric("longctx_kv_disk_bytes", "gauge", "Bytes of the disk cache's files (--cache-dir).", double(m.kv_disk_bytes));
  metric("longctx_disk_sequences", "gauge", "Sequences kept in the disk cache.", double(m.disk_sequences));
  metric("longctx_queue_length", "gauge", "Requests waiting to run.", double(m.queued));
  metric("longctx_requests_running", "gauge", "Requests running (0 or 1).", double(m.running));
  return out;
}

// A response writer that cannot take the server down: an exception (a bug)
// ends this response, cancels its job, and is logged.
template <typename F>
auto guarded(std::shared_ptr<Job> job, F write) {
  return [job, write = std::move(write)](size_t offset, httplib::DataSink& sink) mutable -> bool {
    try {
      return write(offset, sink);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "longctx-server: a response ended early: %s\n", e.what());
      job->cancel();
      return false;
    }
  };
}

// One completion request: parse, queue, and answer as JSON or as events.
class CompletionHandler {
 public:
  CompletionHandler(Engine& engine, bool chat) : engine_(engine), chat_(chat) {}

  void operator()(const httplib::Request& req, httplib::Response& res) const {
    std::shared_ptr<Job> job;
    try {
      job = engine_.submit(parse_completion_request(req.body, chat_, engine_.limits()));
    } catch (const ApiError& e) {
      return send_error(res, e.status(), e.what(), e.param());
    }
    const std::string id = str_cat(chat_ ? "chatcmpl-" : "cmpl-", next_id());
    const int64_t created = int64_t(std::time(nullptr));
    if (job->request().stream) stream(res, job, id, created);
    else answer(res, job, id, created);
  }

 private:
  static int64_t next_id() {
    static std::atomic<int64_t> n{0};
    return ++n;
  }

  json base(const std::string& id, int64_t created, bool chunk) const {
    return {{"id", id},
            {"object", chat_ ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", created},
            {"model", engine_.limits().model_id}};
  }

  // One choice of a stream chunk: text (may be empty) and finish_reason (null until the end).
  json chunk_choice(const std::string& text, const json& finish_reason, bool first) const {
    if (!chat_) return {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    return {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  }

  // Non-streaming: waits for the first event, so that an error before any
  // token gets its own status; then a chunked 200 that writes a space (JSON
  // allows leading whitespace) per token, which is how a client that went
  // away is noticed, and the JSON at the end.
  void answer(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created) const {
    std::optional<Event> first;
    while (!(first = job->next(std::chrono::milliseconds(1000)))) {
    }
    if (first->kind == Event::kError) return send_error(res, first->status, first->text);
    // Cancelled before its first token: the server is shutting down (or nobody is listening).
    if (first->kind == Event::kDone && first->finish_reason == "cancelled")
      return send_error(res, 503, "the request was cancelled: the server is shutting down");
    auto state = std::make_shared<std::pair<std::optional<Event>, std::string>>(std::move(first), std::string());
    res.set_chunked_content_provider(
        "application/json",
        guarded(job, [this, job, state, id, created](size_t, httplib::DataSink& sink) {
          std::string& text = state->second;
          for (;;) {
            std::optional<Event> e = std::move(state->first);
            state->first.reset();
            if (!e) e = job->next(std::chrono::milliseconds(1000));
            if (!e) continue;
            if (e->kind == Event::kText) {
              text += e->text;
              if (!sink.write(" ", 1)) {
                job->cancel();
                return false;
              }
              continue;
            }
            json body = base(id, created, false);
            if (e->kind == Event::kError) {
              body = json::parse(error_body(e->status, e->text));
            } else {
              const json choice =
                  chat_ ? json{{"index", 0},
                               {"message", {{"role", "assistant"}, {"content", text}}},
                               {"logprobs", nullptr},
                               {"finish_reason", e->finish_reason}}
                        : json{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", e->finish_reason}};
              body["choices"] = json::array({choice});
              body["usage"] = usage_json(e->usage);
              body["timings"] = timings_json(e->usage);
            }
            const std::string s = json_text(body);
            sink.write(s.data(), s.size());
            sink.done();
            return true;
          }
        }),
        [job](bool success) {
          if (!success) job->cancel();
        });
  }

  // Streaming: server-sent events, "data: {chunk}\n\n" ... "data: [DONE]\n\n";
  // a comment line every second while waiting (the prefill) notices a client
  // that went away.
  void stream(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created) const {
    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider(
        "text/event-stream",
        guarded(job, [this, job, first, id, created](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string s = "data: " + json_text(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          auto gone = [&] {
            job->cancel();
            return false;
          };
          for (;;) {
            std::optional<Event> e = job->next(std::chrono::milliseconds(1000));
            if (!e) {
              if (!sink.write(": waiting\n\n", 11)) return gone();
              continue;
            }
            if (e->kind == Event::kError) {
              send(json::parse(error_body(e->status, e->text)));
            } else if (e->kind == Event::kText) {
              json chunk = base(id, created, true);
              chunk["choices"] = json::array({chunk_choice(e->text, nullptr, *first)});
              *first = false;
              if (!send(chunk)) return gone();
              continue;
            } else {
              json chunk = base(id, created, true);
              chunk["choices"] = json::array({chunk_choice("", e->finish_reason, *first)});
              chunk["timings"] = timings_json(e->usage);
              if (!send(chunk)) return gone();
              if (job->request().include_usage) {
                json usage = base(id, created, true);
                usage["choices"] = json::array();
                usage["usage"] = usage_json(e->usage);
                if (!send(usage)) return gone();
              }
            }
            sink.write("data: [DONE]\n\n", 14);
            sink.done();
            return true;
          }
        }),
        [job](bool success) {
          if (!success) job->cancel();
        });
  }

  Engine& engine_;
  bool chat_;
};

int run(const Args& a) {
  const LongContextConfig config = a.config_path.empty() ? parse_config("", "<defaults>", a.overrides)
                                                         : load_config_file(a.config_path, a.overrides);
  const std::string model_path = a.model_path.empty() ? config.model.path : a.model_path;
  if (model_path.empty())
    fail(ErrorCode::kInvalidArgument, "no model: set model.path in the config or pass --model FILE.gguf");

  // Signals go to one thread (sigwait below), not to whichever thread runs.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::optional<tbb::global_control> threads;
  if (config.threads_num > 0) threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(config.threads_num));
  const apps::ChosenBackend chosen = apps::choose_backend(config.model);
  const auto model = model::Model::open(model_path, *chosen.backend);
  const model::ChatTemplate tmpl = config.model.chat_template == "auto"
                                       ? model::detect_chat_template(model->tokenizer().vocab())
                                       : model::parse_chat_template(config.model.chat_template);
  EngineOptions options;
  options.model_id = model_id_of(model_path);
  options.max_queued = a.max_queued;
  options.cache_dir = a.cache_dir;
  options.cache_bytes = a.cache_bytes;
  Engine engine(config, *model, *chosen.backend, tmpl, options);

  httplib::Server http;
  // Every waiting request holds a thread (it blocks on its job): room for the
  // queue, the running one, and the cheap endpoints.
  const size_t pool = a.max_queued + 8;
  http.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  http.set_payload_max_length(a.max_body_bytes);
  RequestCounts counts;
  http.set_logger([&](const httplib::Request& req, const httplib::Response& res) { counts.add(req.path, res.status); });
  http.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = str_cat("HTTP ", res.status, " for ", req.method, " ", req.path);
    if (res.status == 404) message = str_cat("no such endpoint: ", req.method, " ", req.path);
    // httplib answers 400 itself, before any route, for what it cannot read.
    if (res.status == 400)
      message = str_cat("cannot read the request ", req.method, " ", req.path, ": malformed request line or headers, ",
                        "or a body with neither Content-Length nor chunked transfer encoding");
    if (res.status == 413) message = str_cat("the request body is larger than ", a.max_body_bytes, " bytes (--max-body-bytes)");
    res.set_content(error_body(res.status, message), "application/json");
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    send_error(res, 500, message);
  });
  http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    const bool guarded = req.path.starts_with("/v1/") || req.path == "/metrics";
    if (!a.api_key.empty() && guarded && !same_secret(req.get_header_value("Authorization"), "Bearer " + a.api_key)) {
      send_error(res, 401, req.has_header("Authorization") ? "invalid API key" : "missing API key: send 'Authorization: Bearer KEY'");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kChatPage, "text/html; charset=utf-8");
  });
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (engine.accepting()) res.set_content(R"({"status":"ok"})", "application/json");
    else send_error(res, 503, "the server is shutting down");
  });
  const int64_t started = int64_t(std::time(nullptr));
  http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json model_entry = {{"id", engine.limits().model_id}, {"object", "model"}, {"created", started},
                              {"owned_by", "longctx"}, {"meta", {{"max_seq_len", config.max_seq_len}}}};
    res.set_content(json_text(json{{"object", "list"}, {"data", json::array({model_entry})}}), "application/json");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(engine.metrics(), counts), "text/plain; version=0.0.4");
  });
  http.Post("/v1/chat/completions", CompletionHandler(engine, true));
  http.Post("/v1/completions", CompletionHandler(engine, false));

  // Debian's libcpp-httplib listens with a backlog of 5 (compiled in). When
  // 36 clients connected at once that overflowed: the kernel fell back to SYN
  // cookies, some of which failed, and those clients got a reset instead of
  // an answer (a 503 when the queue is full). A second listen() on the bound
  // socket raises the backlog; the last socket httplib created is that one.
  int listening_socket = -1;
  http.set_socket_options([&listening_socket](socket_t sock) {
    httplib::default_socket_options(sock);
    listening_socket = sock;
  });
  const int port = a.port == 0 ? http.bind_to_any_port(a.host) : (http.bind_to_port(a.host, a.port) ? a.port : -1);
  if (port < 0) fail(ErrorCode::kIo, "cannot listen on ", a.host, ":", a.port, " (in use, or not an address of this machine)");
  constexpr int kListenBacklog = 1024;
  if (listening_socket < 0 || ::listen(listening_socket, kListenBacklog) != 0)
    std::fprintf(stderr, "longctx-server: warning: could not raise the listen backlog to %d (%s); bursts of "
                 "connections may be reset\n", kListenBacklog, std::strerror(errno));

  std::atomic<bool> listen_done{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "longctx-server: %s: finishing requests (up to %.0f s), then exiting\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", a.grace_seconds);
    engine.shutdown(std::chrono::milliseconds(int64_t(a.grace_seconds * 1000)));
    // httplib 0.11's stop() does nothing until listen_after_bind() has set
    // is_running_: a signal that lands before (during startup) was lost and
    // the server listened forever with SIGTERM/SIGINT blocked in every thread.
    // Repeat stop() until the listening loop has returned.
    while (!listen_done.load()) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::fprintf(stderr, "longctx-server: model %s (%s), template %s, policy %s, backend %s\n", options.model_id.c_str(),
               model->spec().arch.c_str(), model::chat_template_name(tmpl), selection_policy_name(config.policy),
               chosen.description.c_str());
  std::fprintf(stderr, "longctx-server: listening on http://%s:%d\n", a.host.c_str(), port);
  std::fflush(stderr);
  http.listen_after_bind();
  listen_done.store(true);
  if (engine.accepting()) kill(getpid(), SIGTERM);  // listening failed: wake the signal thread
  signal_thread.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-server: %s\n", e.what());
    return 1;
  }
}
