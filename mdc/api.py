"""The public API for captions and scores: the core's sampler and scorers with the extensions wired in.

``mdc.generate`` and ``mdc.score`` / ``mdc.score_candidates`` are :func:`mdc.sampler.generate` and
:func:`mdc.scoring.score` / :func:`mdc.scoring.score_candidates` plus MC-Diffusion's options:
``guidance`` "cfg" | "mcs" | "mcs_mirror" with ``guidance_strength`` s >= 0 (the distance from the
plain model, 0 for every rule) or ``guidance_scale`` (:mod:`mdc.mc_diffusion.guidance`: CFG and mirrored MCS are
unguided at 1, MCS as printed at 0; give one of the two). The core never imports the extensions;
this module picks guidance, as the factory picks a model's visual tower and its noise process: a
captioner samples, and is scored, by the noise process it carries (``model.noise``, :mod:`mdc.noise`;
the D3PM reverse process of :mod:`mdc.mc_diffusion.mask_replace` for a ``noise="mask_replace"`` captioner, which
supports none of the MDC scorers).
"""
from __future__ import annotations

from typing import Sequence

import torch

from mdc import sampler, scoring
from mdc.mc_diffusion.guidance import encoder

__all__ = ["generate", "score", "score_candidates"]


def generate(model, images, length: int | None = 15, *, guidance: str | None = None,
             guidance_scale: float | None = None, guidance_seed: int = 0, guidance_strength: float | None = None, **kw):
    """Captions for ``images`` [B, 3, H, W]: list[str] (or tokens with ``return_tokens=True``).

    MDC: exactly ``length`` tokens by greedy confidence unmasking (``length=None``: predicted, for a model
    trained with ``length_visible=False``); ARC: at most ``length`` tokens by
    beam search (``beam_size``, 1 = greedy); a ``mask_replace`` model: the D3PM reverse process
    (``generator`` drives it). ``guidance`` with ``guidance_strength`` or ``guidance_scale`` (MDC
    only, not both; a ValueError names the conflict): sample under the guided distribution;
    ``guidance_seed`` seeds MCS's partial-condition masks. Other keywords (``beam_size``, ``min_length``,
    ``decoder`` (:func:`mdc.list_decoders`), ``tokens_per_step``, ``threshold``, ``temperature``, ``order``,
    ``blocks``, ``refine``, ``generator``, ``return_tokens``, ``precision``, ``trace``) as in
    :func:`mdc.sampler.generate`.
    """
    if model.config.objective != "clip":  # a CLIP model is refused by the sampler, naming itself
        kw["encode"] = encoder(model, guidance, guidance_scale, guidance_seed, guidance_strength)
    return sampler.generate(model, images, length, **kw)


def _guided(model, method, guided: tuple, seed: int | None, kw: dict) -> None:
    """Set the scorers' keywords ``kw`` in place: ``seed`` (the ELBO's and MCS's, if given) and ``encode``,
    one of the caller's own or the guided distribution of ``guided`` = (guidance, scale, strength), its MCS
    masks keyed by (seed, the image's first key); None for the plain model."""
    if seed is not None:
        kw["seed"] = seed
    seed = kw.get("seed", kw["elbo"].seed if kw.get("elbo") is not None else 0)
    kw["encode"] = _scoring_encoder(model, method, guided, seed, kw.get("encode"))


def _scoring_encoder(model, method, guided: tuple, seed: int, encode):
    guidance, guidance_scale, guidance_strength = guided
    if guidance is not None and not scoring.resolve(model, method)[1].caption_distribution:
        raise ValueError(f"guidance applies to the MDC scorers {scoring.DISTRIBUTION_SCORERS}; got method {method!r}")
    if guidance is not None and encode is not None:
        raise ValueError("give either guidance or encode (a caption distribution of your own), not both")
    return encode or encoder(model, guidance, guidance_scale, seed, guidance_strength)


@torch.no_grad()
def score(model, images, captions: Sequence[str], method: str | None = None, *, guidance: str | None = None,
          guidance_scale: float | None = None, guidance_strength: float | None = None, seed: int | None = None,
          precision: str = "fp32", **kw) -> torch.Tensor:
    """Score each (image, caption) pair: Tensor [B]; higher = better match. Methods: "exact" (ARC),
    "elbo" and "heuristic" (MDC), "cosine" (CLIP). ``guidance`` with ``guidance_strength`` or
    ``guidance_scale``: the MDC scorers under the guided distribution (MCS masks keyed by ``seed`` and the
    image's first key). ``encode`` (instead of guidance): a caption distribution of your own, e.g.
    :func:`mdc.distribution.encode_null` for the image-free score. Other keywords (the ELBO's options
    ``num_samples``, ``seed``, ``windows``, ``stratified`` or ``elbo``; ``max_rows``, ``keys``) and
    ``precision`` (fp32 unless "bf16" is asked for) as in :func:`mdc.scoring.score`."""
    _guided(model, method, (guidance, guidance_scale, guidance_strength), seed, kw)
    return scoring.score(model, images, captions, method, precision=precision, **kw)


@torch.no_grad()
def score_candidates(model, images, candidates: Sequence[Sequence[str]], method: str | None = None, *,
                     guidance: str | None = None, guidance_scale: float | None = None,
                     guidance_strength: float | None = None, seed: int | None = None, precision: str = "fp32",
                     **kw) -> torch.Tensor:
    """Scores [B, K] of K candidate captions per image, as :func:`mdc.scoring.score_candidates`,
    with ``guidance`` (``guidance_strength`` or ``guidance_scale``) or ``encode`` and ``precision`` as
    in :func:`score`."""
    _guided(model, method, (guidance, guidance_scale, guidance_strength), seed, kw)
    return scoring.score_candidates(model, images, candidates, method, precision=precision, **kw)
