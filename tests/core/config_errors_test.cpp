// Tests of the YAML configuration loader (core/src/config*.cpp): every kind of
// error with its file:line:col, overrides, validate_config.
#include "longctx/core/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "config_fixture.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using RT = RepresentativeType;
using namespace config_testing;

// ---- errors and where they point ---------------------------------------------
TEST(ConfigErrors, WrongTypeExample) {
  EXPECT_EQ(config_error("chunk_size: 256\nmax_seq_len: 8192\nblock_size: abc\n", {}, "configs/x.yaml"),
            "configs/x.yaml:3:13: key 'block_size': expected an integer, got 'abc'");
}

TEST(ConfigErrors, UnknownKeys) {
  EXPECT_EQ(config_error("chunk_size: 256\nblok_size: 16\n"),
            "x.yaml:2:1: unknown key 'blok_size' (did you mean 'block_size'?)");
  EXPECT_EQ(config_error("razor:\n  sink: 4\n"), "x.yaml:2:3: unknown key 'razor.sink' (did you mean 'razor.sinks'?)");
  EXPECT_EQ(config_error("alpha: 0.5\n"), "x.yaml:1:1: unknown key 'alpha' (did you mean 'budget.alpha'?)");
  EXPECT_EQ(config_error("anchor_nums: 2\n"), "x.yaml:1:1: unknown key 'anchor_nums' (did you mean 'anchor_num'?)");
  EXPECT_EQ(config_error("zzzzzzzz: 1\n"), "x.yaml:1:1: unknown key 'zzzzzzzz'");
  EXPECT_EQ(config_error("block_size: 16\nblock_size: 32\n"),
            "x.yaml:2:1: key 'block_size' is given twice (also at x.yaml:1:13)");
  EXPECT_EQ(config_error("quoka: {n_q: 4}\nquoka: {b_sa: 4}\n"), "x.yaml:2:1: section 'quoka' is given twice");
  EXPECT_EQ(config_error("budget: 5\n"), "x.yaml:1:9: key 'budget': expected a map of budget.* keys, got '5'");
  EXPECT_EQ(config_error("[1, 2]: 3\n"), "x.yaml:1:1: expected a key name, got a list");
  EXPECT_EQ(config_error("budget.alpha: 0.3\n"),
            "x.yaml:1:1: key 'budget.alpha' must be written inside its section: 'budget:' then '  alpha: ...'");
}

TEST(ConfigErrors, TopLevelMustBeAMap) {
  EXPECT_EQ(config_error("- 1\n- 2\n"), "x.yaml:1:1: the top level must be a map of keys (key: value), got a list");
  EXPECT_EQ(config_error("hello\n"), "x.yaml:1:1: the top level must be a map of keys (key: value), got 'hello'");
}

TEST(ConfigErrors, OneDocumentOnly) {
  EXPECT_EQ(config_error("block_size: 16\n---\nblock_size: 32\n"),
            "x.yaml:3:1: a config is one YAML document; this is a second one (remove the '---' before it)");
  EXPECT_EQ(parse_config("---\nblock_size: 16\n...\n", "d").block_size, 16);
  // A document after an empty one is still a second document; empty ones are ignored.
  EXPECT_EQ(config_error("block_size: 16\n---\n---\nchunk_size: 32\n"),
            "x.yaml:4:1: a config is one YAML document; this is a second one (remove the '---' before it)");
  EXPECT_EQ(parse_config("block_size: 16\n---\n---\n", "d").block_size, 16);
}

// yaml-cpp 0.7's LoadAll never returns on these (a stray ',' is never
// consumed; its memory grows until the process is killed): a syntax error here.
TEST(ConfigErrors, StrayFlowEntryIsASyntaxError) {
  EXPECT_EQ(config_error(","), "x.yaml:1:1: YAML syntax error: cannot read a value from ','");
  EXPECT_EQ(config_error("\n\n  , # a comma\n"), "x.yaml:3:3: YAML syntax error: cannot read a value from ', # a comma'");
  EXPECT_EQ(config_error(",\nblock_size: 16\n"), "x.yaml:1:1: YAML syntax error: cannot read a value from ','");
  EXPECT_EQ(config_error(", , ,"), "x.yaml:1:1: YAML syntax error: cannot read a value from ', , ,'");
}

TEST(ConfigErrors, YamlSyntax) {
  const std::string message = config_error("block_size: 16\nnuma: [0, 1\n");
  EXPECT_TRUE(starts_with(message, "x.yaml:3:1: YAML syntax error: ")) << message;
  const std::string tab = config_error("block_size: 16\n\tchunk_size: 16\n");
  EXPECT_TRUE(starts_with(tab, "x.yaml:2:1: YAML syntax error: ")) << tab;
  // Deep nesting is refused by yaml-cpp's depth guard, not by a crash.
  const std::string deep = config_error("numa: " + std::string(100000, '[') + "\n");
  EXPECT_NE(deep.find("YAML syntax error"), std::string::npos) << deep;
}

TEST(ConfigErrors, Ranges) {
  EXPECT_EQ(config_error("block_size: 0\n"), "x.yaml:1:13: key 'block_size': must be in 1..1024, got 0");
  EXPECT_EQ(config_error("block_size: 1025\n"), "x.yaml:1:13: key 'block_size': must be in 1..1024, got 1025");
  EXPECT_EQ(config_error("chunk_size: 1048577\n"), "x.yaml:1:13: key 'chunk_size': must be in 1..1048576, got 1048577");
  EXPECT_EQ(config_error("max_seq_len: 0\n"), "x.yaml:1:14: key 'max_seq_len': must be in 1..2147483647, got 0");
  EXPECT_EQ(config_error("layer_step: 0\n"), "x.yaml:1:13: key 'layer_step': must be >= 1, got 0");
  EXPECT_EQ(config_error("token_step: 0\n"), "x.yaml:1:13: key 'token_step': must be >= 1, got 0");
  EXPECT_EQ(config_error("preselect_block_count: 0\n"),
            "x.yaml:1:24: key 'preselect_block_count': must be >= 1, got 0");
  EXPECT_EQ(config_error("razor: {buffer_ratio: 0}\n"), "x.yaml:1:23: key 'razor.buffer_ratio': must be >= 1, got 0");
  EXPECT_EQ(config_error("razor: {buffer_min: -1}\n"), "x.yaml:1:21: key 'razor.buffer_min': must be >= 0, got -1");
  EXPECT_EQ(config_error("quoka: {n_q: 0}\n"), "x.yaml:1:14: key 'quoka.n_q': must be >= 1, got 0");
  EXPECT_EQ(config_error("quoka: {b_sa: 0}\n"), "x.yaml:1:15: key 'quoka.b_sa': must be >= 1, got 0");
  EXPECT_EQ(config_error("second_select_num: -1\n"), "x.yaml:1:20: key 'second_select_num': must be >= 0, got -1");
}

TEST(ConfigErrors, ImpossibleCombinationsPointAtTheLaterKey) {
  EXPECT_EQ(config_error("max_seq_len: 4096\nlocal_windows_len: 8192\n"),
            "x.yaml:2:20: key 'local_windows_len': the local window (local_windows_len = 8192) is larger "
            "than max_seq_len (4096)");
  // Written the other way round, the later key is max_seq_len.
  EXPECT_TRUE(starts_with(config_error("local_windows_len: 8192\nmax_seq_len: 4096\n"),
                          "x.yaml:2:14: key 'max_seq_len': the local window"));
  EXPECT_EQ(config_error("max_seq_len: 1000\nlocal_windows_len: 600\ninitial_len: 500\n"),
            "x.yaml:3:14: key 'initial_len': initial_len + local_windows_len = 500 + 600 = 1100 tokens is "
            "larger than max_seq_len (1000)");
  EXPECT_EQ(config_error("max_seq_len: 4096\nlocal_windows_len: 0\ninitial_len: 0\nsecond_select_num: 64\n"),
            "x.yaml:4:20: key 'second_select_num': selection larger than what exists: second_select_num * "
            "block_size = 64 * 128 = 8192 tokens is larger than max_seq_len (4096)");
  EXPECT_EQ(config_error("representative_type: QUEST\nrepresentative_num: 3\n"),
            "x.yaml:2:21: key 'representative_num': QUEST keeps two representatives (channel-wise min and "
            "max); representative_num must be 2, got 3");
  EXPECT_EQ(config_error("representative_num: 2\nrepresentative_type: MEAN\n"),
            "x.yaml:2:22: key 'representative_type': MEAN keeps one representative per block; "
            "representative_num must be 1, got 2");
  // representative_num alone is checked against the default type (QUEST).
  EXPECT_TRUE(starts_with(config_error("representative_num: 4\n"), "x.yaml:1:21: key 'representative_num': QUEST"));
  EXPECT_TRUE(starts_with(config_error("representative_type: FIX\nrepresentative_num: 200\n"),
                          "x.yaml:2:21: key 'representative_num': FIX keeps representative_num keys of a block"));

  const std::string preselect =
      "max_seq_len: 4096\nlocal_windows_len: 0\nsecond_select_num: 1\npreselect_block_count: 64\n";
  EXPECT_NO_THROW(parse_config(preselect, "p"));  // preselection off: the count is not used
  EXPECT_EQ(config_error(preselect + "preselect_block: true\n"),
            "x.yaml:5:18: key 'preselect_block': preselection larger than what exists: preselect_block_count "
            "* block_size = 64 * 128 = 8192 tokens is larger than max_seq_len (4096)");

  const std::string quoka = "max_seq_len: 8192\nlocal_windows_len: 0\nsecond_select_num: 1\nquoka:\n  b_sa: 10000\n";
  EXPECT_NO_THROW(parse_config(quoka, "q"));  // QUOKA off
  EXPECT_EQ(config_error(quoka + "  enabled: true\n"),
            "x.yaml:6:12: key 'quoka.enabled': QUOKA cannot keep more cached keys than exist: quoka.b_sa "
            "(10000) is larger than max_seq_len (8192)");
}

TEST(ConfigErrors, PolicyKeys) {
  // The names of every policy, any case.
  EXPECT_EQ(parse_config("policy: select\n", "p").policy, SelectionPolicy::kSelect);
  EXPECT_EQ(parse_config("policy: DENSE\n", "p").policy, SelectionPolicy::kDense);
  EXPECT_EQ(parse_config("policy: Streaming\n", "p").policy, SelectionPolicy::kStreaming);
  EXPECT_EQ(parse_config("policy: h2o\n", "p").policy, SelectionPolicy::kH2O);
  EXPECT_EQ(config_error("policy: quest\n"),
            "x.yaml:1:9: key 'policy': expected one of select, dense, streaming, h2o, got 'quest'");

  // StreamingLLM and H2O choose their own tokens: no preselection.
  EXPECT_EQ(config_error("preselect_block: true\npolicy: streaming\n"),
            "x.yaml:2:9: key 'policy': policy streaming chooses its own tokens and cannot use preselect_block: "
            "true; set preselect_block: false or policy: select");
  EXPECT_TRUE(starts_with(config_error("policy: h2o\npreselect_block: true\n"),
                          "x.yaml:2:18: key 'preselect_block': policy h2o chooses its own tokens"));
  EXPECT_NO_THROW(parse_config("policy: dense\npreselect_block: true\n", "p"));

  // Pooling kernels are odd.
  EXPECT_EQ(config_error("preselect:\n  pool_kernel: 6\n"),
            "x.yaml:2:16: key 'preselect.pool_kernel': must be odd (a window centred on each token), got 6");
  EXPECT_EQ(config_error("preselect: {pool_kernel: 0}\n"),
            "x.yaml:1:26: key 'preselect.pool_kernel': must be >= 1, got 0");
  EXPECT_EQ(parse_config("preselect: {pool_kernel: 1}\n", "p").preselect.pool_kernel, 1);
  EXPECT_EQ(config_error("preselect: {window: 0}\n"), "x.yaml:1:21: key 'preselect.window': must be >= 1, got 0");
  EXPECT_EQ(config_error("preselect: {pool: mean}\n"),
            "x.yaml:1:19: key 'preselect.pool': expected one of max, avg, got 'mean'");
  EXPECT_EQ(config_error("preselect: {gqa_reduce: mean}\n"),
            "x.yaml:1:25: key 'preselect.gqa_reduce': expected one of sum, max, got 'mean'");

  // H2O: ratio in [0, 1]; a budget larger than what exists is refused only when H2O runs.
  EXPECT_EQ(config_error("h2o: {heavy_ratio: 1.5}\n"), "x.yaml:1:20: key 'h2o.heavy_ratio': must be in [0, 1], got 1.5");
  EXPECT_EQ(config_error("h2o: {budget_tokens: -1}\n"),
            "x.yaml:1:22: key 'h2o.budget_tokens': must be >= 0, got -1");
  const std::string big = "max_seq_len: 4096\nlocal_windows_len: 0\ninitial_len: 0\nh2o: {budget_tokens: 5000}\n";
  EXPECT_NO_THROW(parse_config(big, "h"));
  EXPECT_EQ(config_error(big + "policy: h2o\n"),
            "x.yaml:5:9: key 'policy': H2O cannot keep more tokens than exist: its budget (5000 tokens) is "
            "larger than max_seq_len (4096)");
  // The default budget is what block selection attends.
  EXPECT_EQ(config_error("max_seq_len: 8192\nsecond_select_num: 32\npolicy: h2o\n"),
            "x.yaml:3:9: key 'policy': H2O cannot keep more tokens than exist: its budget (8320 tokens = "
            "initial_len + second_select_num * block_size + local_windows_len) is larger than max_seq_len (8192)");
}

TEST(ConfigPolicy, H2OBudgetTokens) {
  LongContextConfig c;
  EXPECT_EQ(h2o_budget_tokens(c), 128 + 32 * 128 + 4096);
  c.initial_len = 4;
  c.second_select_num = 3;
  c.block_size = 16;
  c.local_windows_len = 10;
  EXPECT_EQ(h2o_budget_tokens(c), 4 + 48 + 10);
  c.h2o.budget_tokens = 7;
  EXPECT_EQ(h2o_budget_tokens(c), 7);
}

TEST(ConfigErrors, UnusualButPossibleIsAccepted) {
  // Nothing selected (sinks + window only), a chunk longer than the capacity,
  // a budget of everything: unusual, not impossible.
  const LongContextConfig c = parse_config(
      "max_seq_len: 100\nchunk_size: 4096\nblock_size: 10\nsecond_select_num: 10\nlocal_windows_len: 100\n"
      "initial_len: 0\nrepresentative_type: DYNAMIC\nrepresentative_num: 10\n",
      "u");
  EXPECT_EQ(c.second_select_num * c.block_size, c.max_seq_len);
  EXPECT_NO_THROW(parse_config("max_seq_len: 64\nsecond_select_num: 0\nlocal_windows_len: 0\ninitial_len: 0\n", "u"));
}

// ---- overrides ---------------------------------------------------------------

TEST(ConfigOverrides, ApplyOnTopOfTheFile) {
  const LongContextConfig c =
      parse_config("block_size: 16\nbudget: {alpha: 0.5}\n", "o.yaml",
                   {"block_size=32", "budget.policy=adaptive", "numa=[0, 1]", "razor.retrieval_heads = heads.txt",
                    "dram_budget=1 GiB", "quoka.enabled=true"});
  EXPECT_EQ(c.block_size, 32);
  EXPECT_EQ(c.budget.policy, BudgetConfig::Policy::kAdaptive);
  EXPECT_EQ(c.budget.alpha, 0.5);
  EXPECT_EQ(c.numa.nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.razor.retrieval_heads, "heads.txt");
  EXPECT_EQ(c.dram_budget, uint64_t{1} << 30);
  EXPECT_TRUE(c.quoka.enabled);
  // The last override of a key wins; an override replaces a bad file value unseen.
  EXPECT_EQ(parse_config("block_size: abc\n", "o", {"block_size=8", "block_size=64"}).block_size, 64);
  // An alias overrides the other spelling; the num default follows the new type.
  const LongContextConfig alias = parse_config("representative_type: QUEST\n", "o", {"anchor_type=MAX"});
  EXPECT_EQ(alias.representative_type, RT::kMax);
  EXPECT_EQ(alias.representative_num, 1);
}

TEST(ConfigOverrides, ErrorsNameTheOverride) {
  EXPECT_EQ(config_error("", {"block_size=0"}), "override 'block_size=0': key 'block_size': must be in 1..1024, got 0");
  EXPECT_EQ(config_error("", {"block_size=abc"}),
            "override 'block_size=abc': key 'block_size': expected an integer, got 'abc'");
  EXPECT_EQ(config_error("", {"blok_size=3"}), "override 'blok_size=3': unknown key 'blok_size' (did you mean 'block_size'?)");
  EXPECT_EQ(config_error("", {"block_size"}), "override 'block_size': expected key=value or section.key=value");
  EXPECT_EQ(config_error("", {"budget=1"}),
            "override 'budget=1': key 'budget' is a section; override its keys one by one, as 'budget.KEY=VALUE'");
  EXPECT_EQ(config_error("", {"numa=[0, 0]"}), "override 'numa=[0, 0]': key 'numa': NUMA node 0 is listed twice");
  EXPECT_TRUE(starts_with(config_error("", {"numa=[0, 1"}), "override 'numa=[0, 1': key 'numa': YAML syntax error"));
  EXPECT_EQ(config_error("", {"block_size="}), "override 'block_size=': key 'block_size': expected an integer, got nothing");
  // Combination errors point at the override when it is the later key.
  EXPECT_TRUE(starts_with(config_error("max_seq_len: 4096\n", {"local_windows_len=8192"}),
                          "override 'local_windows_len=8192': key 'local_windows_len': the local window"));
  EXPECT_TRUE(starts_with(config_error("local_windows_len: 8192\n", {"max_seq_len=4096"}),
                          "override 'max_seq_len=4096': key 'max_seq_len': the local window"));
  // A file error stays a file error when the override does not touch it.
  EXPECT_EQ(config_error("block_size: abc\n", {"chunk_size=64"}, "f.yaml"),
            "f.yaml:1:13: key 'block_size': expected an integer, got 'abc'");
}

// ---- validate_config on structs built in code ------------------------------------

TEST(ConfigValidate, NamesTheKeyWithoutALocation) {
  LongContextConfig c;
  c.block_size = 0;
  EXPECT_EQ(validation_error(c), "key 'block_size': must be in 1..1024, got 0");

  c = LongContextConfig{};
  c.max_seq_len = 4096;
  c.local_windows_len = 8192;
  EXPECT_EQ(validation_error(c),
            "key 'local_windows_len': the local window (local_windows_len = 8192) is larger than max_seq_len (4096)");

  c = LongContextConfig{};
  c.max_seq_len = 2048;
  c.local_windows_len = 0;
  EXPECT_TRUE(starts_with(validation_error(c), "key 'second_select_num': selection larger than what exists"));

  c = LongContextConfig{};
  c.representative_type = RT::kMax;  // representative_num stays 2
  EXPECT_TRUE(starts_with(validation_error(c), "key 'representative_num': MAX keeps one representative"));

  c = LongContextConfig{};
  c.gqa_reduce = Reduce::kMean;
  EXPECT_EQ(validation_error(c), "key 'gqa_reduce': must be one of sum, max, got mean");

  c = LongContextConfig{};
  c.dynamic_reduce = Reduce::kSum;
  EXPECT_EQ(validation_error(c), "key 'dynamic_reduce': must be one of max, mean, got sum");

  c = LongContextConfig{};
  c.budget.alpha = std::nan("");
  EXPECT_EQ(validation_error(c), "key 'budget.alpha': must be in [0, 1], got nan");

  c = LongContextConfig{};
  c.budget.p = 1.5;
  EXPECT_EQ(validation_error(c), "key 'budget.p': must be in [0, 1], got 1.5");

  c = LongContextConfig{};
  c.budget.min_blocks = 9;
  c.budget.max_blocks = 4;
  EXPECT_NE(validation_error(c).find("budget.min_blocks = 9 is more than budget.max_blocks = 4"), std::string::npos)
      << validation_error(c);

  c = LongContextConfig{};
  c.tail = TailMode::kEstimate;
  c.policy = SelectionPolicy::kStreaming;
  EXPECT_NE(validation_error(c).find("tail: estimate estimates the context blocks a select step leaves out, but "
                                     "policy is streaming"),
            std::string::npos)
      << validation_error(c);
  c.policy = SelectionPolicy::kSelect;
  EXPECT_NO_THROW(validate_config(c));
  c.razor.retrieval_heads = "heads.txt";
  EXPECT_NE(validation_error(c).find("tail: estimate with razor.retrieval_heads"), std::string::npos)
      << validation_error(c);

  c = LongContextConfig{};
  c.max_seq_len = int64_t{1} << 40;
  EXPECT_EQ(validation_error(c), "key 'max_seq_len': must be in 1..2147483647, got 1099511627776");

  c = LongContextConfig{};
  c.representative_type = static_cast<RT>(17);
  EXPECT_EQ(validation_error(c), "key 'representative_type': must be one of MAX, MEAN, QUEST, FIX, DYNAMIC, got invalid");

  c = LongContextConfig{};
  c.kv_type = static_cast<DType>(9);
  EXPECT_EQ(validation_error(c), "key 'kv_type': must be one of f32, f16, bf16, q8_0, got dtype code 9");

  c = LongContextConfig{};
  c.numa.kind = NumaPolicy::Kind::kNodes;
  EXPECT_EQ(validation_error(c), "key 'numa': an empty list of NUMA nodes; write 'none' or 'auto' instead");
  c.numa.nodes = {0, 2, 2};
  EXPECT_EQ(validation_error(c), "key 'numa': NUMA node 2 is listed twice");
  c.numa.nodes = {-1};
  EXPECT_EQ(validation_error(c), "key 'numa': NUMA node index: must be >= 0, got -1");
  c.numa.kind = NumaPolicy::Kind::kAuto;
  c.numa.nodes = {0};
  EXPECT_TRUE(starts_with(validation_error(c), "key 'numa': nodes are listed but the kind is not kNodes"));

  c = LongContextConfig{};
  c.quoka.enabled = true;
  c.quoka.b_sa = 200000;
  EXPECT_TRUE(starts_with(validation_error(c), "key 'quoka.b_sa': QUOKA cannot keep more cached keys"));
}

}  // namespace
}  // namespace longctx
