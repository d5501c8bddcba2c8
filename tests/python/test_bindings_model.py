"""longctx._core's model runner and GGUF readers: Model.generate gives
longctx-chat's answers (same prompt segments, config and sampler) on the
embedded demo model, logits match the NumPy reference forward pass
(tools/reference/llama_ref.py) on a generated model, read_gguf_* match the
reference's own GGUF parser, and wrong input raises clean errors.

Runs as a script (ctest: /usr/bin/python3 with PYTHONPATH=<build>/python,
LONGCTX_BIN_DIR and LONGCTX_SOURCE_DIR set) or under pytest.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np

from longctx import _core as lc

from _env import BIN_DIR, SOURCE_DIR

DEMO_CONFIG = os.path.join(SOURCE_DIR, "configs", "demo.yaml")
QUESTION = "What is the pass key?"
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools", "reference"))
import llama_ref as ref  # noqa: E402

TMP = None  # set up once: demo model, haystack, generated models


def setUpModule():
    global TMP
    TMP = tempfile.mkdtemp(prefix="longctx-py-model-")
    run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", path("demo.gguf")])
    run([os.path.join(BIN_DIR, "longctx-make-haystack"), "--tokens", "1024", "--depth", "0.4", "--seed", "3",
         "--no-question", "--out", path("doc.txt"), "--json", path("doc.json")])
    for preset in ("gqa-128", "q8", "f16", "qwen2-yarn"):
        run([os.path.join(BIN_DIR, "longctx-make-model"), "--preset", preset, "--seed", "4", "--out",
             path(preset + ".gguf")])
    run([os.path.join(BIN_DIR, "longctx-make-model"), "--preset", "gqa-128", "--seed", "4", "--attn-scale", "0.05",
         "--out", path("gqa-128-scale.gguf")])


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def pass_key():
    with open(path("doc.json")) as f:
        return json.load(f)["key"]


def path(name):
    return os.path.join(TMP, name)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    if p.returncode != 0 or "Sanitizer" in p.stderr or "runtime error:" in p.stderr:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return p.stdout, p.stderr


def chat(*args):
    """longctx-chat's answer (stdout) and its [stats] prefill and n_past counts."""
    out, err = run([os.path.join(BIN_DIR, "longctx-chat"), "--config", DEMO_CONFIG, "--set", "max_seq_len=8192",
                    "--model", path("demo.gguf"), "--prompt-file", path("doc.txt"), "--prompt", QUESTION, *args])
    stats = [line for line in err.splitlines() if line.startswith("[stats]")][0]
    prefill = int(stats.split("| prefill ")[1].split()[0])
    n_past = int(stats.split(" for ")[1].split()[0])
    return out, prefill, n_past


def demo_model(*overrides):
    return lc.Model(path("demo.gguf"), lc.Config.load(DEMO_CONFIG, ["max_seq_len=8192", *overrides]))


def document():
    with open(path("doc.txt")) as f:
        return f.read().strip()


def chat_segments(model, raw=False):
    """The two segments longctx-chat prefills for --prompt-file/--prompt: the
    context (template header + document) and the question's rest."""
    doc = document()
    if raw:
        return doc, "\n\n" + QUESTION
    text = model.apply_chat_template([{"role": "user", "content": doc + "\n\n" + QUESTION}])
    cut = text.index(doc) + len(doc)
    return text[:cut], text[cut:]


class ChatParityTest(unittest.TestCase):
    def test_generate_equals_longctx_chat(self):
        key = pass_key()
        m = demo_model()
        self.assertEqual(m.chat_template, "llama2")
        for raw, extra in ((False, []), (True, ["--raw"])):
            with self.subTest(raw=raw):
                want, chat_prefill, chat_n_past = chat(*extra)
                m.reset()
                prefilled_before = m.stats["prefill_tokens"]  # stats survive reset()
                context, question = chat_segments(m, raw)
                self.assertEqual(m.generate(context, max_tokens=0), "")  # prefill only
                got = m.generate(question)
                self.assertEqual(got + "\n", want)
                self.assertEqual(got.strip(), key)
                self.assertEqual(m.stats["stop_reason"], "end of generation")
                self.assertEqual(len(m.last_generated_tokens), len(key) + 1)  # "▁" and the digits
                self.assertEqual(m.n_past, chat_n_past)
                self.assertEqual(m.stats["prefill_tokens"] - prefilled_before, chat_prefill)
        # The whole rendered prompt at once gives the same answer.
        m.reset()
        self.assertEqual(m.generate("".join(chat_segments(m))).strip(), key)

    def test_sampling_equals_longctx_chat(self):
        want = chat("--temperature", "1.5", "--set", "sampling.seed=7", "--set", "sampling.top_k=0",
                    "--set", "sampling.top_p=1", "--max-tokens", "8")[0]
        m = demo_model()
        context, question = chat_segments(m)
        m.generate(context, max_tokens=0)
        got = m.generate(question, temperature=1.5, seed=7, top_k=0, top_p=1.0, max_tokens=8)
        self.assertEqual(got + "\n", want)
        m.reset()
        m.generate(context, max_tokens=0)
        self.assertEqual(m.generate(question, temperature=1.5, seed=7, top_k=0, top_p=1.0, max_tokens=8), got)

    def test_streaming_tokens_and_continuation(self):
        m = demo_model()
        context, question = chat_segments(m)
        pieces = []
        text = m.generate(context + question, on_token=lambda i, t: pieces.append((i, t)))
        self.assertEqual("".join(t for _, t in pieces), text)
        self.assertEqual([i for i, _ in pieces], m.last_generated_tokens)
        self.assertEqual("".join(m.token_text(i) for i in m.last_generated_tokens), text)
        n_past = m.n_past
        m.reset()
        self.assertEqual(m.n_past, 0)
        got = []
        m.generate(context + question, on_token=lambda i, t: got.append(i) or False)
        self.assertEqual(len(got), 1, "returning False stops")
        self.assertEqual(m.stats["stop_reason"], "stopped by on_token")
        self.assertEqual(m.n_past, n_past - len(pieces) + 1, "the generated token is in the cache")
        with self.assertRaises(ZeroDivisionError):
            m.generate(None, on_token=lambda i, t: 1 / 0)
        with self.assertRaises(TypeError):
            m.generate(None, on_token=3)

    def test_kv_snapshot_through_model_store(self):
        key = pass_key()
        m = demo_model()
        context, question = chat_segments(m)
        m.generate(context, max_tokens=0)
        n_context = m.n_past
        self.assertEqual(m.store.n_tokens(0), n_context)
        self.assertEqual(m.store.shape, (2, 5, 32))
        snap = path("context.kv")
        m.store.save(snap, m.fingerprint)
        with self.assertRaisesRegex(lc.Error, "Model.store"):
            m.store.append(0, np.zeros((1, 5, 32), np.float32), np.zeros((1, 5, 32), np.float32))
        other = demo_model()
        other.store.load(snap, m.fingerprint)
        self.assertEqual(other.n_past, n_context)
        # A plain store's snapshot whose layers differ in length: refused before
        # the model's store is touched (a sequence holds as many in every layer).
        uneven = lc.KVStore(lc.Config.load(DEMO_CONFIG), 2, 5, 32)
        kv = np.random.default_rng(5).standard_normal((20, 5, 32), dtype=np.float32)
        uneven.append(0, kv, kv)
        uneven.append(1, kv[:10], kv[:10])
        uneven.save(path("uneven.kv"), m.fingerprint)
        with self.assertRaisesRegex(lc.Error, "layer 1 holds 10 tokens, layer 0 holds 20"):
            other.store.load(path("uneven.kv"), m.fingerprint)
        self.assertEqual(other.n_past, n_context)
        self.assertEqual(other.store.n_tokens(1), n_context)
        self.assertEqual(other.generate(question).strip(), key)
        other.store.clear()
        self.assertEqual(other.n_past, 0)
        with self.assertRaisesRegex(lc.Error, "nothing to continue"):
            other.generate(None)

    def test_releases_the_gil(self):
        m = demo_model()
        tokens = m.tokenize(document())
        worker = threading.Thread(target=m.prefill, args=(tokens,))
        ticks = 0
        worker.start()
        while worker.is_alive():
            ticks += 1
        worker.join()
        self.assertEqual(m.n_past, len(tokens))
        self.assertGreater(ticks, 1000, "Python ran while the prefill computed")


class ModelApiTest(unittest.TestCase):
    def test_tokenizer_and_template(self):
        m = demo_model()
        ids = m.tokenize("The pass key is 123.")
        self.assertEqual(ids[0], m.bos)
        self.assertEqual(m.detokenize(ids), "The pass key is 123.")
        self.assertNotIn(m.bos, m.tokenize("The", add_bos=False))
        self.assertEqual("".join(m.token_text(i) for i in ids[1:]).strip(), "The pass key is 123.")
        self.assertEqual(m.token_bytes(ids[-1]), m.token_text(ids[-1]).encode())
        self.assertTrue(m.is_end_of_generation(m.eos))
        self.assertEqual((m.n_vocab, m.n_layers), (618, 2))
        self.assertEqual(m.spec["n_kv_heads"], 5)
        self.assertEqual(m.config.block_size, 16)
        text = m.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
        self.assertTrue(text.startswith("<s>[INST] <<SYS>>"), text)
        self.assertEqual(m.apply_chat_template([{"role": "user", "content": "U"}], template="raw"), "U")
        with self.assertRaisesRegex(lc.Error, "alternat|role"):
            m.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        with self.assertRaises(TypeError):
            m.apply_chat_template([{"role": "user"}])
        with self.assertRaises(TypeError):
            m.apply_chat_template("hello")
        with self.assertRaisesRegex(lc.Error, "nope"):
            m.apply_chat_template([{"role": "user", "content": "a"}], template="nope")

    def test_errors(self):
        with self.assertRaisesRegex(lc.Error, "missing.gguf"):
            lc.Model(path("missing.gguf"))
        truncated = path("truncated.gguf")
        with open(path("demo.gguf"), "rb") as f:
            head = f.read(5000)
        with open(truncated, "wb") as f:
            f.write(head)
        with self.assertRaisesRegex(lc.Error, "truncated.gguf"):
            lc.Model(truncated)
        with self.assertRaisesRegex(lc.Error, "truncated.gguf"):
            lc.read_gguf_tensors(truncated)
        with self.assertRaisesRegex(lc.Error, "no model file"):
            lc.Model(None, {"model": {"path": ""}})
        with self.assertRaises(TypeError):
            lc.Model(path("demo.gguf"), 42)
        with self.assertRaisesRegex(lc.Error, "max_seq_len|budget|bytes"):
            lc.Model(path("demo.gguf"), {"dram_budget": "64KiB"})
        m = demo_model("max_seq_len=256", "local_windows_len=64")
        for call, pattern in [(lambda: m.prefill([]), "no tokens"),
                              (lambda: m.prefill([1, 99999]), "99999"),
                              (lambda: m.decode(-1), "-1"),
                              (lambda: m.prefill([5] * 300), "max_seq_len"),
                              (lambda: m.generate("x", max_tokens=-1), "max_tokens"),
                              (lambda: m.generate("x", temperature=-1.0), "temperature"),
                              (lambda: m.generate("x", top_p=2.0), "top_p"),
                              (lambda: m.token_text(618), "618")]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(lc.Error, pattern):
                    call()
                self.assertEqual(m.n_past, 0, "a refused call leaves the sequence as it was")
        with self.assertRaises(TypeError):
            m.prefill("abc")
        with self.assertRaises(TypeError):
            m.prefill([2 ** 40])
        # The context fills up: generation stops, no error.
        m.prefill([5] * 250)
        text = m.generate([7] * 5, max_tokens=10, stop_at_eos=False)
        self.assertEqual(m.stats["stop_reason"], "max_seq_len reached")
        self.assertEqual(m.n_past, 256)
        self.assertEqual(len(m.last_generated_tokens), 2)  # the second one has no room in the cache
        self.assertIsInstance(text, str)


def tolerance(model, n_tokens):
    """Max |logit - reference| / rms(reference logits) for an f32 model and
    KV store (tests/python/test_model_reference.py derives it): 8 u32
    sqrt(K) per sequential dot-product stage."""
    k = max(model.w["token_embd.weight"].shape[1], model.n_heads * model.head_dim,
            model.w["blk.0.ffn_down.weight"].shape[1], n_tokens)
    return 8 * 2.0 ** -24 * math.sqrt(k) * (6 * model.n_layers + 1)


class ReferenceTest(unittest.TestCase):
    def test_logits_match_the_numpy_reference(self):
        """Prefill and decode; gqa-128-scale's llama.attention.scale (0.05, not
        1/sqrt(128)) in both, with dense decode and with the select policy
        (every block selected); qwen2-yarn's YaRN RoPE at decode positions."""
        dense = {"kv_type": "f32", "policy": "dense", "max_seq_len": 1024, "local_windows_len": 64,
                 "initial_len": 4, "block_size": 16, "prefill_kernel": "f32"}
        select = dict(dense, policy="select", dense_layer_num=0, second_select_num=64, local_windows_len=4)
        for name, config in (("gqa-128", dense), ("gqa-128-scale", dense), ("gqa-128-scale", select),
                             ("qwen2-yarn", dense)):
            with self.subTest(model=name, policy=config["policy"]):
                want_model = ref.Model.load(path(name + ".gguf"))
                n_vocab = want_model.w["token_embd.weight"].shape[0]
                tokens = [int(t) for t in np.random.default_rng(1).integers(0, n_vocab, 40)]
                want = ref.forward(want_model, tokens)
                m = lc.Model(path(name + ".gguf"), config)
                self.assertAlmostEqual(m.spec["attn_scale"], 0.05 if name.endswith("scale") else 0.0)
                self.assertEqual(m.spec["rope_scaling"], "yarn" if name == "qwen2-yarn" else "none")
                if name == "qwen2-yarn":
                    self.assertEqual((m.spec["rope_factor"], m.spec["rope_original_context"]), (4.0, 32768))
                    self.assertAlmostEqual(m.spec["rope_magnitude"], 1 + 0.1 * math.log(4), places=6)
                got = [m.prefill(tokens[:8])]
                got += [m.decode(t) for t in tokens[8:]]
                rms = np.sqrt(np.mean(want[7:] ** 2, axis=-1))
                err = np.max(np.abs(np.array(got) - want[7:]), axis=-1) / rms
                self.assertLess(err.max(), tolerance(want_model, len(tokens)))
                self.assertEqual(m.n_past, len(tokens))

    def test_read_gguf_matches_reference_parser(self):
        for preset in ("gqa-128", "q8", "f16"):
            with self.subTest(preset=preset):
                want_meta, want = ref.read_gguf(path(preset + ".gguf"))
                got = lc.read_gguf_tensors(path(preset + ".gguf"))
                self.assertEqual(sorted(got), sorted(want))
                for name, w in want.items():
                    self.assertEqual(got[name].shape, w.shape, name)
                    self.assertEqual(got[name].dtype, np.float32)
                    np.testing.assert_array_equal(got[name].astype(np.float64), w, err_msg=name)
                meta = lc.read_gguf_metadata(path(preset + ".gguf"))
                self.assertEqual(meta, want_meta)
        some = lc.read_gguf_tensors(path("q8.gguf"), names=["output_norm.weight"])
        self.assertEqual(list(some), ["output_norm.weight"])
        with self.assertRaisesRegex(lc.Error, "nope"):
            lc.read_gguf_tensors(path("q8.gguf"), names=["nope"])
        with self.assertRaisesRegex(lc.Error, "missing"):
            lc.read_gguf_metadata(path("missing.gguf"))
        with self.assertRaisesRegex(lc.Error, "doc.txt"):
            lc.read_gguf_metadata(path("doc.txt"))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    n_bad = len({getattr(t, "test_case", t).id() for t, _ in result.failures + result.errors})
    print(f"test_bindings_model: {result.testsRun - n_bad} passed, {n_bad} failed")
    sys.exit(0 if result.wasSuccessful() else 1)
