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
never enter the loss. The masking itself is :func:`mdc.diffusion.corrupt`, which the sampler
and the scorers share.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mdc.condition import training_condition
from mdc.diffusion import corrupt, sample_t, uniform
from mdc.tokenizer import caption_mask, trim_padding, valid_mask


def mdc_loss(model, images, tokens, *, t=None, noise=None, generator=None):
    """Masked diffusion captioning loss (Alg. 1). Optional fixed `t` [B] and `noise` [B, L] for tests."""
    tok, cfg = model.tokenizer, model.config
    tokens = trim_padding(tokens, tok.eot_id, model.trim_multiple)  # [B, L]
    maskable = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [B, L] caption tokens
    B, L = tokens.shape
    if t is None:
        t = sample_t(B, cfg, generator, tokens.device)  # [B]
    if noise is None:
        noise = uniform(B, L, generator=generator, device=tokens.device)  # Alg. 1: p = uniform(B, L)
    c = corrupt(tokens, maskable, tok.mask_id, t=t, noise=noise[:, :L])  # C_t
    cond = training_condition(model, B, generator, tokens.device)  # null / partial y (mdc/condition.py); {} when off
    hidden = model.hidden(c.noisy, model.context(images, **cond))  # [B, L, W]
    ce = F.cross_entropy(model.head(hidden[c.masked]).float(), tokens[c.masked], reduction="none")  # [M]
    if cfg.time_weighting:
        ce = ce * c.weight[:, None].expand(B, L)[c.masked]  # (1/t) per masked token
    return ce.sum() / maskable.sum().clamp(min=1)


def arc_loss(model, images, tokens):
    """Autoregressive captioning: teacher forcing; targets c_0..c_{N-1} and [EOT]; mean over them."""
    tok = model.tokenizer
    tokens = trim_padding(tokens, tok.eot_id, model.trim_multiple)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [B, L-1]
    supervised = valid_mask(tokens, tok.eot_id)[:, 1:]  # caption tokens and EOT
    hidden = model.hidden(inputs, model.context(images))  # [B, L-1, W]
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
