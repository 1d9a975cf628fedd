"""The runs of the GPU first contact (``benchmarks/gpu_first_contact.sh``), timed, each within a budget.

``python -m benchmarks.gpu_runs STEP --work DIR --json FILE [--budget SECONDS]``; STEP is one of

- ``torchrun``: ``python -m mdc.train`` under ``torch.distributed.run --standalone --nproc_per_node 1``
  (NCCL on CUDA) on synthetic shards written by ``python -m mdc.world.scenes``; the run is killed once
  a checkpoint past the middle of its steps exists, then continued with ``--resume`` to its last step.
- ``graphs``: the same, its steps compiled whole and replayed as CUDA graphs (``--compile --compile-mode
  reduce-overhead``): the training loop's graphs on a stream of bucketed caption lengths, through a kill and a
  resume, its images/s and last loss beside the eager ``torchrun`` step's when that ran in the same ``--work``
  (one process: a one-GPU machine cannot run DDP on CUDA, so graphs inside DDP need two GPUs).
- ``twins``: the torchrun step and the graphs step again (run folders of their own), each beside an uninterrupted
  run of its command: the per-step loss differences before the kill (how far two runs of one command differ) and
  after it (whether the resume landed on the run's own stream).
- ``mini-train``: the reference run's ``pretrain/mdc-descriptive-s0`` of the ``mini`` profile (its
  data, ``python -m mdc.world.scenes``, then ``python -m mdc.train --model mini --preset
  reproduce/presets/mini.json``, seed 0), each timed beside its record's seconds in
  ``reproduce/records/mini/``. A run stopped by the budget reports its steps and their rate.
- ``mini-eval``: the synthetic evaluation sets and the linear probe of that run's checkpoint (or of the
  committed seed-0 weights in ``reproduce/weights/mini/``, if the run left none) through the
  :mod:`mdc.eval.probe` API as the probe notebook calls it, beside their records.

Each step adds its figures under its name to the JSON file (read, updated, rewritten) and prints them.
The records' times are wall-clock seconds of the notebook runs on a 2-core CPU (a kernel start and
the notebook's plots included); on CUDA the training runs in bf16 autocast (``precision auto``) with
more loader workers, so the ratio is a time beside a time, not the same arithmetic.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

from mdc.base.processes import kill_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "reproduce", "records", "mini")
PRESET = os.path.join("reproduce", "presets", "mini.json")
MINI_DATA = dict(num=143360, style="descriptive", seed=0, image_size=64, shard_size=1000)  # data/descriptive
TORCHRUN_STEPS, TORCHRUN_SAVE = 300, 50
MINI_STEPS = 2240  # reproduce/presets/mini.json


def record(name: str, records: str = RECORDS) -> dict | None:
    """The committed CPU record ``name`` (e.g. ``pretrain/mdc-descriptive-s0``): its seconds, CPU seconds and
    device; None if absent."""
    path = os.path.join(records, name + ".json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        r = json.load(f)
    return {"run": name, "seconds": r.get("seconds"), "cpu_seconds": r.get("cpu_seconds"), "device": r.get("device")}


def beside(seconds: float, name: str, records: str = RECORDS) -> dict:
    """``seconds`` here beside record ``name``'s, with the ratio (how many times faster here)."""
    r = record(name, records)
    ratio = round(r["seconds"] / seconds, 2) if r and r.get("seconds") and seconds > 0 else None
    return {"seconds": round(seconds, 1), "record": r, "record_over_here": ratio}


def update(path: str, key: str, value: dict) -> None:
    """Set ``key`` in the JSON object at ``path`` (created if absent) and print it."""
    data = {}
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
    data[key] = value
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"{key}: {json.dumps(value)}", flush=True)


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc``, its process group and every process below it (torchrun's workers, loader workers), as a crash
    would: SIGKILL, no chance to save."""
    kill_tree(proc.pid)
    proc.wait()


def run(cmd: list[str], budget: float, until=None) -> dict:
    """Run ``cmd`` (its output into this process's) for at most ``budget`` seconds; ``until()`` true ends it
    early, as a kill. Returns its exit status, seconds and how it ended."""
    print("+ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    ended = "exited"
    while proc.poll() is None:
        if time.perf_counter() - start > budget:
            ended = "budget"
        elif until is not None and until():
            ended = "killed"
        if ended != "exited":
            _kill(proc)
            break
        time.sleep(0.2)
    return {"rc": proc.returncode, "seconds": round(time.perf_counter() - start, 1), "ended": ended}


def latest_step(run_dir: str) -> int:
    """The step of a run folder's newest complete checkpoint (0 if none)."""
    pointer = os.path.join(run_dir, "checkpoints", "latest.json")
    if not os.path.isfile(pointer):
        return 0
    try:
        with open(pointer) as f:
            return int(json.load(f)["step"])
    except (OSError, ValueError, KeyError):
        return 0  # being replaced right now


def metrics(run_dir: str) -> list[dict]:
    """The rows of a run's metrics.jsonl (one per logged step)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def scenes(out: str, num: int, style: str, seed: int = 0, image_size: int = 64, shard_size: int = 1000) -> list[str]:
    """The command that writes synthetic shards, one writer per core."""
    return [sys.executable, "-m", "mdc.world.scenes", "--out", out, "--num", str(num), "--style", style,
            "--seed", str(seed), "--image-size", str(image_size), "--shard-size", str(shard_size),
            "--workers", str(max(1, min(16, os.cpu_count() or 1)))]


GRAPHS = ("--compile", "--compile-mode", "reduce-overhead")  # the step compiled whole, replayed as CUDA graphs


def torchrun_command(work: str, run_dir: str = "torchrun-run", extra: tuple[str, ...] = ()) -> list[str]:
    """``python -m mdc.train`` under torchrun, one process: mini on the shards in ``work/torchrun-data``, into
    ``work/run_dir``, with ``extra`` flags."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            "-m", "mdc.train", "--model", "mini", "--objective", "mdc", "--train-data",
            os.path.join(work, "torchrun-data"), "--output-dir", os.path.join(work, run_dir),
            "--steps", str(TORCHRUN_STEPS), "--batch-size", "64", "--lr", "1e-3",
            "--warmup-steps", str(TORCHRUN_STEPS // 10), "--save-every", str(TORCHRUN_SAVE), "--workers", "2",
            "--no-progress", "--resume", *extra]


def _kill_and_resume(work: str, budget: float, run_dir: str, extra: tuple[str, ...] = ()) -> dict:
    """Shards (unless an earlier step wrote them), a torchrun run killed after its checkpoint past the middle,
    and its resume to the end."""
    deadline = time.perf_counter() + budget
    shards = os.path.join(work, "torchrun-data")
    written = os.path.isdir(shards) and any(f.endswith(".tar") for f in os.listdir(shards))
    data = {"reused": shards} if written else run(scenes(shards, TORCHRUN_STEPS * 64, "alt"), budget)
    folder, half = os.path.join(work, run_dir), TORCHRUN_STEPS // 2
    command = torchrun_command(work, run_dir, extra)
    first = run(command, deadline - time.perf_counter(), until=lambda: latest_step(folder) > half)
    first["checkpoint_step"] = latest_step(folder)
    second = run(command, deadline - time.perf_counter())
    rows = metrics(folder)
    second["checkpoint_step"] = latest_step(folder)
    ok = (first["ended"] == "killed" and second["rc"] == 0 and second["checkpoint_step"] == TORCHRUN_STEPS
          and bool(rows) and rows[-1].get("step") == TORCHRUN_STEPS)
    return {"ok": ok, "data": data, "first_leg": first, "resumed": second,
            "final_loss": rows[-1].get("loss") if rows else None, "steps": TORCHRUN_STEPS,
            "images_per_s": steady_speed(rows)}


def steady_speed(rows: list[dict]) -> float | None:
    """A run's median images/s over its logged steps past the first tenth (compiling and warming up)."""
    speeds = sorted(r["images_per_s"] for r in rows[len(rows) // 10:] if r.get("images_per_s"))
    return round(speeds[len(speeds) // 2], 1) if speeds else None


def step_torchrun(work: str, budget: float) -> dict:
    """Shards, a torchrun run killed after its checkpoint past the middle, and its resume to the end."""
    return _kill_and_resume(work, budget, "torchrun-run")


def step_graphs(work: str, budget: float) -> dict:
    """The torchrun step with CUDA graphs, beside the eager run of the same ``work`` folder if there is one."""
    out = _kill_and_resume(work, budget, "graphs-run", GRAPHS)
    eager = metrics(os.path.join(work, "torchrun-run"))
    if eager and eager[-1].get("step") == TORCHRUN_STEPS:
        speed = steady_speed(eager)
        out["eager"] = {"images_per_s": speed, "final_loss": eager[-1].get("loss"),
                        "graphs_over_eager": round(out["images_per_s"] / speed, 2)
                        if speed and out["images_per_s"] else None}
    return out


def loss_differences(a: list[dict], b: list[dict], split: int) -> dict:
    """|loss| differences of two runs' metrics rows, step by step, up to ``split`` (the resume's checkpoint) and past
    it: {"before", "after": {"steps", "mean", "max", "equal"} or None}."""
    la, lb = ({r["step"]: r["loss"] for r in rows if r.get("loss") is not None} for rows in (a, b))
    out = {}
    for part, keep in (("before", lambda s: s <= split), ("after", lambda s: s > split)):
        d = [abs(la[s] - lb[s]) for s in sorted(la) if s in lb and keep(s)]
        out[part] = {"steps": len(d), "mean": sum(d) / len(d), "max": max(d), "equal": sum(x == 0 for x in d)} \
            if d else None
    return out


def step_twins(work: str, budget: float) -> dict:
    """The torchrun and graphs steps in run folders of their own, each beside an uninterrupted run of the same
    command. The eager resume should equal its twin bit for bit; a graphed run is not bitwise repeatable, so its
    differences after the kill are read against those before it (a resume onto another stream differs by a step's
    loss noise, about 0.15 here)."""
    deadline, out = time.perf_counter() + budget, {}
    for name, extra, share in (("eager", (), 0.35), ("graphs", GRAPHS, 1.0)):
        part = share * (deadline - time.perf_counter())
        legs = _kill_and_resume(work, 0.6 * part, f"twins-{name}", extra)
        whole = run(torchrun_command(work, f"twins-{name}-whole", extra), 0.4 * part)
        rows = [metrics(os.path.join(work, f"twins-{name}{tail}")) for tail in ("", "-whole")]
        at = legs["first_leg"]["checkpoint_step"]  # the checkpoint the resume started from
        out[name] = {"ok": legs["ok"] and whole["rc"] == 0, "resumed_at": at, "legs": legs, "uninterrupted": whole,
                     "differences": loss_differences(*rows, at)}
    return {"ok": all(v["ok"] for v in out.values()), **out}


def mini_train_command(work: str) -> list[str]:
    """The reference run pretrain/mdc-descriptive-s0 (its preset, seed and checkpoints) on ``work``'s shards;
    4 loader workers (the CPU record: 1)."""
    return [sys.executable, "-m", "mdc.train", "--model", "mini", "--objective", "mdc", "--preset", PRESET,
            "--train-data", os.path.join(work, "mini-data"), "--output-dir", os.path.join(work, "mini-run"),
            "--seed", "0", "--workers", "4", "--save-every", "224", "--keep-last", "2", "--no-progress"]


def step_mini_train(work: str, budget: float) -> dict:
    """The mini profile's descriptive shards and its MDC pretraining run, each beside its record."""
    deadline = time.perf_counter() + budget
    d = MINI_DATA
    data = run(scenes(os.path.join(work, "mini-data"), d["num"], d["style"], d["seed"], d["image_size"],
                      d["shard_size"]), budget)
    out = {"data": {**data, **beside(data["seconds"], "data/descriptive")}}
    if data["rc"] != 0:
        return {**out, "ok": False}
    train = run(mini_train_command(work), deadline - time.perf_counter())
    rows = metrics(os.path.join(work, "mini-run"))
    steps = rows[-1]["step"] if rows else 0
    whole = train["seconds"] * MINI_STEPS / steps if 0 < steps < MINI_STEPS else train["seconds"]
    out["train"] = {"rc": train["rc"], "ended": train["ended"], "run_seconds": train["seconds"], "steps_done": steps,
                    "final_loss": rows[-1].get("loss") if rows else None,
                    **beside(whole, "pretrain/mdc-descriptive-s0")}  # its seconds: of all 2,240 steps
    if 0 < steps < MINI_STEPS:
        out["train"]["note"] = f"stopped at step {steps}: seconds extrapolated to {MINI_STEPS} steps at its rate"
    return {**out, "ok": train["rc"] == 0 and steps == MINI_STEPS}


def _probe(checkpoint: str, evalsets: str, work: str) -> dict:
    """The probe notebook's work on CUDA (where there is one): every synthetic task, the random-init floor,
    10 epochs."""
    import torch

    import mdc
    from mdc.eval.probe import ProbeConfig, dataset_fns, probe_datasets, probe_random_init, synthetic_roots

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = mdc.load(checkpoint, map_location=device).to(device).eval()
    preprocess = mdc.image_transform(model)
    roots = synthetic_roots(evalsets)
    cfg = ProbeConfig(batch_size=64, epochs=10, lr=0.1, weight_decay=0.0, seed=0)
    kw = dict(cache_dir=os.path.join(work, "probe-features"), transform_key=f"eval{model.config.image_size}",
              batch_size=256, device=device)
    results = probe_datasets(model, dataset_fns(roots, preprocess), cfg, **kw)
    floor = probe_random_init(model, roots, preprocess, cfg, seed=0, shared_cache=os.path.join(work, "random-init"),
                              **kw)
    return {"average_top1": results["average"], "random_init_average_top1": floor["average"]}


def step_mini_eval(work: str, budget: float) -> dict:
    """The evaluation sets and the linear probe of the mini run (or of the committed weights)."""
    from mdc.base import checkpoint as ckpt
    from mdc.world.evalsets import write_evalsets

    start = time.perf_counter()
    evalsets = os.path.join(work, "evalsets")
    write_evalsets(evalsets, seed=1, image_size=64, n_probe_train=3000, n_probe_test=1000, n_items=300,
                   n_caption_train=1000)
    out = {"evalsets": beside(time.perf_counter() - start, "data/evalsets")}
    print(f"mini-eval: evaluation sets in {out['evalsets']['seconds']} s", flush=True)
    if time.perf_counter() - start > budget:
        return {**out, "ok": False, "error": f"the evaluation sets alone took more than the step's {budget:.0f} s"}
    checkpoint = ckpt.latest(os.path.join(work, "mini-run"))
    if checkpoint:
        source = f"this session's mini run, {os.path.basename(checkpoint)}"
    else:
        checkpoint = os.path.join(ROOT, "reproduce", "weights", "mini", "pretrain", "mdc-descriptive-s0")
        source = "the committed seed-0 weights (the mini run left no checkpoint)"
    start = time.perf_counter()
    probe = _probe(checkpoint, evalsets, work)
    out["probe"] = {**beside(time.perf_counter() - start, "probe/mdc-descriptive-s0"), **probe, "checkpoint": source}
    return {**out, "ok": True}


STEPS = {"torchrun": step_torchrun, "graphs": step_graphs, "twins": step_twins, "mini-train": step_mini_train,
         "mini-eval": step_mini_eval}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_runs", description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=list(STEPS))
    p.add_argument("--work", required=True, help="scratch folder: shards, run folders, caches")
    p.add_argument("--json", required=True, help="the JSON file the step's figures are added to")
    p.add_argument("--budget", type=float, default=120.0, help="seconds the step may take")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    start = time.perf_counter()
    try:
        result = STEPS[args.step](args.work, args.budget)
    except Exception as exn:  # the step's failure is its result: the next steps still run
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exn).__name__}: {exn}"}
    update(args.json, args.step, {**result, "step_seconds": round(time.perf_counter() - start, 1)})
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
