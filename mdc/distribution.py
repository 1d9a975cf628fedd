"""The caption distribution of a batch of encoded images: what the samplers and the scorers query.

:func:`caption_log_probs` is the model's distribution over what a caption position may hold.
Ids that can never be a caption token there ([SOT], [MASK], [PAD] of a compact vocabulary, and
[EOT] except where an autoregressive caption may end) are removed and the rest renormalised.
The unmasking sampler ranks confidence (max probability) under it and every scorer adds its
log-probabilities, so both see the same distribution. [UNK] is a caption token like any other:
a real caption may contain one and must remain scorable.

:class:`CaptionDistribution` is p(x | y), that distribution at every position of token rows
decoded against the images' :class:`mdc.condition.ImageContext`. Extensions subclass it: MC-Diffusion's guided
distribution (:mod:`mdc.mc_diffusion.guidance`) combines p(x | y) with p(x | a variant of y).

Sampler and scorers take an ``encode`` function, ``encode(model, images [B, 3, S, S], keys [B] |
None) -> CaptionDistribution``, called once per batch of images (``keys`` name each image's
noise, where a distribution draws any); :func:`encode` (the plain model) is the default.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mdc.condition import ImageContext


def banned_ids(tok, allow_eot: bool = False) -> list[int]:
    """Ids a caption position never holds: [SOT], [MASK], [PAD] (compact vocabularies) and [EOT]."""
    ids = [tok.sot_id, tok.mask_id] + ([] if allow_eot else [tok.eot_id])
    return ids + ([tok.pad_id] if tok.vocab is not None else [])


def caption_log_probs(logits: torch.Tensor, tok, allow_eot: bool = False) -> torch.Tensor:
    """log p over caption tokens [..., V]: banned ids at -inf, the rest renormalised (float32)."""
    logits = logits.float().clone()
    logits[..., banned_ids(tok, allow_eot)] = -math.inf
    return F.log_softmax(logits, dim=-1, dtype=torch.float32)  # fp32 under any autocast


class CaptionDistribution:
    """p(x | y) for the images of ``context`` (an :class:`ImageContext`)."""

    def __init__(self, model, context: ImageContext):
        self.model, self.context = model, context

    def __len__(self) -> int:  # images
        return len(self.context)

    def select(self, rows: torch.Tensor) -> "CaptionDistribution":
        """The distribution of images ``rows`` [R] (repeats allowed)."""
        return CaptionDistribution(self.model, self.context.select(rows))

    def logits(self, tokens: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
        """Decoder logits [R, L, V] for token rows [R, L] (row r against image r of the context),
        or [M, V] at the positions ``where`` [R, L] only (the head runs there alone)."""
        if where is None:
            return self.model.logits(tokens, self.context)
        return self.model.head(self.model.hidden(tokens, self.context)[where])

    def log_probs(self, tokens: torch.Tensor, where: torch.Tensor | None = None,
                  temperature: float | None = None) -> torch.Tensor:
        """log p over caption tokens, [R, L, V] or [M, V] as :meth:`logits`; divided by
        ``temperature`` if given, then renormalised."""
        logits = self.logits(tokens, where)
        return caption_log_probs(logits if temperature is None else logits / temperature, self.model.tokenizer)


def encode(model, images: torch.Tensor, keys=None) -> CaptionDistribution:
    """The plain model's distribution: every image [B, 3, S, S] encoded once (``keys`` unused)."""
    return CaptionDistribution(model, model.context(images))


def encode_null(model, images: torch.Tensor, keys=None) -> CaptionDistribution:
    """p(x | no image): every image's condition replaced by the learned null condition (a model
    trained with ``cond_drop_prob`` > 0, :mod:`mdc.mc_diffusion.guidance`); the image-free baseline of a score."""
    if getattr(model, "cond_null", None) is None:
        raise ValueError("the null condition needs a model trained with cond_drop_prob > 0; this model has "
                         "no learned null condition")
    return CaptionDistribution(model, model.context(images, null=torch.ones(len(images), dtype=torch.bool,
                                                                             device=images.device)))


def as_distribution(model, context) -> CaptionDistribution:
    """A :class:`CaptionDistribution` as is; an :class:`ImageContext` as the plain model's."""
    return context if isinstance(context, CaptionDistribution) else CaptionDistribution(model, context)
