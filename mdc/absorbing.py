"""MDC's absorbing noise process, in the paper's order: masking, the loss (Eq. 5), the Monte-Carlo ELBO
(Eq. 8) and the heuristic scorer; its sampler (Eq. 6) is :mod:`mdc.unmasking`.

Forward process (Eq. 2, linear schedule alpha_t = 1 - t): every caption token c^i becomes [MASK]
with probability t, independently; [SOT], [EOT] and padding stay as they are (with the length hidden,
``length_visible=False``, only [SOT]: :func:`maskable_positions`). :func:`corrupt` is that process as one
pure function of the clean tokens and given uniforms ``u``, in two forms:

- by ratio t (training, Alg. 1): token i is masked iff u_i < t; weight 1/t (Eq. 5);
- by count n (the bound, Eq. 8): the n caption tokens with the smallest u are masked, a uniformly
  random n-subset; weight 1/n;
- ``u`` None: every caption token is masked (t = 1), the heuristic's start (and the sampler's,
  :func:`mdc.unmasking.masked_row`).

Loss (Alg. 1, Eq. 5). With alpha_t = 1 - t the weight alpha'_t / (1 - alpha_t) is -1/t, so per
caption C of N caption tokens and t ~ U[w_l, w_u]:

    L(C) = (1/t) * sum_{i : c_t^i = [MASK]} -log g_psi^i(C_t, V)[c_0^i]

Normalisation (our choice): the batch loss is sum_b L(C_b) / sum_b N_b, MDLM's per-token NELBO.
Dividing by the caption tokens, a constant under the masking, keeps it unbiased: E_q[(1/t) sum_masked
CE] = sum_i E[CE_i] for every t; dividing by the masked tokens (about t N) would cancel most of 1/t.
``time_weighting=False`` drops exactly the 1/t and keeps the normaliser (the "w/o t" / CMLM ablation);
a fixed ``mask_ratio`` r is image-conditioned BERT (t = r for every caption, Eq. 1). The decoder is
time-independent: t enters only the weight.

Bound (Eq. 8):   log p(C) >= sum_{n=1}^{N} E_{C_n}[ (1/n) sum_{i masked in C_n} log p(c^i | C_n, f(I)) ],
estimated with S = ``num_samples`` masked copies per caption: copy s masks n_s = 1 + floor(N (s + u) / S)
tokens (stratified by one offset u; ``stratified=False`` draws every n_s i.i.d.), a uniform n_s-subset,
and the estimate is N * mean_s (1/n_s) sum_masked log p. A window ``(w_l, w_u)`` of ``windows`` keeps only the counts
with n/N in [w_l, w_u] (the ratios a model trained on t ~ U[w_l, w_u] has seen); (0, 1) is Eq. 8 itself.
Its randomness is keyed (:func:`mdc.base.seeding.key_seed`): a caption's copies depend on (seed, key) alone,
and captions that share a key share their copies (common random numbers for an item's candidates).

Heuristic (Sec. 4.2): start fully masked; N times, reveal the most confident masked position (the
sampler's confidence), add log p(ground-truth token) there and write it in.

The scorers query a :class:`mdc.distribution.CaptionDistribution` (``as_distribution``: an image context or a
distribution, MC-Diffusion's guided one among them).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
import torch.nn.functional as F

from mdc.distribution import as_distribution
from mdc.noise import NoiseProcess
from mdc.base.seeding import key_seed, uniform
from mdc.tokenizer import caption_mask, valid_mask
from mdc.unmasking import log_probs, mdc_sample

__all__ = ["ABSORBING", "Absorbing", "Corrupted", "ElboOptions", "corrupt", "elbo_copies", "elbo_score",
           "heuristic_score", "Masking", "maskable_positions", "mdc_loss"]

T_MIN = 1e-4  # t is clamped here so that the 1/t weight stays finite when w_l = 0
SAMPLINGS = ("uniform", "antithetic", "stratified")  # how t is drawn across a batch


# ------------------------------------------------------------------------ forward process (Eq. 2)
@dataclass
class Corrupted:
    noisy: torch.Tensor  # [B, L] C_t: the tokens with [MASK] at the masked positions
    masked: torch.Tensor  # [B, L] bool
    weight: torch.Tensor  # [B] 1/t (by ratio) or 1/n (by count) per caption


@dataclass(frozen=True)
class Masking:
    """The masking ratio t of MDC's training (Alg. 1, Eq. 5), validated here and nowhere else; a
    ``ModelConfig`` keeps its fields flat and hands them out as one ``config.masking``."""
    interval: tuple[float, float] = (0.5, 1.0)  # t ~ U[w_l, w_u] per caption
    sampling: str = "uniform"  # across a batch: i.i.d., "antithetic" (u, 1 - u), "stratified" ((u + b/n) mod 1)
    ratio: float | None = None  # a fixed t for every caption: image-conditioned BERT (Eq. 1); 1.0: parallel decoding
    time_weighting: bool = True  # the 1/t weight of Eq. 5; False: the "w/o t" (CMLM) ablation

    def __post_init__(self):
        t = tuple(self.interval)
        if len(t) != 2 or not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in t) \
                or not (0.0 <= t[0] <= t[1] <= 1.0 and t[1] > 0.0):
            raise ValueError(f"t_interval must satisfy 0 <= W_L <= W_U <= 1 and W_U > 0, got {t!r}")
        object.__setattr__(self, "interval", tuple(float(x) for x in t))
        if self.ratio is not None and not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"mask_ratio must be in (0, 1], got {self.ratio}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"t_sampling must be one of {SAMPLINGS}, got {self.sampling!r}")

    def sample(self, n: int, generator=None, device=None) -> torch.Tensor:
        """t [n], clamped at T_MIN so that 1/t stays finite when w_l = 0; a fixed ratio gives it n times."""
        if self.ratio is not None:
            return torch.full((n,), float(self.ratio), device=device)
        if self.sampling == "antithetic":
            half = uniform((n + 1) // 2, generator=generator, device=device)
            u = torch.cat([half, 1.0 - half])[:n]  # u_b and 1 - u_b: t's mean is exact for every pair
        else:
            u = uniform(n if self.sampling == "uniform" else 1, generator=generator, device=device)
        if self.sampling == "stratified":
            u = (u + torch.arange(n, device=device) / n) % 1.0
        lo, hi = self.interval
        return (lo + (hi - lo) * u).clamp(min=T_MIN)

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        """The loss weight [n] of captions masked at ratios t [n]: 1/t (Eq. 5), or 1 without time weighting."""
        return 1.0 / t if self.time_weighting else torch.ones_like(t)

    @property
    def trained_window(self) -> tuple[float, float]:
        """The ratios a model trained with this masking has seen: ``(r, r)`` for a fixed ratio, else the interval
        (the ELBO window that scores a caption over the trained ratios only)."""
        return (float(self.ratio),) * 2 if self.ratio is not None else self.interval


def corrupt(tokens: torch.Tensor, maskable: torch.Tensor, mask_id: int, *, t: torch.Tensor | None = None,
            n: torch.Tensor | None = None, u: torch.Tensor | None = None) -> Corrupted:
    """Mask caption tokens: by ratio ``t`` [B] or by count ``n`` [B], from uniforms ``u`` [B, L].

    tokens [B, L]; maskable [B, L] bool (the caption positions). ``u=None`` masks every caption token
    (weight 1).
    """
    if u is None:
        masked = maskable.clone()
        weight = torch.ones(len(tokens), device=tokens.device)
    elif t is not None:
        masked = (u < t[:, None]) & maskable  # Alg. 1: masked_caps[p < t] = MASK
        weight = 1.0 / t
    else:
        rank = u.masked_fill(~maskable, 2.0).argsort(-1).argsort(-1)  # order of the caption positions
        masked = (rank < n[:, None]) & maskable  # the n smallest: a uniform n-subset
        weight = 1.0 / n.clamp(min=1).float()
    return Corrupted(tokens.masked_fill(masked, mask_id), masked, weight)


def maskable_positions(model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, maskable) [B, L] for the loss, the ELBO and the heuristic alike: the tokens as given and their
    caption tokens or, with the length hidden (``length_visible=False``), the tokens padded with [PAD] to the
    context (a static shape) and every position but [SOT], so [EOT] and padding are predicted like words."""
    tok = model.tokenizer
    if model.config.length_visible:
        return tokens, caption_mask(tokens, tok.sot_id, tok.eot_id)
    tokens = tokens.masked_fill(~valid_mask(tokens, tok.eot_id), tok.pad_id)  # [PAD] after [EOT]
    tokens = F.pad(tokens, (0, model.config.context_length - tokens.shape[1]), value=tok.pad_id)  # [B, C]
    maskable = torch.ones_like(tokens, dtype=torch.bool)
    maskable[:, 0] = False  # [SOT]
    return tokens, maskable


# ------------------------------------------------------------------------------- the loss (Eq. 5)
def mdc_loss(model, images, tokens, *, t=None, u=None, generator=None):
    """Masked diffusion captioning loss (Alg. 1). Optional fixed ``t`` [B] and uniforms ``u`` [B, L] for tests.

    Dense, so that the step has one static graph and no host synchronisation: the cross-entropy at every
    position [B, L], weighted by 1/t where masked and 0 elsewhere (padding included)."""
    tok, masking = model.tokenizer, model.config.masking
    tokens, maskable = maskable_positions(model, tokens)  # [B, L] (L = context_length if the length is hidden)
    B, L = tokens.shape
    if t is None:
        t = masking.sample(B, generator, tokens.device)  # [B]
    if u is None:
        # Alg. 1: p = uniform(B, L), drawn at the full context so that position j's draw is the same whatever
        # padding the batch carries (trimmed, bucketed or none): the masks do not depend on the batching
        u = uniform(B, model.config.context_length, generator=generator, device=tokens.device)
    c = corrupt(tokens, maskable, tok.mask_id, t=t, u=u[:, :L])  # C_t
    cond = model.training_condition(B, generator, tokens.device)  # {} unless an extension varies the condition
    logits = model.head(model.hidden(c.noisy, model.context(images, **cond))).float()  # [B, L, V]
    ce = F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")  # [B, L]
    weight = c.masked * masking.weight(t)[:, None]  # [B, L]: (1/t) on the masked tokens (Eq. 5), 0 elsewhere
    return (ce * weight).sum() / maskable.sum().clamp(min=1)


# ---------------------------------------------------------------------------- the bound (Eq. 8)
@dataclass(frozen=True)
class ElboOptions:
    """How the Monte-Carlo bound is estimated (the one place its defaults are written)."""
    num_samples: int = 1024  # S masked copies per caption (the paper's 1024)
    seed: int = 0  # with a caption's key, fixes its copies
    windows: tuple = ((0.0, 1.0),)  # mask-ratio windows (w_l, w_u), all scored from one set of copies (Eq. 8: 0, 1)
    stratified: bool = True  # mask counts spread by one offset; False: i.i.d. (plain Monte Carlo)
    max_samples: int | None = None  # sequential: double an unsure item's copies up to this (mdc.scoring)
    tolerance: float = 3.0  # sequential: an item is unsure while its lead is under this many standard errors

    def __post_init__(self):
        w = tuple(self.windows)
        w = (w,) if len(w) == 2 and all(isinstance(x, (int, float)) for x in w) else w  # one window given bare
        object.__setattr__(self, "windows", tuple((float(a), float(b)) for a, b in w))
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1; got {self.num_samples}")
        if not self.windows or not all(0.0 <= a <= b <= 1.0 for a, b in self.windows):
            raise ValueError(f"windows must each satisfy 0 <= w_l <= w_u <= 1; got {self.windows}")
        if self.max_samples is not None and self.max_samples < self.num_samples:
            raise ValueError(f"max_samples is at least num_samples ({self.num_samples}); got {self.max_samples}")

    @property
    def several(self) -> bool:
        """Whether more than one window is scored (scores [R, J]) rather than one ([R])."""
        return len(self.windows) > 1


def elbo_noise(keys: Sequence[Hashable], seed: int, num_samples: int, width: int,
               stratified: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per caption, from its key: the uniforms v [R, S] that pick the mask counts and the position
    uniforms [R, S, width]. Stratified: v_s = (s + u) / S with one offset u; else S i.i.d. uniforms."""
    levels, positions = [], []
    for key in keys:
        g = torch.Generator().manual_seed(key_seed(seed, key))
        u = torch.rand(1 if stratified else num_samples, generator=g)
        levels.append((torch.arange(num_samples) + u) / num_samples if stratified else u)
        positions.append(torch.rand(num_samples, width, generator=g))
    return torch.stack(levels), torch.stack(positions)


def _chunks(R: int, S: int, max_rows: int):
    """Slices of the R * S masked copies (caption-major), at most ``max_rows`` long and aligned to
    whole captions (or, for S > max_rows, within one caption), so that each chunk's copies share
    their images in equal runs and the image context is folded rather than copied."""
    if S <= max_rows:
        step = max_rows // S * S
        return [slice(a, min(a + step, R * S)) for a in range(0, R * S, step)]
    return [slice(c * S + a, c * S + min(a + max_rows, S)) for c in range(R) for a in range(0, S, max_rows)]


def _count_bounds(window, N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask counts lo..hi [R] with n / N in the window [w_l, w_u]: bounds in float64 (float32 has
    ceil(0.6 * 25) = 16), 1e-9 absorbing decimals' rounding, at least one count."""
    lo = torch.clamp(torch.ceil(window[0] * N.double() - 1e-9), min=1).long()
    return lo, torch.maximum(torch.floor(window[1] * N.double() + 1e-9).long(), lo)


def elbo_copies(model, context, rows, tokens, options: ElboOptions, keys=None, max_rows=256) -> torch.Tensor:
    """The terms [R, J, S] of the Monte-Carlo estimate of Eq. 8 (:func:`elbo_score` is their mean over S):
    copy s of caption r, for window j of ``options.windows``, is span * (1/n_s) sum_masked log p if its
    count n_s lies in the window, else 0."""
    tok, dist = model.tokenizer, as_distribution(model, context)
    tokens, maskable = maskable_positions(model, tokens)  # [R, L]: positions 1..N
    R, L = tokens.shape
    S, dev = options.num_samples, tokens.device
    N = maskable.sum(1).cpu()  # [R] caption lengths (context_length - 1 with the length hidden)
    bounds = [_count_bounds(t, N) for t in options.windows]  # J x ([R], [R])
    lo = torch.stack([b[0] for b in bounds]).min(0).values  # [R] the hull of the windows' counts
    hi = torch.stack([b[1] for b in bounds]).max(0).values
    span = hi - lo + 1  # [R]
    keys = range(R) if keys is None else keys
    v, u = elbo_noise(keys, options.seed, S, model.config.context_length, options.stratified)
    n = lo[:, None] + (v * span[:, None]).floor().long()  # [R, S] uniform over lo..hi
    inside = torch.stack([(n >= a[:, None]) & (n <= b[:, None]) for a, b in bounds], 1)  # [R, J, S]
    # uniform column j drives caption token j, so captions of one key share positions where they can
    u = torch.cat([torch.ones(R, S, 1), u[:, :, : L - 1]], dim=2)  # [R, S, L]; column 0 is SOT
    n, u = n.view(R * S), u.view(R * S, L)
    caption_of = torch.arange(R).repeat_interleave(S)  # masked copy -> caption
    per_copy = torch.zeros(R * S, device=dev)
    for chunk in _chunks(R, S, max_rows):
        b = caption_of[chunk].to(dev)
        c = corrupt(tokens[b], maskable[b], tok.mask_id, n=n[chunk].to(dev), u=u[chunk].to(dev))
        logp = log_probs(model, dist.select(rows[b]), c.noisy, c.masked, ends=not model.config.length_visible)
        ll = torch.zeros(len(b), L, device=dev)
        ll[c.masked] = logp.gather(-1, tokens[b][c.masked][:, None]).squeeze(-1)
        per_copy[chunk] = ll.sum(1) * c.weight  # (1/n) sum over the masked tokens
    # (number of counts) x the copy's term, where its count lies in the window: [R, J, S]
    return span.to(dev)[:, None, None] * torch.where(inside.to(dev), per_copy.view(R, 1, S), 0.0)


def elbo_score(model, context, rows, tokens, options: ElboOptions = ElboOptions(), keys=None, max_rows=256):
    """Monte-Carlo estimate [R] of the Eq. 8 lower bound (or [R, J] for J windows); ``max_rows`` bounds
    each forward pass. ``context``: an ImageContext, or a :class:`mdc.distribution.CaptionDistribution`.

    J windows are scored from ONE set of masked copies: the S copies are stratified over the counts of
    the windows' hull lo..hi (span = hi - lo + 1), and window j's estimate is span * (1/S) sum over the
    copies whose count lies in it of (1/n_s) sum_masked log p. Each is unbiased for its bound (a copy's
    count is uniform on the hull); the first window that is the hull gives exactly the numbers of a call
    with that window alone, a narrower one the ~S x its share of the hull copies that fall in it."""
    out = elbo_copies(model, context, rows, tokens, options, keys, max_rows).sum(-1) / options.num_samples
    return out if options.several else out[:, 0]  # [R, J] or [R]


# ---------------------------------------------------------------------------- the heuristic scorer
def heuristic_score(model, context, rows, tokens):
    """Greedy-order sum of ground-truth log-probabilities [R] (paper Sec. 4.2).
    ``context``: an ImageContext, or a :class:`mdc.distribution.CaptionDistribution`."""
    tok, ends = model.tokenizer, not model.config.length_visible
    dist = as_distribution(model, context).select(rows)
    tokens, todo = maskable_positions(model, tokens)  # [R, L] still masked
    x = corrupt(tokens, todo, tok.mask_id).noisy  # every caption token masked
    total = torch.zeros(len(tokens), device=tokens.device)
    r = torch.arange(len(tokens), device=tokens.device)
    for _ in range(int(todo.sum(1).max())):
        logp = log_probs(model, dist, x, todo, ends=ends)  # [M, V] at the still-masked positions only
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


# ---------------------------------------------------------------------------- the process, as one object
class Absorbing(NoiseProcess):
    """MDC's absorbing noise: loss Eq. 5, greedy confidence unmasking Eq. 6, scorers Eq. 8 and the
    heuristic. ``options`` of :meth:`sample`: those of :func:`mdc.unmasking.mdc_sample`."""
    name = "absorbing"
    scorers = ("elbo", "heuristic")

    def loss(self, model, images, tokens, **kw):
        return mdc_loss(model, images, tokens, **kw)  # kw: t, u, generator

    def sample(self, model, images, length, *, generator=None, encode=None, **options):
        return mdc_sample(model, images, length, generator=generator, encode=encode, **options)


ABSORBING = Absorbing()
