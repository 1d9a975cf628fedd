"""The caption distribution of a batch of encoded images: what the sampler and the scorers query.

:class:`CaptionDistribution` is p(x | y), the model's distribution over caption tokens
(:func:`mdc.diffusion.caption_log_probs`) at every position of token rows decoded against the
images' :class:`mdc.condition.ImageContext`. Extensions subclass it: MC-Diffusion's guided
distribution (:mod:`mdc.guidance`) combines p(x | y) with p(x | a variant of y).

Sampler and scorers take an ``encode`` function, ``encode(model, images [B, 3, S, S], keys [B] |
None) -> CaptionDistribution``, called once per batch of images (``keys`` name each image's
noise, where a distribution draws any); :func:`encode` (the plain model) is the default.
"""
from __future__ import annotations

import torch

from mdc.condition import ImageContext
from mdc.diffusion import caption_log_probs


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
    trained with ``cond_drop_prob`` > 0, :mod:`mdc.condition`); the image-free baseline of a score."""
    if getattr(model, "cond_null", None) is None:
        raise ValueError(f"the null condition needs a model trained with cond_drop_prob > 0; this model has "
                         f"cond_drop_prob = {model.config.cond_drop_prob}")
    return CaptionDistribution(model, model.context(images, null=torch.ones(len(images), dtype=torch.bool,
                                                                             device=images.device)))


def as_distribution(model, context) -> CaptionDistribution:
    """A :class:`CaptionDistribution` as is; an :class:`ImageContext` as the plain model's."""
    return context if isinstance(context, CaptionDistribution) else CaptionDistribution(model, context)
