"""Caption generation: MDC greedy confidence unmasking (Eq. 6); ARC greedy and beam search.

MDC starts from [SOT] [MASK]*N' [EOT] and runs ceil(N'/k) steps. Each step predicts every
masked position, takes the confidence of position i as max_j p(j) under the caption-token
distribution of :func:`mdc.diffusion.caption_log_probs` (ids a caption never holds removed,
the rest renormalised; the heuristic scorer ranks by the same numbers), and reveals the k
most confident masked positions (k = 1 by default: N' steps, Eq. 6). Revealed tokens stay
fixed. The image is encoded and every block's cross-attention keys/values are computed once
per batch (:class:`mdc.model.ImageContext`); only the text is re-run.
"""
from __future__ import annotations

import math

import torch

from mdc.diffusion import caption_log_probs, corrupt
from mdc.guidance import Guide, check_guidance


def masked_row(tok, batch: int, length: int, device) -> torch.Tensor:
    """[SOT] [MASK]*length [EOT] for every row: [B, length + 2] (the fully corrupted caption)."""
    x = torch.full((batch, length + 2), tok.pad_id, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = tok.sot_id, tok.eot_id
    maskable = torch.ones_like(x, dtype=torch.bool)
    maskable[:, [0, -1]] = False
    return corrupt(x, maskable, tok.mask_id).noisy


def check_length(model, length: int) -> None:
    if not 1 <= length <= model.config.context_length - 2:
        raise ValueError(f"length must lie in [1, {model.config.context_length - 2}] "
                         f"(context {model.config.context_length} minus SOT/EOT); got {length}")


@torch.no_grad()
def mdc_sample(model, images, length: int, tokens_per_step: int = 1, temperature: float = 0.0,
               generator: torch.Generator | None = None, guidance: str | None = None,
               guidance_scale: float | None = None, guidance_seed: int = 0) -> torch.Tensor:
    """Greedy confidence unmasking. Returns tokens [B, length + 2] without [MASK].

    ``guidance`` "cfg" | "mcs" ranks and samples under the guided distribution of
    :mod:`mdc.guidance` (CFG: scale 1 is unguided; MCS as printed: scale 0 is unguided);
    ``guidance_seed`` seeds MCS's partial-condition masks."""
    check_length(model, length)
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be >= 1; got {tokens_per_step}")
    tok = model.tokenizer
    guide = Guide.of(model, images, guidance, guidance_scale, seed=guidance_seed)  # encoder + cross-attn K/V, once
    x = masked_row(tok, len(images), length, images.device)  # [B, N'+2]
    for _ in range(math.ceil(length / tokens_per_step)):
        if temperature > 0:
            probs = guide.log_probs(x, temperature=temperature).exp()  # [B, N'+2, V]
            pred = torch.multinomial(probs.flatten(0, 1), 1, generator=generator).view(x.shape)
            conf = probs.gather(-1, pred[..., None]).squeeze(-1)
        else:
            conf, pred = guide.log_probs(x).exp().max(-1)  # [B, N'+2]
        still = x == tok.mask_id
        conf = conf.masked_fill(~still, -1.0)
        k = min(tokens_per_step, int(still.sum(1).max()))
        top = conf.topk(k, dim=-1).indices  # [B, k] most confident masked positions
        reveal = torch.zeros_like(still).scatter_(1, top, True) & still
        x = torch.where(reveal, pred, x)
    return x


def _decode_step(model, tokens, context, cache, start):
    """ARC next-token log-probs [B, V] (caption tokens and [EOT]) with a self-attention KV cache."""
    h = model.decoder(tokens, causal=start == 0, context=context, cache=cache, start=start)
    return caption_log_probs(model.head(h[:, -1]), model.tokenizer, allow_eot=True)


@torch.no_grad()
def arc_sample(model, images, max_length: int | None = None, beam_size: int = 1,
               length_penalty: float = 1.0) -> torch.Tensor:
    """Greedy (beam_size=1) or beam search with a KV cache. Returns tokens [B, <= max_length + 2].

    Beam search keeps `beam_size` live hypotheses; one that emits [EOT] is finished and ranked
    by sum log p / (number of generated tokens incl. EOT) ** length_penalty. A batch row stops
    once it holds `beam_size` finished hypotheses (early stopping); at `max_length` caption
    tokens every live hypothesis is closed with [EOT]. Beam 1 reproduces greedy decoding.
    """
    tok = model.tokenizer
    max_length = max_length or model.config.context_length - 2
    check_length(model, max_length)
    B, K, dev = len(images), beam_size, images.device
    context = model.context(images).repeat(K)
    cache = [[] for _ in model.decoder.blocks]
    seqs = torch.full((B * K, 1), tok.sot_id, dtype=torch.long, device=dev)
    scores = torch.full((B, K), -math.inf, device=dev)
    scores[:, 0] = 0.0  # one live hypothesis to start with
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for step in range(max_length + 1):
        logp = _decode_step(model, seqs[:, -1:], context, cache, start=step)  # [B*K, V]
        if step == max_length:  # out of room: close every hypothesis
            forced = torch.full_like(logp, -math.inf)
            forced[:, tok.eot_id] = logp[:, tok.eot_id]
            logp = forced
        V = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(B, K, V)).view(B, K * V)
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=-1)  # [B, 2K]
        beam, word = top_i // V, top_i % V
        new_scores = torch.full((B, K), -math.inf, device=dev)
        new_src = torch.zeros(B, K, dtype=torch.long, device=dev)
        new_word = torch.full((B, K), tok.eot_id, dtype=torch.long, device=dev)
        for b in range(B):
            if len(finished[b]) >= K:
                continue  # this row is done; its beams stay at -inf
            live = 0
            for r in range(top_s.shape[1]):
                s, src, w = top_s[b, r].item(), beam[b, r].item(), word[b, r].item()
                if s == -math.inf or live == K:
                    break
                if w == tok.eot_id:
                    if r < K:  # only top-K ranked endings count, as in standard beam search
                        body = seqs[b * K + src, 1:].tolist()
                        finished[b].append((s / (len(body) + 1) ** length_penalty, body))
                    continue
                new_scores[b, live], new_src[b, live], new_word[b, live] = s, src, w
                live += 1
        if all(len(f) >= K for f in finished) or step == max_length:
            break
        flat = (new_src + torch.arange(B, device=dev)[:, None] * K).view(-1)
        seqs = torch.cat([seqs[flat], new_word.view(-1, 1)], dim=1)
        for c in cache:
            c[:] = [t[flat] for t in c]
        scores = new_scores
    width = max(len(max(f, key=lambda x: x[0])[1]) for f in finished) + 2
    out = torch.full((B, width), tok.pad_id, dtype=torch.long, device=dev)
    for b, f in enumerate(finished):
        body = max(f, key=lambda x: x[0])[1]
        out[b, : len(body) + 2] = torch.tensor([tok.sot_id, *body, tok.eot_id])
    return out


def generate(model, images, length: int = 15, *, beam_size: int = 6, tokens_per_step: int = 1,
             temperature: float = 0.0, generator=None, return_tokens: bool = False,
             guidance: str | None = None, guidance_scale: float | None = None, guidance_seed: int = 0):
    """Captions for `images` [B, 3, H, W]: list[str] (or the token tensor).

    MDC: exactly `length` tokens by greedy confidence unmasking. ARC: at most `length` tokens,
    beam search with `beam_size` (1 = greedy). MDC with ``noise="mask_replace"``: the D3PM
    reverse process of mdc/d3pm.py (``generator`` drives it). ``guidance`` "cfg" | "mcs" with
    ``guidance_scale`` (MDC only; mdc/guidance.py): CFG is unguided at 1, MCS (as printed) at 0.
    """
    objective = model.config.objective
    if objective == "clip":
        raise ValueError("a CLIP model cannot generate captions; use an 'mdc' or 'arc' model")
    model.check_images(images)
    check_guidance(model, guidance, guidance_scale)
    guided = dict(guidance=guidance, guidance_scale=guidance_scale, guidance_seed=guidance_seed)
    was_training = model.training
    model.eval()
    try:
        if objective == "arc":
            tokens = arc_sample(model, images, max_length=length, beam_size=beam_size)
        elif model.config.noise == "mask_replace":
            from mdc.d3pm import d3pm_sample

            tokens = d3pm_sample(model, images, length, generator=generator, **guided)
        else:
            tokens = mdc_sample(model, images, length, tokens_per_step, temperature, generator, **guided)
    finally:
        model.train(was_training)
    return tokens if return_tokens else model.tokenizer.batch_decode(tokens)
