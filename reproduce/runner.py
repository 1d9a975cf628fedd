"""Execute a registry of notebook runs with papermill: skip what is done, survive what fails.

Each run executes in its own subprocess (``python -m reproduce.execute``), so a crash, a
timeout or a memory blow-up stays inside it; its peak resident memory (the notebook kernel
included) comes from the operating system's accounting of the finished process tree.

Layout under ``<out>/<profile>/``::

    <run name>/<notebook>.ipynb   the executed notebook (kept, outputs included)
    <run name>/results.json       what the notebook wrote (mdc.eval.results)
    <run name>/done.json          {"key": ...} once the run succeeded
    runs.csv                      name, notebook, status, seconds, peak memory (MB), key

A run is done when its key (:mod:`reproduce.graph`: notebook code, parameters, dependencies) is
recorded. A failed run is reported and the runs that do not depend on it still execute; the runner
ends with a non-zero exit status if anything failed. Clusters: :mod:`reproduce.cluster`.

One folder, one run: an execution records its key in ``<run name>/run.json`` before its notebook
starts. A run that executes again with the same key continues in its folder (a pretraining run
resumes from its last checkpoint); a folder left by a run with another key is first moved aside
to ``<run name>.superseded-<its key>``, kept whole, and the log says so.

The ledger (:mod:`reproduce.ledger`): with ``records=DIR`` every run that succeeds writes one small
record into DIR, and a run whose record carries its current key counts as done even where no run
folder exists; it executes again only when a run that will execute needs its output (a checkpoint,
data), and the log says so. With ``time_budget_s`` the runner starts no run that its estimate (its
last record, or the profile's default) with its longest reader's after it says would not finish in
time, lets the running ones finish and returns with the rest ``left``; of the runs ready at once, the
deeper ones go first, then a seed's before the next seed's, then the head of the longest such chain.
Once every run that reads a pretraining run's checkpoints has a record, its checkpoints are removed
(``keep_checkpoints`` keeps them) and its folder no longer counts as done: the record stands for it.

One owner: a runner holds ``<out>/<profile>/.reproduce.lock`` (:mod:`mdc.lock`) while it runs
(``only=`` a run, as a SLURM job does: that run's folder instead), so a second runner on the
same folder is refused at once, naming the first. A run about to execute loses its ``done.json``
first and gets it back (written atomically) only once its notebook succeeded and wrote
``results.json``: a run killed half-way is never counted as done, whatever it left behind. A
notebook dies with its runner: :mod:`reproduce.execute` watches its parent and ends its process
group when the runner is gone (the kernel follows its own parent), so a killed runner leaves no
notebook writing on into a run folder that the next runner executes again.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from mdc.checkpoint import atomic_write_text
from mdc.eval.results import read_results
from mdc.lock import FolderLock
from reproduce import graph, ledger
from reproduce.cluster import torchrun_command
from reproduce.graph import ROOT, Run, code_digest, keys, order, resolve, run_dir

RUNNER_LOCK = ".reproduce.lock"


def is_done(out: str, run: Run, key: str) -> bool:
    try:
        with open(os.path.join(run_dir(out, run), "done.json")) as f:
            return json.load(f)["key"] == key and os.path.isfile(os.path.join(run_dir(out, run), "results.json"))
    except (OSError, ValueError, KeyError):
        return False


def recorded_key(folder: str) -> str | None:
    """The key of the run that last executed in ``folder`` (None: no run recorded there)."""
    for name in ("run.json", "done.json"):  # done.json alone: a folder written before run.json existed
        with contextlib.suppress(OSError, ValueError, KeyError):
            with open(os.path.join(folder, name)) as f:
                return json.load(f)["key"]
    return None


def superseded_key(folder: str, key: str) -> str | None:
    """The key of another run that last executed in ``folder`` (None: none there, or this ``key``)."""
    old = recorded_key(folder)
    return None if old == key else old


def set_aside(out: str, run: Run, key: str) -> str | None:
    """Move what another run of this name left (another key) out of ``run``'s way; returns where.

    Everything moves but the runner's lock (a cluster job's ``--run`` holds it in this folder), the
    run records last: a move cut short leaves the old key recorded, so the next try finishes it."""
    folder = run_dir(out, run)
    old = superseded_key(folder, key)
    if old is None:
        return None
    target, n = f"{folder}.superseded-{old}", 1
    while os.path.exists(target):
        target, n = f"{folder}.superseded-{old}-{n}", n + 1
    os.makedirs(target)
    records = ("run.json", "done.json")
    for name in sorted(os.listdir(folder), key=lambda name: name in records):
        if name != RUNNER_LOCK:
            os.rename(os.path.join(folder, name), os.path.join(target, name))
    return target


def earlier_seconds(folder: str, key: str) -> float:
    """Wall seconds that unfinished attempts of the run ``key`` spent in ``folder`` before this one: those
    the runner saw end (``earlier_s``), and one it did not (the runner itself was stopped: ``started`` is
    still set) from its start to its log's last write. Another run's attempts (another key) count nothing."""
    try:
        with open(os.path.join(folder, "run.json")) as f:
            prior = json.load(f)
    except (OSError, ValueError):
        return 0.0
    if not isinstance(prior, dict) or prior.get("key") != key:
        return 0.0
    seconds = float(prior.get("earlier_s", 0.0))
    if "started" in prior:
        with contextlib.suppress(OSError):
            seconds += max(0.0, os.path.getmtime(os.path.join(folder, "log.txt")) - float(prior["started"]))
    return seconds


def execute(out: str, run: Run, key: str, torchrun: tuple[int, int] | None = None) -> dict:
    """Run one notebook in a subprocess; returns {status, seconds, peak_mb, error}, ``seconds`` being the
    run's wall time over all its attempts (:func:`earlier_seconds`), so a resumed run's record is whole.

    ``torchrun=(gpus_per_node, nodes)``: a pretraining run executes as ``torchrun -m mdc.train``.
    """
    folder = run_dir(out, run)
    os.makedirs(folder, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # not done until this execution succeeds
        os.remove(os.path.join(folder, "done.json"))
    earlier = earlier_seconds(folder, key)
    atomic_write_text(os.path.join(folder, "run.json"),
                      json.dumps({"key": key, "started": time.time(), "earlier_s": earlier}))
    params = resolve(run.params, out)
    params_file = os.path.join(folder, "parameters.json")
    with open(params_file, "w") as f:
        json.dump(params, f, indent=1)
    if torchrun and run.gpus:
        cmd = [sys.executable, "-m", "reproduce.execute", "--command", torchrun_command(run, out, *torchrun),
               "--results", os.path.join(folder, "results.json"), params_file]
    else:
        cmd = [sys.executable, "-m", "reproduce.execute", os.path.join(graph.NOTEBOOKS, f"{run.notebook}.ipynb"),
               os.path.join(folder, f"{run.notebook}.ipynb"), params_file]
    log = open(os.path.join(folder, "log.txt"), "w")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                                     MDC_RUNNER_PID=str(os.getpid())))
    status, rusage = "ok", None
    while rusage is None:
        pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            rusage = usage
            if code:
                status = "failed"
        elif time.perf_counter() - start > run.timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)  # the notebook process and its kernel
            _, _, rusage = os.wait4(proc.pid, 0)
            status = "timeout"
        else:
            time.sleep(0.2)
    proc.returncode = 0  # reaped by wait4 above
    log.close()
    seconds = time.perf_counter() - start + earlier
    if status == "ok" and not os.path.isfile(os.path.join(folder, "results.json")):
        status = "failed"
    error = ""
    if status != "ok":  # the attempt ended and counts toward the next one
        atomic_write_text(os.path.join(folder, "run.json"), json.dumps({"key": key, "earlier_s": seconds}))
        with open(os.path.join(folder, "log.txt")) as f:
            error = f.read()[-2000:]
    else:
        atomic_write_text(os.path.join(folder, "run.json"), json.dumps({"key": key}))
        atomic_write_text(os.path.join(folder, "done.json"), json.dumps({"key": key, "seconds": seconds}))
    return {"status": status, "seconds": seconds, "cpu_seconds": rusage.ru_utime + rusage.ru_stime,
            "peak_mb": rusage.ru_maxrss / 1024, "error": error}


READS_RECORDS_ONLY = ("figures",)  # notebooks that need their dependencies' records, not their folders


def run_all(runs: list[Run], out: str, jobs: int = 1, dry_run: bool = False, log=print,
            torchrun: tuple[int, int] | None = None, only: set[str] | None = None, records: str | None = None,
            time_budget_s: float | None = None, keep_checkpoints: bool = True, profile: str = "",
            flops=None) -> dict[str, dict]:
    """Execute ``runs`` (dependencies first, ``jobs`` at a time); returns {name: outcome}.

    ``only``: execute just these runs of the graph (a cluster job each), taking the others as done.
    The runner holds ``out``'s lock meanwhile (with ``only``: those runs' folders'); another holder
    makes it raise :class:`mdc.lock.FolderInUseError` before anything runs. ``dry_run`` takes no
    lock and writes nothing (``flops(run)``: FLOPs it prints beside a run, or None). ``records``,
    ``time_budget_s``, ``keep_checkpoints``: the ledger, the time box and the checkpoints' removal (module
    docstring); ``profile`` picks the default estimates.
    """
    runs = order(runs)
    key = keys(runs)
    if dry_run:
        _plan(runs, key, out, records, profile, log, flops)
        return {}
    if only is not None:
        unknown = set(only) - {r.name for r in runs}
        if unknown:
            raise ValueError(f"unknown run(s) {sorted(unknown)}")
    hint = "wait for it to end, or give another --out"
    folders = [out] if only is None else [run_dir(out, r) for r in runs if r.name in only]
    with contextlib.ExitStack() as held:
        for folder in folders:
            held.enter_context(FolderLock(folder, RUNNER_LOCK, "a reproduction runner", hint))
        book = _Book(runs, key, out, records, keep_checkpoints or only is not None, log)
        return _run_all(runs, book, jobs, torchrun, only, time_budget_s, profile)


def _plan(runs, key, out, records, profile, log, flops=None) -> None:
    """--dry-run: each run's state, estimated minutes (and FLOPs, ``flops(run)`` where it counts them), and
    the run-hours left, by kind (pretraining, evaluation)."""
    left = {"pretraining": 0.0, "evaluation": 0.0}
    for r in runs:
        done = is_done(out, r, key[r.name]) or ledger.done(records, r.name, key[r.name])
        minutes = ledger.estimate_seconds(r, records, profile) / 60
        kind = "pretraining" if r.notebook == "pretrain" else "evaluation"
        left[kind] += 0 if done else minutes / 60
        count = flops(r) if flops else None
        aside = "; its folder holds a run with other parameters, to be moved aside" if superseded_key(
            run_dir(out, r), key[r.name]) else ""
        needs = ", ".join(r.deps[:4]) + (f", ... ({len(r.deps)} runs)" if len(r.deps) > 4 else "") or "nothing"
        log(f"{'done' if done else 'would run':9s} {r.name}  ({r.notebook}; ~{minutes:.0f} min"
            f"{f'; {count / 1e12:.1f} TFLOP' if count else ''}; needs {needs}{aside})")
    log(f"about {sum(left.values()):.1f} run-hours left: {left['pretraining']:.1f} pretraining, "
        f"{left['evaluation']:.1f} evaluation")


class _Book:
    """What is done and where: run folders, the ledger, the records to write and the checkpoints to free."""

    def __init__(self, runs, key, out, records, keep_checkpoints, log):
        self.runs, self.key, self.out, self.records, self.keep, self.log = runs, key, out, records, keep_checkpoints, log
        self.digest = {nb: code_digest(os.path.join(graph.NOTEBOOKS, f"{nb}.ipynb")) for nb in {r.notebook for r in runs}}
        self.in_folder = {r.name for r in runs if is_done(out, r, key[r.name])}
        self.recorded = {r.name for r in runs if ledger.done(records, r.name, key[r.name])}
        self.needed = self._needed()

    def _needed(self) -> set[str]:
        """Runs to execute: those not done, and the recorded runs whose output (folder) one of them reads."""
        needed = {r.name for r in self.runs if r.name not in self.in_folder | self.recorded}
        for r in reversed(self.runs):  # dependants first
            if r.name in needed and r.notebook not in READS_RECORDS_ONLY:
                for d in r.deps:
                    if d not in self.in_folder and d not in needed:
                        needed.add(d)
                        self.log(f"{d}: recorded, but {r.name} reads its output, which is not here: it executes again")
        return needed

    def record(self, r: Run, outcome: dict) -> None:
        """Write ``r``'s record from its folder's results.json (a run just done, or done before the ledger)."""
        if not self.records or r.notebook in READS_RECORDS_ONLY:  # the figures are built from records, not one
            return
        results = read_results(os.path.join(run_dir(self.out, r), "results.json"))
        ledger.write(self.records, r, self.key[r.name], results, self.out, self.digest[r.notebook], outcome)
        self.recorded.add(r.name)

    def free_checkpoints(self) -> None:
        """Remove the checkpoints of runs whose every reader has a record (unless kept)."""
        if self.keep or not self.records:
            return
        for r in self.runs:
            folder = os.path.join(run_dir(self.out, r), "checkpoints")
            readers = [d.name for d in self.runs if r.name in d.deps and d.notebook not in READS_RECORDS_ONLY]
            if readers and os.path.isdir(folder) and set(readers) <= self.recorded and r.name in self.recorded:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(run_dir(self.out, r), "done.json"))  # the record stands for it now
                shutil.rmtree(folder)
                self.in_folder.discard(r.name)
                self.log(f"{r.name}: every run that reads its checkpoints is recorded; checkpoints removed")


def _run_all(runs, book: _Book, jobs, torchrun, only, budget_s, profile) -> dict[str, dict]:
    out, key, log = book.out, book.key, book.log
    start = time.perf_counter()
    outcome: dict[str, dict] = {}
    if only is not None:
        outcome = {r.name: _quiet("skipped") for r in runs if r.name not in only}
        book.needed = set(only)
    pending = [r for r in runs if r.name not in outcome]
    total = len(runs)
    depth: dict[str, int] = {}
    readers: dict[str, list[Run]] = {r.name: [] for r in runs}
    for r in runs:  # dependencies first (order()), so theirs are known
        depth[r.name] = 1 + max((depth[d] for d in r.deps), default=-1)
        for d in r.deps:
            readers[d].append(r)

    def status(d: str) -> str | None:
        return outcome.get(d, {}).get("status")

    def reach(r: Run) -> int:
        """The depth of the deepest run that ``r`` would make ready (its own if none): depth first."""
        ready_after = [depth[x.name] for x in readers[r.name] if x.notebook not in READS_RECORDS_ONLY
                       and all(d == r.name or status(d) in ("ok", "skipped") for d in x.deps)]
        return max([depth[r.name], *ready_after])

    estimate = {r.name: ledger.estimate_seconds(r, book.records, profile) for r in runs}

    def chain(r: Run) -> float:
        """``r``'s estimate and its longest reader's still to run: the time before its output has served."""
        follow = [estimate[x.name] for x in readers[r.name] if x.notebook not in READS_RECORDS_ONLY
                  and x.name in book.needed and status(x.name) is None]
        return estimate[r.name] + max(follow, default=0.0)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        running = {}
        while pending or running:
            for r in list(pending):  # dependencies first: settle what is blocked, left or completed earlier
                if any(status(d) == "left" for d in r.deps):
                    outcome[r.name] = _quiet("left")
                elif any(status(d) not in (None, "ok", "skipped") for d in r.deps):
                    failed = [d for d in r.deps if status(d) not in ("ok", "skipped")]
                    outcome[r.name] = _quiet("blocked", f"dependency failed: {', '.join(failed)}")
                    log(f"[{len(outcome)}/{total}] blocked  {r.name} (a dependency failed)")
                elif r.name not in book.needed and all(status(d) in ("ok", "skipped") for d in r.deps):
                    outcome[r.name] = _quiet("skipped")
                    if r.name not in book.recorded:
                        book.record(r, {"seconds": 0.0})  # done before the ledger: its record, from its folder
                    log(f"[{len(outcome)}/{total}] done     {r.name} (completed earlier, same parameters)")
                else:
                    continue
                pending.remove(r)
            # then depth first: the runs that make the deepest runs ready, deeper ones first, so a seed's
            # evaluations (and the data only they read) follow its pretraining run instead of waiting behind
            # every other pretraining run (results sooner, few checkpoints waiting for their evaluations);
            # then a seed's runs before the next seed's, and the longest chain first, so the longest evaluation
            # starts early in a time box.
            # Under a budget a run starts only if its longest reader can follow it: a checkpoint left unread is
            # trained again by the next part
            ready = [r for r in pending if all(status(d) in ("ok", "skipped") for d in r.deps)]
            for r in sorted(ready, key=lambda r: (-reach(r), -depth[r.name], r.labels.get("seed", -1), -chain(r))):
                if len(running) >= max(1, jobs):
                    break
                pending.remove(r)
                elapsed = time.perf_counter() - start
                if budget_s is not None and elapsed + chain(r) > budget_s:
                    outcome[r.name] = _quiet("left")
                    continue
                moved = set_aside(out, r, key[r.name])
                if moved:
                    log(f"{r.name}: its folder held a run with other parameters; moved to {moved}")
                log(f"[{len(outcome) + len(running) + 1}/{total}] running  {r.name}")
                running[pool.submit(execute, out, r, key[r.name], torchrun)] = r
            if running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    r = running.pop(fut)
                    o = outcome[r.name] = fut.result()
                    if o["status"] == "ok":
                        book.in_folder.add(r.name)
                        book.record(r, o)
                        book.free_checkpoints()
                    log(f"[{len(outcome)}/{total}] {o['status']:8s} {r.name} in {o['seconds']:.0f} s, "
                        f"peak {o['peak_mb']:.0f} MB")
    _write_csv(out, runs, outcome, key)
    return outcome


def _quiet(status: str, error: str = "") -> dict:
    """The outcome of a run that did not execute."""
    return {"status": status, "seconds": 0.0, "peak_mb": 0.0, "error": error}


def _write_csv(out: str, runs: list[Run], outcome: dict, key: dict) -> None:
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


