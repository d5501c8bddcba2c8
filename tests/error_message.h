// The one way tests read a refusal: run a call, check the Error's code, and
// hand back its message for the test to compare.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "longctx/core/error.h"

namespace longctx {

// The message of the Error `call` throws, after checking its code; a test
// failure and "" when it throws nothing.
template <typename F>
std::string error_message(F&& call, ErrorCode code = ErrorCode::kInvalidArgument) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

}  // namespace longctx
