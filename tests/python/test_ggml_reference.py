"""The NumPy dequantizers of tools/reference/llama_ref.py: against blocks
packed here element by element from logical values (scales, mins, quants),
against a Q2_K and a Q3_K block written and decoded by llama.cpp b4747, and
against longctx's own (core/ggml_types.h, read through
longctx._core.read_gguf_tensors) on a GGUF file of random well-formed blocks
of every type longctx dequantizes and on models written by
longctx-make-model with each --weight-type (quantize()'s output).

NumPy and longctx agree bit for bit: NumPy computes each value in float64,
where the products of an f16 scale with small integers, and their sums, are
exact; longctx computes them in f32, where the products are exact too and
the result is rounded once. So float32(NumPy's value) is longctx's value.

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
         "q2_k": (10, 256, 84, [80, 82]), "q3_k": (11, 256, 110, [108]),
         "q4_k": (12, 256, 144, [0, 2]), "q5_k": (13, 256, 176, [0, 2]), "q6_k": (14, 256, 210, [208]),
         "bf16": (30, 1, 2, [])}
# The --weight-type values of longctx-make-model.
WEIGHT_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q4_k", "q5_k", "q6_k",
                "q3_k_m", "q4_k_m", "q5_k_m"]
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


def pack_crumbs(q):
    """The 64 bytes of 2-bit codes of Q2_K/Q3_K: element 128h + 32j + l in bits 2j, 2j+1 of byte 32h + l."""
    out = [0] * 64
    for i in range(256):
        h, j, l = i // 128, (i % 128) // 32, i % 32
        out[32 * h + l] |= int(q[i] & 3) << (2 * j)
    return bytes(out)


def pack_q3_k_scales(u):
    """The 12 scale bytes of Q3_K: the low 4 bits of u_s in byte s % 8 (low nibble
    for s < 8, high for s >= 8), the top 2 bits at bit 2 (s // 4) of byte 8 + s % 4."""
    out = [0] * 12
    for s in range(16):
        out[s % 8] |= int(u[s] & 15) << (4 * (s // 8))
        out[8 + s % 4] |= int(u[s] >> 4) << (2 * (s // 4))
    return bytes(out)


def test_low_bit_k_quants_from_logical_values():
    rng = np.random.default_rng(3)
    blocks, expects = {"q2_k": b"", "q3_k": b""}, {"q2_k": [], "q3_k": []}
    for block_index in range(4):  # each with its own scales, so that all their bit patterns turn up
        d, dmin = (0.5, -0.125) if block_index % 2 else (0.015625 * 3, 0.75)  # f16 numbers
        scales, mins, q = rng.integers(0, 16, 16), rng.integers(0, 16, 16), rng.integers(0, 4, 256)
        block = bytes(int(scales[s] | mins[s] << 4) for s in range(16)) + pack_crumbs(q)
        block += f16_bytes(d) + f16_bytes(dmin)
        expect = [d * scales[i // 16] * q[i] - dmin * mins[i // 16] for i in range(256)]
        check(np.array_equal(ref.dequantize(TYPES["q2_k"][0], block, 256), expect),
              "q2_k: d scale q - dmin min from logical values")
        blocks["q2_k"] += block
        expects["q2_k"] += expect
        u, q = rng.integers(0, 64, 16), rng.integers(0, 8, 256)
        hmask = [0] * 32
        for i in range(256):
            hmask[i % 32] |= int(q[i] >> 2) << (i // 32)
        block = bytes(hmask) + pack_crumbs(q) + pack_q3_k_scales(u) + f16_bytes(-d)
        expect = [-d * (u[i // 16] - 32) * (q[i] - 4) for i in range(256)]
        check(np.array_equal(ref.dequantize(TYPES["q3_k"][0], block, 256), expect),
              "q3_k: d (u - 32) (q - 4) from logical values")
        blocks["q3_k"] += block
        expects["q3_k"] += expect
    for name in ("q2_k", "q3_k"):  # several blocks at once decode as each on its own
        check(np.array_equal(ref.dequantize(TYPES[name][0], blocks[name], 1024), expects[name]), f"{name}: 4 blocks")


# ---------------------------------------------------- llama.cpp's blocks --

# quantize_row_q2_K_ref / quantize_row_q3_K_ref of llama.cpp b4747 on
# x_i = 0.25 ((37 i) % 101 - 45) / (1 + (i / 16) % 5) (float32, i = 0..255),
# and what its dequantize_row_q2_K / dequantize_row_q3_K make of them.
GOLDEN_Q2_K_BYTES = bytes.fromhex(
    "ee 77 44 34 33 ee 88 45 44 22 ee 87 54 44 23 ff 1c b1 c6 6c b1 1b 6c 86 1b 61 c6 5c b1 db 6c b2 "
    "17 6d 86 1b 71 c6 28 b1 d7 68 b2 1b 6d 86 1b 71 1b 7d 86 2b 71 96 2c b1 db 7d 86 1b 71 86 28 71 "
    "db 6c b6 1b 6c 86 1b 61 c7 6c b1 db 6c b6 1b 6c d6 37 54 39")
GOLDEN_Q2_K_VALUES = [
    -9.32421875, -2.46777344, 4.38867188, -9.32421875, -2.46777344, 11.2451172, -9.32421875, 4.38867188, 11.2451172,
    -2.46777344, 4.38867188, -9.32421875, -2.46777344, 11.2451172, -9.32421875, 4.38867188, 5.62255859, -1.23388672,
    2.19433594, 5.62255859, -1.23388672, 2.19433594, -4.66210938, -1.23388672, 5.62255859, -4.66210938, 2.19433594,
    5.62255859, -1.23388672, 2.19433594, 5.62255859, -1.23388672, 3.21289062, -2.6640625, -0.705078125, 3.21289062,
    -2.6640625, 1.25390625, 3.21289062, -0.705078125, 1.25390625, -2.6640625, -0.705078125, 3.21289062, -2.6640625,
    1.25390625, 3.21289062, -2.6640625, -0.0390625, 3.87890625, -0.0390625, 1.91992188, -1.99804688, -0.0390625,
    1.91992188, -1.99804688, -0.0390625, 1.91992188, -1.99804688, 1.91992188, 3.87890625, -0.0390625, 1.91992188,
    -1.99804688, -0.528808594, 2.40966797, -1.99804688, 0.940429688, 2.40966797, -0.528808594, 0.940429688,
    -1.99804688, -0.528808594, 0.940429688, -1.99804688, -0.528808594, 2.40966797, -0.528808594, 0.940429688,
    2.40966797, -2.46777344, 4.38867188, -9.32421875, -2.46777344, 11.2451172, -9.32421875, 4.38867188, 11.2451172,
    -2.46777344, 4.38867188, 11.2451172, -2.46777344, 4.38867188, -9.32421875, -2.46777344, 11.2451172, -5.328125,
    2.5078125, 6.42578125, -1.41015625, 2.5078125, -5.328125, -1.41015625, 2.5078125, -5.328125, -1.41015625,
    6.42578125, -1.41015625, 2.5078125, 6.42578125, -1.41015625, 2.5078125, -2.6640625, -0.215332031, 2.23339844,
    -2.6640625, -0.215332031, 4.68212891, -2.6640625, 2.23339844, 4.68212891, -0.215332031, 2.23339844, -2.6640625,
    -0.215332031, 2.23339844, -2.6640625, -0.215332031, 3.21289062, -0.705078125, 1.25390625, 3.21289062,
    -0.705078125, 1.25390625, -2.6640625, -0.705078125, 3.21289062, -0.705078125, 1.25390625, 3.21289062,
    -0.705078125, 1.25390625, -2.6640625, -0.705078125, 1.60644531, -1.33203125, 0.626953125, 1.60644531, -1.33203125,
    0.626953125, 1.60644531, -0.352539062, 1.60644531, -1.33203125, -0.352539062, 1.60644531, -1.33203125,
    0.626953125, 1.60644531, -1.33203125, 4.38867188, 11.2451172, -2.46777344, 4.38867188, -9.32421875, -2.46777344,
    11.2451172, -9.32421875, 4.38867188, 11.2451172, -2.46777344, 4.38867188, -9.32421875, -2.46777344, 4.38867188,
    -9.32421875, 1.52832031, 4.95654297, -1.89990234, 1.52832031, 4.95654297, -1.89990234, 1.52832031, -5.328125,
    -1.89990234, 4.95654297, -5.328125, 1.52832031, 4.95654297, -1.89990234, 1.52832031, 4.95654297, -1.37109375,
    2.546875, -3.33007812, 0.587890625, 2.546875, -1.37109375, 0.587890625, 2.546875, -1.37109375, 2.546875,
    -3.33007812, -1.37109375, 2.546875, -3.33007812, 0.587890625, 2.546875, -0.705078125, 1.25390625, 3.21289062,
    -0.705078125, 1.25390625, -2.6640625, -0.705078125, 1.25390625, -2.6640625, 1.25390625, 3.21289062, -0.705078125,
    1.25390625, 3.21289062, -0.705078125, 1.25390625, -1.33203125, 0.137207031, 1.60644531, -1.33203125, 0.137207031,
    1.60644531, -1.33203125, 1.60644531, 3.07568359, 0.137207031, 1.60644531, -1.33203125, 0.137207031, 1.60644531,
    -1.33203125, 0.137207031, 12.0483398, -2.64404297, 4.70214844, -9.99023438, -2.64404297, 4.70214844, -9.99023438,
    -2.64404297, 12.0483398, -2.64404297, 4.70214844, 12.0483398, -2.64404297, 4.70214844, -9.99023438, -2.64404297,
]
GOLDEN_Q3_K_BYTES = bytes.fromhex(
    "cd 93 66 c9 33 6c 99 36 4c 9b 66 cd b3 66 d9 33 6c 99 36 cc 9b 66 cd b3 64 d9 32 6c 99 26 cc 93 "
    "8b dd 22 77 c8 dd 62 b7 d8 2d 72 8b dc 22 76 88 dd 22 b7 88 2d 62 8b d8 2d 76 87 dd 21 77 88 dd "
    "dd 21 77 88 dd 22 77 c8 1d 76 b7 dc 2d 76 8b d8 22 77 88 dd 22 b7 c8 2d 62 8b d8 21 76 8b dd 22 "
    "82 a0 06 08 6a 81 a1 26 54 51 45 15 d5 2e")
GOLDEN_Q3_K_VALUES = [
    -9.60754395, -3.20251465, 6.4050293, -9.60754395, -0, 9.60754395, -6.4050293, 3.20251465, 12.8100586, -3.20251465,
    6.4050293, -9.60754395, -0, 6.4050293, -6.4050293, -0, 5.12402344, -3.41601562, 1.70800781, 6.83203125,
    -1.70800781, 3.41601562, -5.12402344, -0, 5.12402344, -3.41601562, 1.70800781, 5.12402344, -1.70800781,
    1.70800781, 6.83203125, -1.70800781, 2.13500977, -3.20251465, -0, 3.20251465, -2.13500977, 1.06750488, 4.27001953,
    -1.06750488, 2.13500977, -3.20251465, -0, 2.13500977, -3.20251465, -0, 3.20251465, -2.13500977, 0.854003906,
    3.41601562, -0.854003906, 1.70800781, -2.56201172, -0, 1.70800781, -1.70800781, 0.854003906, 2.56201172,
    -0.854003906, 0.854003906, 3.41601562, -0.854003906, 1.70800781, -2.56201172, -0, 1.92150879, -1.28100586,
    0.64050293, 2.56201172, -0.64050293, 1.28100586, -1.92150879, -0.64050293, 1.28100586, -1.92150879, -0,
    1.92150879, -1.28100586, 0.64050293, 2.56201172, -3.30926514, 6.61853027, -9.92779541, -0, 6.61853027,
    -6.61853027, -0, 9.92779541, -6.61853027, 3.30926514, 13.2370605, -3.30926514, 6.61853027, -9.92779541, -0,
    9.92779541, -3.20251465, 1.60125732, 6.4050293, -1.60125732, 1.60125732, -4.80377197, -1.60125732, 3.20251465,
    -4.80377197, -0, 4.80377197, -3.20251465, 1.60125732, 6.4050293, -1.60125732, 3.20251465, -3.20251465, -0,
    2.13500977, -2.13500977, -0, 3.20251465, -2.13500977, 1.06750488, 4.27001953, -1.06750488, 2.13500977,
    -3.20251465, -0, 3.20251465, -2.13500977, 1.06750488, 2.56201172, -0.854003906, 0.854003906, 3.41601562,
    -0.854003906, 1.70800781, -2.56201172, -0, 2.56201172, -1.70800781, 0.854003906, 3.41601562, -0.854003906,
    1.70800781, -2.56201172, -0, 1.28100586, -1.92150879, -0, 1.92150879, -1.28100586, 0.64050293, 2.56201172,
    -0.64050293, 1.28100586, -1.92150879, -0, 1.92150879, -1.28100586, 0.64050293, 1.92150879, -1.28100586,
    3.41601562, 13.6640625, -3.41601562, 6.83203125, -10.2480469, -0, 10.2480469, -6.83203125, 3.41601562, 10.2480469,
    -3.41601562, 3.41601562, -10.2480469, -3.41601562, 6.83203125, -6.83203125, -0, 5.12402344, -3.41601562,
    1.70800781, 6.83203125, -1.70800781, 3.41601562, -5.12402344, -0, 3.41601562, -3.41601562, -0, 5.12402344,
    -3.41601562, 1.70800781, 6.83203125, -1.06750488, 2.13500977, -3.20251465, -0, 3.20251465, -2.13500977,
    1.06750488, 4.27001953, -1.06750488, 1.06750488, -3.20251465, -1.06750488, 2.13500977, -3.20251465, -0,
    3.20251465, -1.70800781, 0.854003906, 3.41601562, -0.854003906, 1.70800781, -2.56201172, -0, 1.70800781,
    -1.70800781, -0, 2.56201172, -1.70800781, 0.854003906, 3.41601562, -0.854003906, 1.70800781, -1.92150879, -0,
    1.92150879, -1.28100586, 0.64050293, 2.56201172, -0.64050293, 0.64050293, 2.56201172, -0.64050293, 1.28100586,
    -1.92150879, -0, 1.92150879, -1.28100586, 0.64050293, 12.8100586, -3.20251465, 6.4050293, -9.60754395, -0,
    6.4050293, -9.60754395, -0, 9.60754395, -6.4050293, 3.20251465, 12.8100586, -3.20251465, 6.4050293, -9.60754395,
    -0,
]


def test_llama_cpp_blocks():
    for name, raw, values in (("q2_k", GOLDEN_Q2_K_BYTES, GOLDEN_Q2_K_VALUES),
                              ("q3_k", GOLDEN_Q3_K_BYTES, GOLDEN_Q3_K_VALUES)):
        check(len(raw) == TYPES[name][2] and len(values) == 256, f"{name}: golden block sizes")
        got, expect = ref.dequantize(TYPES[name][0], raw, 256), np.array(values)
        # ggml computes in f32 and may fuse a multiply-add: equal to within float32 rounding.
        check(np.all(np.abs(got - expect) <= 2e-7 * np.abs(expect)), f"{name}: llama.cpp b4747's values")


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
    test_low_bit_k_quants_from_logical_values()
    test_llama_cpp_blocks()
    with tempfile.TemporaryDirectory() as tmp:
        test_random_blocks(tmp)
        test_generated_models(tmp)
    print(f"ggml reference: {passed} checks passed")


if __name__ == "__main__":
    main()
