"""longctx-server with real clients: the official OpenAI Node client (npm
"openai") and the chat page in headless Chromium (Debian's chromium, driven by
npm "puppeteer-core"). The scripts are in tests/node; scripts/install-deps.sh
installs node, chromium and their npm packages (npm ci in tests/node).

The page test saves a screenshot to <build>/test-output/server-page.png.
Runs as a script (ctest); exit status 1 on the first failure.
"""
import os
import shutil
import subprocess
import tempfile

import _env
from _env import BIN_DIR, SOURCE_DIR, check
from test_server import Server, chat_answer, make_doc

NODE_DIR = os.path.join(SOURCE_DIR, "tests", "node")
OUTPUT_DIR = os.path.join(BIN_DIR, "..", "test-output")


def node(tmp, script, *args):
    # TMPDIR: Chromium's profile and scratch files go inside the test's folder, removed after.
    # Not the sanitizer runtime a sanitized build preloads into Python: Chromium fails under it.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    p = subprocess.run(["node", os.path.join(NODE_DIR, script), *args], capture_output=True, text=True,
                       timeout=300, cwd=NODE_DIR, env={**env, "TMPDIR": tmp})
    check(p.returncode == 0, f"{script} passes", p.stdout + p.stderr)
    print(p.stdout.strip())


def main():
    # Missing tools are a failure: install-deps installs them, and CI runs it.
    check(shutil.which("node") is not None, "node is installed (scripts/install-deps.sh)")
    check(os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")) and
          os.path.isdir(os.path.join(NODE_DIR, "node_modules", "puppeteer-core")),
          "tests/node has its npm packages (scripts/install-deps.sh runs npm ci there)")
    chromium = shutil.which("chromium")
    check(chromium is not None, "chromium is installed (scripts/install-deps.sh)")
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="longctx-server-clients-") as tmp:
        demo = os.path.join(tmp, "demo.gguf")
        subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], check=True, capture_output=True)
        doc, key, doc_path = make_doc(tmp, "doc", 4096, 8)
        expected = chat_answer(demo, doc_path, "What is the pass key?")
        expected_path = os.path.join(tmp, "expected.txt")
        with open(expected_path, "w") as f:
            f.write(expected)
        server = Server(demo)
        try:
            base = f"http://127.0.0.1:{server.port}"
            node(tmp, "openai_client.mjs", base, doc_path, key, expected_path)
            screenshot = os.path.abspath(os.path.join(OUTPUT_DIR, "server-page.png"))
            # Another document, so that the page's first question is prefilled whole.
            _, page_key, page_doc_path = make_doc(tmp, "page-doc", 4096, 9)
            node(tmp, "web_page.mjs", base + "/", page_doc_path, page_key, screenshot, chromium)
            print(f"test_server_clients: screenshot of the chat page: {screenshot}")
        finally:
            server.stop()
    print(f"test_server_clients: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
