#include "server_engine.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "chat_session.h"
#include "longctx/core/error.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/model/sampler.h"

namespace longctx::server {
namespace {

struct Cancelled {};  // thrown from the prefill progress callback

}  // namespace

std::optional<Event> Job::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Job::push(Event e) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(e));
  }
  ready_.notify_all();
}

Engine::Engine(const LongContextConfig& config, model::Model& model, Backend& backend,
               model::ChatTemplate chat_template, EngineOptions options)
    : config_(config), model_(model), backend_(backend), chat_template_(chat_template), options_(options) {
  limits_.model_id = options.model_id;
  if (!options.cache_dir.empty()) {
    const kvstore::StoreLayout layout = kvstore::StoreLayout::make(model.spec().kv_shape(), config);
    disk_ = std::make_unique<DiskCache>(options.cache_dir, options.cache_bytes, model.fingerprint(),
                                        DiskCache::layout_key(layout));
    for (const std::string& r : disk_->removed())
      std::fprintf(stderr, "longctx-server: disk cache: removed %s\n", r.c_str());
    metrics_.kv_disk_bytes = disk_->bytes();
    metrics_.disk_sequences = int64_t(disk_->size());
  }
  limits_.max_seq_len = config.max_seq_len;
  limits_.defaults = config.sampling;
  worker_ = std::thread([this] { work(); });
}

Engine::~Engine() { shutdown(std::chrono::milliseconds(0)); }

std::vector<int32_t> Engine::tokenize(const CompletionRequest& request) const {
  const model::Tokenizer& tok = model_.tokenizer();
  // Special tokens in the text are parsed, as llama-server does.
  if (!request.chat) return tok.encode(request.prompt, tok.vocab().add_bos, /*parse_special=*/true);
  const std::string text = model::apply_chat_template(chat_template_, request.messages, /*add_generation_prompt=*/true);
  const bool bos = !chat::template_writes_bos(chat_template_) && tok.vocab().add_bos;
  return tok.encode(text, bos, /*parse_special=*/true);
}

std::shared_ptr<Job> Engine::submit(CompletionRequest request) {
  auto job = std::make_shared<Job>();
  job->prompt_ = tokenize(request);
  const int64_t n = int64_t(job->prompt_.size());
  if (n == 0) throw ApiError(400, "the prompt is empty after tokenization", request.chat ? "messages" : "prompt");
  if (n >= config_.max_seq_len)
    throw ApiError(400,
                   str_cat("the prompt is ", n, " tokens; this server holds at most max_seq_len ", config_.max_seq_len,
                           " tokens, prompt and answer together"),
                   request.chat ? "messages" : "prompt");
  job->request_ = std::move(request);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw ApiError(503, "the server is shutting down");
    if (queue_.size() >= options_.max_queued)
      throw ApiError(503, str_cat("the server is busy: ", queue_.size(), " requests are waiting; retry later"));
    queue_.push_back(job);
    ++metrics_.queued;
  }
  wake_.notify_all();
  return job;
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  accepting_.store(false);
  std::unique_lock lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
  // Let the worker drain the queue within the grace period, then cancel the rest.
  wake_.wait_for(lock, grace, [&] { return queue_.empty() && running_ == nullptr; });
  for (const auto& job : queue_) job->cancel();
  if (running_) running_->cancel();
  lock.unlock();
  if (!worker_.joinable()) return;
  worker_.join();
  // The worker is gone: its cache is ours. What is in DRAM goes to disk.
  for (auto& c : cache_) spill(*c);
}

Metrics Engine::metrics() const {
  std::lock_guard lock(mutex_);
  return metrics_;
}

void Engine::work() {
  // A request's activations are freed into glibc's heaps, which keep their
  // pages resident (some 20 MiB after a burst of small requests); once the
  // engine has been idle this long they go back to the system. Waiting for
  // idleness keeps the trim, a walk over every heap, out of a burst.
  constexpr std::chrono::milliseconds kIdleBeforeTrim{250};
  bool trimmed = true;  // nothing freed since the last trim
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      const auto ready = [&] { return stopping_ || !queue_.empty(); };
      if (!trimmed && !wake_.wait_for(lock, kIdleBeforeTrim, ready)) {
        lock.unlock();
        malloc_trim(0);
        trimmed = true;
        lock.lock();
      }
      wake_.wait(lock, ready);
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      --metrics_.queued;
      metrics_.running = 1;
      running_ = job;
    }
    trimmed = false;
    try {
      run(*job);
    } catch (const ApiError& e) {
      job->push(Event{Event::kError, e.what(), "", {}, e.status()});
    } catch (const std::exception& e) {
      job->push(Event{Event::kError, e.what(), "", {}, 500});
    }
    {
      std::lock_guard lock(mutex_);
      running_.reset();
      metrics_.running = 0;
      count_cache();
    }
    wake_.notify_all();
  }
}

uint64_t Engine::cache_bytes() const {
  uint64_t bytes = 0;
  for (const auto& c : cache_) bytes += c->seq->store().memory_stats().reserved_bytes;
  return bytes;
}

Engine::Cached& Engine::new_sequence(uint64_t need_bytes) {
  const uint64_t budget = config_.dram_budget != 0 ? config_.dram_budget : kvstore::default_dram_budget();
  while (!cache_.empty() && cache_bytes() + need_bytes > budget) {
    auto lru = std::min_element(cache_.begin(), cache_.end(),
                                [](const auto& a, const auto& b) { return a->last_used < b->last_used; });
    spill(**lru);
    cache_.erase(lru);
  }
  auto fresh = std::make_unique<Cached>();
  try {
    fresh->seq = std::make_unique<scheduler::Sequence>(backend_, model_.transformer(), config_);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kOutOfMemory) throw ApiError(503, str_cat("no memory for another sequence: ", e.what()));
    throw;
  }
  fresh->last_used = ++use_clock_;
  cache_.push_back(std::move(fresh));
  return *cache_.back();
}

void Engine::spill(Cached& c) {
  if (!disk_ || c.on_disk || c.tokens.empty()) return;
  try {
    disk_->save(c.seq->store(), c.tokens);
    c.on_disk = true;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-server: the disk cache could not keep a sequence of %zu tokens: %s\n",
                 c.tokens.size(), e.what());
  }
}

Engine::Cached& Engine::take_sequence(const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t& cached) {
  const int64_t bs = config_.block_size;
  // Whole blocks of a common prefix, leaving at least one token to prefill.
  const auto reusable = [&](size_t common) { return int64_t(std::min(common, prompt.size() - 1)) / bs * bs; };
  Cached* best = nullptr;
  int64_t best_keep = 0;
  for (const auto& c : cache_)
    if (const int64_t keep = reusable(common_prefix(prompt, c->tokens)); keep > best_keep) best = c.get(), best_keep = keep;
  // What a new sequence for this request will hold: asked only when one is made.
  const auto need = [&] {
    const kvstore::StoreLayout layout = kvstore::StoreLayout::make(model_.spec().kv_shape(), config_);
    const int64_t tokens = std::min<int64_t>(config_.max_seq_len, int64_t(prompt.size()) + max_tokens);
    return kvstore::preflight(layout, tokens, std::vector<int>(size_t(layout.shape.n_kv_heads), 0)).total_bytes;
  };

  // A longer prefix on disk: read it back instead of prefilling it.
  size_t disk_common = 0;
  const DiskCache::Entry* on_disk = disk_ ? disk_->best_match(prompt, disk_common) : nullptr;
  if (on_disk != nullptr && reusable(disk_common) > best_keep) {
    const DiskCache::Entry entry = *on_disk;  // new_sequence may spill to disk, which may evict it
    Cached& c = new_sequence(need());
    try {
      disk_->load(entry, c.seq->store());
      c.seq->sync_with_store();
      if (c.seq->n_past() != int64_t(entry.tokens.size()))
        fail(ErrorCode::kCorrupt, "the snapshot holds ", c.seq->n_past(), " tokens, its list ", entry.tokens.size());
      c.tokens = entry.tokens;
      c.on_disk = true;
      const int64_t keep = reusable(disk_common);
      c.seq->truncate(keep);
      c.tokens.resize(size_t(keep));
      cached = keep;
      return c;
    } catch (const Error& e) {
      std::fprintf(stderr, "longctx-server: disk cache entry %s not used: %s\n", entry.name.c_str(), e.what());
      c.seq->reset();
      c.tokens.clear();
      c.on_disk = false;
      cached = 0;
      return c;
    }
  }
  if (best != nullptr) {
    if (best->seq->n_past() > best_keep) best->seq->truncate(best_keep);
    best->tokens.resize(size_t(best_keep));
    best->last_used = ++use_clock_;
    cached = best_keep;
    return *best;
  }
  cached = 0;
  return new_sequence(need());
}

void Engine::run(Job& job) {
  if (job.cancelled()) {
    finish(job, "cancelled", {});
    return;
  }
  int64_t cached = 0;
  Cached& entry = take_sequence(job.prompt_, job.request_.max_tokens, cached);
  entry.on_disk = false;  // it holds other tokens from here on
  try {
    generate(job, entry, cached);
  } catch (...) {
    // The KV holds part of this request (or the sequence is broken): start it over next time.
    entry.seq->reset();
    entry.tokens.clear();
    if (!job.cancelled()) throw;
    Usage usage;
    usage.prompt_tokens = job.prompt_tokens();
    usage.cached_tokens = cached;
    finish(job, "cancelled", usage);
  }
}

void Engine::generate(Job& job, Cached& entry, int64_t cached) {
  const CompletionRequest& req = job.request_;
  const std::vector<int32_t>& prompt = job.prompt_;
  scheduler::Sequence& seq = *entry.seq;
  seq.reset_stats();
  Usage usage;
  usage.prompt_tokens = int64_t(prompt.size());
  usage.cached_tokens = cached;

  scheduler::PrefillOptions options;
  options.progress = [&](int64_t, int64_t) {
    if (job.cancelled()) throw Cancelled{};
  };
  std::vector<float> logits = seq.prefill(std::span<const int32_t>(prompt).subspan(size_t(cached)), options);
  entry.tokens.assign(prompt.begin(), prompt.end());

  model::Sampler sampler(model::SamplerParams{req.temperature, req.top_k, req.top_p, req.seed});
  const model::Tokenizer& tok = model_.tokenizer();
  StopFilter filter(req.stop);
  std::string reason = "length";
  int64_t generated = 0;
  while (generated < req.max_tokens) {
    if (job.cancelled()) {
      reason = "cancelled";
      break;
    }
    const int32_t id = sampler.sample(logits);
    if (tok.is_end_of_generation(id)) {
      reason = "stop";
      break;
    }
    ++generated;
    if (std::string text = filter.push(tok.token_to_piece(id)); !text.empty()) job.push(Event{Event::kText, text});
    if (filter.stopped()) {
      reason = "stop";
      break;
    }
    // The last token's KV is kept only when the cache has room for it.
    if (generated == req.max_tokens || seq.n_past() >= config_.max_seq_len) break;
    logits = seq.decode(id);
    entry.tokens.push_back(id);
  }
  if (std::string rest = filter.finish(); !rest.empty()) job.push(Event{Event::kText, rest});

  const scheduler::SequenceStats& st = seq.stats();
  usage.completion_tokens = generated;
  usage.prefill_tokens_per_second = st.prefill_tokens_per_second();
  usage.decode_tokens_per_second = st.decode_tokens_per_second();
  usage.attended_fraction = st.mean_attended_fraction();
  {
    std::lock_guard lock(mutex_);
    metrics_.prompt_tokens += usage.prompt_tokens;
    metrics_.cached_tokens += usage.cached_tokens;
    metrics_.generated_tokens += generated;
    metrics_.prefilled_tokens += st.prefill_tokens;
    metrics_.prefill_seconds += st.prefill_seconds;
    metrics_.decoded_tokens += st.decode_tokens;
    metrics_.decode_seconds += st.decode_seconds;
  }
  finish(job, reason, usage);
}

void Engine::count_cache() {
  metrics_.kv_dram_bytes = cache_bytes();
  metrics_.cached_sequences = int64_t(cache_.size());
  metrics_.kv_disk_bytes = disk_ ? disk_->bytes() : 0;
  metrics_.disk_sequences = disk_ ? int64_t(disk_->size()) : 0;
}

void Engine::finish(Job& job, const std::string& reason, const Usage& usage) {
  {
    // Before the client hears of the end, so that /metrics already counts it.
    std::lock_guard lock(mutex_);
    if (reason == "cancelled") ++metrics_.cancelled;
    count_cache();
  }
  job.push(Event{Event::kDone, "", reason, usage, 0});
}

}  // namespace longctx::server
