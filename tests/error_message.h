// The one way tests read a refusal: run a call, check the Error's code, and
// hand back its message, or check the parts it must name.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

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
  ADD_FAILURE() << "no error thrown (expected " << error_code_name(code) << ")";
  return "";
}

// Expects `call` to throw Error(code) whose message holds every one of
// `parts`; returns the message.
template <typename F>
std::string expect_error(F&& call, ErrorCode code, const std::vector<std::string>& parts) {
  const std::string message = error_message(call, code);
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << message << "' lacks '" << part << "'";
  return message;
}

}  // namespace longctx
