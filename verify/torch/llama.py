"""TorchTitan's Llama 3, transcribed for the PyTorch oracle.

Source: pytorch/torchtitan v0.2.0, torchtitan/models/llama3/model/model.py
(precompute_freqs_cis, reshape_for_broadcast, apply_rotary_emb, repeat_kv, Attention,
FeedForward, TransformerBlock, Transformer), model/args.py (TransformerModelArgs,
RoPEScalingArgs), models/llama3/__init__.py (llama3_args), models/attention.py
(ScaledDotProductAttentionWrapper: SDPA with is_causal=True) and
components/loss.py (cross_entropy_loss). Same module tree and parameter fqns
(`layers` is a ModuleDict keyed "0".."L-1"), same forward, same init spec.

Deliberate deviations, so the f64 comparison measures the model and not rope's
float32 rounding:
- precompute_freqs_cis and apply_rotary_emb run in the model's dtype (complex128
  for float64) where TorchTitan always uses float32 / complex64 (`.float()`). For a
  float32 model the two are the same operations in the same order.
- the loss is cross-entropy in the logits' dtype: TorchTitan's `.float()` on the
  logits upcasts bf16; on float64 logits it would round them to float32.
- the model is built directly in its dtype (parameters and the freqs_cis buffer):
  Module.to(float64) would cast the complex buffer to a real one.
Only the SDPA attention path (use_flex_attn=False, attention_masks=None) is transcribed.
This file is the oracle's model; it is not TorchTitan's training loop.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelArgs:
    """TransformerModelArgs (args.py) less the options this transcription does not cover."""
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab: int = 128256
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: bool = True  # v0.2.0 always applies the Llama 3.1 scaling below
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_pos: int = 8192
    max_seq_len: int = 131072  # TorchTitan sets it to training.seq_len (update_from_config)
    depth_init: bool = True

    @property
    def kv_heads(self):
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    @property
    def ffn_hidden(self):
        """FeedForward.__init__ with hidden_dim = 4 * dim."""
        h = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            h = int(self.ffn_dim_multiplier * h)
        return self.multiple_of * ((h + self.multiple_of - 1) // self.multiple_of)


# llama3_args in torchtitan/models/llama3/__init__.py (v0.2.0); vocab_size is `vocab` here.
FLAVOURS = {
    "debugmodel": ModelArgs(dim=256, n_layers=6, n_heads=16, vocab=2048, rope_theta=500000),
    "8B": ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
                    multiple_of=1024, rope_theta=500000),
    "70B": ModelArgs(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3,
                     multiple_of=4096, rope_theta=500000),
    "405B": ModelArgs(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim_multiplier=1.2,
                      multiple_of=4096, rope_theta=500000),
}

def _bool01(v):
    if v not in ("0", "1"):
        raise ValueError(f"'{v}' is not 0 or 1")
    return v == "1"


_OVERRIDE_KEYS = {"dim": int, "n_layers": int, "n_heads": int, "n_kv_heads": int, "vocab": int,
                  "multiple_of": int, "ffn_dim_multiplier": float, "rope_theta": float,
                  "norm_eps": float, "rope_scaling": _bool01, "depth_init": _bool01}


def args_from_spec(spec, seq_len=None):
    """'debugmodel' or 'debugmodel:n_layers=2:n_kv_heads=4' (shardbench's --model syntax)."""
    name, *overrides = spec.split(":")
    if name not in FLAVOURS:
        raise ValueError(f"unknown model flavour '{name}' (known: {', '.join(FLAVOURS)})")
    kw = {}
    for o in overrides:
        key, sep, val = o.partition("=")
        if not sep or key not in _OVERRIDE_KEYS:
            raise ValueError(f"bad model override '{o}' in '{spec}' (keys: {', '.join(_OVERRIDE_KEYS)})")
        try:
            kw[key] = _OVERRIDE_KEYS[key](val)
        except ValueError as e:
            raise ValueError(f"model override '{o}' in '{spec}': {e}") from None
    a = replace(FLAVOURS[name], **kw)
    if seq_len is not None:
        a = replace(a, max_seq_len=seq_len)
    return a


def args_for_trace(meta):
    """The model of a shardbench trace: its `model` spec, checked against the numbers in its
    __metadata__ (all strings). ValueError naming the fields that disagree."""
    a = args_from_spec(meta["model"], seq_len=int(meta["seq"]))
    want = {"dim": a.dim, "n_layers": a.n_layers, "n_heads": a.n_heads, "n_kv_heads": a.kv_heads,
            "vocab": a.vocab, "multiple_of": a.multiple_of, "ffn_hidden": a.ffn_hidden,
            "norm_eps": a.norm_eps, "rope_theta": a.rope_theta, "rope_scaling": int(a.rope_scaling)}
    bad = [f"{k} {meta.get(k)} (expected {v})" for k, v in want.items()
           if meta.get(k) is None or float(meta[k]) != float(v)]
    if bad:
        raise ValueError(f"trace metadata disagrees with model '{meta['model']}': {', '.join(bad)}")
    return a


def precompute_freqs_cis(a: ModelArgs, dtype):
    """precompute_freqs_cis(head_dim, max_seq_len, rope_theta, rope_scaling_args), in `dtype`."""
    dim, end = a.head_dim, a.max_seq_len
    freqs = 1.0 / (a.rope_theta ** (torch.arange(0, dim, 2)[: (dim // 2)].to(dtype) / dim))
    if a.rope_scaling:
        scaling_factor = a.rope_scaling_factor
        low_freq_factor = a.rope_low_freq_factor
        high_freq_factor = a.rope_high_freq_factor
        original_max_position_embeddings = a.rope_original_max_pos
        wavelen = 2 * math.pi / freqs
        high_freq_wavelen = original_max_position_embeddings / high_freq_factor
        low_freq_wavelen = original_max_position_embeddings / low_freq_factor
        # wavelen < high_freq_wavelen: unchanged; wavelen > low_freq_wavelen: divided by the factor
        freqs = torch.where(wavelen > low_freq_wavelen, freqs / scaling_factor, freqs)
        # in between: linear interpolation of the scaled and the original freqs
        smooth_factor = (original_max_position_embeddings / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor)
        smoothed_freqs = (1 - smooth_factor) * freqs / scaling_factor + smooth_factor * freqs
        is_medium_freqs = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        freqs = torch.where(is_medium_freqs, smoothed_freqs, freqs)
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).to(dtype)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 / complex128


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    assert ndim > 1
    seqlen = x.shape[1]
    freqs_cis = freqs_cis[0:seqlen]
    assert freqs_cis.shape == (seqlen, x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    """Rotates adjacent pairs (x[2i], x[2i+1]) of each head (interleaved, not rotate-half)."""
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    """torch.repeat_interleave(x, dim=2, repeats=n_rep): kv head j serves q heads j*n_rep.."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (torch.unsqueeze(x, dim=3)
            .expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim))


class Attention(nn.Module):
    def __init__(self, a: ModelArgs, dtype):
        super().__init__()
        self.n_heads = a.n_heads
        self.n_kv_heads = a.kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = a.head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(a.dim, self.n_kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.wv = nn.Linear(a.dim, self.n_kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False, dtype=dtype)

    def init_weights(self, init_std):
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x, freqs_cis, attention_masks):
        assert attention_masks is None  # SDPA path only
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1: the local head count, as TP may have sharded the projections
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)
        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        xk = keys.transpose(1, 2)
        xv = values.transpose(1, 2)
        output = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        output = output.transpose(1, 2).contiguous()  # (bs, seqlen, n_local_heads, head_dim)
        output = output.view(bs, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, a: ModelArgs, dtype):
        super().__init__()
        hidden = a.ffn_hidden
        self.w1 = nn.Linear(a.dim, hidden, bias=False, dtype=dtype)
        self.w2 = nn.Linear(hidden, a.dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(a.dim, hidden, bias=False, dtype=dtype)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)


def block_init_std(a: ModelArgs, layer_id):
    """TransformerBlock.weight_init_std: the std of wo, w2, w3 in layer layer_id."""
    if a.depth_init:
        return 0.02 / (2 * (layer_id + 1)) ** 0.5
    return 0.02 / (2 * a.n_layers) ** 0.5


class TransformerBlock(nn.Module):
    def __init__(self, layer_id, a: ModelArgs, dtype):
        super().__init__()
        self.attention = Attention(a, dtype)
        self.feed_forward = FeedForward(a, dtype)
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps, dtype=dtype)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps, dtype=dtype)
        self.weight_init_std = block_init_std(a, layer_id)

    def forward(self, x, freqs_cis, attention_masks):
        h = x + self.attention(self.attention_norm(x), freqs_cis, attention_masks)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self):
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs, dtype=torch.float32):
        super().__init__()
        self.model_args = a
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim, dtype=dtype)
        self.register_buffer("freqs_cis", precompute_freqs_cis(a, dtype), persistent=False)
        self.layers = nn.ModuleDict()
        for layer_id in range(a.n_layers):
            self.layers[str(layer_id)] = TransformerBlock(layer_id, a, dtype)
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps, dtype=dtype)
        self.output = nn.Linear(a.dim, a.vocab, bias=False, dtype=dtype)

    def init_weights(self):
        """Transformer.init_weights (not used by the oracle, which loads shardbench's weights)."""
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        final_out_std = self.model_args.dim ** -0.5
        cutoff_factor = 3
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=final_out_std,
                              a=-cutoff_factor * final_out_std, b=cutoff_factor * final_out_std)

    def forward(self, tokens, attention_masks=None):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis, attention_masks=attention_masks)
        h = self.norm(h)
        return self.output(h)


def cross_entropy_loss(pred, labels):
    """cross_entropy_loss in torchtitan/components/loss.py, in pred's dtype (see the deviations)."""
    return F.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))


def init_spec(a: ModelArgs):
    """fqn -> (std, bound) of TorchTitan's init_weights; bound is the absolute truncation
    (trunc_normal_'s default a=-2, b=2), None for normal_, and std None for ones (norms)."""
    spec = {"tok_embeddings.weight": (1.0, None)}
    for i in range(a.n_layers):
        s = block_init_std(a, i)
        p = f"layers.{i}."
        spec[p + "attention_norm.weight"] = (None, None)
        spec[p + "ffn_norm.weight"] = (None, None)
        for n in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
            spec[p + n + ".weight"] = (0.02, 2.0)
        for n in ("attention.wo", "feed_forward.w2", "feed_forward.w3"):
            spec[p + n + ".weight"] = (s, 2.0)
    spec["norm.weight"] = (None, None)
    spec["output.weight"] = (a.dim ** -0.5, 3 * a.dim ** -0.5)
    return spec

