"""GPU: vit-b-32 MDC training throughput and model FLOPs utilisation in bf16, sampler and ELBO throughput.

FLOPs of one training step (forward + backward) are counted with
``torch.utils.flop_counter.FlopCounterMode`` (matrix products and attention; elementwise work is
not counted, as in the usual MFU). MFU = counted FLOPs x steps/s / the GPU's dense bf16 peak,
looked up by device name in ``PEAK_BF16``; an unknown GPU gets no MFU.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

import mdc
from mdc import optim

from benchmarks.common import Context, Section, batch, interleaved, median, scene_captions, small

#: Dense bf16 tensor-core peak in FLOP/s, by a substring of torch.cuda.get_device_name (first match wins).
PEAK_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("GH200", 989e12),
             ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("RTX 4090", 165e12))


def peak_flops(device_name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16 if key in device_name), None)


def measure(ctx: Context, device: torch.device) -> Section:
    """The section's figures on ``device`` (tests run it on the CPU)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sec = Section("gpu", f"GPU ({name}): vit-b-32 MDC in bf16")
    torch.manual_seed(0)
    model = mdc.create_model("vit-b-32", "mdc", **small("vit-b-32", ctx.quick)).to(device)
    B = ctx.pick(128, 2)
    images, tokens = batch(model, B, device)
    opt = optim.make_optimizer(model, 5e-4, 0.1)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model.loss(images, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # optimizer state allocated before counting
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model.loss(images, tokens)
        loss.backward()
    opt.zero_grad(set_to_none=True)
    flops = counter.get_total_flops()
    t = median(interleaved({"step": step}, rounds=ctx.pick(10, 1), warmup=ctx.pick(3, 1), device=device)["step"])
    peak = peak_flops(name)
    sec.add(f"training, batch {B}{' (depth 1: quick)' if ctx.quick else ''}", round(B / t, 1), "images/s",
            f"{flops / 1e12:.2f} TFLOP per step counted")
    sec.add("achieved", round(flops / t / 1e12, 2), "TFLOP/s")
    sec.add("model FLOPs utilisation", round(flops / t / peak, 3) if peak else None, "of peak",
            f"peak {peak / 1e12:.0f} TFLOP/s dense bf16" if peak else f"no peak known for {name!r}")

    model.eval()
    n, S = ctx.pick(64, 2), ctx.pick(1024, 8)
    captions = scene_captions(n)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        times = interleaved({"generate": lambda: mdc.generate(model, images[:n], 20, return_tokens=True),
                             "elbo": lambda: mdc.score(model, images[:n], captions, "elbo", num_samples=S)},
                            rounds=ctx.pick(3, 1), device=device)
    sec.add(f"MDC greedy sampling, length 20, batch {n}", round(n / median(times["generate"]), 1), "captions/s")
    sec.add(f"ELBO, {S} samples per caption", round(n * S / median(times["elbo"])), "caption x samples/s")
    return sec


def run(ctx: Context) -> Section:
    if not torch.cuda.is_available():
        sec = Section("gpu", "GPU")
        sec.add("GPU section", "skipped: no CUDA")
        return sec
    return measure(ctx, torch.device("cuda"))
