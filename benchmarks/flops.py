"""Pretraining at the machine's limit: a training step's achieved GFLOP/s beside a large fp32 matmul's.

For ``tiny`` and ``mini`` and each objective: one pretraining step through the training loop's own
code (:class:`mdc.train.LossModule`, :func:`mdc.train.accumulate`, :func:`mdc.base.optim.optimizer_step`:
forward, backward, AdamW, the LR schedule; fp32, which ``precision="auto"`` gives on CPU) on one
in-memory batch of the ``mini`` preset's size (random images, descriptive synthetic captions), timed
in interleaved rounds beside a square fp32 ``torch.mm`` on the same torch threads.

The step's FLOPs are counted, not estimated: the meter of :mod:`mdc.base.flops` (``FlopCounterMode``) over
one forward and backward of the same step with the same masks (the step reseeds torch's RNG: every call
draws the same t and masked positions). It counts matrix products, convolutions and attention (the CPU
kernel of ``scaled_dot_product_attention``, which the counter does not know, at its formula for the
other SDPA kernels: all L x S scores, padding and causal masks included). Elementwise ops (GELU, norms, the
loss), reductions and the optimizer are not counted. fraction = the step's GFLOP/s / the matmul's,
the median over rounds of the paired ratio (the matmul of the same round).

The ``mini`` MDC step compiled whole (the loop's ``--compile``: ``fullgraph``, inductor; quick runs use
aot_eager) beside the eager step, a ratio from interleaved rounds, and the first compiled step's seconds.

Then the FLOPs of one ``mini`` pretraining run (``reproduce/presets/mini.json``: steps x batch) per
objective and caption style, and where a ``mini`` MDC step's time goes: ``torch.profiler``'s self
CPU time by group of operators, the optimizer's apart.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import mdc
from mdc.base import optim
from mdc.base.flops import Meter
from mdc.train import LossModule, accumulate
from mdc.tokenizer import trim_padding
from mdc.world.scenes import scene_captions

from benchmarks.common import Context, Section, interleaved, median, speedup

PRESET = json.loads((Path(__file__).parents[1] / "reproduce" / "presets" / "mini.json").read_text())
MODELS, OBJECTIVES, STYLES = ("tiny", "mini"), ("mdc", "arc", "clip"), ("alt", "descriptive")


def trainer(model, images: torch.Tensor, tokens: torch.Tensor, seed: int = 0, compile: dict | None = None):
    """One pretraining step of ``model`` on (images, tokens), the same masks at every call; ``compile``: the
    loss compiled whole with these ``torch.compile`` arguments, as the loop's ``--compile`` does."""
    net, lr = LossModule(model), PRESET["objectives"].get(model.config.objective, {}).get("lr", PRESET["lr"])
    net = net if compile is None else torch.compile(net, fullgraph=True, **compile)
    opt = optim.make_optimizer(model, lr, PRESET["weight_decay"])
    sched = optim.make_scheduler(opt, PRESET["warmup_steps"], PRESET["steps"])

    def step():
        torch.manual_seed(seed)
        accumulate(net, model, [(images, tokens)])
        optim.optimizer_step(model, opt, sched)

    return step


def count(model, images: torch.Tensor, tokens: torch.Tensor, seed: int = 0) -> dict[str, int]:
    """FLOPs of one forward and backward of :func:`trainer`'s step, by aten operator (:class:`mdc.base.flops.Meter`)."""
    with Meter() as meter:
        torch.manual_seed(seed)
        accumulate(LossModule(model), model, [(images, tokens)])
    model.zero_grad(set_to_none=True)
    return meter.by_op()


def batch(model, n: int, style: str = "descriptive", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    size = model.config.image_size
    images = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))
    return images, trim_padding(model.tokenizer(scene_captions(n, style, seed)), model.tokenizer.eot_id)


# profiler operator name -> group; the first group whose key is in the name
GROUPS = (("attention (SDPA)", ("scaled_dot_product",)), ("convolutions", ("convolution",)),
          ("matrix products (mm, addmm)", ("aten::mm", "aten::addmm", "aten::bmm")),
          ("norms (layer, batch)", ("_norm",)),
          ("data movement (copy_, cat, fill_, index)", ("copy_", "aten::cat", "fill_", "zero_", "index", "clone")))
COUNTED = {"attention (SDPA)": "scaled_dot_product", "convolutions": "convolution",
           "matrix products (mm, addmm)": "mm"}  # FLOP-counter names of a group's ops (substrings)


def _group(event) -> str:
    parent = event
    while parent is not None:
        if parent.name.startswith("Optimizer."):  # step and zero_grad
            return "optimizer (AdamW, outside the count)"
        parent = parent.cpu_parent
    return next((g for g, keys in GROUPS if any(k in event.name for k in keys)),
                "other elementwise and reductions (GELU, add, sum, loss)")


def where_time_goes(sec: Section, step, flops: dict[str, int], steps: int, step_seconds: float) -> None:
    """Rows: share of a profiled step's operator time per group, and the group's GFLOP/s where counted."""
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    seconds: dict[str, dict[str, float]] = {}  # group -> operator -> seconds per step
    for e in prof.events():
        ops = seconds.setdefault(_group(e), {})
        ops[e.name] = ops.get(e.name, 0.0) + e.self_cpu_time_total / 1e6 / steps
    total = sum(sum(ops.values()) for ops in seconds.values())
    for g, ops in sorted(seconds.items(), key=lambda kv: -sum(kv[1].values())):
        t = sum(ops.values())
        top = ", ".join(f"{name.removeprefix('aten::')} {100 * s / total:.0f}%"
                        for name, s in sorted(ops.items(), key=lambda kv: -kv[1])[:3])
        n = sum(v for op, v in flops.items() if COUNTED[g] in op) if g in COUNTED else 0
        rate = f"{n / t / 1e9:.1f} GFLOP/s on {n / 1e9:.1f} GFLOP counted; " if n else ""
        sec.add(f"mini MDC step, time in {g}", round(100 * t / total, 1), "% of op time",
                f"{1000 * t:.0f} ms; {rate}{top}")
    sec.add("mini MDC step, profiled operator time", round(1000 * total, 1), "ms per step",
            f"self CPU time of every operator (torch.profiler, {steps} steps); the timed step took "
            f"{1000 * step_seconds:.0f} ms")


def compiled_whole(sec: Section, ctx: Context, B: int) -> None:
    """The ``mini`` MDC step eager beside the same step compiled whole (the loop's ``--compile``: inductor, caption
    lengths cut to a multiple of 16 for both), two copies of one model, interleaved; quick: aot_eager."""
    torch.manual_seed(0)
    models = [mdc.create_model("mini", "mdc") for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    images, tokens = batch(models[0], B)
    tokens = trim_padding(tokens, models[0].tokenizer.eot_id, 16)
    eager, compiled = trainer(models[0], images, tokens), trainer(models[1], images, tokens,
                                                                  compile=ctx.pick({}, {"backend": "aot_eager"}))
    start = time.perf_counter()
    compiled()
    warm = time.perf_counter() - start
    times = interleaved({"eager": eager, "compiled": compiled}, rounds=ctx.pick(5, 1), warmup=1)
    backend = ctx.pick("inductor", "aot_eager: quick")
    sec.add(f"mini MDC step, compiled whole ({backend}) / eager speed", round(speedup(times, "compiled", "eager"), 3),
            "x", f"eager {1000 * median(times['eager']):.0f} ms, compiled {1000 * median(times['compiled']):.0f} ms "
                 f"a step of {B}; the first compiled step took {warm:.0f} s")


def run(ctx: Context) -> Section:
    sec = Section("flops", "Pretraining at the machine's limit (CPU, fp32): a step's GFLOP/s beside a large matmul's")
    B, size = ctx.pick(PRESET["batch_size"], 4), ctx.pick(2048, 256)
    a, b = torch.randn(size, size), torch.randn(size, size)
    steps, flops, models = {"matmul": lambda: torch.mm(a, b)}, {"matmul": 2 * size**3}, {}
    for name in MODELS:
        for obj in OBJECTIVES:
            torch.manual_seed(0)
            model = models[name, obj] = mdc.create_model(name, obj)
            images, tokens = batch(model, B)
            flops[name, obj] = count(model, images, tokens)
            steps[name, obj] = trainer(model, images, tokens)
    times = interleaved(steps, rounds=ctx.pick(5, 1), warmup=ctx.pick(1, 1))
    mm_rate = [flops["matmul"] / t for t in times["matmul"]]
    sec.add(f"matmul {size} x {size}, fp32", round(median(mm_rate) / 1e9, 1), "GFLOP/s",
            f"{1000 * median(times['matmul']):.0f} ms, torch.mm, {torch.get_num_threads()} torch threads")
    for key, per_op in flops.items():
        if key == "matmul":
            continue
        n, t = sum(per_op.values()), times[key]
        rate = [n / s for s in t]
        fraction = median([r / m for r, m in zip(rate, mm_rate)])
        label = f"{key[0]} {key[1].upper()}, batch {B}"
        sec.add(f"{label}: step", round(B / median(t), 1), "images/s",
                f"{1000 * median(t):.0f} ms/step, {n / B / 1e9:.3f} GFLOP/image counted")
        sec.add(f"{label}: achieved", round(median(rate) / 1e9, 1), "GFLOP/s")
        sec.add(f"{label}: fraction of the matmul's GFLOP/s", round(fraction, 3), "x",
                at_least=0.6 if key == ("mini", "mdc") else None)

    # one mini pretraining run's FLOPs per objective and caption style, and its time at the rate measured
    run_images = PRESET["steps"] * PRESET["batch_size"]
    for obj in OBJECTIVES:
        model, rate = models["mini", obj], median([sum(flops["mini", obj].values()) / s for s in times["mini", obj]])
        for style in STYLES:
            n = sum((flops["mini", obj] if style == "descriptive" else count(model, *batch(model, B, style))).values())
            total = n / B * run_images
            sec.add(f"mini {obj.upper()} pretraining run, {style} captions", round(total / 1e12, 1), "TFLOP",
                    f"{n / B / 1e9:.3f} GFLOP/image x {PRESET['steps']} steps x {PRESET['batch_size']}; "
                    f"{total / rate / 60:.0f} min at this step's measured rate")
    compiled_whole(sec, ctx, B)
    where_time_goes(sec, steps["mini", "mdc"], flops["mini", "mdc"], ctx.pick(2, 1), median(times["mini", "mdc"]))
    sec.notes.append(f"Counted FLOPs: matrix products, convolutions and attention of one forward and backward "
                     f"(FlopCounterMode; SDPA's CPU kernel at the counter's SDPA formula); elementwise ops, "
                     f"reductions and the optimizer are not counted. Steps: the training loop's code in fp32 on "
                     f"one in-memory batch of descriptive captions (loading excluded), the same masks at every "
                     f"call; fraction = median over {ctx.pick(5, 1)} interleaved rounds of the step's GFLOP/s over "
                     f"the same round's matmul's. Run FLOPs: reproduce/presets/mini.json, alt captions counted on "
                     f"a batch of alt captions.")
    return sec
