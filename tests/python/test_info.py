"""longctx-info's preflight of a config: the store fits the budget (exit 0),
does not (exit 1, saying what to change), or fits a dram_budget set above
the machine's memory (exit 0 with a warning that it will not fit in memory).
Run by ctest (LONGCTX_BIN_DIR set) or by hand."""
import os

import _env
from _env import check, run

INFO = os.path.join(_env.BIN_DIR, "longctx-info")
DEMO = os.path.join(_env.SOURCE_DIR, "configs", "demo.yaml")


def main():
    rc, out, err = run([INFO, "--config", DEMO, "--set", "max_seq_len=8192"])  # 1 GiB: fits any test machine
    check(rc == 0 and "(fits)" in out and "warning" not in err, "8K tokens fit the default budget", out + err)
    rc, out, err = run([INFO, "--config", DEMO, "--set", "dram_budget=1MiB"])
    check(rc == 1 and "does not fit" in out and "raise dram_budget" in err, "a 1 MiB budget: does not fit", out + err)
    # 100M tokens of an 8B-shape model's KV: 12.7 TiB, under a budget of 99 TiB.
    rc, out, err = run([INFO, "--config", DEMO, "--set", "dram_budget=99TiB", "--set", "max_seq_len=100000000"])
    check(rc == 0 and "more than this machine's memory" in err and "it will not fit" in err,
          "a budget above the machine's memory: a warning that the store will not fit in it", out + err)
    print(f"test_info: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
