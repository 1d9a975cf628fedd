"""One attempt at one run: its command, its subprocess under the run's timeout, its log, its outcome.

The run executes in its own subprocess (``python -m reproduce.running.execute``: papermill on its notebook,
or a pretraining command line under torchrun), in its own process group, so a crash, a timeout or a
memory blow-up stays inside it; a run past its timeout is killed with its notebook kernel. Its peak
resident memory (the kernel included) comes from the operating system's accounting of the finished
process tree. The attempt writes into the run's folder (:mod:`reproduce.running.folders`): ``run.json`` with
its key before it starts, ``parameters.json``, ``log.txt`` (the subprocess's output), and
``done.json`` only once it succeeded and wrote ``results.json``.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

from mdc.base.checkpoint import atomic_write_text
from mdc.base.processes import kill_tree
from reproduce import graph
from reproduce.running.cluster import torchrun_command
from reproduce.running.execute import SCIENCE
from reproduce.running.folders import earlier_seconds
from reproduce.running.ledger import threads
from reproduce.graph import ROOT, Run, resolve, run_dir


def command(out: str, run: Run, params_file: str, torchrun: tuple[int, int] | None = None,
            science: str | None = None) -> list[str]:
    """The command line of ``run``: its notebook (of the tree ``science`` where given) under papermill, or with
    ``torchrun=(gpus_per_node, nodes)`` a pretraining run as ``torchrun -m mdc.train``, or the figures built from
    the records (:data:`graph.CODE`); each way through ``python -m reproduce.running.execute``."""
    folder = run_dir(out, run)
    if run.notebook in graph.CODE:
        return [sys.executable, "-m", "reproduce.running.execute", "--figures", params_file]
    if torchrun and run.gpus:
        return [sys.executable, "-m", "reproduce.running.execute", "--command", torchrun_command(run, out, *torchrun),
                "--results", os.path.join(folder, "results.json"), params_file]
    return [sys.executable, "-m", "reproduce.running.execute", graph.code_file(run.notebook, science),
            os.path.join(folder, f"{run.notebook}.ipynb"), params_file]


def _wait(proc: subprocess.Popen, timeout_s: float, start: float) -> tuple[str, object]:
    """(status, resource usage) of ``proc`` once it ended: "ok", "failed" (a non-zero exit) or "timeout"
    (killed with its process group ``timeout_s`` after ``start``)."""
    status, rusage = "ok", None
    while rusage is None:
        pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            rusage = usage
            if code:
                status = "failed"
        elif time.perf_counter() - start > timeout_s:
            kill_tree(proc.pid)  # the notebook process, its kernel, and what they started in sessions of their own
            _, _, rusage = os.wait4(proc.pid, 0)
            status = "timeout"
        else:
            time.sleep(0.2)
    proc.returncode = 0  # reaped by wait4 above
    return status, rusage


def child_env(torchrun: tuple[int, int] | None = None, science: str | None = None) -> dict[str, str]:
    """A run's environment: this one, the tree on the path (and ``science``, the tree whose ``mdc`` the notebook's
    kernel imports: :data:`reproduce.running.execute.SCIENCE`), the runner's pid, and the thread count its record
    names (:func:`reproduce.running.ledger.threads`), so the count is set, not inherited by chance; under torchrun
    (a GPU run, named by its device) torchrun's own count per process stands."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MDC_RUNNER_PID=str(os.getpid()), **{SCIENCE: science} if science else {})
    return env if torchrun else {**env, "OMP_NUM_THREADS": str(threads())}


def run_attempt(out: str, run: Run, key: str, torchrun: tuple[int, int] | None = None,
                science: str | None = None) -> dict:
    """Run one notebook in a subprocess; returns {status, seconds, cpu_seconds, peak_mb, error}, ``seconds``
    being the run's wall time over all its attempts (:func:`reproduce.running.folders.earlier_seconds`), so a resumed
    run's record is whole. ``torchrun=(gpus_per_node, nodes)``: a pretraining run executes as
    ``torchrun -m mdc.train``. ``science``: the tree whose notebooks and ``mdc`` the run executes (a study's pin)."""
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
    cmd = command(out, run, params_file, torchrun, science)
    with open(os.path.join(folder, "log.txt"), "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env=child_env(torchrun, science))
        status, rusage = _wait(proc, run.timeout_s, start)
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
