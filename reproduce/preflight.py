"""Before a paper-profile run starts: its data (:func:`missing`), and after one fails, the line of its log that says
why (:func:`last_error`).

Each run of the paper profile reads its data from environment variables (``reproduce.registry.PAPER_ENV``;
:func:`reproduce.paper_profile.data_vars` says which a run reads). :func:`missing` checks each one the selected runs
read, as the run will read it: a shard pattern's shards exist, a count is a whole number, a folder holds the files
its reader opens, a JSON value parses. ``python -m reproduce --profile paper`` refuses, with one line a variable,
before it starts a run, torchrun or writes sbatch scripts.
"""
from __future__ import annotations

import glob
import json
import os
import re

from mdc.base.errors import ConfigError
from mdc.train.stream import check_shards
from reproduce.graph import Run
from reproduce.paper_profile import DATA, data_vars
from reproduce.registry import PAPER_ENV

SHARDS = tuple(var for var, _ in DATA.values()) + ("MDC_CC3M",)  # webdataset shard patterns
COUNTS = tuple(f"{var}_SAMPLES" for var in SHARDS)  # optional: counted from the shards
FOLDERS = {"MDC_SUGARCREPE": "*.json", "MDC_ARO": "visual_genome_*.json", "MDC_COCO_VAL2017": None,
           "MDC_VG_IMAGES": None, "MDC_COCO_IMAGES": None, "MDC_FLICKR_IMAGES": None}  # a folder, and what it holds
FILES = ("MDC_COCO_ORDER", "MDC_FLICKR_ORDER", "MDC_COCO_KARPATHY")


def problem(var: str, value: str | None) -> str | None:
    """Why the value of ``var`` cannot be read as its runs read it; None where it can (or, for an optional count,
    where it is not set)."""
    if not value:
        return None if var in COUNTS else "is not set"
    if var in SHARDS:
        return _shards(value)
    if var in COUNTS:
        return None if value.isdigit() and int(value) > 0 else f"{value!r} is not a positive whole number"
    if var in FOLDERS:
        if not os.path.isdir(value):
            return f"no such folder: {value}"
        pattern = FOLDERS[var]
        return f"no {pattern} in {value}" if pattern and not glob.glob(os.path.join(value, pattern)) else None
    if var in FILES:
        return None if os.path.isfile(value) else f"no such file: {value}"
    try:
        given = json.loads(value)
    except json.JSONDecodeError:
        return f"{value!r} is not JSON"
    if not isinstance(given, dict) or not given:
        return f"{value!r} is not a JSON object of {'datasets' if var == 'MDC_PROBE_ROOTS' else 'subsets'}"
    if var == "MDC_PROBE_ROOTS":
        gone = [f"{name}: {root}" for name, root in given.items() if not os.path.isdir(root)]
        return f"no such folder for {', '.join(gone)}" if gone else None
    return next((f"subset {pairs}: {why}" for pairs, shards in given.items() if (why := _shards(shards))), None)


def _shards(pattern: str) -> str | None:
    try:
        check_shards(pattern)
    except ConfigError as exn:
        return str(exn).removeprefix("train_data: ")
    return None


def missing(runs: list[Run]) -> list[str]:
    """One line per data variable that ``runs`` read and cannot: the variable, why, what it should hold, and the
    artifacts and runs that need it."""
    needed: dict[str, list[Run]] = {}
    for r in runs:
        for var in data_vars(r):
            needed.setdefault(var, []).append(r)
    lines = []
    for var, readers in needed.items():
        why = problem(var, os.environ.get(var))
        if why is None:
            continue
        artifacts = sorted({a for r in readers for a in r.artifacts}) or ["no artifact"]
        first = readers[0].name + (", ..." if len(readers) > 1 else "")
        lines.append(f"{var}{' ' if why == 'is not set' else ': '}{why} ({PAPER_ENV[var]}); needed by "
                     f"{', '.join(artifacts)} ({len(readers)} run{'s' if len(readers) > 1 else ''}: {first})")
    return lines


ERROR_LINE = re.compile(r"\b(\w+\.)*\w*(Error|Exception|Interrupt)\b: \S")
WRAPPERS = ("ChildFailedError", "PapermillExecutionError")  # they wrap the cause, which the log holds above them


def last_error(log: str) -> str | None:
    """The last line of a run's log that names an error (``SomeError: message``), the cause rather than torchrun's or
    papermill's wrapper around it, without a rank prefix; None where none does."""
    found = [line.split("]: ", 1)[-1].strip() for line in log.splitlines() if ERROR_LINE.search(line)]
    causes = [line for line in found if not any(w in line for w in WRAPPERS)]
    return (causes or found or [None])[-1]
