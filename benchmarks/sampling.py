"""Caption generation: MDC's cached greedy unmasking against re-running the whole model each step, each named
decoder beside the default (tiny), and
ARC's KV-cached beam search against open_clip's own ``CoCa.generate``, at the tiny and vit-b-32 sizes.

Decoding cost depends on the number of steps, not on the weights, so the models are freshly
initialised; forward passes are counted with hooks on the image encoder and the text decoder.
CoCa runs in the peers' virtualenv (:mod:`benchmarks.peers`: open_clip 3.3 needs transformers 4),
on the same images (same seed, same torch), at the same widths, length, beams and threads, timed
round trip included in the same interleaved rounds as ARC; where that virtualenv cannot be had
(or a quick run finds none), :func:`coca_beam_search` stands in, labelled as the fallback.
"""
from __future__ import annotations

import math
import os

import torch

import mdc
from mdc.distribution import caption_log_probs
from mdc.unmasking import masked_row

from benchmarks import peers
from benchmarks.common import (Context, Section, coca_config, coca_like, count_calls, interleaved, median, small,
                               speedup)

LENGTH, BEAMS, SEED = 20, 6, 0


@torch.no_grad()
def plain_mdc_sample(model, images, length: int) -> torch.Tensor:
    """Greedy confidence unmasking as :func:`mdc.unmasking.mdc_sample` does it, but running the whole
    model, image encoder included, at every step: the loop the cached sampler replaces."""
    tok = model.tokenizer
    x = masked_row(tok, len(images), length, images.device)
    for _ in range(length):
        conf, pred = caption_log_probs(model(images, x), tok).exp().max(-1)  # [B, N'+2]
        still = x == tok.mask_id
        top = conf.masked_fill(~still, -1.0).topk(1, dim=-1).indices
        x = torch.where(torch.zeros_like(still).scatter_(1, top, True) & still, pred, x)
    return x


@torch.no_grad()
def coca_beam_search(coca, images, length: int, beams: int, tok, min_length: int = 0) -> list[list[int]]:
    """Beam search that drives CoCa the way open_clip's ``CoCa.generate`` does: images repeated per beam
    and encoded once, then the whole prefix through the text tower and the multimodal decoder at every
    step (no cache). The bookkeeping is plain beam search (finished = emitted [EOT] within the top
    ``beams``, length-normalised ranking), the same rules as :func:`mdc.autoregressive.arc_sample`; no [EOT]
    before ``min_length`` tokens, as open_clip's ``min_seq_len``. An image none of whose hypotheses
    finished gets its best live one, length-normalised (open_clip's and Hugging Face's finalize)."""
    B, K = len(images), beams
    latent, embs = coca._encode_image(images.repeat_interleave(K, 0))
    seqs = torch.full((B * K, 1), tok.sot_id, dtype=torch.long)
    scores = torch.full((B, K), -math.inf)
    scores[:, 0] = 0.0
    finished = [[] for _ in range(B)]
    for step in range(length + 1):
        logits = coca(None, seqs, image_latent=latent, image_embs=embs, output_labels=False)["logits"][:, -1]
        logp = logits.float().log_softmax(-1)
        if step < min_length:
            logp[:, tok.eot_id] = -math.inf
        if step == length:  # out of room: only [EOT]
            logp = torch.full_like(logp, -math.inf).index_fill_(1, torch.tensor([tok.eot_id]), 0) + logp
        V = logp.shape[-1]
        top_s, top_i = (scores[:, :, None] + logp.view(B, K, V)).view(B, K * V).topk(2 * K, dim=-1)
        src, word = (top_i // V).tolist(), (top_i % V).tolist()
        top_s = top_s.tolist()
        new_scores, new_src, new_word = torch.full((B, K), -math.inf), torch.zeros(B, K, dtype=torch.long), \
            torch.full((B, K), tok.eot_id)
        for b in range(B):
            live = 0
            for r in range(2 * K):
                if len(finished[b]) >= K or live == K or top_s[b][r] == -math.inf:
                    break
                if word[b][r] == tok.eot_id:
                    if r < K:
                        body = seqs[b * K + src[b][r], 1:].tolist()
                        finished[b].append((top_s[b][r] / (len(body) + 1), body))
                    continue
                new_scores[b, live], new_src[b, live], new_word[b, live] = top_s[b][r], src[b][r], word[b][r]
                live += 1
        if all(len(f) >= K for f in finished) or step == length:
            break
        rows = (new_src + torch.arange(B)[:, None] * K).view(-1)
        seqs, scores = torch.cat([seqs[rows], new_word.view(-1, 1)], dim=1), new_scores
    for b in range(B):
        if not finished[b]:
            finished[b] = [(scores[b, k].item() / max(1, seqs.shape[1] - 1), seqs[b * K + k, 1:].tolist())
                           for k in range(K) if scores[b, k] > -math.inf]
    return [max(f)[1] for f in finished]


def _images(n: int, size: int) -> torch.Tensor:
    """The run's images, drawn the same way in the peers' worker."""
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(SEED))


def _coca(arc, batch: int, python: str | None, why: str = ""):
    """(generate, label, note, close) for CoCa's beam search on ``batch`` images: open_clip's own
    ``CoCa.generate`` in the peers' virtualenv (its ``python``), else :func:`coca_beam_search` in this
    process, the note saying ``why``. ``generate()`` returns ``{"decoder_passes": n, "seconds": its own time or None}``.
    Either way no [EOT] before ``LENGTH`` tokens (open_clip's ``min_seq_len``): untrained models would
    stop at random, and the step counts must match for the times to compare."""
    cfg, name = coca_config(arc)
    tok = arc.tokenizer
    if python:
        worker = None
        try:
            worker = peers.Worker(python, dict(
                cfg=cfg, name=name, batch=batch, image_size=arc.config.image_size, seed=SEED, length=LENGTH,
                beams=BEAMS, threads=torch.get_num_threads(), sot=tok.sot_id, eot=tok.eot_id, pad=tok.pad_id))
            worker()  # runs there, or fails now
            v = worker.info["versions"]
            same = "same torch" if v["torch"] == torch.__version__ else f"torch {v['torch']} ({torch.__version__} here)"
            return (worker, f"open_clip CoCa.generate (isolated venv: open_clip {v['open_clip_torch']}, transformers "
                            f"{v['transformers']})", f"{same}, torch threads {worker.info['threads']}", worker.close)
        except RuntimeError as exn:
            why = f"open_clip's CoCa.generate failed under {os.path.relpath(python, peers.ROOT)}: {exn}"
            if worker:
                worker.close()
    coca, images = coca_like(arc).eval(), _images(batch, arc.config.image_size)
    calls = count_calls(coca.text_decoder)

    def generate():
        before = calls[0]
        coca_beam_search(coca, images, LENGTH, BEAMS, tok, min_length=LENGTH)
        return {"decoder_passes": calls[0] - before, "seconds": None}

    generate()  # untimed, as the worker's first call
    return (generate, "CoCa, open_clip's beam search re-implemented here (fallback)",
            f"{why}; driven as its generate does it: images encoded once, the whole prefix "
            f"through both text towers each step, no cache", lambda: None)


def _counted(counters: dict[str, list[int]], record: dict, name: str, fn):
    """``fn`` that also records in ``record[name]`` how many forward calls each counter saw during it."""
    def call():
        before = {k: c[0] for k, c in counters.items()}
        out = fn()
        record[name] = {k: c[0] - before[k] for k, c in counters.items()}
        return out
    return call


def decoders(sec: Section, model, images, label: str, rounds: int, warmup: int) -> None:
    """Each named decoder (:func:`mdc.list_decoders`) on the cached path, in the same interleaved rounds as the
    default (confidence-first): captions/s and its time over the default's, with its decoder passes."""
    B, calls, passes = len(images), {"decoder": count_calls(model.decoder)}, {}
    fns = {name: _counted(calls, passes, name, lambda name=name: mdc.generate(
        model, images, LENGTH, decoder=name, generator=torch.Generator().manual_seed(SEED), return_tokens=True))
        for name in mdc.list_decoders()}
    times = interleaved(fns, rounds=rounds, warmup=warmup)
    for name in fns:
        sec.add(f"MDC decoder {name}, {label}", round(B / median(times[name]), 2), "captions/s",
                f"{median(times[name]) / median(times['confidence']):.2f} x the default's time; "
                f"{passes[name]['decoder']} decoder passes per batch")


def run(ctx: Context) -> Section:
    sec = Section("sampling", f"Caption generation (CPU): length {LENGTH}, greedy MDC and beam-{BEAMS} ARC")
    notes = {}
    for size, B in (("tiny", ctx.pick(8, 2)), ("vit-b-32", ctx.pick(2, 1))):
        label = f"{size}{' (depth 1: quick)' if small(size, ctx.quick) else ''}, batch {B}"
        rounds, warmup = ctx.pick(3 if size == "tiny" else 2, 1), 1 if size == "tiny" else 0
        torch.manual_seed(0)
        model = mdc.create_model(size, "mdc", **small(size, ctx.quick)).eval()
        images = _images(B, model.config.image_size)
        calls = {"image": count_calls(model.visual.patch_embed), "decoder": count_calls(model.decoder)}
        passes = {}
        fns = {"cached": lambda: mdc.generate(model, images, LENGTH, return_tokens=True),
               "plain": lambda: plain_mdc_sample(model, images, LENGTH)}
        fns = {name: _counted(calls, passes, name, fn) for name, fn in fns.items()}
        times = interleaved(fns, rounds=rounds, warmup=warmup)
        same = torch.equal(fns["cached"](), fns["plain"]())
        for name, what in (("cached", "mdc.generate (image encoded once, K/V cached)"),
                           ("plain", "plain loop (model(images, tokens) each step)")):
            sec.add(f"MDC greedy, {what}, {label}", round(B / median(times[name]), 2), "captions/s",
                    f"{1000 * median(times[name]) / B:.0f} ms/caption; image encoded {passes[name]['image']}x, "
                    f"{passes[name]['decoder']} decoder passes per batch")
        sec.add(f"MDC cache speedup, {size}", round(speedup(times, "cached", "plain"), 2), "x",
                "same captions" if same else "CAPTIONS DIFFER", at_least=3.0)
        if size == "tiny":
            decoders(sec, model, images, label, rounds, warmup)

        arc = mdc.create_model(size, "arc", **small(size, ctx.quick)).eval()
        if "peers" not in ctx.cache:  # built once by a full run; a quick run takes it only if it is there
            ctx.cache["peers"] = peers.environment(build=not ctx.quick)
        peer, source, why, close = _coca(arc, B, *ctx.cache["peers"])
        notes.setdefault(source, why)
        steps, answers = {}, []
        fns = {"ARC": _counted({"ARC": count_calls(arc.decoder)}, steps, "ARC",
                               lambda: mdc.generate(arc, images, LENGTH, beam_size=BEAMS)),
               "CoCa": lambda: answers.append(peer())}
        try:
            fns["ARC"]()  # untimed, as CoCa's first call in _coca
            times = interleaved(fns, rounds, warmup)
        finally:
            close()
        own = [a["seconds"] for a in answers[-rounds:]]
        trip = f"; round trip {1000 * median([w - o for w, o in zip(times['CoCa'], own)]):.0f} ms" if own[0] else ""
        for name, what, passes in (("ARC", "ARC, KV cache (mdc.generate)", steps["ARC"]["ARC"]),
                                   ("CoCa", source, answers[-1]["decoder_passes"])):
            sec.add(f"beam {BEAMS}, {what}, {label}", round(B / median(times[name]), 2), "captions/s",
                    f"{1000 * median(times[name]) / B:.0f} ms/caption; {passes} decoder passes per batch"
                    + (trip if name == "CoCa" else ""))
        sec.add(f"ARC / CoCa beam-search speed, {size}", round(speedup(times, "ARC", "CoCa"), 2), "x", at_least=3.0)
    for source, why in notes.items():
        sec.notes.append(f"{source}: {why}.")
    sec.notes.append(f"Random weights: decoding cost depends on the steps, not the weights; no [EOT] before "
                     f"{LENGTH} tokens on either side (ARC's untrained beams run to the limit too).")
    return sec
