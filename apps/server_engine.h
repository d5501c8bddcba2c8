// longctx-server's engine: one worker thread runs the requests in FIFO
// order, one at a time (a decode step already uses every core), over a cache
// of sequences that keeps each finished request's KV.
//
// Prompt cache: a request whose tokens begin with those held by a cached
// sequence (the same document, a later turn of the same chat) resumes from
// it: the sequence is cut to the whole blocks of the common prefix
// (Sequence::truncate; at least one prompt token is always prefilled, for its
// logits) and only the rest is prefilled. Otherwise a new sequence is made;
// cached sequences leave DRAM least recently used first while their KV
// (slabs reserved) and what the new request needs (its prompt + max_tokens)
// would exceed dram_budget. With a cache directory they go to disk
// (DiskCache) as they leave, and all of them at shutdown; a request that
// shares a longer prefix with a disk entry than with any sequence in DRAM
// loads it (a snapshot read instead of a prefill).
//
// Requests: submit() tokenizes and checks a request, then queues it
// (ApiError 400 if it cannot fit max_seq_len, 503 when the queue is full or
// the server is shutting down). The HTTP thread reads the job's events
// (text, then done or an error); cancel() (the client went away) stops the
// job at its next token, or before its prefill's next chunk.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "longctx/core/backend.h"
#include "longctx/core/config.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"
#include "server_api.h"
#include "server_disk_cache.h"

namespace longctx::server {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, taken from the cache instead of prefilled
  int64_t completion_tokens = 0;
  double prefill_tokens_per_second = 0.0;
  double decode_tokens_per_second = 0.0;
  double attended_fraction = 0.0;  // mean share of the cache a decode step attended exactly
};

struct Event {
  enum Kind { kText, kDone, kError } kind = kText;
  std::string text;           // kText: the next piece of the answer; kError: the message
  std::string finish_reason;  // kDone: stop, length, or cancelled
  Usage usage;                // kDone
  int status = 500;           // kError
};

class Job {
 public:
  // The next event, waiting up to `timeout`; nullopt on timeout.
  std::optional<Event> next(std::chrono::milliseconds timeout);
  // Stops generating at the next token; the job then ends with "cancelled".
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  const CompletionRequest& request() const { return request_; }
  int64_t prompt_tokens() const { return int64_t(prompt_.size()); }

 private:
  friend class Engine;
  void push(Event e);

  CompletionRequest request_;
  std::vector<int32_t> prompt_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
};

struct EngineOptions {
  std::string model_id = "longctx";  // the name /v1/models lists and requests may give
  size_t max_queued = 64;            // requests waiting (not counting the one running); more get 503
  std::string cache_dir;             // empty: no disk cache
  uint64_t cache_bytes = 0;          // its budget
};

// Counters for /metrics, totals since start.
struct Metrics {
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  int64_t cancelled = 0;  // jobs that ended "cancelled"
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  int64_t prefilled_tokens = 0, decoded_tokens = 0;
  uint64_t kv_dram_bytes = 0;  // slabs reserved by the cached sequences
  int64_t cached_sequences = 0;
  uint64_t kv_disk_bytes = 0;  // the disk cache's files
  int64_t disk_sequences = 0;
  int64_t queued = 0;   // waiting
  int64_t running = 0;  // 0 or 1
};

class Engine {
 public:
  // `model` and `backend` outlive the engine. Starts the worker thread.
  Engine(const LongContextConfig& config, model::Model& model, Backend& backend, model::ChatTemplate chat_template,
         EngineOptions options);
  ~Engine();  // shutdown(0)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::shared_ptr<Job> submit(CompletionRequest request);
  // Stops accepting; lets queued and running jobs finish for up to `grace`,
  // then cancels what is left and joins the worker.
  void shutdown(std::chrono::milliseconds grace);
  bool accepting() const { return accepting_.load(); }
  Metrics metrics() const;
  const RequestLimits& limits() const { return limits_; }

 private:
  struct Cached {
    std::unique_ptr<scheduler::Sequence> seq;
    std::vector<int32_t> tokens;  // what its KV holds
    uint64_t last_used = 0;
    bool on_disk = false;  // the disk cache holds exactly these tokens
  };

  std::vector<int32_t> tokenize(const CompletionRequest& request) const;
  void work();
  void run(Job& job);
  // Prefills what the cache lacks and generates; on an exception the caller
  // starts the sequence over.
  void generate(Job& job, Cached& entry, int64_t cached);
  // Ends the job with its done event (finish_reason: stop, length, cancelled).
  void finish(Job& job, const std::string& reason, const Usage& usage);
  // A sequence ready to prefill prompt[cached:]; `cached` is set.
  Cached& take_sequence(const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t& cached);
  uint64_t cache_bytes() const;
  // The cache's sizes into metrics_ (mutex_ held, worker thread).
  void count_cache();
  // A new sequence in the cache, after dropping least recently used ones
  // (to disk) while the cache's KV + need_bytes exceed the budget.
  Cached& new_sequence(uint64_t need_bytes);
  // Writes a sequence to the disk cache unless it is there (or there is none).
  void spill(Cached& c);

  const LongContextConfig config_;
  model::Model& model_;
  Backend& backend_;
  const model::ChatTemplate chat_template_;
  const EngineOptions options_;
  RequestLimits limits_;

  mutable std::mutex mutex_;  // queue_, metrics_, stopping_
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  Metrics metrics_;
  bool stopping_ = false;
  std::atomic<bool> accepting_{true};
  std::shared_ptr<Job> running_;  // under mutex_

  std::vector<std::unique_ptr<Cached>> cache_;  // worker thread only (and shutdown, after it)
  std::unique_ptr<DiskCache> disk_;             // null without --cache-dir
  uint64_t use_clock_ = 0;
  std::thread worker_;
};

}  // namespace longctx::server
