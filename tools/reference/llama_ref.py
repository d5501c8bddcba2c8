#!/usr/bin/python3
"""Independent reference forward pass of Llama-family GGUF models, in NumPy.

Written from the GGUF spec (ggml-org/ggml docs/gguf.md) and the Llama papers,
sharing no code with longctx: its own GGUF parser, its own dequantization and
a plain fp64 forward pass, so that longctx's logits can be checked against it.

    llama_ref.py MODEL.gguf --tokens 1,2,3 --out logits.f32 [--kv-round f16]

writes float32 logits [n_tokens, n_vocab], row-major, no header.

Supported: GGUF v2/v3; F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K tensors (longctx's dequantizable types); architectures "llama" and
"internlm2" (RoPE on adjacent pairs, the layout of llama.cpp's converted Q/K
weights) and "qwen2" (RoPE on the two halves, QKV bias); rope_freqs.weight (Llama-3.1);
{arch}.rope.scaling.type "linear" and "yarn" (YaRN, Peng et al. 2023, with
the ramp and temperature of Hugging Face transformers' Qwen2);
{arch}.attention.scale (scores q.k * scale instead of q.k / sqrt(head_dim)).
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
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
              7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
              12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2)}


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


# Block types, from the layouts of ggml-common.h. Each function takes the
# blocks as a uint8 array [n_blocks, block_bytes] and returns float64
# [n_blocks, block_elems]: every value is an f16 times small integers (plus
# or minus another), exact in float64.

def _f16(blocks, offset):
    """The f16 field at byte `offset` of each block, as a column [n, 1]."""
    return blocks[:, offset:offset + 2].copy().view("<f2").astype(np.float64)


def _nibbles(qs):
    """16 bytes per block -> 32 values: byte j holds element j (low nibble) and j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int64)


def _bit_planes(qh):
    """[n, k] bytes -> [n, 8k] bits, little-endian: bit j is bit j % 8 of byte j // 8."""
    return np.unpackbits(qh, axis=1, bitorder="little").astype(np.int64)


def _q8_0(b):  # f16 d, 32 int8 q; x = d q
    return _f16(b, 0) * b[:, 2:].view(np.int8)


def _q4_0(b):  # f16 d, 16 bytes of nibbles; x = d (q - 8)
    return _f16(b, 0) * (_nibbles(b[:, 2:18]) - 8)


def _q4_1(b):  # f16 d, f16 m, nibbles; x = d q + m
    return _f16(b, 0) * _nibbles(b[:, 4:20]) + _f16(b, 2)


def _q5_0(b):  # f16 d, u32 of fifth bits (bit j for element j), nibbles; x = d (q - 16)
    return _f16(b, 0) * (_nibbles(b[:, 6:22]) + 16 * _bit_planes(b[:, 2:6]) - 16)


def _q5_1(b):  # f16 d, f16 m, fifth bits, nibbles; x = d q + m
    return _f16(b, 0) * (_nibbles(b[:, 8:24]) + 16 * _bit_planes(b[:, 4:8])) + _f16(b, 2)


def _k_crumbs(qs):
    """64 bytes -> [n, 256] 2-bit codes: element 128h + 32j + l is bits 2j, 2j+1 of qs[32h + l]."""
    qs = qs.reshape(-1, 2, 1, 32).astype(np.int64)
    return ((qs >> 2 * np.arange(4)[:, None]) & 3).reshape(-1, 256)


def _q2_k(b):
    """16 bytes of scales (byte s: low nibble the scale, high nibble the min
    of sub-block s, elements 16s..16s+15), 64 bytes of 2-bit codes, f16 d,
    f16 dmin; x = d scale_s q - dmin min_s."""
    sm = b[:, 0:16].astype(np.int64)
    scales, mins = np.repeat(sm & 15, 16, axis=1), np.repeat(sm >> 4, 16, axis=1)
    return _f16(b, 80) * scales * _k_crumbs(b[:, 16:80]) - _f16(b, 82) * mins


def _q3_k(b):
    """hmask[32] (bit i / 32 of hmask[i % 32] is bit 2 of element i), 64
    bytes of 2-bit codes placed as Q2_K's, 12 bytes of 16 six-bit scales,
    f16 d. Scale u_s: low 4 bits in byte s % 8 (low nibble for s < 8, high
    for s >= 8), top 2 bits at bit 2 (s / 4) of byte 8 + s % 4;
    x = d (u_s - 32) (q - 4)."""
    third = np.unpackbits(b[:, 0:32, None], axis=2, bitorder="little").transpose(0, 2, 1).reshape(-1, 256)
    q = _k_crumbs(b[:, 32:96]) | third.astype(np.int64) << 2
    s = b[:, 96:108].astype(np.int64)
    low = np.concatenate([s[:, 0:8] & 15, s[:, 0:8] >> 4], axis=1)
    top = ((s[:, 8:12, None] >> 2 * np.arange(4)) & 3).transpose(0, 2, 1).reshape(-1, 16)  # [n, s / 4, s % 4]
    scales = np.repeat((low | top << 4) - 32, 16, axis=1)
    return _f16(b, 108) * scales * (q - 4)


def _k_scales_mins(s):
    """12 bytes -> 8 six-bit scales and 8 six-bit mins: sub-blocks 0..3 in the
    low 6 bits of bytes 0..3 (scales) and 4..7 (mins); sub-blocks 4..7 in the
    nibbles of bytes 8..11 (low: scale, high: min) below the top 2 bits of
    bytes 0..3 (scales) and 4..7 (mins)."""
    s = s.astype(np.int64)
    scales = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | (s[:, 0:4] >> 6) << 4], axis=1)
    mins = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | (s[:, 4:8] >> 6) << 4], axis=1)
    return scales, mins


def _k_nibbles(qs):
    """128 bytes -> [n, 8 sub-blocks, 32]: each 32 bytes hold two sub-blocks,
    the first in the low nibbles, the second in the high ones."""
    qs = qs.reshape(-1, 4, 1, 32).astype(np.int64)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _affine_k(b, q):
    """Sub-block s of Q4_K/Q5_K: x = d scale_s q - dmin min_s."""
    scales, mins = _k_scales_mins(b[:, 4:16])
    d, dmin = _f16(b, 0)[:, :, None], _f16(b, 2)[:, :, None]
    return (d * scales[:, :, None] * q - dmin * mins[:, :, None]).reshape(-1, 256)


def _q4_k(b):  # f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles
    return _affine_k(b, _k_nibbles(b[:, 16:144]))


def _q5_k(b):  # as Q4_K, with qh[32] before the nibbles: bit s of qh[l] is bit 4 of element l of sub-block s
    fifth = np.unpackbits(b[:, 16:48, None], axis=2, bitorder="little").transpose(0, 2, 1).astype(np.int64)
    return _affine_k(b, _k_nibbles(b[:, 48:176]) + 16 * fifth)


def _q6_k(b):
    """ql[128] low 4 bits, qh[64] high 2 bits, 16 int8 scales, f16 d. Half h
    (128 elements) uses ql[64h..64h+63] and qh[32h..32h+31]: element 32k + l
    takes ql[64h + 32(k % 2) + l] (high nibble when k >= 2) and bits 2k, 2k+1
    of qh[32h + l]; x = d scale_(i / 16) (q - 32)."""
    ql = b[:, 0:128].reshape(-1, 2, 2, 32).astype(np.int64)
    qh = b[:, 128:192].reshape(-1, 2, 32).astype(np.int64)
    low = np.stack([(ql[:, :, k % 2] >> (4 * (k // 2))) & 15 for k in range(4)], axis=2)
    high = np.stack([(qh >> (2 * k)) & 3 for k in range(4)], axis=2)
    q = (low | high << 4).reshape(-1, 256) - 32
    scales = np.repeat(b[:, 192:208].view(np.int8).astype(np.int64), 16, axis=1)
    return _f16(b, 208) * scales * q


_BLOCK_DECODERS = {2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k,
                   14: _q6_k}


def dequantize(ttype, raw, n):
    """n values of tensor type `ttype` from bytes `raw`, as float64."""
    if ttype == 0:
        return np.frombuffer(raw, "<f4", n).astype(np.float64)
    if ttype == 1:
        return np.frombuffer(raw, "<f2", n).astype(np.float64)
    if ttype == 30:  # bf16 = the high 16 bits of an f32
        return (np.frombuffer(raw, "<u2", n).astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if ttype not in _BLOCK_DECODERS:
        raise ValueError(f"tensor type {ttype} not supported by the reference")
    _, block_elems, block_bytes = GGML_TYPES[ttype]
    blocks = np.frombuffer(raw, np.uint8, n // block_elems * block_bytes).reshape(-1, block_bytes)
    return _BLOCK_DECODERS[ttype](blocks).reshape(-1)


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
        if ttype not in GGML_TYPES:
            raise ValueError(f"{path}: tensor {name} has type {ttype}, not supported by the reference")
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
        if arch not in ("llama", "qwen2", "internlm2"):
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
        self.rope_style = "halves" if arch == "qwen2" else "adjacent"
        self.freq_factors = w.get("rope_freqs.weight")
        # RoPE scaling: None, ("linear", factor) or ("yarn", factor, original context); attn_factor
        # multiplies the rotated pairs whatever the scaling (as llama.cpp reads the key).
        self.scaling = None
        self.attn_factor = meta.get(f"{arch}.rope.scaling.attn_factor", 1.0)
        # As llama.cpp reads the type: absent is linear (by the factor, or the older
        # rope.scale_linear; neither: 1), and "none" never scales.
        kind = meta.get(f"{arch}.rope.scaling.type", "linear")
        factor = meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear", 1.0))
        if kind == "linear":
            self.scaling = ("linear", factor) if factor != 1.0 else None
        elif kind == "yarn":
            original = meta.get(f"{arch}.rope.scaling.original_context_length", meta.get(f"{arch}.context_length"))
            self.scaling = ("yarn", factor, original)
        elif kind != "none":
            raise ValueError(f"rope scaling {kind} not supported by the reference")
        self.attn_scale = meta.get(f"{arch}.attention.scale", 1.0 / math.sqrt(self.head_dim))
        if not 0 < self.attn_scale < math.inf:
            raise ValueError(f"{arch}.attention.scale is {self.attn_scale}, expected a finite value > 0")
        if self.n_rot != self.head_dim:
            raise ValueError("partial rotary embedding not supported by the reference")

    @staticmethod
    def load(path):
        return Model(*read_gguf(path))


def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_inv_freq(head_dim, theta, freq_factors=None, scaling=None):
    """RoFormer (Su et al. 2021): theta_i = base^(-2i/d), i < d/2; Llama-3.1
    scaling divides each by its factor (llama.cpp rope_freqs.weight); linear
    scaling divides all by the factor; YaRN see yarn_inv_freq."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is not None and scaling[0] == "linear":
        inv = inv / scaling[1]
    if scaling is not None and scaling[0] == "yarn":
        inv = yarn_inv_freq(inv, head_dim, theta, scaling[1], scaling[2])
    return inv if freq_factors is None else inv / freq_factors


def yarn_inv_freq(inv, head_dim, theta, factor, original, beta_fast=32.0, beta_slow=1.0):
    """YaRN's "NTK-by-parts": a frequency that turns r times over the original
    context is kept for r > beta_fast, divided by the factor for r < beta_slow;
    transformers places the boundaries at the dimensions d(r) = head_dim
    ln(original / (2 pi r)) / (2 ln theta), floor and ceiling, and ramps
    linearly in the pair index between them."""
    def dim(turns):
        return head_dim * math.log(original / (2 * math.pi * turns)) / (2 * math.log(theta))
    low = max(math.floor(dim(beta_fast)), 0)
    high = min(math.ceil(dim(beta_slow)), head_dim - 1)
    ramp = np.clip((np.arange(head_dim // 2) - low) / max(high - low, 0.001), 0.0, 1.0)
    return inv / factor * ramp + inv * (1.0 - ramp)


def rope_magnitude(scaling, attn_factor=1.0):
    """attn_factor, times YaRN's temperature: q and k are multiplied by
    sqrt(1/t) = 0.1 ln s + 1."""
    if scaling is None or scaling[0] != "yarn":
        return attn_factor
    return attn_factor * (0.1 * math.log(scaling[1]) + 1.0)


def apply_rope(x, positions, inv_freq, style, magnitude=1.0):
    """Rotates each pair (a, b) of x [n_tokens, n_heads, d] by angle
    pos * theta_i: (a cos - b sin, a sin + b cos), times magnitude. Pair i is
    (2i, 2i+1) for "adjacent" and (i, i + d/2) for "halves"."""
    angle = np.outer(positions, inv_freq)[:, None, :]  # [n_tokens, 1, d/2]
    cos, sin = magnitude * np.cos(angle), magnitude * np.sin(angle)
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


def causal_attention(q, k, v, scale=None):
    """softmax(q k^T * scale + causal mask) v per query head, for
    q [n, n_heads, d], k and v [n, n_kv_heads, d]; scale None = 1/sqrt(d).
    GQA: query head h reads kv head h // (n_heads / n_kv_heads) (Ainslie et
    al. 2023)."""
    n, n_heads, d = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    group = n_heads // k.shape[1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)  # key j > query i
    out = np.empty_like(q)
    for h in range(n_heads):
        scores = q[:, h, :] @ k[:, h // group, :].T * scale
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
    inv_freq = rope_inv_freq(d, model.theta, model.freq_factors, model.scaling)
    magnitude = rope_magnitude(model.scaling, model.attn_factor)
    x = w["token_embd.weight"][np.asarray(tokens)]  # [n, n_embd]
    for i in range(model.n_layers):
        p = f"blk.{i}."
        # Attention block: x += Wo attn(rope(Wq h), rope(Wk h), Wv h), h = norm(x).
        h = rms_norm(x, w[p + "attn_norm.weight"], model.eps)
        q = linear(h, w, p + "attn_q").reshape(n, model.n_heads, d)
        k = linear(h, w, p + "attn_k").reshape(n, model.n_kv_heads, d)
        v = linear(h, w, p + "attn_v").reshape(n, model.n_kv_heads, d)
        q = apply_rope(q, positions, inv_freq, model.rope_style, magnitude)
        k = apply_rope(k, positions, inv_freq, model.rope_style, magnitude)
        if kv_round == "f16":
            k, v = round_f16(k), round_f16(v)
        attn = causal_attention(q, k, v, model.attn_scale).reshape(n, model.n_heads * d)
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
