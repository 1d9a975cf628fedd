"""The caption noise process: one interface, its variants chosen once where the model is built.

A :class:`NoiseProcess` is what follows from how captions are corrupted: the training loss
(``loss``), the sampler that inverts the corruption (``sample``) and the likelihood scorers of
:mod:`mdc.scoring` that are bounds of *this* process (``scorers``). A diffusion captioner carries
one as ``model.noise``; :func:`mdc.factory.build` picks it, once, and the sampler, the scorers and
``model.loss`` ask it rather than the config (MDLM's noise schedules: one interface, small
variants). ARC and CLIP models have none (``model.noise is None``).

- :data:`mdc.absorbing.ABSORBING` (MDC, the default): masking, Eq. 5, Eq. 6, Eq. 8, the heuristic.
- :data:`mdc.mc_diffusion.mask_replace.MASK_REPLACE` (D3PM / VQ-Diffusion, MC-Diffusion's): an extension.
"""
from __future__ import annotations

import torch

__all__ = ["NoiseProcess"]


class NoiseProcess:
    """The interface: a variant names itself (``name``) and the scorers whose likelihood is its own
    (``scorers``), and trains and samples a captioner."""
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
