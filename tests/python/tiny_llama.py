"""A small Llama-style PyTorch model with Hugging Face's module and argument
names, for testing longctx.inject without the transformers package.

Layout and signatures follow transformers' modeling_llama (>= 4.48):
LlamaForCausalLM.model.{embed_tokens, layers[i], norm, rotary_emb}, lm_head;
layers[i].{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}; the attention's forward(hidden_states,
position_embeddings=(cos, sin), attention_mask=None, position_ids=None,
past_key_value=None, **kwargs) returns (attn_output, attn_weights). RoPE uses
HF's "halves" layout. With config.rope_in_attention the attention owns a
rotary_emb and computes (cos, sin) from position_ids (transformers <= 4.45).
attention_bias puts biases on q/k/v (Qwen2 style). attention_multiplier
(Granite's name) is the attention's `scaling` when given, else
head_dim ** -0.5.

KVCache is this file's own cache (one tensor pair per layer) for the plain
model; generate() passes explicit position_ids so that an injected model,
whose attention keeps its K/V in longctx and ignores the cache, runs the
same loop. load_gguf() reads a llama.cpp GGUF through
longctx.read_gguf_tensors and undoes the converter's Q/K row permutation.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class TinyConfig:
    def __init__(self, vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, head_dim=None, rope_theta=10000.0,
                 rms_norm_eps=1e-5, attention_bias=False, rope_in_attention=False, attention_multiplier=None):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.attention_bias = attention_bias
        self.rope_in_attention = rope_in_attention
        self.attention_multiplier = attention_multiplier
        self.attention_dropout = 0.0


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class LlamaRotaryEmbedding(nn.Module):
    """(cos, sin) [batch, n, head_dim] of positions, in x's dtype. The
    frequencies are rounded to f32 and the angles formed in fp64 (as the
    longctx runtime does), so that long positions stay exact."""

    def __init__(self, config):
        super().__init__()
        d = config.head_dim
        inv = config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        self.register_buffer("inv_freq", inv.to(torch.float32), persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        angle = position_ids.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
        emb = torch.cat((angle, angle), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class KVCache:
    """Per-layer K/V [batch, n_kv_heads, tokens, head_dim], appended by update()."""

    def __init__(self):
        self.k, self.v = {}, {}

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        if layer_idx in self.k:
            key_states = torch.cat([self.k[layer_idx], key_states], dim=2)
            value_states = torch.cat([self.v[layer_idx], value_states], dim=2)
        self.k[layer_idx], self.v[layer_idx] = key_states, value_states
        return key_states, value_states

    def get_seq_length(self, layer_idx=0):
        return self.k[layer_idx].shape[2] if layer_idx in self.k else 0


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.attention_multiplier or self.head_dim ** -0.5
        self.is_causal = True
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)
        if config.rope_in_attention:
            self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, position_ids=None,
                past_key_value=None, cache_position=None, **kwargs):
        b, n, _ = hidden_states.shape
        shape = (b, n, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if position_embeddings is None:
            position_embeddings = self.rotary_emb(v, position_ids)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, self.layer_idx)
        k = k.repeat_interleave(self.num_key_value_groups, dim=1)
        v = v.repeat_interleave(self.num_key_value_groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling  # [b, heads, n, keys]
        if attention_mask is None:  # causal: the n queries are the last n of the keys
            keys = k.shape[2]
            future = torch.ones(n, keys, dtype=torch.bool, device=q.device).triu(keys - n + 1)
            scores = scores.masked_fill(future, float("-inf"))
        else:
            scores = scores + attention_mask[:, :, :, : k.shape[2]]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(b, n, -1)
        return self.o_proj(out), weights


class LlamaMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                cache_position=None, position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                          attention_mask=attention_mask, position_ids=position_ids,
                                          past_key_value=past_key_value, cache_position=cache_position,
                                          position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, cache_position=None):
        n = input_ids.shape[1]
        if cache_position is None:
            start = past_key_values.get_seq_length() if past_key_values is not None else 0
            cache_position = torch.arange(start, start + n)
        if position_ids is None:
            position_ids = cache_position.unsqueeze(0)
        hidden_states = self.embed_tokens(input_ids)
        # transformers <= 4.45 style: every attention computes its own rotary embedding.
        position_embeddings = None if self.config.rope_in_attention else self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_value=past_key_values, cache_position=cache_position,
                                  position_embeddings=position_embeddings)
        return self.norm(hidden_states)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, cache_position=None):
        """Logits [batch, n, vocab]."""
        return self.lm_head(self.model(input_ids, attention_mask, position_ids, past_key_values, cache_position))

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens, eos=None, chunk=None, on_logits=None):
        """Greedy tokens after `prompt` (a list of ids), prefilled in pieces of
        `chunk` tokens (all at once when None); stops after eos. on_logits(l)
        sees the logits [vocab] of every step (prompt end, then each token)."""
        cache = KVCache()
        pos, logits = 0, None
        chunk = chunk or len(prompt)
        for s in range(0, len(prompt), chunk):
            ids = torch.tensor([prompt[s:s + chunk]])
            logits = self(ids, position_ids=torch.arange(pos, pos + ids.shape[1])[None], past_key_values=cache)[0, -1]
            pos += ids.shape[1]
        out = []
        while len(out) < max_new_tokens:
            if on_logits:
                on_logits(logits)
            token = int(torch.argmax(logits))
            out.append(token)
            if token == eos or len(out) == max_new_tokens:
                break
            logits = self(torch.tensor([[token]]), position_ids=torch.tensor([[pos]]), past_key_values=cache)[0, -1]
            pos += 1
        return out


def random_model(seed=0, dtype=torch.float32, **config_kwargs):
    """A model with random weights large enough that attention is not uniform."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(TinyConfig(**config_kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 1.0)
        for layer in model.model.layers:  # sharper attention: scores of a few units
            layer.self_attn.q_proj.weight.mul_(2.0)
            layer.self_attn.k_proj.weight.mul_(2.0)
    return model.to(dtype).eval()


def _unpermute_rows(w, n_heads):
    """llama.cpp's converter stores each head's Q/K rows so that rotated pairs
    are adjacent (row 2i + c holds HF row c * d/2 + i); back to HF's halves."""
    rows = w.shape[0]
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(rows, *w.shape[1:])


def load_gguf(path, dtype=torch.float32):
    """A LlamaForCausalLM with the weights of a llama/qwen2 GGUF file."""
    import longctx
    import numpy as np

    meta = longctx.read_gguf_metadata(path)
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"{path}: architecture {arch} not supported by tiny_llama")
    w = longctx.read_gguf_tensors(path)
    if "rope_freqs.weight" in w:
        raise ValueError(f"{path}: rope_freqs.weight (Llama-3.1 rope scaling) not supported by tiny_llama")
    n_heads = meta[f"{arch}.attention.head_count"]
    n_kv = meta.get(f"{arch}.attention.head_count_kv", n_heads)
    n_embd = meta[f"{arch}.embedding_length"]
    head_dim = meta.get(f"{arch}.attention.key_length", n_embd // n_heads)
    if meta.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{path}: partial rotary embedding not supported by tiny_llama")
    config = TinyConfig(vocab_size=w["token_embd.weight"].shape[0], hidden_size=n_embd,
                        intermediate_size=meta[f"{arch}.feed_forward_length"],
                        num_hidden_layers=meta[f"{arch}.block_count"], num_attention_heads=n_heads,
                        num_key_value_heads=n_kv, head_dim=head_dim,
                        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
                        rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
                        attention_bias="blk.0.attn_q.bias" in w,
                        attention_multiplier=meta.get(f"{arch}.attention.scale"))
    model = LlamaForCausalLM(config)
    permute = arch == "llama"  # qwen2 GGUFs keep HF's layout

    def q_or_k(name, heads):
        t = w[name]
        return _unpermute_rows(t, heads) if permute else t

    state = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"],
             "lm_head.weight": w.get("output.weight", w["token_embd.weight"])}
    for i in range(config.num_hidden_layers):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        state[h + "self_attn.q_proj.weight"] = q_or_k(p + "attn_q.weight", n_heads)
        state[h + "self_attn.k_proj.weight"] = q_or_k(p + "attn_k.weight", n_kv)
        state[h + "self_attn.v_proj.weight"] = w[p + "attn_v.weight"]
        state[h + "self_attn.o_proj.weight"] = w[p + "attn_output.weight"]
        if config.attention_bias:
            state[h + "self_attn.q_proj.bias"] = q_or_k(p + "attn_q.bias", n_heads)
            state[h + "self_attn.k_proj.bias"] = q_or_k(p + "attn_k.bias", n_kv)
            state[h + "self_attn.v_proj.bias"] = w[p + "attn_v.bias"]
        state[h + "input_layernorm.weight"] = w[p + "attn_norm.weight"]
        state[h + "post_attention_layernorm.weight"] = w[p + "ffn_norm.weight"]
        state[h + "mlp.gate_proj.weight"] = w[p + "ffn_gate.weight"]
        state[h + "mlp.up_proj.weight"] = w[p + "ffn_up.weight"]
        state[h + "mlp.down_proj.weight"] = w[p + "ffn_down.weight"]
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
    return model.to(dtype).eval()
