"""A run's folder, ``<out>/<profile>/<run name>/``: whether it holds the run done, which run last
executed there, the time that run's unfinished attempts spent, and moving aside what a run with other
parameters left.

Each execution records its key in ``run.json`` before its notebook starts (with its start time and
the seconds of the attempts before it) and ``done.json`` once it succeeded and wrote ``results.json``;
a run is done in its folder when ``done.json`` carries its current key and ``results.json`` is there.
A folder left by a run with another key is moved aside to ``<run name>.superseded-<its key>``, kept
whole (:func:`set_aside`).
"""
from __future__ import annotations

import contextlib
import json
import os

from reproduce.graph import Run, run_dir

RUNNER_LOCK = ".reproduce.lock"  # held by a runner in its output folder (a cluster job's: its run's folder)


def is_done(out: str, run: Run, key: str) -> bool:
    """Whether ``run``'s folder holds it done with ``key``: its ``done.json`` names the key, its results are there."""
    try:
        with open(os.path.join(run_dir(out, run), "done.json")) as f:
            return json.load(f)["key"] == key and os.path.isfile(os.path.join(run_dir(out, run), "results.json"))
    except (OSError, ValueError, KeyError):
        return False


def done_seconds(out: str, run: Run) -> float:
    """The wall seconds ``run``'s folder says it took (its ``done.json``); 0 where it does not say."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(os.path.join(run_dir(out, run), "done.json")) as f:
            return float(json.load(f)["seconds"])
    return 0.0


def recorded_key(folder: str) -> str | None:
    """The key of the run that last executed in ``folder`` (None: no run recorded there): its ``run.json``'s,
    written before its notebook starts."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        with open(os.path.join(folder, "run.json")) as f:
            return json.load(f)["key"]
    return None


def superseded_key(folder: str, key: str) -> str | None:
    """The key of another run that last executed in ``folder`` (None: none there, or this ``key``)."""
    old = recorded_key(folder)
    return None if old == key else old


def set_aside(out: str, run: Run, key: str) -> str | None:
    """Move what another run of this name left (another key) out of ``run``'s way; returns where.

    Everything moves but the runner's lock (a cluster job's ``--run`` holds it in this folder), the
    run records last and ``run.json`` the very last: a move cut short leaves the old key recorded, so the
    next try finishes it."""
    folder = run_dir(out, run)
    old = superseded_key(folder, key)
    if old is None:
        return None
    target, n = f"{folder}.superseded-{old}", 1
    while os.path.exists(target):
        target, n = f"{folder}.superseded-{old}-{n}", n + 1
    os.makedirs(target)
    records = ("done.json", "run.json")
    for name in sorted(os.listdir(folder), key=lambda name: records.index(name) + 1 if name in records else 0):
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
