// The embedded demo model (tools/demo_model.h, tools/DEMO_MODEL.md) and the
// haystack generator (tools/haystack.h): the GGUF loads as a standard Llama
// model; the attention margins the construction claims hold for the file's
// own weights at every distance up to 2^21 (fp64, RoPE as the runtime
// rotates); greedy decoding through model::Model + scheduler::Sequence
// answers the hidden key with dense attention at every depth and with QUEST
// at <= 2% of the cache, and does not with sinks + a local window.
#include "longctx/tools/demo_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "longctx/core/config.h"
#include "longctx/core/error.h"
#include "longctx/cpu/cpu_backend.h"
#include "longctx/model/llama.h"
#include "longctx/scheduler/sequence.h"
#include "longctx/tools/haystack.h"
#include "scheduler/sequence_fixture.h"

namespace longctx::tools {
namespace {

using S = DemoModelShape;
using longctx::testing::topology;

const std::vector<uint8_t>& demo_bytes() {
  static const std::vector<uint8_t> bytes = make_demo_model().to_bytes();
  return bytes;
}

// The demo model loaded once for the end-to-end tests.
struct Loaded {
  cpu::CpuBackend backend;
  std::unique_ptr<model::Model> model;
  Loaded() {
    const std::string path = ::testing::TempDir() + "longctx_demo_model_test.gguf";
    make_demo_model().write(path);
    model = model::Model::open(path, backend);
    std::filesystem::remove(path);
  }
};
Loaded& loaded() {
  static Loaded l;
  return l;
}

// Greedy decoding of `text` (BOS first): the generated pieces until </s>.
std::string greedy_answer(const std::string& yaml, const std::string& text, double* attended = nullptr) {
  Loaded& l = loaded();
  const LongContextConfig config = parse_config(yaml, "<demo test>");
  scheduler::Sequence seq(l.backend, l.model->transformer(), config, &topology());
  const std::vector<int32_t> prompt = l.model->tokenizer().encode(text, true, false);
  std::vector<float> logits = seq.prefill(prompt);
  std::string answer;
  for (int step = 0; step < 12; ++step) {
    const auto id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (l.model->tokenizer().is_end_of_generation(id)) break;
    answer += l.model->tokenizer().token_to_piece(id);
    logits = seq.decode(id);
  }
  if (attended) *attended = seq.stats().mean_attended_fraction();
  return answer;
}

const char* const kCommon = "chunk_size: 512\nmax_seq_len: 4096\nkv_type: f16\ndram_budget: 256MiB\n"
                            "dense_layer_num: 0\nblock_size: 16\n";

TEST(DemoModel, LoadsAsAStandardLlamaModel) {
  const model::Model& m = *loaded().model;
  EXPECT_EQ(m.spec().arch, "llama");
  EXPECT_EQ(m.spec().n_layers, S::kLayers);
  EXPECT_EQ(m.spec().n_heads, S::kHeads);
  EXPECT_EQ(m.spec().n_kv_heads, S::kHeads);
  EXPECT_EQ(m.spec().head_dim, S::kHeadDim);
  EXPECT_EQ(m.spec().rope.theta, S::kRopeTheta);
  EXPECT_EQ(m.spec().rope.n_rot, S::kHeadDim);
  EXPECT_EQ(m.spec().context_length, S::kContextLength);
  for (const char* name : {"token_embd.weight", "output.weight", "output_norm.weight", "blk.1.attn_q.weight",
                           "blk.1.ffn_down.weight"})
    EXPECT_NE(m.gguf().find_tensor(name), nullptr) << name;
  // Every weight is bf16-exact (the low 16 bits of each f32 are zero).
  for (const auto& info : m.gguf().tensors()) {
    for (const float v : m.gguf().tensor_f32(info)) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      ASSERT_EQ(bits & 0xFFFFu, 0u) << info.name;
    }
  }
  // The number is marked by a bare "▁", each digit a token of its own; no
  // other bare "▁" in the key sentence or the question.
  const model::Tokenizer& tok = m.tokenizer();
  const auto ids = tok.encode(demo_key_sentence("73912") + " " + demo_question(), false, false);
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(tok.token_to_piece(id));
  const std::vector<std::string> head = {" The", " pass", " key", " is", " ", "7", "3", "9", "1", "2", "."};
  ASSERT_GE(pieces.size(), head.size());
  EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.begin() + long(head.size())), head);
  EXPECT_EQ(std::count(pieces.begin(), pieces.end(), " "), 2);  // before each of the two numbers
  EXPECT_EQ(pieces.back(), " is");
}

// q.k / sqrt(head_dim) of query (head h, query vector) and key vector at
// distance `dist` after RoPE with the runtime's frequencies: per pair (a, b)
// q . R(-w dist) k = cos(w d)(q0 k0 + q1 k1) + sin(w d)(q0 k1 - q1 k0).
struct PairScores {
  std::vector<double> dot, cross, omega;
  PairScores(const std::vector<double>& q, const std::vector<double>& k) {
    RopeParams rope;
    rope.n_rot = S::kHeadDim;
    rope.theta = S::kRopeTheta;
    for (const float w : rope_inv_freq(rope)) omega.push_back(w);
    for (size_t i = 0; i < omega.size(); ++i) {
      dot.push_back((q[2 * i] * k[2 * i] + q[2 * i + 1] * k[2 * i + 1]) / std::sqrt(double(S::kHeadDim)));
      cross.push_back((q[2 * i] * k[2 * i + 1] - q[2 * i + 1] * k[2 * i]) / std::sqrt(double(S::kHeadDim)));
    }
  }
  double at(int64_t dist) const {
    double s = 0.0;
    for (size_t i = 0; i < omega.size(); ++i) {
      const double a = double(omega[i]) * double(dist);
      s += std::cos(a) * dot[i] + std::sin(a) * cross[i];
    }
    return s;
  }
  // at(d) for every d in [0, max_dist], by rotating each pair's (cos, sin)
  // one step at a time (error ~1e-16 per step, ~1e-9 after 2^21 steps).
  template <typename F>
  void scan(int64_t max_dist, F&& visit) const {
    const size_t n = omega.size();
    std::vector<double> c(n, 1.0), s(n, 0.0), dc(n), ds(n);
    for (size_t i = 0; i < n; ++i) dc[i] = std::cos(double(omega[i])), ds[i] = std::sin(double(omega[i]));
    for (int64_t d = 0; d <= max_dist; ++d) {
      double score = 0.0;
      for (size_t i = 0; i < n; ++i) {
        score += c[i] * dot[i] + s[i] * cross[i];
        const double c2 = c[i] * dc[i] - s[i] * ds[i];
        s[i] = s[i] * dc[i] + c[i] * ds[i];
        c[i] = c2;
      }
      visit(d, score);
    }
  }
};

// Column `col` of head h's rows of a [q_dim, n_embd] weight, times `scale`.
std::vector<double> head_column(const std::vector<float>& w, int h, int col, double scale) {
  std::vector<double> v(S::kHeadDim);
  for (int c = 0; c < S::kHeadDim; ++c) v[size_t(c)] = scale * w[size_t((h * S::kHeadDim + c) * S::kEmbd + col)];
  return v;
}

TEST(DemoModel, AttentionMarginsHoldUpTo2MTokens) {
  const model::GgufFile file = model::GgufFile::from_bytes(demo_bytes(), "demo");
  auto get = [&](const char* name) { return file.tensor_f32(*file.find_tensor(name)); };
  const auto q0 = get("blk.0.attn_q.weight"), k0 = get("blk.0.attn_k.weight");
  const int64_t max_dist = int64_t{2} << 20;
  // Layer 0, head h: the query (bias dim at its nominal value B) against a
  // marker key. Nominal normalized stream = x (the norm weights are B/sqrt(n)).
  for (int h = 0; h < S::kHeads; ++h) {
    SCOPED_TRACE(h);
    const PairScores p(head_column(q0, h, S::kBiasDim, S::kBias), head_column(k0, h, S::kMarkerDim, 1.0));
    const double match = p.at(h + 1);
    EXPECT_GT(match, 24.0);  // > ln(2^21) + 9: beats 2M zero-score keys by e^9
    EXPECT_LT(match, 28.0);
    double worst = -1e300;
    int64_t worst_at = -1;
    p.scan(max_dist, [&](int64_t d, double s) {
      if (d != h + 1 && s > worst) worst = s, worst_at = d;
    });
    EXPECT_NEAR(p.at(worst_at), worst, 1e-6);
    EXPECT_LT(worst, -4.0) << "at distance " << worst_at;  // a marker elsewhere: weight < e^-4 / (keys)
    EXPECT_GT(match - worst, 30.0);
  }
  // Layer 1: a query with slot tag s against a digit key with tag t scores
  // ~40 when t = s + 1 and ~0 otherwise, at every distance.
  const auto q1 = get("blk.1.attn_q.weight"), k1 = get("blk.1.attn_k.weight");
  for (int s = 0; s < S::kKeyDigits; ++s) {
    const int q_col = s == 0 ? S::kMarkerDim : S::kTagDim + s - 1;
    for (int t = 1; t <= S::kKeyDigits; ++t) {
      const PairScores p(head_column(q1, 0, q_col, 1.0), head_column(k1, 0, S::kTagDim + t - 1, 1.0));
      for (const int64_t d : {int64_t{0}, int64_t{1000}, int64_t{1} << 17, int64_t{1} << 20, max_dist}) {
        if (t == s + 1) {
          EXPECT_GT(p.at(d), 36.0) << s << " " << t << " " << d;
        } else {
          EXPECT_NEAR(p.at(d), 0.0, 1e-6) << s << " " << t << " " << d;
        }
      }
    }
  }
}

TEST(DemoModel, DenseAttentionAnswersAtEveryDepth) {
  const model::Tokenizer& tok = loaded().model->tokenizer();
  const std::string yaml = std::string(kCommon) + "policy: dense\ninitial_len: 4\nlocal_windows_len: 16\n";
  for (const double depth : {0.0, 0.45, 1.0}) {
    const Haystack h = make_haystack({.tokens = 2048, .depth = depth, .seed = uint64_t(depth * 10 + 1)}, tok);
    SCOPED_TRACE(haystack_json(h, 0));
    EXPECT_EQ(greedy_answer(yaml, h.text), " " + h.key);
  }
}

TEST(DemoModel, SinksAndLocalWindowDoNotAnswer) {
  const model::Tokenizer& tok = loaded().model->tokenizer();
  const std::string yaml = std::string(kCommon) + "policy: streaming\ninitial_len: 4\nlocal_windows_len: 64\n";
  const Haystack h = make_haystack({.tokens = 2048, .depth = 0.4, .seed = 7}, tok);
  // The first token of the answer ("▁") needs no retrieval; every digit does.
  EXPECT_EQ(greedy_answer(yaml, h.text), " ");
}

TEST(DemoModel, QuestAtTwoPercentAnswers) {
  const model::Tokenizer& tok = loaded().model->tokenizer();
  // 4 sinks + 2 blocks of 16 + a window of 16 = 52 of ~4K tokens (1.3%).
  const std::string yaml = std::string(kCommon) +
                           "policy: select\nrepresentative_type: QUEST\ninitial_len: 4\nlocal_windows_len: 16\n"
                           "second_select_num: 2\nhead_select_mode: SEPARATE\n";
  for (const double depth : {0.15, 0.85}) {
    const Haystack h = make_haystack({.tokens = 4096 - 16, .depth = depth, .seed = 11}, tok);
    SCOPED_TRACE(haystack_json(h, 11));
    double attended = 1.0;
    EXPECT_EQ(greedy_answer(yaml, h.text, &attended), " " + h.key);
    EXPECT_LE(attended, 0.02);
    EXPECT_GT(attended, 0.0);
  }
}

TEST(Haystack, CountsTokensAndPlacesTheKey) {
  const model::Tokenizer& tok = loaded().model->tokenizer();
  for (const int64_t n : {int64_t{40}, int64_t{300}, int64_t{5000}}) {
    for (const double depth : {0.0, 0.5, 1.0, -1.0}) {
      SCOPED_TRACE(std::to_string(n) + " " + std::to_string(depth));
      const Haystack h = make_haystack({.tokens = n, .depth = depth, .seed = uint64_t(n)}, tok);
      const auto ids = tok.encode(h.text, true, false);
      EXPECT_EQ(int64_t(ids.size()), h.n_tokens);
      EXPECT_LE(h.n_tokens, n);
      EXPECT_GT(h.n_tokens, n - 20);  // filled up to one sentence short
      ASSERT_EQ(h.key.size(), size_t(S::kKeyDigits));
      EXPECT_NE(h.key[0], '0');
      std::string digits;
      for (int i = 0; i < S::kKeyDigits; ++i) digits += tok.token_to_piece(ids[size_t(h.key_token + i)]);
      EXPECT_EQ(digits, h.key);
      EXPECT_EQ(tok.token_to_piece(ids[size_t(h.key_token - 1)]), " ");
      EXPECT_TRUE(h.text.ends_with(demo_question()));
      if (depth >= 0) {
        EXPECT_EQ(h.depth, depth);
      }
      EXPECT_GE(h.depth, 0.0);
      EXPECT_LE(h.depth, 1.0);
      // Where the key sentence starts, as a fraction of the text's tokens.
      if (depth == 0.0) {
        EXPECT_EQ(h.key_token, 6);  // BOS, " The pass key is", "▁"
      }
      if (depth == 1.0) {
        EXPECT_GT(double(h.key_token), 0.9 * double(h.n_tokens) - 30);
      }
    }
  }
  // Deterministic from the seed; another seed, another key or filler.
  const Haystack a = make_haystack({.tokens = 500, .seed = 5}, tok), b = make_haystack({.tokens = 500, .seed = 5}, tok);
  EXPECT_EQ(a.text, b.text);
  EXPECT_NE(a.text, make_haystack({.tokens = 500, .seed = 6}, tok).text);
  const std::string json = haystack_json(a, 5);
  EXPECT_NE(json.find("\"key\": \"" + a.key + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"tokens\": " + std::to_string(a.n_tokens)), std::string::npos) << json;
  // Without the question the text ends with filler.
  EXPECT_FALSE(make_haystack({.tokens = 500, .seed = 5, .question = false}, tok).text.ends_with(demo_question()));
  try {
    make_haystack({.tokens = 20}, tok);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_THROW(make_haystack({.tokens = 500, .depth = 1.5}, tok), Error);
}

}  // namespace
}  // namespace longctx::tools
