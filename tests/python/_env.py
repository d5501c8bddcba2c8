"""What the Python tests share: where the source tree and the built binaries
are, check() for the script-style tests (stop at the first failure, count
the checks passed) and run() for a binary that must not print a sanitizer
report.

ctest sets LONGCTX_SOURCE_DIR, LONGCTX_BIN_DIR and LONGCTX_VOCAB_DIR
(tests/CMakeLists.txt); run by hand, a test finds this checkout, its
build/bin and ../shared/vocab beside it. The tests import this
module from their own folder (`import _env`); ctest runs only test_*.py.
"""
import os
import subprocess
import sys

SOURCE_DIR = os.environ.get("LONGCTX_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN_DIR = os.environ.get("LONGCTX_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
# llama.cpp's tokenizer test files (CMake's LONGCTX_VOCAB_DIR); tests skip without them.
VOCAB_DIR = os.environ.get("LONGCTX_VOCAB_DIR", os.path.join(SOURCE_DIR, "..", "shared", "vocab"))
passed = 0  # checks passed so far


def check(condition, what, detail=""):
    global passed
    if not condition:
        print("FAIL:", what)
        if detail:
            print(detail)
        sys.exit(1)
    passed += 1


def run(args, stdin=None, timeout=300, cwd=None):
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=cwd)
    # Under ASan/UBSan an error report also exits 1: never accept one.
    check("Sanitizer" not in p.stderr and "runtime error:" not in p.stderr, "no sanitizer report", p.stderr)
    return p.returncode, p.stdout, p.stderr
