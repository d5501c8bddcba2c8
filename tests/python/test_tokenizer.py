"""longctx.Tokenizer: the tokenizer of a GGUF file from its tokenizer.* keys
alone. On llama.cpp b4747's vocabulary-only test files (VOCAB_DIR: ggml-vocab-*
.gguf with .inp inputs and the .out ids of the family's Hugging Face
tokenizer; skipped when the directory is missing) every case gives the
expected ids, as `longctx-info FILE --tokenize TEXT --no-bos --no-special`
does; on a model file it tokenizes as longctx.Model; unknown pre-tokenizer
names and missing files raise longctx.Error naming them.

Runs as a script (ctest: /usr/bin/python3 with PYTHONPATH=<build>/python,
LONGCTX_BIN_DIR, LONGCTX_SOURCE_DIR and LONGCTX_VOCAB_DIR set) or under pytest.
"""
import glob
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

from longctx import _core as lc

from _env import BIN_DIR, SOURCE_DIR, VOCAB_DIR

TMP = None


def setUpModule():
    global TMP
    TMP = tempfile.mkdtemp(prefix="longctx-py-tokenizer-")


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


def vocab_files():
    """(gguf path, inputs, expected ids) of every family whose vocabulary is here."""
    out = []
    for gguf in sorted(glob.glob(os.path.join(VOCAB_DIR, "ggml-vocab-*.gguf"))):
        with open(gguf + ".inp", "rb") as f:
            raw = f.read().decode("utf-8")
        inputs = raw.split("\n__ggml_vocab_test__\n")
        if inputs and inputs[-1] == "":
            inputs.pop()  # the text after the last separator
        with open(gguf + ".out", encoding="utf-8") as f:
            ids = [[int(x) for x in line.split()] for line in f.read().splitlines()]
        out.append((gguf, inputs, ids))
    return out


def gguf_bytes(kv):
    """A GGUF v3 file with metadata `kv` (str, bool, int as u32, list of str) and no tensors."""
    def text(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    body = b""
    for key, value in kv.items():
        body += text(key)
        if isinstance(value, bool):
            body += struct.pack("<IB", 7, value)
        elif isinstance(value, int):
            body += struct.pack("<II", 4, value)
        elif isinstance(value, str):
            body += struct.pack("<I", 8) + text(value)
        else:
            body += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(text(v) for v in value)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + body
    return data + b"\0" * (-len(data) % 32)


def write_vocab(name, pre):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(gguf_bytes({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                            "tokenizer.ggml.tokens": ["a", "b", "c", "1", "ab", "abc"],
                            "tokenizer.ggml.merges": ["a b", "ab c"]}))
    return path


class TokenizerTest(unittest.TestCase):
    def test_llama_cpp_vocab_files(self):
        files = vocab_files()
        if not os.path.isdir(VOCAB_DIR):
            self.skipTest(f"no vocab directory {VOCAB_DIR}")
        self.assertGreater(len(files), 0, f"no ggml-vocab-*.gguf in {VOCAB_DIR}")
        for gguf, inputs, want in files:
            with self.subTest(vocab=os.path.basename(gguf)):
                self.assertEqual(len(inputs), len(want))
                tok = lc.Tokenizer(pathlib.Path(gguf))  # os.PathLike as well as str
                for i, text in enumerate(inputs):
                    self.assertEqual(tok.tokenize(text, add_bos=False, parse_special=False), want[i],
                                     f"case {i} {text!r}")

    def test_cli_tokenize_matches(self):
        if not os.path.isdir(VOCAB_DIR):
            self.skipTest(f"no vocab directory {VOCAB_DIR}")
        info = os.path.join(BIN_DIR, "longctx-info")
        for gguf, inputs, want in vocab_files():
            for i in (0, 1, 4, 10, 11, 17, 25, 33):  # non-ASCII, spaces, newlines, emoji, digits
                with self.subTest(vocab=os.path.basename(gguf), case=i):
                    p = subprocess.run([info, gguf, "--tokenize", inputs[i], "--no-bos", "--no-special"],
                                       capture_output=True, text=True, timeout=120)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    self.assertEqual([int(x) for x in p.stdout.split()], want[i])

    def test_properties_and_round_trip(self):
        if not os.path.isdir(VOCAB_DIR):
            self.skipTest(f"no vocab directory {VOCAB_DIR}")
        spm = lc.Tokenizer(os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf"))
        self.assertEqual((spm.kind, spm.pre_tokenizer, spm.n_vocab, spm.bos, spm.eos), ("spm", None, 32000, 1, 2))
        ids = spm.tokenize("Hello world")
        self.assertEqual(ids[0], spm.bos)
        self.assertEqual(spm.detokenize(ids), "Hello world")
        self.assertEqual(spm.tokenize("<s>x", add_bos=False)[0], spm.bos)  # parse_special by default
        self.assertTrue(spm.is_end_of_generation(spm.eos))
        falcon = lc.Tokenizer(os.path.join(VOCAB_DIR, "ggml-vocab-falcon.gguf"))
        self.assertEqual((falcon.kind, falcon.pre_tokenizer), ("bpe", "falcon"))
        text = "Hello, world!!! 12345 \u00e9\u4e2d"
        self.assertEqual(falcon.detokenize(falcon.tokenize(text)), text)
        self.assertEqual(b"".join(falcon.token_bytes(i) for i in falcon.tokenize(text)), text.encode("utf-8"))
        self.assertIn("ggml-vocab-falcon.gguf", repr(falcon))

    def test_same_as_model(self):
        demo = os.path.join(TMP, "demo.gguf")
        p = subprocess.run([os.path.join(BIN_DIR, "longctx-make-demo"), "--out", demo], capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        config = lc.Config.load(os.path.join(SOURCE_DIR, "configs", "demo.yaml"), ["max_seq_len=4096"])
        model = lc.Model(demo, config)
        tok = lc.Tokenizer(demo)
        self.assertEqual((tok.n_vocab, tok.bos, tok.eos), (model.n_vocab, model.bos, model.eos))
        for text in ("The pass key is 12345.", "<s>a</s> b", "", "  \n\t x"):
            for add_bos in (True, False):
                for special in (True, False):
                    self.assertEqual(tok.tokenize(text, add_bos, special), model.tokenize(text, add_bos, special))

    def test_pre_tokenizer_names(self):
        tok = lc.Tokenizer(write_vocab("r1.gguf", "deepseek-r1-qwen"))
        self.assertEqual(tok.pre_tokenizer, "qwen2")  # the rules of the name
        self.assertEqual(tok.tokenize("abc1", add_bos=False), [5, 3])
        self.assertEqual(lc.Tokenizer(write_vocab("absent.gguf", "")).pre_tokenizer, "default")
        for bad in ("gpt2", "llama4"):
            with self.assertRaisesRegex(lc.Error, f"{bad}.gguf.*tokenizer.ggml.pre '{bad}'"):
                lc.Tokenizer(write_vocab(bad + ".gguf", bad))

    def test_errors(self):
        with self.assertRaisesRegex(lc.Error, "missing.gguf"):
            lc.Tokenizer(os.path.join(TMP, "missing.gguf"))
        with self.assertRaises(TypeError):
            lc.Tokenizer(42)
        tok = lc.Tokenizer(write_vocab("ok.gguf", "qwen2"))
        with self.assertRaises(lc.Error):
            tok.token_text(6)
        with self.assertRaises(TypeError):
            tok.detokenize("ab")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    n_bad = len({getattr(t, "test_case", t).id() for t, _ in result.failures + result.errors})
    print(f"test_tokenizer: {result.testsRun - n_bad} passed, {n_bad} failed")
    sys.exit(0 if result.wasSuccessful() else 1)
