// Forcing one Highway target at a time, so that a test checks every vector
// path this CPU runs, not only the best one.
#pragma once

#include <cstdint>

#include "hwy/targets.h"

namespace longctx::testing {

// Forces one Highway target (0: Highway's own choice) for the lifetime of the object.
class ForcedHighwayTarget {
 public:
  explicit ForcedHighwayTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~ForcedHighwayTarget() { hwy::SetSupportedTargetsForTest(0); }
  ForcedHighwayTarget(const ForcedHighwayTarget&) = delete;
  ForcedHighwayTarget& operator=(const ForcedHighwayTarget&) = delete;
};

}  // namespace longctx::testing
