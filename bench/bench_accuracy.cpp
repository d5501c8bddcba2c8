// Placeholder until the accuracy benchmark lands (being written now).
#include <string>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::bench {
int run_accuracy(const std::vector<std::string>&) { fail(ErrorCode::kUnsupported, "longctx-bench accuracy is not built yet"); }
}  // namespace longctx::bench
