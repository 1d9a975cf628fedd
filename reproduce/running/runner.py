"""Execute a registry of notebook runs with papermill: skip what is done, survive what fails.

    outcome = run_all(runs, out, RunSettings(jobs=2, records="reproduce/records/mini", profile="mini"))

Layout under ``<out>/<profile>/``::

    <run name>/<notebook>.ipynb   the executed notebook (kept, outputs included; the figures run has none)
    <run name>/results.json       what the notebook wrote (mdc.eval.results)
    <run name>/done.json          {"key": ...} once the run succeeded
    runs.csv                      name, notebook, status, seconds, peak memory (MB), key

A run is done when its key (:mod:`reproduce.graph`: notebook code, parameters, dependencies) is
recorded. A failed run is reported and the runs that do not depend on it still execute; the runner
ends with a non-zero exit status if anything failed. Clusters: :mod:`reproduce.running.cluster`.

The pieces: :mod:`reproduce.running.scheduler` picks which run starts next and how many run at once;
:mod:`reproduce.running.attempt` executes one run in its own subprocess (command, timeout, log, outcome);
:mod:`reproduce.running.folders` keeps one folder to one run (a folder left by a run with another key is
moved aside to ``<run name>.superseded-<its key>``; a run that executes again with the same key
continues in its folder, a pretraining run from its last checkpoint); :mod:`reproduce.running.bookkeeping` keeps
the ledger (:mod:`reproduce.running.ledger`): with ``records=DIR`` every run that succeeds writes one small
record into DIR, a run whose record carries its current key counts as done even where no run folder
exists, and the checkpoints every reader of which is recorded are removed (``keep_checkpoints``
keeps them); with ``kept_weights=DIR`` the runs of :data:`reproduce.pretrained.KEEP` (every seed of the
descriptive MDC, ARC and CLIP) leave their weights in DIR in float16 as they are recorded. With
``time_budget_s`` the runner starts no run that would not finish in time (but a short reader of a run
executed in this part: :mod:`reproduce.running.scheduler`), lets the running ones finish and returns with the rest
``left``.

One owner: a runner holds ``<out>/<profile>/.reproduce.lock`` (:mod:`mdc.base.lock`) while it runs
(``only=`` a run, as a SLURM job does: that run's folder instead), so a second runner on the
same folder is refused at once, naming the first. A run about to execute loses its ``done.json``
first and gets it back (written atomically) only once its notebook succeeded and wrote
``results.json``: a run killed half-way is never counted as done, whatever it left behind. A
notebook dies with its runner: :mod:`reproduce.running.execute` watches its parent and ends its process
group when the runner is gone (the kernel follows its own parent), so a killed runner leaves no
notebook writing on into a run folder that the next runner executes again.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Collection
from dataclasses import dataclass

from mdc.base.checkpoint import atomic_write_text
from mdc.base.lock import FolderLock
from reproduce.running import ledger
from reproduce.running.bookkeeping import Book
from reproduce.running.folders import RUNNER_LOCK, superseded_key
from reproduce.graph import Run, digests, keys, order, run_dir
from reproduce.running.scheduler import Scheduler


@dataclass(frozen=True)
class RunSettings:
    """How :func:`run_all` executes a graph (and :func:`dry_run` reports it)."""

    jobs: int = 1  # runs executed at the same time
    torchrun: tuple[int, int] | None = None  # (gpus_per_node, nodes): pretraining runs under torchrun
    only: Collection[str] | None = None  # execute just these runs of the graph (a cluster job each)
    records: str | None = None  # the ledger: one record per finished run
    time_budget_s: float | None = None  # start no run that would not finish within it
    keep_checkpoints: bool = True  # False: remove the checkpoints every reader of which is recorded
    profile: str = ""  # picks the default estimates of runs not yet recorded
    kept_weights: str | None = None  # where the runs of reproduce.pretrained.KEEP leave float16 weights
    machine_factor: float | None = None  # this machine's run time over the reference's, written into each record
    science: str | None = None  # a tree holding the mdc/ and notebooks/ the runs execute (a study's pinned export)
    priority: dict[str, int] | None = None  # ready runs start in this order (lowest first), not the scheduler's rule
    again: Collection[str] = ()  # recorded runs to execute where their folder is gone, though no run here reads it


def run_all(runs: list[Run], out: str, settings: RunSettings = RunSettings(), log=print) -> dict[str, dict]:
    """Execute ``runs`` (dependencies first, ``settings.jobs`` at a time); returns {name: outcome}.

    ``settings.only``: execute just these runs of the graph (a cluster job each), taking the others as
    done. The runner holds ``out``'s lock meanwhile (with ``only``: those runs' folders'); another holder
    makes it raise :class:`mdc.base.lock.FolderInUseError` before anything runs.
    """
    runs = order(runs)
    key = keys(runs, digests(runs, settings.science))
    only = settings.only
    if only is not None:
        unknown = set(only) - {r.name for r in runs}
        if unknown:
            raise ValueError(f"unknown run(s) {sorted(unknown)}")
    hint = "wait for it to end, or give another --out"
    locked = [out] if only is None else [run_dir(out, r) for r in runs if r.name in only]
    with contextlib.ExitStack() as held:
        for folder in locked:
            held.enter_context(FolderLock(folder, RUNNER_LOCK, "a reproduction runner", hint))
        book = Book(runs, key, out, settings.records, settings.keep_checkpoints or only is not None, log,
                    kept_weights=settings.kept_weights, machine_factor=settings.machine_factor,
                    science=settings.science, again=settings.again)
        skipped = [] if only is None else [r.name for r in runs if r.name not in only]
        if only is not None:
            book.needed = set(only)
        by_name = {r.name: r for r in runs}
        estimate = {r.name: ledger.estimate_seconds(r, settings.records, settings.profile, by_name) for r in runs}
        outcome = Scheduler(book, estimate, settings.jobs, settings.time_budget_s, settings.torchrun, skipped,
                            settings.priority).run()
        _write_csv(out, runs, outcome, key)
        return outcome


def dry_run(runs: list[Run], out: str, settings: RunSettings = RunSettings(), log=print, flops=None) -> None:
    """What :func:`run_all` would do, without a lock and writing nothing: each run's state (a recorded run that
    a run to execute reads again, with the line why, would run), estimated minutes
    (where its record was scaled or is not its own, from what: :func:`reproduce.running.ledger.estimate`; and FLOPs,
    ``flops(run)`` where it counts them), the run-hours left, by kind (pretraining, evaluation), and the
    run-hours of all ``runs`` (a seed plan's, done or not) by kind (data, pretraining, evaluation), with
    evaluation's share of pretraining and evaluation."""
    runs = order(runs)
    key = keys(runs)
    records, left, plan = settings.records, {"pretraining": 0.0, "evaluation": 0.0}, {}
    by_name = {r.name: r for r in runs}
    needed = Book(runs, key, out, records, settings.keep_checkpoints, log).needed  # what run_all would execute
    for r in runs:
        done = r.name not in needed
        seconds, source = ledger.estimate(r, records, settings.profile, by_name)
        minutes = seconds / 60
        kind = "pretraining" if r.notebook == "pretrain" else "evaluation"
        left[kind] += 0 if done else minutes / 60
        kind = "data" if r.notebook == "data" else kind  # the world's shards: shared by every seed
        plan[kind] = plan.get(kind, 0.0) + minutes / 60
        count = flops(r) if flops else None
        aside = "; its folder holds a run with other parameters, to be moved aside" if superseded_key(
            run_dir(out, r), key[r.name]) else ""
        needs = ", ".join(r.deps[:4]) + (f", ... ({len(r.deps)} runs)" if len(r.deps) > 4 else "") or "nothing"
        tflop = f"; {count / 1e12:.1f} TFLOP" if count else ""
        log(f"{'done' if done else 'would run':9s} {r.name}  ({r.notebook}; ~{minutes:.0f} min"
            f"{f' ({source})' if source else ''}{tflop}; needs {needs}{aside})")
    pre, ev = plan.get("pretraining", 0.0), plan.get("evaluation", 0.0)
    log(f"about {sum(left.values()):.1f} run-hours left: {left['pretraining']:.1f} pretraining, "
        f"{left['evaluation']:.1f} evaluation; {sum(plan.values()):.1f} run-hours in this plan, {len(runs)} runs: "
        f"data {plan.get('data', 0.0):.2f}, pretraining {pre:.2f}, evaluation {ev:.2f} "
        f"({ev / (pre + ev) if pre + ev else 0:.0%} of the two)")


def _write_csv(out: str, runs: list[Run], outcome: dict, key: dict) -> None:
    """``out``/runs.csv: each run's status, seconds, peak memory and key (a run skipped keeps its measured ones)."""
    path = os.path.join(out, "runs.csv")
    previous = {}
    if os.path.isfile(path):
        with open(path) as f:
            previous = {row["name"]: row for row in csv.DictReader(f)}
    f = io.StringIO(newline="")  # written whole, then moved into place: a killed runner leaves the old file
    w = csv.DictWriter(f, ["name", "notebook", "status", "seconds", "peak_mb", "key"])
    w.writeheader()
    for r in runs:
        o = outcome.get(r.name, {})
        if o.get("status") == "skipped" and r.name in previous:  # keep the measured figures
            w.writerow({**previous[r.name], "status": "skipped", "key": key[r.name]})
        else:
            w.writerow({"name": r.name, "notebook": r.notebook, "status": o.get("status", "not run"),
                        "seconds": f"{o.get('seconds', 0):.1f}", "peak_mb": f"{o.get('peak_mb', 0):.0f}",
                        "key": key[r.name]})
    atomic_write_text(path, f.getvalue())
