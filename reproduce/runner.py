"""Execute a registry of notebook runs with papermill: skip what is done, survive what fails.

Each run executes in its own subprocess (``python -m reproduce.execute``), so a crash, a
timeout or a memory blow-up stays inside it; its peak resident memory (the notebook kernel
included) comes from the operating system's accounting of the finished process tree.

Layout under ``<out>/<profile>/``::

    <run name>/<notebook>.ipynb   the executed notebook (kept, outputs included)
    <run name>/results.json       what the notebook wrote (mdc.eval.results)
    <run name>/done.json          {"key": ...} once the run succeeded
    index.json                    every run: notebook, parameters, labels, artifacts, results path
    runs.csv                      name, notebook, status, seconds, peak memory (MB), key

A run's *key* hashes its notebook's code cells, its parameters and the keys of the runs it depends
on, so changing a parameter reruns that run and everything downstream of it, and nothing else; a
notebook saved from Jupyter with outputs, metadata or a markdown note keeps its runs.
Parameters that only steer bookkeeping (checkpoint cadence, resumption: the trainer's
``RESUME_FREE`` but for the run's folder) stay out of the key. A failed run is reported and the
runs that do not depend on it still execute; the runner ends with a non-zero exit status if
anything failed.

One folder, one run: an execution records its key in ``<run name>/run.json`` before its notebook
starts. A run that executes again with the same key continues in its folder (a pretraining run
resumes from its last checkpoint); a folder left by a run with another key is first moved aside
to ``<run name>.superseded-<its key>``, kept whole, and the log says so.

The ledger (:mod:`reproduce.ledger`): with ``records=DIR`` every run that succeeds writes one small
record into DIR, and a run whose record carries its current key counts as done even where no run
folder exists; it executes again only when a run that will execute needs its output (a checkpoint,
data), and the log says so. With ``time_budget_s`` the runner starts no run that its estimate (its
last record, or the profile's default) says would not finish in time, lets the running ones finish
and returns with the rest ``left``. Once every run that reads a pretraining run's checkpoints has a
record, its checkpoints are removed (``keep_checkpoints`` keeps them) and its folder no longer counts
as done: the record stands for it.

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
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import nbformat

from mdc.checkpoint import atomic_write_text
from mdc.lock import FolderLock
from mdc.train.config import RESUME_FREE
from reproduce import ledger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
RUNNER_LOCK = ".reproduce.lock"
# parameters that change no result, so not a run's key: the trainer's RESUME_FREE but the run's own folder
BOOKKEEPING = tuple(name for name in RESUME_FREE if name != "output_dir")


@dataclass(frozen=True)
class Run:
    """One notebook execution of the reproduction."""

    name: str  # unique within a profile, also its folder: "pretrain/mdc-alt-s0"
    notebook: str  # notebooks/<notebook>.ipynb
    params: dict  # papermill parameters; "{run:<name>}" in a string is replaced by that run's folder
    deps: tuple[str, ...] = ()  # runs that must succeed first
    artifacts: tuple[str, ...] = ()  # the paper artifacts it feeds
    labels: dict = field(default_factory=dict)  # what the figures need to place it (method, style, seed, ...)
    timeout_s: int = 3600
    gpus: int = 0  # > 1: a pretraining run that may execute under torchrun (see torchrun_command)


def run_dir(out: str, run: Run) -> str:
    return os.path.join(out, run.name)


def resolve(value, out: str):
    """Replace ``{run:<name>}`` in strings (recursively) with ``<out>/<name>``."""
    if isinstance(value, str):
        while "{run:" in value:
            start = value.index("{run:")
            end = value.index("}", start)
            value = value[:start] + os.path.join(out, value[start + 5 : end]) + value[end + 1 :]
        return value
    if isinstance(value, dict):
        return {k: resolve(v, out) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve(v, out) for v in value]
    return value


def code_digest(path: str) -> str:
    """sha256 of a notebook's code cells: saving it with outputs, counts, metadata or prose keeps it."""
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()


def keys(runs: list[Run]) -> dict[str, str]:
    """Content key of every run: its notebook's code, parameters and the keys of its dependencies."""
    by_name, out = {r.name: r for r in runs}, {}
    code = {nb: code_digest(os.path.join(NOTEBOOKS, f"{nb}.ipynb")) for nb in {r.notebook for r in runs}}

    def key(name: str) -> str:
        if name not in out:
            r = by_name[name]
            nb = code[r.notebook]
            params = {k: v for k, v in r.params.items() if k not in BOOKKEEPING}
            payload = json.dumps([r.notebook, nb, params, [key(d) for d in r.deps]], sort_keys=True)
            out[name] = hashlib.sha256(payload.encode()).hexdigest()[:16]
        return out[name]

    for r in runs:
        key(r.name)
    return out


def order(runs: list[Run]) -> list[Run]:
    """Topological order (dependencies first); errors on unknown or circular dependencies."""
    by_name = {r.name: r for r in runs}
    done, seen, out = set(), set(), []

    def visit(r: Run):
        if r.name in done:
            return
        if r.name in seen:
            raise ValueError(f"circular dependency at run {r.name!r}")
        seen.add(r.name)
        for d in r.deps:
            if d not in by_name:
                raise ValueError(f"run {r.name!r} depends on unknown run {d!r}")
            visit(by_name[d])
        done.add(r.name)
        out.append(r)

    for r in runs:
        visit(r)
    return out


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


def execute(out: str, run: Run, key: str, torchrun: tuple[int, int] | None = None) -> dict:
    """Run one notebook in a subprocess; returns {status, seconds, peak_mb, error}.

    ``torchrun=(gpus_per_node, nodes)``: a pretraining run executes as ``torchrun -m mdc.train``.
    """
    folder = run_dir(out, run)
    os.makedirs(folder, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # not done until this execution succeeds
        os.remove(os.path.join(folder, "done.json"))
    atomic_write_text(os.path.join(folder, "run.json"), json.dumps({"key": key}))
    params = resolve(run.params, out)
    params_file = os.path.join(folder, "parameters.json")
    with open(params_file, "w") as f:
        json.dump(params, f, indent=1)
    if torchrun and run.gpus:
        cmd = [sys.executable, "-m", "reproduce.execute", "--command", torchrun_command(run, out, *torchrun),
               "--results", os.path.join(folder, "results.json"), params_file]
    else:
        cmd = [sys.executable, "-m", "reproduce.execute", os.path.join(NOTEBOOKS, f"{run.notebook}.ipynb"),
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
    seconds = time.perf_counter() - start
    if status == "ok" and not os.path.isfile(os.path.join(folder, "results.json")):
        status = "failed"
    error = ""
    if status != "ok":
        with open(os.path.join(folder, "log.txt")) as f:
            error = f.read()[-2000:]
    else:
        atomic_write_text(os.path.join(folder, "done.json"), json.dumps({"key": key, "seconds": seconds}))
    return {"status": status, "seconds": seconds, "cpu_seconds": rusage.ru_utime + rusage.ru_stime,
            "peak_mb": rusage.ru_maxrss / 1024, "error": error}


def write_index(out: str, runs: list[Run]) -> str:
    index = {r.name: {"notebook": r.notebook, "params": resolve(r.params, out), "labels": r.labels,
                      "artifacts": list(r.artifacts), "results": os.path.join(run_dir(out, r), "results.json")}
             for r in runs}
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "index.json")
    atomic_write_text(path, json.dumps(index, indent=1))
    return path


READS_RECORDS_ONLY = ("figures",)  # notebooks that need their dependencies' records, not their folders


def run_all(runs: list[Run], out: str, jobs: int = 1, dry_run: bool = False, log=print,
            torchrun: tuple[int, int] | None = None, only: set[str] | None = None, records: str | None = None,
            time_budget_s: float | None = None, keep_checkpoints: bool = True, profile: str = "") -> dict[str, dict]:
    """Execute ``runs`` (dependencies first, ``jobs`` at a time); returns {name: outcome}.

    ``only``: execute just these runs of the graph (a cluster job each), taking the others as done.
    The runner holds ``out``'s lock meanwhile (with ``only``: those runs' folders'); another holder
    makes it raise :class:`mdc.lock.FolderInUseError` before anything runs. ``dry_run`` takes no
    lock and writes nothing. ``records``, ``time_budget_s``, ``keep_checkpoints``: the ledger, the
    time box and the checkpoints' removal (module docstring); ``profile`` picks the default estimates.
    """
    runs = order(runs)
    key = keys(runs)
    if dry_run:
        _plan(runs, key, out, records, profile, log)
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


def _plan(runs, key, out, records, profile, log) -> None:
    """--dry-run: each run's state and estimated minutes, and the minutes left in all."""
    left = 0.0
    for r in runs:
        done = is_done(out, r, key[r.name]) or ledger.done(records, r.name, key[r.name])
        minutes = ledger.estimate_seconds(r, records, profile) / 60
        left += 0 if done else minutes
        aside = "; its folder holds a run with other parameters, to be moved aside" if superseded_key(
            run_dir(out, r), key[r.name]) else ""
        needs = ", ".join(r.deps[:4]) + (f", ... ({len(r.deps)} runs)" if len(r.deps) > 4 else "") or "nothing"
        log(f"{'done' if done else 'would run':9s} {r.name}  ({r.notebook}; ~{minutes:.0f} min; needs {needs}{aside})")
    log(f"about {left / 60:.1f} run-hours left")


class _Book:
    """What is done and where: run folders, the ledger, the records to write and the checkpoints to free."""

    def __init__(self, runs, key, out, records, keep_checkpoints, log):
        self.runs, self.key, self.out, self.records, self.keep, self.log = runs, key, out, records, keep_checkpoints, log
        self.digest = {nb: code_digest(os.path.join(NOTEBOOKS, f"{nb}.ipynb")) for nb in {r.notebook for r in runs}}
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
        results = read_results_file(os.path.join(run_dir(self.out, r), "results.json"))
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


def read_results_file(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _run_all(runs, book: _Book, jobs, torchrun, only, budget_s, profile) -> dict[str, dict]:
    out, key, log = book.out, book.key, book.log
    write_index(out, runs)
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
            # every other pretraining run (results sooner, few checkpoints waiting for their evaluations)
            ready = [r for r in pending if all(status(d) in ("ok", "skipped") for d in r.deps)]
            for r in sorted(ready, key=lambda r: (-reach(r), -depth[r.name])):
                if len(running) >= max(1, jobs):
                    break
                pending.remove(r)
                elapsed = time.perf_counter() - start
                if budget_s is not None and elapsed + ledger.estimate_seconds(r, book.records, profile) > budget_s:
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


# ----------------------------------------------------------------------------- clusters
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
    parts = ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={gpus}"]
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
    return " ".join(shlex.quote(x) if not x.startswith("--rdzv_endpoint") else x for x in parts)


def slurm_scripts(runs: list[Run], out: str, folder: str, profile: str, gpus: int = 8, nodes: int = 1,
                  account: str = "", partition: str = "") -> str:
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
            head += [f"#SBATCH --nodes={nodes}", f"#SBATCH --gres=gpu:{gpus}", "#SBATCH --ntasks-per-node=1",
                     f"#SBATCH --cpus-per-task={8 * gpus}"]
        else:
            head += ["#SBATCH --gres=gpu:1", "#SBATCH --cpus-per-task=8"]
        head += [f"#SBATCH --account={account}"] if account else []
        head += [f"#SBATCH --partition={partition}"] if partition else []
        body = ['export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"python -m reproduce --profile {profile} --out {shlex.quote(os.path.dirname(out))} "
                f"--run {shlex.quote(r.name)}" + (f" --gpus-per-node {gpus} --nodes {nodes}" if r.gpus else "")]
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
