"""Guidance for MDC captioners (MC-Diffusion, Definitions 1 and 2, Algorithm 1).

An extension of the core: it imports the core and the core never imports it. The condition
variants it needs are inputs of the core network (:mod:`mdc.condition`): the null condition
(CFG, ``cond_drop_prob`` = P_cond) and the partial condition (y_[M], y_o) (MCS,
``cond_mask_prob`` = P_mask), drawn in training by :func:`mdc.condition.training_condition`
(Algorithm 1's branch "p < P_cond: mask some entries"). A masked token keeps its position, as
MC-Diffusion's y_i = [MASK] does: the ViT masks the patch embedding before the position embedding
and the encoder (so no masked content leaks through the other tokens), VQ-VAE codes
(:mod:`mdc.vqvae`, MC-Diffusion's setup) become the [MASK] code before theirs.

Sampling and scoring combine log-probabilities over caption tokens (as
:func:`mdc.diffusion.caption_log_probs`) and renormalise with a log-softmax:

- CFG (Definition 1):       (1 - g) log p(x | null) + g log p(x | y);   g = 1 is the plain model;
- MCS (Definition 2, as printed): g log p(x | y_[M], y_o) + (1 - g) log p(x | y);   g = 0 is the plain model.

(As printed, MCS with g > 1 extrapolates *towards* the partial condition; the form that
mirrors CFG would swap the two weights. We implement the paper's formula.) At the unguided
scale the extra pass is skipped, so the result is exactly the plain model's. Otherwise the
conditional and the variant rows go through the decoder together: one call on 2B rows.
The partial condition of guided sampling masks each image token with probability P_mask,
drawn from a CPU generator seeded by ``guidance_seed`` (the same images and seed give the
same masks on any device); the scorers key it by the item, like the ELBO noise.

Asking for guidance a model was not trained for (no ``cond_null`` / mask token) is a
ValueError: the variant would be an embedding the model never learnt, so the "guided"
numbers would mean nothing. Unknown names and negative scales are ValueErrors too.

:class:`Guide` is the guided :class:`mdc.distribution.CaptionDistribution`; :func:`encoder`
hands it to the sampler and scorers, as :func:`mdc.api.generate` and :func:`mdc.api.score` do.
The sweeps of ``notebooks/guidance.ipynb`` live in :mod:`mdc.eval.guidance`.
"""
from __future__ import annotations

import torch

from mdc.condition import has_token_mask, num_image_tokens, partial_mask, training_condition, vary_condition
from mdc.diffusion import caption_log_probs
from mdc.distribution import CaptionDistribution, as_distribution

# Names that lived here before the condition variants moved into the core (kept for one release).
mcs_token_mask, as_guide = partial_mask, as_distribution
__all__ = ["GUIDANCE", "UNGUIDED", "Guide", "check_guidance", "combine", "encoder", "is_unguided", "scale_label",
           "as_guide", "mcs_token_mask", "num_image_tokens", "training_condition", "vary_condition"]

GUIDANCE = ("cfg", "mcs")
UNGUIDED = {"cfg": 1.0, "mcs": 0.0}  # the scale at which each rule is the plain conditional model
_NEEDS = {"cfg": ("cond_drop_prob", lambda m: getattr(m, "cond_null", None) is not None, "null condition"),
          "mcs": ("cond_mask_prob", has_token_mask, "mask token")}


def check_guidance(model, guidance: str | None, scale: float | None) -> None:
    """ValueError naming the value: unknown guidance, a missing or negative scale, a model not trained for it."""
    if guidance is None:
        if scale is not None:
            raise ValueError(f"guidance_scale = {scale} given without guidance; pass guidance='cfg' or 'mcs'")
        return
    if guidance not in GUIDANCE:
        raise ValueError(f"unknown guidance {guidance!r}; choose one of {GUIDANCE} or None")
    if scale is None:
        raise ValueError(f"guidance={guidance!r} needs a guidance_scale (unguided: {UNGUIDED[guidance]})")
    if not float(scale) >= 0.0:  # also NaN
        raise ValueError(f"guidance_scale must be >= 0; got {scale}")
    if model.config.objective != "mdc":
        raise ValueError(f"guidance applies to 'mdc' captioners; got objective {model.config.objective!r}")
    option, learnt, what = _NEEDS[guidance]
    if not learnt(model):
        raise ValueError(f"guidance={guidance!r} needs a model trained with {option} > 0 (its learned {what}); "
                         f"this model has {option} = {getattr(model.config, option)}. Train with e.g. "
                         f"{option}=0.1 (MC-Diffusion's value)")


def combine(lp_cond: torch.Tensor, lp_var: torch.Tensor, guidance: str, scale: float, tok,
            temperature: float | None = None) -> torch.Tensor:
    """Guided log p [..., V] from log p(x | y) and log p(x | variant) (module docstring), divided
    by ``temperature`` if given, renormalised over caption tokens."""
    w = scale if guidance == "cfg" else 1.0 - scale  # weight of log p(x | y)
    lp_cond, lp_var = torch.nan_to_num(lp_cond, neginf=0.0), torch.nan_to_num(lp_var, neginf=0.0)  # banned ids
    mixed = w * lp_cond + (1.0 - w) * lp_var
    return caption_log_probs(mixed if temperature is None else mixed / temperature, tok)


class Guide(CaptionDistribution):
    """The guided caption distribution of a batch of encoded images. ``context`` holds 2B rows:
    the B full conditions, then their B variants; each query decodes the token rows against
    both in one decoder call and combines them (:func:`combine`)."""

    def __init__(self, model, context, guidance: str, scale: float):
        super().__init__(model, context)
        self.guidance, self.scale = guidance, scale

    @classmethod
    def of(cls, model, images, guidance=None, scale=None, *, seed: int = 0, keys=None) -> CaptionDistribution:
        """Encode ``images`` [B, 3, S, S] once; MCS masks from ``seed`` (and ``keys`` [B] if given).
        At the unguided scale: the plain model's distribution (no second pass)."""
        check_guidance(model, guidance, scale)
        if is_unguided(guidance, scale):
            return CaptionDistribution(model, model.context(images))
        v = model.condition(images)  # [B, T, W]
        if guidance == "cfg":
            variant = vary_condition(model, v, null=torch.ones(len(v), dtype=torch.bool, device=v.device))
        else:  # masked in the visual tower, each masked token keeping its position: a second encoder pass
            variant = model.condition(images, token_mask=partial_mask(model, len(v), seed, keys).to(v.device))
        return cls(model, model.kv_context(torch.cat([v, variant])), guidance, scale)  # [2B, T, W]

    def __len__(self) -> int:  # images
        return len(self.context) // 2

    def select(self, rows: torch.Tensor) -> "Guide":
        """The guide of images ``rows`` [R] (repeats allowed)."""
        return Guide(self.model, self.context.select(torch.cat([rows, rows + len(self)])), self.guidance, self.scale)

    def log_probs(self, tokens: torch.Tensor, where: torch.Tensor | None = None,
                  temperature: float | None = None) -> torch.Tensor:
        """Guided log p over caption tokens: [R, L, V] for token rows [R, L] (row r against image r),
        or [M, V] at the positions ``where`` [R, L] only; divided by ``temperature`` if given."""
        logits = self.logits(tokens.repeat(2, 1), None if where is None else where.repeat(2, 1))  # [2R, L, V] | [2M, V]
        cond, variant = (caption_log_probs(x, self.model.tokenizer) for x in logits.chunk(2))
        return combine(cond, variant, self.guidance, self.scale, self.model.tokenizer, temperature)


def encoder(model, guidance: str | None, scale: float | None, seed: int = 0):
    """The ``encode`` argument of :func:`mdc.sampler.generate` and :func:`mdc.scoring.score` for
    (guidance, scale): None (the plain model) without guidance, else a function that makes the
    :class:`Guide` of a batch; MCS masks from ``seed`` and the images' keys. Checks its arguments."""
    check_guidance(model, guidance, scale)
    if guidance is None:
        return None

    def encode(model, images, keys=None) -> CaptionDistribution:
        return Guide.of(model, images, guidance, scale, seed=seed, keys=keys)
    return encode


def scale_label(guidance: str | None, scale: float | None) -> str:
    """"none", "cfg@2", "mcs@0.5": a run's name in results and figures."""
    return "none" if guidance is None else f"{guidance}@{scale:g}"


def is_unguided(guidance: str | None, scale: float | None) -> bool:
    """No guidance, or the scale at which the rule is the plain conditional model."""
    return guidance is None or float(scale) == UNGUIDED[guidance]
