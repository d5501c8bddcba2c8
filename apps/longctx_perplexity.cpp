// longctx-perplexity: perplexity of a text under a GGUF model, with the
// attention the config selects, and optionally every position's logits as
// raw float32 for comparison with other implementations.
#include <tbb/global_control.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/core/file.h"
#include "longctx/core/flag.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"

namespace {

using namespace longctx;

constexpr const char* kUsage =
    "usage: longctx-perplexity --model FILE.gguf (--file TEXT.txt | --tokens 1,2,3)\n"
    "                          [--config X.yaml] [--set KEY=VALUE]... [--context N]\n"
    "                          [--dump-logits OUT.f32] [--weights native|bf16|f32] [--no-bos]\n"
    "\n"
    "Perplexity exp(-mean log p(token i+1 | tokens 0..i)) over every position of the\n"
    "text (tokenized with the model's tokenizer, BOS first unless --no-bos or the\n"
    "vocabulary says otherwise; --tokens takes ids as they are).\n"
    "\n"
    "How attention is computed:\n"
    "  The first N tokens (--context N; default: all of them) are prefilled in\n"
    "  chunks of chunk_size: prefill attention is exact (every earlier token), or\n"
    "  QUOKA-restricted when quoka.enabled. The remaining tokens are fed one at a\n"
    "  time as decode steps, and their predictions use the decode-time policy of\n"
    "  the config (policy: select = block selection with second_select_num,\n"
    "  dense, streaming, h2o; preselect/budget/razor as configured). So a sparse\n"
    "  policy is exercised only after --context: e.g. --context 4096 on an 8K\n"
    "  text scores the second half with sparse decode attention over a growing\n"
    "  cache, as in Quest's PG19 evaluation. Both parts are reported.\n"
    "\n"
    "  --config X.yaml   long-context config (default: every key's default)\n"
    "  --set KEY=VALUE   override a config key (repeatable), e.g. --set max_seq_len=32768\n"
    "  --dump-logits F   write the logits of every position as raw float32\n"
    "                    [n_tokens, n_vocab], row i = the prediction after token i\n"
    "                    (written atomically: no file on error)\n"
    "  --weights T       weight storage of the CPU backend: native (default: each tensor in its\n"
    "                    GGUF type, quantized blocks computed as they are), bf16 or f32\n"
    "Errors print a message and exit with status 1.\n";

struct Args {
  std::string model, file, tokens_text, config_path, dump_path;
  std::vector<std::string> overrides;
  int64_t context = 0;  // 0: prefill everything
  WeightStorage weights = WeightStorage::kNative;
  bool bos = true;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--model") a.model = value();
    else if (flag == "--file") a.file = value();
    else if (flag == "--tokens") a.tokens_text = value();
    else if (flag == "--config") a.config_path = value();
    else if (flag == "--set") a.overrides.push_back(value());
    else if (flag == "--context") a.context = parse_int_flag(flag, value(), 1, INT64_MAX);
    else if (flag == "--dump-logits") a.dump_path = value();
    else if (flag == "--no-bos") a.bos = false;
    else if (flag == "--weights") {
      const std::string t = value();
      const std::optional<WeightStorage> storage = parse_weight_storage(t);
      if (!storage) fail(ErrorCode::kInvalidArgument, "--weights: expected native, bf16 or f32, got '", t, "'");
      a.weights = *storage;
    } else if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "' (see --help)");
    }
  }
  if (a.model.empty()) fail(ErrorCode::kInvalidArgument, "--model is required (see --help)");
  if (a.file.empty() == a.tokens_text.empty())
    fail(ErrorCode::kInvalidArgument, "give exactly one of --file and --tokens (see --help)");
  return a;
}

std::vector<int32_t> parse_token_list(const std::string& text, int64_t n_vocab) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0)
      fail(ErrorCode::kInvalidArgument, "--tokens: item ", ids.size(), " is '", item, "', not an integer");
    if (id < 0 || id >= n_vocab)
      fail(ErrorCode::kInvalidArgument, "--tokens: item ", ids.size(), " is ", id, ", outside the vocabulary [0, ",
           n_vocab, ")");
    ids.push_back(static_cast<int32_t>(id));
    pos = comma + 1;
  }
  return ids;
}

// -log softmax(logits)[target], in double.
double negative_log_prob(std::span<const float> logits, int32_t target) {
  double max = -INFINITY;
  for (float x : logits) max = std::max(max, double(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - max);
  return -(double(logits[size_t(target)]) - max - std::log(sum));
}

struct Score {
  double nll = 0.0;
  int64_t count = 0;
  double ppl() const { return count > 0 ? std::exp(nll / double(count)) : NAN; }
};

int run(const Args& a) {
  LongContextConfig config = a.config_path.empty() ? parse_config("", "<defaults>", a.overrides)
                                                   : load_config_file(a.config_path, a.overrides);
  std::optional<tbb::global_control> threads;
  if (config.threads_num > 0) threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(config.threads_num));

  cpu::CpuBackendOptions backend_options;
  backend_options.weights = a.weights;
  cpu::CpuBackend backend(backend_options);
  const auto model = model::Model::open(a.model, backend);
  const int64_t n_vocab = model->spec().n_vocab;

  std::vector<int32_t> tokens;
  if (!a.tokens_text.empty()) {
    tokens = parse_token_list(a.tokens_text, n_vocab);
  } else {
    const std::vector<std::byte> bytes = read_file(a.file);
    const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    tokens = model->tokenizer().encode(text, a.bos && model->tokenizer().vocab().add_bos, false);
  }
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 2) fail(ErrorCode::kInvalidArgument, "the text has ", n, " token(s); perplexity needs at least 2");
  if (n > config.max_seq_len)
    fail(ErrorCode::kInvalidArgument, "the text has ", n, " tokens, more than max_seq_len ", config.max_seq_len,
         " (raise it with --set max_seq_len=", n, ")");
  const int64_t n_prefill = a.context > 0 ? std::min(a.context, n) : n;

  std::printf("model:   %s (%s, %d layers, %d/%d heads, d=%d, vocab %lld)\n", a.model.c_str(),
              model->spec().arch.c_str(), model->spec().n_layers, model->spec().n_heads, model->spec().n_kv_heads,
              model->spec().head_dim, static_cast<long long>(n_vocab));
  std::printf("tokens:  %lld (%lld prefilled, %lld decoded); policy %s, quoka %s\n", static_cast<long long>(n),
              static_cast<long long>(n_prefill), static_cast<long long>(n - n_prefill),
              selection_policy_name(config.policy), config.quoka.enabled ? "on" : "off");
  std::fflush(stdout);

  scheduler::Sequence seq(backend, model->transformer(), config);
  Score prefill_score, decode_score;
  auto evaluate = [&](FileSink* sink) {
    // Row i predicts token i + 1; the last row has no target.
    auto consume = [&](int64_t row, std::span<const float> logits, Score& score) {
      if (sink) sink->write(logits.data(), logits.size_bytes());
      if (row + 1 < n) {
        score.nll += negative_log_prob(logits, tokens[size_t(row + 1)]);
        ++score.count;
      }
    };
    scheduler::PrefillOptions options;
    options.on_logits = [&](int64_t first, int64_t rows, std::span<const float> logits) {
      for (int64_t r = 0; r < rows; ++r)
        consume(first + r, logits.subspan(size_t(r * n_vocab), size_t(n_vocab)), prefill_score);
    };
    seq.prefill(std::span<const int32_t>(tokens).first(size_t(n_prefill)), options);
    for (int64_t i = n_prefill; i < n; ++i) consume(i, seq.decode(tokens[size_t(i)]), decode_score);
  };
  if (a.dump_path.empty()) evaluate(nullptr);
  else write_file_atomically(a.dump_path, [&](FileSink& sink) { evaluate(&sink); });

  Score all{prefill_score.nll + decode_score.nll, prefill_score.count + decode_score.count};
  const scheduler::SequenceStats& st = seq.stats();
  std::printf("perplexity: %.6f over %lld predictions\n", all.ppl(), static_cast<long long>(all.count));
  if (decode_score.count > 0) {
    std::printf("  prefilled part: %.6f over %lld\n", prefill_score.ppl(), static_cast<long long>(prefill_score.count));
    std::printf("  decoded part:   %.6f over %lld (%.1f%% of the cache attended per step on average)\n",
                decode_score.ppl(), static_cast<long long>(decode_score.count), 100.0 * st.mean_attended_fraction());
  }
  std::printf("prefill: %.1f tokens/s", st.prefill_tokens_per_second());
  if (st.decode_tokens > 0) std::printf(", decode: %.1f tokens/s", st.decode_tokens_per_second());
  std::printf("\n");
  if (!a.dump_path.empty())
    std::printf("logits:  %s (float32 [%lld, %lld])\n", a.dump_path.c_str(), static_cast<long long>(n),
                static_cast<long long>(n_vocab));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {  // longctx::Error included
    std::fprintf(stderr, "longctx-perplexity: %s\n", e.what());
    return 1;
  }
}
