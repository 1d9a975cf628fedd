"""The masked diffusion process on captions, shared by the loss, the sampler and the scorers.

Forward process (paper Eq. 2 with the linear schedule alpha_t = 1 - t): every caption token
c^i is replaced by [MASK] with probability t, independently. :func:`corrupt` is that process
as one pure function of the clean tokens and given noise, in the two forms the method needs:

- by ratio t (training, Alg. 1): token i is masked iff noise_i < t; loss weight 1/t (Eq. 5);
- by count n (the lower bound, Eq. 8): exactly the n caption tokens with the smallest noise
  are masked, a uniformly random n-subset; the bound weights that term by 1/n;
- noise None: every caption token is masked (t = 1), the sampler's and the heuristic
  scorer's starting point [SOT] [MASK]*N [EOT].

Only caption tokens are ever masked; [SOT], [EOT] and padding stay as they are.

Noise is keyed, not streamed, wherever a result must not depend on its batch: :func:`key_seed`
turns (seed, key) into a generator seed (the ELBO's masks, the partial condition's masks).

Reverse process: :func:`caption_log_probs` is the model's distribution over what a masked
caption position may hold. Ids that can never be a caption token there ([SOT], [MASK],
[PAD] of a compact vocabulary, and [EOT] except where an autoregressive caption may end)
are removed and the rest renormalised. The sampler ranks confidence (max probability) under
it and the scorers add its log-probabilities, so both see the same distribution. [UNK] is a
caption token like any other: a real caption may contain one and must remain scorable.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Hashable

import torch
import torch.nn.functional as F

T_MIN = 1e-4  # t is clamped here so that the 1/t weight stays finite when w_l = 0


@dataclass
class Corrupted:
    noisy: torch.Tensor  # [B, L] C_t: the tokens with [MASK] at the masked positions
    masked: torch.Tensor  # [B, L] bool
    weight: torch.Tensor  # [B] 1/t (by ratio) or 1/n (by count) per caption


def uniform(*size: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """U[0, 1) draws of shape ``size`` from ``generator`` (the global stream when None). The generator is
    passed on only when given: under torch.compile with a dynamic batch size, ``torch.rand(B, generator=None)``
    fails to trace (its generator overload wants concrete sizes), while ``torch.rand(B)`` draws the same."""
    if generator is None:
        return torch.rand(*size, device=device)
    return torch.rand(*size, generator=generator, device=device)


def sample_t(n: int, cfg, generator=None, device=None) -> torch.Tensor:
    """t [n] ~ U[w_l, w_u] (clamped at T_MIN); 'stratified' uses one offset u and (u + b/n) mod 1.

    A fixed ``cfg.mask_ratio`` (image-conditioned BERT) gives t = mask_ratio for every caption.
    """
    if cfg.mask_ratio is not None:
        return torch.full((n,), float(cfg.mask_ratio), device=device)
    u = uniform(n if cfg.t_sampling == "uniform" else 1, generator=generator, device=device)
    if cfg.t_sampling == "stratified":
        u = (u + torch.arange(n, device=device) / n) % 1.0
    lo, hi = cfg.t_interval
    return (lo + (hi - lo) * u).clamp(min=T_MIN)


def corrupt(tokens: torch.Tensor, maskable: torch.Tensor, mask_id: int, *, t: torch.Tensor | None = None,
            n: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> Corrupted:
    """Mask caption tokens: by ratio ``t`` [B] or by count ``n`` [B], from uniform ``noise`` [B, L].

    tokens [B, L]; maskable [B, L] bool (the caption positions). ``noise=None`` masks every
    caption token (weight 1).
    """
    if noise is None:
        masked = maskable.clone()
        weight = torch.ones(len(tokens), device=tokens.device)
    elif t is not None:
        masked = (noise < t[:, None]) & maskable  # Alg. 1: masked_caps[p < t] = MASK
        weight = 1.0 / t
    else:
        rank = noise.masked_fill(~maskable, 2.0).argsort(-1).argsort(-1)  # order of the caption positions
        masked = (rank < n[:, None]) & maskable  # the n smallest: a uniform n-subset
        weight = 1.0 / n.clamp(min=1).float()
    return Corrupted(tokens.masked_fill(masked, mask_id), masked, weight)


def masked_row(tok, batch: int, length: int, device) -> torch.Tensor:
    """[SOT] [MASK]*length [EOT] for every row: [B, length + 2] (the fully corrupted caption)."""
    x = torch.full((batch, length + 2), tok.pad_id, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = tok.sot_id, tok.eot_id
    maskable = torch.ones_like(x, dtype=torch.bool)
    maskable[:, [0, -1]] = False
    return corrupt(x, maskable, tok.mask_id).noisy


def plain_key(key: Hashable) -> Hashable:
    """``key`` in plain Python values: numpy scalars and 0-dim arrays / tensors as their ``.item()``
    (np.int64(5) -> 5, np.str_("a") -> "a", torch.tensor(5) -> 5), recursively inside tuples."""
    if type(key) is tuple:
        return tuple(plain_key(k) for k in key)
    if getattr(key, "shape", None) == () and hasattr(key, "item"):
        return key.item()
    return key


def key_seed(seed: int, key: Hashable) -> int:
    """A 63-bit generator seed from (seed, key), stable across processes and platforms. The key is
    hashed as :func:`plain_key`, so 5, np.int64(5) and torch.tensor(5) give the same noise (the seeds
    of plain int / str / tuple keys are those of the repr they always had)."""
    digest = hashlib.blake2b(repr((int(seed), plain_key(key))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def banned_ids(tok, allow_eot: bool = False) -> list[int]:
    """Ids a caption position never holds: [SOT], [MASK], [PAD] (compact vocabularies) and [EOT]."""
    ids = [tok.sot_id, tok.mask_id] + ([] if allow_eot else [tok.eot_id])
    return ids + ([tok.pad_id] if tok.vocab is not None else [])


def caption_log_probs(logits: torch.Tensor, tok, allow_eot: bool = False) -> torch.Tensor:
    """log p over caption tokens [..., V]: banned ids at -inf, the rest renormalised (float32)."""
    logits = logits.float().clone()
    logits[..., banned_ids(tok, allow_eot)] = -math.inf
    return F.log_softmax(logits, dim=-1, dtype=torch.float32)  # fp32 under any autocast
