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
# Arguments after --tokens N go to longctx-chat. Needs the build in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=32768
if [ "${1:-}" = "--tokens" ]; then
  tokens="$2"
  shift 2
fi
bin=build/bin
"$bin/longctx-make-demo" --out build/demo.gguf
"$bin/longctx-make-haystack" --tokens "$tokens" --no-question --out build/haystack.txt --json build/haystack.json
answer="$("$bin/longctx-chat" --config configs/demo.yaml --prompt-file build/haystack.txt \
  --prompt "What is the pass key?" "$@")"
key="$(sed -n 's/.*"key": *"\([^"]*\)".*/\1/p' build/haystack.json)"
depth="$(sed -n 's/.*"depth": *\([0-9.]*\).*/\1/p' build/haystack.json)"
answer="$(echo "$answer" | tr -d '[:space:]')"
if [ "$answer" = "$key" ]; then
  echo "pass key: the answer $answer is the key hidden at depth $depth of $tokens tokens: correct"
else
  echo "pass key: the answer '$answer' is NOT the key $key hidden at depth $depth of $tokens tokens" >&2
  exit 1
fi
