"""Mask-and-replace discrete diffusion on captions (D3PM; VQ-Diffusion's transition), MC-Diffusion's noise.

An alternative to MDC's absorbing noise for the captioner, and an extension of the core: with
``create_model(..., noise="mask_replace")`` (the "mask_replace" entry of ``ModelConfig.extensions``,
whose fields are :class:`MaskReplace`'s) the factory (:func:`mdc.factory.build`) gives the model a
:class:`MaskReplace` as its noise process (``model.noise``, the interface of :mod:`mdc.noise`), so
``model.loss`` is :func:`d3pm_loss` and ``mdc.generate`` samples with :func:`d3pm_sample`.

States: the K caption tokens (the ids :func:`mdc.distribution.caption_log_probs` keeps) and
[MASK]; [SOT], [EOT] and padding never change. One forward step t (the paper's Q_t):

    q(x_t | x_{t-1} = i) = alpha_t [x_t = i] + beta_t (each of the K caption tokens) + gamma_t [x_t = MASK]

so a token goes to [MASK] with probability gamma_t, is re-drawn uniformly from the K caption
tokens with probability K beta_t (to another token with (K-1) beta_t), and [MASK] stays [MASK].
The t-step marginal has the same form with alpha_bar_t = prod alpha, 1 - gamma_bar_t =
prod (1 - gamma) and K beta_bar_t = 1 - alpha_bar_t - gamma_bar_t.

Schedule (VQ-Diffusion's linear one): gamma_bar_t = (1 - r) t / T and K beta_bar_t = r t / T
with r = ``replace_prob`` (0.1) and T = ``diffusion_steps`` (100, MC-Diffusion's), so
alpha_bar_t = 1 - t / T; x_T no longer depends on x_0 (mask with 1 - r, else a uniform
token) and the prior term of the bound is 0. The per-step rates follow from the products.

Loss (D3PM's hybrid loss, MC-Diffusion Eq. for L), per caption with t ~ U{1..T}:

    T * L_{t-1} + lambda * sum_i -log p(x_0^i | x_t, y),
    L_{t-1} = sum_i KL(q(x_{t-1}^i | x_t, x_0) || p(x_{t-1}^i | x_t, y))   (t > 1),  -log p(x_0 | x_1, y) (t = 1),
    p(x_{t-1} | x_t, y) = sum_{x_0} q(x_{t-1} | x_t, x_0) p(x_0 | x_t, y),

with lambda = ``aux_loss_weight`` (MC-Diffusion does not give it; 0.01). T * L_{t-1} is an
unbiased estimate of the whole bound; like the MDC loss the batch sum is divided by the
number of caption tokens. The decoder predicts p(x_0 | x_t, y) and stays time-independent,
as in MDC (the share of [MASK] tokens reveals t). Guidance's condition variants
(:class:`mdc.mc_diffusion.guidance.ConditionVariants`: ``cond_drop_prob``, ``cond_mask_prob``) apply here as in MDC.

Scoring: none of the MDC scorers applies, and ``mdc.score`` refuses them in one line. "elbo" is
the bound of the absorbing process (Eq. 8: masks only, no replaced tokens) and "heuristic" walks
its unmasking path; neither is a likelihood under this process. Its own bound would sum the T
terms L_{t-1} above over x_t drawn by :func:`q_sample` (not implemented).

Sampling: x_T from the stationary distribution, then T ancestral steps x_{t-1} ~ p(x_{t-1} |
x_t, y) (``generator``); the last step keeps the most probable x_0, under the caption
distribution that ``encode`` makes (MC-Diffusion's guidance combines the log p(x_0 | x_t, .)
of the conditional and variant rows, :mod:`mdc.mc_diffusion.guidance`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from mdc import distribution
from mdc.unmasking import masked_row
from mdc.distribution import banned_ids, caption_log_probs
from mdc.noise import NoiseProcess
from mdc.tokenizer import caption_mask, trim_padding

EPS = 1e-30  # floor of probabilities before division and log


@dataclass(frozen=True)
class Schedule:
    """Rates indexed by t = 0..T (float64, CPU): cumulative (``*_bar``) and per step (index 0: identity).
    ``uniform`` is K beta: the probability of a uniform re-draw over the K caption tokens."""
    alpha_bar: torch.Tensor
    gamma_bar: torch.Tensor
    uniform_bar: torch.Tensor
    alpha: torch.Tensor
    gamma: torch.Tensor
    uniform: torch.Tensor
    K: int

    @property
    def T(self) -> int:
        return len(self.alpha) - 1

    def at(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Rate ``name`` at steps ``t`` (any shape), float32 on t's device; per token for beta(_bar)."""
        if name.startswith("beta"):
            return self.at(name.replace("beta", "uniform"), t) / self.K
        return getattr(self, name).to(t.device)[t].float()


@lru_cache(maxsize=16)
def schedule(T: int, replace_prob: float, K: int) -> Schedule:
    """The linear mask-and-replace schedule (module docstring)."""
    s = torch.arange(T + 1, dtype=torch.float64) / T
    alpha_bar, gamma_bar = 1 - s, (1 - replace_prob) * s
    uniform_bar = (1 - alpha_bar - gamma_bar).clamp(min=0)
    prev = lambda x: torch.cat([x[:1], x[:-1]])  # noqa: E731  x_{t-1}, with x_{-1} := x_0
    alpha = torch.where(prev(alpha_bar) > 0, alpha_bar / prev(alpha_bar), torch.zeros_like(s))
    gamma = 1 - (1 - gamma_bar) / (1 - prev(gamma_bar))
    uniform = (1 - alpha - gamma).clamp(min=0)
    return Schedule(alpha_bar, gamma_bar, uniform_bar, alpha, gamma, uniform, K)


def caption_ids(tok) -> torch.Tensor:
    """The K caption-token ids [K]: every id but those a caption never holds."""
    banned = set(banned_ids(tok))
    return torch.tensor([i for i in range(tok.vocab_size) if i not in banned])


def model_schedule(model) -> Schedule:
    process = model.noise  # a MaskReplace
    return schedule(process.diffusion_steps, process.replace_prob, len(caption_ids(model.tokenizer)))


def q_sample(x0: torch.Tensor, maskable: torch.Tensor, t: torch.Tensor, sched: Schedule, ids: torch.Tensor,
             mask_id: int, generator=None) -> torch.Tensor:
    """x_t ~ q(x_t | x_0) [B, L] at the caption positions ``maskable`` [B, L]; t [B] in 1..T."""
    u = torch.rand(x0.shape, generator=generator, device=x0.device)  # [B, L]
    redraw = ids.to(x0.device)[torch.randint(len(ids), x0.shape, generator=generator, device=x0.device)]
    g, r = sched.at("gamma_bar", t)[:, None], sched.at("uniform_bar", t)[:, None]  # [B, 1]
    xt = torch.where(u < g, torch.full_like(x0, mask_id), torch.where(u < g + r, redraw, x0))
    return torch.where(maskable, xt, x0)


def posterior(p0: torch.Tensor, xt: torch.Tensor, t: torch.Tensor, sched: Schedule, ids: torch.Tensor,
              mask_id: int) -> torch.Tensor:
    """p(x_{t-1} | x_t) = sum_{x_0} q(x_{t-1} | x_t, x_0) p0(x_0): [P, V] from p0 [P, V] (mass on
    caption ids only; one-hot: the true posterior), x_t [P], t [P] in 1..T. As VQ-Diffusion:
    q(x_t | x_{t-1}) * sum_{x_0} q(x_{t-1} | x_0) p0(x_0) / q(x_t | x_0), renormalised."""
    P, V = p0.shape
    caption = torch.zeros(V, dtype=torch.bool, device=p0.device)
    caption[ids.to(p0.device)] = True
    onehot = F.one_hot(xt, V).bool()  # [P, V]
    is_mask = (xt == mask_id)[:, None]  # [P, 1]
    rate = lambda name, s: sched.at(name, s)[:, None]  # noqa: E731  [P, 1]
    s = t - 1
    # q(x_t | x_0 = v) [P, V] and the weights w = p0 / q(x_t | x_0)
    q_t = torch.where(is_mask, rate("gamma_bar", t), rate("alpha_bar", t) * onehot + rate("beta_bar", t))
    w = p0 / q_t.clamp(min=EPS)
    total = w.sum(-1, keepdim=True)  # [P, 1]
    # sum_{x_0} w(x_0) q(x_{t-1} = j | x_0): caption j -> alpha_bar w_j + beta_bar sum w; MASK -> gamma_bar sum w
    back = torch.where(caption, rate("alpha_bar", s) * w + rate("beta_bar", s) * total, torch.zeros_like(w))
    back[:, mask_id] = (rate("gamma_bar", s) * total).squeeze(-1)
    # q(x_t | x_{t-1} = j): x_t = MASK -> gamma (caption j), 1 (j = MASK); else alpha [j = x_t] + beta (caption j)
    step = torch.where(is_mask, rate("gamma", t) * caption, rate("alpha", t) * onehot + rate("beta", t) * caption)
    step[:, mask_id] = is_mask.squeeze(-1).float()
    out = step * back
    return out / out.sum(-1, keepdim=True).clamp(min=EPS)


def d3pm_loss(model, images, tokens, *, t=None, generator=None):
    """D3PM hybrid loss per caption token (module docstring). Optional fixed ``t`` [B] in 1..T for tests."""
    tok = model.tokenizer
    tokens = trim_padding(tokens, tok.eot_id)  # [B, L]
    maskable = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [B, L] caption tokens
    B, L = tokens.shape
    sched, ids = model_schedule(model), caption_ids(tok)
    if t is None:
        t = torch.randint(1, sched.T + 1, (B,), generator=generator, device=tokens.device)  # [B]
    xt = q_sample(tokens, maskable, t, sched, ids, tok.mask_id, generator)  # [B, L]
    cond = model.training_condition(B, generator, tokens.device)  # {} unless guidance's variants are on
    hidden = model.hidden(xt, model.context(images, **cond))[maskable]  # [P, W]
    logp0 = caption_log_probs(model.head(hidden), tok)  # [P, V] log p(x_0 | x_t, y)
    x0, xt, tp = tokens[maskable], xt[maskable], t[:, None].expand(B, L)[maskable]  # [P]
    ce = -logp0.gather(-1, x0[:, None]).squeeze(-1)  # [P]
    q = posterior(F.one_hot(x0, logp0.shape[-1]).float(), xt, tp, sched, ids, tok.mask_id)  # [P, V]
    p = posterior(logp0.exp(), xt, tp, sched, ids, tok.mask_id)
    kl = (torch.xlogy(q, q) - q * p.clamp(min=EPS).log()).sum(-1)  # [P]
    vb = torch.where(tp == 1, ce, kl)  # L_0 at t = 1
    return (sched.T * vb + model.noise.aux_loss_weight * ce).sum() / maskable.sum().clamp(min=1)


@torch.no_grad()
def d3pm_sample(model, images, length: int, generator=None, encode=None) -> torch.Tensor:
    """The reverse process from x_T: tokens [B, length + 2] without [MASK] (module docstring).
    ``encode``: the caption distribution's maker, as in :func:`mdc.sampler.generate`."""
    model.check_length(length)
    tok = model.tokenizer
    sched, ids = model_schedule(model), caption_ids(tok)
    dist = (encode or distribution.encode)(model, images)  # encoded once
    x = masked_row(tok, len(images), length, images.device)  # [B, N'+2]
    pos = x == tok.mask_id  # caption positions
    T = torch.full((len(x),), sched.T, device=x.device)
    x = q_sample(x.masked_fill(pos, int(ids[0])), pos, T, sched, ids, tok.mask_id, generator)  # x_T (x_0-free)
    for t in range(sched.T, 0, -1):
        logp0 = dist.log_probs(x, where=pos)  # [B*N', V] log p(x_0 | x_t, y)
        if t == 1:
            x[pos] = logp0.argmax(-1)
            break
        p = posterior(logp0.exp(), x[pos], torch.full_like(x[pos], t), sched, ids, tok.mask_id)
        x[pos] = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    return x


@dataclass(frozen=True)
class MaskReplace(NoiseProcess):
    """The mask-and-replace process as a captioner's noise (module docstring), and its config (the
    "mask_replace" entry of ``ModelConfig.extensions``): loss :func:`d3pm_loss`, sampler :func:`d3pm_sample`,
    no scorer. Ancestral sampling draws every step at temperature 1; the unmasking sampler's options
    (``tokens_per_step``, ``threshold``, ``trace``, another temperature) have no meaning here and are refused."""
    diffusion_steps: int = 100  # T
    replace_prob: float = 0.1  # cumulative uniform-replacement probability at T (mask: 1 - it)
    aux_loss_weight: float = 0.01  # lambda of the auxiliary x_0 cross-entropy
    name = "mask_replace"
    scorers = ()

    def __post_init__(self):
        if not 0.0 <= self.replace_prob < 1.0:
            raise ValueError(f"replace_prob must lie in [0, 1); got {self.replace_prob}")
        if self.diffusion_steps < 1 or self.aux_loss_weight < 0:
            raise ValueError(f"need diffusion_steps >= 1 and aux_loss_weight >= 0; got {self.diffusion_steps}, "
                             f"{self.aux_loss_weight}")

    def loss(self, model, images, tokens, **kw):
        return d3pm_loss(model, images, tokens, **kw)  # kw: t, generator

    def sample(self, model, images, length, *, generator=None, encode=None, temperature=None, **options):
        if options or temperature not in (None, 1.0):
            given = sorted(options) + ([] if temperature in (None, 1.0) else [f"temperature={temperature}"])
            raise ValueError(f"the {self.name!r} reverse process samples at temperature 1 without the unmasking "
                             f"sampler's options; got {given}")
        return d3pm_sample(model, images, length, generator=generator, encode=encode)


MASK_REPLACE = MaskReplace()  # MC-Diffusion's settings

