"""longctx.torch: SparseAttention, a drop-in replacement for a Hugging
Face-style attention module whose K/V live in a longctx KV store.

    import longctx, longctx.torch
    longctx.inject(model, "configs/inject/llama.yaml")   # or SparseAttention(attn, config)

The module keeps the original q/k/v/o projections (the same Linear objects,
so the state_dict keys do not change) and per forward, for one sequence
(batch 1):
  - q, k, v = projections (+ bias) of hidden_states in the model's dtype,
    rotary embedding from position_embeddings=(cos, sin) or the module's
    own rotary_emb(x, position_ids) (HF's "halves" layout);
  - then the session's longctx.LayerAttention, the C++ step longctx-chat
    runs on its CPU path (scheduler/layer_attention.h), does the rest:
  - a forward of n > 1 tokens (or one token at position 0) is a prefill:
    per chunk of chunk_size tokens, prefill_chunk appends the chunk's K/V
    and attends its queries over every earlier token and the chunk causally
    (QUOKA's restricted history when quoka.enabled); then end_prefill gives
    the policy the last preselect.window queries;
  - a forward of one token is a decode step: decode appends its K/V and
    attends what the config selects (local window included).
Both score with the module's `scaling` (default head_dim ** -0.5), which the
session's LayerAttention is built with.

On a CUDA device (the module's tensors there, this longctx built with CUDA,
config `model.backend` auto or cuda) the same step runs with the device half
that longctx-chat's GPU path runs (scheduler/device_layer_attention.h): the
prefill chunks and the decode local window are attended on the GPU, straight
from the module's tensors and in order with torch's current stream; the rest
of a decode step (selection and sparse attention over the KV store) runs on
the CPU and the two parts are merged on the GPU. Configs the device path does
not run (kv_type q8_0 or f32, head_dim other than 64/128/256, policy h2o,
quoka) take the CPU path under `model.backend: auto` (Session.cuda_declined
says why) and are refused under `cuda`. `model.backend: cpu` always attends
on the CPU, copying the tensors there and back.
Positions come from position_ids, else cache_position, else continue the
store. Position 0 starts a new sequence (the store is cleared); any other
first position must be the number of tokens the store holds for the layer.
The engine computes in f32 (q handed over zero-copy through DLPack); the
output returns in the input's dtype and device. Inference only: no
gradient flows through the attention. The caller's KV cache
(past_key_value) is ignored (returned as given to attention modules of
transformers < 4.48, which return three values): longctx's store is the cache.

This file is named torch.py inside the package; `import torch` below is an
absolute import of PyTorch (Python 3 has no implicit relative imports).
"""
from __future__ import annotations

import inspect
import os

import torch
from torch import nn

from . import _core

__all__ = ["SparseAttention", "Session"]

# Children of an attention module that SparseAttention knows how to use.
_KNOWN_CHILDREN = ("q_proj", "k_proj", "v_proj", "o_proj", "rotary_emb", "q_norm", "k_norm")


def _as_config(config):
    if isinstance(config, _core.Config):
        return config
    if config is None:
        return _core.Config()
    if isinstance(config, (str, os.PathLike)):
        return _core.Config.load(os.fspath(config))
    if isinstance(config, dict):
        return _core.Config.from_dict(config)
    raise TypeError(f"config: expected a longctx.Config, a YAML path, a dict or None, got {type(config).__name__}")


class Session:
    """What the SparseAttention modules of one model share: the config, the
    attention scale, the KV store (created on first use: n_layers x
    n_kv_heads x head_dim) and the LayerAttention over it (policy state and
    each layer's decode step)."""

    def __init__(self, config, n_layers, scale):
        self.config = _as_config(config)
        self.n_layers = n_layers
        self.scale = scale
        self.store = None
        self.attention = None
        self.window = int(self.config.to_dict()["preselect"]["window"])
        self.backend = str(self.config.to_dict()["model"]["backend"]).lower()
        self.cuda_device = None  # the torch.device attention runs on when it takes the CUDA path
        self.cuda_declined = ""  # why it does not, when the tensors are on CUDA

    def ensure_store(self, n_kv_heads, head_dim, n_heads, device):
        """The store (made on first use) and the path: the CUDA path when the
        tensors are on a CUDA device and model.backend allows it."""
        if self.store is None:
            store = _core.KVStore(self.config, self.n_layers, n_kv_heads, head_dim)
            attention = _core.LayerAttention(self.config, store, scale=self.scale)
            self.cuda_device, self.cuda_declined = self._choose_path(attention, n_heads, device)
            self.store, self.attention = store, attention
        elif tuple(self.store.shape) != (self.n_layers, n_kv_heads, head_dim):
            raise ValueError(f"longctx.torch: a module with {n_kv_heads} kv heads of {head_dim} shares the KV "
                             f"store of shape {tuple(self.store.shape)} (n_layers, n_kv_heads, head_dim)")
        if self.cuda_device is not None and device != self.cuda_device:
            raise ValueError(f"longctx.torch: the attention runs on {self.cuda_device}, but a module's tensors "
                             f"are on {device}; keep the model on one device")
        return self.store

    def _choose_path(self, attention, n_heads, device):
        if self.backend == "cpu" or (device.type != "cuda" and self.backend == "auto"):
            return None, ""
        if device.type != "cuda":
            raise ValueError(f"longctx.torch: model.backend is cuda but the module's tensors are on {device}")
        why = attention.cuda_declined()
        if why:
            if self.backend == "cuda":
                raise ValueError(f"longctx.torch: model.backend is cuda, but attention cannot run there: {why}")
            return None, why
        index = device.index if device.index is not None else torch.cuda.current_device()
        attention.use_cuda(n_heads, index)
        return torch.device("cuda", index), ""

    def n_tokens(self, layer):
        return 0 if self.store is None else self.store.n_tokens(layer)

    def new_sequence(self):
        """Drops every token and the policy's state."""
        if self.store is not None:
            self.store.clear()
            self.attention.restart()

    def release(self):
        self.store = self.attention = self.cuda_device = None


def _attr(obj, *names):
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SparseAttention(nn.Module):
    """Hugging Face-style attention over a longctx KV store (module docstring).

    orig: the attention module (q_proj, k_proj, v_proj, o_proj; optional
    rotary_emb, q_norm/k_norm). config: longctx.Config, YAML path, dict or
    None (defaults). layer_idx: the layer in the store (inject assigns it in
    walk order). chunk_size: prefill chunk, default config.chunk_size.
    session: a Session shared with other layers (inject creates one per model;
    else a private one of layer_idx + 1 layers is made on first use)."""

    def __init__(self, orig, config=None, layer_idx=None, chunk_size=None, session=None):
        super().__init__()
        # Return what the replaced module returned: transformers < 4.48 attention
        # (it takes output_attentions) gives (out, weights, past_key_value), later ones (out, weights).
        self._returns_cache = "output_attentions" in inspect.signature(orig.forward).parameters
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(orig, name, None), nn.Module):
                raise ValueError(f"SparseAttention: {type(orig).__name__} has no module '{name}' (expected a "
                                 "Hugging Face-style attention module with q_proj, k_proj, v_proj, o_proj)")
        for name, child in orig.named_children():
            if name not in _KNOWN_CHILDREN and not isinstance(child, nn.Dropout):
                raise ValueError(f"SparseAttention: {type(orig).__name__} has a submodule '{name}' "
                                 f"that longctx does not know how to apply (known: {', '.join(_KNOWN_CHILDREN)})")
            setattr(self, name, child)  # the same objects: the state_dict keys are unchanged
        hf = getattr(orig, "config", None)
        self.num_heads = int(_attr(orig, "num_heads") or _attr(hf, "num_attention_heads") or 0)
        self.head_dim = int(_attr(orig, "head_dim") or _attr(hf, "head_dim") or
                            (_attr(hf, "hidden_size") or 0) // max(self.num_heads, 1))
        self.num_key_value_heads = int(_attr(orig, "num_key_value_heads") or _attr(hf, "num_key_value_heads")
                                       or self.num_heads)
        if self.num_heads <= 0 or self.head_dim <= 0:
            raise ValueError(f"SparseAttention: cannot tell the head count and head_dim of {type(orig).__name__} "
                             "(expected config.num_attention_heads / head_dim or module attributes)")
        for name, heads in (("q_proj", self.num_heads), ("k_proj", self.num_key_value_heads),
                            ("v_proj", self.num_key_value_heads)):
            features = getattr(getattr(self, name), "out_features", heads * self.head_dim)
            if features != heads * self.head_dim:
                raise ValueError(f"SparseAttention: {name} has {features} outputs, expected {heads} heads x "
                                 f"{self.head_dim}")
        if self.num_heads % self.num_key_value_heads:
            raise ValueError(f"SparseAttention: {self.num_heads} query heads is not a multiple of "
                             f"{self.num_key_value_heads} kv heads")
        self.scaling = float(_attr(orig, "scaling") or self.head_dim ** -0.5)
        if hf is not None:
            self.config = hf  # HF code may read module.config
        self.longctx_config = _as_config(config)
        self.layer_idx = layer_idx
        self.chunk_size = int(chunk_size or self.longctx_config.chunk_size)
        self.__dict__["original"] = orig  # not a child: the projections are registered once
        self.__dict__["_session"] = session

    # ---- binding (longctx.inject) ----

    @classmethod
    def longctx_bind(cls, modules):
        """One Session for `modules` (walk order = store layer order)."""
        config, scale = modules[0].longctx_config, modules[0].scaling
        for i, m in enumerate(modules):
            if m.longctx_config != config:
                raise ValueError(f"SparseAttention: injected module {i} has a different longctx config than "
                                 "module 0; every injected layer of a model shares one KV store and one config")
            if m.scaling != scale:
                raise ValueError(f"SparseAttention: injected module {i} has scaling {m.scaling}, module 0 has "
                                 f"{scale}; every injected layer of a model shares one decode policy and one scale")
        session = Session(config, len(modules), scale)
        for i, m in enumerate(modules):
            m.layer_idx = i
            m.__dict__["_session"] = session

    def longctx_release(self):
        if self._session is not None:
            self._session.release()

    @property
    def session(self):
        if self._session is None:
            self.__dict__["_session"] = Session(self.longctx_config, (self.layer_idx or 0) + 1, self.scaling)
            if self.layer_idx is None:
                self.layer_idx = 0
        return self._session

    def extra_repr(self):
        c = self.longctx_config
        return (f"layer_idx={self.layer_idx}, heads={self.num_heads}, kv_heads={self.num_key_value_heads}, "
                f"head_dim={self.head_dim}, policy={c.policy}, kv_type={c.kv_type}")

    # ---- forward ----

    def _where(self):
        return f"SparseAttention (layer {self.layer_idx})"

    def _first_position(self, n, position_ids, cache_position, n_cached):
        src = position_ids if position_ids is not None else cache_position
        if src is None:
            return n_cached
        src = torch.as_tensor(src)
        if src.dim() == 2:
            src = src[0]
        if src.dim() != 1 or src.shape[0] != n:
            what = "position_ids" if position_ids is not None else "cache_position"
            raise ValueError(f"{self._where()}: {what} of shape {tuple(src.shape)} for {n} tokens")
        p0 = int(src[0])
        if not torch.equal(src.cpu().long(), torch.arange(p0, p0 + n)):
            raise ValueError(f"{self._where()}: positions must be consecutive, got {src.tolist()[:8]}...")
        # A forward that failed or was interrupted part way leaves the first
        # layers holding its tokens and the others not: checked where a
        # forward starts (layer 0), and wherever a position does not match.
        # Layers holding nothing are left out: a module called on its own
        # (not through its model) fills only its layer.
        if p0 != 0 and (p0 != n_cached or self.layer_idx == 0):
            counts = sorted({self.session.n_tokens(layer) for layer in range(self.session.n_layers)} - {0})
            if len(counts) > 1:
                raise ValueError(f"{self._where()}: the longctx KV store's layers hold {counts[0]} to {counts[-1]} "
                                 "tokens, as an earlier forward that failed or was interrupted part way left them; "
                                 "start the sequence again (position 0)")
        if p0 != 0 and p0 != n_cached:
            raise ValueError(f"{self._where()}: the forward starts at position {p0} but the longctx KV store "
                             f"holds {n_cached} tokens of this layer; only continuing the sequence (position "
                             f"{n_cached}) or starting a new one (position 0) is supported")
        return p0

    def _check_mask(self, mask, p0, n):
        """None, an all-ones 2-D mask or a causal 4-D mask: anything else masks tokens longctx would attend."""
        if mask is None:
            return
        if mask.dim() == 2:
            ok = bool((mask != 0).all())
        elif mask.dim() == 4 and mask.shape[-2] == n:
            m = mask[0]
            allowed = m if m.dtype == torch.bool else m == 0
            keys = torch.arange(m.shape[-1], device=m.device)
            causal = keys[None, :] <= (p0 + torch.arange(n, device=m.device))[:, None]
            ok = bool((allowed == causal).all())
        else:
            raise ValueError(f"{self._where()}: attention_mask of shape {tuple(mask.shape)} not understood "
                             "(expected [batch, keys] or [batch, 1, queries, keys])")
        if not ok:
            raise ValueError(f"{self._where()}: attention_mask masks more than the causal future (padding?); "
                             "longctx attends one unpadded sequence")

    def _rope(self, q, k, v, position_embeddings, p0, n, position_ids):
        if position_embeddings is None:
            rotary = getattr(self, "rotary_emb", None)
            if rotary is None:
                raise ValueError(f"{self._where()}: no position_embeddings given and the module has no rotary_emb")
            if position_ids is None:
                position_ids = torch.arange(p0, p0 + n, device=q.device)[None]
            position_embeddings = rotary(v, position_ids)
        cos, sin = position_embeddings
        d = q.shape[-1]
        if cos.shape[-1] != d or cos.numel() != n * d:
            raise ValueError(f"{self._where()}: position_embeddings of shape {tuple(cos.shape)}, expected "
                             f"[1, {n}, {d}] (partial rotary embeddings are not supported)")
        cos = cos.reshape(n, 1, d).to(q.dtype)
        sin = sin.reshape(n, 1, d).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, position_ids=None,
                past_key_value=None, cache_position=None, **kwargs):
        if hidden_states.dim() != 3:
            raise ValueError(f"{self._where()}: hidden_states of shape {tuple(hidden_states.shape)}, "
                             "expected [batch, tokens, hidden]")
        b, n, _ = hidden_states.shape
        if b != 1:
            raise ValueError(f"{self._where()}: batch size {b}; longctx attends one sequence per KV store "
                             "(batch size 1)")
        if n == 0:
            raise ValueError(f"{self._where()}: no tokens")
        session = self.session
        layer = self.layer_idx
        if not 0 <= layer < session.n_layers:
            raise ValueError(f"{self._where()}: layer_idx outside the {session.n_layers} layers of the store")
        p0 = self._first_position(n, position_ids, cache_position, session.n_tokens(layer))
        self._check_mask(attention_mask, p0, n)

        with torch.no_grad():
            x = hidden_states[0]
            q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
            k = self.k_proj(x).view(n, self.num_key_value_heads, self.head_dim)
            v = self.v_proj(x).view(n, self.num_key_value_heads, self.head_dim)
            if getattr(self, "q_norm", None) is not None:  # Qwen3: per-head RMSNorm before RoPE
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self._rope(q, k, v, position_embeddings, p0, n, position_ids)
            store = session.ensure_store(self.num_key_value_heads, self.head_dim, self.num_heads, q.device)
            if p0 == 0 and store.n_tokens(layer) > 0:
                session.new_sequence()
            if session.cuda_device is not None:
                out = self._attend_on_cuda(session, layer, p0, n, q, k, v)
                out = out.to(hidden_states.dtype).reshape(1, n, self.num_heads * self.head_dim)
                return self._result(out, past_key_value)
            qf = q.to("cpu", torch.float32).contiguous()
            kv_dtypes = (torch.float32, torch.float16, torch.bfloat16)
            kf = k.to("cpu", k.dtype if k.dtype in kv_dtypes else torch.float32).contiguous()
            vf = v.to("cpu", v.dtype if v.dtype in kv_dtypes else torch.float32).contiguous()
            out = torch.empty(n, self.num_heads, self.head_dim, dtype=torch.float32)
            attention = session.attention
            if n > 1 or p0 == 0:
                for s in range(0, n, self.chunk_size):
                    e = min(n, s + self.chunk_size)
                    attention.prefill_chunk(layer, p0 + s, qf[s:e], kf[s:e], vf[s:e], out=out[s:e])
                w = min(session.window, n)
                attention.end_prefill(layer, qf[n - w:])
            else:
                attention.decode(layer, qf[0], kf, vf, out=out[0])
            out = out.to(hidden_states.device, hidden_states.dtype).reshape(1, n, self.num_heads * self.head_dim)
        return self._result(out, past_key_value)

    def _result(self, out, past_key_value):
        if self._returns_cache:
            return self.o_proj(out), None, past_key_value
        return self.o_proj(out), None

    def _attend_on_cuda(self, session, layer, p0, n, q, k, v):
        """The CUDA path (module docstring): f32 copies on the device, handed
        over zero-copy, ordered with torch's current stream."""
        qd, kd, vd = (t.to(torch.float32).contiguous() for t in (q, k, v))
        out = torch.empty(n, self.num_heads, self.head_dim, dtype=torch.float32, device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        attention = session.attention
        if n > 1 or p0 == 0:
            attention.device_begin_layer(layer)
            for s in range(0, n, self.chunk_size):
                e = min(n, s + self.chunk_size)
                attention.device_prefill_chunk(layer, p0 + s, qd[s:e], kd[s:e], vd[s:e], out[s:e], stream)
            w = min(session.window, n)
            attention.end_prefill(layer, qd[n - w:].cpu())
        else:
            attention.device_decode(layer, qd, kd, vd, out, stream)
        return out
