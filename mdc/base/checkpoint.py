"""Run folder I/O: checkpoints (atomic, pickle-free for code, resumable bit for bit) and the metrics log.

Layout under a run's output folder::

    checkpoints/step_000200/model.safetensors   weights (mdc.load reads this folder)
    checkpoints/step_000200/config.json         model config
    checkpoints/step_000200/trainer.pt          optimizer, LR schedule, step, per-rank RNG
                                                states and data-stream positions
    checkpoints/latest.json                     {"step": 200, "path": "step_000200"}
    metrics.jsonl                               one JSON line per logged step

    checkpoints/step_000200/train_config.json   the resolved run configuration (resume compares it)

A checkpoint folder is written under a temporary name (``.step_000200.tmp-PID``), every file
and the folder are fsync'ed, the folder is renamed into place and its parent fsync'ed, and
only then is ``latest.json`` replaced (and its folder fsync'ed): a run killed at any moment,
or a machine that loses power, leaves ``latest.json`` pointing at a complete checkpoint.
Temporary folders of earlier crashed writes are removed by the next save (safe because a run folder
has one writer: :func:`mdc.train.train` holds its lock, :mod:`mdc.base.lock`). A full disk
raises ``OSError(ENOSPC)`` saying "no space left on device" with the checkpoint's path,
after removing the partial folder; ``latest.json`` is untouched. ``keep_last=K`` deletes,
after a successful save, the step folders older than the new one beyond the K newest (the
new one, which ``latest.json`` names, always stays; a folder newer than it, left by a run
killed before ``latest.json`` named it, is overwritten by the resumed run). ``trainer.pt`` holds only tensors and plain Python values and is read with
``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import random
import re
import shutil
import sys

import numpy as np
import torch

LATEST = "latest.json"


def fsync_path(path: str) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, ``os.replace`` it over ``path``, fsync the folder."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_path(os.path.dirname(os.path.abspath(path)))


def rng_state() -> dict:
    """This process's RNG states: python, numpy, torch CPU and (if present) every CUDA device."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run_dir: str, step: int, model, trainer_state: dict, run_config: dict | None = None,
         keep_last: int | None = None) -> str:
    """Write the checkpoint of ``step`` durably and point ``latest.json`` at it; returns its folder.

    ``run_config`` (JSON-able) is stored as ``train_config.json``; ``keep_last`` (None = keep
    all) prunes older step folders afterwards. See the module docstring for the guarantees.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be at least 1; got {keep_last}")
    root = os.path.join(run_dir, "checkpoints")
    name = f"step_{step:06d}"
    final, tmp = os.path.join(root, name), os.path.join(root, f".{name}.tmp-{os.getpid()}")
    os.makedirs(root, exist_ok=True)
    for stale in glob.glob(os.path.join(root, ".step_*.tmp-*")):  # left by earlier crashed writes
        shutil.rmtree(stale, ignore_errors=True)
    for stale in glob.glob(os.path.join(root, f"{LATEST}.tmp-*")):
        os.remove(stale)
    try:
        model.save(tmp)
        with open(os.path.join(tmp, "trainer.pt"), "wb") as f:  # a file object: write errors keep their errno
            torch.save(trainer_state, f)
        if run_config is not None:
            with open(os.path.join(tmp, "train_config.json"), "w") as f:
                f.write(json.dumps(run_config, indent=1))
        for entry in os.listdir(tmp):
            fsync_path(os.path.join(tmp, entry))
        fsync_path(tmp)
        if os.path.exists(final):  # re-saving a step after a resume
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(root)
        atomic_write_text(os.path.join(root, LATEST), json.dumps({"step": step, "path": name}))
    except Exception as exn:
        shutil.rmtree(tmp, ignore_errors=True)
        if _no_space(exn):
            raise OSError(errno.ENOSPC, f"no space left on device while writing checkpoint {final}; "
                          f"free space and resume: latest.json is unchanged") from exn
        raise
    if keep_last is not None:
        _prune(root, step, keep_last)
    return final


def _no_space(exn: BaseException) -> bool:
    """Is this (or its cause) a full disk? safetensors' writer reports it only in its message."""
    while exn is not None:
        if getattr(exn, "errno", None) == errno.ENOSPC or "No space left on device" in str(exn):
            return True
        exn = exn.__cause__ or exn.__context__
    return False


def _prune(root: str, latest_step: int, keep_last: int) -> None:
    """Delete step folders older than ``latest_step`` beyond the ``keep_last`` newest (latest included)."""
    steps = sorted(int(m.group(1)) for n in os.listdir(root) if (m := re.fullmatch(r"step_(\d+)", n)))
    older = [s for s in steps if s < latest_step]
    for s in older[: max(0, len(older) - (keep_last - 1))]:
        shutil.rmtree(os.path.join(root, f"step_{s:06d}"), ignore_errors=True)


def latest(run_dir: str) -> str | None:
    """Folder of the newest complete checkpoint of a run, or None."""
    pointer = os.path.join(run_dir, "checkpoints", LATEST)
    if not os.path.isfile(pointer):
        return None
    with open(pointer) as f:
        return os.path.join(run_dir, "checkpoints", json.load(f)["path"])


def read_run_config(checkpoint: str) -> dict | None:
    """{"train": train_config.json, "model": config.json} of a checkpoint folder; None without train_config.json."""
    path = os.path.join(checkpoint, "train_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f, open(os.path.join(checkpoint, "config.json")) as g:
        return {"train": json.load(f), "model": json.load(g)}


def load_trainer_state(checkpoint: str) -> dict:
    """The trainer state of a checkpoint folder (tensors and plain values only)."""
    return torch.load(os.path.join(checkpoint, "trainer.pt"), map_location="cpu", weights_only=True)


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics log (``metrics.jsonl``), one dict per logged step."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class MetricsLog:
    """metrics.jsonl (and optionally TensorBoard) on rank 0; a resumed run drops lines past its step."""

    def __init__(self, run_dir: str, start_step: int, tensorboard: bool = False):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        kept = []
        if start_step and os.path.isfile(self.path):
            with open(self.path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= start_step]
        atomic_write_text(self.path, "".join(kept))
        self.file = open(self.path, "a")
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("tensorboard is not installed; logging to metrics.jsonl only", file=sys.stderr)
            else:
                self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=start_step + 1)

    def write(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key in ("loss", "lr", "images_per_s", "unk_rate", "data_wait", "loader_images_per_s"):
                if row.get(key) is not None:
                    self.writer.add_scalar(f"train/{key}", row[key], row["step"])

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
