"""longctx.inject on a small Llama-style PyTorch model (tiny_llama.py).

With full attention (tests/configs/inject-dense.yaml: dense decode, f32 KV)
the injected model must give the original model's logits over a chunked
prefill (several chunks and a partial one), greedy decode steps, a second
prompt continuing the sequence and a new sequence; for GQA groups of 1 and 4,
with and without q/k/v bias, with the rotary embedding passed in or computed
by the attention module; and for modules whose `scaling` is not
head_dim ** -0.5, dense and with the select policy. uninject restores the same module objects; bad
rules raise ValueError naming the rule and the key; unsupported inputs raise
clear ValueErrors. The pass-key retrieval through an injected model is in
test_inject_demo.py.

Runs as a script (ctest: /usr/bin/python3 with PYTHONPATH=<build>/python and
LONGCTX_SOURCE_DIR set). Exit status 1 on the first failure. Needs torch
(Debian python3-torch): a missing torch is a failure, not a skip.
"""
import os
import subprocess
import sys
import tempfile

import torch

import longctx
import longctx.torch
import _env
import tiny_llama
from _env import SOURCE_DIR, check

DENSE = os.path.join(SOURCE_DIR, "tests", "configs", "inject-dense.yaml")
RULES = os.path.join(SOURCE_DIR, "configs", "inject", "llama.yaml")
ATTN = {"class": "longctx.torch.SparseAttention", "kwargs": {"config": DENSE}}


def close(a, b, what, rel=1e-4):
    """|a - b| <= rel * max|b|: both sides compute in f32 (f32 KV storage) and
    differ only in summation order, ~1e-6 of the logits' scale."""
    err = float((a.float() - b.float()).abs().max())
    scale = max(1.0, float(b.float().abs().max()))
    check(err <= rel * scale, what, f"max error {err:.3g}, scale {scale:.3g}")


def raises(fn, exc, *needles):
    try:
        fn()
    except exc as e:
        msg = str(e)
        missing = [s for s in needles if s not in msg]
        check(not missing, f"{exc.__name__} mentions {missing}", msg)
        return msg
    check(False, f"expected {exc.__name__} mentioning {needles}")


def trace(model, prompt, cont, steps=4):
    """Logits of: the prompt (every position), `steps` greedy decode steps,
    then `cont` fed as a second prompt continuing the sequence, then one more
    step; the greedy tokens. Positions are explicit, the cache is the model's own."""
    cache = tiny_llama.KVCache()
    out, tokens = [], []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None], past_key_values=cache)[0]
        out.append(logits)
        pos = len(prompt)
        for _ in range(steps):
            token = int(torch.argmax(logits[-1]))
            tokens.append(token)
            logits = model(torch.tensor([[token]]), position_ids=torch.tensor([[pos]]), past_key_values=cache)[0]
            out.append(logits)
            pos += 1
        logits = model(torch.tensor([cont]), position_ids=torch.arange(pos, pos + len(cont))[None],
                       past_key_values=cache)[0]
        out.append(logits)
        pos += len(cont)
        token = int(torch.argmax(logits[-1]))
        out.append(model(torch.tensor([[token]]), position_ids=torch.tensor([[pos]]), past_key_values=cache)[0])
    return out, tokens


def test_same_logits():
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 97, (50,), generator=g).tolist()  # 16 + 16 + 16 + 2 with chunk_size 16
    cont = torch.randint(0, 97, (21,), generator=g).tolist()    # a second prompt: 16 + 5
    cases = [dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=64),
             dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=128, attention_bias=True),
             dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=64, attention_bias=True,
                  rope_in_attention=True),
             dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=128, rope_in_attention=True)]
    for i, kwargs in enumerate(cases):
        what = f"case {i} {kwargs}"
        model = tiny_llama.random_model(seed=i, **kwargs)
        expect, expect_tokens = trace(model, prompt, cont)
        names = longctx.inject(model, [{"match": {"class": "LlamaAttention"}, "replace": ATTN}])
        check(names == ["model.layers.0.self_attn", "model.layers.1.self_attn"], f"{what}: names {names}")
        for run in range(2):  # the second run starts a new sequence at position 0
            got, tokens = trace(model, prompt, cont)
            check(tokens == expect_tokens, f"{what} run {run}: greedy tokens", f"{tokens} != {expect_tokens}")
            for step, (a, b) in enumerate(zip(got, expect)):
                close(a, b, f"{what} run {run}: logits of step {step}")
        attn = model.model.layers[1].self_attn
        check(attn.session.store.n_tokens(1) == len(prompt) + 4 + len(cont) + 1, f"{what}: tokens in the store")
        check(attn.session.store.kv_type == "f32", f"{what}: f32 KV store")
        longctx.uninject(model)


def test_q8_0_kv_cache():
    """kv_type: q8_0 behind the injected modules: the store holds int8 codes
    (one f16 scale per 32 channels, head_dim 32 here) and the logits stay
    within the codes' rounding (max|x| / 254 per value; 3.3e-2 of the logits'
    scale measured on this random model, checked at 1e-1: a wrong scale or
    layout moves them by their whole scale)."""
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, 97, (40,), generator=g).tolist()
    cont = torch.randint(0, 97, (7,), generator=g).tolist()
    model = tiny_llama.random_model(seed=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=128)
    expect, _ = trace(model, prompt, cont)
    q8 = longctx.Config.load(DENSE, ["kv_type=q8_0"])
    longctx.inject(model, [{"match": {"class": "LlamaAttention"},
                            "replace": {"class": "longctx.torch.SparseAttention", "kwargs": {"config": q8}}}])
    got, _ = trace(model, prompt, cont)
    for step, (a, b) in enumerate(zip(got, expect)):
        close(a, b, f"q8_0 KV: logits of step {step}", rel=1e-1)
    attn = model.model.layers[0].self_attn
    check(attn.session.store.kv_type == "q8_0", "q8_0 KV: the store's type", attn.session.store.kv_type)
    longctx.uninject(model)


def test_select_full_budget_and_rules_file():
    """The select policy with every block selected, and the shipped rules file
    (configs/default.yaml: f16 KV, layers < 2 dense) with and without a config."""
    model = tiny_llama.random_model(seed=7, num_attention_heads=8, num_key_value_heads=2, hidden_size=128)
    prompt = torch.randint(0, 97, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    cont = [3, 4, 5]
    expect, _ = trace(model, prompt, cont)
    full = longctx.Config.load(DENSE, ["policy=select", "dense_layer_num=0", "second_select_num=64",
                                       "local_windows_len=16", "representative_type=QUEST"])
    longctx.inject(model, RULES, config=full)
    got, _ = trace(model, prompt, cont)
    for step, (a, b) in enumerate(zip(got, expect)):
        close(a, b, f"select, every block selected: logits of step {step}")
    stats = model.model.layers[0].self_attn.session.attention.last_stats()
    check(stats["reselected"], "select policy: the last step selected blocks", str(stats))
    longctx.uninject(model)

    names = longctx.inject(model, RULES)
    attn = model.model.layers[0].self_attn
    check(len(names) == 2 and attn.longctx_config == longctx.Config.load(os.path.join(SOURCE_DIR, "configs",
                                                                                      "default.yaml")),
          "rules file: its config path is relative to the rules file")
    got, _ = trace(model, prompt, cont)
    # f16 K/V: relative rounding 2^-11 per element moves the scores by ~1e-3 of
    # their size. Where prefill_kernel auto takes the bf16 kernel, q, k, v and
    # the probabilities are rounded to 2^-8: eight times that (1.9e-2 measured).
    bf16 = longctx.auto_prefill_kernel() != "f32"
    for step, (a, b) in enumerate(zip(got, expect)):
        close(a, b, f"default.yaml (f16 KV, {'bf16' if bf16 else 'f32'} prefill): logits of step {step}",
              rel=5e-2 if bf16 else 1e-2)
    check(attn.session.store.kv_type == "f16", "default.yaml: f16 store")
    longctx.uninject(model)

    # A config file where rules are expected: the default rules with that config.
    names = longctx.inject(model, DENSE)
    check(names == ["model.layers.0.self_attn", "model.layers.1.self_attn"], "config path: default rules")
    got, _ = trace(model, prompt, cont)
    close(got[0], expect[0], "config path: prefill logits")
    longctx.uninject(model)


def test_module_scaling():
    """Modules whose scaling is Granite-style attention_multiplier, not
    head_dim ** -0.5: the prefill, every decode step and the second prompt
    score with it, with dense decode and with the select policy (every block
    selected); modules of one model with different scalings are refused."""
    prompt = torch.randint(0, 97, (150,), generator=torch.Generator().manual_seed(9)).tolist()
    cont = [3, 4, 5]
    shape = dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=128)  # head_dim 16: default 0.25
    model = tiny_llama.random_model(seed=11, attention_multiplier=0.6, **shape)
    expect, expect_tokens = trace(model, prompt, cont)
    # The scale matters: the same weights at the default scale give other logits.
    default, _ = trace(tiny_llama.random_model(seed=11, **shape), prompt, cont)
    check(float((default[1] - expect[1]).abs().max()) > 0.1 * float(expect[1].abs().max()),
          "scaling 0.6 changes the decode logits")
    select = longctx.Config.load(DENSE, ["policy=select", "dense_layer_num=0", "second_select_num=64",
                                         "local_windows_len=16", "representative_type=QUEST"])
    for name, config in (("dense", DENSE), ("select", select)):
        longctx.inject(model, [{"match": {"class": "LlamaAttention"},
                                "replace": {"class": "longctx.torch.SparseAttention", "kwargs": {"config": config}}}])
        got, tokens = trace(model, prompt, cont)
        scale = model.model.layers[0].self_attn.session.attention.scale  # f32
        check(abs(scale - 0.6) < 1e-7, f"{name}: the policy's scale is {scale}")
        check(tokens == expect_tokens, f"{name}, scaling 0.6: greedy tokens", f"{tokens} != {expect_tokens}")
        for step, (a, b) in enumerate(zip(got, expect)):
            close(a, b, f"{name}, scaling 0.6: logits of step {step}")
        longctx.uninject(model)

    model.model.layers[1].self_attn.scaling = 0.5
    raises(lambda: longctx.inject(model, [{"match": {"class": "LlamaAttention"}, "replace": ATTN}]), ValueError,
           "module 1 has scaling 0.5", "0.6")
    check(isinstance(model.model.layers[0].self_attn, tiny_llama.LlamaAttention), "a refused inject changes nothing")


def test_uninject():
    model = tiny_llama.random_model(seed=3, num_attention_heads=8, num_key_value_heads=2, hidden_size=128)
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids)
    originals = {name: m for name, m in model.named_modules()}
    keys = list(model.state_dict().keys())
    longctx.inject(model, [{"match": {"name": r"self_attn$"}, "replace": ATTN}])
    attn = model.model.layers[0].self_attn
    check(isinstance(attn, longctx.torch.SparseAttention), "injected: SparseAttention")
    check(attn.q_proj is originals["model.layers.0.self_attn.q_proj"], "injected: the same q_proj object")
    check(list(model.state_dict().keys()) == keys, "injected: state_dict keys unchanged")
    check(attn.layer_idx == 0 and model.model.layers[1].self_attn.layer_idx == 1, "layer indices in walk order")
    check(model.model.layers[0].self_attn.session is model.model.layers[1].self_attn.session, "one session")
    raises(lambda: longctx.inject(model, [{"match": {"name": "x"}, "replace": ATTN}]), ValueError,
           "already injected")
    with torch.no_grad():
        injected = model(ids)
    close(injected, before, "injected logits")
    restored = longctx.uninject(model)
    check(restored == ["model.layers.0.self_attn", "model.layers.1.self_attn"], f"restored names {restored}")
    check(all(m is originals[name] for name, m in model.named_modules()) and
          len(list(model.named_modules())) == len(originals), "uninject: the same module objects")
    with torch.no_grad():
        check(torch.equal(model(ids), before), "uninject: the same logits, exactly")
    check(longctx.uninject(model) == [], "uninject twice: nothing to do")
    check(attn.session.store is None, "uninject frees the store")


def test_rules_errors():
    model = tiny_llama.random_model(seed=1)
    state = [m for m in model.modules()]

    def bad(rules, *needles):
        raises(lambda: longctx.inject(model, rules), ValueError, *needles)
        check([m for m in model.modules()] == state, f"model unchanged after {needles}")

    ok = {"match": {"name": "self_attn$"}, "replace": ATTN}
    bad([ok, {"match": {"name": "(unclosed"}, "replace": ATTN}], "rule 1", "match.name", "(unclosed")
    bad([{"match": {"name": "x"}}], "rule 0", "missing key 'replace'")
    bad([{"match": {"name": "x"}, "replace": {"kwargs": {}}}], "rule 0", "replace.class")
    bad([ok, ok, {"match": {"class": "X"}, "replace": {"class": "longctx.torch.NoSuchAttention"}}],
        "rule 2", "replace.class", "longctx.torch.NoSuchAttention")
    bad([{"match": {"class": "X"}, "replace": {"class": "no_such_module_xyz.Attention"}}], "rule 0",
        "no_such_module_xyz")
    bad([{"match": {"class": "X"}, "replace": {"class": "SparseAttention"}}], "rule 0", "dotted path")
    bad([{"match": {"name": "x"}, "replace": ATTN, "replce": {}}], "rule 0", "unknown key 'replce'")
    bad([{"match": {"nmae": "x"}, "replace": ATTN}], "rule 0", "unknown key 'match.nmae'")
    bad([{"match": {"name": "x"}, "replace": dict(ATTN, kwarg={})}], "rule 0", "unknown key 'replace.kwarg'")
    bad([{"match": {}, "replace": ATTN}], "rule 0", "key 'match'")
    bad([{"match": {"name": 3}, "replace": ATTN}], "rule 0", "match.name")
    bad([], "non-empty list")
    bad([{"match": {"name": "x"}, "replace": {"class": ATTN["class"], "kwargs": {"config": "no-such.yaml"}}}],
        "rule 0", "replace.kwargs.config", "no-such.yaml")
    bad([{"match": {"name": "^nothing$"}, "replace": ATTN}], "no module of the model matched")
    # The near miss is named: the name matches, the class does not (and the other way round).
    bad([{"match": {"name": r"^model\.layers\.\d+\.self_attn$", "class": "MistralAttention"}, "replace": ATTN}],
        "no module of the model matched", "rule 0", "'model.layers.0.self_attn' matches match.name",
        "is not 'MistralAttention'")
    bad([{"match": {"name": "^attn$", "class": "LlamaMLP"}, "replace": ATTN}],
        "rule 0", "'model.layers.0.mlp' (LlamaMLP) matches match.class but not match.name '^attn$'")
    raises(lambda: longctx.inject(model, [ok], config="no-such-config.yaml"), ValueError, "no-such-config.yaml")
    # A rule that matches a module SparseAttention cannot wrap (an MLP), after one that worked.
    bad([ok, {"match": {"class": "LlamaMLP"}, "replace": ATTN}], "rule 1", "model.layers.0.mlp", "q_proj")
    bad([{"match": {"name": "self_attn$"}, "replace": dict(ATTN, kwargs={"config": DENSE, "bogus": 1})}],
        "rule 0", "bogus")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rules.yaml")
        with open(path, "w") as f:
            f.write("- match: {name: 'self_attn$'}\n  replace: {class: longctx.torch.SparseAttention}\n"
                    "- match: {name: '[z-a]'}\n  replace: {class: longctx.torch.SparseAttention}\n")
        bad(path, path, "rule 1", "match.name", "[z-a]")
        with open(path, "w") as f:
            f.write("- match: {name: 'self_attn$'\n")
        bad(path, path, "not valid YAML")
        # A config next to the rules file, named relatively.
        with open(os.path.join(tmp, "small.yaml"), "w") as f:
            f.write(open(DENSE).read().replace("chunk_size: 16", "chunk_size: 8"))
        with open(path, "w") as f:
            f.write("- match: {class: LlamaAttention}\n"
                    "  replace: {class: longctx.torch.SparseAttention, kwargs: {config: small.yaml}}\n")
        longctx.inject(model, path)
        check(model.model.layers[0].self_attn.chunk_size == 8, "config relative to the rules file")
        longctx.uninject(model)


def test_forward_errors():
    model = tiny_llama.random_model(seed=2)
    longctx.inject(model, [{"match": {"class": "LlamaAttention"}, "replace": ATTN}])
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 6, 64)
    pe = model.model.rotary_emb(x, torch.arange(6)[None])
    raises(lambda: attn(torch.randn(2, 6, 64), position_embeddings=pe), ValueError, "batch size 2", "layer 0")
    padding = torch.ones(1, 6)
    padding[0, 0] = 0
    raises(lambda: attn(x, position_embeddings=pe, attention_mask=padding), ValueError, "padding")
    causal = torch.full((1, 1, 6, 6), torch.finfo(torch.float32).min).triu(1)
    out, weights = attn(x, position_embeddings=pe, attention_mask=causal, position_ids=torch.arange(6)[None])
    check(out.shape == (1, 6, 64) and weights is None, "a causal 4-D mask is accepted")
    check(attn.session.store.n_tokens(0) == 6, "6 tokens appended")
    pe2 = model.model.rotary_emb(x, torch.arange(10, 16)[None])
    raises(lambda: attn(x, position_embeddings=pe2, position_ids=torch.arange(10, 16)[None]), ValueError,
           "position 10", "holds 6 tokens")
    raises(lambda: attn(x, position_embeddings=pe, position_ids=torch.tensor([[0, 1, 2, 4, 5, 6]])), ValueError,
           "consecutive")
    raises(lambda: attn(x), ValueError, "rotary_emb")
    check(attn.session.store.n_tokens(0) == 6, "nothing appended by rejected calls")
    longctx.uninject(model)
    # bf16 model: the output comes back in bf16, close to the f32 model (bf16 rounds to 2^-8).
    f32 = tiny_llama.random_model(seed=4)
    bf16 = tiny_llama.random_model(seed=4, dtype=torch.bfloat16)
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    longctx.inject(bf16, [{"match": {"class": "LlamaAttention"}, "replace": ATTN}])
    with torch.no_grad():
        got, expect = bf16(ids), f32(ids)
    check(got.dtype == torch.bfloat16, "bf16 in, bf16 out")
    close(got, expect, "bf16 model within bf16 rounding of the f32 model", rel=0.1)


def test_forward_stopped_part_way():
    """A forward that fails after some layers appended its tokens (here layer
    1's keys overflow what a q8_0 store holds) leaves the layers holding
    different counts: the next forward says so and how to go on (position
    0), rather than that one layer's count does not match, and position 0 works."""
    model = tiny_llama.random_model(seed=5, num_attention_heads=4, num_key_value_heads=2, hidden_size=128)
    q8 = longctx.Config.load(DENSE, ["kv_type=q8_0"])
    longctx.inject(model, [{"match": {"class": "LlamaAttention"},
                            "replace": {"class": "longctx.torch.SparseAttention", "kwargs": {"config": q8}}}])
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(5))
    k_proj = model.model.layers[1].self_attn.k_proj
    weight = k_proj.weight.data.clone()
    with torch.no_grad():
        model(ids)
        store = model.model.layers[0].self_attn.session.store  # made by the first forward
        k_proj.weight.data.mul_(1e9)
        raises(lambda: model(ids[:, :1], position_ids=torch.tensor([[10]])), longctx.Error, "layer 1")
        k_proj.weight.data.copy_(weight)
        check((store.n_tokens(0), store.n_tokens(1)) == (11, 10), "the failed forward appended to layer 0 only")
        for position in (10, 11):
            raises(lambda: model(ids[:, :1], position_ids=torch.tensor([[position]])), ValueError,
                   "layers hold 10 to 11 tokens", "position 0")
        check((store.n_tokens(0), store.n_tokens(1)) == (11, 10), "the refused forwards appended nothing")
        model(ids, position_ids=torch.arange(10)[None])
    check((store.n_tokens(0), store.n_tokens(1)) == (10, 10), "position 0 starts the sequence again")
    longctx.uninject(model)


def test_older_transformers_return_arity():
    """An attention module taking output_attentions (transformers < 4.48) returns three values; so must its
    replacement, with the caller's past_key_value passed through."""
    class OldLlamaAttention(tiny_llama.LlamaAttention):
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                    output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None,
                    **kwargs):
            out, weights = super().forward(hidden_states, position_embeddings, attention_mask, position_ids)
            return out, weights, past_key_value

    model = tiny_llama.random_model(seed=5)
    for layer in model.model.layers:
        old = OldLlamaAttention(layer.self_attn.config, layer.self_attn.layer_idx)
        old.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = old
    x = torch.randn(1, 5, 64)
    pe = model.model.rotary_emb(x, torch.arange(5)[None])
    cache = object()
    with torch.no_grad():
        expect = model.model.layers[0].self_attn(x, position_embeddings=pe, past_key_value=cache)
        longctx.inject(model, [{"match": {"class": "LlamaAttention"}, "replace": ATTN}])
        got = model.model.layers[0].self_attn(x, position_embeddings=pe, past_key_value=cache)
    check(len(got) == 3 and got[1] is None and got[2] is cache, "old-style module: (out, None, past_key_value)")
    close(got[0], expect[0], "old-style module: same output")
    longctx.uninject(model)


def test_import_without_torch():
    """`import longctx` (and inject) must not import torch; longctx.torch needs it."""
    code = ("import sys; sys.modules['torch'] = None; import longctx; longctx.inject; longctx.uninject\n"
            "try:\n    import longctx.torch\nexcept ImportError:\n    print('no torch')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    check(p.returncode == 0 and p.stdout.strip() == "no torch", "import longctx without torch", p.stdout + p.stderr)


def test_readme_shows_the_shipped_rules():
    """The README's rule snippet is configs/inject/llama.yaml without its comments."""
    with open(os.path.join(_env.SOURCE_DIR, "configs", "inject", "llama.yaml")) as f:
        shipped = [line for line in f.read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    with open(os.path.join(_env.SOURCE_DIR, "README.md")) as f:
        readme = f.read()
    start = readme.index("```yaml\n", readme.index("`longctx.inject(model, rules)`")) + len("```yaml\n")
    snippet = readme[start:readme.index("```", start)].splitlines()
    check(snippet == shipped, "README's inject rules = configs/inject/llama.yaml", f"{snippet}\n{shipped}")


def main():
    test_import_without_torch()
    for test in (test_same_logits, test_q8_0_kv_cache, test_select_full_budget_and_rules_file, test_module_scaling,
                 test_uninject,
                 test_rules_errors, test_forward_errors, test_forward_stopped_part_way,
                 test_older_transformers_return_arity, test_readme_shows_the_shipped_rules):
        test()
    print(f"test_inject: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
