"""CPU training throughput of the `tiny` model per objective, and the cost of a checkpoint.

    python benchmarks/bench_train.py [--batch-size 32] [--steps 10] [--objectives mdc arc clip] [--threads N]

Times full optimizer steps (forward, backward, AdamW) on one in-memory batch of synthetic
scene captions, so data loading is excluded, and the atomic checkpoint write of
:mod:`mdc.checkpoint` (weights, optimizer, schedule, RNG states). Prints one JSON line per
objective: images/s, ms per step, ms per checkpoint and that cost as a % of one step.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

import mdc
from mdc import checkpoint, optim
from mdc.data.scenes import caption, sample_scene, stream_rng


def scene_batch(model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [n, 3, S, S] and the tokens [n, L] of n synthetic alt-text captions."""
    captions = [caption(sample_scene(stream_rng(0, 0, i)), "alt", stream_rng(0, 1, i)) for i in range(n)]
    size = model.config.image_size
    return torch.randn(n, 3, size, size), model.tokenizer(captions)


def bench(objective: str, batch_size: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = mdc.create_model("tiny", objective)
    opt = optim.make_optimizer(model, 5e-4, 0.1)
    sched = optim.make_scheduler(opt, 0, 10_000)
    images, tokens = scene_batch(model, batch_size)

    def step():
        loss = model.loss(images, tokens)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up (allocator, AdamW state)
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    step_s = (time.perf_counter() - start) / steps

    with tempfile.TemporaryDirectory() as run_dir:
        times = []
        for i in range(3):
            start = time.perf_counter()
            state = {"step": i, "world_size": 1, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                     "rng": [checkpoint.rng_state()], "data": [{}]}
            checkpoint.save(run_dir, i, model, state)
            times.append(time.perf_counter() - start)
    ckpt_s = sorted(times)[1]  # median of 3
    return {"objective": objective, "model": "tiny", "batch_size": batch_size, "threads": torch.get_num_threads(),
            "images_per_s": round(batch_size / step_s, 1), "ms_per_step": round(1000 * step_s, 1),
            "ms_per_checkpoint": round(1000 * ckpt_s, 1), "checkpoint_pct_of_step": round(100 * ckpt_s / step_s, 1),
            "params": model.num_params()}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="timed steps per objective")
    p.add_argument("--objectives", nargs="+", default=["mdc", "arc", "clip"])
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for objective in args.objectives:
        rows.append(bench(objective, args.batch_size, args.steps))
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
