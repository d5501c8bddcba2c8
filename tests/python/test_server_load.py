"""longctx-server under load and faults, on loopback, bounded in time.

32 concurrent clients x 5 requests mix documents the cache holds with new
ones, streaming and not; some clients hang up mid-stream and some client
processes are SIGKILLed mid-stream. Every request gets 200 or 503 (with
Retry-After), the server never crashes, and afterwards its resident memory is
back within 10% of what it was idle (the DRAM cache is bounded by
dram_budget) and it still answers correctly.

Runs as a script (ctest); exit status 1 on the first failure.
"""
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import _env
from _env import BIN_DIR, check
from test_server import QUESTION, Server, events, make_doc, streamed_text

CLIENTS = 32
REQUESTS = 5


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def one_request(port, doc, stream, hang_up, rng):
    """(status, answer text or None)."""
    body = {"messages": [{"role": "user", "content": doc + "\n\n" + QUESTION}], "stream": stream,
            "max_tokens": 8}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status == 503:
            check(r.getheader("Retry-After") is not None, "503 carries Retry-After")
            r.read()
            return 503, None
        if hang_up:
            r.read(rng.randint(0, 40))  # maybe part of the first event, then gone
            return r.status, None
        text = r.read().decode()
        if r.status != 200:
            return r.status, text
        if stream:
            check(events(text)[-1] == "[DONE]", "a stream ends with [DONE]", text[-300:])
            return 200, streamed_text(text)
        return 200, json.loads(text)["choices"][0]["message"]["content"]
    finally:
        conn.close()


# A client process that streams and is SIGKILLed mid-way (started with -c).
KILLED_CLIENT = r"""
import http.client, json, sys
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=300)
body = {"messages": [{"role": "user", "content": open(sys.argv[2]).read() + "\n\nWhat is the pass key?"}],
        "stream": True}
conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
r = conn.getresponse()
print(r.status, flush=True)
while r.read(1):
    pass
"""


def main():
    with tempfile.TemporaryDirectory(prefix="longctx-server-load-") as tmp:
        demo = os.path.join(tmp, "demo.gguf")
        subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], check=True, capture_output=True)
        shared = [make_doc(tmp, f"shared-{i}", 1024, 20 + i) for i in range(4)]
        fresh = [make_doc(tmp, f"fresh-{i}", 1024, 100 + i) for i in range(CLIENTS * REQUESTS // 2)]
        # Room in DRAM for a few sequences only: the cache stays bounded under load.
        # In a sanitized build ASan holds freed memory back (its quarantine, 256 MiB by
        # default, and free lists it returns to the system only when told), which
        # would read as growth: a small quarantine, and release every 100 ms.
        asan = os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=4:allocator_release_to_os_interval_ms=100"
        env = {**os.environ, "ASAN_OPTIONS": asan}
        server = Server(demo, "--max-queued", "24", "--set", "dram_budget=48MiB", max_seq_len=4096, env=env)
        try:
            # Idle: the cache full (dram_budget), after requests of each kind and one
            # burst of concurrent ones (every HTTP thread has run), so that what
            # stays is what any server that has seen traffic holds.
            warm = [make_doc(tmp, f"warm-{i}", 1024, 300 + i) for i in range(12)] + shared
            for i, (doc, key, _) in enumerate(warm):
                status, answer = one_request(server.port, doc, i % 2 == 0, False, random.Random(0))
                check(status == 200 and key in answer, "warm-up request", str(answer))
            burst = [threading.Thread(target=one_request, args=(server.port, shared[i % 4][0], i % 2 == 0, False,
                                                                random.Random(i))) for i in range(CLIENTS)]
            for t in burst:
                t.start()
            for t in burst:
                t.join()
            time.sleep(1.0)
            time.sleep(0.5)
            idle = rss_bytes(server.proc.pid)

            statuses, wrong = [], []
            lock = threading.Lock()

            def client(i):
                rng = random.Random(i)
                for r in range(REQUESTS):
                    use_shared = (i + r) % 2 == 0
                    doc, key, _ = shared[rng.randrange(len(shared))] if use_shared else fresh[(i * REQUESTS + r) // 2]
                    hang_up = rng.random() < 0.15
                    status, answer = one_request(server.port, doc, rng.random() < 0.5, hang_up, rng)
                    with lock:
                        statuses.append(status)
                        if status == 200 and answer is not None and key not in answer:
                            wrong.append(answer)

            killed = []
            for doc in fresh[:4]:
                p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, str(server.port), doc[2]],
                                     stdout=subprocess.PIPE, text=True)
                killed.append(p)
            started = time.time()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
            for t in threads:
                t.start()
            time.sleep(0.3)
            for p in killed:  # mid-stream (or still queued): gone without a word
                p.send_signal(signal.SIGKILL)
                p.wait()
            for t in threads:
                t.join(timeout=600)
            check(not any(t.is_alive() for t in threads), "every client finished within 10 minutes")
            elapsed = time.time() - started
            check(server.proc.poll() is None, "the server is still running after the load")
            check(len(statuses) == CLIENTS * REQUESTS, "every request was answered", f"{len(statuses)}")
            check(set(statuses) <= {200, 503}, "every answer is 200 or 503", str(sorted(set(statuses))))
            check(statuses.count(200) >= CLIENTS, "most requests are served", f"{statuses.count(200)} x 200")
            check(not wrong, "every answer served has its document's key", str(wrong[:3]))

            # Drained, the memory comes back.
            deadline = time.time() + 60
            while time.time() < deadline:
                _, _, text = server.request("/metrics")
                if "longctx_queue_length 0" in text and "longctx_requests_running 0" in text:
                    break
                time.sleep(0.2)
            time.sleep(1.0)
            after = rss_bytes(server.proc.pid)
            print(f"test_server_load: {CLIENTS}x{REQUESTS} requests in {elapsed:.1f} s: "
                  f"{statuses.count(200)} x 200, {statuses.count(503)} x 503; RSS idle {idle >> 20} MiB, "
                  f"after {after >> 20} MiB")
            check(after <= idle * 1.10, "RSS back within 10% of idle", f"idle {idle}, after {after}")
            status, answer = one_request(server.port, shared[1][0], True, False, random.Random(1))
            check(status == 200 and shared[1][1] in answer, "still answering correctly after the load", str(answer))
        finally:
            server.stop()
    print(f"test_server_load: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
