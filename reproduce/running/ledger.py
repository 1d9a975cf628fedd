"""The results ledger: one small JSON record per finished run; every table and figure is built from it.

Layout: ``<records>/<run name>.json`` (``reproduce/records/mini/pretrain/mdc-alt-s0.json``). A record::

    {"schema": "reproduce.record/1", "run": "pretrain/mdc-alt-s0", "key": "...",
     "notebook": "pretrain", "params": {...},            # the registry's, "{run:<name>}" unresolved
     "labels": {...}, "artifacts": [...], "seed": 0,
     "code": {"notebook": "<sha256 of its code cells>", "package": "<sha256 of mdc/>"},
     "device": "...", "seconds": 1234.5, "cpu_seconds": 2400.1, "peak_mb": 812,
     "machine_factor": 2.7,                              # where a study's part wrote it (machine_factor())
     "results": {...}}                                   # the run's results.json (mdc.eval.results)

No checkpoint and no feature enters a record: it holds what the artifact builders read, per-item
outcomes included, and nothing else. Paths inside ``results`` are written relative to the run folder
tree (``{out}/...``) or the repository, so a record says nothing about the machine that made it.

A record whose key is the run's current key counts as done (:func:`done`), with or without a run
folder. The builders read :func:`for_build`'s list; :func:`provenance` says which code made it.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import re
import statistics
import time

from mdc.base.checkpoint import atomic_write_text
from mdc.eval.results import SCHEMA as RESULTS_SCHEMA
from reproduce.cost import eval_cost

SCHEMA = "reproduce.record/1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a run takes when no record of it exists yet: seconds on 2 CPU cores at two runs at a time, by profile
# and notebook (mini: docs/reproduction.md's measured figures; smoke: its CI logs). A pretraining run scales
# with its images (steps x batch) and its captions' length; MDC's compositionality scores Monte-Carlo ELBOs.
DEFAULT_SECONDS = {
    "smoke": {"data": 20, "pretrain": 20, "linear_probe": 15, "compositionality": 20, "captioning": 30,
              "guidance": 40, "figures": 30},
    "mini": {"data": 90, "pretrain": 1300, "linear_probe": 150, "compositionality": 60, "captioning": 240,
             "guidance": 4150, "figures": 120},
}
# MDC's Table 2 on mini by part (reproduce.registry.TABLE2_PARTS), measured on the reference run's seed 0 (ELBO
# of 32 copies doubled up to 256 where a decision is close, log p(t) over K = 4 images)
MDC_TABLE2_SECONDS = {"order": 2864, "pairs": 670}
MINI_IMAGES = 2240 * 64  # a mini pretraining run's images, which DEFAULT_SECONDS["mini"]["pretrain"] is for
REFERENCE_SPEED = "at the reference machine's speed"  # an estimate from a record that says what machine made it


def trained_steps(params: dict, labels: dict | None) -> int:
    """The steps a pretraining run trains: up to its ``stop_at`` (else its schedule's end) from the step where it
    continues another run's checkpoint (its label ``from_step``, else 0)."""
    return (params.get("stop_at") or params.get("steps") or 0) - (labels or {}).get("from_step", 0)


def _default_seconds(run, profile: str) -> float:
    seconds = float(DEFAULT_SECONDS.get(profile, {}).get(run.notebook, 0))
    if profile == "mini" and run.notebook == "pretrain":
        p = run.params
        images = trained_steps(p, run.labels) * (p.get("batch_size") or 0)
        seconds *= (images / MINI_IMAGES if images else 1) * (1.5 if run.labels.get("style") == "descriptive" else 1)
    part = run.labels.get("part")
    if profile == "mini" and run.notebook == "compositionality" and run.labels.get("method") == "MDC":
        # a measured part's seconds; a run of every part, their sum; a part never measured, the notebook's default
        seconds = sum(MDC_TABLE2_SECONDS.values()) if part is None else MDC_TABLE2_SECONDS.get(part, seconds)
    return seconds


def package_digest(root: str = ROOT) -> str:
    """sha256 (16 hex) of the package's code under ``root``: every ``mdc/**/*.py``, by relative path and content."""
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "mdc", "**", "*.py"), recursive=True)):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()[:16]


def threads() -> int:
    """The CPU threads a run gets: ``OMP_NUM_THREADS`` where set, else this process's torch count (the child's own
    default). Its numbers depend on it in the last bit, which a pretraining run grows into a point of probe."""
    import torch  # as in device()

    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(given) if given.isdigit() and int(given) > 0 else torch.get_num_threads()


def device(run) -> str:
    """Where ``run`` executed: the CUDA device's name, or the CPU, its core count and the run's threads
    (:func:`threads`). A notebook with a ``device`` parameter runs where it says (its default, "cpu" for the
    evaluations, where the run names none); pretraining takes the GPU wherever there is one (``mdc.train``'s rule);
    the data notebook runs on the CPU."""
    import torch  # the runner is imported by tools that do not need torch

    named = run.params.get("device", eval_cost.notebook_defaults(run.notebook).get("device"))
    on_gpu = str(named).startswith("cuda") if named is not None else run.notebook == "pretrain"
    if on_gpu and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return cpu_device()


def cpu_device() -> str:
    """The CPU, its core count and a run's threads (:func:`threads`), as a record names them."""
    n = threads()
    return f"cpu: {platform.machine()}, {os.cpu_count()} cores, {n} thread{'s' * (n > 1)}"


def path(records: str, name: str) -> str:
    return os.path.join(records, f"{name}.json")


def read(records: str, name: str) -> dict | None:
    """The record of run ``name`` (None: none, or not a record: a file that does not parse is ignored)."""
    try:
        with open(path(records, name)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def read_all(records: str) -> dict[str, dict]:
    """Every record under ``records``, by run name."""
    found = {}
    for p in sorted(glob.glob(os.path.join(records, "**", "*.json"), recursive=True)):
        name = os.path.relpath(p, records)[: -len(".json")].replace(os.sep, "/")
        record = read(records, name)
        if record is not None:
            found[name] = record
    return found


def done(records: str | None, name: str, key: str) -> bool:
    record = read(records, name) if records else None
    return record is not None and record["key"] == key


def _relative(value, out: str):
    """``value`` with the run tree written ``{out}`` and the repository's own paths made relative."""
    if isinstance(value, str):
        for prefix, alias in ((os.path.abspath(out), "{out}"), (ROOT, ".")):
            if value == prefix or value.startswith(prefix + os.sep):
                return alias + value[len(prefix):]
        return value
    if isinstance(value, dict):
        return {k: _relative(v, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, out) for v in value]
    return value


def write(records: str, run, key: str, results: dict, out: str, notebook_digest: str, outcome: dict,
          package: str | None = None) -> str:
    """Write run ``run``'s record (atomically), naming the code that made it (``package``: default this tree's
    :func:`package_digest`); returns its path."""
    if results.get("schema") != RESULTS_SCHEMA:
        raise ValueError(f"{run.name}: its results are not of schema {RESULTS_SCHEMA!r}")
    record = {
        "schema": SCHEMA, "run": run.name, "key": key, "notebook": run.notebook, "params": run.params,
        "labels": run.labels, "artifacts": list(run.artifacts), "seed": run.labels.get("seed"),
        "code": {"notebook": notebook_digest, "package": package or package_digest()},
        "device": outcome.get("device") or device(run), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(outcome.get("seconds", 0.0), 1), "cpu_seconds": round(outcome.get("cpu_seconds", 0.0), 1),
        "peak_mb": round(outcome.get("peak_mb", 0.0)), "results": _relative(results, out),
    }
    if outcome.get("machine_factor"):
        record["machine_factor"] = round(float(outcome["machine_factor"]), 3)
    return save(records, record)


def save(records: str, record: dict) -> str:
    """Write ``record`` (new, or read and amended) under its run's name, atomically; returns its path."""
    target = path(records, record["run"])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    atomic_write_text(target, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return target


def run_seconds(record: dict) -> float:
    """A recorded run's length: its wall time (over all its attempts, :func:`reproduce.running.folders.earlier_seconds`),
    or for a pretraining run its images over its throughput if that is longer: the records of the reference
    run were written before the runner added up attempts, and a resumed run's holds its last attempt only."""
    seconds = float(record.get("seconds") or 0.0)
    r = (record.get("results") or {}).get("results") or {}
    if record.get("notebook") == "pretrain" and r.get("images_per_s") and r.get("steps") and r.get("global_batch"):
        steps = r["steps"] - (record.get("labels") or {}).get("from_step", 0)  # a piece: its own steps
        seconds = max(seconds, steps * r["global_batch"] / r["images_per_s"])
    return seconds


def machine_factor(record: dict) -> float | None:
    """The run time over the reference machine's of the machine that made ``record`` (a study's part writes it, then
    what it measured), or None where the record does not say: its seconds are then this machine's."""
    return float(record["machine_factor"]) if record.get("machine_factor") else None


def reference_seconds(record: dict) -> float:
    """:func:`run_seconds` on the reference machine where the record says what machine made it, else as recorded."""
    return run_seconds(record) / (machine_factor(record) or 1.0)


def _nearest_record(run, records: str) -> tuple[dict, str] | None:
    """The record an estimate of ``run`` starts from: its own (any key), else the longest of the same run's
    records for other seeds (``...-s<N>``); with where it came from."""
    record = read(records, run.name)
    if record is not None and run_seconds(record):
        return record, "its record"
    stem = re.sub(r"-s\d+$", "", run.name)
    others = [read(records, os.path.relpath(p, records)[: -len(".json")]) for p in
              glob.glob(path(records, glob.escape(stem) + "-s*"))] if stem != run.name else []
    others = [r for r in others if r and re.fullmatch(re.escape(stem) + r"-s\d+", r.get("run", "")) and run_seconds(r)]
    if not others:
        return None
    record = max(others, key=reference_seconds)
    return record, f"the record of seed {record.get('seed')}"


def _speed(run, records: str | None) -> tuple[float, str]:
    """(median of recorded / modeled seconds, which records) over the ledger's records of ``run``'s kind (its
    folder, notebook and method): the machine's speed against the units', for a run with no record of its own;
    (1.0, "") where none is modeled."""
    kin, method = os.path.dirname(run.name), run.labels.get("method")
    ratios = []
    for p in sorted(glob.glob(os.path.join(records or "", glob.escape(kin), "*.json"))) if records and kin else ():
        r = read(records, os.path.relpath(p, records)[: -len(".json")])
        if not r or r.get("notebook") != run.notebook or r.get("labels", {}).get("method") != method:
            continue
        work, seconds = eval_cost.recorded_work(r), run_seconds(r)
        modeled = eval_cost.modeled_seconds(run.notebook, work) if work is not None else 0.0
        if modeled > 0 and seconds > 0:
            ratios.append(seconds / modeled)
    if not ratios:
        return 1.0, ""
    return statistics.median(ratios), " ".join(["the", str(len(ratios)), *([method] if method else []), kin,
                                                 "record(s)"])


def estimate(run, records: str | None, profile: str, runs: dict | None = None) -> tuple[float, str]:
    """(seconds ``run`` should take, where they come from): its latest record's length (any key,
    :func:`run_seconds`), else the longest of the same run's records for other seeds, scaled by the cost of its
    parameters now against the record's (:func:`reproduce.cost.eval_cost.scale`; ``runs``: the graph by name, whose
    ``data/evalsets`` gives the sizes); else its work by the cost model (:func:`reproduce.cost.eval_cost.planned_seconds`)
    where that exceeds the profile's default, else the default. A record that says what machine made it
    (:func:`machine_factor`) gives the reference machine's seconds (the note says :data:`REFERENCE_SPEED`). The note
    is empty for a record taken as is."""
    found = _nearest_record(run, records) if records else None
    if found is None:  # its work by the cost model where one applies, the default a floor for fixed costs
        default, modeled = _default_seconds(run, profile), eval_cost.planned_seconds(run, runs)
        if modeled is not None and modeled > default:
            speed, kin = _speed(run, records)
            return modeled * speed, ("no record: its work x the cost model's seconds per unit" +
                                     (f" x {speed:.2f} (recorded / modeled seconds of {kin})" if kin else ""))
        return default, "no record: the profile's default"
    record, source = found
    speed = machine_factor(record)
    at = f"{REFERENCE_SPEED} (made at x {speed:g})" if speed else ""
    factor, changed = eval_cost.scale(run, record, runs)
    if factor != 1.0:
        return reference_seconds(record) * factor, f"{source} x {factor:.2f}: {changed}" + (f"; {at}" if at else "")
    note = "; ".join(n for n in (source if source != "its record" else "", changed, at) if n)
    return reference_seconds(record), note


def estimate_seconds(run, records: str | None, profile: str, runs: dict | None = None) -> float:
    """:func:`estimate`'s seconds."""
    return estimate(run, records, profile, runs)[0]


def for_build(records: dict[str, dict]) -> list[dict]:
    """The runs as the artifact builders read them: ``{name, notebook, labels, artifacts, record}``,
    ``record`` being the run's results (:mod:`mdc.eval.results`), in the order of ``records`` (the
    registry's, where the runner builds: a table lists its rows in the order of its runs)."""
    return [{"name": name, "notebook": r["notebook"], "params": r["params"], "labels": r["labels"],
             "artifacts": r["artifacts"], "record": r["results"]} for name, r in records.items()]


def provenance(records: dict[str, dict], of: int | None = None) -> str:
    """One line naming the code the records came from: its package digest(s), with a count per digest
    when they differ (records of different package versions are listed, never silently mixed); ``of``, the
    records of the whole ledger, where these are the part of it that feeds one artifact."""
    by_digest: dict[str, list[str]] = {}
    for name, r in sorted(records.items()):
        by_digest.setdefault(r["code"]["package"], []).append(name)
    count = (f"{len(records)} of the ledger's {of} run records (those that feed it)" if of and of != len(records)
             else f"{len(records)} run records")
    if len(by_digest) <= 1:
        digest = next(iter(by_digest), "none")
        return f"From {count} of package {digest}."
    parts = "; ".join(f"package {d}: {len(names)} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                      for d, names in sorted(by_digest.items(), key=lambda kv: -len(kv[1])))
    return f"From {count} of {len(by_digest)} package versions: {parts}."
