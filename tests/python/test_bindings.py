"""The native module longctx._core without a model: DLPack exchange with
NumPy and PyTorch, Config, KVStore, the attention engine (against a NumPy
fp64 reference) and DecodePolicy.

Runs as a script (ctest: /usr/bin/python3 with PYTHONPATH=<build>/python and
LONGCTX_SOURCE_DIR set) or under pytest. Exit status 1 on a failure.
"""
import gc
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import unittest
import weakref

import numpy as np
import torch

from longctx import _core as lc

from _env import SOURCE_DIR


def small_config(**overrides):
    """A store config small enough for tests (1K tokens, 16-token blocks)."""
    d = {"max_seq_len": 1024, "block_size": 16, "kv_type": "f16", "local_windows_len": 32, "initial_len": 4,
         "second_select_num": 2, "chunk_size": 256, "dense_layer_num": 0}
    d.update(overrides)
    return lc.Config.from_dict(d)


def rounded(x, kv_type):
    """x (float64) as the store keeps it: rounded to kv_type."""
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float64)
    if kv_type == "bf16":
        return torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()
    return x.astype(np.float32).astype(np.float64)


U32 = 2.0 ** -24


def _row(q, kk, vv, scale):
    """One query row: out, lse and the f32 error bounds of the CPU kernels
    (tests/cpu/prefill_attention_test.cpp "error budget"): A = scale * max_t
    sum_c |q_c k_tc|, L keys, V = max |v|."""
    s = kk @ q * scale
    m = s.max()
    p = np.exp(s - m)
    out, lse = p @ vv / p.sum(), m + np.log(p.sum())
    a, n_keys, big_v = scale * np.max(np.abs(kk) @ np.abs(q)), len(kk), np.max(np.abs(vv))
    e_s = (len(q) + 2) * U32 * a
    e_p = 2 * e_s + 110 * U32 + (2 * a + 2 * n_keys) * U32
    tol_out = big_v * (2 * e_p + 8 * n_keys * U32 + 2 * U32)
    tol_lse = e_s + e_p + 4 * n_keys * U32 + (abs(lse) + 2) * U32
    return out, lse, tol_out, tol_lse


def ref_attention(q, k, v, ends, scale):
    """fp64 reference. q [n, H, D], k/v [T, Hkv, D]; query i attends keys
    [0, ends[i]) of its kv head h // (H / Hkv). Returns out [n, H, D], lse
    [n, H] and error bounds per row [n, H] for out and lse."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    out = np.zeros(q.shape)
    lse, tol_out, tol_lse = np.full((n, heads), -np.inf), np.zeros((n, heads)), np.zeros((n, heads))
    for i in range(n):
        for h in range(heads):
            if ends[i] > 0:
                out[i, h], lse[i, h], tol_out[i, h], tol_lse[i, h] = _row(
                    q[i, h], k[: ends[i], h // group], v[: ends[i], h // group], scale)
    return out, lse, tol_out, tol_lse


def ref_spans(q, k, v, spans, scale):
    """fp64 decode reference over explicit token spans per kv head: q [H, D]."""
    heads = q.shape[0]
    group = heads // k.shape[1]
    out, lse, tol_out, tol_lse = np.zeros(q.shape), np.full(heads, -np.inf), np.zeros(heads), np.zeros(heads)
    for h in range(heads):
        idx = np.concatenate([np.arange(b, e) for b, e in spans[h // group]])
        out[h], lse[h], tol_out[h], tol_lse[h] = _row(q[h], k[idx, h // group], v[idx, h // group], scale)
    return out, lse, tol_out, tol_lse


def assert_close(test, got_out, got_lse, ref):
    """Kernel results within the reference's error bounds (a factor 2 for the
    decode kernels' flash-decoding split and merge)."""
    want_out, want_lse, tol_out, tol_lse = ref
    err_out = np.abs(got_out - want_out).max(axis=-1)
    err_lse = np.abs(got_lse - want_lse)
    test.assertTrue(np.all(err_out <= 2 * tol_out), f"out error {err_out.max()} > bound {tol_out.min()}")
    test.assertTrue(np.all(err_lse <= 2 * tol_lse), f"lse error {err_lse.max()} > bound {tol_lse.min()}")
    test.assertGreater(np.abs(got_out).max(), 0.01, "not an all-zero output")


class FakeCuda:
    """Says it lives on cuda:0; must be refused before __dlpack__ is called."""

    called = False

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        FakeCuda.called = True
        raise AssertionError("__dlpack__ must not be called for a CUDA tensor")


class DLPackTest(unittest.TestCase):
    NP_DTYPES = {np.float32: "f32", np.float16: "f16", np.float64: "f64", np.int32: "i32", np.int64: "i64",
                 np.uint8: "u8", np.int8: "i8"}
    TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32",
                    torch.int64: "i64", torch.uint8: "u8"}

    def check_numpy_view(self, x, name):
        t = lc.from_dlpack(x)
        self.assertEqual(t.shape, x.shape)
        self.assertEqual(t.strides, tuple(s // x.itemsize for s in x.strides))
        self.assertEqual(t.dtype, name)
        self.assertEqual(t.device, "cpu")
        if x.size:
            self.assertEqual(t.data_ptr(), x.ctypes.data)
        y = np.from_dlpack(t)
        self.assertEqual(y.dtype, x.dtype)
        np.testing.assert_array_equal(y, x)
        if x.size:
            self.assertEqual(y.ctypes.data, x.ctypes.data, "zero copy")
            self.assertEqual(y.strides, x.strides)
            # Same memory: a write to the source shows through the round trip.
            x[(0,) * x.ndim] = 7
            self.assertEqual(y[(0,) * y.ndim], 7)

    def test_numpy_round_trip_every_dtype(self):
        for dt, name in self.NP_DTYPES.items():
            base = np.arange(4 * 6 * 5).reshape(4, 6, 5).astype(dt)
            for view in (base, base[1:], base[1:, ::2, 1:], base[:, 3], base[2:2]):
                with self.subTest(dtype=name, shape=view.shape, strides=view.strides):
                    self.check_numpy_view(view, name)

    def test_torch_round_trip_every_dtype(self):
        for dt, name in self.TORCH_DTYPES.items():
            base = torch.arange(4 * 6 * 5).reshape(4, 6, 5).to(dt)
            for view in (base, base[1:], base[1:, ::2, 1:], base[:, 3], base.transpose(0, 2), base[2:2]):
                with self.subTest(dtype=name, shape=tuple(view.shape), strides=view.stride()):
                    t = lc.from_dlpack(view)
                    self.assertEqual(t.shape, tuple(view.shape))
                    if view.numel():  # torch normalizes the strides of empty tensors
                        self.assertEqual(t.strides, view.stride())
                    self.assertEqual(t.dtype, name)
                    if view.numel():
                        self.assertEqual(t.data_ptr(), view.data_ptr())
                    y = torch.from_dlpack(t)
                    self.assertEqual(y.dtype, dt)
                    self.assertTrue(torch.equal(y, view))
                    if view.numel():
                        self.assertEqual(y.data_ptr(), view.data_ptr(), "zero copy")
                        self.assertEqual(y.stride(), view.stride())
                        y[(0,) * y.dim()].fill_(3)
                        self.assertEqual(view[(0,) * view.dim()].item(), 3)

    def test_torch_to_numpy_through_longctx(self):
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1:]
        y = np.from_dlpack(lc.from_dlpack(x))
        np.testing.assert_array_equal(y, x.numpy())
        self.assertEqual(y.ctypes.data, x.data_ptr())

    def test_keeps_source_alive_and_releases_it(self):
        src = np.arange(10.0)
        ref = weakref.ref(src)
        t = lc.from_dlpack(src)
        del src
        gc.collect()
        self.assertIsNotNone(ref(), "the Tensor keeps its source alive")
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(10.0))
        capsule = t.__dlpack__()  # never consumed: its destructor must free it
        del t
        gc.collect()
        self.assertIsNotNone(ref(), "an unconsumed capsule keeps the source alive")
        del capsule
        gc.collect()
        self.assertIsNone(ref(), "everything released")

    def test_arguments_are_released_after_a_call(self):
        store = lc.KVStore(small_config(), 1, 2, 64)
        k = np.ones((3, 2, 64), np.float32)
        ref = weakref.ref(k)
        store.append(0, k, k)
        del k
        gc.collect()
        self.assertIsNone(ref(), "append holds no reference to its inputs")

    def test_errors(self):
        with self.assertRaises(TypeError):
            lc.from_dlpack("not a tensor")
        with self.assertRaises(TypeError):
            lc.from_dlpack(None)

        class NotCapsule:
            def __dlpack__(self, stream=None):
                return 42

        with self.assertRaisesRegex(TypeError, "capsule"):
            lc.from_dlpack(NotCapsule())

        class BadDevice:
            def __dlpack_device__(self):
                return "cpu"

            def __dlpack__(self, stream=None):
                return np.zeros(1).__dlpack__()

        with self.assertRaisesRegex(TypeError, "__dlpack_device__"):
            lc.from_dlpack(BadDevice())
        # A used capsule cannot be imported twice.
        cap = np.zeros(3).__dlpack__()
        np.from_dlpack(type("C", (), {"__dlpack__": lambda self, stream=None: cap,
                                      "__dlpack_device__": lambda self: (1, 0)})())
        with self.assertRaisesRegex(TypeError, "capsule"):
            lc.from_dlpack(type("C", (), {"__dlpack__": lambda self, stream=None: cap})())

    def test_cuda_tensor_is_refused_clearly(self):
        store = lc.KVStore(small_config(), 1, 2, 64)
        k = np.zeros((1, 2, 64), np.float32)
        with self.assertRaisesRegex(lc.Error, r"k: expected a CPU tensor, got cuda:0"):
            store.append(0, FakeCuda(), k)
        with self.assertRaisesRegex(lc.Error, r"q: expected a CPU tensor, got cuda:0"):
            lc.dense_decode_attention(store, 0, FakeCuda())
        self.assertFalse(FakeCuda.called)
        self.assertEqual(store.n_tokens(0), 0)


class ConfigTest(unittest.TestCase):
    def test_load_file_and_properties(self):
        c = lc.Config.load(os.path.join(SOURCE_DIR, "configs", "demo.yaml"))
        self.assertEqual((c.block_size, c.initial_len, c.local_windows_len, c.second_select_num), (16, 4, 64, 16))
        self.assertEqual((c.representative_type, c.kv_type, c.policy, c.head_select_mode),
                         ("QUEST", "f16", "select", "SEPARATE"))
        c2 = lc.Config.load(pathlib.Path(SOURCE_DIR, "configs", "demo.yaml"), ["block_size=32"])
        self.assertEqual(c2.block_size, 32)
        self.assertNotEqual(c, c2)
        self.assertEqual(c.with_overrides(["block_size=32"]), c2)

    def test_dict_yaml_round_trip(self):
        c = lc.Config.from_dict({"block_size": 32, "kv_type": "bf16", "preselect": {"window": 8},
                                 "sampling": {"top_p": 0.5}, "numa": "none", "dram_budget": "1GiB"})
        self.assertEqual((c.block_size, c.kv_type, c.dram_budget), (32, "bf16", 1 << 30))
        d = c.to_dict()
        self.assertEqual(d["preselect"]["window"], 8)
        self.assertEqual(d["sampling"]["top_p"], 0.5)
        self.assertIs(d["preselect_block"], False)
        self.assertEqual(lc.Config.from_dict(d), c)
        self.assertEqual(lc.Config.from_yaml(c.to_yaml()), c)
        self.assertEqual(lc.Config(), lc.Config.from_dict({}))
        self.assertEqual(lc.Config().block_size, 128)

    def test_errors_name_source_and_key(self):
        for d, pattern in [({"block_size": 0}, r"<dict>.*block_size"),
                           ({"sampling": {"temprature": 0}}, r"<dict>.*sampling\.temprature"),
                           ({"block_size": "16"}, r"<dict>.*block_size.*quoted"),
                           ({"kv_type": "f8"}, r"<dict>.*kv_type"),
                           ({"local_windows_len": 4096, "max_seq_len": 1024}, r"<dict>.*local_windows_len")]:
            with self.subTest(d=d):
                with self.assertRaisesRegex(lc.Error, pattern):
                    lc.Config.from_dict(d)
        with self.assertRaisesRegex(TypeError, "block_size"):
            lc.Config.from_dict({"block_size": {1, 2}})
        with self.assertRaises(TypeError):
            lc.Config.from_dict({1: 2})
        with self.assertRaises(TypeError):
            lc.Config.load(os.path.join(SOURCE_DIR, "configs", "demo.yaml"), "block_size=32")
        with self.assertRaises(TypeError):
            lc.Config.load(42)
        with self.assertRaisesRegex(lc.Error, "/nonexistent/x.yaml"):
            lc.Config.load("/nonexistent/x.yaml")
        with self.assertRaisesRegex(lc.Error, "block_size"):
            lc.Config.load(os.path.join(SOURCE_DIR, "configs", "demo.yaml"), ["block_size=0"])
        with self.assertRaisesRegex(lc.Error, "<string>:2"):
            lc.Config.from_yaml("block_size: 16\nbogus: 1\n")
        self.assertTrue(issubclass(lc.Error, RuntimeError))


class KVStoreTest(unittest.TestCase):
    def test_append_read_and_stats(self):
        for kv_type in ("f32", "f16", "bf16"):
            for src in ("numpy", "torch"):
                with self.subTest(kv_type=kv_type, src=src):
                    store = lc.KVStore(small_config(kv_type=kv_type), 2, 2, 64)
                    self.assertEqual(store.shape, (2, 2, 64))
                    self.assertEqual(store.kv_type, kv_type)
                    rng = np.random.default_rng(3)
                    k, v = rng.standard_normal((2, 37, 2, 64))
                    for lo, hi in ((0, 5), (5, 21), (21, 37)):  # partial blocks on both sides
                        kk, vv = k[lo:hi].astype(np.float32), v[lo:hi].astype(np.float32)
                        if src == "torch":
                            kk, vv = torch.from_numpy(kk).to(torch.bfloat16), torch.from_numpy(vv)
                        store.append(1, kk, vv)
                    self.assertEqual((store.n_tokens(0), store.n_tokens(1), store.n_blocks(1)), (0, 37, 3))
                    got_k, got_v = store.read(1)
                    want_k = rounded(rounded(k, "bf16") if src == "torch" else k, kv_type)
                    np.testing.assert_array_equal(got_k, want_k.astype(np.float32))
                    np.testing.assert_array_equal(got_v, rounded(v, kv_type).astype(np.float32))
                    stats = store.memory_stats()
                    self.assertGreater(stats["used_bytes"], 0)
                    self.assertGreaterEqual(stats["reserved_bytes"], stats["used_bytes"])
                    self.assertEqual(store.partition(1)["n_tokens"], 37)
                    store.clear()
                    self.assertEqual(store.n_tokens(1), 0)

    def test_read_while_other_threads_append(self):
        """read() between appends of other threads returns a whole prefix of
        the layer (the arrays are made outside the store's lock; a count that
        changed meanwhile made it fail)."""
        store = lc.KVStore(small_config(kv_type="f32"), 1, 2, 16)
        rng = np.random.default_rng(4)
        k = rng.standard_normal((400, 2, 16)).astype(np.float32)
        errors, lengths = [], []

        def append():
            try:
                for t in range(400):
                    store.append(0, k[t:t + 1], k[t:t + 1])
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        def read():
            try:
                for _ in range(200):
                    got_k, got_v = store.read(0)
                    lengths.append(len(got_k))
                    np.testing.assert_array_equal(got_k, k[:len(got_k)])
                    np.testing.assert_array_equal(got_v, k[:len(got_v)])
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=append)] + [threading.Thread(target=read) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(store.n_tokens(0), 400)
        self.assertEqual(len(lengths), 600)

    def test_q8_0_store(self):
        """kv_type q8_0: per token and group of 32 channels, s = f16(max|x| / 127),
        q = clamp(round-half-even(x / s), -127, 127); read() returns q * s. A NaN
        is refused naming the kv head, position and channel; nothing changes."""
        store = lc.KVStore(small_config(kv_type="q8_0"), 2, 2, 64)
        self.assertEqual(store.kv_type, "q8_0")
        rng = np.random.default_rng(8)
        k, v = rng.standard_normal((2, 37, 2, 64)).astype(np.float32)
        store.append(1, k[:20], v[:20])
        store.append(1, k[20:], v[20:])

        def q8(x):
            g = x.reshape(*x.shape[:-1], -1, 32)
            s = (np.abs(g).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
            q = np.clip(np.rint(np.divide(g, s, out=np.zeros_like(g), where=s > 0)), -127, 127)
            return (q * s).reshape(x.shape)

        got_k, got_v = store.read(1)
        np.testing.assert_array_equal(got_k, q8(k))
        np.testing.assert_array_equal(got_v, q8(v))
        self.assertLess(np.abs(got_k - k).max(), np.abs(k).max() / 127)  # half a step at most, plus f16 rounding
        bad = k[:3].copy()
        bad[2, 1, 40] = np.nan
        with self.assertRaisesRegex(lc.Error, r"key of kv head 1 at position 39, channel 40 is nan"):
            store.append(1, bad, v[:3])
        self.assertEqual(store.n_tokens(1), 37)
        with self.assertRaisesRegex(lc.Error, r"q8_0 needs head_dim a multiple of 32"):
            lc.KVStore(small_config(kv_type="q8_0"), 1, 1, 48)

    def test_strided_input(self):
        store = lc.KVStore(small_config(kv_type="f32"), 1, 2, 64)
        big = np.random.default_rng(1).standard_normal((10, 3, 64)).astype(np.float32)
        view = big[::2, 1:]  # outer strides arbitrary, innermost contiguous
        store.append(0, view, view)
        np.testing.assert_array_equal(store.read(0)[0], view)

    def test_errors_leave_the_store_unchanged(self):
        store = lc.KVStore(small_config(kv_type="f32"), 2, 2, 64)
        k = np.ones((3, 2, 64), np.float32)
        store.append(0, k, k)
        before = store.read(0)

        def unchanged():
            self.assertEqual((store.n_tokens(0), store.n_tokens(1)), (3, 0))
            after = store.read(0)
            np.testing.assert_array_equal(after[0], before[0])

        cases = [
            ((5, k, k), r"layer 5 out of range"),
            ((-1, k, k), r"layer -1"),
            ((0, k.astype(np.int32), k), r"k: expected \[n, 2, 64\] f32/f16/bf16, got \[3, 2, 64\] i32"),
            ((0, k.astype(np.float64), k), r"got \[3, 2, 64\] f64"),
            ((0, np.ones((3, 4, 64), np.float32), k), r"k: expected \[n, 2, 64\].*got \[3, 4, 64\] f32"),
            ((0, k, np.ones((2, 2, 64), np.float32)), r"v: expected \[3, 2, 64\]"),
            ((0, np.ones((3, 2, 128), np.float32)[:, :, ::2], k), r"innermost dimension must be contiguous"),
            ((0, k[::-1], k), r"negative strides|dlpack|DLPack"),
            ((0, np.ones((2000, 2, 64), np.float32), np.ones((2000, 2, 64), np.float32)), r"max_seq_len"),
        ]
        for args, pattern in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex((lc.Error, BufferError), pattern):
                    store.append(*args)
                unchanged()
        with self.assertRaises(TypeError):
            store.append(0, "k", k)
        with self.assertRaises(TypeError):
            store.append(0, k, [1, 2])
        with self.assertRaisesRegex(lc.Error, "out of range"):
            store.n_tokens(2)
        unchanged()
        with self.assertRaisesRegex(lc.Error, "head_dim"):
            lc.KVStore(small_config(), 1, 2, 12)
        with self.assertRaisesRegex(lc.Error, "n_layers"):
            lc.KVStore(small_config(), 0, 2, 64)
        with self.assertRaisesRegex(lc.Error, r"\d+ bytes|budget|B\b"):
            lc.KVStore(small_config(dram_budget="64KiB"), 4, 8, 128)

    def test_save_load(self):
        tmp = tempfile.mkdtemp(prefix="longctx-py-store-")
        self.addCleanup(shutil.rmtree, tmp, True)
        rng = np.random.default_rng(5)
        store = lc.KVStore(small_config(), 2, 2, 64)
        k = rng.standard_normal((40, 2, 64)).astype(np.float32)
        store.append(0, k, k)
        store.append(1, k[:40], -k[:40])
        path = os.path.join(tmp, "a.kv")
        store.save(path, "model-x")
        for mmap in (False, True):
            other = lc.KVStore(small_config(), 2, 2, 64)
            other.load(path, "model-x", mmap=mmap)
            for layer in (0, 1):
                for a, b in zip(store.read(layer), other.read(layer)):
                    np.testing.assert_array_equal(a, b)
        # Refused loads leave the target as it was.
        target = lc.KVStore(small_config(), 2, 2, 64)
        target.append(0, k[:3], k[:3])
        with self.assertRaisesRegex(lc.Error, "fingerprint|model-x"):
            target.load(path, "model-y")
        with self.assertRaisesRegex(lc.Error, "missing.kv"):
            target.load(os.path.join(tmp, "missing.kv"))
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        bad = os.path.join(tmp, "bad.kv")
        with open(bad, "wb") as f:
            f.write(data)
        with self.assertRaisesRegex(lc.Error, "bad.kv"):
            target.load(bad, "model-x")
        with self.assertRaisesRegex(lc.Error, "block_size|layout|match"):
            lc.KVStore(small_config(block_size=32), 2, 2, 64).load(path, "model-x")
        self.assertEqual((target.n_tokens(0), target.n_tokens(1)), (3, 0))
        np.testing.assert_array_equal(target.read(0)[0], rounded(k[:3], "f16").astype(np.float32))
        with self.assertRaisesRegex(lc.Error, "no-dir"):
            store.save(os.path.join(tmp, "no-dir", "x.kv"))
        self.assertFalse(os.path.exists(os.path.join(tmp, "no-dir")))


class AttentionTest(unittest.TestCase):
    def test_bf16_prefill_matches_the_reference_over_its_rounded_inputs(self):
        """kernel='bf16' (and 'onednn' and 'amx', the same products through
        oneDNN and on AMX tiles)
        rounds q * scale, k, v and the probabilities to bf16:
        against the fp64 reference over the rounded q, k, v its only extra
        error is P's rounding, at most 2^-8 max|v| per output."""
        kernels = [k for k in ("bf16", "onednn", "amx") if k in lc.prefill_kernels()]  # the same rounded products
        if "bf16" not in kernels:
            with self.assertRaisesRegex(lc.Error, "AVX512-BF16"):
                lc.prefill_attention(lc.KVStore(small_config(), 2, 1, 64), 1, 0, np.zeros((0, 1, 64), np.float32),
                                     kernel="bf16")
        if not kernels:
            self.skipTest("this CPU has no AVX512-BF16 and oneDNN no bf16 matmul: no bf16 prefill kernel runs")
        rng = np.random.default_rng(12)
        bf16 = lambda x: torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).to(torch.float64).numpy()
        for kernel in kernels:
            for head_dim, group in ((64, 1), (128, 4), (256, 2)):
                with self.subTest(kernel=kernel, head_dim=head_dim, group=group):
                    n_kv = 2
                    store = lc.KVStore(small_config(kv_type="f16"), 2, n_kv, head_dim)
                    first, n = 37, 23
                    k, v = rng.standard_normal((2, first + n, n_kv, head_dim))
                    q = rng.standard_normal((n, n_kv * group, head_dim)).astype(np.float32)
                    store.append(1, k.astype(np.float32), v.astype(np.float32))
                    out, lse = lc.prefill_attention(store, 1, first, q, kernel=kernel)
                    scale = np.float32(1 / np.sqrt(np.float32(head_dim)))
                    kr, vr = bf16(rounded(k, "f16")), bf16(rounded(v, "f16"))
                    ends = first + 1 + np.arange(n)
                    want_out, want_lse, tol_out, tol_lse = ref_attention(bf16(q * scale), kr, vr, ends, 1.0)
                    tol_out = tol_out + 2.0 ** -8 * np.abs(vr).max()
                    assert_close(self, out, lse, (want_out, want_lse, tol_out, tol_lse))
                    # Not the f32 kernel's result: the rounding happened.
                    f32_out, _ = lc.prefill_attention(store, 1, first, q, kernel="f32")
                    self.assertGreater(np.abs(out - f32_out).max(), 0)
        with self.assertRaisesRegex(lc.Error, "kernel must be 'auto', 'f32', 'bf16', 'onednn' or 'amx', got 'fp8'"):
            lc.prefill_attention(store, 1, first, q, kernel="fp8")

    def test_auto_prefill_kernel_is_the_one_auto_runs(self):
        auto = lc.auto_prefill_kernel()
        self.assertIn(auto, lc.prefill_kernels())
        rng = np.random.default_rng(13)
        store = lc.KVStore(small_config(kv_type="f16"), 2, 2, 64)
        k, v = rng.standard_normal((2, 50, 2, 64)).astype(np.float32)
        store.append(1, k, v)
        q = rng.standard_normal((10, 4, 64)).astype(np.float32)
        out, lse = lc.prefill_attention(store, 1, 40, q, kernel="auto")
        want_out, want_lse = lc.prefill_attention(store, 1, 40, q, kernel=auto)
        np.testing.assert_array_equal(out, want_out)
        np.testing.assert_array_equal(lse, want_lse)

    def test_prefill_and_decode_match_reference(self):
        rng = np.random.default_rng(11)
        for head_dim in (64, 128, 256):
            for group in (1, 4):
                n_kv, kv_type = 2, "f16"
                heads = n_kv * group
                with self.subTest(head_dim=head_dim, group=group):
                    store = lc.KVStore(small_config(kv_type=kv_type), 2, n_kv, head_dim)
                    first, n = 21, 19  # history ends inside a block, the chunk spans a block boundary
                    k, v = rng.standard_normal((2, first + n, n_kv, head_dim))
                    q = rng.standard_normal((n, heads, head_dim)).astype(np.float32)
                    store.append(1, k[:first].astype(np.float32), v[:first].astype(np.float32))
                    store.append(1, torch.from_numpy(k[first:].astype(np.float32)),
                                 torch.from_numpy(v[first:].astype(np.float32)))
                    kr, vr = rounded(k, kv_type), rounded(v, kv_type)
                    scale = 1 / np.sqrt(head_dim)
                    out, lse = lc.prefill_attention(store, 1, first, q, kernel="f32")
                    self.assertEqual((out.shape, lse.shape, out.dtype), ((n, heads, head_dim), (n, heads), np.float32))
                    assert_close(self, out, lse, ref_attention(q.astype(np.float64), kr, vr, first + 1 + np.arange(n), scale))
                    # An explicit scale, into out= tensors (torch), returned as given.
                    o_t, l_t = torch.empty(n, heads, head_dim), torch.empty(n, heads)
                    res = lc.prefill_attention(store, 1, first, torch.from_numpy(q), scale=0.5, out=o_t, lse=l_t,
                                               kernel="f32")
                    self.assertIs(res[0], o_t)
                    self.assertIs(res[1], l_t)
                    assert_close(self, o_t.numpy(), l_t.numpy(),
                                 ref_attention(q.astype(np.float64), kr, vr, first + 1 + np.arange(n), 0.5))
                    # Queries as a strided view (heads outermost in memory): same results.
                    q_heads_first = torch.from_numpy(np.ascontiguousarray(q.transpose(1, 0, 2))).transpose(0, 1)
                    out_v, lse_v = lc.prefill_attention(store, 1, first, q_heads_first, scale=0.5, kernel="f32")
                    np.testing.assert_array_equal(out_v, o_t.numpy())
                    np.testing.assert_array_equal(lse_v, l_t.numpy())
                    # Dense decode of one query over every token.
                    qd = rng.standard_normal((heads, head_dim)).astype(np.float32)
                    out, lse = lc.dense_decode_attention(store, 1, qd)
                    ref = ref_attention(qd[None].astype(np.float64), kr, vr, [first + n], scale)
                    assert_close(self, out, lse, [r[0] for r in ref])
                    # Explicit spans.
                    spans = [[(0, 3), (17, 30)], [(5, 40)]]
                    out, lse = lc.decode_attention(store, 1, qd, spans)
                    assert_close(self, out, lse, ref_spans(qd.astype(np.float64), kr, vr, spans, scale))
                    # An empty layer: lse -inf, out 0.
                    out, lse = lc.dense_decode_attention(store, 0, qd)
                    self.assertTrue(np.all(lse == -np.inf) and np.all(out == 0))

    def test_empty_inputs(self):
        store = lc.KVStore(small_config(kv_type="f32"), 1, 2, 64)
        store.append(0, np.zeros((0, 2, 64), np.float32), torch.zeros(0, 2, 64))
        self.assertEqual(store.n_tokens(0), 0)
        k = np.ones((4, 2, 64), np.float32)
        store.append(0, k, k)
        out, lse = lc.prefill_attention(store, 0, 4, np.zeros((0, 4, 64), np.float32))
        self.assertEqual((out.shape, lse.shape), ((0, 4, 64), (0, 4)))
        out, lse = lc.merge_attention(np.zeros((0, 8), np.float32), np.zeros(0, np.float32),
                                      np.zeros((0, 8), np.float32), np.zeros(0, np.float32))
        self.assertEqual((out.shape, lse.shape), ((0, 8), (0,)))

    def test_argument_errors(self):
        store = lc.KVStore(small_config(kv_type="f32"), 1, 2, 64)
        k = np.ones((8, 2, 64), np.float32)
        store.append(0, k, k)
        q = np.ones((8, 4, 64), np.float32)
        for call, pattern in [
            (lambda: lc.prefill_attention(store, 0, 0, np.ones((8, 4, 32), np.float32)),
             r"q: expected \[n, n_q_heads, 64\] f32, got \[8, 4, 32\] f32"),
            (lambda: lc.prefill_attention(store, 0, 0, q.astype(np.float16)), r"q: expected .* f32, got .* f16"),
            (lambda: lc.prefill_attention(store, 0, 4, q), r"positions"),
            (lambda: lc.prefill_attention(store, 3, 0, q), r"layer 3"),
            (lambda: lc.prefill_attention(store, 0, 0, np.ones((8, 3, 64), np.float32)), r"multiple|3"),
            (lambda: lc.prefill_attention(store, 0, 0, q, out=np.ones((8, 4, 63), np.float32)), r"out: expected \[8, 4, 64\]"),
            (lambda: lc.prefill_attention(store, 0, 0, q, scale=float("nan")), r"scale"),
            (lambda: lc.dense_decode_attention(store, 0, q), r"q: expected \[n_q_heads, 64\]"),
            (lambda: lc.decode_attention(store, 0, q[0], [[(0, 9)], [(0, 1)]]), r"span"),
            (lambda: lc.decode_attention(store, 0, q[0], [[(0, 1)]]), r"one span list per kv head"),
        ]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(lc.Error, pattern):
                    call()
        with self.assertRaises(TypeError):
            lc.decode_attention(store, 0, q[0], "spans")
        with self.assertRaises(TypeError):
            lc.prefill_attention("store", 0, 0, q)

    def test_merge_attention(self):
        rng = np.random.default_rng(2)
        oa, ob = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
        la, lb = rng.standard_normal((2, 3, 4)).astype(np.float32) * 3
        la[0, 1] = -np.inf  # a empty: b unchanged
        lb[1, 2] = -np.inf  # b empty: a unchanged
        la[2, 3] = lb[2, 3] = -np.inf  # both empty: empty
        out, lse = lc.merge_attention(oa, la, torch.from_numpy(ob), lb)
        self.assertEqual((out.shape, lse.shape), ((3, 4, 8), (3, 4)))
        m = np.maximum(la, lb).astype(np.float64)
        safe = np.where(np.isinf(m), 0, m)
        wa, wb = np.exp(la - safe), np.exp(lb - safe)
        want = (wa[..., None] * oa + wb[..., None] * ob) / np.maximum(wa + wb, 1e-300)[..., None]
        with np.errstate(divide="ignore"):
            want_lse = safe + np.log(wa + wb)
        live = ~np.isinf(m)
        np.testing.assert_allclose(out[live], want[live], atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(lse[live], want_lse[live], atol=1e-6, rtol=1e-6)
        np.testing.assert_array_equal(out[0, 1], ob[0, 1])
        np.testing.assert_array_equal(out[1, 2], oa[1, 2])
        self.assertEqual((lse[0, 1], lse[1, 2]), (lb[0, 1], la[1, 2]))
        self.assertEqual(lse[2, 3], -np.inf)
        self.assertFalse(np.isnan(out).any())
        with self.assertRaisesRegex(lc.Error, r"lse_a: expected \[3, 4\] f32"):
            lc.merge_attention(oa, la[:2], ob, lb)
        with self.assertRaisesRegex(lc.Error, r"contiguous"):
            lc.merge_attention(oa[:, :, ::2], la, ob[:, :, ::2], lb)
        # head_dim 0: no output values, but the lse merge (they were left unwritten).
        empty = np.zeros((3, 0), np.float32)
        out, lse = lc.merge_attention(empty, np.zeros(3, np.float32), empty, np.zeros(3, np.float32))
        self.assertEqual(out.shape, (3, 0))
        np.testing.assert_allclose(lse, np.full(3, np.log(2)), rtol=1e-6)
        bad = la.copy()
        bad[1, 2] = np.nan
        with self.assertRaisesRegex(lc.Error, r"lse_a\[6\] is nan"):
            lc.merge_attention(oa, bad, ob, lb)


class DecodePolicyTest(unittest.TestCase):
    def test_quest_selects_the_needle_block(self):
        cfg = small_config(kv_type="f32", representative_type="QUEST", second_select_num=1, local_windows_len=16,
                           head_select_mode="SEPARATE")
        n_kv, group, d, n_tokens = 2, 2, 64, 200
        store = lc.KVStore(cfg, 1, n_kv, d)
        rng = np.random.default_rng(9)
        k = rng.standard_normal((n_tokens, n_kv, d)) * 0.1
        v = rng.standard_normal((n_tokens, n_kv, d))
        u = np.zeros(d)
        u[:8] = 1
        needles = {0: 5, 1: 9}  # kv head -> block holding keys along u
        for h, b in needles.items():
            k[b * 16: b * 16 + 16, h] += 3 * u
        store.append(0, k.astype(np.float32), v.astype(np.float32))
        policy = lc.DecodePolicy(None, store)
        self.assertEqual(policy.config.second_select_num, 1)
        q = np.tile(u, (n_kv * group, 1)).astype(np.float32)
        out, lse = policy.decode(0, 0, q)
        sel = policy.last_selection()
        self.assertEqual(len(sel), n_kv)
        for h, b in needles.items():
            self.assertTrue(any(s <= b * 16 and b * 16 + 16 <= e for s, e in sel[h]), f"head {h}: {sel[h]}")
            self.assertFalse(any(s <= needles[1 - h] * 16 < e for s, e in sel[h]), f"head {h}: {sel[h]}")
        stats = policy.last_stats()
        self.assertTrue(stats["reselected"])
        self.assertEqual(stats["attended_tokens"], sum(e - s for spans in sel for s, e in spans))
        self.assertLess(stats["attended_tokens"], n_kv * n_tokens)
        self.assertEqual(stats["estimated_mass"], [])  # top_k
        self.assertEqual((stats["tail_mass"], stats["tail_blocks"]), ([], 0))  # tail: drop
        self.assertFalse(stats["speculated"])  # speculate off
        # top_p from a dict: per kv head, the fewest blocks holding half the estimated mass.
        top_p = lc.DecodePolicy(dict(cfg.to_dict(), budget=dict(cfg.to_dict()["budget"], mode="top_p", p=0.5),
                                     head_select_mode="SEPARATE"), store)
        top_p.decode(0, 0, q)
        mass = top_p.last_stats()["estimated_mass"]
        self.assertEqual(len(mass), n_kv)
        self.assertTrue(all(0.5 <= m <= 1.0 for m in mass), mass)
        for h, b in needles.items():
            self.assertTrue(any(s <= b * 16 and b * 16 + 16 <= e for s, e in top_p.last_selection()[h]))
        assert_close(self, out, lse, ref_spans(q.astype(np.float64), k.astype(np.float32).astype(np.float64),
                                               v.astype(np.float32).astype(np.float64), sel, 1 / np.sqrt(d)))
        policy.on_prefill_end(0, np.tile(q, (4, 1, 1)))
        with self.assertRaisesRegex(lc.Error, r"window_q: expected \[w, n_q_heads, 64\]"):
            policy.on_prefill_end(0, q)
        with self.assertRaisesRegex(lc.Error, "layer"):
            policy.decode(3, 0, q)
        # Dense policy from a dict attends everything.
        dense = lc.DecodePolicy(dict(cfg.to_dict(), policy="dense"), store)
        dense.decode(0, 0, q)
        self.assertEqual(dense.last_selection(), [[(0, n_tokens)]] * n_kv)
        with self.assertRaisesRegex(lc.Error, "block_size"):
            lc.DecodePolicy(small_config(block_size=32), store)
        # The model's scale: the same selection, attention at that scale.
        scaled = lc.DecodePolicy(None, store, scale=0.3)
        self.assertAlmostEqual(scaled.scale, 0.3, places=7)
        self.assertEqual(policy.scale, 0.0)
        out, lse = scaled.decode(0, 0, q)
        self.assertEqual(scaled.last_selection(), sel)
        assert_close(self, out, lse, ref_spans(q.astype(np.float64), k.astype(np.float32).astype(np.float64),
                                               v.astype(np.float32).astype(np.float64), sel, 0.3))
        with self.assertRaisesRegex(lc.Error, "attn_scale"):
            lc.DecodePolicy(None, store, scale=-1.0)
        # tail: estimate on a store that keeps the tail sums: the unselected blocks' share is reported.
        tail_cfg = dict(cfg.to_dict(), tail="estimate")
        tail_store = lc.KVStore(tail_cfg, 1, n_kv, d)
        tail_store.append(0, k.astype(np.float32), v.astype(np.float32))
        tailed = lc.DecodePolicy(None, tail_store)
        tailed.decode(0, 0, q)
        st = tailed.last_stats()
        self.assertEqual(len(st["tail_mass"]), n_kv)
        self.assertTrue(all(0.0 < m < 1.0 for m in st["tail_mass"]), st["tail_mass"])
        self.assertGreater(st["tail_blocks"], 0)
        with self.assertRaisesRegex(lc.Error, "tail"):
            lc.DecodePolicy(tail_cfg, store)  # the store has no tail sums


class LayerAttentionTest(unittest.TestCase):
    """longctx.LayerAttention runs what the parts do: the same results as
    KVStore.append + prefill_attention, DecodePolicy.on_prefill_end +
    decode on a second store fed the same tokens."""

    def test_matches_the_parts_and_checks_its_inputs(self):
        cfg = small_config(kv_type="f16", representative_type="QUEST", second_select_num=2, local_windows_len=16)
        n_kv, group, d = 2, 2, 64
        rng = np.random.default_rng(11)
        step = lc.KVStore(cfg, 2, n_kv, d)
        parts = lc.KVStore(cfg, 2, n_kv, d)
        attention = lc.LayerAttention(None, step, scale=0.2)
        policy = lc.DecodePolicy(None, parts, scale=0.2)
        self.assertAlmostEqual(attention.scale, 0.2, places=7)
        q_all = rng.standard_normal((300, n_kv * group, d)).astype(np.float32)
        k_all = rng.standard_normal((300, n_kv, d)).astype(np.float32)
        v_all = rng.standard_normal((300, n_kv, d)).astype(np.float32)
        for layer in range(2):
            for s, e in ((0, 128), (128, 250)):  # two chunks
                out, lse = attention.prefill_chunk(layer, s, q_all[s:e], k_all[s:e], v_all[s:e])
                parts.append(layer, k_all[s:e], v_all[s:e])
                want, want_lse = lc.prefill_attention(parts, layer, s, q_all[s:e], 0.2, kernel=cfg.prefill_kernel)
                np.testing.assert_array_equal(out, want)
                np.testing.assert_array_equal(lse, want_lse)
            attention.end_prefill(layer, q_all[250 - 8:250])
            policy.on_prefill_end(layer, q_all[250 - 8:250])
        for i, t in enumerate(range(250, 260)):  # decode steps: the step index is counted per layer
            for layer in range(2):
                out, lse = attention.decode(layer, q_all[t], k_all[t:t + 1], v_all[t:t + 1])
                parts.append(layer, k_all[t:t + 1], v_all[t:t + 1])
                want, want_lse = policy.decode(layer, i, q_all[t])
                np.testing.assert_array_equal(out, want)
                np.testing.assert_array_equal(lse, want_lse)
                self.assertEqual(attention.last_selection(), policy.last_selection())
                self.assertEqual(attention.last_stats(), policy.last_stats())
        self.assertEqual(step.n_tokens(1), 260)
        # Errors name what is wrong and append nothing.
        with self.assertRaisesRegex(lc.Error, "starts at position 100 but layer 0 holds 260"):
            attention.prefill_chunk(0, 100, q_all[:2], k_all[:2], v_all[:2])
        with self.assertRaisesRegex(lc.Error, r"k: expected \[2, 2, 64\]"):
            attention.prefill_chunk(0, 260, q_all[:2], k_all[:3], v_all[:2])
        with self.assertRaisesRegex(lc.Error, "layer 5"):
            attention.decode(5, q_all[0], k_all[:1], v_all[:1])
        self.assertEqual(step.n_tokens(0), 260)
        with self.assertRaisesRegex(lc.Error, "block_size"):
            lc.LayerAttention(small_config(block_size=32), step)
        # restart: a new sequence over the cleared store.
        step.clear()
        attention.restart()
        out, _ = attention.prefill_chunk(0, 0, q_all[:5], k_all[:5], v_all[:5])
        self.assertEqual(out.shape, (5, n_kv * group, d))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    n_bad = len({getattr(t, "test_case", t).id() for t, _ in result.failures + result.errors})
    print(f"test_bindings: {result.testsRun - n_bad} passed, {n_bad} failed")
    sys.exit(0 if result.wasSuccessful() else 1)
