"""longctx.inject with the model on a CUDA device: the CUDA path of
longctx.torch (the prefill chunks and the decode window attended on the GPU
straight from the module's tensors, the rest of a decode step on the CPU,
merged on the GPU; scheduler/device_layer_attention.h) against the same
injected model with `model.backend: cpu` (the same C++ step on the CPU).

The select policy (QUEST, 3 blocks of 16) and a module scaling of 0.25 (not
head_dim ** -0.5 = 0.125), head_dim 64 and 128, GQA 2 and 1; a 300-token prompt,
decode steps, a second prompt continuing the sequence, then a new sequence;
the CUDA run on a torch stream of its own, so the hand-off with torch's
current stream is what orders it. Both paths keep f16 K/V; the device
rounds q and P to f16 where the CPU keeps f32 (~1e-3 of the attention
output, exactly bounded in tests/gpu/foreign_memory_test.cpp), which this
random model's sharp attention amplifies (a scaling of 0.6 gave 1.2e-2 of
the logits' scale on an H200), so logits are compared at 2e-2 of their scale
and the greedy tokens wherever the reference's top two differ by more than
that; a wrong scale, a lost token or a window attended twice moves them by
more than 0.1. A config the
device path does not run (kv_type q8_0) takes the CPU path under
model.backend auto, saying why, and is refused under cuda.

Exit 77 (ctest: skipped) when torch has no CUDA device or longctx was built
without CUDA.
"""
import sys

import torch

import longctx
import longctx.torch
import _env
import tiny_llama
from _env import check

BASE = {"chunk_size": 16, "max_seq_len": 4096, "block_size": 16, "local_windows_len": 32, "initial_len": 4,
        "kv_type": "f16", "prefill_kernel": "f32", "policy": "select", "dense_layer_num": 0,
        "second_select_num": 3, "representative_type": "QUEST", "dram_budget": "256MiB"}


def make_config(backend, **keys):
    d = dict(BASE, **keys)
    d["model"] = {"backend": backend}
    return longctx.Config.from_dict(d)


def inject(model, cfg):
    longctx.inject(model, [{"match": {"class": "LlamaAttention"},
                            "replace": {"class": "longctx.torch.SparseAttention", "kwargs": {"config": cfg}}}])


def trace(model, prompt, steps, cont, device):
    """Logits of the prompt, of `steps` decode steps fed the given tokens, of
    a second prompt `cont` and of one more step: teacher-forced, so that both
    paths see the same tokens whatever they predict."""
    out = []
    cache = tiny_llama.KVCache()
    with torch.no_grad():
        def run(tokens, pos):
            ids = torch.tensor([tokens], device=device)
            positions = torch.arange(pos, pos + len(tokens), device=device)[None]
            return model(ids, position_ids=positions, past_key_values=cache)[0].float().cpu()
        out.append(run(prompt, 0))
        pos = len(prompt)
        for t in steps:
            out.append(run([t], pos))
            pos += 1
        out.append(run(cont, pos))
        pos += len(cont)
        out.append(run([steps[0]], pos))
    return out


def compare(got, want, what):
    """Returns the largest error relative to the logits' scale."""
    worst = 0.0
    for step, (a, b) in enumerate(zip(got, want)):
        scale = max(1.0, float(b.abs().max()))
        err = float((a - b).abs().max())
        worst = max(worst, err / scale)
        check(err <= 2e-2 * scale, f"{what}: logits of step {step}", f"max error {err:.3g}, scale {scale:.3g}")
        top2 = b[-1].topk(2).values
        if float(top2[0] - top2[1]) > 4e-2 * scale:
            check(int(a[-1].argmax()) == int(b[-1].argmax()), f"{what}: greedy token of step {step}")
    return worst


def main():
    if not torch.cuda.is_available():
        print("test_inject_cuda: SKIP: torch sees no CUDA device")
        sys.exit(77)
    probe = longctx.LayerAttention(None, longctx.KVStore(longctx.Config(), 1, 1, 64))
    why = probe.cuda_declined()
    if why:
        print(f"test_inject_cuda: SKIP: {why}")
        sys.exit(77)
    device = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(17)
    prompt = torch.randint(0, 97, (300,), generator=g).tolist()
    steps = torch.randint(0, 97, (8,), generator=g).tolist()
    cont = torch.randint(0, 97, (21,), generator=g).tolist()
    cases = [dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=256, attention_multiplier=0.25),
             dict(num_attention_heads=2, num_key_value_heads=2, hidden_size=256, rope_in_attention=True)]
    for i, shape in enumerate(cases):
        what = f"case {i} {shape}"
        model = tiny_llama.random_model(seed=20 + i, **shape).to(device)
        inject(model, make_config("cpu"))
        want = [trace(model, prompt, steps, cont, device) for _ in range(2)]  # the second run: a new sequence
        attn = model.model.layers[0].self_attn
        check(attn.session.cuda_device is None, f"{what}: model.backend cpu keeps the CPU path")
        longctx.uninject(model)

        inject(model, make_config("cuda"))
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):  # not the default stream: the hand-off must order the work
            got = [trace(model, prompt, steps, cont, device) for _ in range(2)]
        attn = model.model.layers[1].self_attn
        check(attn.session.cuda_device == device, f"{what}: the CUDA path ran", str(attn.session.cuda_device))
        check(attn.session.attention.cuda_device == 0, f"{what}: the layer step is on cuda:0")
        check(abs(attn.session.attention.scale - attn.scaling) < 1e-7, f"{what}: the module's scale")
        check(attn.session.store.n_tokens(1) == len(prompt) + len(steps) + len(cont) + 1, f"{what}: store tokens")
        stats = attn.session.attention.last_stats()
        check(0 < stats["attended_tokens"], f"{what}: the CPU part attended the selection", str(stats))
        worst = max(compare(got[run], want[run], f"{what} run {run}") for run in range(2))
        print(f"{what}: largest logit difference CUDA path vs CPU path: {worst:.2e} of the logits' scale")
        longctx.uninject(model)

    # A config the device path does not run.
    model = tiny_llama.random_model(seed=30, num_attention_heads=4, num_key_value_heads=2, hidden_size=256).to(device)
    inject(model, make_config("auto", kv_type="q8_0"))
    trace(model, prompt[:40], steps[:2], cont[:3], device)
    session = model.model.layers[0].self_attn.session
    check(session.cuda_device is None and "kv_type q8_0" in session.cuda_declined,
          "q8_0 KV under backend auto: the CPU path, saying why", session.cuda_declined)
    longctx.uninject(model)
    inject(model, make_config("cuda", kv_type="q8_0"))
    try:
        trace(model, prompt[:40], steps[:2], cont[:3], device)
        check(False, "q8_0 KV under backend cuda is refused")
    except ValueError as e:
        check("cannot run there" in str(e) and "kv_type q8_0" in str(e), "the refusal says why", str(e))
    longctx.uninject(model)
    print(f"test_inject_cuda: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
