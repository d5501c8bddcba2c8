// longctx-bench's help texts (usage.cpp).
#pragma once

#include <optional>
#include <string>

namespace longctx::bench {

// The subcommands, one line each.
std::string usage_overview();
// One subcommand's options and defaults; nullopt for an unknown name.
std::optional<std::string> usage_of(const std::string& subcommand);

}  // namespace longctx::bench
