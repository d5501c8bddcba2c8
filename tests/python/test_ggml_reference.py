"""The NumPy dequantizers of tools/reference/llama_ref.py: against blocks
packed here element by element from logical values (scales, mins, quants),
and against longctx's own (core/ggml_types.h, read through
longctx._core.read_gguf_tensors) on a GGUF file of random well-formed blocks
of every type longctx dequantizes and on models written by
longctx-make-model with each --weight-type (quantize()'s output).

The two agree bit for bit: NumPy computes each value in float64, where the
products of an f16 scale with small integers, and their sums, are exact;
longctx computes them in f32, where the products are exact too and the
result is rounded once. So float32(NumPy's value) is longctx's value.

Runs as a script (ctest: /usr/bin/python3 with PYTHONPATH=<build>/python,
LONGCTX_BIN_DIR and LONGCTX_SOURCE_DIR set). Exit status 1 on the first failure.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from longctx import _core as lc
from test_model_reference import BIN_DIR, gguf_bytes, ref  # the GGUF builder and llama_ref.py

# Per type: GGUF id, elements and bytes per block, byte offsets of its f16 fields.
TYPES = {"f32": (0, 1, 4, []), "f16": (1, 1, 2, []), "q4_0": (2, 32, 18, [0]), "q4_1": (3, 32, 20, [0, 2]),
         "q5_0": (6, 32, 22, [0]), "q5_1": (7, 32, 24, [0, 2]), "q8_0": (8, 32, 34, [0]),
         "q4_k": (12, 256, 144, [0, 2]), "q5_k": (13, 256, 176, [0, 2]), "q6_k": (14, 256, 210, [208]),
         "bf16": (30, 1, 2, [])}
# The --weight-type values of longctx-make-model.
WEIGHT_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"]
passed = 0


def check(condition, what):
    global passed
    if not condition:
        print("FAIL:", what)
        sys.exit(1)
    passed += 1


def f16_bytes(value):
    return np.array([value], dtype="<f2").tobytes()


# ------------------------------------------ logical values packed by hand --

def pack_k_scales(scales, mins):
    """The 12 scale bytes of Q4_K/Q5_K, bit by bit as the layout describes."""
    out = [0] * 12
    for s in range(8):
        if s < 4:
            out[s] |= scales[s]
            out[s + 4] |= mins[s]
        else:
            out[s + 4] |= (scales[s] & 15) | (mins[s] & 15) << 4
            out[s - 4] |= (scales[s] >> 4) << 6
            out[s] |= (mins[s] >> 4) << 6
    return bytes(out)


def test_k_quants_from_logical_values():
    rng = np.random.default_rng(1)
    for name in ("q4_k", "q5_k"):
        top = 15 if name == "q4_k" else 31
        d, dmin = 0.015625 * 3, -0.25  # f16 numbers; a negative dmin is legal
        scales, mins = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
        q = rng.integers(0, top + 1, 256)
        qs, qh = [0] * 128, [0] * 32
        for i in range(256):
            s, l = i // 32, i % 32
            qs[32 * (s // 2) + l] |= (q[i] & 15) << (4 * (s % 2))
            qh[l] |= (q[i] >> 4) << s
        block = f16_bytes(d) + f16_bytes(dmin) + pack_k_scales(scales, mins)
        block += (bytes(qh) if name == "q5_k" else b"") + bytes(qs)
        got = ref.dequantize(TYPES[name][0], block, 256)
        expect = [d * scales[i // 32] * q[i] - dmin * mins[i // 32] for i in range(256)]
        check(np.array_equal(got, expect), f"{name}: d scale q - dmin min from logical values")
    scales, q = rng.integers(-128, 128, 16), rng.integers(0, 64, 256)
    ql, qh = [0] * 128, [0] * 64
    for i in range(256):
        half, k, l = i // 128, (i % 128) // 32, i % 32
        ql[64 * half + 32 * (k % 2) + l] |= (q[i] & 15) << (4 * (k // 2))
        qh[32 * half + l] |= (q[i] >> 4) << (2 * k)
    block = bytes(ql) + bytes(qh) + scales.astype(np.int8).tobytes() + f16_bytes(0.375)
    got = ref.dequantize(TYPES["q6_k"][0], block, 256)
    check(np.array_equal(got, [0.375 * scales[i // 16] * (q[i] - 32) for i in range(256)]), "q6_k from logical values")
    # Q4_1 / Q5_0 / Q5_1: element j < 16 in the low nibble of byte j, bit j of qh its fifth bit.
    q = rng.integers(0, 32, 32)
    qs = bytes(int(q[j] & 15 | (q[j + 16] & 15) << 4) for j in range(16))
    qh = int(sum(int(q[j] >> 4) << j for j in range(32))).to_bytes(4, "little")
    check(np.array_equal(ref.dequantize(6, f16_bytes(-2.0) + qh + qs, 32), -2.0 * (q - 16)), "q5_0")
    check(np.array_equal(ref.dequantize(7, f16_bytes(0.5) + f16_bytes(-3.0) + qh + qs, 32), 0.5 * q - 3.0), "q5_1")
    check(np.array_equal(ref.dequantize(3, f16_bytes(0.5) + f16_bytes(-3.0) + qs, 32), 0.5 * (q & 15) - 3.0), "q4_1")


# ------------------------------------------------- NumPy against longctx --

def random_blocks(rng, name, n_blocks):
    """Random bytes whose f16 fields are finite, of magnitude 2^-14 .. 2^4."""
    _, elems, size, fields = TYPES[name]
    if elems == 1:  # plain types: finite values
        values = rng.normal(size=n_blocks)
        if name == "bf16":
            return values.astype("<f4").view("<u2")[1::2].tobytes()
        return values.astype("<f4" if name == "f32" else "<f2").tobytes()
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for offset in fields:
        values = rng.choice([-1, 1], n_blocks) * 2.0 ** rng.uniform(-14, 4, n_blocks)
        blocks[:, offset:offset + 2] = values.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    return blocks.tobytes()


def compare_file(path, what):
    _, expect = ref.read_gguf(path)
    got = lc.read_gguf_tensors(path)
    check(set(got) == set(expect), f"{what}: tensor names")
    for name, values in expect.items():
        check(got[name].shape == values.shape, f"{what}: {name} shape {got[name].shape} vs {values.shape}")
        same = np.array_equal(values.astype(np.float32), got[name])
        if not same:
            bad = np.argwhere(values.astype(np.float32) != got[name])[0]
            print(f"{name}{list(bad)}: NumPy {values[tuple(bad)]!r}, longctx {got[name][tuple(bad)]!r}")
        check(same, f"{what}: {name} dequantized alike")


def test_random_blocks(tmp):
    rng = np.random.default_rng(2)
    tensors = []
    for name, (ttype, elems, _, _) in TYPES.items():
        rows, row_blocks = 3, 2 if elems > 1 else 40
        tensors.append((name, [elems * row_blocks, rows], ttype, random_blocks(rng, name, rows * row_blocks)))
    data, _ = gguf_bytes(3, [], tensors, 32)
    path = os.path.join(tmp, "blocks.gguf")
    with open(path, "wb") as f:
        f.write(data)
    compare_file(path, "random blocks")


def test_generated_models(tmp):
    maker = os.path.join(BIN_DIR, "longctx-make-model")
    for weight_type in WEIGHT_TYPES:
        path = os.path.join(tmp, weight_type + ".gguf")
        res = subprocess.run([maker, "--preset", "gqa-128", "--weight-type", weight_type, "--out", path],
                             capture_output=True, text=True)
        check(res.returncode == 0, f"longctx-make-model --weight-type {weight_type}: {res.stderr.strip()}")
        compare_file(path, f"gqa-128 {weight_type}")


def main():
    test_k_quants_from_logical_values()
    with tempfile.TemporaryDirectory() as tmp:
        test_random_blocks(tmp)
        test_generated_models(tmp)
    print(f"ggml reference: {passed} checks passed")


if __name__ == "__main__":
    main()
