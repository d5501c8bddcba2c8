// BPE pre-tokenizers: the tokenizer.ggml.pre names llama.cpp b4747 accepts,
// the type each names, and each type's split regexes (PCRE2, UTF + Unicode
// properties). Where a type has several regexes they run in turn, each one
// splitting the pieces the one before left; text no match of a regex covers
// stays a piece of its own, so the pieces always concatenate to the text.
//
// The regexes are llama.cpp's, matched on the text as it is, as Hugging Face
// tokenizers match them. Where llama.cpp's std::regex emulation answers
// otherwise, longctx follows the regex as the model's tokenizer.json writes it:
// - Tekken keeps its tokenizer.json regex with \p{Lu} / \p{Ll} classes, which
//   llama.cpp approximates with ASCII lookaheads ("s\u00c9" is one word there,
//   two here; a combining mark joins the letters here);
// - Llama-3 and Qwen2 keep "(?i:'s|...)" (Unicode case folding: "'\u017f"
//   is a contraction too), where llama.cpp spells out '[sS]...;
// - \p{S} holds '~' (DeepSeek-V3), which llama.cpp's ASCII table leaves out;
// - non-ASCII whitespace stays itself: llama.cpp turns it into \v before the
//   regexes without a \p class, so U+3000, which DeepSeek's lists name in two
//   ranges, never matches those there.
// Non-ASCII characters are written \x{...}.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "longctx/core/error.h"
#include "tokenizer_internal.h"

namespace longctx::model {
namespace {

// GPT-2's split, as llama.cpp lists it (without GPT-2's final "|\s+": the
// only text it would take, one whitespace character before a non-space, is
// left as a piece of its own anyway).
constexpr const char* kGpt2Split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDigit = R"(\p{N})";
constexpr const char* kDigitRun = R"(\p{N}+)";
constexpr const char* kThreeAsciiDigits = R"([0-9][0-9][0-9])";
constexpr const char* kNewline = R"([\r\n])";
// CJK ideographs, U+0800..U+4E00, Hangul.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// Cased letters of many scripts (Latin, Greek, Cyrillic, Armenian, Georgian,
// Cherokee, Glagolitic, Coptic, Deseret, ...) with one optional space before.
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5})"
    R"(\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD})"
    R"(\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15})"
    R"(\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB})"
    R"(\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D})"
    R"(\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E})"
    R"(\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})"
    R"(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB})"
    R"(\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
// ASCII punctuation (and what lies between it: the range :-~ holds the
// letters too), full-width forms, curly quotes, CJK space and full stops.
constexpr const char* kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
// `$` is the end of the piece only (PCRE2_DOLLAR_ENDONLY).
constexpr const char* kTrailingSpace = R"(\s+$)";
constexpr const char* kDeepseekV3Cjk = R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)";
constexpr const char* kDeepseekV3Split =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Everything up to a space or one of the listed punctuation marks (the
// parentheses and bar are literal members of the class, as written upstream).
constexpr const char* kBloomSplit =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";
constexpr const char* kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

using Patterns = std::span<const char* const>;

Patterns patterns_of(PreTokenizer pre) {
  static constexpr const char* kDefault[] = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Split, kDigitRun, kThreeAsciiDigits};
  static constexpr const char* kGpt2[] = {kGpt2Split};
  static constexpr const char* kLlama3[] = {kLlama3Split};
  static constexpr const char* kQwen2[] = {kQwen2Split};
  static constexpr const char* kDeepseekLlm[] = {kNewline,       kDeepseekLetters, kDeepseekPunct,
                                                 kTrailingSpace, kDeepseekCjk,     kDigitRun};
  static constexpr const char* kDeepseekCoder[] = {kNewline, R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, kDigit};
  static constexpr const char* kDeepseekV3[] = {R"(\p{N}{1,3})", kDeepseekV3Cjk, kDeepseekV3Split};
  static constexpr const char* kFalcon[] = {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Split, kThreeAsciiDigits};
  static constexpr const char* kDigitsThenGpt2[] = {kDigit, kGpt2Split};
  static constexpr const char* kBloom[] = {kBloomSplit};
  static constexpr const char* kViking[] = {kBloomSplit, kDigit};
  static constexpr const char* kTekken[] = {kTekkenSplit};
  static constexpr const char* kChameleon[] = {
      R"(<sentinel:[0-9]+>)",         // sentinel tokens
      R"((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)",  // image tokens
      R"(([\t\n]|    |  ))",          // tabs, newlines, runs of 4 or 2 spaces
      kDigit,
      R"([\p{P}!-/:-@\[-`{-~])",      // one punctuation mark or ASCII symbol
      kGpt2Split};
  switch (pre) {
    case PreTokenizer::kDefault: return kDefault;
    case PreTokenizer::kGpt2:
    case PreTokenizer::kMpt:
    case PreTokenizer::kOlmo:
    case PreTokenizer::kJais: return kGpt2;
    case PreTokenizer::kLlama3:
    case PreTokenizer::kDbrx:
    case PreTokenizer::kSmaug:
    case PreTokenizer::kChatglm4: return kLlama3;
    case PreTokenizer::kQwen2:
    case PreTokenizer::kStablelm2: return kQwen2;
    case PreTokenizer::kDeepseekLlm: return kDeepseekLlm;
    case PreTokenizer::kDeepseekCoder: return kDeepseekCoder;
    case PreTokenizer::kDeepseekV3: return kDeepseekV3;
    case PreTokenizer::kFalcon: return kFalcon;
    case PreTokenizer::kStarcoder:
    case PreTokenizer::kRefact:
    case PreTokenizer::kCommandR:
    case PreTokenizer::kSmollm:
    case PreTokenizer::kCodeshell:
    case PreTokenizer::kExaone:
    case PreTokenizer::kMinerva: return kDigitsThenGpt2;
    case PreTokenizer::kPoro:
    case PreTokenizer::kBloom:
    case PreTokenizer::kGpt3Finnish: return kBloom;
    case PreTokenizer::kViking: return kViking;
    case PreTokenizer::kTekken: return kTekken;
    case PreTokenizer::kChameleon: return kChameleon;
  }
  fail(ErrorCode::kInvalidArgument, "tokenizer: unknown pre-tokenizer type ", int(pre));
}

// Indexed by PreTokenizer.
constexpr PreTokenizerInfo kInfo[] = {
    {"gpt-2", false, false},        {"llama-bpe", true, true},       {"qwen2", false, false},
    {"default", false, false},      {"deepseek-llm", false, false},  {"deepseek-coder", false, false},
    {"deepseek-v3", false, false},  {"falcon", false, false},        {"mpt", false, false},
    {"starcoder", false, false},    {"refact", false, false},        {"command-r", false, false},
    {"stablelm2", false, false},    {"olmo", false, false},          {"dbrx", false, false},
    {"smaug-bpe", false, false},    {"poro-chat", false, false},     {"chatglm-bpe", false, false},
    {"viking", false, false},       {"jais", false, false},          {"tekken", true, true},
    {"smollm", false, false},       {"codeshell", false, false},     {"bloom", false, false},
    {"gpt3-finnish", false, false}, {"exaone", false, false},        {"chameleon", false, true},
    {"minerva-7b", false, false},
};
static_assert(std::size(kInfo) == size_t(kPreTokenizerCount));

// The names of llama.cpp b4747's llama_vocab::impl::load, in its order.
constexpr std::pair<std::string_view, PreTokenizer> kNames[] = {
    {"default", PreTokenizer::kDefault},
    {"llama3", PreTokenizer::kLlama3},
    {"llama-v3", PreTokenizer::kLlama3},
    {"llama-bpe", PreTokenizer::kLlama3},
    {"falcon3", PreTokenizer::kLlama3},
    {"deepseek-llm", PreTokenizer::kDeepseekLlm},
    {"deepseek-coder", PreTokenizer::kDeepseekCoder},
    {"deepseek-v3", PreTokenizer::kDeepseekV3},
    {"falcon", PreTokenizer::kFalcon},
    {"mpt", PreTokenizer::kMpt},
    {"starcoder", PreTokenizer::kStarcoder},
    {"gpt-2", PreTokenizer::kGpt2},
    {"phi-2", PreTokenizer::kGpt2},
    {"jina-es", PreTokenizer::kGpt2},
    {"jina-de", PreTokenizer::kGpt2},
    {"gigachat", PreTokenizer::kGpt2},
    {"jina-v1-en", PreTokenizer::kGpt2},
    {"jina-v2-es", PreTokenizer::kGpt2},
    {"jina-v2-de", PreTokenizer::kGpt2},
    {"jina-v2-code", PreTokenizer::kGpt2},
    {"roberta-bpe", PreTokenizer::kGpt2},
    {"refact", PreTokenizer::kRefact},
    {"command-r", PreTokenizer::kCommandR},
    {"qwen2", PreTokenizer::kQwen2},
    {"deepseek-r1-qwen", PreTokenizer::kQwen2},
    {"stablelm2", PreTokenizer::kStablelm2},
    {"olmo", PreTokenizer::kOlmo},
    {"dbrx", PreTokenizer::kDbrx},
    {"smaug-bpe", PreTokenizer::kSmaug},
    {"poro-chat", PreTokenizer::kPoro},
    {"chatglm-bpe", PreTokenizer::kChatglm4},
    {"viking", PreTokenizer::kViking},
    {"jais", PreTokenizer::kJais},
    {"tekken", PreTokenizer::kTekken},
    {"smollm", PreTokenizer::kSmollm},
    {"codeshell", PreTokenizer::kCodeshell},
    {"bloom", PreTokenizer::kBloom},
    {"gpt3-finnish", PreTokenizer::kGpt3Finnish},
    {"exaone", PreTokenizer::kExaone},
    {"chameleon", PreTokenizer::kChameleon},
    {"minerva-7b", PreTokenizer::kMinerva},
    {"megrez", PreTokenizer::kQwen2},
};

}  // namespace

const PreTokenizerInfo& pre_tokenizer_info(PreTokenizer pre) {
  if (int(pre) >= kPreTokenizerCount)
    fail(ErrorCode::kInvalidArgument, "tokenizer: unknown pre-tokenizer type ", int(pre));
  return kInfo[size_t(pre)];
}

PreTokenizer parse_pre_tokenizer(std::string_view name) {
  if (name.empty()) return PreTokenizer::kDefault;
  for (const auto& [known, pre] : kNames)
    if (known == name) return pre;
  fail(ErrorCode::kUnsupported, "tokenizer.ggml.pre '", name,
       "' is not a pre-tokenizer llama.cpp b4747 knows (e.g. default, gpt-2, llama-bpe, qwen2, deepseek-llm, "
       "falcon; the list is in README.md)");
}

std::vector<std::pair<std::string_view, PreTokenizer>> pre_tokenizer_names() {
  return {std::begin(kNames), std::end(kNames)};
}

namespace detail {

struct PreTokenizerRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

PreTokenizerRegex::PreTokenizerRegex(PreTokenizer pre) {
  for (const char* pattern : patterns_of(pre)) {
    auto& c = codes_.emplace_back(std::make_unique<Code>());
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    // UCP: \s, \p{L} and \p{N} follow Unicode; MATCH_INVALID_UTF: bytes that
    // are not UTF-8 never match and stay pieces of their own; DOLLAR_ENDONLY:
    // `$` is the end of the piece, never before a final newline.
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &error,
                            &error_offset, nullptr);
    if (c->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      fail(ErrorCode::kInternal, "tokenizer: pre-tokenizer pattern of ", pre_tokenizer_info(pre).name,
           " does not compile at offset ", error_offset, ": ", reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // optional speed-up: the interpreter runs without it
  }
}

PreTokenizerRegex::~PreTokenizerRegex() = default;

namespace {

using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;

// Splits `text` by one pattern: its matches, and the text between them.
template <typename Piece>
void split_by(const pcre2_code* code, pcre2_match_data* data, std::string_view text, Piece&& piece) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  uint32_t options = 0;
  size_t pos = 0, gap = 0;  // [gap, match start) is text no match covered
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, options, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && options == 0) {  // the interpreter has no such limit
      options = PCRE2_NO_JIT;
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail(ErrorCode::kInternal, "tokenizer: pre-tokenizer match failed at byte ", pos, ": ",
           reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end <= begin) {  // the patterns match no empty string; be safe anyway
      pos = begin + 1;
      continue;
    }
    if (begin > gap) piece(text.substr(gap, begin - gap));
    piece(text.substr(begin, end - begin));
    pos = gap = end;
  }
  if (gap < text.size()) piece(text.substr(gap));
}

}  // namespace

void PreTokenizerRegex::split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
  std::vector<MatchData> data;
  for (const auto& c : codes_) {
    data.emplace_back(pcre2_match_data_create_from_pattern(c->code, nullptr), &pcre2_match_data_free);
    if (!data.back()) fail(ErrorCode::kOutOfMemory, "tokenizer: cannot allocate PCRE2 match data");
  }
  // Every pattern but the last splits the pieces into new pieces; the last
  // hands its pieces to the caller. Each piece is matched as a subject of its
  // own, so lookaheads and `$` stop at its end.
  std::vector<std::string_view> pieces{text}, next;
  const size_t last = codes_.size() - 1;
  for (size_t k = 0; k < last; ++k) {
    next.clear();
    for (const std::string_view p : pieces)
      split_by(codes_[k]->code, data[k].get(), p, [&](std::string_view s) { next.push_back(s); });
    pieces.swap(next);
  }
  for (const std::string_view p : pieces) split_by(codes_[last]->code, data[last].get(), p, piece);
}

}  // namespace detail

std::vector<std::string> pre_tokenize(PreTokenizer pre, std::string_view text) {
  std::vector<std::string> pieces;
  detail::PreTokenizerRegex(pre).split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

}  // namespace longctx::model
