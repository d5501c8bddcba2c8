#!/usr/bin/python3
"""Independent reference forward pass of Llama-family GGUF models, in NumPy.

Written from the GGUF spec (ggml-org/ggml docs/gguf.md) and the Llama papers,
sharing no code with longctx: its own GGUF parser, its own dequantization and
a plain fp64 forward pass, so that longctx's logits can be checked against it.

    llama_ref.py MODEL.gguf --tokens 1,2,3 --out logits.f32 [--kv-round f16]

writes float32 logits [n_tokens, n_vocab], row-major, no header.

Supported: GGUF v2/v3; F32, F16, BF16, Q8_0, Q4_0 tensors; architectures "llama"
(RoPE on adjacent pairs, the layout of llama.cpp's converted Q/K weights) and
"qwen2" (RoPE on the two halves, QKV bias); rope_freqs.weight (Llama-3.1).
"""
import argparse
import math
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- GGUF file --

# Metadata value types of the spec: id -> struct format (8 string, 9 array).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# Tensor types: id -> (name, elements per block, bytes per block).
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 8: ("Q8_0", 32, 34), 30: ("BF16", 1, 2)}


class _Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def unpack(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError(f"GGUF truncated at offset {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self):
        n = self.unpack("<Q")
        if self.pos + n > len(self.data):
            raise ValueError(f"GGUF string of {n} bytes at offset {self.pos} runs past the end")
        text = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return text

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype} at offset {self.pos}")


def dequantize(ttype, raw, n):
    """n values of tensor type `ttype` from bytes `raw`, as float64."""
    if ttype == 0:
        return np.frombuffer(raw, "<f4", n).astype(np.float64)
    if ttype == 1:
        return np.frombuffer(raw, "<f2", n).astype(np.float64)
    if ttype == 30:  # bf16 = the high 16 bits of an f32
        return (np.frombuffer(raw, "<u2", n).astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if ttype == 8:  # Q8_0 block: f16 scale d, then 32 int8 q; x = d * q
        blocks = np.frombuffer(raw, np.uint8, n // 32 * 34).reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float64)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
        return (d * q).reshape(-1)
    if ttype == 2:  # Q4_0 block: f16 d, 16 bytes; byte j holds q_j (low nibble) and q_j+16; x = d * (q - 8)
        blocks = np.frombuffer(raw, np.uint8, n // 32 * 18).reshape(-1, 18)
        d = blocks[:, :2].copy().view("<f2").astype(np.float64)
        qs = blocks[:, 2:].astype(np.int64)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) - 8
        return (d * q).reshape(-1)
    raise ValueError(f"tensor type {ttype} not supported by the reference")


def read_gguf(path):
    """(metadata dict, {name: float64 array in NumPy order = reversed GGUF dims})."""
    with open(path, "rb") as f:
        data = f.read()
    cur = _Cursor(data)
    if cur.unpack("<4s") != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} not supported")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.unpack("<Q") for _ in range(cur.unpack("<I"))]
        infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
    align = meta.get("general.alignment", 32)
    base = (cur.pos + align - 1) // align * align  # the data section starts aligned
    tensors = {}
    for name, dims, ttype, offset in infos:
        n = math.prod(dims)
        _, block_elems, block_bytes = GGML_TYPES[ttype]
        start = base + offset
        end = start + n // block_elems * block_bytes
        if end > len(data):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file")
        tensors[name] = dequantize(ttype, data[start:end], n).reshape(list(reversed(dims)))
    return meta, tensors


# -------------------------------------------------------------------- model --

class Model:
    """Hyperparameters and fp64 weights. A weight of GGUF dims [n_in, n_out]
    is the NumPy matrix W[n_out, n_in], applied as y = x @ W.T."""

    def __init__(self, meta, w):
        arch = meta["general.architecture"]
        if arch not in ("llama", "qwen2"):
            raise ValueError(f"architecture {arch} not supported by the reference")
        self.arch, self.w = arch, w
        self.n_layers = meta[f"{arch}.block_count"]
        self.n_heads = meta[f"{arch}.attention.head_count"]
        self.n_kv_heads = meta.get(f"{arch}.attention.head_count_kv", self.n_heads)
        n_embd = meta[f"{arch}.embedding_length"]
        self.head_dim = meta.get(f"{arch}.attention.key_length", n_embd // self.n_heads)
        self.n_rot = meta.get(f"{arch}.rope.dimension_count", self.head_dim)
        self.eps = meta[f"{arch}.attention.layer_norm_rms_epsilon"]
        self.theta = meta.get(f"{arch}.rope.freq_base", 10000.0)
        # llama.cpp's converter permutes Llama's Q/K rows so that rotated pairs are
        # adjacent (2i, 2i+1); Qwen2 keeps the HF layout: pairs (i, i + d/2).
        self.rope_style = "adjacent" if arch == "llama" else "halves"
        self.freq_factors = w.get("rope_freqs.weight")
        if self.n_rot != self.head_dim:
            raise ValueError("partial rotary embedding not supported by the reference")

    @staticmethod
    def load(path):
        return Model(*read_gguf(path))


def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_inv_freq(head_dim, theta, freq_factors=None):
    """RoFormer (Su et al. 2021): theta_i = base^(-2i/d), i < d/2; Llama-3.1
    scaling divides each by its factor (llama.cpp rope_freqs.weight)."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    return inv if freq_factors is None else inv / freq_factors


def apply_rope(x, positions, inv_freq, style):
    """Rotates each pair (a, b) of x [n_tokens, n_heads, d] by angle
    pos * theta_i: (a cos - b sin, a sin + b cos). Pair i is (2i, 2i+1) for
    "adjacent" and (i, i + d/2) for "halves"."""
    angle = np.outer(positions, inv_freq)[:, None, :]  # [n_tokens, 1, d/2]
    cos, sin = np.cos(angle), np.sin(angle)
    half = x.shape[-1] // 2
    if style == "adjacent":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :half], x[..., half:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if style == "adjacent":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :half], out[..., half:] = ra, rb
    return out


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(d) + causal mask) v per query head, for
    q [n, n_heads, d], k and v [n, n_kv_heads, d]. GQA: query head h reads kv
    head h // (n_heads / n_kv_heads) (Ainslie et al. 2023)."""
    n, n_heads, d = q.shape
    group = n_heads // k.shape[1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)  # key j > query i
    out = np.empty_like(q)
    for h in range(n_heads):
        scores = q[:, h, :] @ k[:, h // group, :].T / math.sqrt(d)
        scores[future] = -np.inf
        out[:, h, :] = softmax(scores) @ v[:, h // group, :]
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def linear(x, w, name):
    """x @ W.T (+ bias when the file has name.bias)."""
    y = x @ w[name + ".weight"].T
    bias = w.get(name + ".bias")
    return y if bias is None else y + bias


def round_f16(x):
    return x.astype(np.float16).astype(np.float64)


def forward(model, tokens, kv_round=None):
    """Logits [n_tokens, n_vocab] for tokens at positions 0..n-1. kv_round
    "f16" rounds K and V to f16 before attention (a KV store kept in f16)."""
    w, n = model.w, len(tokens)
    d, positions = model.head_dim, np.arange(n)
    inv_freq = rope_inv_freq(d, model.theta, model.freq_factors)
    x = w["token_embd.weight"][np.asarray(tokens)]  # [n, n_embd]
    for i in range(model.n_layers):
        p = f"blk.{i}."
        # Attention block: x += Wo attn(rope(Wq h), rope(Wk h), Wv h), h = norm(x).
        h = rms_norm(x, w[p + "attn_norm.weight"], model.eps)
        q = linear(h, w, p + "attn_q").reshape(n, model.n_heads, d)
        k = linear(h, w, p + "attn_k").reshape(n, model.n_kv_heads, d)
        v = linear(h, w, p + "attn_v").reshape(n, model.n_kv_heads, d)
        q = apply_rope(q, positions, inv_freq, model.rope_style)
        k = apply_rope(k, positions, inv_freq, model.rope_style)
        if kv_round == "f16":
            k, v = round_f16(k), round_f16(v)
        attn = causal_attention(q, k, v).reshape(n, model.n_heads * d)
        x = x + linear(attn, w, p + "attn_output")
        # SwiGLU feed-forward (Shazeer 2020): x += W_down (silu(W_gate h) * W_up h).
        h = rms_norm(x, w[p + "ffn_norm.weight"], model.eps)
        x = x + linear(silu(linear(h, w, p + "ffn_gate")) * linear(h, w, p + "ffn_up"), w, p + "ffn_down")
    x = rms_norm(x, w["output_norm.weight"], model.eps)
    out = w.get("output.weight", w["token_embd.weight"])  # tied embeddings when absent
    return x @ out.T


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="float32 logits [n_tokens, n_vocab]")
    ap.add_argument("--kv-round", choices=["f16"], help="round K/V to this dtype before attention")
    args = ap.parse_args(argv)
    model = Model.load(args.model)
    tokens = [int(t) for t in args.tokens.split(",")]
    n_vocab = model.w["token_embd.weight"].shape[0]
    if not tokens or min(tokens) < 0 or max(tokens) >= n_vocab:
        sys.exit(f"llama_ref.py: token ids must be in [0, {n_vocab})")
    forward(model, tokens, args.kv_round).astype("<f4").tofile(args.out)


if __name__ == "__main__":
    main()
