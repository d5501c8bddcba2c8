#!/usr/bin/python3
"""End-to-end pass-key benchmark (the issue's `longctx-bench e2e`), as a script.

Drives the real binaries: longctx-make-demo writes the demo pass-key model
(tools/DEMO_MODEL.md), longctx-make-haystack one document per (context, depth),
longctx-chat answers "What is the pass key?" under each attention config. For
every (config, context) it reports pass-key accuracy over the depths and the
median prefill and decode tokens/s from longctx-chat's [stats] line.

Output: one JSON line per run and one per (config, context) summary on stdout
(--jsonl FILE too), a table on stderr, and with --plot FILE.png a gnuplot chart
of decode tokens/s and accuracy vs context (needs gnuplot, scripts/install-deps.sh).

    tools/bench_e2e.py --bin-dir build/bin --contexts 32K,128K --depths 20 --plot docs/e2e.png
    tools/bench_e2e.py --contexts 1M ...   # 1M: ~1.3 GB of f16 KV per run
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

QUESTION = "What is the pass key?"
# --set overrides of configs/demo.yaml (QUEST selection, 16 blocks of 16 tokens).
CONFIGS = {
    "dense": ["policy=dense"],
    "quest": [],
    "dynamic+preselect": ["representative_type=DYNAMIC", "preselect_block=true"],
    "streaming": ["policy=streaming"],
}
STATS = re.compile(r"\[stats\] answer (\d+) tokens \(([^)]*)\) \| prefill (\d+) tokens, ([\d.]+) tokens/s \| "
                   r"decode (\d+) tokens, ([\d.]+) tokens/s \| KV (.*) for (\d+) tokens \| "
                   r"attended ([\d.]+)% of the cache per step")


def parse_context(text):
    """'32K' -> 32768, '1M' -> 1048576, '5000' -> 5000."""
    m = re.fullmatch(r"(\d+)([KkMm]?)", text.strip())
    if not m:
        raise SystemExit(f"bench_e2e: bad context '{text}' (e.g. 32K, 128K, 1M, 8192)")
    return int(m[1]) * {"": 1, "k": 1024, "m": 1 << 20}[m[2].lower()]


def context_name(tokens):
    if tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    return f"{tokens >> 10}K" if tokens % 1024 == 0 else str(tokens)


def depths(n):
    return [0.5] if n == 1 else [i / (n - 1) for i in range(n)]


def run_one(args, chat_config, model, doc, context, overrides):
    cmd = [os.path.join(args.bin_dir, "longctx-chat"), "--config", chat_config, "--model", model,
           "--prompt-file", doc, "--prompt", QUESTION, "--temperature", "0", "--max-tokens", "16",
           "--set", f"max_seq_len={context}"]
    for o in overrides:
        cmd += ["--set", o]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        raise SystemExit(f"bench_e2e: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    m = STATS.search(p.stderr)
    if not m:
        raise SystemExit(f"bench_e2e: no [stats] line from longctx-chat:\n{p.stderr}")
    return p.stdout, {"prefill_tokens": int(m[3]), "prefill_tok_s": float(m[4]), "decode_tokens": int(m[5]),
                      "decode_tok_s": float(m[6]), "kv": m[7], "attended_pct": float(m[9])}


def emit(record, jsonl):
    line = json.dumps(record)
    print(line, flush=True)
    if jsonl:
        jsonl.write(line + "\n")
        jsonl.flush()


def plot(summaries, contexts, names, path):
    """decode tokens/s (log) and accuracy vs context, one line per config."""
    if not shutil.which("gnuplot"):
        raise SystemExit("bench_e2e: --plot needs gnuplot (scripts/install-deps.sh installs gnuplot-nox)")
    tmp = tempfile.mkdtemp(prefix="bench-e2e-plot-")
    script = [f"set terminal pngcairo size 1200,480 font ',11'" if has_cairo() else "set terminal png size 1200,480",
              f"set output '{path}'", "set multiplot layout 1,2 title 'longctx e2e: demo pass-key model'",
              "set logscale x 2", "set xlabel 'context (tokens)'", "set grid", "set key top right",
              f"set xtics ({', '.join(repr(context_name(c)) + ' ' + str(c) for c in contexts)})",
              f"set xrange [{contexts[0] / 1.5}:{contexts[-1] * 1.5}]"]
    data = {}
    for name in names:
        f = os.path.join(tmp, f"{len(data)}.dat")
        with open(f, "w") as out:
            for s in summaries:
                if s["config"] == name:
                    out.write(f"{s['context']} {s['decode_tok_s']} {s['accuracy']}\n")
        data[name] = f
    plots = lambda col: ", ".join(f"'{f}' using 1:{col} with linespoints lw 2 title '{n}'" for n, f in data.items())
    script += ["set ylabel 'decode tokens/s'", "set logscale y", "set title 'decode speed'", f"plot {plots(2)}",
               "unset logscale y", "set ylabel 'pass-key accuracy'", "set yrange [-0.05:1.05]",
               "set title 'accuracy'", "set key center right", f"plot {plots(3)}", "unset multiplot"]
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    shutil.rmtree(tmp)


def has_cairo():
    p = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    return "pngcairo" in p.stdout + p.stderr


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(here, "..", "build", "bin"),
                    help="folder of longctx-chat, longctx-make-demo and longctx-make-haystack (longctx-bench passes its own)")
    ap.add_argument("--config", default=os.path.join(here, "..", "configs", "demo.yaml"),
                    help="the longctx config every run starts from (default: configs/demo.yaml)")
    ap.add_argument("--contexts", default="32K,128K", help="comma-separated, e.g. 32K,128K,1M")
    ap.add_argument("--depths", type=int, default=20, help="key depths per context, evenly from 0 to 1")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    ap.add_argument("--seed", type=int, default=1, help="seed of the haystacks and their keys")
    ap.add_argument("--jsonl", help="also write the JSON lines here")
    ap.add_argument("--plot", help="PNG chart of decode tokens/s and accuracy vs context")
    args = ap.parse_args()
    contexts = sorted(parse_context(c) for c in args.contexts.split(","))
    names = args.configs.split(",")
    for n in names:
        if n not in CONFIGS:
            raise SystemExit(f"bench_e2e: unknown config '{n}' (known: {', '.join(CONFIGS)})")
    if args.depths < 1:
        raise SystemExit("bench_e2e: --depths must be >= 1")

    tmp = tempfile.mkdtemp(prefix="bench-e2e-")
    jsonl = open(args.jsonl, "w") if args.jsonl else None
    model = os.path.join(tmp, "demo.gguf")
    subprocess.run([os.path.join(args.bin_dir, "longctx-make-demo"), "--out", model], check=True,
                   capture_output=True)
    runs = {}
    for context in contexts:
        # The document leaves room for the chat template and question within max_seq_len = context.
        doc_tokens = context - 128
        for i, depth in enumerate(depths(args.depths)):
            doc, meta = os.path.join(tmp, "doc.txt"), os.path.join(tmp, "doc.json")
            subprocess.run([os.path.join(args.bin_dir, "longctx-make-haystack"), "--tokens", str(doc_tokens),
                            "--depth", str(depth), "--seed", str(args.seed + i), "--no-question", "--out", doc,
                            "--json", meta], check=True, capture_output=True)
            key = json.load(open(meta))["key"]
            for name in names:
                answer, r = run_one(args, args.config, model, doc, context, CONFIGS[name])
                r = {"kind": "run", "config": name, "context": context, "depth": round(depth, 4), "key": key,
                     "answer": answer.strip(), "correct": answer.strip() == key, **r}
                runs.setdefault((name, context), []).append(r)
                emit(r, jsonl)

    summaries = []
    for (name, context), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0]))):
        s = {"kind": "summary", "config": name, "context": context, "depths": len(rs),
             "accuracy": sum(r["correct"] for r in rs) / len(rs),
             "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in rs),
             "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rs),
             "attended_pct": statistics.median(r["attended_pct"] for r in rs)}
        summaries.append(s)
        emit(s, jsonl)
    print(f"\n{'config':<18} {'context':>8} {'depths':>6} {'accuracy':>8} {'prefill tok/s':>13} "
          f"{'decode tok/s':>12} {'attended':>8}", file=sys.stderr)
    for s in summaries:
        print(f"{s['config']:<18} {context_name(s['context']):>8} {s['depths']:>6} {s['accuracy']:>8.2f} "
              f"{s['prefill_tok_s']:>13.0f} {s['decode_tok_s']:>12.1f} {s['attended_pct']:>7.2f}%", file=sys.stderr)
    if args.plot:
        plot(summaries, contexts, names, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
