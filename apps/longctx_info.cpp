// longctx-info: what this machine offers longctx (CPU features, SIMD target,
// NUMA nodes, GPUs), and, given a config and a model shape, whether the KV
// store fits the DRAM budget; given a GGUF file, validates it, builds its
// tokenizer and prints its metadata, tensors, tokenizer and KV bytes per
// token; with --tokenize, prints the token ids of a text (a vocabulary-only
// GGUF will do: only the tokenizer.* keys are read).
//
//   longctx-info
//   longctx-info MODEL.gguf [--config FILE.yaml]   (the model gives the shape)
//   longctx-info MODEL.gguf --tokenize TEXT [--no-bos] [--no-special]
//   longctx-info --config configs/default.yaml [--layers 32 --kv-heads 8 --head-dim 128] [--set key=value]...
//   longctx-info --config-reference
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/cpu_features.h"
#include "longctx/cpu/attention.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/cpu/peak_loops.h"
#include "longctx/cpu/prefill_attention.h"
#include "longctx/cpu/quant_matmul.h"
#include "longctx/core/error.h"
#include "longctx/gpu/device.h"
#include "longctx/kvstore/kv_store.h"
#include "longctx/kvstore/memory_budget.h"
#include "longctx/kvstore/numa.h"
#include "longctx/model/gguf.h"
#include "longctx/model/llama.h"
#include "longctx/model/tokenizer.h"

namespace {

using namespace longctx;

constexpr const char* kUsage =
    "usage: longctx-info [--config FILE.yaml [--layers N] [--kv-heads N] [--head-dim N] [--set KEY=VALUE]...]\n"
    "       longctx-info MODEL.gguf [--config FILE.yaml [--set KEY=VALUE]...]\n"
    "       longctx-info MODEL.gguf --tokenize TEXT [--no-bos] [--no-special]\n"
    "           prints the token ids of TEXT, space-separated: BOS (and EOS) where the vocabulary adds\n"
    "           them unless --no-bos; control-token text such as <s> becomes its id unless --no-special\n"
    "       longctx-info --config-reference\n";

struct Args {
  std::string config_path;
  std::string gguf_path;
  std::vector<std::string> overrides;
  kvstore::KVShape shape{32, 8, 128};  // Llama-3-8B-like attention
  // Where the shape comes from, printed beside it: the planned store is only
  // as real as the model it assumes.
  std::string shape_source = "assumed, Llama-3-8B's attention: give MODEL.gguf or --layers/--kv-heads/--head-dim";
  bool reference = false;
  std::optional<std::string> tokenize;  // --tokenize TEXT
  bool add_bos = true, parse_special = true;
};

int parse_int(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value <= 0 || value > 1 << 20)
    fail(ErrorCode::kInvalidArgument, flag, ": expected a positive integer, got '", text, "'");
  return static_cast<int>(value);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) fail(ErrorCode::kInvalidArgument, flag, " needs a value");
      return argv[++i];
    };
    auto shape_value = [&](int& field) {
      field = parse_int(flag, value());
      args.shape_source = "--layers/--kv-heads/--head-dim, the rest Llama-3-8B's";
    };
    if (flag == "--config") args.config_path = value();
    else if (flag == "--set") args.overrides.push_back(value());
    else if (flag == "--layers") shape_value(args.shape.n_layers);
    else if (flag == "--kv-heads") shape_value(args.shape.n_kv_heads);
    else if (flag == "--head-dim") shape_value(args.shape.head_dim);
    else if (flag == "--config-reference") args.reference = true;
    else if (flag == "--tokenize") args.tokenize = value();
    else if (flag == "--no-bos") args.add_bos = false;
    else if (flag == "--no-special") args.parse_special = false;
    else if (!flag.empty() && flag[0] != '-' && args.gguf_path.empty()) args.gguf_path = flag;
    else if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else fail(ErrorCode::kInvalidArgument, "unknown argument '", flag, "'\n", kUsage);
  }
  if ((args.tokenize || !args.add_bos || !args.parse_special) && args.gguf_path.empty())
    fail(ErrorCode::kInvalidArgument, "--tokenize, --no-bos and --no-special need a GGUF file\n", kUsage);
  if ((!args.add_bos || !args.parse_special) && !args.tokenize)
    fail(ErrorCode::kInvalidArgument, "--no-bos and --no-special go with --tokenize\n", kUsage);
  return args;
}

void print_system(const kvstore::NumaTopology& topology) {
  const CpuFeatures& cpu = cpu_features();
  std::printf("longctx %s\n", LONGCTX_VERSION);
  std::printf("cpu:      %s\n", cpu.brand.c_str());
  std::printf("features: %s\n", describe_cpu_features(cpu).c_str());
  std::printf("simd:     %s (Highway runtime dispatch)%s\n", highway_target_name().c_str(),
              cpu.avx512f ? "" : "; no AVX-512 on this CPU");
  const cpu::CpuBackend backend;
  std::printf("int8:     quantized matmul on %s; prefill rows on %s (weights in groups of rows: %s)\n",
              cpu::quant_isa_name(cpu::best_quant_isa()), cpu::quant_prefill_name(backend.quant_prefill()),
              cpu::quant_prefill_name(backend.quant_prefill(cpu::QuantLayout::kRows8)));
  const cpu::PrefillKernel prefill = cpu::best_prefill_kernel();
  char prefill_why[128] = "";
  if (prefill == cpu::PrefillKernel::kF32 && cpu::prefill_kernel_unsupported_reason(cpu::PrefillKernel::kBf16).empty())
    std::snprintf(prefill_why, sizeof prefill_why, "; not bf16: vdpbf16ps runs at %.2fx the FMA rate here, below %.2fx",
                  cpu::vdpbf16ps_over_fma(), cpu::kBf16MinOverFma);
  std::printf("prefill:  attention products: %s on %s (prefill_kernel: auto%s)\n", cpu::prefill_kernel_name(prefill),
              cpu::prefill_kernel_engine(prefill).c_str(), prefill_why);
  std::printf("q8_0 kv:  decode attention on %s\n", cpu::q8_decode_kernel_description());
  const std::string& amx_why = amx_unusable_reason();
  std::printf("amx:      %s\n", amx_why.empty() ? "usable (tile data permission granted)" : ("not usable: " + amx_why).c_str());
  std::string nodes = topology.describe();
  if (!nodes.empty() && nodes.back() != '\n') nodes += '\n';
  std::printf("numa:     %d node(s)%s\n%s", topology.node_count(),
              topology.is_this_system() ? "" : " (not this system)", nodes.c_str());
  std::string why;
  const auto gpus = gpu::list_devices(&why);
  if (gpus.empty()) std::printf("gpu:      none (%s)\n", why.c_str());
  for (const auto& d : gpus)
    std::printf("gpu %d:    %s, sm_%d%d, %d SMs, %s\n", d.index, d.name.c_str(), d.sm_major, d.sm_minor,
                d.multiprocessors, format_bytes(d.memory_bytes).c_str());
}

// ---- GGUF report ----------------------------------------------------------------

// A string for the terminal: control bytes escaped, long ones cut.
std::string printable(std::string_view text, size_t limit = 60) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\' || c == '"') out += str_cat('\\', static_cast<char>(c));
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7F) out += str_cat("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    else out += static_cast<char>(c);
  }
  out += "\"";
  if (text.size() > limit) out += str_cat("... (", text.size(), " bytes)");
  return out;
}

std::string describe_value(const model::GgufFile& file, const std::string& key, const model::GgufValue& v) {
  using model::GgufType;
  switch (v.type) {
    case GgufType::kString: return printable(v.str);
    case GgufType::kBool: return v.b ? "true" : "false";
    case GgufType::kF32: case GgufType::kF64: return str_cat(v.f);
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64: return str_cat(v.i);
    case GgufType::kArray: break;
    default: return str_cat(v.u);
  }
  // Arrays: element type, count and the first few elements.
  constexpr size_t kShown = 4;
  std::string out = str_cat("[", v.array_count, " x ", model::gguf_type_name(v.array_type), "]");
  std::vector<std::string> shown;
  if (v.array_type == GgufType::kString) {
    for (auto s : file.get_string_array(key)) {
      if (shown.size() == kShown) break;
      shown.push_back(printable(s, 24));
    }
  } else if (v.array_type == GgufType::kF32) {
    for (float x : file.get_f32_array(key)) {
      if (shown.size() == kShown) break;
      shown.push_back(str_cat(x));
    }
  } else {
    try {
      for (int32_t x : file.get_i32_array(key)) {
        if (shown.size() == kShown) break;
        shown.push_back(str_cat(x));
      }
    } catch (const Error&) {
      shown.clear();  // not integers that fit int32: type and count only
    }
  }
  if (!shown.empty()) {
    out += " ";
    for (size_t i = 0; i < shown.size(); ++i) out += (i ? ", " : "") + shown[i];
    if (v.array_count > shown.size()) out += ", ...";
  }
  return out;
}

// The attention shape from <arch>.* keys, or why it is not known.
std::optional<kvstore::KVShape> model_kv_shape(const model::GgufFile& file, std::string* why, uint64_t* bytes_per_token) {
  const std::string arch = file.get_string_or("general.architecture", "");
  if (arch.empty()) {
    *why = "no general.architecture";
    return std::nullopt;
  }
  const auto key = [&](const char* name) { return arch + "." + name; };
  for (const char* needed : {"block_count", "attention.head_count"})
    if (!file.has(key(needed))) {
      *why = "missing " + key(needed);
      return std::nullopt;
    }
  const uint64_t layers = file.get_uint(key("block_count"));
  const uint64_t heads = file.get_uint(key("attention.head_count"));
  const uint64_t kv_heads = file.get_uint_or(key("attention.head_count_kv"), heads);
  uint64_t k_len = file.get_uint_or(key("attention.key_length"), 0);
  if (k_len == 0) {
    if (!file.has(key("embedding_length")) || heads == 0) {
      *why = "missing " + key("embedding_length");
      return std::nullopt;
    }
    k_len = file.get_uint(key("embedding_length")) / heads;
  }
  const uint64_t v_len = file.get_uint_or(key("attention.value_length"), k_len);
  // Values come from the file: multiply without overflow. f16 K and V: 2 bytes each.
  uint64_t total = 0;
  if (__builtin_mul_overflow(layers, kv_heads, &total) || __builtin_mul_overflow(total, k_len + v_len, &total) ||
      __builtin_mul_overflow(total, uint64_t{2}, &total) || k_len + v_len < k_len) {
    *why = "the shape overflows";
    return std::nullopt;
  }
  *bytes_per_token = total;
  const uint64_t limit = 1 << 20;
  if (layers > limit || kv_heads > limit || k_len > limit || k_len != v_len) {
    *why = "shape outside what the KV store holds";
    return std::nullopt;
  }
  return kvstore::KVShape{static_cast<int>(layers), static_cast<int>(kv_heads), static_cast<int>(k_len)};
}

// The tokenizer line of the report: what tokenizer_from_gguf built.
std::string describe_tokenizer(const model::GgufFile& file, const model::Tokenizer& tok) {
  const model::Vocab& v = tok.vocab();
  std::string out = str_cat(v.kind == model::TokenizerKind::kSpm ? "llama" : "gpt2", ", vocabulary of ",
                            tok.n_vocab(), " tokens");
  if (v.kind == model::TokenizerKind::kBpe) {
    const std::string name = file.get_string_or("tokenizer.ggml.pre", "");
    const char* type = model::pre_tokenizer_info(v.pre).name;
    if (name.empty()) out += str_cat(", pre-tokenizer ", type, " (tokenizer.ggml.pre absent)");
    else if (name == type) out += str_cat(", pre-tokenizer ", name);
    else out += str_cat(", pre-tokenizer ", name, " (the ", type, " rules)");
  }
  out += v.add_bos && v.bos >= 0 ? str_cat(", BOS ", v.bos, " added") : std::string(", no BOS added");
  return out;
}

// Prints the report; returns the model's attention shape when it is known.
// `tokenizer` is what the file's tokenizer.* keys built, or null when they
// could not build one.
std::optional<kvstore::KVShape> print_gguf(const model::GgufFile& file, const model::Tokenizer* tokenizer) {
  std::printf("file:       %s (%s, GGUF v%u, alignment %llu)\n", file.name().c_str(),
              format_bytes(file.file_size()).c_str(), file.version(),
              static_cast<unsigned long long>(file.alignment()));
  std::printf("metadata:   %zu keys\n", file.metadata().size());
  size_t width = 0;
  for (const auto& kv : file.metadata()) width = std::max(width, kv.key.size());
  for (const auto& kv : file.metadata())
    std::printf("  %-*s  %-6s  %s\n", static_cast<int>(std::min<size_t>(width, 48)), kv.key.c_str(),
                model::gguf_type_name(kv.value.type), describe_value(file, kv.key, kv.value).c_str());

  uint64_t total = 0;
  size_t name_width = 4;
  for (const auto& t : file.tensors()) {
    total += t.n_bytes;
    name_width = std::max(name_width, t.name.size());
  }
  std::printf("tensors:    %zu (%s)\n", file.tensors().size(), format_bytes(total).c_str());
  // What the CPU backend keeps resident for these tensors, per weight storage.
  std::string resident;
  for (WeightStorage storage : {WeightStorage::kNative, WeightStorage::kBF16, WeightStorage::kF32}) {
    uint64_t bytes = 0;
    std::string unsupported;
    for (const auto& t : file.tensors()) {
      const auto type = cpu::CpuBackend::stored_type(t.type, t.dims.size(), storage);
      if (!type) unsupported = t.name;
      else bytes += ggml_bytes(*type, t.n_elements).value_or(0);
    }
    resident += str_cat(resident.empty() ? "" : ", ", weight_storage_name(storage), " ",
                        unsupported.empty() ? format_bytes(bytes) : "cannot load " + unsupported);
  }
  std::printf("resident:   %s (weights on the CPU backend, by model.weights)\n", resident.c_str());
  const int nw = static_cast<int>(std::min<size_t>(name_width, 64));
  if (!file.tensors().empty()) std::printf("  %-*s  %-5s  %-28s  %s\n", nw, "name", "type", "shape", "bytes");
  for (const auto& t : file.tensors()) {
    std::string shape = "[";
    for (size_t i = 0; i < t.dims.size(); ++i) shape += str_cat(i ? ", " : "", t.dims[i]);
    shape += "]";
    std::printf("  %-*s  %-5s  %-28s  %llu\n", nw, t.name.c_str(), ggml_type_info(t.type).name, shape.c_str(),
                static_cast<unsigned long long>(t.n_bytes));
  }

  std::printf("tokenizer:  %s\n",
              tokenizer != nullptr ? describe_tokenizer(file, *tokenizer).c_str() : "cannot be built (below)");

  std::string why;
  uint64_t per_token = 0;
  const auto shape = model_kv_shape(file, &why, &per_token);
  if (per_token != 0)
    std::printf("kv cache:   %llu bytes per token (K and V in f16)\n", static_cast<unsigned long long>(per_token));
  else
    std::printf("kv cache:   unknown (%s)\n", why.c_str());
  // The score scale the loader takes from the file (model/llama.h); absent: 1/sqrt(head_dim).
  const std::string scale_key = file.get_string_or("general.architecture", "") + ".attention.scale";
  if (file.has(scale_key))
    std::printf("attention:  scores q.k * %g (%s)\n", file.get_float(scale_key), scale_key.c_str());
  return shape;
}

// The RoPE the loader takes from the file (model/llama.h).
std::string describe_rope(const RopeParams& r, int head_dim) {
  std::string text = str_cat(r.style == RopeStyle::kNeox ? "halves" : "adjacent pairs", ", theta ", r.theta, ", ",
                             r.n_rot, " of ", head_dim, " channels");
  if (!r.freq_factors.empty()) text += ", rope_freqs.weight (Llama-3.1)";
  if (r.scaling != RopeScaling::kNone) text += str_cat(", ", rope_scaling_name(r.scaling), " scaling x", r.factor);
  if (r.scaling == RopeScaling::kYarn) text += str_cat(" from ", r.original_context, " tokens");
  if (const float magnitude = rope_magnitude(r); magnitude != 1.0f)
    text += str_cat(", rotated pairs times ", magnitude);
  return text;
}

// Returns false when the store would not fit the DRAM budget.
bool print_preflight(const Args& args, const LongContextConfig& config, const kvstore::NumaTopology& topology) {
  const auto layout = kvstore::StoreLayout::make(args.shape, config);
  const auto nodes = kvstore::resolve_numa_nodes(config.numa, topology);
  const auto head_nodes = kvstore::place_kv_heads(args.shape.n_kv_heads, nodes);
  const auto plan = kvstore::preflight(layout, config.max_seq_len, head_nodes);
  const uint64_t budget = config.dram_budget ? config.dram_budget : kvstore::default_dram_budget();
  std::printf("\nconfig %s: valid\n", args.config_path.c_str());
  std::printf("model:    %d layers x %d kv heads x %d dims (%s)\n", args.shape.n_layers, args.shape.n_kv_heads,
              args.shape.head_dim, args.shape_source.c_str());
  std::printf("store:    %s\n", plan.describe().c_str());
  const bool fits = plan.total_bytes <= budget;
  std::printf("budget:   %s (%s)\n", format_bytes(budget).c_str(), fits ? "fits" : "does not fit");
  // A budget set above the machine's memory cannot refuse a store that will not fit in it.
  const uint64_t memory = kvstore::machine_memory_bytes();
  if (budget > memory)
    std::fprintf(stderr, "longctx-info: warning: dram_budget %s is more than this machine's memory (%s)%s\n",
                 format_bytes(budget).c_str(), format_bytes(memory).c_str(),
                 plan.total_bytes > memory ? ", and so is the KV store: it will not fit" : "");
  if (!fits)
    std::fprintf(stderr, "longctx-info: the KV store needs %s but dram_budget is %s: lower max_seq_len, choose a "
                 "smaller kv_type, or raise dram_budget\n", format_bytes(plan.total_bytes).c_str(),
                 format_bytes(budget).c_str());
  return fits;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    if (args.reference) {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return 0;
    }
    // Load the config first so that a bad file fails before any report is printed.
    LongContextConfig config;
    if (!args.config_path.empty()) config = load_config_file(args.config_path, args.overrides);
    const auto topology = kvstore::NumaTopology::detect();
    if (!args.gguf_path.empty()) {
      const model::GgufFile file = model::GgufFile::open(args.gguf_path);
      if (args.tokenize) {
        const model::Tokenizer tok = model::tokenizer_from_gguf(file);
        std::string line;
        for (const int32_t id : tok.encode(*args.tokenize, args.add_bos, args.parse_special)) {
          if (!line.empty()) line += ' ';
          line += std::to_string(id);
        }
        std::printf("%s\n", line.c_str());
        return 0;
      }
      // The report first, then why the tokenizer could not be built (exit 1:
      // no model of this file would load).
      std::optional<model::Tokenizer> tok;
      std::optional<Error> tokenizer_error;
      try {
        tok.emplace(model::tokenizer_from_gguf(file));
      } catch (const Error& e) {
        tokenizer_error = e;
      }
      const auto shape = print_gguf(file, tok ? &*tok : nullptr);
      if (tokenizer_error) throw *tokenizer_error;
      // The loader's own checks (model/llama.h), after the report: what this
      // says loads is what longctx-chat loads.
      if (file.tensors().empty()) {
        std::printf("loader:     no tensors: a vocabulary-only file (tokenizer only)\n");
      } else {
        const scheduler::TransformerSpec spec = model::check_model_file(file, *tok);
        std::printf("loader:     loads: %s, %d layers, %d q / %d kv heads x %d, n_embd %d, n_ff %d, vocab %lld\n",
                    spec.arch.c_str(), spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.n_embd,
                    spec.n_ff, static_cast<long long>(spec.n_vocab));
        std::printf("rope:       %s\n", describe_rope(spec.rope, spec.head_dim).c_str());
      }
      if (args.config_path.empty()) return 0;
      if (!shape) fail(ErrorCode::kUnsupported, args.gguf_path, ": the model's attention shape is unknown");
      Args with_shape = args;
      with_shape.shape = *shape;
      with_shape.shape_source = "from " + args.gguf_path;
      return print_preflight(with_shape, config, topology) ? 0 : 1;
    }
    print_system(topology);
    if (!args.config_path.empty() && !print_preflight(args, config, topology)) return 1;
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "longctx-info: %s: %s\n", error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longctx-info: %s\n", e.what());
    return 1;
  }
}
