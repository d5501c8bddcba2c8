"""longctx-chat end to end, through the real binary (subprocess).

Uses the embedded demo pass-key model (longctx-make-demo, tools/DEMO_MODEL.md)
and a haystack document (longctx-make-haystack): the greedy answer to any
question about the document is the hidden key. Random-weight test models
(longctx-make-model) serve as "another model" for snapshots.

Runs as a script (ctest: /usr/bin/python3 with LONGCTX_BIN_DIR and
LONGCTX_SOURCE_DIR set). Exit status 1 on the first failure.
"""
import json
import os
import re
import signal
import stat
import subprocess
import tempfile
import time

import _env
from _env import BIN_DIR, SOURCE_DIR, check, run

CHAT = os.path.join(BIN_DIR, "longctx-chat")
CONFIG = os.path.join(SOURCE_DIR, "configs", "demo.yaml")
QUESTION = "What is the pass key?"


def chat(*args, stdin=None):
    # Small KV store: the documents here are 2K tokens.
    return run([CHAT, "--config", CONFIG, "--set", "max_seq_len=8192", *args], stdin=stdin)


def stats(stderr):
    """The [stats] lines as dicts: answer, prefill, decode token counts."""
    out = []
    for m in re.finditer(r"\[stats\] answer (\d+) tokens \(([^)]*)\) \| prefill (\d+) tokens, ([\d.]+) tokens/s \| "
                         r"decode (\d+) tokens, ([\d.]+) tokens/s \| KV (.*) for (\d+) tokens \| "
                         r"attended ([\d.]+)% of the cache per step", stderr):
        out.append({"answer": int(m[1]), "reason": m[2], "prefill": int(m[3]), "decode": int(m[5]),
                    "n_past": int(m[8]), "attended": float(m[9])})
    return out


def ctrl_c_twice_at_the_prompt(base):
    """Interactive chat waiting at the prompt: one Ctrl-C keeps it (and says how
    to quit), a second one quits with status 130."""
    p = subprocess.Popen([CHAT, "--config", CONFIG, "--set", "max_seq_len=8192", *base],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The prefill's stats go to stderr; then it reads stdin. Wait for the
        # answer to a first question so the prompt is surely waiting.
        p.stdin.write(QUESTION + "\n")
        p.stdin.flush()
        answer = p.stdout.readline()
        check(answer.strip() != "", "interactive chat answers before the Ctrl-C test", answer)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
        check(p.poll() is None, "one Ctrl-C at the prompt keeps the chat")
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
        err = p.stderr.read()
        check(rc == 130, "a second Ctrl-C at the prompt quits with status 130", f"rc={rc}\n{err}")
        check("Ctrl-C again to quit" in err, "the first Ctrl-C says how to quit", err)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def expect_error(result, pattern, what):
    rc, out, err = result
    check(rc == 1, f"{what}: exit status 1", f"rc={rc}\nstderr:\n{err}")
    check(re.search(pattern, err) is not None, f"{what}: message matches {pattern!r}", err)


def main():
    with tempfile.TemporaryDirectory(prefix="longctx-chat-test-") as tmp:  # removed after the run
        run_all(tmp)
    print(f"test_chat: {_env.passed} checks passed")


def run_all(tmp):
    demo = os.path.join(tmp, "demo.gguf")
    doc = os.path.join(tmp, "doc.txt")
    meta = os.path.join(tmp, "doc.json")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], check=True, capture_output=True)
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-haystack"), "--tokens", "2048", "--depth", "0.3",
                    "--seed", "5", "--no-question", "--out", doc, "--json", meta], check=True, capture_output=True)
    key = json.load(open(meta))["key"]
    others = []
    for seed in ("1", "2"):
        path = os.path.join(tmp, f"mha-{seed}.gguf")
        subprocess.run([os.path.join(BIN_DIR, "longctx-make-model"), "--preset", "mha-64", "--seed", seed,
                        "--out", path], check=True, capture_output=True)
        others.append(path)

    # One-shot answer: the key, greedy, with the stats line.
    base = ["--model", demo, "--prompt-file", doc]
    rc, out, err = chat(*base, "--prompt", QUESTION, "--temperature", "0")
    check(rc == 0, "one-shot exits 0", err)
    check(out.strip() == key, f"one-shot answers the key {key}", f"stdout={out!r}\nstderr:\n{err}")
    s = stats(err)
    check(len(s) == 1, "one stats line", err)
    check(s[0]["reason"] == "end of generation" and s[0]["answer"] == len(key) + 1, "answer ' KEY' then </s>", err)
    check(s[0]["prefill"] > 1500 and s[0]["n_past"] >= s[0]["prefill"], "stats count the document's prefill", err)
    check(0 < s[0]["attended"] < 100, "stats: a fraction of the cache attended (QUEST)", err)
    first_prefill = s[0]["prefill"]

    # Reproducible: greedy twice, and sampling with the same seed twice.
    check(chat(*base, "--prompt", QUESTION, "--temperature", "0")[1] == out, "greedy answers are identical")
    sampled = [chat(*base, "--prompt", QUESTION, "--temperature", "1.5", "--set", "sampling.seed=7",
                    "--set", "sampling.top_k=0", "--set", "sampling.top_p=1")[1] for _ in range(2)]
    check(sampled[0] == sampled[1], "sampling with one seed is reproducible", str(sampled))

    # --raw: no chat template, fewer prompt tokens, still the key.
    rc, out_raw, err = chat(*base, "--prompt", QUESTION, "--raw")
    check(rc == 0 and out_raw.strip() == key, "--raw answers the key", err)
    check(stats(err)[0]["prefill"] < first_prefill, "--raw prompt has no template tokens", err)

    # --max-tokens N limits the answer.
    rc, out3, err = chat(*base, "--prompt", QUESTION, "--max-tokens", "3")
    check(rc == 0 and out3.strip() == key[:2], "--max-tokens 3: ' ' and two digits", f"{out3!r}\n{err}")
    check(stats(err)[0]["answer"] == 3 and stats(err)[0]["reason"] == "max_tokens", "stats: 3 tokens", err)

    # --save-kv, then --load-kv: same answer, no document prefill; a second question too.
    snap = os.path.join(tmp, "doc.kv")
    rc, out_saved, err = chat(*base, "--prompt", QUESTION, "--save-kv", snap)
    check(rc == 0 and out_saved == out, "--save-kv run answers as a fresh run", err)
    check(os.path.exists(snap), "--save-kv wrote the snapshot")
    rc, out_loaded, err = chat("--model", demo, "--load-kv", snap, "--prompt", QUESTION)
    check(rc == 0 and out_loaded == out, "--load-kv answers identically to a fresh run", f"{out_loaded!r}\n{err}")
    check("(no prefill)" in err, "--load-kv says it did not prefill", err)
    s = stats(err)
    check(s[0]["prefill"] < 30 and s[0]["n_past"] > 1500, "--load-kv prefilled only the question", err)
    rc, out2, err = chat("--model", demo, "--load-kv", snap, "--prompt", "Tell me the pass key again, please.")
    check(rc == 0 and out2.strip() == key, "--load-kv with another question answers the key", err)

    # Interactive: two turns on one sequence, the document prefilled once.
    rc, out_i, err = chat(*base, stdin=f"{QUESTION}\n\nAnd once more: {QUESTION}\n")
    check(rc == 0, "interactive exits 0 at end of input", err)
    s = stats(err)
    check(len(s) == 2, "interactive: two answers", err)
    check(out_i.split() == [key, key], "interactive: the key twice", out_i)
    check(s[1]["prefill"] < 40 and s[1]["n_past"] > s[0]["n_past"], "second turn appends, no re-prefill", err)

    # Snapshots from another model are refused.
    snap_other = os.path.join(tmp, "other.kv")
    rc, _, err = run([CHAT, "--model", others[0], "--raw", "--prompt-file", doc, "--prompt", "x", "--max-tokens",
                      "1", "--save-kv", snap_other, "--set", "max_seq_len=8192"])
    check(rc == 0 and os.path.exists(snap_other), "snapshot of a random model", err)
    expect_error(run([CHAT, "--model", others[1], "--raw", "--load-kv", snap_other, "--prompt", "x",
                      "--set", "max_seq_len=8192"]), r"another model", "snapshot of a same-shape model, other weights")
    expect_error(chat("--model", demo, "--load-kv", snap_other, "--prompt", "x"), r"another model",
                 "snapshot of a model of another shape")
    expect_error(chat("--model", demo, "--raw", "--load-kv", snap, "--prompt", "x"), r"chat template 'llama2'",
                 "snapshot made with another chat template")
    bad_snap = os.path.join(tmp, "bad.kv")
    with open(snap, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF
    with open(bad_snap, "wb") as f:
        f.write(data)
    expect_error(chat("--model", demo, "--load-kv", bad_snap, "--prompt", "x"), r"bad.kv", "corrupt snapshot")
    # A flipped byte in the header's fingerprint is a checksum mismatch, not "another model".
    with open(snap, "rb") as f:
        data = bytearray(f.read())
    data[93] ^= 0x04
    with open(bad_snap, "wb") as f:
        f.write(data)
    expect_error(chat("--model", demo, "--load-kv", bad_snap, "--prompt", "x"), r"header checksum mismatch",
                 "a corrupt fingerprint")
    expect_error(chat("--model", demo, "--load-kv", snap, "--save-kv", os.path.join(tmp, "copy.kv"), "--prompt", "x"),
                 r"--load-kv and --save-kv", "--save-kv with --load-kv (it was ignored)")
    fifo = os.path.join(tmp, "pipe.kv")
    os.mkfifo(fifo)
    expect_error(chat(*base, "--prompt", QUESTION, "--save-kv", fifo), r"not a regular file",
                 "--save-kv onto a FIFO (it became a regular file)")
    check(stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO is still one")

    # Errors: message, exit 1, nothing written.
    expect_error(chat("--model", os.path.join(tmp, "missing.gguf"), "--prompt", "x"), r"missing\.gguf",
                 "missing model file")
    truncated = os.path.join(tmp, "truncated.gguf")
    with open(demo, "rb") as f:
        head = f.read(5000)
    with open(truncated, "wb") as f:
        f.write(head)
    expect_error(chat("--model", truncated, "--prompt", "x"), r"truncated\.gguf", "truncated model file")
    bad_yaml = os.path.join(tmp, "bad.yaml")
    with open(bad_yaml, "w") as f:
        f.write("# bad\nblock_size: 16\nsampling:\n  temprature: 0\n")
    expect_error(run([CHAT, "--config", bad_yaml, "--model", demo, "--prompt", "x"]),
                 r"bad\.yaml:4:3: unknown key 'sampling\.temprature'", "bad config key names file:line:key")
    expect_error(chat(*base, "--prompt", "x", "--set", "sampling.top_p=2"),
                 r"key 'sampling.top_p': must be in \[0, 1\]", "bad override value")
    never = os.path.join(tmp, "never.kv")
    expect_error(chat(*base, "--prompt", QUESTION, "--set", "max_seq_len=1024", "--set", "local_windows_len=64",
                      "--save-kv", never), r"too long: \d+ tokens.*max_seq_len 1024", "prompt longer than max_seq_len")
    check(not os.path.exists(never), "no snapshot written after an error")
    expect_error(chat(*base, "--prompt", QUESTION, "--set", "dram_budget=64KiB", "--save-kv", never),
                 r"\d+ bytes", "DRAM budget too small names the bytes needed")
    check(not os.path.exists(never), "no snapshot written after an out-of-memory error")
    expect_error(chat(*base, "--prompt", QUESTION, "--save-kv", os.path.join(tmp, "no-dir", "x.kv")),
                 r"no-dir", "snapshot into a missing directory")
    check(not os.path.exists(os.path.join(tmp, "no-dir")), "nothing created for a failed --save-kv")
    # configs/demo.yaml names build/demo.gguf; clear it to get the "no model" error.
    expect_error(chat("--set", "model.path=", "--prompt", "x"), r"no model", "no model given")
    expect_error(chat("--model", demo, "--bogus"), r"unknown argument '--bogus'", "unknown argument")
    ctrl_c_twice_at_the_prompt(base)
    leftovers = [f for f in os.listdir(tmp) if f.startswith(".") or "tmp" in f]
    check(not leftovers, "no temporary files left behind", str(leftovers))


if __name__ == "__main__":
    main()
