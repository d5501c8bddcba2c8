"""The demo pass-key model (tools/DEMO_MODEL.md) loaded into the PyTorch
tiny_llama and injected with longctx.torch.SparseAttention.

On haystacks of a few thousand tokens (longctx-make-haystack), greedy
decoding must answer the pass key: the plain PyTorch model (reference, its
own KV cache), the injected model with QUEST block selection
(configs/demo.yaml: 16 blocks of 16 tokens per step), and longctx.Model on
the same GGUF, which must produce the same tokens as the injected model.
StreamingLLM (sinks + local window) must not find the key (the probe can
fail).

Runs as a script (ctest: /usr/bin/python3 with PYTHONPATH=<build>/python,
LONGCTX_SOURCE_DIR and LONGCTX_BIN_DIR set). Exit status 1 on the first
failure.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

import longctx
import longctx.torch
import _env
import tiny_llama
from _env import BIN_DIR, SOURCE_DIR, check

DEMO_CONFIG = os.path.join(SOURCE_DIR, "configs", "demo.yaml")
RULES = os.path.join(SOURCE_DIR, "configs", "inject", "llama.yaml")
# (document tokens, key depth, seed): the key early and late in the document.
# Five prefills of the C++ engine take ~25 s under ASan at this size.
CASES = [(2500, 0.15, 21), (2500, 0.85, 22)]


def haystack(tmp, tokens, depth, seed):
    doc, meta = os.path.join(tmp, f"doc-{seed}.txt"), os.path.join(tmp, f"doc-{seed}.json")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-haystack"), "--tokens", str(tokens), "--depth", str(depth),
                    "--seed", str(seed), "--out", doc, "--json", meta], check=True, capture_output=True)
    with open(doc, encoding="utf-8") as f, open(meta) as m:
        return f.read(), json.load(m)["key"]


def main():
    start = time.time()
    tmp = tempfile.mkdtemp(prefix="longctx-inject-demo-")
    demo = os.path.join(tmp, "demo.gguf")
    subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], check=True, capture_output=True)
    config = longctx.Config.load(DEMO_CONFIG, ["max_seq_len=8192"])
    streaming = config.with_overrides(["policy=streaming"])
    engine = longctx.Model(demo, config)
    torch_model = tiny_llama.load_gguf(demo)

    for tokens, depth, seed in CASES:
        what = f"{tokens} tokens, depth {depth}"
        text, key = haystack(tmp, tokens, depth, seed)
        ids = engine.tokenize(text)
        expect = engine.tokenize(key, add_bos=False) + [engine.eos]  # '▁', one token per digit, '</s>'
        check(len(expect) == len(key) + 2 and engine.token_text(expect[0]) == " ", "the answer's tokens")

        plain = torch_model.generate(ids, 10, eos=engine.eos, chunk=512)
        check(plain == expect, f"{what}: the PyTorch model answers {key}", f"{plain} != {expect}")

        longctx.inject(torch_model, RULES, config=config)
        injected = torch_model.generate(ids, 10, eos=engine.eos)
        check(injected == expect, f"{what}: the injected model (QUEST) answers {key}", f"{injected} != {expect}")
        session = torch_model.model.layers[1].self_attn.session
        attended = session.attention.last_stats()["attended_tokens"]
        cached = session.store.n_tokens(1) * session.store.shape[1]
        check(attended <= 0.15 * cached, f"{what}: QUEST attends a small part of the cache",
              f"{attended} of {cached}")
        longctx.uninject(torch_model)

        answer = []
        engine.reset()
        text_out = engine.generate(ids, max_tokens=10, on_token=lambda i, t: answer.append(i))
        # on_token sees every token but the end of generation.
        check(answer + [engine.eos] == injected and engine.stats["stop_reason"] == "end of generation",
              f"{what}: longctx.Model.generate gives the injected model's tokens",
              f"{answer} + eos != {injected} ({text_out!r}, {engine.stats['stop_reason']})")
        check(text_out.strip() == key, f"{what}: longctx.Model answers {key}", repr(text_out))

    # QUOKA's restricted prefill (chunks of 512 tokens, each attending 256
    # chosen cached keys besides sinks and the previous chunk): the injected
    # modules run longctx-chat's own step (LayerAttention), so the logits after
    # the prompt are longctx.Model's, and not the dense prefill's.
    quoka = config.with_overrides(["chunk_size=512", "quoka.enabled=true", "quoka.b_sa=256"])
    text, key = haystack(tmp, 2500, 0.5, 24)
    ids = engine.tokenize(text)
    cpp_quoka = np.asarray(longctx.Model(demo, quoka).prefill(ids), dtype=np.float64)
    cpp_dense = np.asarray(longctx.Model(demo, config.with_overrides(["chunk_size=512"])).prefill(ids),
                           dtype=np.float64)
    longctx.inject(torch_model, RULES, config=quoka)
    seen = []
    torch_model.generate(ids, 1, on_logits=lambda l: seen.append(l.double().numpy()))
    longctx.uninject(torch_model)
    off_model, off_dense = np.abs(seen[0] - cpp_quoka).max(), np.abs(cpp_quoka - cpp_dense).max()
    check(off_model <= 0.02 * off_dense, "QUOKA: the injected model's logits are longctx.Model's",
          f"max difference {off_model:.3g}; QUOKA vs dense prefill {off_dense:.3g}")

    # StreamingLLM keeps the sinks and the last 64 tokens: the key is out of sight.
    text, key = haystack(tmp, 1500, 0.5, 23)
    ids = engine.tokenize(text)
    longctx.inject(torch_model, RULES, config=streaming)
    lost = torch_model.generate(ids, 10, eos=engine.eos)
    check(lost[1:] == [engine.eos], "streaming: the injected model does not find the key",
          f"{lost} {engine.detokenize(lost)!r}")
    longctx.uninject(torch_model)

    shutil.rmtree(tmp)
    print(f"test_inject_demo: {_env.passed} checks passed in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
