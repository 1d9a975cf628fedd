"""Caption generation, the one entry point: each captioner decodes by its own method.

A diffusion captioner samples with its noise process (``model.noise.sample``, :mod:`mdc.noise`):
MDC's greedy confidence unmasking (Eq. 6, :func:`mdc.unmasking.mdc_sample`) or, for a
``mask_replace`` model, the D3PM reverse process (:mod:`mdc.mc_diffusion.mask_replace`). ARC decodes left to right
with a KV cache (:func:`mdc.autoregressive.arc_sample`). The image is encoded once per batch.

The diffusion samplers query a :class:`mdc.distribution.CaptionDistribution` made by an
``encode`` function (default: the plain model's); MC-Diffusion's guidance passes its guided one
(:func:`mdc.api.generate` wires it in).
"""
from __future__ import annotations

from mdc.unmasking import DECODERS, decoder_options
from mdc.autoregressive import arc_sample
from mdc.model import evaluating

__all__ = ["generate", "list_decoders"]


def list_decoders() -> list[str]:
    """The named decoders of an MDC captioner (``generate(..., decoder=name)``; :data:`mdc.unmasking.DECODERS`)."""
    return sorted(DECODERS)


def generate(model, images, length: int | None = 15, *, beam_size: int = 6, min_length=None, generator=None,
             return_tokens: bool = False, precision: str = "auto", encode=None, decoder: str | None = None,
             **options):
    """Captions for `images` [B, 3, H, W]: list[str] (or the token tensor).

    A diffusion captioner samples with its noise process (``model.noise.sample``): MDC's absorbing
    noise gives exactly `length` tokens by greedy confidence unmasking, or, for a model trained with its
    caption length hidden (``length_visible=False``) and ``length=None``, the caption up to the first [EOT]
    it predicts (tokens [PAD] after it); ``decoder`` names a set of its options (:func:`list_decoders`:
    ``confidence``, the paper's and the default; ``margin``; ``ancestral``; ``semi-autoregressive``; ``remask``)
    and ``options`` are its own, given alone or beside ``decoder`` (``order``, ``blocks``, ``refine``;
    ``tokens_per_step`` or a confidence ``threshold`` reveal several per step; ``temperature`` > 0
    samples; ``trace``: a list that receives each step's revealed positions, tokens and confidences,
    see :func:`mdc.unmasking.mdc_sample`); a ``mask_replace`` model runs the D3PM reverse process
    (``generator`` drives it) and refuses those options. ARC: at most `length` tokens, beam search
    with `beam_size` (1 = greedy), [EOT] held back until `min_length` tokens (one int, or one per image;
    ARC only, :func:`mdc.autoregressive.arc_sample`). ``precision``: "auto" (bf16 autocast on CUDA, fp32 elsewhere) |
    "fp32" | "bf16". ``encode`` makes the caption distribution of the images (MC-Diffusion's
    guidance, wired by :func:`mdc.api.generate`).
    """
    if model.config.objective == "clip":
        raise ValueError("a CLIP model cannot generate captions; use an 'mdc' or 'arc' model")
    model.check_images(images)
    if length is None:
        model.check_length(length)  # a predicted length: an MDC model trained with length_visible=False only
    options = decoder_options(decoder, {name: value for name, value in options.items() if value is not None})
    if min_length is not None and model.noise is not None:
        raise ValueError("min_length holds ARC's [EOT] back; a diffusion captioner writes exactly `length` tokens")
    if model.noise is None and options:
        what = "trace records MDC's unmasking steps" if "trace" in options else \
            f"{sorted(options)} are options of MDC's unmasking sampler"
        raise ValueError(f"{what}; this model samples otherwise (objective {model.config.objective!r})")
    with evaluating(model, precision):
        if model.noise is None:  # ARC: no noise process
            tokens = arc_sample(model, images, max_length=length, beam_size=beam_size,
                                min_length=0 if min_length is None else min_length)
        else:
            tokens = model.noise.sample(model, images, length, generator=generator, encode=encode, **options)
    return tokens if return_tokens else model.tokenizer.batch_decode(tokens)
