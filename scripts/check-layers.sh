#!/usr/bin/env bash
# Checks the layer rules of longctx (docs/architecture.md) on the source tree:
# a file includes "longctx/<layer>/..." only from its own layer or from a
# layer below it.
#
#   core < kvstore < cpu < policy < scheduler < model < tools < apps, bench, bindings
#   gpu:       over core only; included only by apps, bench and bindings (they pick the backend)
#   workloads: bench/workloads, over cpu; included only by bench (and tests)
#
# Everywhere, tests/ included: nothing includes a file of apps/, and no file
# outside gpu/src and tests/gpu includes a CUDA header (tests/gpu play another
# CUDA library, such as PyTorch, that hands its memory and streams to the
# backend). tests/ may include any layer.
# Prints FILE:LINE: RULE for each include that breaks a rule and exits 1;
# prints nothing and exits 0 when there is none.
#
# Usage: scripts/check-layers.sh [SOURCE_DIR]   (default: this script's tree)
#        scripts/check-layers.sh --self-test    (a tree with known bad includes must fail)
# ctest runs both (tests/CMakeLists.txt: layers, layers.self_test).
set -euo pipefail

# Layers each layer may include (its own first).
declare -A may=(
  [core]="core"
  [kvstore]="kvstore core"
  [cpu]="cpu kvstore core"
  [gpu]="gpu core"
  [policy]="policy cpu kvstore core"
  [workloads]="workloads cpu kvstore core"
  [scheduler]="scheduler policy cpu kvstore core"
  [model]="model scheduler policy cpu kvstore core"
  [tools]="tools model scheduler policy cpu kvstore core"
  [apps]="tools model scheduler policy cpu gpu kvstore core"
  [bench]="workloads tools model scheduler policy cpu gpu kvstore core"
  [bindings]="tools model scheduler policy cpu gpu kvstore core"
)
folders="core kvstore cpu gpu policy scheduler model tools apps bench bindings tests"
cuda_header='^(cuda[_a-z0-9]*\.h|cublas[_A-Za-z0-9]*\.h|cusparse|curand|nvrtc|nvtx|mma\.h$|cub/|thrust/)'

# check ROOT: prints one line per bad include; returns 1 when there is any.
check() {
  local root="$1" bad=0 hit file number line layer open path target
  while IFS= read -r hit; do
    file="${hit%%:*}"
    hit="${hit#*:}"
    number="${hit%%:*}"
    line="${hit#*:}"
    case "$file" in
      bench/workloads/*) layer=workloads ;;  # its own layer inside bench/
      *) layer="${file%%/*}" ;;
    esac
    [[ "$line" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*([\<\"])([^\>\"]+)[\>\"] ]] || continue
    open="${BASH_REMATCH[1]}"
    path="${BASH_REMATCH[2]}"
    if [[ "$layer" != apps && ( "$path" == apps/* || "$path" == */apps/* ) ]]; then
      echo "$file:$number: includes \"$path\": nothing includes a file of apps/"
      bad=1
    fi
    if [[ "$open" == "<" && "$path" =~ $cuda_header && "$file" != gpu/src/* && "$file" != tests/gpu/* ]]; then
      echo "$file:$number: includes <$path>: CUDA headers stay in gpu/src (and tests/gpu)"
      bad=1
    fi
    [[ "$layer" == tests ]] && continue
    [[ "$path" =~ ^longctx/([a-z_]+)/ ]] || continue
    target="${BASH_REMATCH[1]}"
    if [[ -z "${may[$target]+x}" ]]; then
      echo "$file:$number: includes \"$path\": no layer '$target' (scripts/check-layers.sh lists them)"
      bad=1
    elif [[ " ${may[$layer]} " != *" $target "* ]]; then
      echo "$file:$number: includes \"$path\": $layer/ may not include $target/ (only ${may[$layer]})"
      bad=1
    fi
  done < <(cd "$root" && for f in $folders; do
             if [[ -d "$f" ]]; then
               grep -rnE '^[[:space:]]*#[[:space:]]*include' --include='*.h' --include='*.hpp' --include='*.cpp' \
                 --include='*.cc' --include='*.cu' --include='*.cuh' "$f" || true
             fi
           done | LC_ALL=C sort -t: -k1,1 -k2,2n)
  return "$bad"
}

# A tree with one bad include of each kind (and good ones beside them): check
# must fail and name exactly these files and lines.
self_test() {
  local tmp out status want ok=1
  tmp="$(mktemp -d)"
  mkdir -p "$tmp"/{core/src,kvstore/include/longctx/kvstore,cpu/src,gpu/src,scheduler/src,bench/workloads/src,tests/gpu}
  printf '#include "longctx/core/error.h"\n#include "longctx/scheduler/sequence.h"\n' > "$tmp/cpu/src/up.cpp"
  printf '#pragma once\n#include "longctx/cpu/attention.h"\n' > "$tmp/kvstore/include/longctx/kvstore/up.h"
  printf '#include "longctx/kvstore/kv_store.h"\n#include <cuda_runtime.h>\n' > "$tmp/gpu/src/side.cu"
  printf '#include <cuda_runtime.h>\n#include "longctx/policy/decode_policy.h"\n' > "$tmp/scheduler/src/cuda.cpp"
  printf '#include "../../apps/chat_session.h"\n' > "$tmp/core/src/apps.cpp"
  printf '#include "longctx/policy/razor.h"\n#include "longctx/cpu/selection.h"\n' > "$tmp/bench/workloads/src/w.cpp"
  printf '#include "longctx/scheduler/sequence.h"\n#include "cuda_test_util.h"\n#include <cuda_runtime.h>\n' > "$tmp/tests/gpu/ok_test.cpp"
  printf '#include "longctx/gpu/device.h"\n# include <cublas_v2.h>\n#include "longctx/foo/x.h"\n' > "$tmp/core/src/gpu.cpp"
  local expected=(
    'bench/workloads/src/w.cpp:1: includes "longctx/policy/razor.h": workloads/ may not include policy/'
    'core/src/apps.cpp:1: includes "../../apps/chat_session.h": nothing includes a file of apps/'
    'core/src/gpu.cpp:1: includes "longctx/gpu/device.h": core/ may not include gpu/'
    'core/src/gpu.cpp:2: includes <cublas_v2.h>: CUDA headers stay in gpu/src'
    "core/src/gpu.cpp:3: includes \"longctx/foo/x.h\": no layer 'foo'"
    'cpu/src/up.cpp:2: includes "longctx/scheduler/sequence.h": cpu/ may not include scheduler/'
    'gpu/src/side.cu:1: includes "longctx/kvstore/kv_store.h": gpu/ may not include kvstore/'
    'kvstore/include/longctx/kvstore/up.h:2: includes "longctx/cpu/attention.h": kvstore/ may not include cpu/'
    'scheduler/src/cuda.cpp:1: includes <cuda_runtime.h>: CUDA headers stay in gpu/src'
  )
  status=0
  out="$(check "$tmp")" || status=$?
  rm -rf "$tmp"
  for want in "${expected[@]}"; do
    if [[ "$out" != *"$want"* ]]; then
      echo "self-test: not reported: $want"
      ok=0
    fi
  done
  if [[ "$status" -eq 0 || "$(printf '%s\n' "$out" | wc -l)" -ne "${#expected[@]}" ]]; then
    ok=0
  fi
  if [[ "$ok" -eq 0 ]]; then
    printf 'self-test: check returned %s on the tree with bad includes and printed:\n%s\n' "$status" "$out"
    return 1
  fi
  echo "self-test: the ${#expected[@]} bad includes were reported, and nothing else"
}

if [[ "${1:-}" == --self-test ]]; then
  self_test
else
  check "${1:-$(cd "$(dirname "$0")/.." && pwd)}"
fi
