"""longctx-server end to end, through the real binary and Python's urllib.

Uses the embedded demo pass-key model (longctx-make-demo) and haystack
documents (longctx-make-haystack): the greedy answer to a question about the
document is the hidden key, the same answer longctx-chat gives.

Runs as a script (ctest: /usr/bin/python3 with LONGCTX_BIN_DIR and
LONGCTX_SOURCE_DIR set). Exit status 1 on the first failure.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import _env
from _env import BIN_DIR, SOURCE_DIR, check, run

SERVER = os.path.join(BIN_DIR, "longctx-server")
CHAT = os.path.join(BIN_DIR, "longctx-chat")
CONFIG = os.path.join(SOURCE_DIR, "configs", "demo.yaml")
QUESTION = "What is the pass key?"


class Server:
    """A longctx-server on a free port; stderr kept for the checks."""

    def __init__(self, model, *args, max_seq_len=40000, env=None):
        self.proc = subprocess.Popen([SERVER, "--config", CONFIG, "--model", model, "--port", "0",
                                      "--set", f"max_seq_len={max_seq_len}", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines = []
        self.port = None
        deadline = time.time() + 60
        while self.port is None:
            line = self.proc.stderr.readline()
            check(line != "" and time.time() < deadline, "the server starts", "".join(self.lines))
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m[1])
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def request(self, path, body=None, headers=None, raw=None):
        """(status, headers, body text)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url(path), data=data,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(timeout=60)
            check(rc == 0, "SIGTERM: the server exits 0", "".join(self.lines))
        text = "".join(self.lines)
        check("Sanitizer" not in text and "runtime error:" not in text, "no sanitizer report", text)


def events(text):
    """The data payloads of a server-sent event stream."""
    return [block[len("data: "):] for block in text.split("\n\n") if block.startswith("data: ")]


def streamed_text(text, chat=True):
    out = ""
    for payload in events(text):
        if payload == "[DONE]":
            continue
        for c in json.loads(payload)["choices"]:
            out += (c["delta"].get("content", "") if chat else c["text"])
    return out


def expect_api_error(server, what, status, path, body=None, raw=None, headers=None, param=None, pattern=None):
    code, _, text = server.request(path, body, headers=headers, raw=raw)
    check(code == status, f"{what}: status {status}", f"got {code}: {text}")
    try:
        err = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        check(False, f"{what}: OpenAI error JSON", text)
    check(isinstance(err.get("message"), str) and err["message"] and "type" in err, f"{what}: message and type", text)
    if param is not None:
        check(err.get("param") == param, f"{what}: param {param}", text)
    if pattern is not None:
        check(re.search(pattern, err["message"]) is not None, f"{what}: message matches {pattern!r}", text)


def make_doc(tmp, name, tokens, seed):
    doc = os.path.join(tmp, name + ".txt")
    meta = os.path.join(tmp, name + ".json")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-haystack"), "--tokens", str(tokens), "--depth", "0.4",
                    "--seed", str(seed), "--no-question", "--out", doc, "--json", meta], check=True,
                   capture_output=True)
    return open(doc).read(), json.load(open(meta))["key"], doc


def chat_answer(demo, doc_path, question):
    rc, out, err = run([CHAT, "--config", CONFIG, "--model", demo, "--set", "max_seq_len=40000",
                        "--prompt-file", doc_path, "--prompt", question])
    check(rc == 0, "longctx-chat answers", err)
    return out.rstrip("\n")


def answers(server, demo, doc, key, doc_path):
    messages = [{"role": "user", "content": doc.strip() + "\n\n" + QUESTION}]
    expected = chat_answer(demo, doc_path, QUESTION)
    check(key in expected, "longctx-chat finds the key", expected)

    code, _, text = server.request("/v1/chat/completions", {"messages": messages})
    check(code == 200, "chat completion: 200", text)
    j = json.loads(text)
    check(j["object"] == "chat.completion" and j["model"] == "demo", "chat completion: object and model", text)
    answer = j["choices"][0]["message"]["content"]
    check(answer == expected, "non-streaming answer equals longctx-chat's", f"{answer!r} vs {expected!r}")
    check(j["choices"][0]["finish_reason"] == "stop", "finish_reason stop (end of generation)", text)
    usage = j["usage"]
    check(usage["prompt_tokens"] > 1000 and usage["completion_tokens"] >= 1, "usage counts tokens", text)
    check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "usage total", text)

    # Streaming, the same question: the same text; chunks, the usage chunk, [DONE].
    code, headers, text = server.request("/v1/chat/completions", {"messages": messages, "stream": True,
                                                                  "stream_options": {"include_usage": True}})
    check(code == 200 and headers["Content-Type"].startswith("text/event-stream"), "stream: event stream", text)
    payloads = events(text)
    check(payloads[-1] == "[DONE]", "stream ends with [DONE]", text[-300:])
    check(streamed_text(text) == expected, "streamed answer equals longctx-chat's", text[:2000])
    chunks = [json.loads(p) for p in payloads[:-1]]
    check(all(c["object"] == "chat.completion.chunk" for c in chunks), "stream: chunk objects", text[:500])
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "stream: the first delta has the role")
    check(chunks[-1]["choices"] == [] and "usage" in chunks[-1], "stream: a last chunk with usage", text[-500:])
    # The same document again: its whole blocks come from the cache.
    cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    check(prompt_tokens - 16 <= cached < prompt_tokens, "the same prompt again: all but its last block cached",
          f"{cached} of {prompt_tokens}")

    # Another question on the same document: the document is not prefilled again.
    code, _, text = server.request("/v1/chat/completions", {"messages": [{"role": "user", "content":
                                                           doc.strip() + "\n\nTell me the pass key."}]})
    u = json.loads(text)["usage"]
    check(code == 200 and u["prompt_tokens_details"]["cached_tokens"] >= u["prompt_tokens"] - 32,
          "a second question on the same document: the document comes from the cache", text)
    check(json.loads(text)["timings"]["cached_tokens"] == u["prompt_tokens_details"]["cached_tokens"],
          "timings repeat cached_tokens", text)

    # Completions: raw text; stop strings end the answer before them.
    code, _, text = server.request("/v1/completions", {"prompt": doc.strip() + "\n\n" + QUESTION, "max_tokens": 8})
    j = json.loads(text)
    check(code == 200 and j["object"] == "text_completion" and isinstance(j["choices"][0]["text"], str),
          "completion: 200 and text", text)
    check(j["usage"]["completion_tokens"] <= 8, "completion: max_tokens holds", text)
    cut = expected.strip()[2:4]
    code, _, text = server.request("/v1/chat/completions", {"messages": messages, "stop": [cut]})
    j = json.loads(text)
    got = j["choices"][0]["message"]["content"]
    check(code == 200 and got == expected[:expected.index(cut)] and j["choices"][0]["finish_reason"] == "stop",
          "stop: the answer ends before the stop string", f"{got!r} (stop {cut!r}, full {expected!r})")
    code, _, text = server.request("/v1/chat/completions", {"messages": messages, "stop": cut, "stream": True})
    check(streamed_text(text) == expected[:expected.index(cut)], "stop while streaming", text[:1000])
    # max_tokens 1 ends with "length" unless the first token ends the answer.
    code, _, text = server.request("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    j = json.loads(text)
    check(j["usage"]["completion_tokens"] <= 1 and j["choices"][0]["finish_reason"] in ("length", "stop"),
          "max_tokens 1", text)
    return expected


def bad_input(server):
    chat = "/v1/chat/completions"
    ok = {"messages": [{"role": "user", "content": "hi"}]}
    expect_api_error(server, "malformed JSON", 400, chat, raw=b'{"messages": [', pattern="malformed JSON at byte")
    expect_api_error(server, "not an object", 400, chat, raw=b"[1, 2]", pattern="JSON object")
    expect_api_error(server, "messages of the wrong type", 400, chat, {"messages": "hi"}, param="messages")
    expect_api_error(server, "no messages", 400, chat, {"model": "demo"}, param="messages")
    expect_api_error(server, "empty messages", 400, chat, {"messages": []}, param="messages")
    expect_api_error(server, "a message without content", 400, chat, {"messages": [{"role": "user"}]},
                     param="messages[0].content")
    expect_api_error(server, "an unknown role", 400, chat, {"messages": [{"role": "robot", "content": "x"}]},
                     param="messages[0].role")
    expect_api_error(server, "unknown model", 404, chat, {**ok, "model": "gpt-4"}, param="model", pattern="demo")
    expect_api_error(server, "max_tokens 0", 400, chat, {**ok, "max_tokens": 0}, param="max_tokens")
    expect_api_error(server, "max_tokens -5", 400, chat, {**ok, "max_tokens": -5}, param="max_tokens")
    expect_api_error(server, "max_tokens huge", 400, chat, {**ok, "max_tokens": 10**30}, param="max_tokens")
    expect_api_error(server, "max_tokens 2**64", 400, chat, {**ok, "max_tokens": 2**64 - 1}, param="max_tokens")
    expect_api_error(server, "max_tokens a string", 400, chat, {**ok, "max_tokens": "10"}, param="max_tokens")
    expect_api_error(server, "temperature a string", 400, chat, {**ok, "temperature": "hot"}, param="temperature")
    expect_api_error(server, "temperature out of range", 400, chat, {**ok, "temperature": 9}, param="temperature")
    expect_api_error(server, "stream not a boolean", 400, chat, {**ok, "stream": "yes"}, param="stream")
    expect_api_error(server, "stop: five strings", 400, chat, {**ok, "stop": ["a", "b", "c", "d", "e"]}, param="stop")
    expect_api_error(server, "n = 2", 400, chat, {**ok, "n": 2}, param="n")
    expect_api_error(server, "prompt missing", 400, "/v1/completions", {"max_tokens": 3}, param="prompt")
    expect_api_error(server, "prompt empty", 400, "/v1/completions", {"prompt": ""}, param="prompt")
    expect_api_error(server, "a prompt longer than max_seq_len", 400, "/v1/completions",
                     {"prompt": "the pass key is 1234. " * 8000}, param="prompt", pattern="max_seq_len")
    expect_api_error(server, "a body over the size limit", 413, chat, raw=b"x" * (300 << 10),
                     pattern="larger than")
    expect_api_error(server, "unknown endpoint", 404, "/v1/nothing", {}, pattern="no such endpoint")
    # A POST whose body has no length: httplib refuses it before any route; the message says why.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.putrequest("POST", "/v1/completions")
    conn.endheaders()
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    check(response.status == 400 and "neither Content-Length nor chunked" in json.loads(text)["error"]["message"],
          "a POST without Content-Length: 400 saying what it lacks", text)
    # Still serving.
    code, _, text = server.request(chat, ok)
    check(code == 200 and json.loads(text)["choices"][0]["message"]["role"] == "assistant",
          "after bad input the server still answers", text)


def api_key(demo):
    server = Server(demo, "--api-key", "sesame")
    try:
        ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        expect_api_error(server, "missing API key", 401, "/v1/chat/completions", ok, pattern="missing API key")
        expect_api_error(server, "wrong API key", 401, "/v1/chat/completions", ok,
                         headers={"Authorization": "Bearer nope"}, pattern="invalid API key")
        expect_api_error(server, "metrics need the key", 401, "/metrics")
        code, _, text = server.request("/v1/chat/completions", ok, headers={"Authorization": "Bearer sesame"})
        check(code == 200, "the right API key is served", text)
        code, _, _ = server.request("/health")
        check(code == 200, "/health needs no key")
    finally:
        server.stop()


def open_stream(server, body):
    """A raw streaming request: the socket, after the response headers."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def metric(server, name):
    _, _, text = server.request("/metrics")
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    check(m is not None, f"/metrics has {name}", text)
    return float(m[1])


def queue_and_disconnect(server, long_doc):
    """A long prefill keeps the worker busy: with --max-queued 1 the third
    request is refused with 503 and Retry-After; a client that goes away is
    cancelled and the server goes on."""
    # Documents the cache does not hold yet: each is prefilled whole (about a second here).
    def busy(tag):
        return {"messages": [{"role": "user", "content": tag + long_doc + "\n\nWhat is the pass key?"}],
                "max_tokens": 4}
    conn1, r1 = open_stream(server, busy("First: "))
    check(r1.status == 200, "first long request streams")
    conn2, r2 = open_stream(server, busy("Second: "))
    check(r2.status == 200, "second request queued")
    code, headers, text = server.request("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    check(code == 503 and headers.get("Retry-After") is not None, "a full queue answers 503 with Retry-After",
          f"{code} {text}")
    # The second client goes away while it waits; the first reads its answer.
    conn2.sock.shutdown(socket.SHUT_RDWR)
    conn2.close()
    body = r1.read().decode()
    check(events(body)[-1] == "[DONE]", "the first request completes", body[-300:])
    deadline = time.time() + 60
    while metric(server, "longctx_cancelled_requests_total") < 1 and time.time() < deadline:
        time.sleep(0.2)
    check(metric(server, "longctx_cancelled_requests_total") >= 1, "the client that went away is cancelled")
    check(metric(server, "longctx_queue_length") == 0, "the queue is empty again")
    code, _, text = server.request("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 2})
    check(code == 200, "served after the cancel", text)


def sigterm_finishes_running(demo, long_doc, key):
    server = Server(demo, "--grace-seconds", "120")  # room for a slow (sanitized) prefill
    body = {"messages": [{"role": "user", "content": long_doc + "\n\n" + QUESTION}]}
    conn, r = open_stream(server, body)
    time.sleep(0.2)  # in its prefill
    server.proc.send_signal(signal.SIGTERM)
    text = r.read().decode()
    check(events(text)[-1] == "[DONE]" and key in streamed_text(text),
          "SIGTERM: the running request finishes with its answer", text[-500:])
    rc = server.proc.wait(timeout=60)
    check(rc == 0, "SIGTERM: exit status 0", "".join(server.lines))
    out = "".join(server.lines)
    check("finishing requests" in out, "SIGTERM: says it is finishing", out)


def ask(server, doc, question=QUESTION, stream=False):
    """(answer text, usage) of one question about `doc`."""
    body = {"messages": [{"role": "user", "content": doc.strip() + "\n\n" + question}]}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    code, _, text = server.request("/v1/chat/completions", body)
    check(code == 200, "a question is answered", text[-500:])
    if stream:
        return streamed_text(text), json.loads(events(text)[-2])["usage"]
    j = json.loads(text)
    return j["choices"][0]["message"]["content"], j["usage"]


def disk_cache(tmp, demo, docs):
    """Sequences that leave DRAM go to --cache-dir and come back from it, also
    after a restart; torn or damaged entries are removed, never served."""
    cache = os.path.join(tmp, "cache")
    # DRAM for one 8K-token document's KV at a time: the second evicts the first.
    args = ["--cache-dir", cache, "--set", "dram_budget=20MiB"]
    (doc1, key1), (doc2, key2) = docs
    server = Server(demo, *args, max_seq_len=10000)
    try:
        answer, usage = ask(server, doc1)
        check(key1 in answer and usage["prompt_tokens_details"]["cached_tokens"] == 0, "doc 1, uncached", answer)
        answer, usage = ask(server, doc2)
        check(key2 in answer and usage["prompt_tokens_details"]["cached_tokens"] == 0, "doc 2, uncached", answer)
        check(metric(server, "longctx_disk_sequences") == 1, "doc 1 went to disk when doc 2 needed the DRAM")
        answer, usage = ask(server, doc1, "Tell me the pass key.")
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        check(key1 in answer and cached > usage["prompt_tokens"] - 64, "doc 1 comes back from disk",
              f"{answer!r} {usage}")
        check(metric(server, "longctx_kv_disk_bytes") > 0, "/metrics: disk bytes")
    finally:
        server.stop()  # SIGTERM: what is in DRAM goes to disk
    entries = sorted(f for f in os.listdir(cache) if f.endswith(".kv"))
    check(len(entries) >= 2, "after SIGTERM the disk holds both documents", str(os.listdir(cache)))

    # A restart reads them back: both documents answer from the cache.
    server = Server(demo, *args, max_seq_len=10000)
    try:
        for doc, key in docs:
            answer, usage = ask(server, doc, stream=True)
            check(key in answer and usage["prompt_tokens_details"]["cached_tokens"] > usage["prompt_tokens"] - 64,
                  "after a restart, a document answers from the disk cache", f"{answer!r} {usage}")
    finally:
        server.stop()

    # What a crash leaves: a temp file, half an entry, a damaged snapshot.
    open(os.path.join(cache, "seq-0badf00d-12.kv.tmp.999"), "wb").write(b"partial")
    open(os.path.join(cache, "seq-0badf00d-12.tokens"), "wb").write(b"LCTXTOKS")
    for name in sorted(f for f in os.listdir(cache) if f.endswith(".kv")):
        path = os.path.join(cache, name)
        with open(path, "r+b") as f:  # a byte in the middle of the blocks
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x5A]))
    server = Server(demo, *args, max_seq_len=10000)
    try:
        for doc, key in docs:
            answer, usage = ask(server, doc)
            check(key in answer and usage["prompt_tokens_details"]["cached_tokens"] == 0,
                  "a damaged entry is not served: the document is prefilled again", f"{answer!r} {usage}")
        log = "".join(server.lines)
        check("removed seq-0badf00d-12.kv.tmp.999" in log and "removed seq-0badf00d-12 " in log,
              "the torn files are removed at the start", log)
        check("not used" in log and "checksum" in log, "the damaged snapshot is named and dropped", log)
        check(not os.path.exists(os.path.join(cache, "seq-0badf00d-12.tokens")), "the half entry is gone")
    finally:
        server.stop()

    # A cache directory that cannot be written: a clear error at the start.
    not_dir = os.path.join(tmp, "a-file")
    open(not_dir, "w").close()
    for bad in (not_dir, "/proc/version/cache"):
        rc, _, err = run([SERVER, "--config", CONFIG, "--model", demo, "--port", "0", "--cache-dir", bad])
        check(rc == 1 and "--cache-dir" in err and bad in err, f"--cache-dir {bad}: exit 1 naming it", err)


def sigkill_mid_snapshot(tmp, demo, docs):
    """SIGKILL while the disk cache is being written: SIGTERM makes the server
    write every sequence in DRAM, and the kill comes as soon as a temp file of
    that write appears. Every restart drops what was torn and serves the right
    answers."""
    cache = os.path.join(tmp, "cache-kill")
    caught = torn = 0
    for round_ in range(4):
        server = Server(demo, "--cache-dir", cache, max_seq_len=10000)
        try:
            torn += sum(1 for line in server.lines if "disk cache: removed" in line)
            for doc, key in docs:  # new token lists each round: written again at exit
                answer, _ = ask(server, doc, f"Round {round_}: what is the pass key?")
                check(key in answer, f"round {round_}: the right key after a kill and restart", answer)
            server.proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 30
            while server.proc.poll() is None and time.time() < deadline:
                if any(".tmp." in f for f in os.listdir(cache)):
                    server.proc.kill()
                    caught += 1
                    break
        finally:
            server.proc.kill()
            server.proc.wait()
    server = Server(demo, "--cache-dir", cache, max_seq_len=10000)
    try:
        time.sleep(0.2)  # the start's log lines
        torn += sum(1 for line in server.lines if "disk cache: removed" in line)
        for doc, key in docs:
            answer, _ = ask(server, doc)
            check(key in answer, "after the kills: the right keys", answer)
    finally:
        server.stop()
    check(caught > 0 and torn > 0, "some kills landed inside a write and left torn files",
          f"{caught} kills inside a write, {torn} torn files")
    print(f"test_server: {caught} of 4 SIGKILLs landed inside a disk-cache write; {torn} torn files were "
          "removed at the next start")


def not_utf8(tmp):
    """A random-weight model emits byte tokens that are not UTF-8: the answers
    stay valid JSON (U+FFFD in their place), streaming and not."""
    model = os.path.join(tmp, "mha-64.gguf")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-model"), "--preset", "mha-64", "--seed", "1",
                    "--out", model], check=True, capture_output=True)
    server = Server(model, max_seq_len=4096)
    try:
        replaced = 0
        for seed in range(4):
            body = {"prompt": "hello world", "max_tokens": 48, "temperature": 1.0, "seed": seed}
            code, _, text = server.request("/v1/completions", body)
            check(code == 200, "random bytes: a JSON answer", text[:300])
            plain = json.loads(text)["choices"][0]["text"]
            replaced += "\ufffd" in plain
            code, _, text = server.request("/v1/completions", {**body, "stream": True})
            check(code == 200 and events(text)[-1] == "[DONE]", "random bytes: a whole stream", text[-300:])
            check(streamed_text(text, chat=False) == plain, "random bytes: the stream has the same text")
        check(replaced > 0, "the model did emit bytes that are not UTF-8 (else this test tests nothing)")
    finally:
        server.stop()


def run_all(tmp):
    demo = os.path.join(tmp, "demo.gguf")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], check=True, capture_output=True)
    doc, key, doc_path = make_doc(tmp, "doc", 2048, 5)
    long_doc, long_key, long_path = make_doc(tmp, "long", 32000, 6)

    server = Server(demo, "--max-body-bytes", str(256 << 10), "--max-queued", "1")
    try:
        code, _, text = server.request("/health")
        check(code == 200 and json.loads(text)["status"] == "ok", "/health", text)
        code, _, text = server.request("/v1/models")
        models = json.loads(text)
        check(code == 200 and models["data"][0]["id"] == "demo", "/v1/models lists the model", text)
        code, _, text = server.request("/")
        check(code == 200 and "<title>longctx</title>" in text, "the chat page at /")

        answers(server, demo, doc, key, doc_path)
        # The pass key from a 32K-token document, streamed.
        code, _, text = server.request("/v1/chat/completions", {
            "messages": [{"role": "user", "content": long_doc.strip() + "\n\n" + QUESTION}], "stream": True})
        check(code == 200 and long_key in streamed_text(text), "the pass key from a 32K document", text[-500:])
        bad_input(server)
        queue_and_disconnect(server, long_doc)
        # A path of the client's (a quote and a newline in it) is no label of /metrics: it counts as "other".
        code, _, _ = server.request("/x%22%7D%201%0Afake_metric%7Bpath%3D%22")
        check(code == 404, "an unknown path is a 404")
        _, _, text = server.request("/metrics")
        check("fake_metric" not in text and "longctx_requests_total{path=\"other\",status=\"404\"} " in text,
              "/metrics: an unknown path counts as other, and writes nothing of its own", text)
        for name in ("longctx_requests_total{path=\"/v1/chat/completions\",status=\"200\"}",
                     "longctx_requests_total{path=\"/v1/chat/completions\",status=\"400\"}",
                     "longctx_cached_tokens_total", "longctx_prefill_tokens_per_second", "longctx_kv_dram_bytes"):
            check(name in text, f"/metrics: {name}", text)
        check(metric(server, "longctx_cached_tokens_total") > 2000, "/metrics counts cached tokens", text)
    finally:
        server.stop()
    api_key(demo)
    not_utf8(tmp)
    # 8K-token documents: the disk tests prefill them many times (slow in a sanitized build).
    docs = [make_doc(tmp, f"disk-{i}", 8000, 7 + i)[:2] for i in range(2)]
    # An 8K-token prefill outlasts the 0.2 s before SIGTERM and fits the grace
    # period in a sanitized build on a 2-core AVX2-only CPU, where the 32K one
    # did not (it was cancelled after 120 s).
    sigterm_finishes_running(demo, *docs[0])
    disk_cache(tmp, demo, docs)
    sigkill_mid_snapshot(tmp, demo, docs)


def main():
    with tempfile.TemporaryDirectory(prefix="longctx-server-test-") as tmp:
        run_all(tmp)
    print(f"test_server: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
