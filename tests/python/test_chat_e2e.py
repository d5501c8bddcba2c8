"""longctx-chat end to end at 8K and 16K tokens, through the real binary.

The demo pass-key model (tools/DEMO_MODEL.md) must answer the key hidden at
several depths of longer haystacks with QUEST selection (configs/demo.yaml),
must not with StreamingLLM (sinks + local window only), and the interactive
mode must work in a real terminal (tmux: progress bar, prompt, answer).
Snapshots and error cases are in test_chat.py.

Runs as a script (ctest: /usr/bin/python3 with LONGCTX_BIN_DIR and
LONGCTX_SOURCE_DIR set). Exit status 1 on the first failure. Under ASan the
prefill is ~15x slower, so a sanitizer build checks two depths at 8K only.
"""
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time

import _env
from _env import BIN_DIR, SOURCE_DIR, check, run

CHAT = os.path.join(BIN_DIR, "longctx-chat")
CONFIG = os.path.join(SOURCE_DIR, "configs", "demo.yaml")
QUESTION = "What is the pass key?"
# tests/CMakeLists.txt preloads libasan for sanitizer builds.
SANITIZED = "asan" in os.environ.get("LD_PRELOAD", "")
# (document tokens, key depths): the key near the start, middle and end.
# The prefill is quadratic: 16K takes ~70 s under ASan, so a sanitizer build checks 8K only.
CASES = [(8192, [0.1, 0.9])] if SANITIZED else [(8192, [0.0, 0.3, 0.6, 1.0]), (16384, [0.05, 0.5, 0.95])]


def haystack(tmp, tokens, depth, seed):
    doc = os.path.join(tmp, f"doc-{tokens}-{seed}.txt")
    meta = os.path.join(tmp, f"doc-{tokens}-{seed}.json")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-haystack"), "--tokens", str(tokens), "--depth", str(depth),
                    "--seed", str(seed), "--no-question", "--out", doc, "--json", meta], check=True,
                   capture_output=True)
    return doc, json.load(open(meta))["key"]


def ask(demo, doc, tokens, *overrides):
    args = [CHAT, "--config", CONFIG, "--model", demo, "--prompt-file", doc, "--prompt", QUESTION,
            "--set", f"max_seq_len={tokens + 1024}"]
    for o in overrides:
        args += ["--set", o]
    return run(args, timeout=600)


def tmux_test(tmp, demo):
    """Interactive mode in a terminal: progress bar, '> ' prompt, the answer."""
    if not shutil.which("tmux"):
        print("test_chat_e2e: SKIP terminal test: tmux is not installed (scripts/install-deps.sh installs it)")
        return
    doc, key = haystack(tmp, 2048, 0.4, 11)
    # A private server (-L) with no user config; no LD_PRELOAD for tmux itself (the chat binary is
    # built with the sanitizer when it needs it).
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TMUX")}
    sock = f"longctx-e2e-{os.getpid()}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    cmd = " ".join(shlex.quote(a) for a in [CHAT, "--config", CONFIG, "--model", demo, "--prompt-file", doc,
                                            "--set", "max_seq_len=4096"])
    # The pane outlives the chat so that its exit status can be read.
    shell = f"{cmd}; echo \"chat exited $?\"; sleep 600"
    subprocess.run(tmux + ["new-session", "-d", "-s", "e2e", "-x", "160", "-y", "40", shell], env=env, check=True)

    def pane():
        return subprocess.run(tmux + ["capture-pane", "-p", "-t", "e2e"], env=env, capture_output=True,
                              text=True, errors="replace").stdout

    def wait_for(what, timeout=240):
        end = time.time() + timeout
        while time.time() < end:
            text = pane()
            if what(text):
                return text
            time.sleep(0.2)
        return pane()

    try:
        # capture-pane drops trailing blanks: the prompt line is '>'.
        prompt = lambda t: any(ln.rstrip() == ">" for ln in t.splitlines())
        text = wait_for(lambda t: prompt(t) or "chat exited" in t)
        check(prompt(text), "terminal: the '> ' prompt after the prefill", text)
        check("prefill [" + "#" * 30 + "]" in text, "terminal: the progress bar was drawn to the end", text)
        subprocess.run(tmux + ["send-keys", "-t", "e2e", "-l", QUESTION], env=env, check=True)
        subprocess.run(tmux + ["send-keys", "-t", "e2e", "Enter"], env=env, check=True)
        text = wait_for(lambda t: "[stats]" in t or "chat exited" in t)
        lines = text.splitlines()
        answers = [ln for ln in lines if ln.strip() == key]
        check(answers, f"terminal: the key {key} on a line of its own", text)
        check(any(QUESTION in ln for ln in lines), "terminal: the question echoed", text)
        subprocess.run(tmux + ["send-keys", "-t", "e2e", "-l", "/exit"], env=env, check=True)
        subprocess.run(tmux + ["send-keys", "-t", "e2e", "Enter"], env=env, check=True)
        text = wait_for(lambda t: "chat exited" in t, timeout=60)
        check("chat exited 0" in text, "terminal: /exit quits with status 0", text)
        check("Sanitizer" not in text and "runtime error:" not in text, "terminal: no sanitizer report", text)
    finally:
        subprocess.run(tmux + ["kill-server"], env=env, capture_output=True)


def main():
    start = time.time()
    tmp = tempfile.mkdtemp(prefix="longctx-chat-e2e-")
    demo = os.path.join(tmp, "demo.gguf")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], check=True, capture_output=True)

    seed = 100
    for tokens, depths in CASES:
        for depth in depths:
            seed += 1
            doc, key = haystack(tmp, tokens, depth, seed)
            rc, out, err = ask(demo, doc, tokens)
            check(rc == 0, f"{tokens} tokens, depth {depth}: exits 0", err)
            check(out.strip() == key, f"{tokens} tokens, depth {depth}: answers the key {key}",
                  f"stdout={out!r}\nstderr:\n{err}")
            check("% of the cache per step" in err, "stats line printed", err)

    # StreamingLLM keeps only the sinks and the local window: the key (mid-document) is gone.
    tokens = 2048 if SANITIZED else 8192
    doc, key = haystack(tmp, tokens, 0.5, 7)
    rc, out, err = ask(demo, doc, tokens, "policy=streaming")
    check(rc == 0, "streaming: exits 0", err)
    check(key not in out and out.strip() == "", f"streaming: does not find the key {key}", f"stdout={out!r}")

    tmux_test(tmp, demo)
    shutil.rmtree(tmp)
    print(f"test_chat_e2e: {_env.passed} checks passed in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
