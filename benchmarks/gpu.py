"""GPU: what the first GPU session fills in with one command, ``python -m benchmarks gpu``.

- Training, ViT-B/32 MDC, ARC and CLIP in turn at the paper's micro-batch (128 per GPU, Sec. 4.1),
  through the training loop's own code (:class:`mdc.train.LossModule`, :func:`mdc.train.accumulate`, bf16 autocast as
  ``precision="auto"`` gives on CUDA, :func:`mdc.base.optim.optimizer_step`): images/s, achieved TFLOP/s,
  model FLOPs utilisation (MFU), peak memory, and the same step compiled whole (the loop's ``--compile``:
  ``fullgraph``) and, on CUDA, replayed as CUDA graphs (``--compile-mode reduce-overhead``), each with its
  speed-up over eager, the host's milliseconds to issue a step, and its kernels and GPU-busy milliseconds a
  step (the eager step's too); each row is named
  after its objective (``MDC training, batch 128``, ``ARC model FLOPs utilisation``, ...).
- Sampling: MDC greedy unmasking (20 tokens) and ARC beam search (beam 6, 20 tokens), captions/s.
- Scoring: every scorer's throughput (ELBO with 1024 samples, heuristic, ARC exact, CLIP cosine) in
  fp32 (the scorers' default) and bf16 (``precision="bf16"``), and the bf16 - fp32 score error.

FLOPs of one training step (forward + backward) are counted with the meter of :mod:`mdc.base.flops`
(``torch.utils.flop_counter.FlopCounterMode``: matrix products and attention; elementwise work is
not counted, as in the usual MFU; the paper profile's dry run, ``reproduce/cost/paper_cost.py``, costs it with
the same meter). MFU = counted FLOPs x steps/s / the GPU's dense bf16 peak, looked up by device name in
``PEAK_BF16``; an unknown GPU gets no MFU. The models have random weights: the score errors say
how far bf16 moves a score, not how often it flips a benchmark's decision.

Without CUDA the section is skipped with its reason; ``measure(ctx, torch.device("cpu"))`` runs
the same code on the CPU (the tests do, ``quick``: depth 1, small batches, the ``aot_eager``
compiler instead of inductor's minutes of C++).
"""
from __future__ import annotations

import functools
import os
import time

import torch

import mdc
from mdc.base import optim
from mdc.base.flops import Meter
from mdc.train import LossModule, accumulate
from mdc.world.scenes import scene_captions

from benchmarks.common import Context, Section, batch, interleaved, median, small, speedup, sync

#: Dense bf16 tensor-core peak in FLOP/s, by a substring of torch.cuda.get_device_name (first match wins).
PEAK_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("GH200", 989e12),
             ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("RTX 4090", 165e12))
PAPER_MICRO_BATCH = 128  # per GPU, ViT-B (paper Sec. 4.1)
OBJECTIVES = ("mdc", "arc", "clip")  # the training rows, in this order
PARTS = ("training", "sampling", "scoring")  # MDC_GPU_PARTS picks some (default all), run in this order
GiB = 2**30


def peak_flops(device_name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16 if key in device_name), None)


def skip_reason() -> str | None:
    """Why the GPU section cannot run here, or None."""
    if not torch.cuda.is_available():
        return (f"no CUDA device (torch {torch.__version__}, built "
                f"{'with CUDA ' + torch.version.cuda if torch.version.cuda else 'without CUDA'}); "
                f"run `python -m benchmarks gpu` on a GPU machine")
    return None


def _trainer(model, device: torch.device, compile: dict | None = None):
    """One optimizer step of the training loop's code on a fixed batch: bf16 autocast (precision "auto"
    on CUDA, "bf16" elsewhere), fused AdamW, fp32 master weights; ``compile``: the loop's --compile (the loss
    compiled whole, ``fullgraph``) with these ``torch.compile`` arguments (``mode="reduce-overhead"``: CUDA graphs)."""
    net = LossModule(model)
    graphs = (compile or {}).get("mode") == "reduce-overhead"
    if compile is not None:
        net = torch.compile(net, fullgraph=True, **compile)
    opt = optim.make_optimizer(model, 5e-4, 0.1)
    sched = optim.make_scheduler(opt, 10, 10**6)
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16)

    def step(images, tokens):
        loss = accumulate(net, model, [(images, tokens)], autocast=autocast, graphs=graphs)
        optim.optimizer_step(model, opt, sched)
        return loss

    return step


def _count_flops(model, images, tokens, device: torch.device) -> float:
    """FLOPs of one forward and backward of ``model``'s loss in bf16, counted by :mod:`mdc.base.flops`'s meter."""
    with Meter() as meter:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model.loss(images, tokens)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return meter.flops


def _eager(sec: Section, ctx: Context, device: torch.device, name: str, objective: str):
    """One objective's eager training step: its rows (images/s, TFLOP/s, MFU, peak memory); returns the
    step, its batch and the FLOPs counted."""
    torch.manual_seed(0)
    model = mdc.create_model("vit-b-32", objective, **small("vit-b-32", ctx.quick)).to(device)
    B = ctx.pick(int(os.environ.get("MDC_GPU_BATCH", PAPER_MICRO_BATCH)), 2)
    images, tokens = batch(model, B, device)
    eager = _trainer(model, device)
    eager(images, tokens)  # optimizer state allocated before counting
    flops = _count_flops(model, images, tokens, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = median(interleaved({"step": lambda: eager(images, tokens)}, rounds=ctx.pick(10, 1), warmup=ctx.pick(3, 1),
                           device=device)["step"])
    peak, label = peak_flops(name), objective.upper()
    depth = " (depth 1: quick)" if ctx.quick else ""
    sec.add(f"{label} training, batch {B}{depth}", round(B / t, 1), "images/s",
            f"{flops / 1e12:.2f} TFLOP per step counted, {1000 * t:.0f} ms/step")
    sec.add(f"{label} achieved", round(flops / t / 1e12, 2), "TFLOP/s")
    sec.add(f"{label} model FLOPs utilisation", round(flops / t / peak, 3) if peak else None, "of peak",
            f"{name}: peak {peak / 1e12:.0f} TFLOP/s dense bf16; the dry run's is reproduce/cost/paper_cost.py:MFU"
            if peak else f"no peak known for {name!r}")
    if device.type == "cuda":
        sec.add(f"{label} peak memory, training", round(torch.cuda.max_memory_allocated(device) / GiB, 2), "GiB",
                "weights, gradients, AdamW state and activations; compare the dry run's estimate")
    return eager, images, tokens


def _variants(ctx: Context, device: torch.device) -> dict[str, dict]:
    """The compiled steps beside eager, by name: torch.compile's arguments (quick: aot_eager)."""
    if ctx.quick:
        return {"compiled whole (aot_eager: quick)": {"backend": "aot_eager"}}
    out = {"compiled whole": {}}
    if device.type == "cuda":
        out["compiled whole, CUDA graphs"] = {"mode": "reduce-overhead"}
    return out


def _compiled(sec: Section, ctx: Context, device: torch.device, objective: str, eager, images, tokens) -> None:
    """The loop's --compile and its CUDA-graph mode: a copy of the model each, steps interleaved with eager's; per
    variant the images/s, the speed-up, the host's milliseconds to issue a step and, on CUDA, its kernels and
    GPU-busy milliseconds."""
    steps = {"eager": lambda: eager(images, tokens)}
    for name, kw in _variants(ctx, device).items():
        torch.manual_seed(0)
        twin = mdc.create_model("vit-b-32", objective, **small("vit-b-32", ctx.quick)).to(device)
        step = _trainer(twin, device, kw)
        step(images, tokens)  # compiles (CUDA graphs: warms up and records on the next calls)
        steps[name] = functools.partial(step, images, tokens)
    times = interleaved(steps, rounds=ctx.pick(10, 1), warmup=ctx.pick(3, 1), device=device)
    label, B = objective.upper(), len(images)
    for name, step in steps.items():
        if name != "eager":
            sec.add(f"{label} training, {name}", round(B / median(times[name]), 1), "images/s",
                    f"{1000 * median(times[name]):.0f} ms/step")
            sec.add(f"{label} {name} speed-up", round(speedup(times, name, "eager"), 3), "x",
                    f"steps interleaved: eager {1000 * median(times['eager']):.0f} ms")
        host, kernels, busy = _host_and_kernels(step, device)
        sec.add(f"{label} {name}: host ms to issue a step", round(1000 * host, 2), "ms",
                "the Python and dispatch time before the device has the step (a host-bound step: close to a step)")
        if kernels is not None:
            sec.add(f"{label} {name}: kernels a step", kernels, "kernels", f"GPU busy {1000 * busy:.1f} ms a step")


def _host_and_kernels(step, device: torch.device, n: int = 3) -> tuple[float, int | None, float | None]:
    """Seconds the host takes to issue one step (no wait for the device), and on CUDA the kernels and the
    GPU-busy seconds per step (torch.profiler's device events)."""
    sync(device)
    host = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)
        sync(device)
    if device.type != "cuda":
        return median(host), None, None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        sync(device)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return median(host), round(len(events) / n), sum(e.device_time_total for e in events) / 1e6 / n


def _profile(step, images, tokens, device: torch.device, objective: str) -> None:
    """Where one eager training step's time goes: torch.profiler's operators by their own GPU time, printed (a
    step far below the card's peak shows whether the GPU waits on the host)."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step(images, tokens)
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"  gpu: {objective.upper()} profile, 3 eager steps, by {key}:\n"
          + prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60), flush=True)


def _print_rows(sec: Section, first: int) -> None:
    for row in sec.rows[first:]:
        print(f"  gpu: {row.name}: {row.value} {row.unit}  {row.note}", flush=True)


def _training(sec: Section, ctx: Context, device: torch.device, name: str) -> None:
    """MDC, ARC and CLIP in turn, eager then compiled; the eager rows are printed as soon as they are measured and
    the compiled ones once all are, so that a run stopped by a time limit while compiling still leaves the eager
    figures in its log. ``MDC_GPU_OBJECTIVES`` (e.g. ``arc,clip``) picks objectives, ``MDC_GPU_COMPILE=0`` leaves
    out the compiled steps, ``MDC_GPU_PROFILE=1`` prints a profile of each objective's eager step and
    ``MDC_GPU_BATCH`` sets the batch (default the paper's 128: a larger one shows whether the step waits on the
    host)."""
    objectives = os.environ.get("MDC_GPU_OBJECTIVES", ",".join(OBJECTIVES)).split(",")
    for objective in objectives:
        first = len(sec.rows)
        eager, images, tokens = _eager(sec, ctx, device, name, objective)
        _print_rows(sec, first)  # before compiling (minutes): a step stopped by its limit keeps the eager figures
        if os.environ.get("MDC_GPU_PROFILE") == "1":
            _profile(eager, images, tokens, device, objective)
        if os.environ.get("MDC_GPU_COMPILE", "1") != "0":
            first = len(sec.rows)
            _compiled(sec, ctx, device, objective, eager, images, tokens)
            _print_rows(sec, first)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _models(ctx: Context, device: torch.device) -> dict:
    torch.manual_seed(0)
    return {obj: mdc.create_model("vit-b-32", obj, **small("vit-b-32", ctx.quick)).to(device).eval()
            for obj in ("mdc", "arc", "clip")}


def _sampling(sec: Section, ctx: Context, device: torch.device, models: dict) -> None:
    n, length = ctx.pick(64, 2), 20
    images, _ = batch(models["mdc"], n, device)
    calls = {"mdc": lambda: mdc.generate(models["mdc"], images, length, return_tokens=True),
             "arc": lambda: mdc.generate(models["arc"], images, length, beam_size=6, return_tokens=True)}
    times = interleaved(calls, rounds=ctx.pick(3, 1), device=device)
    sec.add(f"MDC greedy sampling, length {length}, batch {n}", round(n / median(times["mdc"]), 1), "captions/s",
            "precision auto (bf16 on CUDA)")
    sec.add(f"ARC beam search, beam 6, up to {length} tokens, batch {n}", round(n / median(times["arc"]), 1),
            "captions/s")
    same = mdc.generate(models["mdc"], images, length, return_tokens=True, precision="fp32")
    agree = (same == mdc.generate(models["mdc"], images, length, return_tokens=True, precision="bf16")).float().mean()
    sec.add("MDC tokens the same in bf16 and fp32", round(float(agree), 3), "of tokens", "random weights")


def _scoring(sec: Section, ctx: Context, device: torch.device, models: dict) -> None:
    n, S = ctx.pick(64, 2), ctx.pick(1024, 8)
    images, _ = batch(models["mdc"], n, device)
    captions = scene_captions(n)
    scorers = {"ELBO": ("mdc", dict(method="elbo", num_samples=S)), "heuristic": ("mdc", dict(method="heuristic")),
               "exact (ARC)": ("arc", dict(method="exact")), "cosine (CLIP)": ("clip", dict(method="cosine"))}
    for label, (objective, kw) in scorers.items():
        model, per = models[objective], S if label == "ELBO" else 1
        calls = {p: functools.partial(mdc.score, model, images, captions, precision=p, **kw) for p in ("fp32", "bf16")}
        times = interleaved(calls, rounds=ctx.pick(3, 1), device=device)
        for p in calls:
            sec.add(f"{label}{f', {S} samples' if per > 1 else ''}, {p}", round(n * per / median(times[p])),
                    "captions x samples/s" if per > 1 else "captions/s")
        error = (calls["bf16"]() - calls["fp32"]()).abs()
        sec.add(f"{label}: |bf16 - fp32| score, max (mean)", round(float(error.max()), 4), "nats" if
                objective != "clip" else "cosine", f"mean {float(error.mean()):.4f}; random weights")


def measure(ctx: Context, device: torch.device) -> Section:
    """The section's figures on ``device`` (tests run it on the CPU); ``MDC_GPU_PARTS`` (e.g. ``training``) picks
    the parts of a second try."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    parts = os.environ.get("MDC_GPU_PARTS", ",".join(PARTS)).split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"MDC_GPU_PARTS names {', '.join(map(repr, unknown))}; the parts are {', '.join(PARTS)}")
    sec = Section("gpu", f"GPU ({name}): vit-b-32 MDC, ARC and CLIP training in bf16, sampling, scoring")
    if "training" in parts:
        _training(sec, ctx, device, name)
    later = [part for key, part in (("sampling", _sampling), ("scoring", _scoring)) if key in parts]
    models = _models(ctx, device) if later else {}
    for part in later:
        first = len(sec.rows)
        part(sec, ctx, device, models)
        _print_rows(sec, first)
    return sec


def run(ctx: Context) -> Section:
    reason = skip_reason()
    if reason:
        sec = Section("gpu", "GPU")
        sec.add("GPU section", "skipped: no CUDA", note=reason)
        return sec
    return measure(ctx, torch.device("cuda"))
