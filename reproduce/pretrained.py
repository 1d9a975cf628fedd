"""The package's trained weights from the reference run: ``python -m reproduce.pretrained``.

The `mini` reference run keeps its seed-0 descriptive checkpoints in ``reproduce/weights/mini/``
(float32, each the file its ledger record names by ``checkpoint_id``). This writes them into the
package as ``mdc/pretrained/mini-<objective>-synthetic/``: ``config.json``, ``model.safetensors``
in float16 (its floating tensors rounded, half the size; ``docs/api.md`` gives the tolerance
measured against float32) and ``record.json``, the pretraining record verbatim (run key, code
digests, device, losses). It prints each file's sha256 (its checkpoint_id), the digest ``mdc.factory`` checks on load.
"""
from __future__ import annotations

import json
import os
import shutil
from argparse import ArgumentParser

import torch
from safetensors.torch import load_file, save_file

from mdc.eval.results import checkpoint_id
from mdc.factory import PRETRAINED_DIR
from reproduce import ledger

#: objective -> the run whose checkpoint becomes mdc/pretrained/mini-<objective>-synthetic
SHIPPED = {"mdc": "pretrain/mdc-descriptive-s0", "arc": "pretrain/arc-descriptive-s0",
           "clip": "pretrain/clip-descriptive-s0"}
KEPT = os.path.join(ledger.ROOT, "reproduce", "weights", "mini")
RECORDS = os.path.join(ledger.ROOT, "reproduce", "records", "mini")


def half(state: dict[str, torch.Tensor], dtype=torch.float16) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor in ``dtype`` (round to nearest); the rest unchanged."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def ship(run: str, out: str, kept: str = KEPT, records: str = RECORDS) -> str:
    """Write the kept checkpoint of ``run`` into ``out`` as float16, with its config and record; returns the
    weights' sha256 (16 hex). A ValueError if the kept file is not the checkpoint the record names."""
    source, record = os.path.join(kept, run), ledger.read(records, run)
    if record is None:
        raise ValueError(f"no record of {run} in {records}")
    if checkpoint_id(source) != record["results"]["checkpoint_id"]:
        raise ValueError(f"{source}/model.safetensors is not the checkpoint {record['results']['checkpoint_id']} "
                         f"that the record of {run} names")
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(source, "config.json"), os.path.join(out, "config.json"))
    weights = os.path.join(out, "model.safetensors")
    save_file(half(load_file(os.path.join(source, "model.safetensors"))), weights,
              metadata={"source": f"float16 of checkpoint {record['results']['checkpoint_id']} of run {run} "
                                  f"(key {record['key']})"})  # one key: safetensors orders several at random
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
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
