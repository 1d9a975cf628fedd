"""The run records as the paper's tables and figures read them: records grouped by their labels, and a
linear probe's top-1 per paper column.

Synthetic probe tasks stand in for the paper's datasets as ``mdc.world.evalsets.PROBE_TASKS`` says
(object -> ImageNet-1k, texture -> Food101, shape -> CIFAR-10, shape_texture -> CIFAR-100, colour ->
Pets); a real-data run reports the real ones. mean4 is the mean of the four tasks the learnability
study found informative (object, shape, texture, count).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Mapping

import numpy as np

# synthetic probe task -> the paper's Table 1 column it stands in for (mdc.world.evalsets.PROBE_TASKS)
PROBE_COLUMNS = {"object": "imagenet1k", "texture": "food101", "shape": "cifar10", "shape_texture": "cifar100",
                 "colour": "pets"}
REAL_COLUMNS = {"imagenet1k": "imagenet1k", "food101": "food101", "cifar10": "cifar10", "cifar100": "cifar100",
                "pets": "pets", "wds/imagenet1k": "imagenet1k"}


def records_by(runs: Iterable[dict], notebook: str, artifact: str, key: Callable[[dict], tuple]) -> dict:
    """Results records of ``notebook`` runs feeding ``artifact``, grouped by ``key(labels)``."""
    out = defaultdict(list)
    for r in runs:
        if r["notebook"] == notebook and artifact in r["artifacts"]:
            out[key(r["labels"])].append(r["record"])
    return out


def probe_top1(record: dict, floor: bool = False, grid: bool = False) -> dict[str, float]:
    """{column or task: top-1} of a linear_probe record (its random-init floor with ``floor``); with ``grid``
    the grid probe's (:mod:`mdc.eval.grid_probe`)."""
    res = record["results"]["grid"] if grid else record["results"]
    res = res["random_init"] if floor else res
    out = {}
    for name, r in res["datasets"].items():
        task = name.split("/", 1)[1] if name.startswith("wds/") else name
        out[PROBE_COLUMNS.get(task, REAL_COLUMNS.get(name, task))] = r["top1"]
    return out


def informative_mean(top1: Mapping[str, float]) -> float | None:
    """Mean of the synthetic tasks the learnability study found informative (object, shape, texture, count)."""
    keys = ("imagenet1k", "cifar10", "food101", "count")
    return float(np.mean([top1[k] for k in keys])) if all(k in top1 for k in keys) else None


def probe_rows(runs, artifact: str, key, columns: dict[str, Callable[[dict], float | None]]) -> dict:
    """{key(labels): {column: [values over seeds]}} from the probe runs feeding ``artifact``."""
    out = {}
    for k, records in records_by(runs, "linear_probe", artifact, key).items():
        tops = [probe_top1(r) for r in records]
        out[k] = {c: [f(t) for t in tops] for c, f in columns.items()}
    return out

