"""MDC's sampler (Eq. 6): greedy confidence unmasking, the way :mod:`mdc.absorbing`'s process is run backwards.

From [SOT] [MASK]*N' [EOT], ceil(N'/k) steps; each predicts every masked position, takes the confidence of
position i as max_j p(j) under :func:`mdc.distribution.caption_log_probs`, reveals the k most confident (k = 1:
N' steps, Eq. 6) and keeps revealed tokens fixed. The image is encoded once per batch
(:class:`mdc.condition.ImageContext`); only the text is re-run. A hidden length not given: from [SOT]
[MASK]*(context - 1), [EOT] and [PAD] predicted too, the caption ending at the first [EOT].

The sampler queries a :class:`mdc.distribution.CaptionDistribution` (``encode``; the plain model's by default);
MC-Diffusion's guidance passes its guided one (:mod:`mdc.api`). :func:`log_probs` is also the heuristic
scorer's (:func:`mdc.absorbing.heuristic_score` reveals in the sampler's order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mdc import distribution
from mdc.distribution import CaptionDistribution
from mdc.base.options import with_options
from mdc.tokenizer import valid_mask

__all__ = ["Unmasking", "log_probs", "masked_row", "mdc_sample"]


def masked_row(tok, batch: int, length: int | None, device, width: int | None = None) -> torch.Tensor:
    """[SOT] [MASK]*length [EOT] for every row, then [PAD] to ``width``: [B, width or length + 2] (the fully
    corrupted caption); ``length=None`` (a hidden length, predicted): [SOT] [MASK]*(width - 1)."""
    x = torch.full((batch, width or length + 2), tok.pad_id, dtype=torch.long, device=device)
    x[:, 0] = tok.sot_id
    end = x.shape[1] if length is None else length + 1  # the caption is 1 .. end - 1
    x[:, end:end + 1] = tok.eot_id
    at = torch.arange(x.shape[1], device=device)
    return x.masked_fill((at > 0) & (at < end), tok.mask_id)  # every caption token masked (t = 1, Eq. 2)


def log_probs(model, dist, x, where, temperature=None, *, ends: bool = False) -> torch.Tensor:
    """log p [M, V] at the positions ``where`` of ``x`` [B, L]: the caption distribution's or, with ``ends``
    (a hidden length's [EOT] and padding), over every id but [SOT] and [MASK] (the plain distribution only)."""
    if not ends:
        return dist.log_probs(x, where=where, temperature=temperature)
    if type(dist) is not CaptionDistribution:
        raise ValueError("guidance needs a model trained with its caption length visible (length_visible=True)")
    logits = dist.logits(x, where).float() / (temperature or 1.0)  # [M, V]
    logits[:, [model.tokenizer.sot_id, model.tokenizer.mask_id]] = -torch.inf
    return F.log_softmax(logits, dim=-1)


@dataclass(frozen=True)
class Unmasking:
    """How the sampler reveals tokens (the one place its defaults are written)."""
    tokens_per_step: int = 1  # k: the k most confident masked positions a step (Eq. 6: k = 1)
    temperature: float = 0.0  # 0: each position's most likely token; > 0: drawn at this temperature
    threshold: float | None = None  # every position above this confidence, at least the best (Fast-dLLM)

    def __post_init__(self):
        if self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be >= 1; got {self.tokens_per_step}")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1]; got {self.threshold}")


@torch.no_grad()
def mdc_sample(model, images, length: int | None, options: Unmasking | None = None, *, generator=None,
               trace: list | None = None, encode=None, **kw) -> torch.Tensor:
    """Greedy confidence unmasking. Returns tokens [B, length + 2] without [MASK] ([B, context_length] with the
    length hidden; ``length=None`` there: predicted, [PAD] after the first [EOT], where the caption ends).

    ``options`` (or its fields as keywords, :class:`Unmasking`): each step reveals the ``tokens_per_step``
    most confident masked positions, or, with ``threshold`` (parallel decoding after Fast-dLLM), every
    masked position whose confidence exceeds it, at least the most confident one; ``temperature`` > 0 draws
    them (``generator``). The head runs only at still-masked positions. ``trace``: a list that receives one
    record per step, ``{"revealed": [B, N'+2] bool, "tokens": [B, N'+2] after the step, "confidence":
    [B, N'+2]}`` (each still-masked position's confidence at that step, -1 at the others);
    :func:`mdc.plots.plot_unmasking` draws it."""
    model.check_length(length)
    o = with_options(Unmasking, options, kw, "sampler")
    tokens_per_step, temperature, threshold = o.tokens_per_step, o.temperature, o.threshold
    tok, width = model.tokenizer, None if model.config.length_visible else model.config.context_length
    dist = (encode or distribution.encode)(model, images)  # encoder + cross-attn K/V, once
    x = masked_row(tok, len(images), length, images.device, width)  # [B, N'+2], or [B, context_length]
    while bool((still := x == tok.mask_id).any()):  # still: [B, N'+2]
        logp = log_probs(model, dist, x, still, temperature or None, ends=length is None)  # [M, V] masked only
        if temperature > 0:
            p = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)  # [M]
            c = logp.gather(-1, p[:, None]).squeeze(1).exp()
        else:
            c, p = logp.exp().max(-1)  # [M]
        conf = torch.full(x.shape, -1.0, device=x.device).masked_scatter_(still, c)  # [B, N'+2]
        if threshold is None:
            top = conf.topk(min(tokens_per_step, int(still.sum(1).max())), dim=-1).indices  # [B, k] most confident
            reveal = torch.zeros_like(still).scatter_(1, top, True) & still
        else:
            reveal = ((conf > threshold) | (conf == conf.max(1, keepdim=True).values)) & still  # at least the best
        x = torch.where(reveal, x.masked_scatter(still, p), x)
        if trace is not None:
            trace.append({"revealed": reveal.cpu(), "tokens": x.cpu(), "confidence": conf.float().cpu()})
    return x if length is not None else x.masked_fill(~valid_mask(x, tok.eot_id), tok.pad_id)  # ends at 1st [EOT]
