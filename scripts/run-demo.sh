#!/usr/bin/env bash
# The main job on the embedded default: generates the demo pass-key model
# (tools/DEMO_MODEL.md) and a haystack document with a pass key hidden at a
# random depth, asks longctx-chat (configs/demo.yaml: QUEST selection) for the
# key, and says whether its answer is the hidden key (exit 1 if not).
#
#   bash scripts/run-demo.sh                       # 32K tokens
#   bash scripts/run-demo.sh --tokens 131072       # 128K
#   bash scripts/run-demo.sh --tokens 131072 --set quoka.enabled=true   # sparse prefill
#
# Arguments after --tokens N go to longctx-chat. Binaries from build/bin and
# files into build/ unless LONGCTX_BIN_DIR / LONGCTX_DEMO_DIR say otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=32768
if [ "${1:-}" = "--tokens" ]; then
  tokens="$2"
  shift 2
fi
bin="${LONGCTX_BIN_DIR:-build/bin}"
out="${LONGCTX_DEMO_DIR:-build}"
mkdir -p "$out"
"$bin/longctx-make-demo" --out "$out/demo.gguf"
"$bin/longctx-make-haystack" --tokens "$tokens" --no-question --out "$out/haystack.txt" --json "$out/haystack.json"
answer="$("$bin/longctx-chat" --config configs/demo.yaml --model "$out/demo.gguf" --prompt-file "$out/haystack.txt" \
  --prompt "What is the pass key?" "$@")"
key="$(sed -n 's/.*"key": *"\([^"]*\)".*/\1/p' "$out/haystack.json")"
depth="$(sed -n 's/.*"depth": *\([0-9.]*\).*/\1/p' "$out/haystack.json")"
answer="$(echo "$answer" | tr -d '[:space:]')"
if [ "$answer" = "$key" ]; then
  echo "pass key: the answer $answer is the key hidden at depth $depth of $tokens tokens: correct"
else
  echo "pass key: the answer '$answer' is NOT the key $key hidden at depth $depth of $tokens tokens" >&2
  exit 1
fi
