// The harness helpers that pair or size benchmark rows: what a row is
// compared with must be what it claims (a comparison that never matches
// prints nothing, and nothing says so).
#include <gtest/gtest.h>

#include <string>

#include "bench_util.h"
#include "longctx/core/config.h"

namespace longctx::bench {
namespace {

// A line as tools/bench_sdpa.py prints it (json.dumps, separators=(",", ":")).
const std::string kSdpaLine =
    R"({"bench":"gpu_sdpa","dtype":"f16","history":32768,"n_q":4096,"ms":1.2,"tflops":304.5,"backend":"flash"})";

TEST(JsonField, ReadsStringsUnquotedAndNumbersAsWritten) {
  EXPECT_EQ(json_field(kSdpaLine, "dtype"), "f16");
  EXPECT_EQ(json_field(kSdpaLine, "history"), "32768");
  EXPECT_EQ(json_field(kSdpaLine, "backend"), "flash");  // the last field, before '}'
  EXPECT_EQ(json_field(kSdpaLine, "missing"), "");
}

TEST(SamePrefillCase, PairsOurRecordWithTheSdpaLineOfItsDtypeAndHistory) {
  Record ours;
  ours.set("bench", "gpu").set("part", "prefill_attention").set("dtype", "f16").set("history", int64_t{32768});
  ASSERT_EQ(ours.get("dtype"), "f16");  // Record::get gives strings unquoted, as json_field does
  EXPECT_TRUE(same_prefill_case(ours, kSdpaLine));

  Record other_dtype, other_history;
  other_dtype.set("dtype", "bf16").set("history", int64_t{32768});
  other_history.set("dtype", "f16").set("history", int64_t{131072});
  EXPECT_FALSE(same_prefill_case(other_dtype, kSdpaLine));
  EXPECT_FALSE(same_prefill_case(other_history, kSdpaLine));
  EXPECT_FALSE(same_prefill_case(ours, R"({"bench":"gpu_sdpa","skipped":"torch has no CUDA device"})"));
}

TEST(SecondSelectNumForBudget, FillsTheBudgetLeftAfterSinksAndWindow) {
  LongContextConfig config;
  config.block_size = 128;
  config.initial_len = 128;
  config.local_windows_len = 1024;
  config.max_seq_len = 131072;
  // (4096 - 128 - 1024) / 128 = 23 whole blocks: longctx-bench decode and gpu both select this many.
  EXPECT_EQ(second_select_num_for_budget(4096, config), 23);
  EXPECT_EQ(second_select_num_for_budget(128 + 1024, config), 1);  // at least one block
  config.max_seq_len = 2048;
  EXPECT_EQ(second_select_num_for_budget(1 << 20, config), 16);  // at most the store's blocks
}

}  // namespace
}  // namespace longctx::bench
