#!/usr/bin/python3
"""Baseline of `longctx-bench gpu`: torch scaled_dot_product_attention on the
shapes of its prefill_attention measurement, one compact JSON line per case.

A chunk of n_q queries at positions [history, history + n_q) attends keys
[0, history + i] (causal with an offset). SDPA's is_causal aligns the mask to
the top-left corner, so the mask is built explicitly (query i sees key j when
j <= history + i); GQA by repeating the kv heads. FLOPs are counted like
longctx-bench: 4 * n_q * mean keys per query * head_dim * n_heads. Prints a
{"bench":"gpu_sdpa","skipped":...} line when torch or CUDA is missing.
"""
import argparse
import json
import statistics
import sys


def emit(**fields):
    print(json.dumps({"bench": "gpu_sdpa", **fields}, separators=(",", ":")), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", default="32768,131072")
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--n-q", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means "no baseline"
        emit(skipped=f"torch not importable: {e}")
        return 0
    if not torch.cuda.is_available():
        emit(skipped="torch has no CUDA device")
        return 0

    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    group = a.heads // a.kv_heads
    for name in a.dtypes.split(","):
        for history in [int(h) for h in a.histories.split(",")]:
            n_kv = history + a.n_q
            gen = torch.Generator(device="cuda").manual_seed(1)
            q = torch.rand(1, a.heads, a.n_q, a.head_dim, device="cuda", generator=gen) * 2 - 1
            k = torch.rand(1, a.kv_heads, n_kv, a.head_dim, device="cuda", generator=gen) * 2 - 1
            v = torch.rand(1, a.kv_heads, n_kv, a.head_dim, device="cuda", generator=gen) * 2 - 1
            q, k, v = (t.to(dtypes[name]) for t in (q, k, v))
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            i = torch.arange(a.n_q, device="cuda")[:, None]
            j = torch.arange(n_kv, device="cuda")[None, :]
            mask = j <= history + i

            def run():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

            run()
            torch.cuda.synchronize()
            times = []
            for _ in range(a.reps):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) / 1e3)
            seconds = statistics.median(times)
            mean_keys = history + (a.n_q + 1) / 2
            flops = 4.0 * a.n_q * mean_keys * a.head_dim * a.heads
            emit(dtype=name, history=history, n_q=a.n_q, n_kv=n_kv, ms=seconds * 1e3,
                 tflops=flops / seconds / 1e12, backend="sdpa+bool_mask", torch=torch.__version__)
            del q, k, v, mask
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
