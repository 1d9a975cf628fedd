"""Clusters: a pretraining run as a torchrun command, and the whole graph as SLURM jobs chained by
``afterok`` dependencies (``python -m reproduce --slurm DIR``)."""
from __future__ import annotations

import os
import shlex
import shutil
import sys

from reproduce.graph import ROOT, Run, order, resolve, run_dir


def torchrun() -> str:
    """The torchrun of this interpreter's environment (beside it), else the one on PATH, else the bare name."""
    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return beside if os.path.isfile(beside) else shutil.which("torchrun") or "torchrun"


def run_command(run: Run, out: str, profile: str, step: str | None = None) -> str:
    """``python -m reproduce ... --run NAME``, this project's interpreter, for one run of ``out``'s graph (the
    paper profile's ``--step`` given, so that the run is keyed as it was planned)."""
    return (f"{shlex.quote(os.path.realpath(sys.executable))} -m reproduce --profile {profile} "
            f"--out {shlex.quote(os.path.dirname(out) or '.')} " + (f"--step {step} " if step else "")
            + f"--run {shlex.quote(run.name)}")


def torchrun_command(run: Run, out: str, gpus: int, nodes: int = 1) -> str:
    """The pretraining run as ``torchrun ... -m mdc.train`` flags (paper scale: real shards given)."""
    p = resolve(run.params, out)
    flags = {"train-data": p["train_data"], "output-dir": p.get("output_dir") or run_dir(out, run),
             "objective": p["objective"], "model": p.get("model"), "preset": p.get("preset"),
             "steps": p.get("steps"), "epochs": p.get("epochs"), "batch-size": p.get("batch_size"),
             "lr": p.get("lr"), "weight-decay": p.get("weight_decay"), "warmup-steps": p.get("warmup_steps"),
             "seed": p.get("seed"), "workers": p.get("workers"), "save-every": p.get("save_every"),
             "samples-per-epoch": p.get("samples_per_epoch"), "mask-ratio": p.get("mask_ratio"),
             "global-batch": p.get("global_batch"), "keep-last": p.get("keep_last")}
    parts = [torchrun(), f"--nnodes={nodes}", f"--nproc_per_node={gpus}"]
    parts += ["--rdzv_backend=c10d", "--rdzv_endpoint=$MASTER_ADDR:29500", f"--rdzv_id={run.name.replace('/', '-')}"] \
        if nodes > 1 else ["--standalone"]
    parts += ["-m", "mdc.train", "--resume"]
    for flag, value in flags.items():
        if value not in (None, ""):
            parts += [f"--{flag}", str(value)]
    if p.get("t_interval") and p.get("mask_ratio") is None:
        parts += ["--t-interval", *map(str, p["t_interval"])]
    if p.get("time_weighting") is False:
        parts.append("--no-time-weighting")
    if p.get("draft_decode") is False:
        parts.append("--no-draft-decode")
    if p.get("compile_mode"):  # the step compiled whole (reduce-overhead: replayed as CUDA graphs)
        parts += ["--compile", "--compile-mode", p["compile_mode"]]
    return " ".join(shlex.quote(x) if not x.startswith("--rdzv_endpoint") else x for x in parts)


def slurm_scripts(runs: list[Run], out: str, folder: str, profile: str, gpus: int = 8, nodes: int = 1, *,
                  account: str = "", partition: str = "", step: str | None = None) -> str:
    """One sbatch script per run plus ``submit.sh``, which submits them in dependency order with
    ``--dependency=afterok:<the jobs of its dependencies>``. Returns the path of submit.sh."""
    runs = order(runs)
    os.makedirs(folder, exist_ok=True)
    lines = ["#!/usr/bin/env bash", "# Submit every run of the reproduction; each job starts after its dependencies.",
             "set -euo pipefail", f'cd "{ROOT}"']
    ids = {}
    for i, r in enumerate(runs):
        var = f"job{i}"
        ids[r.name] = var
        script = os.path.join(folder, f"{i:03d}-{r.name.replace('/', '-')}.sbatch")
        head = ["#!/usr/bin/env bash", f"#SBATCH --job-name=mdc-{r.name.replace('/', '-')}",
                f"#SBATCH --time={max(1, r.timeout_s // 60)}", f"#SBATCH --output={os.path.join(folder, 'logs', '%x-%j.out')}"]
        if r.gpus:
            cores = r.params.get("workers", 7) + 1  # a GPU's loader workers and its training process
            head += [f"#SBATCH --nodes={nodes}", f"#SBATCH --gres=gpu:{gpus}", "#SBATCH --ntasks-per-node=1",
                     f"#SBATCH --cpus-per-task={cores * gpus}"]
        else:
            head += ["#SBATCH --gres=gpu:1", "#SBATCH --cpus-per-task=8"]
        head += [f"#SBATCH --account={account}"] if account else []
        head += [f"#SBATCH --partition={partition}"] if partition else []
        body = ['export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                run_command(r, out, profile, step) + (f" --gpus-per-node {gpus} --nodes {nodes}" if r.gpus else "")]
        if r.gpus and nodes > 1:
            body[-1] = "srun " + body[-1]
        with open(script, "w") as f:
            f.write("\n".join(head + body) + "\n")
        dep = ":".join(f"${ids[d]}" for d in r.deps)
        lines.append(f"{var}=$(sbatch --parsable{' --dependency=afterok:' + dep if dep else ''} {shlex.quote(script)})")
    lines.append('echo "submitted ' + str(len(runs)) + ' jobs"')
    os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
    path = os.path.join(folder, "submit.sh")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o755)
    return path
