"""The caption noise process: one interface, its variants chosen once where the model is built.

A :class:`NoiseProcess` is what follows from how captions are corrupted: the training loss
(``loss``), the sampler that inverts the corruption (``sample``) and the likelihood scorers of
:mod:`mdc.scoring` that are bounds of *this* process (``scorers``). A captioner carries one as
``model.noise``; :func:`mdc.factory.build` picks it from ``ModelConfig.noise``, once, and the
sampler, the scorers and ``model.loss`` ask it rather than the config (MDLM's noise schedules,
one interface with small variants). ARC and CLIP models have none (``model.noise is None``).

- :data:`ABSORBING` (MDC, the default): every caption token goes to [MASK] with probability t
  (:func:`mdc.diffusion.corrupt`); loss :func:`mdc.loss.mdc_loss` (Eq. 5), sampler
  :func:`mdc_sample` (Eq. 6, below), scorers "elbo" (Eq. 8) and "heuristic".
- ``mask_replace`` (D3PM / VQ-Diffusion, MC-Diffusion's): an extension, :data:`mdc.d3pm.MASK_REPLACE`.

The unmasking sampler (Eq. 6) starts from [SOT] [MASK]*N' [EOT] and runs ceil(N'/k) steps.
Each step predicts every masked position, takes the confidence of position i as max_j p(j)
under the caption-token distribution of :func:`mdc.diffusion.caption_log_probs` (ids a caption
never holds removed, the rest renormalised; the heuristic scorer ranks by the same numbers),
and reveals the k most confident masked positions (k = 1 by default: N' steps, Eq. 6).
Revealed tokens stay fixed. The image is encoded and every block's cross-attention keys/values
are computed once per batch (:class:`mdc.condition.ImageContext`); only the text is re-run. It
queries a :class:`mdc.distribution.CaptionDistribution` made by an ``encode`` function
(default: the plain model's); MC-Diffusion's guidance passes its guided one (:func:`mdc.api.generate`).
"""
from __future__ import annotations

import torch

from mdc import distribution
from mdc.diffusion import masked_row
from mdc.loss import mdc_loss

__all__ = ["ABSORBING", "Absorbing", "NoiseProcess", "check_length", "mdc_sample"]


class NoiseProcess:
    """The interface: a variant names itself (``name``, the ``ModelConfig.noise`` value it serves)
    and the scorers whose likelihood is its own (``scorers``), and trains and samples a captioner."""
    name: str = ""
    scorers: tuple[str, ...] = ()

    def loss(self, model, images: torch.Tensor, tokens: torch.Tensor, **kw) -> torch.Tensor:
        """The training loss (a scalar) of ``tokens`` [B, L] given ``images`` [B, 3, S, S]."""
        raise NotImplementedError

    def sample(self, model, images: torch.Tensor, length: int, *, generator=None, encode=None,
               **options) -> torch.Tensor:
        """Captions of ``length`` tokens: [B, length + 2] without [MASK]. ``encode`` makes the caption
        distribution (:func:`mdc.distribution.encode` by default); ``options``: the variant's own."""
        raise NotImplementedError

    def check_scorer(self, method: str) -> None:
        """A ValueError in one line, naming this variant and its scorers, unless it supports ``method``."""
        if method not in self.scorers:
            supported = f"only {list(self.scorers)}" if self.scorers else "no scorer"
            raise ValueError(f"scorer {method!r} does not apply to a captioner with {self.name!r} noise, "
                             f"which supports {supported}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __deepcopy__(self, memo):
        return self  # stateless: a copied model shares its process


class Absorbing(NoiseProcess):
    """MDC's absorbing noise (paper Sec. 3): loss Eq. 5, greedy confidence unmasking Eq. 6, scorers
    Eq. 8 and the heuristic. ``options`` of :meth:`sample`: those of :func:`mdc_sample`."""
    name = "absorbing"
    scorers = ("elbo", "heuristic")

    def loss(self, model, images, tokens, **kw):
        return mdc_loss(model, images, tokens, **kw)  # kw: t, noise, generator

    def sample(self, model, images, length, *, generator=None, encode=None, **options):
        return mdc_sample(model, images, length, generator=generator, encode=encode, **options)


ABSORBING = Absorbing()


def check_length(model, length: int) -> None:
    if not 1 <= length <= model.config.context_length - 2:
        raise ValueError(f"length must lie in [1, {model.config.context_length - 2}] "
                         f"(context {model.config.context_length} minus SOT/EOT); got {length}")


@torch.no_grad()
def mdc_sample(model, images, length: int, tokens_per_step: int = 1, temperature: float = 0.0,
               generator: torch.Generator | None = None, threshold: float | None = None,
               trace: list | None = None, encode=None) -> torch.Tensor:
    """Greedy confidence unmasking. Returns tokens [B, length + 2] without [MASK].

    Each step reveals the ``tokens_per_step`` most confident masked positions, or, with
    ``threshold`` (parallel decoding after Fast-dLLM), every masked position whose confidence
    exceeds it, at least the most confident one. The head runs only at still-masked positions.
    ``encode(images)`` makes the distribution ranked and sampled (default: the plain model's;
    MC-Diffusion's guided one from :func:`mdc.guidance.encoder`). ``trace``: a list that receives one
    record per step, ``{"revealed": [B, N'+2] bool, "tokens": [B, N'+2] after the step,
    "confidence": [B, N'+2]}`` (each still-masked position's confidence at that step, -1 at the
    others); :func:`mdc.plots.plot_unmasking` draws it (nothing is recorded without a list)."""
    check_length(model, length)
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be >= 1; got {tokens_per_step}")
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1]; got {threshold}")
    tok = model.tokenizer
    dist = (encode or distribution.encode)(model, images)  # encoder + cross-attn K/V, once
    x = masked_row(tok, len(images), length, images.device)  # [B, N'+2]
    while True:
        still = x == tok.mask_id  # [B, N'+2]
        if not bool(still.any()):
            return x
        logp = dist.log_probs(x, where=still, temperature=temperature or None)  # [M, V] masked positions only
        if temperature > 0:
            p = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)  # [M]
            c = logp.gather(-1, p[:, None]).squeeze(1).exp()
        else:
            c, p = logp.exp().max(-1)  # [M]
        conf = torch.full(x.shape, -1.0, device=x.device).masked_scatter_(still, c)  # [B, N'+2]
        pred = x.masked_scatter(still, p)
        if threshold is None:
            top = conf.topk(min(tokens_per_step, int(still.sum(1).max())), dim=-1).indices  # [B, k] most confident
            reveal = torch.zeros_like(still).scatter_(1, top, True) & still
        else:
            reveal = (conf > threshold) | (conf == conf.max(1, keepdim=True).values)  # at least the best one
            reveal &= still
        x = torch.where(reveal, pred, x)
        if trace is not None:
            trace.append({"revealed": reveal.cpu(), "tokens": x.cpu(), "confidence": conf.float().cpu()})
