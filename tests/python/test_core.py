"""Smoke tests of the native module: it imports, reports, and turns C++
errors into Python exceptions with the C++ message."""
import os

import longctx

from _env import SOURCE_DIR, check


def main():
    check(longctx.version().count(".") == 2, "version looks like X.Y.Z")
    features = longctx.cpu_features()
    check(isinstance(features["avx2"], bool) and features["simd_target"], "cpu_features dict")
    text = longctx.load_config(os.path.join(SOURCE_DIR, "configs", "default.yaml"), ["block_size=64"])
    check("block_size: 64" in text, "override applied: " + text)
    try:
        longctx.load_config(os.path.join(SOURCE_DIR, "configs", "default.yaml"), ["block_size=0"])
        check(False, "block_size=0 must be rejected")
    except longctx.Error as e:
        check("block_size" in str(e), "error names the key: " + str(e))
    try:
        longctx.load_config("/nonexistent/x.yaml")
        check(False, "missing file must be rejected")
    except longctx.Error as e:
        check("/nonexistent/x.yaml" in str(e), "error names the path: " + str(e))
    print("python bindings: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
