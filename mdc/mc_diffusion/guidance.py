"""Guidance for MDC captioners (MC-Diffusion, Definitions 1 and 2, Algorithm 1).

An extension of the core: it imports the core and the core never imports it. The condition
variants it needs are inputs of the core network (:mod:`mdc.condition`): the null condition
(CFG, ``cond_drop_prob`` = P_cond) and the partial condition (y_[M], y_o) (MCS,
``cond_mask_prob`` = P_mask). :class:`ConditionVariants` is this extension's config (the "guidance"
entry of ``ModelConfig.extensions``): the factory attaches it to a captioner, with the parameters it
learns, and it draws the variants in training (Algorithm 1's branch "p < P_cond: mask some entries"). A masked token keeps its position, as
MC-Diffusion's y_i = [MASK] does: the ViT masks the patch embedding before the position embedding
and the encoder (so no masked content leaks through the other tokens), VQ-VAE codes
(:mod:`mdc.mc_diffusion.vqvae`, MC-Diffusion's setup) become the [MASK] code before theirs.

Sampling and scoring combine log-probabilities over caption tokens (as
:func:`mdc.distribution.caption_log_probs`) and renormalise with a log-softmax. Three rules, each at
a guidance scale g or, the same thing measured from where the rule is the plain model, a guidance
*strength* s = g - g_unguided >= 0 (sweeps and figures use strengths, so that one x value means the
same distance from the plain model for every rule):

- "cfg", CFG (Definition 1): (1 - g) log p(x | null) + g log p(x | y); plain at g = 1, g = 1 + s;
- "mcs", MCS as printed (Definition 2): g log p(x | y_[M], y_o) + (1 - g) log p(x | y); plain at
  g = 0, g = s: with s > 1 it extrapolates *towards* the partial condition;
- "mcs_mirror", MCS mirrored (our addition): the weights swapped, g log p(x | y) + (1 - g)
  log p(x | y_[M], y_o); plain at g = 1, g = 1 + s, i.e. (1 + s) log p(x | y) - s log p(x | y_[M], y_o):
  it extrapolates *away from* the partial condition, as CFG does from the null condition.

``cfg@1`` and ``mcs@0`` were both the plain model, so a bare number in a label is ambiguous:
labels say what the number is, ``cfg@s=2`` (:func:`strength_label`) or ``cfg@scale=3``
(:func:`scale_label`). At strength 0 the extra pass is skipped, so the result is exactly the
plain model's. Otherwise the conditional and the variant rows go through the decoder together:
one call on 2B rows.
The partial condition of guided sampling masks each image token with probability P_mask,
drawn from a CPU generator seeded by ``guidance_seed`` (the same images and seed give the
same masks on any device); the scorers key it by the item, like the ELBO noise.

Asking for guidance a model was not trained for (no ``cond_null`` / mask token) is a
ValueError: the variant would be an embedding the model never learnt, so the "guided"
numbers would mean nothing. Unknown names, negative scales or strengths, and a scale given
together with a strength are ValueErrors too.

:class:`Guide` is the guided :class:`mdc.distribution.CaptionDistribution`; :func:`encoder`
hands it to the sampler and scorers, as :func:`mdc.api.generate` and :func:`mdc.api.score` do.
The sweeps of ``notebooks/guidance.ipynb`` live in :mod:`mdc.eval.guidance_sweeps`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
from torch import nn

from mdc.condition import has_token_mask, num_image_tokens, vary_condition
from mdc.distribution import CaptionDistribution, caption_log_probs
from mdc.base.seeding import key_seed

__all__ = ["GUIDANCE", "RULES", "UNGUIDED", "ConditionVariants", "Guide", "check_guidance", "combine", "encoder", "is_unguided",
           "partial_mask", "scale_label", "scale_of", "strength_label", "strength_of", "variants_of"]

@dataclass(frozen=True)
class ConditionVariants:
    """What a captioner learns for guidance (MC-Diffusion's Algorithm 1), the "guidance" entry of
    ``ModelConfig.extensions``. Per caption one uniform u: u < P_cond(CFG) -> the null condition;
    P_cond(CFG) <= u < P_cond(CFG) + P_cond(MCS) -> the partial condition; otherwise the full one. The
    events are disjoint, so one checkpoint serves both rules. With MCS on, every caption goes through the
    masked path (an all-False row is exactly the full condition), so every parameter is in every step's
    graph, as DDP needs."""
    cond_drop_prob: float = 0.0  # CFG's P_cond: per caption, the whole image condition -> a learned null condition
    cond_mask_prob: float = 0.0  # MCS's P_mask: each image token of a selected caption masked, its position kept
    cond_mask_select_prob: float = 0.1  # Alg. 1's P_cond for MCS: share of captions whose condition is masked

    def __post_init__(self):
        for name in ("cond_drop_prob", "cond_mask_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1); got {getattr(self, name)}")
        if self.cond_mask_prob > 0 and not 0.0 < self.cond_mask_select_prob <= 1.0 - self.cond_drop_prob:
            raise ValueError(f"cond_mask_select_prob must lie in (0, 1 - cond_drop_prob = {1 - self.cond_drop_prob}]; "
                             f"got {self.cond_mask_select_prob}")

    @property
    def active(self) -> bool:
        return self.cond_drop_prob > 0 or self.cond_mask_prob > 0

    def attach(self, model) -> None:
        """Give a built captioner the parameters its variants learn, after its own (so its initial weights
        are drawn in the order they always were), and itself as ``model.condition_variants``: the null
        condition ``cond_null`` [W]; MCS's mask, a patch embedding ``cond_mask_token`` [Dv] masked before the
        position embedding (a tower that masks its own tokens, VQ codes' [MASK] code, needs none)."""
        if self.cond_drop_prob > 0:
            model.cond_null = nn.Parameter(0.02 * torch.randn(model.config.text_width))  # [W]
        if self.cond_mask_prob > 0 and not hasattr(model.visual, "masked_features"):
            model.cond_mask_token = nn.Parameter(0.02 * torch.randn(model.config.vision_width))  # [Dv]
        model.condition_variants = self

    def draw(self, model, batch: int, generator=None, device=None) -> dict:
        """``model.context`` keywords for one training batch: {} when both options are off, else ``null``
        [B] and/or ``token_mask`` [B, T] (bool)."""
        if not self.active:
            return {}
        u = torch.rand(batch, generator=generator, device=device)  # [B] one draw per caption
        out = {}
        if self.cond_drop_prob > 0:
            out["null"] = u < self.cond_drop_prob
        if self.cond_mask_prob > 0:
            selected = (u >= self.cond_drop_prob) & (u < self.cond_drop_prob + self.cond_mask_select_prob)  # [B]
            p = torch.rand(batch, num_image_tokens(model), generator=generator, device=device)  # [B, T]
            out["token_mask"] = selected[:, None] & (p < self.cond_mask_prob)
        return out


def variants_of(model) -> ConditionVariants:
    """The condition variants a captioner was built with (none: all options off)."""
    return getattr(model, "condition_variants", None) or ConditionVariants()


def partial_mask(model, batch: int, seed: int = 0, keys: Sequence[Hashable] | None = None) -> torch.Tensor:
    """Partial-condition masks [B, T] (bool, CPU): each token with probability P_mask. From one
    generator seeded by ``seed``, or, given ``keys`` [B], one generator per (seed, key)."""
    T, p = num_image_tokens(model), variants_of(model).cond_mask_prob
    if keys is None:
        return torch.rand(batch, T, generator=torch.Generator().manual_seed(seed)) < p
    return torch.stack([torch.rand(T, generator=torch.Generator().manual_seed(key_seed(seed, ("mcs", k)))) < p
                        for k in keys])


GUIDANCE = ("cfg", "mcs", "mcs_mirror")
UNGUIDED = {"cfg": 1.0, "mcs": 0.0, "mcs_mirror": 1.0}  # the scale at which each rule is the plain conditional model
RULES = {"cfg": "CFG", "mcs": "MCS (as printed)", "mcs_mirror": "MCS (mirrored)"}  # names in figures and tables
_has_null = lambda m: getattr(m, "cond_null", None) is not None  # noqa: E731
_NEEDS = {"cfg": ("cond_drop_prob", _has_null, "null condition"),
          "mcs": ("cond_mask_prob", has_token_mask, "mask token"),
          "mcs_mirror": ("cond_mask_prob", has_token_mask, "mask token")}


def scale_of(guidance: str | None, strength: float | None) -> float | None:
    """The guidance scale at ``strength`` s: 1 + s (CFG, mirrored MCS), s (MCS as printed)."""
    return None if guidance is None else UNGUIDED[guidance] + float(strength)


def strength_of(guidance: str | None, scale: float | None) -> float | None:
    """The guidance strength of ``scale``: its distance from the rule's unguided scale."""
    return None if guidance is None else float(scale) - UNGUIDED[guidance]


def check_guidance(model, guidance: str | None, scale: float | None, strength: float | None = None) -> float | None:
    """The guidance scale of (``scale``, ``strength``), at most one of them given; ValueError naming
    the value: unknown guidance, both or neither given, a negative one, a model not trained for it."""
    if scale is not None and strength is not None:
        raise ValueError(f"give guidance_strength or guidance_scale, not both; got {strength} and {scale}")
    if guidance is None:
        for name, value in (("guidance_scale", scale), ("guidance_strength", strength)):
            if value is not None:
                raise ValueError(f"{name} = {value} given without guidance; pass guidance= one of {GUIDANCE}")
        return None
    if guidance not in GUIDANCE:
        raise ValueError(f"unknown guidance {guidance!r}; choose one of {GUIDANCE} or None")
    if scale is None and strength is None:
        raise ValueError(f"guidance={guidance!r} needs a guidance_strength (>= 0; 0 is the plain model) or a "
                         f"guidance_scale (the plain model at {UNGUIDED[guidance]:g})")
    if strength is not None:
        if not float(strength) >= 0.0:  # also NaN
            raise ValueError(f"guidance_strength must be >= 0; got {strength}")
        scale = scale_of(guidance, strength)
    if not float(scale) >= 0.0:
        raise ValueError(f"guidance_scale must be >= 0; got {scale}")
    if model.config.objective != "mdc":
        raise ValueError(f"guidance applies to 'mdc' captioners; got objective {model.config.objective!r}")
    option, learnt, what = _NEEDS[guidance]
    if not learnt(model):
        raise ValueError(f"guidance={guidance!r} needs a model trained with {option} > 0 (its learned {what}); "
                         f"this model has {option} = {getattr(variants_of(model), option)}. Train with e.g. "
                         f"{option}=0.1 (MC-Diffusion's value)")
    return float(scale)


def combine(lp_cond: torch.Tensor, lp_var: torch.Tensor, guidance: str, scale: float, tok,
            temperature: float | None = None) -> torch.Tensor:
    """Guided log p [..., V] from log p(x | y) and log p(x | variant) at guidance ``scale`` (module
    docstring), divided by ``temperature`` if given, renormalised over caption tokens."""
    w = 1.0 - scale if guidance == "mcs" else scale  # weight of log p(x | y)
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
    def of(cls, model, images, guidance=None, scale=None, *, seed: int = 0, keys=None,
           condition: torch.Tensor | None = None) -> CaptionDistribution:
        """Encode ``images`` [B, 3, S, S] once at guidance ``scale``; MCS masks (both forms) from ``seed``
        (and ``keys`` [B] if given). At the unguided scale: the plain model's distribution (no second pass).
        ``condition``: the images' condition [B, T, W] (``model.condition(images)``) where already encoded,
        so that the guides of one batch share it."""
        check_guidance(model, guidance, scale)
        if is_unguided(guidance, scale):
            return CaptionDistribution(model, model.context(images) if condition is None else model.kv_context(condition))
        v = model.condition(images) if condition is None else condition  # [B, T, W]
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


def encoder(model, guidance: str | None, scale: float | None, seed: int = 0, strength: float | None = None):
    """The ``encode`` argument of :func:`mdc.sampler.generate` and :func:`mdc.scoring.score` for
    (guidance, scale or strength): None (the plain model) without guidance, else a function that
    makes the :class:`Guide` of a batch; MCS masks from ``seed`` and the images' keys. Checks its arguments."""
    scale = check_guidance(model, guidance, scale, strength)
    if guidance is None:
        return None

    def encode(model, images, keys=None) -> CaptionDistribution:
        return Guide.of(model, images, guidance, scale, seed=seed, keys=keys)
    return encode


def strength_label(guidance: str | None, strength: float | None) -> str:
    """"none", "cfg@s=2", "mcs_mirror@s=0.5": a run's name at a guidance strength (the sweeps' results and figures)."""
    return "none" if guidance is None else f"{guidance}@s={strength:g}"


def scale_label(guidance: str | None, scale: float | None) -> str:
    """"none", "cfg@scale=3", "mcs@scale=0.5": a run's name at a guidance scale."""
    return "none" if guidance is None else f"{guidance}@scale={scale:g}"


def is_unguided(guidance: str | None, scale: float | None) -> bool:
    """No guidance, or the scale at which the rule is the plain conditional model."""
    return guidance is None or float(scale) == UNGUIDED[guidance]
