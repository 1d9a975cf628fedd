"""Caption generation: a captioner's noise process samples MDC; ARC greedy and beam search here.

:func:`generate` is the one entry point. A diffusion captioner's sampler is its noise process's
(``model.noise.sample``, :mod:`mdc.noise`): MDC's greedy confidence unmasking (Eq. 6,
:func:`mdc.noise.mdc_sample`) or, for a ``mask_replace`` model, the D3PM
reverse process (:mod:`mdc.d3pm`). ARC decodes left to right with a KV cache (:func:`arc_sample`).
The image is encoded once per batch (:class:`mdc.condition.ImageContext`).

The diffusion samplers query a :class:`mdc.distribution.CaptionDistribution` made by an
``encode`` function (default: the plain model's); MC-Diffusion's guidance passes its guided one
(:func:`mdc.api.generate` wires it in).
"""
from __future__ import annotations

import math

import torch

from mdc.diffusion import caption_log_probs
from mdc.model import evaluating
from mdc.noise import check_length

__all__ = ["arc_sample", "generate"]


def _decode_step(model, tokens, context, cache, start):
    """ARC next-token log-probs [B, V] (caption tokens and [EOT]) with a self-attention KV cache."""
    h = model.decoder(tokens, causal=start == 0, context=context, cache=cache, start=start)
    return caption_log_probs(model.head(h[:, -1]), model.tokenizer, allow_eot=True)


@torch.no_grad()
def arc_sample(model, images, max_length: int | None = None, beam_size: int = 1,
               length_penalty: float = 1.0) -> torch.Tensor:
    """Greedy (beam_size=1) or beam search with a KV cache. Returns tokens [B, <= max_length + 2].

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
    check_length(model, max_length)
    B, K, dev = len(images), beam_size, images.device
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
        if step == max_length:  # out of room: close every hypothesis
            forced = torch.full_like(logp, -math.inf)
            forced[:, tok.eot_id] = logp[:, tok.eot_id]
            logp = forced
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
    all_scores = torch.cat([s for s, _ in finished], 1)  # [B, steps * 2K], in the order hypotheses finished
    best = all_scores.argmax(1)  # the first of the best
    width = finished[0][0].shape[1]  # 2K candidates per step
    step_of = best // width
    out = torch.full((B, int(step_of.max()) + 2), tok.pad_id, dtype=torch.long, device=dev)
    for b in range(B):  # one short copy per row
        n = int(step_of[b])
        out[b, : n + 2] = torch.cat([out.new_tensor([tok.sot_id]), finished[n][1][b, best[b] % width],
                                     out.new_tensor([tok.eot_id])])
    return out


def generate(model, images, length: int = 15, *, beam_size: int = 6, tokens_per_step: int | None = None,
             threshold: float | None = None, temperature: float | None = None, generator=None,
             return_tokens: bool = False, precision: str = "auto", trace: list | None = None, encode=None):
    """Captions for `images` [B, 3, H, W]: list[str] (or the token tensor).

    A diffusion captioner samples with its noise process (``model.noise.sample``): MDC's absorbing
    noise gives exactly `length` tokens by greedy confidence unmasking (``tokens_per_step`` or a
    confidence ``threshold`` reveal several per step; ``temperature`` > 0 samples; ``trace``: a list
    that receives each step's revealed positions, tokens and confidences, see :func:`mdc.noise.mdc_sample`);
    a ``mask_replace`` model runs the D3PM reverse process (``generator`` drives it) and refuses
    those options. ARC: at most `length` tokens, beam search with `beam_size` (1 = greedy).
    ``precision``: "auto" (bf16 autocast on CUDA, fp32 elsewhere) | "fp32" | "bf16". ``encode``
    makes the caption distribution of the images (MC-Diffusion's guidance, wired by :func:`mdc.api.generate`).
    """
    if model.config.objective == "clip":
        raise ValueError("a CLIP model cannot generate captions; use an 'mdc' or 'arc' model")
    model.check_images(images)
    if trace is not None and model.noise is None:
        raise ValueError("trace records MDC's unmasking steps; this model samples otherwise "
                         f"(objective {model.config.objective!r})")
    given = dict(tokens_per_step=tokens_per_step, threshold=threshold, temperature=temperature, trace=trace)
    options = {name: value for name, value in given.items() if value is not None}  # the sampler's defaults else
    with evaluating(model, precision):
        if model.noise is None:  # ARC: no noise process
            tokens = arc_sample(model, images, max_length=length, beam_size=beam_size)
        else:
            tokens = model.noise.sample(model, images, length, generator=generator, encode=encode, **options)
    return tokens if return_tokens else model.tokenizer.batch_decode(tokens)
