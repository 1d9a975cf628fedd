"""Caption scoring: ELBO and heuristic throughput, and the variance of the ELBO's true-minus-false
difference under i.i.d., stratified and paired (common random numbers) sampling.

Variance needs a trained model (an untrained one scores every caption alike): ``--checkpoint DIR``
(an MDC checkpoint), or else a tiny MDC trained here for a fixed number of steps on descriptive
captions of the synthetic world, so the numbers then describe that model. The items are held-out
two-object scenes with a true relation sentence and its swap ("the red circle is left of the blue
square." / "the blue square is left of the red circle."), as VG-Relation pairs them.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

import mdc
from mdc.base import optim
from mdc.data.transforms import CLIP_MEAN, CLIP_STD
from mdc.tokenizer import trim_padding
from mdc.world.render import render_array
from mdc.world.scenes import sample_scene
from mdc.world.streams import STREAM_BENCHMARK_ITEMS, STREAM_CAPTION, STREAM_SCENE, stream_rng
from mdc.world.text import DESCRIPTIVE_RELATION, REL_VERB, caption, relation_of

from benchmarks.common import Context, Section, interleaved, median

CONFIGS = {  # label -> score_candidates options
    "i.i.d.": dict(paired=False, stratified=False),
    "stratified": dict(paired=False, stratified=True),
    "paired": dict(paired=True, stratified=False),
    "paired + stratified (default)": dict(paired=True, stratified=True),
}


def _images(scenes: list[dict], size: int) -> torch.Tensor:
    x = torch.from_numpy(np.stack([render_array(s, size) for s in scenes])).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1)


def load_checkpoint(path: str):
    """The MDC model of checkpoint folder ``path``; a ValueError names any other objective."""
    model = mdc.load(path).eval()
    if model.config.objective != "mdc":
        raise ValueError(f"--checkpoint must be an MDC checkpoint; {path!r} holds objective "
                         f"{model.config.objective!r}")
    return model


def trained_model(ctx: Context):
    """(model, description): the --checkpoint, or a tiny MDC trained in-process (cached per run)."""
    if ctx.checkpoint:
        model = load_checkpoint(ctx.checkpoint)
        return model, f"the {model.config.name} MDC checkpoint given with --checkpoint"
    if "trained" not in ctx.cache:
        steps, bsz, n = ctx.pick(300, 3), ctx.pick(32, 8), ctx.pick(2048, 64)
        torch.manual_seed(0)
        model = mdc.create_model("tiny", "mdc")
        scenes = [sample_scene(stream_rng(0, STREAM_SCENE, i)) for i in range(n)]
        images = _images(scenes, model.config.image_size)
        captions = [caption(s, "descriptive", stream_rng(0, STREAM_CAPTION, i)) for i, s in enumerate(scenes)]
        tokens = trim_padding(model.tokenizer(captions), model.tokenizer.eot_id)
        opt = optim.make_optimizer(model, 1e-3, 0.1)
        sched = optim.make_scheduler(opt, max(1, steps // 20), steps)
        g, start = torch.Generator().manual_seed(0), time.perf_counter()
        for _ in range(steps):
            rows = torch.randint(n, (bsz,), generator=g)
            loss = model.loss(images[rows], tokens[rows])
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        took = time.perf_counter() - start
        ctx.cache["trained"] = (model.eval(), f"a tiny MDC trained here: {steps} steps of {bsz} descriptive "
                                              f"captions of {n} synthetic scenes, lr 1e-3 ({took:.0f} s, final "
                                              f"loss {loss.item():.2f})")
    return ctx.cache["trained"]


def relation_items(k: int, size: int) -> tuple[torch.Tensor, list[list[str]]]:
    """k held-out two-object scenes: images [k, 3, S, S] and [true, swapped] relation sentences."""
    scenes = [sample_scene(stream_rng(1, STREAM_BENCHMARK_ITEMS, i), n_objects=2) for i in range(k)]
    pairs = []
    for s in scenes:
        a, b = (f"{o['colour']} {o['shape']}" for o in s["objects"])
        rel = REL_VERB[relation_of(s, 0, 1)][0]
        pairs.append([DESCRIPTIVE_RELATION.format(a=a, rel=rel, b=b), DESCRIPTIVE_RELATION.format(a=b, rel=rel, b=a)])
    return _images(scenes, size), pairs


def samples_to_match(sizes: list[int], sigmas: list[float], target: float) -> float:
    """Samples at which the std falls to ``target``: log-log interpolation between the measured sizes,
    extrapolated with the nearest segment's slope (or 1/sqrt(S) where the measured slope is not negative)."""
    ls, lg, t = np.log(sizes), np.log(sigmas), math.log(target)
    i = 0 if lg[0] <= t else next((j for j in range(len(ls) - 1) if lg[j + 1] <= t), len(ls) - 2)
    slope = (lg[i + 1] - lg[i]) / (ls[i + 1] - ls[i]) if len(ls) > 1 else -0.5
    slope = slope if slope < 0 else -0.5
    return float(math.exp(ls[i] + (t - lg[i]) / slope))


def _difference(model, images, pairs, num_samples: int, seed: int, options: dict) -> torch.Tensor:
    """True-minus-false ELBO per item [K]."""
    scores = mdc.score_candidates(model, images, pairs, "elbo", num_samples=num_samples, seed=seed, **options)
    return scores[:, 0] - scores[:, 1]


def run(ctx: Context) -> Section:
    sec = Section("scoring", "Caption scoring (CPU, mdc.score / mdc.score_candidates): throughput and ELBO variance")
    model, described = trained_model(ctx)
    k, seeds = ctx.pick(6, 2), ctx.pick(6, 2)
    sizes = ctx.pick([32, 128, 1024], [4, 8, 16])
    images, pairs = relation_items(k, model.config.image_size)
    true = [p[0] for p in pairs]
    S = ctx.pick(256, 16)
    times = interleaved({"elbo": lambda: mdc.score(model, images, true, "elbo", num_samples=S),
                         "heuristic": lambda: mdc.score(model, images, true, "heuristic")}, rounds=ctx.pick(3, 1))
    sec.add(f"ELBO ({S} samples per caption)", round(k * S / median(times["elbo"])), "caption x samples/s",
            f"{k} captions of about {len(true[0].split())} words per call")
    sec.add("heuristic (greedy-order) scorer", round(k / median(times["heuristic"]), 1), "captions/s")

    sigma = {}
    for label, options in CONFIGS.items():
        for n in sizes:
            diffs = torch.stack([_difference(model, images, pairs, n, seed, options) for seed in range(seeds)])
            sigma[label, n] = float(diffs.std(0).pow(2).mean().sqrt())  # RMS over items of the std over seeds
            sec.add(f"std of true - false ELBO, {label}, {n} samples", round(sigma[label, n], 4), "nats")
    reference = sigma["i.i.d.", sizes[-1]]
    for label in CONFIGS:
        needed = samples_to_match(sizes, [sigma[label, n] for n in sizes], reference)
        sec.add(f"samples to match {sizes[-1]} i.i.d., {label}", round(needed), "samples",
                f"{sizes[-1] / needed:.1f}x fewer")
        if label.startswith("paired + stratified"):
            sec.add(f"fewer samples than i.i.d., {label}", round(sizes[-1] / needed, 1), "x", at_least=8.0)
    sec.notes.append(f"Model: {described}. Items: {k} held-out two-object scenes, true relation sentence vs its "
                     f"swap (equal lengths, so paired noise shares every mask position); std over {seeds} seeds "
                     f"per item, RMS over items. 'Samples to match' interpolates the measured stds in log-log.")
    return sec
