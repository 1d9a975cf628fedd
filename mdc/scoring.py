"""Caption likelihood scorers for zero-shot matching (paper Sec. 4.2, Eq. 7 and Eq. 8).

- "exact" (ARC, Eq. 7): sum_i log p(c^i | c^{<i}, f(I)) over the caption tokens and [EOT]
  (the end token makes it a likelihood of the complete caption).
- "elbo" (MDC, Eq. 8): the masked-diffusion lower bound
      log p(C) >= sum_{n=1}^{N} E_{C_n}[ (1/n) sum_{i masked in C_n} log p(c^i | C_n, f(I)) ]
  estimated with S = `num_samples` masked copies per caption: copy s masks
  n_s = 1 + floor(N (s + u) / S) tokens (stratified over the mask counts by one offset u;
  ``stratified=False`` draws every n_s i.i.d. instead, the plain Monte-Carlo estimate), a
  uniformly random n_s-subset, and the estimate is N * mean_s (1/n_s) sum_masked log p.
  Candidates of an item can be scored sequentially (``max_samples``): copies are added, doubling,
  while the item's decision is within a few standard errors (:func:`elbo_sequential`).
  ``t_interval=(w_l, w_u)`` keeps only the counts with n/N in [w_l, w_u] (the ratios a model
  trained on t ~ U[w_l, w_u] has seen); (0, 1) is Eq. 8 itself.
- "heuristic" (MDC): start fully masked; N times, reveal the most confident masked position
  (the sampler's confidence), add log p(ground-truth token) there and write it in.
- "cosine" (CLIP): cosine similarity of the image and caption embeddings.

Log-probabilities are those of :func:`mdc.diffusion.caption_log_probs` (the sampler's).

Randomness of the ELBO is keyed, not streamed: the offset u and the position noise of a
caption are drawn from a generator seeded by (seed, key), where the key is the caption's
position in the call unless ``keys`` are given. A pair therefore scores the same whatever
else is in the batch, and captions that share a key share their noise: same mask counts and,
where their lengths allow, the same masked positions (common random numbers). Comparing the
candidates of an item with one key (:func:`score_candidates`, ``paired=True``) removes most of
the Monte-Carlo noise from their *difference*, which is all a matching benchmark looks at.

The MDC scorers query a :class:`mdc.distribution.CaptionDistribution` made by ``encode``
(default: the plain model's); MC-Diffusion's guidance passes its guided one (:func:`mdc.api.score`).

One table, :data:`SCORERS`, names every scorer with the objectives it applies to, the one it is
the default of and whether it takes a caption distribution; :func:`resolve` checks a method
against it and against the model's noise process (``model.noise.scorers``, :mod:`mdc.noise`):
"elbo" and "heuristic" are bounds of the absorbing process, so a ``mask_replace`` model refuses them.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch

from mdc import distribution
from mdc.diffusion import banned_ids, corrupt, key_seed
from mdc.distribution import as_distribution
from mdc.model import OBJECTIVES, evaluating
from mdc.tokenizer import caption_mask, trim_padding, valid_mask


def exact_loglik(model, context, rows, tokens, max_rows=256):
    """ARC log-likelihood [R] by teacher forcing; token row r decodes against image rows[r] of ``context``.

    The log-probabilities of :func:`mdc.diffusion.caption_log_probs` (``allow_eot``) at the targets
    only, log p(c) = logit(c) - logsumexp(allowed logits), ``max_rows`` token rows per forward pass
    and the head at their caption and [EOT] targets alone: the largest tensor is
    [<= max_rows * (L - 1), V], never [R, L, V] (2.4 GB of fp32 at V = 49,409 and 160 rows of 77)."""
    tok = model.tokenizer
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    valid = valid_mask(tokens, tok.eot_id)[:, 1:]  # [R, L-1] the targets that are caption tokens or [EOT]
    banned = banned_ids(tok, allow_eot=True)
    ll = torch.zeros(targets.shape, device=tokens.device)  # [R, L-1]; 0 at padding
    for a in range(0, len(tokens), max_rows):
        c = slice(a, a + max_rows)
        logits = model.head(model.hidden(inputs[c], context.select(rows[c]))[valid[c]]).float()  # [M, V]
        logits[:, banned] = -math.inf
        ll[c][valid[c]] = logits.gather(-1, targets[c][valid[c]][:, None]).squeeze(-1) - logits.logsumexp(-1)
    return ll.sum(1)


def heuristic_score(model, context, rows, tokens):
    """Greedy-order sum of ground-truth log-probabilities [R] (paper Sec. 4.2).
    ``context``: an ImageContext, or a :class:`mdc.distribution.CaptionDistribution`."""
    tok = model.tokenizer
    dist = as_distribution(model, context).select(rows)
    todo = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [R, L] still masked
    x = corrupt(tokens, todo, tok.mask_id).noisy  # every caption token masked
    total = torch.zeros(len(tokens), device=tokens.device)
    r = torch.arange(len(tokens), device=tokens.device)
    for _ in range(int(todo.sum(1).max())):
        logp = dist.log_probs(x, where=todo)  # [M, V] at the still-masked positions only
        conf = torch.full(x.shape, -torch.inf, device=x.device).masked_scatter_(todo, logp.max(-1).values)  # [R, L]
        truth_ll = torch.zeros(x.shape, device=x.device).masked_scatter_(
            todo, logp.gather(-1, tokens[todo][:, None]).squeeze(-1))  # [R, L] log p(ground truth)
        pos = conf.argmax(-1)  # [R] most confident masked position
        active = todo[r, pos]  # rows whose caption is not complete yet
        truth = tokens[r, pos]
        total += torch.where(active, truth_ll[r, pos], torch.zeros_like(total))
        x[r, pos] = torch.where(active, truth, x[r, pos])
        todo[r, pos] = False
    return total


def elbo_noise(keys: Sequence[Hashable], seed: int, num_samples: int, width: int,
               stratified: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per caption, from its key: the uniforms v [R, S] that pick the mask counts and the position
    noise [R, S, width]. Stratified: v_s = (s + u) / S with one offset u; else S i.i.d. uniforms."""
    levels, noise = [], []
    for key in keys:
        g = torch.Generator().manual_seed(key_seed(seed, key))
        u = torch.rand(1 if stratified else num_samples, generator=g)
        levels.append((torch.arange(num_samples) + u) / num_samples if stratified else u)
        noise.append(torch.rand(num_samples, width, generator=g))
    return torch.stack(levels), torch.stack(noise)


def _chunks(R: int, S: int, max_rows: int):
    """Slices of the R * S masked copies (caption-major), at most ``max_rows`` long and aligned to
    whole captions (or, for S > max_rows, within one caption), so that each chunk's copies share
    their images in equal runs and the image context is folded rather than copied."""
    if S <= max_rows:
        step = max_rows // S * S
        return [slice(a, min(a + step, R * S)) for a in range(0, R * S, step)]
    return [slice(c * S + a, c * S + min(a + max_rows, S)) for c in range(R) for a in range(0, S, max_rows)]


def _intervals(t_interval) -> list[tuple[float, float]]:
    """One (w_l, w_u) or a sequence of them, as a list."""
    return [tuple(t) for t in t_interval] if isinstance(t_interval[0], (tuple, list)) else [tuple(t_interval)]


def _count_bounds(t_interval, N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask counts lo..hi [R] with n / N in [w_l, w_u]: bounds in float64 (float32 has
    ceil(0.6 * 25) = 16), 1e-9 absorbing decimals' rounding, at least one count."""
    lo = torch.clamp(torch.ceil(t_interval[0] * N.double() - 1e-9), min=1).long()
    return lo, torch.maximum(torch.floor(t_interval[1] * N.double() + 1e-9).long(), lo)


def elbo_copies(model, context, rows, tokens, num_samples, seed=0, max_rows=256, keys=None,
                t_interval=((0.0, 1.0),), stratified=True) -> torch.Tensor:
    """The terms [R, J, S] of the Monte-Carlo estimate of Eq. 8 (:func:`elbo_score` is their mean over S):
    copy s of caption r, for interval j, is span * (1/n_s) sum_masked log p if its count n_s lies in
    the interval, else 0. ``t_interval``: a list of J (w_l, w_u)."""
    tok, dist = model.tokenizer, as_distribution(model, context)
    R, L = tokens.shape
    S, dev = num_samples, tokens.device
    maskable = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [R, L] positions 1..N
    N = maskable.sum(1).cpu()  # [R] caption lengths
    bounds = [_count_bounds(t, N) for t in t_interval]  # J x ([R], [R])
    lo = torch.stack([b[0] for b in bounds]).min(0).values  # [R] the hull of the intervals' counts
    hi = torch.stack([b[1] for b in bounds]).max(0).values
    span = hi - lo + 1  # [R]
    v, noise = elbo_noise(range(R) if keys is None else keys, seed, S, model.config.context_length, stratified)
    n = lo[:, None] + (v * span[:, None]).floor().long()  # [R, S] uniform over lo..hi
    inside = torch.stack([(n >= a[:, None]) & (n <= b[:, None]) for a, b in bounds], 1)  # [R, J, S]
    # noise column j drives caption token j, so captions of one key share positions where they can
    noise = torch.cat([torch.ones(R, S, 1), noise[:, :, : L - 1]], dim=2)  # [R, S, L]; column 0 is SOT
    n, noise = n.view(R * S), noise.view(R * S, L)
    caption_of = torch.arange(R).repeat_interleave(S)  # masked copy -> caption
    per_copy = torch.zeros(R * S, device=dev)
    for chunk in _chunks(R, S, max_rows):
        b = caption_of[chunk].to(dev)
        c = corrupt(tokens[b], maskable[b], tok.mask_id, n=n[chunk].to(dev), noise=noise[chunk].to(dev))
        logp = dist.select(rows[b]).log_probs(c.noisy, where=c.masked)  # [M, V]
        ll = torch.zeros(len(b), L, device=dev)
        ll[c.masked] = logp.gather(-1, tokens[b][c.masked][:, None]).squeeze(-1)
        per_copy[chunk] = ll.sum(1) * c.weight  # (1/n) sum over the masked tokens
    # (number of counts) x the copy's term, where its count lies in the interval: [R, J, S]
    return span.to(dev)[:, None, None] * torch.where(inside.to(dev), per_copy.view(R, 1, S), 0.0)


def elbo_score(model, context, rows, tokens, num_samples=1024, seed=0, max_rows=256, keys=None,
               t_interval=(0.0, 1.0), stratified=True):
    """Monte-Carlo estimate [R] of the Eq. 8 lower bound; `max_rows` bounds each forward pass.
    ``context``: an ImageContext, or a :class:`mdc.distribution.CaptionDistribution`.

    ``t_interval``: one (w_l, w_u), or J of them scored from ONE set of masked copies ([R, J]):
    the S copies are stratified over the counts of the intervals' hull lo..hi (span = hi - lo + 1),
    and interval j's estimate is span * (1/S) sum over the copies whose count lies in it of
    (1/n_s) sum_masked log p. Each is unbiased for its bound (a copy's count is uniform on the hull,
    so E = sum over the interval's counts of E_{C_n}[...]); the first interval that is the hull gives
    exactly the numbers of a call with that interval alone, and a narrower one uses the ~S x its
    share of the hull copies that fall in it (still stratified over its counts)."""
    out = elbo_copies(model, context, rows, tokens, num_samples, seed, max_rows, keys, _intervals(t_interval),
                      stratified).sum(-1) / num_samples  # [R, J]
    return out if isinstance(t_interval[0], (tuple, list)) else out[:, 0]


def _unsure(m1: torch.Tensor, m2: torch.Tensor, n: torch.Tensor, tolerance: float) -> torch.Tensor:
    """[A] items whose best candidate leads some other candidate, in some interval, by less than
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


def elbo_sequential(model, context, rows, tokens, group, num_samples, max_samples, tolerance=3.0, seed=0,
                    max_rows=256, keys=None, t_interval=(0.0, 1.0), stratified=True):
    """The ELBO of items of ``group`` consecutive captions (an item's candidates), with masked copies
    added where the item's decision is not yet clear: (scores [R] or [R, J], copies per item [R / group]).

    Round 0 is :func:`elbo_score` with ``num_samples`` copies and the captions' keys, so an item that is
    sure at once scores exactly as the fixed estimate. While an item is unsure (:func:`_unsure`: its
    best candidate's lead over another is under ``tolerance`` standard errors of the paired per-copy
    difference, in any interval) and has fewer than ``max_samples`` copies, round r >= 1 draws as many
    copies again (keys (key, r)), doubling its count. The score is the mean over all its copies. The
    standard error treats the copies as independent, which overstates it for stratified copies: the
    rule errs towards more copies. What it targets is the decision; a score's copy count depends on it."""
    intervals = _intervals(t_interval)
    R, K, J = len(tokens), group, len(intervals)
    B, keys = R // K, list(range(R) if keys is None else keys)
    m1 = torch.zeros(B, K, J, dtype=torch.float64)
    m2 = torch.zeros(B, K, K, J, dtype=torch.float64)
    copies = torch.zeros(B, dtype=torch.long)
    out = torch.zeros(B, K, J)
    active, size, r = torch.arange(B), num_samples, 0
    while len(active):
        sel = (active[:, None] * K + torch.arange(K)).flatten()  # the active items' captions
        round_keys = [keys[i] if r == 0 else (keys[i], r) for i in sel.tolist()]
        x = elbo_copies(model, context, rows[sel.to(rows.device)], tokens[sel.to(tokens.device)], size, seed,
                        max_rows, round_keys, intervals, stratified).cpu().view(len(active), K, J, size)
        if r == 0:  # elbo_score's numbers, to the bit
            out = x.sum(-1) / size  # [B, K, J]
        x = x.double()
        m1[active] += x.sum(-1)
        m2[active] += torch.einsum("akjs,aljs->aklj", x, x)
        copies[active] += size
        active = active[(copies[active] < max_samples) & _unsure(m1[active], m2[active], copies[active], tolerance)]
        size, r = min(num_samples * 2 ** r, max_samples - num_samples * 2 ** r), r + 1
    more = copies > num_samples
    out[more] = (m1[more] / copies[more, None, None]).float()
    out = out.view(R, J).to(tokens.device)
    return (out if isinstance(t_interval[0], (tuple, list)) else out[:, 0]), copies


# ------------------------------------------------------------------------------------ the scorer table
@dataclass(frozen=True)
class Scorer:
    """One scorer: ``fn(model, source, rows, tokens, **options)`` -> scores [R], where ``source`` is the
    images [B, 3, S, S] or, with ``caption_distribution``, the caption distribution of the images
    (made by ``encode``: MC-Diffusion's guidance applies); ``options``: num_samples, seed, max_rows,
    keys, t_interval, stratified (each scorer takes what it uses). ``objectives``: the models it
    applies to; ``default_for``: those it is the default scorer of."""
    fn: Callable
    objectives: tuple[str, ...]
    default_for: tuple[str, ...] = ()
    caption_distribution: bool = False


def _cosine(model, images, rows, tokens, **_):
    return (model.image_embedding(images)[rows] * model.text_embedding(tokens)).float().sum(-1)


def _exact(model, images, rows, tokens, *, max_rows, **_):
    return exact_loglik(model, model.context(images), rows, tokens, max_rows)  # each image encoded once


def _heuristic(model, dist, rows, tokens, **_):
    return heuristic_score(model, dist, rows, tokens)


def _elbo(model, dist, rows, tokens, *, num_samples, seed, max_rows, keys, t_interval, stratified, max_samples=None,
          tolerance=3.0, group=1):
    if max_samples is None or max_samples == num_samples:
        return elbo_score(model, dist, rows, tokens, num_samples, seed, max_rows, keys, t_interval, stratified)
    return elbo_sequential(model, dist, rows, tokens, group, num_samples, max_samples, tolerance, seed, max_rows, keys,
                           t_interval, stratified)[0]


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


def _score(model, images, rows, captions, method, keys, num_samples=1024, seed=0, max_rows=256,
           t_interval=(0.0, 1.0), stratified=True, precision="fp32", encode=None, **sequential):
    """Scores [R] of captions[r] against images[rows[r]]: checks, tokenises, encodes every image once.
    ``sequential``: the ELBO's max_samples, tolerance and group (:func:`score_candidates`)."""
    method, scorer = resolve(model, method)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    if sequential.get("max_samples") is not None and (method != "elbo" or sequential["max_samples"] < num_samples):
        raise ValueError(f"max_samples applies to the 'elbo' scorer and is at least num_samples ({num_samples}); "
                         f"got {sequential['max_samples']} for method {method!r}")
    if keys is not None and len(keys) != len(captions):
        raise ValueError(f"got {len(keys)} keys for {len(captions)} captions")
    if not all(0.0 <= a <= b <= 1.0 for a, b in _intervals(t_interval)):
        raise ValueError(f"t_interval must satisfy 0 <= w_l <= w_u <= 1; got {t_interval}")
    if encode is not None and not scorer.caption_distribution:
        raise ValueError(f"a caption distribution (encode) applies to the MDC scorers {DISTRIBUTION_SCORERS}; "
                         f"got method {method!r}")
    model.check_images(images)
    tokens = _tokenize(model, captions).to(images.device)
    with evaluating(model, precision):
        source = images
        if scorer.caption_distribution:
            source = (encode or distribution.encode)(model, images, _image_keys(rows, keys, len(images)))
        return scorer.fn(model, source, rows, tokens, num_samples=num_samples, seed=seed, max_rows=max_rows,
                         keys=keys, t_interval=t_interval, stratified=stratified, **sequential)


@torch.no_grad()
def score(model, images, captions: Sequence[str], method: str | None = None, *, num_samples: int = 1024,
          seed: int = 0, max_rows: int = 256, keys: Sequence[Hashable] | None = None,
          t_interval: tuple[float, float] = (0.0, 1.0), stratified: bool = True, precision: str = "fp32",
          encode=None) -> torch.Tensor:
    """Score each (image, caption) pair: Tensor [B]; higher = better match.

    ELBO only: ``num_samples`` masked copies per caption, ``keys`` [B] name each caption's
    noise (default: its index in this call), ``t_interval`` restricts the mask ratios summed
    (default: all, Eq. 8), ``stratified`` spreads the mask counts evenly (False: i.i.d.);
    ``max_rows`` bounds the rows of one forward pass. ``precision``: "fp32" (the default on every
    device: a score does not depend on its batch beyond float32 rounding, nor on an autocast the
    caller entered) | "bf16" (opt-in autocast; the vocabulary head and the log-softmax stay fp32;
    scores move by up to ~0.2 nats, the heuristic's most) | "auto" (bf16 on CUDA). MDC scorers: ``encode(model, images, keys)`` makes the
    caption distribution (default: the plain model's; ``keys`` [B]: each image's first caption key),
    as :func:`mdc.api.score` does for MC-Diffusion's guidance.
    """
    if len(captions) != len(images):
        raise ValueError(f"got {len(images)} images but {len(captions)} captions")
    rows = torch.arange(len(images), device=images.device)
    return _score(model, images, rows, captions, method, keys, num_samples, seed, max_rows, t_interval, stratified,
                  precision, encode)


@torch.no_grad()
def score_candidates(model, images, candidates: Sequence[Sequence[str]], method: str | None = None, *,
                     paired: bool = True, item_keys: Sequence[Hashable] | None = None, max_samples: int | None = None,
                     tolerance: float = 3.0, **kw) -> torch.Tensor:
    """Scores [B, K] of K candidate captions per image (the true and false captions of an item).

    ``paired``: all candidates of an item share one noise key (common random numbers for the
    ELBO); else every candidate has its own. ``item_keys`` [B] (default: the item's index in
    this call) fix an item's noise whatever else is in the call. Each image is encoded once.
    ``kw``: num_samples, seed, max_rows, t_interval, stratified, precision, encode as in :func:`score`.

    ELBO, sequentially: with ``max_samples`` > ``num_samples``, an item whose best candidate leads another
    by less than ``tolerance`` standard errors gets more masked copies, doubling its count up to
    ``max_samples`` (:func:`elbo_sequential`); an item that is clear at ``num_samples`` scores as without.
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
    out = _score(model, images, rows, flat, method, keys, max_samples=max_samples, tolerance=tolerance, group=K,
                 **kw)  # [B*K] or, for several ELBO t_intervals, [B*K, J]
    return out.view(len(images), K, *out.shape[1:])
