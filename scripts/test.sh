#!/usr/bin/env bash
# Builds longctx with AddressSanitizer + UndefinedBehaviorSanitizer and runs
# every test suite with ctest. GPU tests skip with a message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${LONGCTX_TEST_BUILD:-build-test}"
jobs="$(nproc)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLONGCTX_SANITIZE=ON
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs"
