"""The reference run's kept weights, and the package's trained weights: ``python -m reproduce.pretrained``.

A reference run (``python -m reproduce --profile mini``, :mod:`reproduce.__main__`) keeps the weights of every
seed of the runs in :data:`KEEP`, the descriptive MDC, ARC and CLIP, in ``reproduce/weights/mini/<run name>/``:
``config.json``, ``model.safetensors`` in float16 and ``kept.json`` (:func:`keep`, called as the run's record is
written), so a later instrument can be applied to any seed without training again. ``kept.json`` names the
float32 checkpoint the record names by ``checkpoint_id``.

This writes the seed-0 ones into the package as ``mdc/pretrained/mini-<objective>-synthetic/``: ``config.json``,
``model.safetensors`` in float16 (a kept float16 file as it is, a float32 one with its floating tensors rounded:
half the size; ``docs/api.md`` gives the tolerance measured against float32) and ``record.json``, the
pretraining record verbatim (run key, code digests, device, losses). It prints each file's sha256 (its
checkpoint_id), the digest ``mdc.factory`` checks on load.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
from argparse import ArgumentParser

import torch
from safetensors.torch import load_file, save_file

from mdc.base.checkpoint import atomic_write_text, fsync_path
from mdc.eval.results import checkpoint_id
from mdc.factory import PRETRAINED_DIR, checkpoint_folder
from reproduce.running import ledger

#: objective -> the run whose checkpoint becomes mdc/pretrained/mini-<objective>-synthetic
SHIPPED = {"mdc": "pretrain/mdc-descriptive-s0", "arc": "pretrain/arc-descriptive-s0",
           "clip": "pretrain/clip-descriptive-s0"}
#: the runs whose weights a reference run keeps, every seed of each: ``<stem>-s<seed>``
KEEP = ("pretrain/mdc-descriptive", "pretrain/arc-descriptive", "pretrain/clip-descriptive")
KEPT = os.path.join(ledger.ROOT, "reproduce", "weights", "mini")
KEPT_NOTE = "kept.json"  # beside a kept float16 file: which float32 checkpoint it rounds (keep)
RECORDS = os.path.join(ledger.ROOT, "reproduce", "records", "mini")


def half(state: dict[str, torch.Tensor], dtype=torch.float16) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor in ``dtype`` (round to nearest); the rest unchanged."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def is_kept(run: str) -> bool:
    """Whether a reference run keeps the weights of ``run``: a seed of a run in :data:`KEEP`."""
    return any(re.fullmatch(re.escape(stem) + r"-s\d+", run) for stem in KEEP)


def _replace(path: str, write) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, then rename it over ``path``: a crash leaves the old
    file or none, never a partial file under the final name."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def _source(record: dict) -> str:
    """The metadata line of a float16 file: which checkpoint and run it rounds."""
    return (f"float16 of checkpoint {record['results']['checkpoint_id']} of run {record['run']} "
            f"(key {record['key']})")


def keep(run_folder: str, out: str, record: dict) -> str | None:
    """Write the newest checkpoint of the pretraining run in ``run_folder`` into ``out/<run name>/``
    (:func:`keep_at`) for a run kept (:func:`is_kept`); returns that folder, or None for a run not kept.
    ``record``: the run's ledger record, or its ``run``, ``key`` and ``results``."""
    return keep_at(run_folder, os.path.join(out, record["run"]), record) if is_kept(record["run"]) else None


def keep_at(run_folder: str, target: str, record: dict) -> str:
    """Write the newest checkpoint of the pretraining run in ``run_folder`` into ``target``: ``config.json``,
    ``model.safetensors`` in float16 and ``kept.json`` (the run, its key, the float32 ``checkpoint_id`` the
    record holds and the float16 file's own); returns ``target``. Each file is written under a temporary name
    and renamed, ``kept.json`` last: a folder without it is not kept. A ValueError if the checkpoint is not the
    one the record names."""
    run, wanted = record["run"], record["results"]["checkpoint_id"]
    source = checkpoint_folder(run_folder)
    if (found := checkpoint_id(source)) != wanted:
        raise ValueError(f"{source}/model.safetensors is not the checkpoint {wanted} that the record of {run} "
                         f"names (its sha256 is {found})")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(source, "config.json")) as f:
        atomic_write_text(os.path.join(target, "config.json"), f.read())
    weights = half(load_file(os.path.join(source, "model.safetensors")))
    _replace(os.path.join(target, "model.safetensors"),  # one metadata key: safetensors orders several at random
             lambda tmp: save_file(weights, tmp, metadata={"source": _source(record)}))
    note = {"run": run, "key": record["key"], "checkpoint_id": wanted, "float16_id": checkpoint_id(target)}
    atomic_write_text(os.path.join(target, KEPT_NOTE), json.dumps(note, indent=1, sort_keys=True) + "\n")
    return target


def kept_checkpoint(folder: str) -> str | None:
    """The float32 checkpoint id whose float16 ``folder`` holds (:func:`keep`'s ``kept.json``), or None where
    the folder has no note or its weights are not the file the note describes."""
    try:
        with open(os.path.join(folder, KEPT_NOTE)) as f:
            note = json.load(f)
    except (OSError, ValueError):
        return None
    return note.get("checkpoint_id") if note.get("float16_id") == checkpoint_id(folder) else None


def listing(weights: str, found: dict[str, dict]) -> list[str]:
    """One line per kept folder under ``weights``: where it is, its run, and whether its float16 file rounds the
    checkpoint the run's record in ``found`` (:func:`reproduce.running.ledger.read_all`) names."""
    lines = []
    for note in sorted(glob.glob(os.path.join(weights, "**", KEPT_NOTE), recursive=True)):
        folder = os.path.dirname(note)
        with open(note) as f:
            run = json.load(f)["run"]
        wanted = found.get(run, {}).get("results", {}).get("checkpoint_id")
        state = (f"float16 of checkpoint {wanted}" if wanted and kept_checkpoint(folder) == wanted else
                 "NOT the checkpoint its record names" if wanted else "no record")
        lines.append(f"- `{os.path.relpath(folder, ledger.ROOT)}`: {run}, {state}")
    return lines


def _write_json(value: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")


def ship(run: str, out: str, kept: str = KEPT, records: str = RECORDS) -> str:
    """Write the kept weights of ``run`` into ``out`` as float16, with its config and record; returns the
    weights' sha256 (16 hex). A kept float16 file whose ``kept.json`` names the record's checkpoint is copied as
    is; a float32 one must be that checkpoint and is rounded. A ValueError naming the file and both ids if
    neither holds."""
    source, record = os.path.join(kept, run), ledger.read(records, run)
    if record is None:
        raise ValueError(f"no record of {run} in {records}")
    wanted, weights = record["results"]["checkpoint_id"], os.path.join(source, "model.safetensors")
    rounded = kept_checkpoint(source)  # a kept float16 file's float32 checkpoint
    if rounded != wanted and (found := checkpoint_id(source)) != wanted:
        rounds = f"; it is the float16 of checkpoint {rounded}" if rounded else ""
        raise ValueError(f"{weights} is not the checkpoint {wanted} that the record of {run} names "
                         f"(its sha256 is {found}{rounds})")
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(source, "config.json"), os.path.join(out, "config.json"))
    if rounded == wanted:
        shutil.copyfile(weights, os.path.join(out, "model.safetensors"))
    else:
        save_file(half(load_file(weights)), os.path.join(out, "model.safetensors"),
                  metadata={"source": _source(record)})
    _write_json(record, os.path.join(out, "record.json"))
    return checkpoint_id(out)


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = ArgumentParser(description="Write the reference run's kept mini checkpoints into mdc/pretrained.")
    parser.add_argument("--out", default=PRETRAINED_DIR, help="where the model folders go")
    args = parser.parse_args(argv)
    digests = {}
    for objective, run in SHIPPED.items():
        folder = os.path.join(args.out, f"mini-{objective}-synthetic")
        digests[objective] = ship(run, folder)
        size = os.path.getsize(os.path.join(folder, "model.safetensors")) / 2**20
        print(f"{os.path.relpath(folder, ledger.ROOT)}: {size:.1f} MiB, sha256 {digests[objective]} (from {run})")
    return digests


if __name__ == "__main__":
    main()
