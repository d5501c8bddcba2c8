"""longctx-bench's command line: --help for the harness and for each
subcommand prints the options and exits 0; bad arguments exit non-zero with
the argument named. Runs one benchmark, kernels at 4K with two KV types, for
the ratio it reports between them. Run by ctest (LONGCTX_BIN_DIR set) or
by hand. Exit status 1 on the first failure."""
import contextlib
import io
import json
import os
import sys
import tempfile

import _env
from _env import check, run

BENCH = os.path.join(_env.BIN_DIR, "longctx-bench")
SUBCOMMANDS = ["kvstore", "kernels", "accuracy", "decode", "prefill", "matmul", "gpu", "e2e"]


def main():
    for flag in ("--help", "-h"):
        rc, out, err = run([BENCH, flag])
        check(rc == 0, f"longctx-bench {flag} exits 0", err)
        for sub in SUBCOMMANDS:
            check(f"  {sub} " in out, f"longctx-bench {flag} lists {sub}", out)
    for sub in SUBCOMMANDS:
        rc, out, err = run([BENCH, sub, "--help"], timeout=60)
        check(rc == 0, f"longctx-bench {sub} --help exits 0", out + err)
        check(out.startswith("usage: "), f"{sub} --help prints a usage line", out)
        check("--" in out, f"{sub} --help lists options", out)
    rc, out, _ = run([BENCH, "accuracy", "--help"])
    for name in ("quest", "adakv-sep", "razor", "h2o", "streaming", "quoka", "needle", "multiquery", "prefill"):
        check(name in out, f"accuracy --help names '{name}'", out)
    rc, out, _ = run([BENCH, "e2e", "--help"], timeout=60)
    for option in ("--bin-dir", "--config", "--seed", "--contexts"):
        check(option in out, f"e2e --help describes {option}", out)
    # The scripts are looked for under the current directory's tools/ first
    # (a copy of the tree with a carried build, as on a lent GPU machine).
    with tempfile.TemporaryDirectory() as tree:
        os.mkdir(os.path.join(tree, "tools"))
        with open(os.path.join(tree, "tools", "bench_e2e.py"), "w") as f:
            f.write("import sys\nprint('copied tree e2e', sys.argv[1:])\n")
        rc, out, err = run([BENCH, "e2e", "--seed", "3"], cwd=tree, timeout=60)
        check(rc == 0 and "copied tree e2e" in out and "'--bin-dir'" in out and "'--seed', '3'" in out,
              "e2e runs tools/bench_e2e.py of the current directory, with --bin-dir and the arguments", out + err)
    rc, out, err = run([BENCH])
    check(rc == 2 and "usage:" in err, "no subcommand: usage on stderr, exit 2", err)
    rc, out, err = run([BENCH, "nosuch", "--help"])
    check(rc == 2 and "unknown subcommand 'nosuch'" in err, "unknown subcommand named", err)
    rc, out, err = run([BENCH, "kernels", "--dtype", "f8"])
    check(rc == 1 and "--dtype" in err and "'f8'" in err, "kernels --dtype f8 refused, naming it", err)
    rc, out, err = run([BENCH, "kernels", "--dtype", "f16,q8_0,f16"])
    check(rc == 1 and "'f16' twice" in err, "kernels --dtype listing a type twice refused, naming it", err)
    rc, out, err = run([BENCH, "kernels", "--contexts", "4096", "--dtype", "q8_0,f16", "--no-prefill", "--reps", "1"],
                       timeout=300)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    steps = {(r["dtype"], r["threads"]): r for r in rows if r.get("kernel") == "sparse_step"}
    check(rc == 0 and {dtype for dtype, _ in steps} == {"q8_0", "f16"}, "kernels runs both listed KV types", err)
    for (dtype, threads), r in steps.items():
        f16 = steps[("f16", threads)]
        check(abs(r["over_f16"] - r["ms"] / f16["ms"]) < 1e-4 * r["over_f16"],
              f"kernels: {dtype} over_f16 is its time over f16's ({threads} threads)", str(r))
        # sparse_step runs the runtime's defaults: at 4K the sinks and the local window cover every token.
        check(r["layout"] == "default" and r["attended_tokens"] == 4096 * 8,
              f"kernels: sparse_step attends what the default layout does ({dtype}, {threads} threads)", str(r))
    budget_steps = [r for r in rows if r.get("kernel") == "sparse_step_budget"]
    check(len(budget_steps) == len(steps) and all(r["layout"] == "budget_only" for r in budget_steps),
          "kernels: the budget-only step is a row of its own, named so", out)
    # The top_p step beside the default one; RazorAttention's scoring of 2 of the 8 kv heads (ceil 15%).
    top_p = {(r["dtype"], r["threads"]): r for r in rows if r.get("kernel") == "sparse_step_top_p"}
    check(top_p.keys() == steps.keys() and all(
              abs(r["over_step"] - r["ms"] / steps[key]["ms"]) < 1e-4 * r["over_step"] and r["layout"] == "default"
              for key, r in top_p.items()), "kernels: sparse_step_top_p over sparse_step, on the default layout", out)
    retrieval = [r for r in rows if r.get("kernel") == "score_retrieval"]
    check(len(retrieval) == len(steps) and all(r["scored_heads"] == 2 and r["over_score"] > 0 for r in retrieval),
          "kernels: score_retrieval scores 2 of 8 kv heads", out)
    rc, out, err = run([BENCH, "kernels", "--target", "avx9"])
    check(rc == 1 and "--target 'avx9'" in err and "sse4" in err, "kernels --target avx9 refused, naming it and "
          "the targets this CPU runs", err)
    # Every x86-64 CPU longctx runs on has SSE4; the rows say which target ran.
    rc, out, err = run([BENCH, "kernels", "--contexts", "4096", "--dtype", "q8_0", "--no-prefill", "--reps", "1",
                        "--target", "sse4"], timeout=300)
    targets = {r.get("target") for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))
               if r.get("kernel") == "dense"}
    check(rc == 0 and targets == {"sse4"}, "kernels --target sse4 runs the SSE4 code", err + str(targets))
    rc, out, err = run([BENCH, "kernels", "--q-heads", "6", "--kv-heads", "4"])
    check(rc == 1 and "--q-heads (6)" in err and "--kv-heads (4)" in err, "kernels: q heads not a multiple of kv heads "
          "refused, naming both", err)
    rc, out, _ = run([BENCH, "kernels", "--help"])
    for option in ("--q-heads", "--kv-heads", "--head-dim", "--target"):
        check(option in out, f"kernels --help describes {option}", out)
    rc, out, err = run([BENCH, "accuracy", "--policies", "questt"])
    check(rc == 1 and "unknown policy 'questt'" in err, "unknown policy named", err)
    # Numeric options: refused before anything runs (no JSON line), naming the option, the text and the range.
    for args, expected in [
        (["kernels", "--contexts", "4096,abc"], "--contexts: expected an integer in [1, 2147483647], got 'abc'"),
        (["kernels", "--contexts", "4096,"], "kernels: --contexts: expected an integer in [1, 2147483647], got ''"),
        (["kernels", "--reps", "3x"], "kernels: --reps: expected an integer in [1, 2147483647], got '3x'"),
        (["kernels", "--reps", "0"], "kernels: --reps: expected an integer in [1, 2147483647], got '0'"),
        (["kernels", "--budget", "-1"], "kernels: --budget: expected an integer in [0, 2147483647], got '-1'"),
        (["kernels", "--contexts", "99999999999"], "kernels: --contexts: expected an integer in [1, 2147483647]"),
        (["kernels", "--reps"], "kernels: --reps needs a value"),
        (["kvstore", "--tokens", "-5"], "kvstore: --tokens: expected an integer in [1, 2147483647], got '-5'"),
        (["matmul", "--shapes", "4096x-1"], "matmul: --shapes K: expected an integer in [1, 2147483647], got '-1"),
        (["decode", "--contexts", "1000"], "decode: --contexts: expected an integer in [1280, 2147483647], got '1000'"),
        (["prefill", "--tokens", "0"], "prefill: --tokens: expected an integer in [1, 2147483647], got '0'"),
        (["gpu", "--reps", "0"], "gpu: --reps: expected an integer in [1, 2147483647], got '0'"),
        (["accuracy", "--budgets", "1,nan"], "accuracy: --budgets: expected a number in [0, 100], got 'nan'"),
        (["accuracy", "--budgets", "0"], "accuracy: --budgets: a budget of 0% attends nothing"),
        (["accuracy", "--seeds", "two"], "accuracy: --seeds: expected an integer in [1, 2147483647], got 'two'"),
    ]:
        rc, out, err = run([BENCH] + args, timeout=60)
        check(rc == 1 and expected in err and "{" not in out, f"longctx-bench {' '.join(args)} refused up front", err)
    check_server_script_json()
    print(f"test_bench_cli: {_env.passed} checks passed")


def check_server_script_json():
    """tools/bench_server.py prints null, not bare NaN (not JSON), for what it could not measure."""
    sys.path.insert(0, os.path.join(_env.SOURCE_DIR, "tools"))
    import bench_server

    class Args:
        jsonl = None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench_server.emit(Args(), {"phase": "decode", "rate": float("nan"), "ttft": float("inf"), "ms": 1.5})
    check(json.loads(out.getvalue()) == {"phase": "decode", "rate": None, "ttft": None, "ms": 1.5},
          "bench_server emits null for NaN and infinity", out.getvalue())
    check(bench_server.median_or_none([0.5, None]) is None and bench_server.median_or_none([1.0, 3.0]) == 2.0,
          "bench_server: a median over a missing measurement is None")
    check(bench_server.ratio_or_none(None, 2.0) is None and bench_server.ratio_or_none(1.0, 0) is None,
          "bench_server: a ratio with a missing or zero part is None")


if __name__ == "__main__":
    main()
