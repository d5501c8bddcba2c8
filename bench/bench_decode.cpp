// Placeholder until the decode benchmark lands (being written now).
#include <string>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::bench {
int run_decode(const std::vector<std::string>&) { fail(ErrorCode::kUnsupported, "longctx-bench decode is not built yet"); }
}  // namespace longctx::bench
