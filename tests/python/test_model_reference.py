"""The NumPy reference forward pass (tools/reference/llama_ref.py) checked on
its own, the test-model generator (longctx-make-model) checked through it,
and longctx's logits (longctx-perplexity --dump-logits) compared with it,
prefilled and, for a model with an attention scale (--attn-scale), decoded.

Runs as a script (ctest: /usr/bin/python3 with LONGCTX_BIN_DIR and
LONGCTX_SOURCE_DIR set). Exit status 1 on the first failure.
"""
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

import _env
from _env import BIN_DIR, SOURCE_DIR, check

sys.path.insert(0, os.path.join(SOURCE_DIR, "tools", "reference"))
import llama_ref as ref  # noqa: E402

PRESETS = ["mha-64", "gqa-128", "qwen2-bias", "qwen2-yarn", "q8", "f16", "llama3-rope", "q4_0", "q6_k", "q4_k_m",
           "q5_k_m", "q3_k_m", "q2_k"]
U32 = 2.0 ** -24  # f32 unit roundoff
U16 = 2.0 ** -11  # f16 unit roundoff


# ------------------------------------------------- the reference on its own --

def test_rope():
    rng = np.random.default_rng(1)
    d = 16
    inv = ref.rope_inv_freq(d, 10000.0)
    check(np.allclose(inv, [10000.0 ** (-2 * i / d) for i in range(d // 2)], rtol=1e-15), "theta_i = base^(-2i/d)")
    q, k = rng.normal(size=(1, 1, d)), rng.normal(size=(1, 1, d))
    for style in ("adjacent", "halves"):
        def rot(x, pos):
            return ref.apply_rope(x, np.array([pos]), inv, style)
        # A rotation keeps the norm, and q(m).k(n) depends only on m - n.
        check(abs(np.linalg.norm(rot(q, 37)) - np.linalg.norm(q)) < 1e-12, f"rope {style} keeps norms")
        dots = [np.sum(rot(q, m) * rot(k, m - 5)) for m in (5, 9, 100, 1000)]
        check(np.ptp(dots) < 1e-10, f"rope {style}: q(m).k(m-5) independent of m: {dots}")
        check(abs(np.sum(rot(q, 0) * k) - np.sum(q * k)) < 1e-12, f"rope {style}: position 0 is identity")
        check(abs(np.sum(rot(q, 9) * rot(k, 0)) - np.sum(q * k)) > 1e-3, f"rope {style}: position 9 rotates")
    # Adjacent pairs as complex numbers: (x_2i + i x_2i+1) * exp(i m theta_i).
    m = 11
    z = (q[0, 0, 0::2] + 1j * q[0, 0, 1::2]) * np.exp(1j * m * inv)
    expect = np.stack([z.real, z.imag], axis=-1).reshape(d)
    check(np.allclose(ref.apply_rope(q, np.array([m]), inv, "adjacent")[0, 0], expect, atol=1e-12),
          "adjacent rope = complex rotation of (x_2i, x_2i+1)")
    # Halves = adjacent after interleaving (x_i, x_i+d/2) -> (2i, 2i+1).
    perm = np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=-1).reshape(d)
    halves = ref.apply_rope(q, np.array([m]), inv, "halves")[0, 0]
    adjacent = ref.apply_rope(q[..., perm], np.array([m]), inv, "adjacent")[0, 0]
    check(np.allclose(halves[perm], adjacent, atol=1e-12), "halves rope = adjacent rope on interleaved dims")
    # Frequency factors divide theta_i.
    factors = np.linspace(1, 8, d // 2)
    check(np.allclose(ref.rope_inv_freq(d, 500000.0, factors) * factors, ref.rope_inv_freq(d, 500000.0), rtol=1e-15),
          "freq factors divide theta_i")
    # YaRN as Qwen2.5 at 128K (d 128, theta 1e6, x4 from 32768): a pair that
    # turns more than 32 times over 32768 tokens keeps its frequency, one
    # turning less than once is divided by 4.
    plain = ref.rope_inv_freq(128, 1e6)
    ratio = plain / ref.rope_inv_freq(128, 1e6, scaling=("yarn", 4.0, 32768))
    turns = 32768 * plain / (2 * math.pi)
    check(np.allclose(ratio[turns > 32 * 1.2], 1.0, rtol=1e-15), "yarn keeps the fast pairs")
    check(np.allclose(ratio[turns < 1 / 1.2], 4.0, rtol=1e-15), "yarn divides the slow pairs by the factor")
    check(np.all((ratio >= 1.0) & (ratio <= 4.0)) and np.sum((ratio > 1.001) & (ratio < 3.999)) >= 10,
          f"yarn blends the pairs between: {ratio}")
    check(abs(ref.rope_magnitude(("yarn", 4.0, 32768), 0.5) - 0.5 * (1 + 0.1 * math.log(4))) < 1e-15,
          "yarn's magnitude 0.1 ln s + 1, times attn_factor")
    check(ref.rope_magnitude(("linear", 4.0), 0.5) == 0.5 and ref.rope_magnitude(None) == 1.0,
          "attn_factor alone for other scalings")


def test_attention_scalar():
    """causal_attention against scalar loops over (query, head, key), at the
    default scale 1/sqrt(d) and at a given one."""
    rng = np.random.default_rng(2)
    n, n_heads, n_kv, d = 6, 6, 2, 5
    q, k, v = rng.normal(size=(n, n_heads, d)), rng.normal(size=(n, n_kv, d)), rng.normal(size=(n, n_kv, d))
    for scale in (None, 0.7):
        got = ref.causal_attention(q, k, v, scale)
        for i in range(n):
            for h in range(n_heads):
                g = h // (n_heads // n_kv)
                s = [sum(q[i, h, c] * k[j, g, c] for c in range(d)) * (scale or 1 / math.sqrt(d))
                     for j in range(i + 1)]
                e = [math.exp(x - max(s)) for x in s]
                o = [sum(e[j] * v[j, g, c] for j in range(i + 1)) / sum(e) for c in range(d)]
                check(np.allclose(got[i, h], o, atol=1e-12), f"attention scale {scale} query {i} head {h}")


def random_model(rng, arch="llama", n_heads=4, n_kv=2, d=8, n_embd=12, n_ff=20, n_vocab=30, bias=False):
    meta = {"general.architecture": arch, f"{arch}.block_count": 2, f"{arch}.embedding_length": n_embd,
            f"{arch}.attention.head_count": n_heads, f"{arch}.attention.head_count_kv": n_kv,
            f"{arch}.attention.key_length": d, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
            f"{arch}.rope.freq_base": 10000.0}
    w = {"token_embd.weight": rng.normal(size=(n_vocab, n_embd)),
         "output_norm.weight": 1 + 0.1 * rng.normal(size=n_embd),
         "output.weight": rng.normal(size=(n_vocab, n_embd)) / math.sqrt(n_embd)}
    for i in range(2):
        p = f"blk.{i}."
        for name, shape in (("attn_q", (n_heads * d, n_embd)), ("attn_k", (n_kv * d, n_embd)),
                            ("attn_v", (n_kv * d, n_embd)), ("attn_output", (n_embd, n_heads * d)),
                            ("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
            w[p + name + ".weight"] = rng.normal(size=shape) / math.sqrt(shape[1])
            if bias and name in ("attn_q", "attn_k", "attn_v"):
                w[p + name + ".bias"] = rng.normal(size=shape[0])
        w[p + "attn_norm.weight"] = 1 + 0.1 * rng.normal(size=n_embd)
        w[p + "ffn_norm.weight"] = 1 + 0.1 * rng.normal(size=n_embd)
    return ref.Model(meta, w)


def test_one_token_by_hand():
    """One token: softmax over one key is 1, so attention returns v of the
    query head's kv head; RoPE at position 0 is the identity."""
    rng = np.random.default_rng(3)
    model = random_model(rng, bias=True)
    w, d, group = model.w, model.head_dim, model.n_heads // model.n_kv_heads

    def norm(x, g):
        return x / math.sqrt(sum(t * t for t in x) / len(x) + 1e-5) * g
    x = w["token_embd.weight"][7].copy()
    for i in range(2):
        p = f"blk.{i}."
        h = norm(x, w[p + "attn_norm.weight"])
        v = w[p + "attn_v.weight"] @ h + w[p + "attn_v.bias"]
        attn = np.concatenate([v[(head // group) * d:(head // group + 1) * d] for head in range(model.n_heads)])
        x = x + w[p + "attn_output.weight"] @ attn
        h = norm(x, w[p + "ffn_norm.weight"])
        gate = w[p + "ffn_gate.weight"] @ h
        x = x + w[p + "ffn_down.weight"] @ (gate / (1 + np.exp(-gate)) * (w[p + "ffn_up.weight"] @ h))
    expect = w["output.weight"] @ norm(x, w["output_norm.weight"])
    check(np.allclose(ref.forward(model, [7])[0], expect, atol=1e-12), "one-token forward by hand")


def test_forward_properties():
    rng = np.random.default_rng(4)
    model = random_model(rng)
    tokens = list(rng.integers(0, 30, size=9))
    full = ref.forward(model, tokens)
    # Causal: a prefix gives the same logits as the first rows of the full run.
    check(np.allclose(ref.forward(model, tokens[:4]), full[:4], atol=1e-12), "prefix logits = first rows")
    changed = tokens[:5] + [(t + 1) % 30 for t in tokens[5:]]
    check(np.allclose(ref.forward(model, changed)[:5], full[:5], atol=1e-12),
          "later tokens do not change earlier logits")
    check(not np.allclose(ref.forward(model, changed)[5:], full[5:]), "changed tokens change their logits")
    # GQA: the same model with each kv head's K/V rows repeated for its query heads (MHA) is identical.
    mha_w = dict(model.w)
    d, group = model.head_dim, model.n_heads // model.n_kv_heads
    for i in range(2):
        for name in ("attn_k", "attn_v"):
            rows = model.w[f"blk.{i}.{name}.weight"].reshape(model.n_kv_heads, d, -1)
            mha_w[f"blk.{i}.{name}.weight"] = np.repeat(rows, group, axis=0).reshape(model.n_heads * d, -1)
    mha = ref.Model({**meta_of(model), "llama.attention.head_count_kv": model.n_heads}, mha_w)
    check(np.allclose(ref.forward(mha, tokens), full, atol=1e-10), "GQA = MHA with repeated K/V heads")


def meta_of(model):
    a = model.arch
    return {"general.architecture": a, f"{a}.block_count": model.n_layers,
            f"{a}.embedding_length": model.w["token_embd.weight"].shape[1], f"{a}.attention.head_count": model.n_heads,
            f"{a}.attention.head_count_kv": model.n_kv_heads, f"{a}.attention.key_length": model.head_dim,
            f"{a}.attention.layer_norm_rms_epsilon": model.eps, f"{a}.rope.freq_base": model.theta}


# ---------------------------------------------- the GGUF reader on its own --

def gguf_bytes(version, meta_items, tensors, alignment):
    """A GGUF file built with struct, per the spec: header, typed key/values,
    tensor infos (dims in GGUF order), aligned data section."""
    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta_items))
    for key, vtype, payload in meta_items:
        out += s(key) + struct.pack("<I", vtype) + payload
    offset, datas = 0, []
    for name, dims, ttype, raw in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims)
        out += struct.pack("<IQ", ttype, offset)
        datas.append((offset, raw))
        offset = (offset + len(raw) + alignment - 1) // alignment * alignment
    base = (len(out) + alignment - 1) // alignment * alignment
    body = bytearray(b"\xee" * (base - len(out) + offset))  # garbage in padding
    for off, raw in datas:
        body[base - len(out) + off: base - len(out) + off + len(raw)] = raw
    return out + bytes(body), len(out)


def test_gguf_reader():
    q8_scale = np.array([0.5, -0.25], dtype="<f2")
    q8_q = np.arange(-32, 32, dtype=np.int8)
    q8_raw = q8_scale[:1].tobytes() + q8_q[:32].tobytes() + q8_scale[1:].tobytes() + q8_q[32:].tobytes()
    # Q4_0 block: byte j = q_j | q_(j+16) << 4 with q_j = j, q_(j+16) = 15 - j; x = d (q - 8).
    q4_raw = np.array([2.0], dtype="<f2").tobytes() + bytes(j | (15 - j) << 4 for j in range(16))
    bf16 = np.array([1.5, -2.75], dtype="<f4").view("<u2")[1::2].tobytes()  # high halves, exact in bf16
    tensors = [("a", [3, 2], 0, np.arange(6, dtype="<f4").tobytes()),
               ("h", [4], 1, np.array([1, -2, 0.5, 65504], dtype="<f2").tobytes()),
               ("b", [2], 30, bf16), ("q", [32, 2], 8, q8_raw), ("q4", [32], 2, q4_raw)]
    for version in (2, 3):
        for pad in range(64):  # a header length where 32- and 64-alignment differ
            meta = [("general.alignment", 4, struct.pack("<I", 64)),
                    ("pad", 8, struct.pack("<Q", pad) + b"x" * pad),
                    ("u8", 0, struct.pack("<B", 200)), ("i16", 3, struct.pack("<h", -300)),
                    ("f32", 6, struct.pack("<f", 0.5)), ("b", 7, b"\x01"), ("u64", 10, struct.pack("<Q", 2 ** 40)),
                    ("f64", 12, struct.pack("<d", -1.25)),
                    ("arr", 9, struct.pack("<IQ", 8, 2) + struct.pack("<Q", 2) + b"hi" + struct.pack("<Q", 0))]
            data, header = gguf_bytes(version, meta, tensors, 64)
            if (header + 31) // 32 * 32 != (header + 63) // 64 * 64:
                break
        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(data)
            f.flush()
            meta, t = ref.read_gguf(f.name)
        check(meta["u8"] == 200 and meta["i16"] == -300 and meta["f32"] == 0.5 and meta["b"] is True
              and meta["u64"] == 2 ** 40 and meta["f64"] == -1.25 and meta["arr"] == ["hi", ""], f"v{version} metadata")
        check(t["a"].shape == (2, 3) and (t["a"] == np.arange(6).reshape(2, 3)).all(), "f32 [3,2] is 2 rows of 3")
        check(list(t["h"]) == [1, -2, 0.5, 65504], "f16 values")
        check(list(t["b"]) == [1.5, -2.75], "bf16 values")
        check(t["q"].shape == (2, 32) and (t["q"][0] == 0.5 * np.arange(-32, 0)).all()
              and (t["q"][1] == -0.25 * np.arange(0, 32)).all(), "q8_0 = d * q per block of 32")
        check(list(t["q4"]) == [2.0 * (j - 8) for j in range(16)] + [2.0 * (7 - j) for j in range(16)], "q4_0 nibbles")


# ----------------------------------------- generated models and longctx --

def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    check(res.returncode == 0, f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def tolerance(model, n_tokens, kv_f16=False):
    """Bound on max |logit_longctx - logit_ref| / rms(logits_ref) per position.

    longctx computes in f32, the reference in fp64 on the same stored weights
    (dequantized alike: every block type's value is exact in fp64 and
    rounded once to f32 by longctx, test_ggml_reference.py; that relative
    2^-24 per weight is below the arithmetic's rounding), so the difference
    is longctx's rounding. A dot product of K terms summed
    in f32 (any order) has a rounding error of about u32 * sqrt(K) relative
    to its result for random-signed terms (the probabilistic bound of Higham
    and Mary 2019). The errors of S sequential dot-product stages add (worst
    case, linear in S): per layer Q/K/V, scores, P.V, output projection,
    gate/up, down = 6, plus the output matrix. Elementwise ops (norm, RoPE,
    exp, SiLU) add O(u32) each, negligible next to sqrt(K) u32. C = 8: a
    factor 4 for the tail of the random-walk error (4 standard deviations)
    and 2 for the gain from an intermediate perturbation to the logits of
    these unit-scale random networks (RMSNorm renormalizes, residuals add).
    A KV store in f16 rounds K and V (relative u16 each) once per layer."""
    K = max(model.w["token_embd.weight"].shape[1], model.n_heads * model.head_dim,
            model.w["blk.0.ffn_down.weight"].shape[1], n_tokens)
    S = 6 * model.n_layers + 1
    tol = 8 * U32 * math.sqrt(K) * S
    if kv_f16:
        tol += 8 * U16 * model.n_layers
    return tol


def max_rel_err(got, expect):
    rms = np.sqrt(np.mean(expect * expect, axis=-1))
    return float(np.max(np.max(np.abs(got - expect), axis=-1) / rms))


def test_generated(tmp):
    maker = os.path.join(BIN_DIR, "longctx-make-model")
    check(os.path.exists(maker), f"longctx-make-model not built ({maker})")
    paths = {}
    for preset in PRESETS:
        path = os.path.join(tmp, preset + ".gguf")
        run([maker, "--preset", preset, "--seed", "7", "--out", path])
        paths[preset] = path
        meta, w = ref.read_gguf(path)
        model = ref.Model(meta, w)
        a = model.arch
        n_embd, n_ff = meta[f"{a}.embedding_length"], meta[f"{a}.feed_forward_length"]
        check(w["token_embd.weight"].shape == (meta[f"{a}.vocab_size"], n_embd), f"{preset}: token_embd shape")
        check(w["blk.1.attn_k.weight"].shape == (model.n_kv_heads * model.head_dim, n_embd), f"{preset}: attn_k shape")
        check(w["blk.0.ffn_down.weight"].shape == (n_embd, n_ff), f"{preset}: ffn_down shape")
        # Weight scale N(0, 1/fan_in) as documented (quantization adds < 9% RMS noise: std + 0.4%).
        std = np.std(w["blk.0.attn_q.weight"]) * math.sqrt(n_embd)
        check(abs(std - 1) < 0.05, f"{preset}: attn_q std * sqrt(n_embd) = {std}")
        toks = meta["tokenizer.ggml.tokens"]
        check(len(toks) == w["token_embd.weight"].shape[0] and len(set(toks)) == len(toks) and toks[:3] ==
              ["<unk>", "<s>", "</s>"] and toks[3] == "<0x00>" and toks[258] == "<0xFF>", f"{preset}: vocab")
        check("[INST]" in meta["tokenizer.chat_template"], f"{preset}: llama2 chat template")
    # --attn-scale writes {arch}.attention.scale (absent otherwise), which the reference reads.
    path = os.path.join(tmp, "gqa-128-scale.gguf")
    run([maker, "--preset", "gqa-128", "--seed", "7", "--attn-scale", "0.05", "--out", path])
    paths["gqa-128-scale"] = path
    check(ref.read_gguf(path)[0]["llama.attention.scale"] == np.float32(0.05), "--attn-scale: llama.attention.scale")
    check("llama.attention.scale" not in ref.read_gguf(paths["gqa-128"])[0], "no --attn-scale: no key")
    check(ref.Model.load(path).attn_scale == np.float32(0.05), "the reference reads llama.attention.scale")
    for bad in ("0", "-1", "nan", "inf", "x"):
        res = subprocess.run([maker, "--preset", "gqa-128", "--attn-scale", bad, "--out", path + ".bad"],
                             capture_output=True, text=True)
        check(res.returncode == 2 and "--attn-scale" in res.stderr and not os.path.exists(path + ".bad"),
              f"--attn-scale {bad} is refused", res.stderr)
    # --arch internlm2 writes the same tensors under InternLM2's name, which
    # the reference runs as Llama (compared with longctx below too).
    path = os.path.join(tmp, "mha-64-internlm2.gguf")
    run([maker, "--preset", "mha-64", "--seed", "7", "--arch", "internlm2", "--out", path])
    paths["mha-64-internlm2"] = path
    check(ref.read_gguf(path)[0]["general.architecture"] == "internlm2", "--arch: general.architecture")
    tokens = list(range(3, 40))
    as_llama = ref.forward(ref.Model.load(paths["mha-64"]), tokens)
    check(np.array_equal(ref.forward(ref.Model.load(path), tokens), as_llama), "internlm2 runs as llama in the reference")
    res = subprocess.run([maker, "--preset", "mha-64", "--arch", "gptneox", "--out", path + ".bad"],
                         capture_output=True, text=True)
    check(res.returncode == 2 and "arch must be" in res.stderr and not os.path.exists(path + ".bad"),
          "--arch gptneox is refused", res.stderr)
    # Each preset's distinguishing feature must change the logits far beyond
    # the tolerance, or the comparison below could not catch its omission.
    tokens = list(range(3, 103))
    model = ref.Model.load(paths["gqa-128-scale"])
    base = ref.forward(model, tokens)
    model.attn_scale = 1 / math.sqrt(model.head_dim)
    effect = max_rel_err(ref.forward(model, tokens), base)
    check(effect > 20 * tolerance(model, len(tokens)), f"attention.scale changes the logits by {effect}")
    model = ref.Model.load(paths["llama3-rope"])
    base = ref.forward(model, tokens)
    model.freq_factors = None
    effect = max_rel_err(ref.forward(model, tokens), base)
    check(effect > 20 * tolerance(model, len(tokens)), f"llama3-rope: rope_freqs change the logits by {effect}")
    model = ref.Model.load(paths["qwen2-yarn"])
    base = ref.forward(model, tokens)
    check(model.scaling == ("yarn", 4.0, 32768) and model.attn_factor == 1.0, f"qwen2-yarn: scaling {model.scaling}")
    model.scaling = None
    effect = max_rel_err(ref.forward(model, tokens), base)
    check(effect > 20 * tolerance(model, len(tokens)), f"qwen2-yarn: YaRN changes the logits by {effect}")
    model.scaling, model.attn_factor = ("yarn", 4.0, 32768), 1 / (1 + 0.1 * math.log(4))  # the frequencies alone
    effect = max_rel_err(ref.forward(model, tokens), base)
    check(effect > 20 * tolerance(model, len(tokens)), f"qwen2-yarn: YaRN's magnitude changes the logits by {effect}")
    model = ref.Model.load(paths["qwen2-bias"])
    base = ref.forward(model, tokens)
    model.rope_style = "adjacent"
    effect = max_rel_err(ref.forward(model, tokens), base)
    check(effect > 20 * tolerance(model, len(tokens)), f"qwen2: rope style changes the logits by {effect}")
    model.rope_style = "halves"
    for i in range(model.n_layers):
        del model.w[f"blk.{i}.attn_k.bias"]
    effect = max_rel_err(ref.forward(model, tokens), base)
    check(effect > 20 * tolerance(model, len(tokens)), f"qwen2: k bias changes the logits by {effect}")
    return paths


def compare_with_longctx(paths, tmp):
    ppl = os.path.join(BIN_DIR, "longctx-perplexity")
    check(os.path.exists(ppl), f"longctx-perplexity not built ({ppl}): cannot compare longctx's logits")
    # Dense attention in f32 (prefill_kernel: f32; the bf16 kernel is compared
    # in tests/model/llama_test.cpp), KV in f32 (the tight comparison) or f16; one config
    # prefills in chunks of 17 tokens so that chunk boundaries are compared too;
    # the model with an attention scale also decodes the last 40 tokens
    # (--context: one token per decode step, the policy's attention).
    # Weights widened to f32 (--weights f32): the reference computes with the
    # dequantized weights and exact activations (the native int8 path is
    # compared in tests/model/llama_test.cpp).
    configs = {"f32": "kv_type: f32\n", "f32-chunk17": "kv_type: f32\nchunk_size: 17\n", "f16": "kv_type: f16\n"}
    for name, keys in configs.items():
        configs[name] = os.path.join(tmp, f"dense-{name}.yaml")
        with open(configs[name], "w") as f:
            f.write(f"policy: dense\nmax_seq_len: 4096\nlocal_windows_len: 1024\ndram_budget: 256MiB\n"
                    f"prefill_kernel: f32\n{keys}")
    rng = np.random.default_rng(5)
    report = []
    for preset, path in paths.items():
        model = ref.Model.load(path)
        n_vocab = model.w["token_embd.weight"].shape[0]
        # Row 0 of every run is the one-token case. context: tokens prefilled, the rest decoded.
        runs = [("f32", [1] + list(rng.integers(3, n_vocab, size=16)), None),
                ("f32-chunk17", [1] + list(rng.integers(3, n_vocab, size=99)), None)]
        if preset == "mha-64":
            runs.append(("f16", [1] + list(rng.integers(3, n_vocab, size=40)), None))
        if preset == "gqa-128-scale":
            runs.append(("f32-chunk17", [1] + list(rng.integers(3, n_vocab, size=99)), 60))
        for config, tokens, context in runs:
            kv_f16 = config == "f16"
            out = os.path.join(tmp, "logits.f32")
            text = ",".join(str(int(t)) for t in tokens)
            decode = ["--context", str(context)] if context else []
            run([ppl, "--model", path, "--weights", "f32", "--tokens", text, "--config", configs[config],
                 "--dump-logits", out] + decode)
            got = np.fromfile(out, dtype="<f4")
            check(got.size == len(tokens) * n_vocab, f"{preset}: {got.size} logits, want {len(tokens)} x {n_vocab}")
            expect = ref.forward(model, tokens, "f16" if kv_f16 else None)
            err = max_rel_err(got.reshape(len(tokens), n_vocab).astype(np.float64), expect)
            tol = tolerance(model, len(tokens), kv_f16)
            report.append(f"{preset:13s} {config:12s} n={len(tokens):3d}"
                          f"{f' ({context} prefilled)' if context else '':16s}: "
                          f"max err / rms {err:.2e} (tolerance {tol:.2e})")
            check(err <= tol, f"{preset}: longctx logits differ from the reference: {report[-1]}")
    print("\n".join(report))


def main():
    test_rope()
    test_attention_scalar()
    test_one_token_by_hand()
    test_forward_properties()
    test_gguf_reader()
    with tempfile.TemporaryDirectory() as tmp:
        paths = test_generated(tmp)
        compare_with_longctx(paths, tmp)
    print(f"model reference: {_env.passed} checks passed")


if __name__ == "__main__":
    main()
