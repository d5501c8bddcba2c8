#!/usr/bin/python3
"""longctx-server benchmark (`longctx-bench server`), as a script.

Drives the real binaries over loopback and prints one JSON line per
measurement (--jsonl FILE too) and a summary on stderr:

1. ttft: time to first token of a question about a --context-token document
   (the demo pass-key model), uncached (a new document) and cached (another
   question about it), over --docs documents; medians and their ratio.
2. decode: decode tokens/s of one request (the `bench` model shape, 32/8
   heads x 128, greedy, --decode-tokens tokens after a --decode-context
   document), streamed through the server (client side: tokens after the first
   over the time from the first to the last) and by longctx-chat (its [stats]
   line), alternating, --reps times each; medians and their ratio.
3. load: --clients concurrent clients (1, 4, 8), each asking --requests
   questions about --load-docs shared documents (cached after the first):
   answers per minute, p50/p99 time to first token.

    tools/bench_server.py --bin-dir build/bin --context 32768
"""
import argparse
import http.client
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

QUESTIONS = ["What is the pass key?", "Tell me the pass key.", "Which number is the pass key?"]
STATS = re.compile(r"decode (\d+) tokens, ([\d.]+) tokens/s")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin-dir", default="build/bin", help="where longctx-server and friends are (default build/bin)")
    p.add_argument("--context", type=int, default=32768, help="document tokens for ttft (default 32768)")
    p.add_argument("--docs", type=int, default=3, help="documents for ttft (default 3)")
    p.add_argument("--decode-context", type=int, default=4096, help="document tokens for decode (default 4096)")
    p.add_argument("--decode-tokens", type=int, default=128, help="tokens generated for decode (default 128)")
    p.add_argument("--reps", type=int, default=5, help="decode repetitions per side (default 5)")
    p.add_argument("--clients", default="1,4,8", help="concurrent clients for load (default 1,4,8)")
    p.add_argument("--requests", type=int, default=4, help="requests per client for load (default 4)")
    p.add_argument("--load-docs", type=int, default=4, help="shared documents for load (default 4)")
    p.add_argument("--load-context", type=int, default=4096, help="document tokens for load (default 4096)")
    p.add_argument("--jsonl", help="also append the JSON lines to this file")
    return p.parse_args()


class Server:
    def __init__(self, bin_dir, model, *args):
        self.proc = subprocess.Popen([os.path.join(bin_dir, "longctx-server"), "--model", model, "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                sys.exit("longctx-server did not start")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m[1])
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stream(self, path, body):
        """(seconds to the first text, seconds to each text event, usage, text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        start = time.perf_counter()
        conn.request("POST", path, json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            sys.exit(f"longctx-server answered {r.status}: {r.read()[:300]}")
        times, usage, text, buf = [], None, "", b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                j = json.loads(event[6:])
                if j.get("usage"):
                    usage = j["usage"]
                for c in j.get("choices", []):
                    piece = c.get("text") if "text" in c else c.get("delta", {}).get("content", "")
                    if piece:
                        times.append(time.perf_counter() - start)
                        text += piece
        conn.close()
        return (times[0] if times else None), times, usage, text

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def finite_or_none(value):
    """A float that JSON can carry: NaN and the infinities become None (null),
    since json.dumps would print them as bare NaN/Infinity, which is not JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def median_or_none(values):
    """The median, or None when a value is missing (a request that streamed no token)."""
    return None if not values or any(v is None for v in values) else statistics.median(values)


def ratio_or_none(num, den):
    return None if num is None or den is None or den == 0 else num / den


def emit(args, record):
    line = json.dumps({k: finite_or_none(v) for k, v in record.items()}, allow_nan=False)
    print(line, flush=True)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(line + "\n")


def haystack(bin_dir, tmp, name, tokens, seed):
    path = os.path.join(tmp, name + ".txt")
    subprocess.run([os.path.join(bin_dir, "longctx-make-haystack"), "--tokens", str(tokens), "--depth", "0.5",
                    "--seed", str(seed), "--no-question", "--out", path], check=True, capture_output=True)
    return path


def chat_body(doc, question):
    return {"messages": [{"role": "user", "content": doc.strip() + "\n\n" + question}]}


def ttft(args, tmp, demo):
    server = Server(args.bin_dir, demo, "--config", os.path.join(SOURCE_DIR, "configs", "demo.yaml"),
                    "--set", f"max_seq_len={args.context + 2048}")
    try:
        server.stream("/v1/chat/completions", chat_body("warm-up", QUESTIONS[0]))
        uncached, cached = [], []
        for d in range(args.docs):
            doc = open(haystack(args.bin_dir, tmp, f"ttft-{d}", args.context, 40 + d)).read()
            first, _, u1, _ = server.stream("/v1/chat/completions", chat_body(doc, QUESTIONS[0]))
            again, _, u2, _ = server.stream("/v1/chat/completions", chat_body(doc, QUESTIONS[1]))
            uncached.append(first)
            cached.append(again)
            emit(args, {"bench": "server", "phase": "ttft", "doc": d, "context": u1["prompt_tokens"],
                        "uncached_s": first, "cached_s": again,
                        "cached_tokens": u2["prompt_tokens_details"]["cached_tokens"]})
        ratio = ratio_or_none(median_or_none(cached), median_or_none(uncached))
        emit(args, {"bench": "server", "phase": "ttft", "summary": True, "context": args.context,
                    "uncached_median_s": median_or_none(uncached), "cached_median_s": median_or_none(cached),
                    "cached_over_uncached": ratio})
        return ratio
    finally:
        server.stop()


def decode(args, tmp):
    model = os.path.join(tmp, "bench.gguf")
    subprocess.run([os.path.join(args.bin_dir, "longctx-make-model"), "--preset", "bench", "--seed", "3",
                    "--out", model], check=True, capture_output=True)
    doc_path = haystack(args.bin_dir, tmp, "decode", args.decode_context, 60)
    doc = open(doc_path).read()
    common = ["--set", f"max_seq_len={args.decode_context * 4 + 4096}", "--set", "sampling.temperature=0",
              "--set", "block_size=64", "--set", "second_select_num=16", "--set", "model.chat_template=raw"]
    server = Server(args.bin_dir, model, *common)
    via_server, via_chat = [], []
    try:
        for rep in range(args.reps):
            # The same text for both: chat's raw template puts the document, then the (empty) question.
            _, times, usage, _ = server.stream("/v1/completions", {"prompt": doc.strip(),
                                                                  "max_tokens": args.decode_tokens})
            n = usage["completion_tokens"]
            rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
            p = subprocess.run([os.path.join(args.bin_dir, "longctx-chat"), "--model", model, *common, "--raw",
                                "--prompt-file", doc_path, "--prompt", "", "--max-tokens", str(args.decode_tokens)],
                               capture_output=True, text=True, errors="replace")
            m = STATS.search(p.stderr)
            if not m:
                sys.exit("longctx-chat printed no stats:\n" + p.stderr[-2000:])
            via_server.append(rate)
            via_chat.append(float(m[2]))
            emit(args, {"bench": "server", "phase": "decode", "rep": rep, "server_tokens": n,
                        "server_stream_events": len(times), "server_tokens_per_s": rate,
                        "chat_tokens": int(m[1]), "chat_tokens_per_s": float(m[2])})
    finally:
        server.stop()
    ratio = ratio_or_none(median_or_none(via_server), median_or_none(via_chat))
    emit(args, {"bench": "server", "phase": "decode", "summary": True, "context": args.decode_context,
                "server_median_tokens_per_s": median_or_none(via_server),
                "chat_median_tokens_per_s": median_or_none(via_chat), "server_over_chat": ratio})
    return ratio


def load(args, tmp, demo):
    docs = [open(haystack(args.bin_dir, tmp, f"load-{i}", args.load_context, 80 + i)).read()
            for i in range(args.load_docs)]
    server = Server(args.bin_dir, demo, "--config", os.path.join(SOURCE_DIR, "configs", "demo.yaml"),
                    "--set", f"max_seq_len={args.load_context + 1024}", "--max-queued", "64")
    rows = []
    try:
        for doc in docs:  # each document once, so that load measures the cached case
            server.stream("/v1/chat/completions", chat_body(doc, QUESTIONS[0]))
        for clients in [int(c) for c in args.clients.split(",")]:
            firsts, lock = [], threading.Lock()

            def client(i):
                for r in range(args.requests):
                    doc = docs[(i + r) % len(docs)]
                    first, _, _, _ = server.stream("/v1/chat/completions",
                                                   chat_body(doc, QUESTIONS[(i + r) % len(QUESTIONS)]))
                    with lock:
                        firsts.append(first)
            start = time.perf_counter()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
            # Percentiles over the requests that streamed a token; the others are counted apart.
            timed = sorted(f for f in firsts if f is not None)
            row = {"bench": "server", "phase": "load", "clients": clients, "requests": len(firsts),
                   "requests_without_token": len(firsts) - len(timed),
                   "answers_per_min": 60 * len(firsts) / elapsed,
                   "ttft_p50_s": timed[len(timed) // 2] if timed else None,
                   "ttft_p99_s": timed[min(len(timed) - 1, int(0.99 * len(timed)))] if timed else None}
            emit(args, row)
            rows.append(row)
    finally:
        server.stop()
    return rows


def fmt(value, scale, spec):
    """value * scale formatted with spec, or "n/a" when it was not measured."""
    return "n/a" if value is None else format(value * scale, spec)


SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="longctx-bench-server-") as tmp:
        demo = os.path.join(tmp, "demo.gguf")
        subprocess.run([os.path.join(args.bin_dir, "longctx-make-demo"), "--out", demo], check=True,
                       capture_output=True)
        ttft_ratio = ttft(args, tmp, demo)
        decode_ratio = decode(args, tmp)
        rows = load(args, tmp, demo)
    print(f"ttft: cached / uncached at {args.context} tokens = {fmt(ttft_ratio, 1, '.4f')}", file=sys.stderr)
    print(f"decode: server / longctx-chat = {fmt(decode_ratio, 1, '.3f')}", file=sys.stderr)
    for r in rows:
        print(f"load: {r['clients']} clients: {r['answers_per_min']:.0f} answers/min, ttft p50 "
              f"{fmt(r['ttft_p50_s'], 1000, '.0f')} ms, p99 {fmt(r['ttft_p99_s'], 1000, '.0f')} ms", file=sys.stderr)


if __name__ == "__main__":
    main()
