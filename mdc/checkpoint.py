"""Run folder I/O: checkpoints (atomic, pickle-free for code, resumable bit for bit) and the metrics log.

Layout under a run's output folder::

    checkpoints/step_000200/model.safetensors   weights (mdc.load reads this folder)
    checkpoints/step_000200/config.json         model config
    checkpoints/step_000200/trainer.pt          optimizer, LR schedule, step, per-rank RNG
                                                states and data-stream positions
    checkpoints/latest.json                     {"step": 200, "path": "step_000200"}
    metrics.jsonl                               one JSON line per logged step

A checkpoint folder is written under a temporary name and renamed into place, and
``latest.json`` is replaced only afterwards, so a run killed at any moment leaves
``latest.json`` pointing at a complete checkpoint. ``trainer.pt`` holds only tensors and
plain Python values and is read with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys

import numpy as np
import torch

LATEST = "latest.json"


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then ``os.replace`` it over ``path``."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def save(run_dir: str, step: int, model, trainer_state: dict) -> str:
    """Write the checkpoint of ``step`` atomically and point ``latest.json`` at it; returns its folder."""
    root = os.path.join(run_dir, "checkpoints")
    name = f"step_{step:06d}"
    final, tmp = os.path.join(root, name), os.path.join(root, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    torch.save(trainer_state, os.path.join(tmp, "trainer.pt"))
    if os.path.exists(final):  # re-saving a step after a resume
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(os.path.join(root, LATEST), json.dumps({"step": step, "path": name}))
    return final


def latest(run_dir: str) -> str | None:
    """Folder of the newest complete checkpoint of a run, or None."""
    pointer = os.path.join(run_dir, "checkpoints", LATEST)
    if not os.path.isfile(pointer):
        return None
    with open(pointer) as f:
        return os.path.join(run_dir, "checkpoints", json.load(f)["path"])


def load_trainer_state(checkpoint: str) -> dict:
    """The trainer state of a checkpoint folder (tensors and plain values only)."""
    return torch.load(os.path.join(checkpoint, "trainer.pt"), map_location="cpu", weights_only=True)


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
            for key in ("loss", "lr", "images_per_s"):
                self.writer.add_scalar(f"train/{key}", row[key], row["step"])

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
