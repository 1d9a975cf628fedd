"""Caption likelihood scorers for zero-shot matching (paper Sec. 4.2, Eq. 7 and Eq. 8).

- "exact" (ARC, Eq. 7): sum_i log p(c^i | c^{<i}, f(I)) over the caption tokens and [EOT]
  (the end token makes it a likelihood of the complete caption).
- "elbo" (MDC, Eq. 8): the masked-diffusion lower bound
      log p(C) >= sum_{n=1}^{N} E_{C_n}[ (1/n) sum_{i masked in C_n} log p(c^i | C_n, f(I)) ]
  estimated with `num_samples` masked copies per caption. Copy s gets n_s = 1 + floor(N (s + u)/S)
  masked tokens (one random offset u per caption: stratified over mask counts), a uniformly
  random subset of that size, and the estimate is N * mean_s (1/n_s) sum_masked log p.
- "heuristic" (MDC): start fully masked; N times, reveal the most confident masked position
  (max_j p_j, as the sampler does), add log p(ground-truth token) there and write it in.
- "cosine" (CLIP): cosine similarity of the image and caption embeddings.

Confidences and log-probabilities use the model's full output distribution (no ids banned).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mdc.loss import trim_padding
from mdc.tokenizer import caption_mask, valid_mask

METHODS = {"arc": ("exact",), "mdc": ("elbo", "heuristic"), "clip": ("cosine",)}
DEFAULT = {"arc": "exact", "mdc": "heuristic", "clip": "cosine"}


def exact_loglik(model, images, tokens):
    """ARC log-likelihood [B] by teacher forcing."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logp = F.log_softmax(model(images, inputs).float(), dim=-1)  # [B, L-1, V]
    ll = logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, L-1]
    return (ll * valid_mask(tokens, model.tokenizer.eot_id)[:, 1:]).sum(1)


def heuristic_score(model, images, tokens):
    """Greedy-order sum of ground-truth log-probabilities [B] (paper Sec. 4.2)."""
    tok = model.tokenizer
    memory = model.memory(images)
    todo = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [B, L] still masked
    x = tokens.masked_fill(todo, tok.mask_id)
    total = torch.zeros(len(tokens), device=tokens.device)
    rows = torch.arange(len(tokens), device=tokens.device)
    for _ in range(int(todo.sum(1).max())):
        logp = F.log_softmax(model.logits(x, memory).float(), dim=-1)  # [B, L, V]
        conf = logp.max(-1).values.masked_fill(~todo, -torch.inf)  # [B, L]
        pos = conf.argmax(-1)  # [B] most confident masked position
        active = todo[rows, pos]  # rows whose caption is not complete yet
        truth = tokens[rows, pos]
        total += torch.where(active, logp[rows, pos, truth], torch.zeros_like(total))
        x[rows, pos] = torch.where(active, truth, x[rows, pos])
        todo[rows, pos] = False
    return total


def elbo_score(model, images, tokens, num_samples=1024, seed=0, max_rows=256):
    """Monte-Carlo estimate [B] of the Eq. 8 lower bound; `max_rows` bounds each forward pass."""
    tok = model.tokenizer
    gen = torch.Generator().manual_seed(seed)
    B, L = tokens.shape
    S, dev = num_samples, tokens.device
    maskable = caption_mask(tokens, tok.sot_id, tok.eot_id)  # [B, L]
    N = maskable.sum(1)  # [B] caption lengths
    # n_{b,s}: stratified mask counts in 1..N_b
    u = torch.rand(B, 1, generator=gen)
    n = 1 + ((torch.arange(S)[None] + u) / S * N.cpu()[:, None]).floor().long()  # [B, S]
    n = torch.minimum(n, N.cpu()[:, None].clamp(min=1)).to(dev)
    memory = model.memory(images)
    total = torch.zeros(B, device=dev)
    flat_b = torch.arange(B).repeat_interleave(S).to(dev)  # row -> caption
    for start in range(0, B * S, max_rows):
        b = flat_b[start : start + max_rows]
        rows_n = n.view(-1)[start : start + max_rows]  # [R]
        keys = torch.rand(len(b), L, generator=gen).to(dev).masked_fill(~maskable[b], 2.0)
        rank = keys.argsort(-1).argsort(-1)  # random order of the caption positions
        masked = (rank < rows_n[:, None]) & maskable[b]  # exactly n masked tokens per row
        x = tokens[b].masked_fill(masked, tok.mask_id)
        mem = [(k[b], v[b]) for k, v in memory]
        hidden = model.hidden(x, mem)  # [R, L, W]
        logp = F.log_softmax(model.head(hidden[masked]).float(), -1)  # [M, V]
        ll = torch.zeros(len(b), L, device=dev)
        ll[masked] = logp.gather(-1, tokens[b][masked][:, None]).squeeze(-1)
        total.index_add_(0, b, ll.sum(1) / rows_n)
    return N * total / S


@torch.no_grad()
def score(model, images, captions, method: str | None = None, *, num_samples: int = 1024,
          seed: int = 0, max_rows: int = 256) -> torch.Tensor:
    """Score each (image, caption) pair: Tensor [B]; higher = better match."""
    objective = model.config.objective
    method = method or DEFAULT[objective]
    if method not in METHODS[objective]:
        raise ValueError(f"method {method!r} does not apply to a {objective!r} model; "
                         f"choose one of {METHODS[objective]}")
    if len(captions) != len(images):
        raise ValueError(f"got {len(images)} images but {len(captions)} captions")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    model.check_images(images)
    tokens = trim_padding(model.tokenizer(list(captions)).to(images.device), model.tokenizer.eot_id)
    was_training = model.training
    model.eval()
    try:
        if method == "cosine":
            return (model.image_embedding(images) * model.text_embedding(tokens)).sum(-1)
        if method == "exact":
            return exact_loglik(model, images, tokens)
        if method == "heuristic":
            return heuristic_score(model, images, tokens)
        return elbo_score(model, images, tokens, num_samples, seed, max_rows)
    finally:
        model.train(was_training)
