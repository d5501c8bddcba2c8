#!/usr/bin/python3
"""Injected PyTorch attention on a GPU: the time of a prefill and of decode
steps of a small Llama-shaped model (tests/python/tiny_llama.py: 32/8 heads x
128, 2 layers by default) whose attention modules longctx.inject replaced,
with `model.backend: cuda` (longctx.torch's CUDA path: prefill and the decode
window on the GPU, the selection's sparse part on the CPU) and `cpu` (q/k/v
copied to the CPU and attended there), next to the model's own PyTorch
attention with its own KV cache. One JSON line per backend; a
{"bench":"inject","skipped":...} line without torch, CUDA or a CUDA build.
attend_ms: the longctx attention calls of a decode step alone (summed over
layers, each timed after a torch.cuda.synchronize(), in extra steps).

The config is the select policy (QUEST, 128-token blocks, 4096-token budget,
1024-token window, 128 sinks, f16 K/V).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))


def emit(**fields):
    print(json.dumps({"bench": "inject", **fields}, separators=(",", ":")), flush=True)


class _Timed:
    """Forwards to a longctx.LayerAttention, timing its decode calls."""

    def __init__(self, inner, torch):
        self.inner, self.torch, self.ms = inner, torch, 0.0

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name not in ("decode", "device_decode"):
            return fn

        def timed(*args, **kwargs):
            self.torch.cuda.synchronize()
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            self.torch.cuda.synchronize()
            self.ms += (time.perf_counter() - start) * 1e3
            return result
        return timed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--backends", default="torch,cuda,cpu")
    a = ap.parse_args()
    try:
        import torch
        import longctx
        import longctx.torch  # noqa: F401
        import tiny_llama
    except Exception as e:  # noqa: BLE001 - any import failure means no measurement
        emit(skipped=f"not importable: {e}")
        return 0
    if not torch.cuda.is_available():
        emit(skipped="torch has no CUDA device")
        return 0
    device = torch.device("cuda", 0)
    shape = dict(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, intermediate_size=4096,
                 num_hidden_layers=a.layers)
    model = tiny_llama.random_model(seed=1, **shape).to(device)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 97, (a.context,), generator=g).tolist()
    steps = torch.randint(0, 97, (a.steps,), generator=g).tolist()
    keys = {"chunk_size": 4096, "max_seq_len": a.context + 2 * a.steps + 16, "block_size": 128,
            "local_windows_len": 1024, "initial_len": 128, "kv_type": "f16", "policy": "select",
            "dense_layer_num": 0, "second_select_num": 32, "representative_type": "QUEST"}

    for backend in a.backends.split(","):
        if backend != "torch":
            config = longctx.Config.from_dict(dict(keys, model={"backend": backend}))
            longctx.inject(model, [{"match": {"class": "LlamaAttention"},
                                    "replace": {"class": "longctx.torch.SparseAttention",
                                                "kwargs": {"config": config}}}])
        cache = tiny_llama.KVCache()
        with torch.no_grad():
            def run(tokens, pos):
                ids = torch.tensor([tokens], device=device)
                positions = torch.arange(pos, pos + len(tokens), device=device)[None]
                return model(ids, position_ids=positions, past_key_values=cache)[0]
            try:
                torch.cuda.synchronize()
                start = time.perf_counter()
                run(prompt, 0)
                torch.cuda.synchronize()
                prefill = time.perf_counter() - start
                times = []
                for i, t in enumerate(steps):
                    start = time.perf_counter()
                    run([t], a.context + i)
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - start) * 1e3)
                attend = []
                if backend != "torch":
                    session = model.model.layers[0].self_attn.session
                    timed = _Timed(session.attention, torch)
                    session.attention = timed
                    for i, t in enumerate(steps):
                        timed.ms = 0.0
                        run([t], a.context + len(steps) + i)
                        attend.append(timed.ms)
                    session.attention = timed.inner
            except Exception as e:  # noqa: BLE001 - reported, the other backends still run
                emit(backend=backend, context=a.context, error=str(e))
                if backend != "torch":
                    longctx.uninject(model)
                continue
        fields = {}
        if backend != "torch":
            session = model.model.layers[0].self_attn.session
            fields["path"] = "cuda" if session.cuda_device is not None else "cpu"
            longctx.uninject(model)
        if attend:
            fields["attend_ms_median"] = round(statistics.median(attend), 3)
        emit(backend=backend, context=a.context, layers=a.layers, prefill_s=round(prefill, 4),
             decode_ms_median=round(statistics.median(times), 3), decode_ms_min=round(min(times), 3), **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
