"""scripts/run-demo.sh, the README's main job, on a small haystack: it says the
answer is the hidden key and exits 0; with a policy that cannot find the key
(streaming: sinks + local window only) it says so and exits 1. Run by ctest
(LONGCTX_BIN_DIR, LONGCTX_SOURCE_DIR set) or by hand."""
import os
import subprocess
import tempfile

import _env
from _env import check

SCRIPT = os.path.join(_env.SOURCE_DIR, "scripts", "run-demo.sh")


def demo(tmp, *args):
    env = dict(os.environ, LONGCTX_BIN_DIR=os.path.abspath(_env.BIN_DIR), LONGCTX_DEMO_DIR=tmp)
    p = subprocess.run(["bash", SCRIPT, "--tokens", "4096", *args], env=env, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def main():
    with tempfile.TemporaryDirectory(prefix="longctx-run-demo-") as tmp:
        rc, out, err = demo(tmp)
        check(rc == 0, "run-demo.sh exits 0", out + err)
        check("is the key hidden at depth" in out and "correct" in out, "run-demo.sh says the answer is the key", out)
        rc, out, err = demo(tmp, "--set", "policy=streaming")
        check(rc == 1, "run-demo.sh exits 1 when the answer is wrong", out + err)
        check("is NOT the key" in err, "run-demo.sh says the answer is not the key", err)
    print(f"test_run_demo: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
