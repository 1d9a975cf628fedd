"""ARC, the autoregressive captioner (CapPa's baseline), in one place: the teacher-forced loss, greedy and
beam-search decoding with a KV cache, and the exact log-likelihood scorer (paper Eq. 7).

- Loss: teacher forcing; targets c_0 .. c_{N-1} and [EOT]; the mean cross-entropy over them.
- Decoding: left to right with a self-attention KV cache; the image is encoded once per batch and
  beams share their image's keys/values (a folded :class:`mdc.condition.ImageContext`).
- Score (Eq. 7): sum_i log p(c^i | c^{<i}, f(I)) over the caption tokens and [EOT] (the end token makes
  it a likelihood of the complete caption).

Log-probabilities are those of :func:`mdc.distribution.caption_log_probs` with [EOT] allowed.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mdc.distribution import banned_ids, caption_log_probs
from mdc.tokenizer import valid_mask

__all__ = ["arc_loss", "arc_sample", "exact_loglik"]


def arc_loss(model, images, tokens):
    """Autoregressive captioning: teacher forcing; targets c_0..c_{N-1} and [EOT]; mean over them. Dense: the
    padding after [EOT] is ``ignore_index``, so the step has one static graph and no host synchronisation."""
    tok = model.tokenizer
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [B, L-1]
    supervised = valid_mask(tokens, tok.eot_id)[:, 1:]  # caption tokens and EOT
    logits = model.head(model.hidden(inputs, model.context(images))).float()  # [B, L-1, V]
    return F.cross_entropy(logits.transpose(1, 2), targets.masked_fill(~supervised, -100), ignore_index=-100)


def _decode_step(model, tokens, context, cache, start):
    """ARC next-token log-probs [B, V] (caption tokens and [EOT]) with a self-attention KV cache."""
    h = model.decoder(tokens, causal=start == 0, context=context, cache=cache, start=start)
    return caption_log_probs(model.head(h[:, -1]), model.tokenizer, allow_eot=True)


def _min_lengths(min_length, batch: int, max_length: int, device) -> torch.Tensor:
    """``min_length`` (an int, or one per image) as a LongTensor [B], checked against ``max_length``."""
    m = torch.as_tensor(min_length, dtype=torch.long, device=device)
    m = m.expand(batch) if m.ndim == 0 else m
    if m.shape != (batch,):
        raise ValueError(f"min_length must be one int or one per image ({batch}); got {tuple(m.shape)} values")
    if int(m.max()) > max_length:
        raise ValueError(f"min_length ({int(m.max())}) must not exceed max_length ({max_length})")
    return m


def _length_rules(logp, step: int, max_length: int, minimum, eot: int) -> torch.Tensor:
    """Next-token log-probs [R, V] after ``step`` caption tokens: only [EOT] at ``max_length`` (out of room),
    no [EOT] on a row still under its ``minimum`` [R]."""
    if step == max_length:
        forced = torch.full_like(logp, -math.inf)
        forced[:, eot] = logp[:, eot]
        return forced
    if step < int(minimum.max()):
        logp[minimum > step, eot] = -math.inf
    return logp


@torch.no_grad()
def arc_sample(model, images, max_length: int | None = None, beam_size: int = 1,
               length_penalty: float = 1.0, min_length=0) -> torch.Tensor:
    """Greedy (beam_size=1) or beam search with a KV cache. Returns tokens [B, <= max_length + 2].

    ``min_length`` (an int, or a sequence / LongTensor [B] with one per image): [EOT] is held back until
    that many caption tokens, its log-probability -inf before (a minimum-length decoding constraint).

    Beam search keeps `beam_size` live hypotheses; one that emits [EOT] among the `beam_size`
    best candidates is finished and ranked by sum log p / (number of generated tokens incl. EOT)
    ** length_penalty. A batch row stops once it holds `beam_size` finished hypotheses (early
    stopping) and leaves the batch; at `max_length` caption tokens every live hypothesis is
    closed with [EOT]. Beam 1 reproduces greedy decoding. The bookkeeping is tensor operations
    (no per-candidate Python loop or device synchronisation); beams share their image's
    keys/values (a folded :class:`mdc.condition.ImageContext`).
    """
    tok = model.tokenizer
    max_length = max_length or model.config.context_length - 2
    model.check_length(max_length)
    B, K, dev = len(images), beam_size, images.device
    minimum = _min_lengths(min_length, B, max_length, dev)  # [B]
    base = model.context(images)  # [B] images, encoded once
    alive = torch.arange(B, device=dev)  # rows still decoding: A of them
    context, cache = base.repeat(K), [[] for _ in model.decoder.blocks]
    seqs = torch.full((B * K, 1), tok.sot_id, dtype=torch.long, device=dev)  # [A*K, 1 + step]
    scores = torch.full((B, K), -math.inf, device=dev)  # [A, K] live hypotheses' sum log p
    scores[:, 0] = 0.0  # one live hypothesis to start with
    n_done = torch.zeros(B, dtype=torch.long, device=dev)
    finished = []  # per step: (normalised score [B, 2K], body [B, 2K, step])
    for step in range(max_length + 1):
        logp = _decode_step(model, seqs[:, -1:], context, cache, start=step)  # [A*K, V]
        logp = _length_rules(logp, step, max_length, minimum[alive].repeat_interleave(K), tok.eot_id)
        A, V = len(alive), logp.shape[-1]
        top_s, top_i = (scores[:, :, None] + logp.view(A, K, V)).view(A, K * V).topk(min(2 * K, K * V), dim=-1)
        beam, word = top_i // V, top_i % V
        ok = top_s > -math.inf
        ends = ok & (word == tok.eot_id) & (torch.arange(top_s.shape[1], device=dev) < K)  # endings among the K best
        lives = ok & (word != tok.eot_id)
        lives &= lives.cumsum(1) <= K  # the K best live continuations
        score = torch.full((B, top_s.shape[1]), -math.inf, device=dev)  # [B, 2K]
        score[alive] = torch.where(ends, top_s / (step + 1) ** length_penalty, -math.inf)
        body = torch.zeros(B, top_s.shape[1], step, dtype=torch.long, device=dev)
        body[alive] = seqs[:, 1:].view(A, K, step).gather(1, beam[..., None].expand(-1, -1, step))
        finished.append((score, body))
        n_done[alive] += ends.sum(1)
        keep = n_done[alive] < K  # rows that go on
        if step == max_length or not bool(keep.any()):
            break
        order = (~lives).int().argsort(stable=True, dim=1)[:, :K]  # live ones first, in rank order
        take = lives.gather(1, order)  # [A, K]
        rows = (beam.gather(1, order) + torch.arange(A, device=dev)[:, None] * K)[keep].view(-1)  # source hypotheses
        seqs = torch.cat([seqs[rows], torch.where(take, word.gather(1, order), tok.eot_id)[keep].view(-1, 1)], 1)
        for c in cache:
            c[:] = [t[rows] for t in c]
        scores = torch.where(take, top_s.gather(1, order), -math.inf)[keep]
        alive = alive[keep]
        context = base.select(alive).repeat(K)
    return _best_finished(finished, tok)


def _best_finished(finished: list, tok) -> torch.Tensor:
    """Each row's best finished hypothesis, [B, <= max_length + 2] padded: ``finished`` holds per step
    (normalised scores [B, 2K], bodies [B, 2K, step]); the first of the best wins a tie."""
    all_scores = torch.cat([s for s, _ in finished], 1)  # [B, steps * 2K], in the order hypotheses finished
    best = all_scores.argmax(1)  # the first of the best
    width = finished[0][0].shape[1]  # 2K candidates per step
    step_of = best // width
    out = torch.full((len(best), int(step_of.max()) + 2), tok.pad_id, dtype=torch.long, device=best.device)
    for b in range(len(best)):  # one short copy per row
        n = int(step_of[b])
        out[b, : n + 2] = torch.cat([out.new_tensor([tok.sot_id]), finished[n][1][b, best[b] % width],
                                     out.new_tensor([tok.eot_id])])
    return out


def exact_loglik(model, context, rows, tokens, max_rows=256):
    """ARC log-likelihood [R] by teacher forcing; token row r decodes against image rows[r] of ``context``.

    The log-probabilities of :func:`mdc.distribution.caption_log_probs` (``allow_eot``) at the targets
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

