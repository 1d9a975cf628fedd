"""Training step per objective (MDC, ARC, CLIP) beside open_clip's CoCa, and the cost of a checkpoint.

Full optimizer steps (forward, backward, AdamW) on one in-memory batch of synthetic scene
captions (data loading excluded), the four models' steps interleaved. CoCa is built by
:func:`benchmarks.common.coca_like` and trained with open_clip's ``CoCaLoss`` (caption weight 2,
contrastive weight 1, its defaults) on the same images and tokens.
"""
from __future__ import annotations

import tempfile
import time

import torch

import mdc
from mdc.base import checkpoint, optim
from mdc.tokenizer import trim_padding

from benchmarks.common import Context, Section, batch, coca_like, interleaved, median, open_clip_module, small, speedup

OBJECTIVES = ("mdc", "arc", "clip")


def _step(model, images, tokens):
    opt = optim.make_optimizer(model, 5e-4, 0.1)

    def step():
        model.loss(images, tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, opt


def _coca_step(coca, images, tokens, pad_id):
    loss_fn = open_clip_module().loss.CoCaLoss(caption_loss_weight=2.0, clip_loss_weight=1.0, pad_id=pad_id)
    opt = torch.optim.AdamW(coca.parameters(), lr=5e-4, betas=(0.9, 0.98), weight_decay=0.1)

    def step():
        losses = loss_fn(**coca(images, tokens), output_dict=True)
        sum(losses.values()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _checkpoint_ms(model, opt) -> float:
    """Median of 3 atomic checkpoint writes (weights, optimizer, RNG states)."""
    times = []
    with tempfile.TemporaryDirectory() as run_dir:
        for i in range(3):
            start = time.perf_counter()
            state = {"step": i, "world_size": 1, "optimizer": opt.state_dict(), "scheduler": {},
                     "rng": [checkpoint.rng_state()], "data": [{}]}
            checkpoint.save(run_dir, i, model, state)
            times.append(time.perf_counter() - start)
    return 1000 * median(times)


def run(ctx: Context) -> Section:
    sec = Section("train", "Training step (CPU, fp32): images/s per objective, beside open_clip's CoCa")
    sizes = [("tiny", ctx.pick(32, 8)), ("vit-b-32", ctx.pick(4, 2))]
    for name, bsz in sizes:
        torch.manual_seed(0)
        models = {obj: mdc.create_model(name, obj, **small(name, ctx.quick)) for obj in OBJECTIVES}
        images, tokens = batch(models["mdc"], bsz)
        steps, opts = {}, {}
        for obj, model in models.items():
            steps[obj.upper()], opts[obj] = _step(model, images, tokens)
        coca, tok = coca_like(models["mdc"]), models["mdc"].tokenizer
        coca_tokens = trim_padding(tokens, tok.eot_id)[:, : coca.context_length]  # as the captioners trim
        steps["CoCa"] = _coca_step(coca, images, coca_tokens, tok.pad_id)
        times = interleaved(steps, rounds=ctx.pick(5 if name == "tiny" else 3, 1), warmup=ctx.pick(2, 1))
        label = f"{name}{' (depth 1: quick)' if small(name, ctx.quick) else ''}, batch {bsz}"
        for who, t in times.items():
            params = sum(p.numel() for p in (coca if who == "CoCa" else models[who.lower()]).parameters())
            sec.add(f"{who} {label}", round(bsz / median(t), 1), "images/s",
                    f"{1000 * median(t):.0f} ms/step, {params / 1e6:.1f}M params")
        sec.add(f"MDC / ARC speed, {name}", round(speedup(times, "MDC", "ARC"), 3), "x", at_least=0.95)
        sec.add(f"MDC / CoCa speed, {name}", round(speedup(times, "MDC", "CoCa"), 3), "x", at_least=1.0)
        if name == "tiny":
            for obj, model in models.items():
                ms = _checkpoint_ms(model, opts[obj])
                sec.add(f"checkpoint {obj.upper()} tiny", round(ms, 1), "ms",
                        f"{100 * ms / 1000 / median(times[obj.upper()]):.0f}% of a step")
    sec.notes.append("Ratios are medians over interleaved rounds of the paired step-time ratio, one process. "
                     "CoCa: open_clip's CoCa with the same ViT and a multimodal decoder of the captioners' "
                     "decoder size plus a unimodal text tower of that size (open_clip's split), random "
                     "weights, fed the same padding-trimmed tokens.")
    return sec
