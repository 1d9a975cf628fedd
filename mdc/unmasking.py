"""MDC's sampler (Eq. 6): greedy confidence unmasking, the way :mod:`mdc.absorbing`'s process is run backwards.

From [SOT] [MASK]*N' [EOT], ceil(N'/k) steps; each predicts every masked position, takes the confidence of
position i as max_j p(j) under :func:`mdc.distribution.caption_log_probs`, reveals the k most confident (k = 1:
N' steps, Eq. 6) and keeps revealed tokens fixed. The image is encoded once per batch
(:class:`mdc.condition.ImageContext`); only the text is re-run. A hidden length not given: from [SOT]
[MASK]*(context - 1), [EOT] and [PAD] predicted too, the caption ending at the first [EOT].

Its decoders (:class:`Unmasking`; :data:`DECODERS` names sets of its fields, ``mdc.generate(..., decoder=)``) vary
which positions a step reveals (``order``: confidence, Eq. 6; the margin between the two most likely tokens; random),
where (``blocks``: spans left to right) and whether written tokens are masked again (``refine``); confidence
first, one token a step, is the paper's and the default.

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

__all__ = ["DECODERS", "ORDERS", "Unmasking", "decoder_options", "log_probs", "masked_row", "mdc_sample"]


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


ORDERS = ("confidence", "margin", "random")


@dataclass(frozen=True)
class Unmasking:
    """How the sampler reveals tokens (the one place its defaults are written; :data:`DECODERS` names sets)."""
    tokens_per_step: int = 1  # k: the k highest-ranked masked positions a step (Eq. 6: k = 1)
    temperature: float = 0.0  # 0: each position's most likely token; > 0: drawn at this temperature (float64)
    threshold: float | None = None  # every position above this confidence, at least the best (Fast-dLLM)
    order: str = "confidence"  # which positions first: max p (Eq. 6), top-1 - top-2 margin, or uniformly random
    blocks: int = 1  # semi-autoregressive: the caption in this many spans, left to right, each unmasked in turn
    refine: int = 0  # remasking rounds after the last reveal: the k least confident tokens masked and written again

    def __post_init__(self):
        if self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be >= 1; got {self.tokens_per_step}")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1]; got {self.threshold}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}; got {self.order!r}")
        if self.blocks < 1 or self.refine < 0 or self.temperature < 0:
            raise ValueError(f"blocks >= 1, refine >= 0 and temperature >= 0; got blocks={self.blocks}, "
                             f"refine={self.refine}, temperature={self.temperature}")


DECODERS = {  # name -> the Unmasking fields it sets (mdc.list_decoders; any field can still be given beside it)
    "confidence": {},  # the paper's: the most confident position, its most likely token (Eq. 6)
    "margin": {"order": "margin"},  # the largest gap between a position's two most likely tokens (Kim et al. 2025)
    "ancestral": {"order": "random", "temperature": 1.0},  # random positions, tokens drawn: the model's own sampler
    "semi-autoregressive": {"blocks": 4},  # four spans left to right, confidence-first in each (LLaDA)
    "remask": {"refine": 8},  # then 8 rounds: the least confident token masked and written again (after ReMDM)
}


def decoder_options(decoder: str | None, kw: dict) -> dict:
    """The :class:`Unmasking` fields of the named decoder, the keywords ``kw`` given beside it winning."""
    if decoder is None:
        return kw
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; known: {sorted(DECODERS)}")
    return {**DECODERS[decoder], **kw}


def _draw(logp: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [M], its probability [M]) at each row of ``logp`` [M, V] (already divided by the temperature):
    the most likely, or with ``temperature`` > 0 a draw by the Gumbel-max trick in float64 (float32 noise
    flattens the tail: a lower effective temperature, Zheng et al. 2024)."""
    if temperature > 0:
        u = torch.rand(logp.shape, dtype=torch.float64, generator=generator, device=logp.device)
        p = (logp.double() - torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))).argmax(-1)
        return p, logp.gather(-1, p[:, None]).squeeze(1).exp()
    c, p = logp.exp().max(-1)
    return p, c


def _rank(order: str, logp: torch.Tensor, c: torch.Tensor, generator) -> torch.Tensor:
    """Each masked position's rank score [M] (higher first): its token's probability, the margin between its two
    most likely tokens, or a uniform draw (float64)."""
    if order == "confidence":
        return c.double()
    if order == "margin":
        top = logp.exp().topk(2, dim=-1).values.double()  # [M, 2]
        return top[:, 0] - top[:, 1]
    return torch.rand(c.shape, dtype=torch.float64, generator=generator, device=c.device)


def _blocks(x: torch.Tensor, caption: torch.Tensor, blocks: int) -> torch.Tensor:
    """Block index [B, L] of each caption position (``caption`` [B, L]: positions 1 .. N), N split left to right
    into ``blocks`` spans of nearly equal size; -1 elsewhere."""
    n = caption.sum(1, keepdim=True).clamp_min(1)  # [B, 1]
    j = caption.long().cumsum(1) - 1  # [B, L]: 0 .. N - 1 along the caption
    return torch.where(caption, j * blocks // n, torch.full_like(j, -1))


@torch.no_grad()
def mdc_sample(model, images, length: int | None, options: Unmasking | None = None, *, generator=None,
               trace: list | None = None, encode=None, **kw) -> torch.Tensor:
    """Confidence unmasking (Eq. 6) and its variants. Returns tokens [B, length + 2] without [MASK]
    ([B, context_length] with the length hidden; ``length=None`` there: predicted, [PAD] after the first [EOT],
    where the caption ends).

    ``options`` (or its fields as keywords, :class:`Unmasking`): each step predicts every masked position and
    reveals the ``tokens_per_step`` ranked first by ``order`` (confidence: the paper's), or, with ``threshold``
    (parallel decoding after Fast-dLLM), every masked position whose confidence exceeds it, at least the first;
    ``blocks`` > 1 reveals only in the leftmost span that still holds a mask; ``temperature`` > 0 draws the
    tokens (float64 Gumbel noise; ``generator``, which also draws a random order); ``refine`` rounds then mask
    the ``tokens_per_step`` caption tokens written with the least confidence and write them again. The head runs
    only at masked positions. ``trace``: a list that receives one record per step, ``{"revealed": [B, N'+2]
    bool, "tokens": [B, N'+2] after the step, "confidence": [B, N'+2]}`` (each still-masked position's
    confidence at that step, -1 at the others); :func:`mdc.plots.plot_unmasking` draws it."""
    model.check_length(length)
    o = with_options(Unmasking, options, kw, "sampler")
    tok, width = model.tokenizer, None if model.config.length_visible else model.config.context_length
    dist = (encode or distribution.encode)(model, images)  # encoder + cross-attn K/V, once
    x = masked_row(tok, len(images), length, images.device, width)  # [B, N'+2], or [B, context_length]
    caption = x == tok.mask_id  # [B, L]: the positions the sampler writes
    span = _blocks(x, caption, o.blocks)  # [B, L]
    held = torch.zeros(x.shape, dtype=torch.float64, device=x.device)  # each written token's probability
    for round_ in range(o.refine + 1):
        if round_:  # remask the k written caption tokens held with the least confidence
            low = held.masked_fill(~caption, torch.inf).topk(o.tokens_per_step, dim=-1, largest=False).indices
            x = x.scatter(1, low, tok.mask_id)
        x, held = _unmask(model, dist, x, span, held, o, length is None, generator=generator, trace=trace)
    return x if length is not None else x.masked_fill(~valid_mask(x, tok.eot_id), tok.pad_id)  # ends at 1st [EOT]


def _unmask(model, dist, x, span, held, o: Unmasking, ends: bool, *, generator, trace):
    """Reveal every [MASK] of ``x`` by the steps of :func:`mdc_sample`; returns (tokens, held confidences)."""
    mask_id = model.tokenizer.mask_id
    while bool((still := x == mask_id).any()):  # still: [B, L]
        logp = log_probs(model, dist, x, still, o.temperature or None, ends=ends)  # [M, V] masked only
        p, c = _draw(logp, o.temperature, generator)  # [M]
        conf = torch.full(x.shape, -1.0, device=x.device).masked_scatter_(still, c.float())  # [B, L]
        first = span.masked_fill(~still, span.shape[1]).min(1, keepdim=True).values  # [B, 1] leftmost open span
        open_ = still & ((span == first) | (span < 0))  # [B, L]: where this step may reveal
        rank = torch.full(x.shape, -torch.inf, dtype=torch.float64, device=x.device).masked_scatter_(
            still, _rank(o.order, logp, c, generator)).masked_fill_(~open_, -torch.inf)
        if o.threshold is None:
            top = rank.topk(min(o.tokens_per_step, int(open_.sum(1).max())), dim=-1).indices  # [B, k]
            reveal = torch.zeros_like(still).scatter_(1, top, True) & open_
        else:
            reveal = ((conf > o.threshold) & open_) | (rank == rank.max(1, keepdim=True).values) & open_
        x = torch.where(reveal, x.masked_scatter(still, p), x)
        held = torch.where(reveal, held.masked_scatter(still, c.double()), held)
        if trace is not None:
            trace.append({"revealed": reveal.cpu(), "tokens": x.cpu(), "confidence": conf.float().cpu()})
    return x, held
