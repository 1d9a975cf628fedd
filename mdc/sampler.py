"""Caption generation: MDC greedy confidence unmasking (Eq. 6); ARC greedy and beam search.

MDC starts from [SOT] [MASK]*N' [EOT] and runs ceil(N'/k) steps. Each step predicts every
masked position, takes the confidence of position i as max_j p(j) under the caption-token
distribution of :func:`mdc.diffusion.caption_log_probs` (ids a caption never holds removed,
the rest renormalised; the heuristic scorer ranks by the same numbers), and reveals the k
most confident masked positions (k = 1 by default: N' steps, Eq. 6). Revealed tokens stay
fixed. The image is encoded and every block's cross-attention keys/values are computed once
per batch (:class:`mdc.condition.ImageContext`); only the text is re-run.

The sampler queries a :class:`mdc.distribution.CaptionDistribution` made by an ``encode``
function (default: the plain model's); MC-Diffusion's guidance passes its guided one
(:func:`mdc.api.generate` wires it in).
"""
from __future__ import annotations

import math

import torch

from mdc import distribution
from mdc.diffusion import caption_log_probs, masked_row
from mdc.model import evaluating

__all__ = ["arc_sample", "check_length", "generate", "mdc_sample"]


def check_length(model, length: int) -> None:
    if not 1 <= length <= model.config.context_length - 2:
        raise ValueError(f"length must lie in [1, {model.config.context_length - 2}] "
                         f"(context {model.config.context_length} minus SOT/EOT); got {length}")


@torch.no_grad()
def mdc_sample(model, images, length: int, tokens_per_step: int = 1, temperature: float = 0.0,
               generator: torch.Generator | None = None, threshold: float | None = None,
               trace: list | None = None, encode=None) -> torch.Tensor:
    """Greedy confidence unmasking. Returns tokens [B, length + 2] without [MASK].

    Each step reveals the ``tokens_per_step`` most confident masked positions, or, with
    ``threshold`` (parallel decoding after Fast-dLLM), every masked position whose confidence
    exceeds it, at least the most confident one. The head runs only at still-masked positions.
    ``encode(images)`` makes the distribution ranked and sampled (default: the plain model's;
    MC-Diffusion's guided one from :func:`mdc.guidance.encoder`). ``trace``: a list that receives one
    record per step, ``{"revealed": [B, N'+2] bool, "tokens": [B, N'+2] after the step,
    "confidence": [B, N'+2]}`` (each still-masked position's confidence at that step, -1 at the
    others); :func:`mdc.plots.plot_unmasking` draws it (nothing is recorded without a list)."""
    check_length(model, length)
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be >= 1; got {tokens_per_step}")
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1]; got {threshold}")
    tok = model.tokenizer
    dist = (encode or distribution.encode)(model, images)  # encoder + cross-attn K/V, once
    x = masked_row(tok, len(images), length, images.device)  # [B, N'+2]
    while True:
        still = x == tok.mask_id  # [B, N'+2]
        if not bool(still.any()):
            return x
        logp = dist.log_probs(x, where=still, temperature=temperature or None)  # [M, V] masked positions only
        if temperature > 0:
            p = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)  # [M]
            c = logp.gather(-1, p[:, None]).squeeze(1).exp()
        else:
            c, p = logp.exp().max(-1)  # [M]
        conf = torch.full(x.shape, -1.0, device=x.device).masked_scatter_(still, c)  # [B, N'+2]
        pred = x.masked_scatter(still, p)
        if threshold is None:
            top = conf.topk(min(tokens_per_step, int(still.sum(1).max())), dim=-1).indices  # [B, k] most confident
            reveal = torch.zeros_like(still).scatter_(1, top, True) & still
        else:
            reveal = (conf > threshold) | (conf == conf.max(1, keepdim=True).values)  # at least the best one
            reveal &= still
        x = torch.where(reveal, pred, x)
        if trace is not None:
            trace.append({"revealed": reveal.cpu(), "tokens": x.cpu(), "confidence": conf.float().cpu()})


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


def generate(model, images, length: int = 15, *, beam_size: int = 6, tokens_per_step: int = 1,
             threshold: float | None = None, temperature: float = 0.0, generator=None, return_tokens: bool = False,
             precision: str = "auto", trace: list | None = None, encode=None, diffusion_sampler=None):
    """Captions for `images` [B, 3, H, W]: list[str] (or the token tensor).

    MDC: exactly `length` tokens by greedy confidence unmasking (``tokens_per_step`` or a confidence
    ``threshold`` reveal several per step). ARC: at most `length` tokens,
    beam search with `beam_size` (1 = greedy). ``precision``: "auto" (bf16 autocast on CUDA,
    fp32 elsewhere) | "fp32" | "bf16". ``trace`` (MDC's unmasking sampler only): a list that
    receives each step's revealed positions, tokens and confidences (see :func:`mdc_sample`).
    Extensions (wired by :func:`mdc.api.generate`): ``encode`` makes the caption distribution of
    the images (MC-Diffusion's guidance); ``diffusion_sampler(model, images, length, generator=,
    encode=)`` replaces the unmasking sampler (the D3PM reverse process of a ``mask_replace`` model).
    """
    objective = model.config.objective
    if objective == "clip":
        raise ValueError("a CLIP model cannot generate captions; use an 'mdc' or 'arc' model")
    if model.config.noise != "absorbing" and diffusion_sampler is None:
        raise ValueError(f"noise {model.config.noise!r} needs its own sampler: use mdc.generate, which wires it in")
    model.check_images(images)
    if trace is not None and (objective != "mdc" or diffusion_sampler is not None):
        raise ValueError("trace records MDC's unmasking steps; this model samples otherwise "
                         f"(objective {objective!r}, noise {model.config.noise!r})")
    with evaluating(model, precision):
        if objective == "arc":
            tokens = arc_sample(model, images, max_length=length, beam_size=beam_size)
        elif diffusion_sampler is not None:
            tokens = diffusion_sampler(model, images, length, generator=generator, encode=encode)
        else:
            tokens = mdc_sample(model, images, length, tokens_per_step, temperature, generator, threshold=threshold,
                                trace=trace, encode=encode)
    return tokens if return_tokens else model.tokenizer.batch_decode(tokens)
