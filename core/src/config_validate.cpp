// The combination rules of the config (keys that are valid alone but not
// together) and the check of a whole config: every key's range, then every
// rule, naming the involved key written last.
#include <string>
#include <string_view>
#include <vector>

#include "config_internal.h"
#include "longctx/core/error.h"

namespace longctx::config_detail {
namespace {

std::string representative_num_problem(const Config& c) {
  const char* type = representative_type_name(c.representative_type);
  const int num = c.representative_num;
  switch (c.representative_type) {
    case RepresentativeType::kMax:
    case RepresentativeType::kMean:
      if (num == 1) return {};
      return str_cat(type, " keeps one representative per block; representative_num must be 1, got ", num);
    case RepresentativeType::kQuest:
      if (num == 2) return {};
      return str_cat("QUEST keeps two representatives (channel-wise min and max); "
                     "representative_num must be 2, got ", num);
    case RepresentativeType::kFix:
    case RepresentativeType::kDynamic:
      if (num >= 1 && num <= c.block_size) return {};
      return str_cat(type, " keeps representative_num keys of a block of block_size = ", c.block_size,
                     " tokens; representative_num must be in 1..", c.block_size, ", got ", num);
  }
  return {};  // an invalid type is reported by its own key
}

}  // namespace

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = [] {
    std::vector<Rule> r;
    r.push_back({{"local_windows_len", "max_seq_len"},
                 "`local_windows_len` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   if (c.local_windows_len <= c.max_seq_len) return {};
                   return str_cat("the local window (local_windows_len = ", c.local_windows_len,
                                  ") is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"initial_len", "local_windows_len", "max_seq_len"},
                 "`initial_len` + `local_windows_len` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t always = int64_t{c.initial_len} + c.local_windows_len;
                   if (always <= c.max_seq_len) return {};
                   return str_cat("initial_len + local_windows_len = ", c.initial_len, " + ",
                                  c.local_windows_len, " = ", always, " tokens is larger than max_seq_len (",
                                  c.max_seq_len, ")");
                 }});
    r.push_back({{"second_select_num", "block_size", "max_seq_len"},
                 "`second_select_num` * `block_size` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t tokens = int64_t{c.second_select_num} * c.block_size;
                   if (tokens <= c.max_seq_len) return {};
                   return str_cat("selection larger than what exists: second_select_num * block_size = ",
                                  c.second_select_num, " * ", c.block_size, " = ", tokens,
                                  " tokens is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"preselect_block_count", "preselect_block", "block_size", "max_seq_len"},
                 "with `preselect_block`: `preselect_block_count` * `block_size` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t tokens = int64_t{c.preselect_block_count} * c.block_size;
                   if (!c.preselect_block || tokens <= c.max_seq_len) return {};
                   return str_cat("preselection larger than what exists: preselect_block_count * block_size = ",
                                  c.preselect_block_count, " * ", c.block_size, " = ", tokens,
                                  " tokens is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"tail", "policy"},
                 "`tail: estimate` needs `policy: select` (the other policies select no blocks)",
                 [](const Config& c) -> std::string {
                   if (c.tail == TailMode::kDrop || c.policy == SelectionPolicy::kSelect) return {};
                   return str_cat("tail: estimate estimates the context blocks a select step leaves out, but policy is ",
                                  selection_policy_name(c.policy));
                 }});
    r.push_back({{"rerank", "policy", "budget.mode", "razor.retrieval_heads"},
                 "`rerank: tokens` needs `policy: select`, `budget.mode: top_k` and no RazorAttention",
                 [](const Config& c) -> std::string {
                   if (c.rerank == RerankMode::kNone) return {};
                   if (c.policy != SelectionPolicy::kSelect)
                     return str_cat("rerank: tokens reranks the blocks a select step chooses, but policy is ",
                                    selection_policy_name(c.policy));
                   if (c.budget.mode != BudgetConfig::Mode::kTopK)
                     return "rerank: tokens keeps second_select_num x block_size tokens, a top_k budget; "
                            "budget.mode is top_p";
                   if (!c.razor.retrieval_heads.empty())
                     return "rerank: tokens with razor.retrieval_heads: RazorAttention selects its own tokens";
                   return {};
                 }});
    r.push_back({{"speculate", "policy"},
                 "`speculate` needs `policy: select`",
                 [](const Config& c) -> std::string {
                   if (!c.speculate || c.policy == SelectionPolicy::kSelect) return {};
                   return str_cat("speculate reuses a select step's blocks, but policy is ",
                                  selection_policy_name(c.policy));
                 }});
    r.push_back({{"tail", "razor.retrieval_heads"},
                 "`tail: estimate` and RazorAttention (`razor.retrieval_heads`) are not combined",
                 [](const Config& c) -> std::string {
                   if (c.tail == TailMode::kDrop || c.razor.retrieval_heads.empty()) return {};
                   return "tail: estimate with razor.retrieval_heads: RazorAttention already compensates what its "
                          "heads drop; use one or the other";
                 }});
    r.push_back({{"budget.min_blocks", "budget.max_blocks"},
                 "`budget.min_blocks` <= `budget.max_blocks` unless `budget.max_blocks` is 0 (no limit)",
                 [](const Config& c) -> std::string {
                   if (c.budget.max_blocks == 0 || c.budget.min_blocks <= c.budget.max_blocks) return {};
                   return str_cat("budget.min_blocks = ", c.budget.min_blocks, " is more than budget.max_blocks = ",
                                  c.budget.max_blocks);
                 }});
    r.push_back({{"representative_num", "representative_type", "block_size"},
                 "`representative_num` is 1 for MAX and MEAN, 2 for QUEST, 1..`block_size` for FIX "
                 "and DYNAMIC",
                 representative_num_problem});
    r.push_back({{"preselect_block", "policy"},
                 "`preselect_block` only with `policy: select` or `dense` (StreamingLLM and H2O choose "
                 "their own tokens)",
                 [](const Config& c) -> std::string {
                   const bool own_tokens = c.policy == SelectionPolicy::kStreaming || c.policy == SelectionPolicy::kH2O;
                   if (!c.preselect_block || !own_tokens) return {};
                   return str_cat("policy ", selection_policy_name(c.policy),
                                  " chooses its own tokens and cannot use preselect_block: true; set "
                                  "preselect_block: false or policy: select");
                 }});
    r.push_back({{"h2o.budget_tokens", "policy", "initial_len", "second_select_num", "block_size",
                  "local_windows_len", "max_seq_len"},
                 "with `policy: h2o`: the H2O budget (`h2o.budget_tokens`, or its default) <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   const int64_t budget = h2o_budget_tokens(c);
                   if (c.policy != SelectionPolicy::kH2O || budget <= c.max_seq_len) return {};
                   return str_cat("H2O cannot keep more tokens than exist: its budget (", budget, " tokens",
                                  c.h2o.budget_tokens == 0
                                      ? str_cat(" = initial_len + second_select_num * block_size + local_windows_len")
                                      : std::string(),
                                  ") is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    r.push_back({{"quoka.b_sa", "quoka.enabled", "max_seq_len"},
                 "with `quoka.enabled`: `quoka.b_sa` <= `max_seq_len`",
                 [](const Config& c) -> std::string {
                   if (!c.quoka.enabled || c.quoka.b_sa <= c.max_seq_len) return {};
                   return str_cat("QUOKA cannot keep more cached keys than exist: quoka.b_sa (", c.quoka.b_sa,
                                  ") is larger than max_seq_len (", c.max_seq_len, ")");
                 }});
    return r;
  }();
  return table;
}

namespace {

// Throws Error(kConfig) for `problem`, naming the involved key written last
// (and where), or the first involved key when none was written.
[[noreturn]] void fail_for(const std::vector<std::string_view>& involved, const std::string& problem,
                           const Origins* origins) {
  const Origin* latest = nullptr;
  if (origins != nullptr) {
    for (const std::string_view name : involved) {
      const auto it = origins->find(name);
      if (it == origins->end()) continue;
      if (latest == nullptr || it->second.order > latest->order) latest = &it->second;
    }
  }
  if (latest != nullptr) fail(ErrorCode::kConfig, latest->place, ": key '", latest->spelled, "': ", problem);
  fail(ErrorCode::kConfig, "key '", involved.front(), "': ", problem);
}

}  // namespace

void check_config(const Config& config, const Origins* origins) {
  for (const Key& key : keys()) {
    if (const std::string problem = key.check(config); !problem.empty()) {
      fail_for({key.path}, problem, origins);
    }
  }
  for (const Rule& rule : rules()) {
    if (const std::string problem = rule.problem(config); !problem.empty()) {
      fail_for(rule.keys, problem, origins);
    }
  }
}

}  // namespace longctx::config_detail

namespace longctx {

void validate_config(const LongContextConfig& config) { config_detail::check_config(config, nullptr); }

}  // namespace longctx
