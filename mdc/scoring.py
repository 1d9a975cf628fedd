"""Caption likelihood scorers for zero-shot matching (paper Sec. 4.2): the table and its entry points.

- "exact" (ARC, Eq. 7): :func:`mdc.autoregressive.exact_loglik`.
- "elbo" (MDC, Eq. 8): the Monte-Carlo bound of :mod:`mdc.absorbing` (:func:`~mdc.absorbing.elbo_score`;
  with ``max_samples``, :func:`elbo_sequential` adds copies where an item is unsure).
  Its settings travel as one :class:`~mdc.absorbing.ElboOptions` (samples, seed, interval,
  stratification, sequential budget); ``score(..., num_samples=64)`` is shorthand for it.
- "heuristic" (MDC): :func:`mdc.absorbing.heuristic_score`.
- "cosine" (CLIP): cosine similarity of the image and caption embeddings.

Randomness of the ELBO is keyed, not streamed: a caption's masked copies are drawn from (seed, key),
where the key is the caption's position in the call unless ``keys`` are given. A pair therefore scores
the same whatever else is in the batch, and captions that share a key share their copies (common random
numbers). Comparing the candidates of an item with one key (:func:`score_candidates`, ``paired=True``)
removes most of the Monte-Carlo noise from their *difference*, which is all a matching benchmark reads.

The MDC scorers query a :class:`mdc.distribution.CaptionDistribution` made by ``encode`` (default: the
plain model's); MC-Diffusion's guidance passes its guided one (:func:`mdc.api.score`).

One table, :data:`SCORERS`, names every scorer with the objectives it applies to, the one it is the
default of and whether it takes a caption distribution; :func:`resolve` checks a method against it and
against the model's noise process (``model.noise.scorers``, :mod:`mdc.noise`): "elbo" and "heuristic"
are bounds of the absorbing process, so a ``mask_replace`` model refuses them.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Callable, Hashable, Sequence

import torch

from mdc import distribution
from mdc.absorbing import ElboOptions, elbo_copies, elbo_score, heuristic_score
from mdc.autoregressive import exact_loglik
from mdc.model import OBJECTIVES, evaluating
from mdc.base.options import with_options
from mdc.tokenizer import caption_mask, trim_padding

__all__ = ["ElboOptions", "METHODS", "SCORERS", "elbo_options", "resolve", "score", "score_candidates"]


@dataclass(frozen=True)
class Scorer:
    """One scorer: ``fn(model, source, rows, tokens, *, elbo, keys, max_rows, group)`` -> scores [R], where
    ``source`` is the images [B, 3, S, S] or, with ``caption_distribution``, the caption distribution of the
    images (made by ``encode``: MC-Diffusion's guidance applies); each takes the settings it uses.
    ``objectives``: the models it applies to; ``default_for``: those it is the default scorer of."""
    fn: Callable
    objectives: tuple[str, ...]
    default_for: tuple[str, ...] = ()
    caption_distribution: bool = False


def _unsure(m1: torch.Tensor, m2: torch.Tensor, n: torch.Tensor, tolerance: float) -> torch.Tensor:
    """[A] items whose best candidate leads some other candidate, in some window, by less than
    ``tolerance`` standard errors of the mean per-copy difference. From the running sums of the
    terms m1 [A, K, J] and of their products m2 [A, K, K, J] over n [A] copies (float64)."""
    A, K, J = m1.shape
    n = n.double()[:, None, None]
    mean, second = m1 / n, m2 / n[..., None]  # [A, K, J], [A, K, K, J]
    best = mean.argmax(1, keepdim=True)  # [A, 1, J]
    lead = mean.gather(1, best) - mean  # [A, K, J]
    with_best = second.gather(1, best[:, :, None].expand(A, 1, K, J))[:, 0]  # E[x_best x_k]: [A, K, J]
    square = second.diagonal(dim1=1, dim2=2).transpose(1, 2)  # E[x_k^2]: [A, K, J]
    var = (square.gather(1, best) - 2 * with_best + square - lead**2).clamp(min=0) * n / (n - 1).clamp(min=1)
    return (lead < tolerance * (var / n).sqrt()).flatten(1).any(1)  # the best against itself: 0 < 0


def elbo_sequential(model, context, rows, tokens, group: int, options: ElboOptions, keys=None, max_rows=256):
    """The ELBO of items of ``group`` consecutive captions (an item's candidates), with masked copies
    added where the item's decision is not yet clear: (scores [R] or [R, J], copies per item [R / group]).

    Round 0 is :func:`elbo_score` with ``num_samples`` copies and the captions' keys, so an item that is
    sure at once scores exactly as the fixed estimate. While an item is unsure (:func:`_unsure`: its best
    candidate's lead over another is under ``tolerance`` standard errors of the paired per-copy difference,
    in any window) and has fewer than ``max_samples`` copies, round r >= 1 draws as many copies again
    (keys (key, r)), doubling its count. The score is the mean over all its copies. The standard error
    treats the copies as independent, which overstates it for stratified copies: the rule errs towards
    more copies. What it targets is the decision; a score's copy count depends on it."""
    R, K, J = len(tokens), group, len(options.windows)
    B, keys = R // K, list(range(R) if keys is None else keys)
    first, most = options.num_samples, options.max_samples or options.num_samples
    m1 = torch.zeros(B, K, J, dtype=torch.float64)
    m2 = torch.zeros(B, K, K, J, dtype=torch.float64)
    copies = torch.zeros(B, dtype=torch.long)
    out = torch.zeros(B, K, J)
    active, size, r = torch.arange(B), first, 0
    while len(active):
        sel = (active[:, None] * K + torch.arange(K)).flatten()  # the active items' captions
        round_keys = [keys[i] if r == 0 else (keys[i], r) for i in sel.tolist()]
        x = elbo_copies(model, context, rows[sel.to(rows.device)], tokens[sel.to(tokens.device)],
                        replace(options, num_samples=size), round_keys, max_rows).cpu().view(len(active), K, J, size)
        if r == 0:  # elbo_score's numbers, to the bit
            out = x.sum(-1) / size  # [B, K, J]
        x = x.double()
        m1[active] += x.sum(-1)
        m2[active] += torch.einsum("akjs,aljs->aklj", x, x)
        copies[active] += size
        active = active[(copies[active] < most) & _unsure(m1[active], m2[active], copies[active], options.tolerance)]
        size, r = min(first * 2 ** r, most - first * 2 ** r), r + 1
    more = copies > first
    out[more] = (m1[more] / copies[more, None, None]).float()
    out = out.view(R, J).to(tokens.device)
    return (out if options.several else out[:, 0]), copies


def _cosine(model, images, rows, tokens, **_):
    return (model.image_embedding(images)[rows] * model.text_embedding(tokens)).float().sum(-1)


def _exact(model, images, rows, tokens, *, max_rows, **_):
    return exact_loglik(model, model.context(images), rows, tokens, max_rows)  # each image encoded once


def _heuristic(model, dist, rows, tokens, **_):
    return heuristic_score(model, dist, rows, tokens)


def _elbo(model, dist, rows, tokens, *, elbo: ElboOptions, keys, max_rows, group=1):
    if elbo.max_samples is None or elbo.max_samples == elbo.num_samples:
        return elbo_score(model, dist, rows, tokens, elbo, keys, max_rows)
    return elbo_sequential(model, dist, rows, tokens, group, elbo, keys, max_rows)[0]


SCORERS = {
    "exact": Scorer(_exact, ("arc",), default_for=("arc",)),
    "elbo": Scorer(_elbo, ("mdc",), caption_distribution=True),
    "heuristic": Scorer(_heuristic, ("mdc",), default_for=("mdc",), caption_distribution=True),
    "cosine": Scorer(_cosine, ("clip",), default_for=("clip",)),
}
# read-only view of the table by objective, for callers that choose by objective (mdc.eval.compositionality)
METHODS = {o: tuple(name for name, s in SCORERS.items() if o in s.objectives) for o in OBJECTIVES}
DISTRIBUTION_SCORERS = tuple(name for name, s in SCORERS.items() if s.caption_distribution)


def resolve(model, method: str | None = None) -> tuple[str, Scorer]:
    """(name, row) of the scorer ``method`` (None: the default of the model's objective), or a ValueError
    in one line: a method of another objective, or one the model's noise process does not support."""
    objective = model.config.objective
    if method is None:
        method = next(name for name, s in SCORERS.items() if objective in s.default_for)
    if method not in METHODS[objective]:
        raise ValueError(f"method {method!r} does not apply to a {objective!r} model; "
                         f"choose one of {METHODS[objective]}")
    if model.noise is not None:  # a diffusion captioner: only the scorers of its own noise process
        model.noise.check_scorer(method)
    return method, SCORERS[method]


def elbo_options(elbo: ElboOptions | None = None, **kw) -> ElboOptions:
    """``elbo`` (default: :class:`ElboOptions`'s defaults) with the fields ``kw`` replaced; a ValueError
    names an option that is not one of its fields."""
    return with_options(ElboOptions, elbo, kw, "ELBO")


def _tokenize(model, captions: Sequence[str]) -> torch.Tensor:
    """Tokens [B, L'] of the captions; empty captions are errors, truncation is reported."""
    tokens, stats = model.tokenizer.tokenize(list(captions))
    tok = model.tokenizer
    empty = (caption_mask(tokens, tok.sot_id, tok.eot_id).sum(1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"caption at index {empty[0]} ({captions[empty[0]]!r}) has no tokens; "
                         f"{len(empty)} empty caption(s) in all (an empty caption would score 0, the best score)")
    if stats.truncated:
        warnings.warn(f"{stats.truncated} of {len(tokens)} captions are longer than the context of "
                      f"{tok.context_length} tokens and were truncated; captions that differ only past it tie",
                      stacklevel=4)
    return trim_padding(tokens, tok.eot_id)


def _image_keys(rows: torch.Tensor, keys, n_images: int) -> list:
    """Per image, the noise key of its first caption (default keys: caption indices): the key of
    any noise the caption distribution draws per image (MC-Diffusion's partial-condition masks)."""
    first: dict[int, int] = {}
    for r, b in enumerate(rows.tolist()):
        first.setdefault(b, r)
    return [(first[b] if keys is None else keys[first[b]]) if b in first else ("image", b)
            for b in range(n_images)]


def _score(model, images, rows, captions, method, elbo: ElboOptions, *, keys=None, max_rows=256,
           precision="fp32", encode=None):
    """Scores [R] of captions[r] against images[rows[r]] (an item's candidates in a run of equal length):
    checks, tokenises, encodes every image once."""
    method, scorer = resolve(model, method)
    if elbo.max_samples is not None and method != "elbo":
        raise ValueError(f"max_samples applies to the 'elbo' scorer; got {elbo.max_samples} for method {method!r}")
    if keys is not None and len(keys) != len(captions):
        raise ValueError(f"got {len(keys)} keys for {len(captions)} captions")
    if encode is not None and not scorer.caption_distribution:
        raise ValueError(f"a caption distribution (encode) applies to the MDC scorers {DISTRIBUTION_SCORERS}; "
                         f"got method {method!r}")
    model.check_images(images)
    tokens = _tokenize(model, captions).to(images.device)
    with evaluating(model, precision):
        source = images
        if scorer.caption_distribution:
            source = (encode or distribution.encode)(model, images, _image_keys(rows, keys, len(images)))
        group = len(rows) // max(len(images), 1)  # candidates per image
        return scorer.fn(model, source, rows, tokens, elbo=elbo, keys=keys, max_rows=max_rows, group=group)


@torch.no_grad()
def score(model, images, captions: Sequence[str], method: str | None = None, *,
          keys: Sequence[Hashable] | None = None, max_rows: int = 256, precision: str = "fp32", encode=None,
          elbo: ElboOptions | None = None, **elbo_kw) -> torch.Tensor:
    """Score each (image, caption) pair: Tensor [B]; higher = better match.

    ELBO only: ``elbo`` (an :class:`ElboOptions`) or its fields as keywords (``num_samples`` masked copies
    per caption, ``seed``, ``windows`` restricting the mask ratios summed, default all (Eq. 8),
    ``stratified``); ``keys`` [B] name each caption's noise (default: its index in this call);
    ``max_rows`` bounds the rows of one forward pass. ``precision``: "fp32" (the default on every
    device: a score does not depend on its batch beyond float32 rounding, nor on an autocast the
    caller entered) | "bf16" (opt-in autocast; the vocabulary head and the log-softmax stay fp32;
    scores move by up to ~0.2 nats, the heuristic's most) | "auto" (bf16 on CUDA). MDC scorers:
    ``encode(model, images, keys)`` makes the caption distribution (default: the plain model's;
    ``keys`` [B]: each image's first caption key), as :func:`mdc.api.score` does for MC-Diffusion's guidance.
    """
    if len(captions) != len(images):
        raise ValueError(f"got {len(images)} images but {len(captions)} captions")
    rows = torch.arange(len(images), device=images.device)
    return _score(model, images, rows, captions, method, elbo_options(elbo, **elbo_kw), keys=keys,
                  max_rows=max_rows, precision=precision, encode=encode)


@torch.no_grad()
def score_candidates(model, images, candidates: Sequence[Sequence[str]], method: str | None = None, *,
                     paired: bool = True, item_keys: Sequence[Hashable] | None = None, max_rows: int = 256,
                     precision: str = "fp32", elbo: ElboOptions | None = None, **kw) -> torch.Tensor:
    """Scores [B, K] of K candidate captions per image (the true and false captions of an item).

    ``paired``: all candidates of an item share one noise key (common random numbers for the
    ELBO); else every candidate has its own. ``item_keys`` [B] (default: the item's index in
    this call) fix an item's noise whatever else is in the call. Each image is encoded once.
    ``kw``: ``encode`` and the ELBO's options, as in :func:`score`.

    ELBO, sequentially: with ``max_samples`` > ``num_samples``, an item whose best candidate leads another
    by less than ``tolerance`` standard errors gets more masked copies, doubling its count up to
    ``max_samples`` (:func:`elbo_sequential`); an item clear at ``num_samples`` scores as without.
    """
    if len(candidates) != len(images):
        raise ValueError(f"got {len(images)} images but {len(candidates)} candidate lists")
    K = len(candidates[0]) if len(candidates) else 0
    if any(len(c) != K for c in candidates):
        raise ValueError("every item needs the same number of candidate captions")
    item_keys = range(len(images)) if item_keys is None else item_keys
    keys = [key if paired else (key, k) for key in item_keys for k in range(K)]
    rows = torch.arange(len(images), device=images.device).repeat_interleave(K)
    flat = [c for cands in candidates for c in cands]
    encode = kw.pop("encode", None)
    out = _score(model, images, rows, flat, method, elbo_options(elbo, **kw), keys=keys, max_rows=max_rows,
                 precision=precision, encode=encode)  # [B*K] or, for several intervals, [B*K, J]
    return out.view(len(images), K, *out.shape[1:])
