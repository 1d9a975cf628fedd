"""Training objectives: MDC (paper Alg. 1 / Eq. 5) and its ablations, ARC, CLIP.

MDC with the linear schedule alpha_t = 1 - t has weight alpha'_t / (1 - alpha_t) = -1/t, so
Eq. 5 becomes, per caption C with N caption tokens and t ~ U[w_l, w_u]:

    L(C) = (1/t) * sum_{i : c_t^i = [MASK]} -log g_psi^i(C_t, V)[c_0^i]

Normalisation (our choice): the batch loss is sum_b L(C_b) / sum_b N_b, the per-token NELBO
of MDLM. Dividing by the number of caption tokens, a constant under the masking, keeps the
estimate unbiased: E_q[(1/t) sum_masked CE] = sum_i E[CE_i] for every t. Dividing by the
number of *masked* tokens instead (about t*N) would cancel most of the 1/t factor.
``time_weighting=False`` drops exactly the 1/t factor and keeps this normaliser (the
"w/o t" / CMLM ablation). A fixed ``mask_ratio`` r is image-conditioned BERT: t = r for
every caption, and the loss is then about the mean cross-entropy over masked tokens (Eq. 1).

Only caption tokens are masked and supervised: [SOT], [EOT] and padding stay visible and
never enter the loss (the sampler likewise starts from [SOT] [MASK]*N' [EOT]).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mdc.tokenizer import caption_mask, valid_mask

T_MIN = 1e-4  # t is clamped here so that 1/t stays finite when w_l = 0


def trim_padding(tokens: torch.Tensor, eot_id: int) -> torch.Tensor:
    """Drop trailing columns that are padding in every row ([B, L] -> [B, L'])."""
    return tokens[:, : int(valid_mask(tokens, eot_id).sum(1).max())]


def sample_t(n: int, cfg, generator=None, device=None) -> torch.Tensor:
    """t [n] ~ U[w_l, w_u]; 'stratified' draws one offset u and uses (u + b/n) mod 1 across the batch."""
    if cfg.mask_ratio is not None:
        return torch.full((n,), float(cfg.mask_ratio), device=device)
    u = torch.rand(n if cfg.t_sampling == "uniform" else 1, generator=generator, device=device)
    if cfg.t_sampling == "stratified":
        u = (u + torch.arange(n, device=device) / n) % 1.0
    lo, hi = cfg.t_interval
    return (lo + (hi - lo) * u).clamp(min=T_MIN)


def mdc_loss(model, images, tokens, *, t=None, masked=None, generator=None):
    """Masked diffusion captioning loss (Alg. 1). Optional fixed `t` [B] and `masked` [B, L] for tests."""
    tok = model.tokenizer
    tokens = trim_padding(tokens, tok.eot_id)  # [B, L]
    maskable = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [B, L] caption tokens
    B, L = tokens.shape
    if t is None:
        t = sample_t(B, model.config, generator, tokens.device)  # [B]
    if masked is None:
        p = torch.rand(B, L, generator=generator, device=tokens.device)
        masked = p < t[:, None]  # Alg. 1: masked_caps[p < t] = MASK
    masked = masked[:, :L] & maskable
    noisy = tokens.masked_fill(masked, tok.mask_id)  # C_t
    hidden = model.hidden(noisy, model.memory(images))  # [B, L, W]
    ce = F.cross_entropy(model.head(hidden[masked]).float(), tokens[masked], reduction="none")  # [M]
    if model.config.time_weighting:
        ce = ce / t[:, None].expand(B, L)[masked]  # (1/t) per masked token
    return ce.sum() / maskable.sum().clamp(min=1)


def arc_loss(model, images, tokens):
    """Autoregressive captioning: teacher forcing; targets c_0..c_{N-1} and [EOT]; mean over them."""
    tok = model.tokenizer
    tokens = trim_padding(tokens, tok.eot_id)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [B, L-1]
    supervised = valid_mask(tokens, tok.eot_id)[:, 1:]  # caption tokens and EOT
    hidden = model.hidden(inputs, model.memory(images))  # [B, L-1, W]
    ce = F.cross_entropy(model.head(hidden[supervised]).float(), targets[supervised])
    return ce


def gather_features(x: torch.Tensor) -> torch.Tensor:
    """Concatenate [B, E] features from every DDP rank, keeping the gradient of every slice."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x), dim=0)


def clip_loss(image_emb, text_emb, scale):
    """Symmetric InfoNCE over the global batch (features gathered across ranks with gradient).

    Every rank computes the same global loss; all_gather's backward sums the gradient
    contributions of all ranks, and DDP's averaging then yields the global-batch gradient.
    """
    img, txt = gather_features(image_emb), gather_features(text_emb)  # [G, E]
    logits = scale * img @ txt.t()  # [G, G]
    labels = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
