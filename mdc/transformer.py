"""The decoder's building blocks: multi-head attention with reusable keys/values, pre-LN blocks
[self-attention -> (cross-attention to image tokens) -> MLP], the text transformer and its
vocabulary head. :mod:`mdc.model` assembles them into the captioner and CLIP's text tower.
:func:`recording_attention` records the self-attention probabilities of a text transformer's forward passes."""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn


class Head(nn.Linear):
    """The decoder's vocabulary head: a linear layer (same weights and state dict as ``nn.Linear``).
    With ``fp32`` set (inside :func:`evaluating`) its matmul runs outside autocast on float32
    inputs and weights, so bf16 evaluation keeps fp32 logits; training leaves it to autocast."""

    fp32 = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fp32:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:  # [B, L, D] -> [B, h, L, D/h]
    B, L, D = x.shape
    return x.view(B, L, h, D // h).transpose(1, 2)


ROTARY_BASE = 10000.0


def rotary_angles(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) [L, dim] at ``positions`` [L]: theta_j = base^(-2j/dim), angle p * theta_j, the
    dim/2 frequencies written twice (GPT-NeoX's half split), in float32."""
    theta = ROTARY_BASE ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)  # [dim/2]
    angles = positions.float()[:, None] * theta  # [L, dim/2]
    angles = torch.cat([angles, angles], dim=-1)  # [L, dim]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [B, h, L, d] rotated by position: x cos + rotate_half(x) sin, rotate_half(x1, x2) = (-x2, x1)."""
    cos, sin = rotary  # [L, d]
    x1, x2 = x.float().chunk(2, dim=-1)  # 2 x [B, h, L, d/2]
    return (x.float() * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def attention_probs(q, k, mask=None, causal=False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) [B, h, L, S] in float32, masked as scaled_dot_product_attention masks it:
    q [B, h, L, d], k [B, h, S, d], mask [B, 1, 1|L, S] (bool: True attends; else added), causal top-left."""
    with torch.autocast(q.device.type, enabled=False):
        scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, h, L, S]
    L, S = scores.shape[-2:]
    if causal:
        scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=q.device).tril(), -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.float()
    return scores.softmax(-1)


class Attention(nn.Module):
    """Multi-head attention on scaled_dot_product_attention; keys/values computed separately
    so that cross-attention memory and self-attention KV caches can be reused."""

    record: list | None = None  # while :func:`recording_attention` is active: the list its probabilities go to

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, width)

    def keys_values(self, x: torch.Tensor, rotary=None) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv(x).chunk(2, dim=-1)  # 2 x [B, S, D]
        k, v = _heads(k, self.heads), _heads(v, self.heads)  # 2 x [B, h, S, D/h]
        return (k if rotary is None else rotate(k, rotary)), v

    def forward(self, x, kv, mask=None, causal=False, rotary=None):
        # x [R, L, D], kv 2 x [B, h, S, D/h], mask [R, 1, 1|L, S]; rotary: (cos, sin) [L, D/h] of the queries
        q = self.q(x)
        if len(kv[0]) != len(x):  # a folded context: R = B * f rows, image-major; one query sequence per image
            q = q.reshape(len(kv[0]), -1, q.shape[-1])  # [B, f * L, D]
        q = _heads(q, self.heads)  # [R, h, L, D/h]
        if rotary is not None:
            q = rotate(q, rotary)
        if self.record is not None:
            self.record.append(attention_probs(q, kv[0], mask, causal).detach())  # [R, h, L, S]
        y = F.scaled_dot_product_attention(q, *kv, attn_mask=mask, is_causal=causal)
        return self.out(y.transpose(1, 2).flatten(2)).reshape(x.shape)  # [R, L, D]


class Block(nn.Module):
    """Pre-LN [self-attention -> (cross-attention to image tokens) -> MLP]."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, cross: bool):
        super().__init__()
        self.ln_self, self.self_attn = nn.LayerNorm(width), Attention(width, heads)
        self.ln_cross = nn.LayerNorm(width) if cross else None
        self.cross_attn = Attention(width, heads) if cross else None
        hidden = int(width * mlp_ratio)
        self.ln_mlp = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x, mask=None, causal=False, context=None, cache=None, *, rotary=None):
        h = self.ln_self(x)
        kv = self.self_attn.keys_values(h, rotary)  # keys rotated to their positions (and cached so)
        if cache is not None:  # incremental decoding: append this step's keys/values
            if cache:
                kv = tuple(torch.cat([c, n], dim=2) for c, n in zip(cache, kv))
            cache[:] = kv
        x = x + self.self_attn(h, kv, mask=mask, causal=causal, rotary=rotary)
        if self.cross_attn is not None:
            x = x + self.cross_attn(self.ln_cross(x), context)
        return x + self.mlp(self.ln_mlp(x))


class TextTransformer(nn.Module):
    """Token embeddings, N blocks, final LayerNorm. Returns hidden states. Positions (``cfg.positions``):
    "learned", a learned embedding added to the tokens' (``pos``); "rotary", RoPE on the self-attention's
    queries and keys (:func:`rotary_angles`; no ``pos``); cross-attention to the image never sees them."""

    def __init__(self, cfg, vocab_size: int, cross: bool):  # cfg: a ModelConfig
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.text_width)
        self.rotary = cfg.positions == "rotary"
        if self.rotary:
            self.register_parameter("pos", None)
        else:
            self.pos = nn.Parameter(torch.randn(cfg.context_length, cfg.text_width) * 0.01)
        self.blocks = nn.ModuleList(
            Block(cfg.text_width, cfg.text_heads, cfg.mlp_ratio, cross) for _ in range(cfg.text_layers)
        )
        self.ln_final = nn.LayerNorm(cfg.text_width)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens, *, mask=None, causal=False, context=None, cache=None, start=0):
        # tokens [B, L] -> hidden [B, L, W]; `start` = position of tokens[:, 0] (KV-cached decoding)
        L, rotary = tokens.shape[1], None
        if self.rotary:  # absolute positions start .. start + L - 1
            positions = torch.arange(start, start + L, device=tokens.device)  # [L]
            rotary = rotary_angles(positions, self.embed.embedding_dim // self.blocks[0].self_attn.heads)
            x = self.embed(tokens)
        else:
            x = self.embed(tokens) + self.pos[start : start + L]
        for i, block in enumerate(self.blocks):
            x = block(x, mask, causal, context[i] if context is not None else None,
                      cache[i] if cache is not None else None, rotary=rotary)
        return self.ln_final(x)


@contextlib.contextmanager
def recording_attention(text: TextTransformer):
    """While active, every forward pass of ``text`` appends to the yielded list its blocks' self-attention
    probabilities [B, h, L, S] (float32, detached; :func:`attention_probs`), one entry per block in order.
    The forward's outputs are unchanged."""
    records: list[torch.Tensor] = []
    layers = [block.self_attn for block in text.blocks]
    before = [layer.record for layer in layers]
    for layer in layers:
        layer.record = records
    try:
        yield records
    finally:
        for layer, record in zip(layers, before):
            layer.record = record
