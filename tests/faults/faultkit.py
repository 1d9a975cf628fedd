"""What the fault suite (tests/faults/test_faults.py) runs in its child processes: a training attempt through
the command line's own entry point, optionally with a fault injected from inside.

The children are forked from a multiprocessing forkserver that has imported mdc.train once, so an
attempt starts in a fraction of a second and a kill cycle takes about one. Nothing here changes
what the trainer does: faults are injected by wrapping the functions a checkpoint save calls.
"""
import errno
import multiprocessing
import os
import shutil
import signal
import sys

import safetensors.torch
import torch

import mdc.train
import mdc.train.cli
from mdc.base import checkpoint


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _in_save(after_calls: int, save_index: int, action):
    """Wrap what checkpoint.save calls (the weights' and trainer state's writes, fsyncs, renames,
    removals): during the
    ``save_index``-th save of this attempt, run ``action`` at its ``after_calls``-th call (or once
    the save returns, if it makes fewer)."""
    state = {"save": 0, "calls": 0, "active": False}

    def tick():
        if state["active"] and state["save"] == save_index:
            state["calls"] += 1
            if state["calls"] == after_calls:
                action()

    def wrap(module, name):
        real = getattr(module, name)

        def wrapped(*args, **kw):
            tick()
            return real(*args, **kw)

        setattr(module, name, wrapped)

    wrap(safetensors.torch, "save_file")
    wrap(checkpoint, "fsync_path")
    wrap(checkpoint.torch, "save")
    wrap(os, "replace")
    wrap(shutil, "rmtree")
    save = checkpoint.save

    def watched(*args, **kw):
        state["save"] += 1
        state["active"] = True
        try:
            path = save(*args, **kw)
        finally:
            state["active"] = False
        if state["save"] == save_index and state["calls"] < after_calls:
            action()  # fewer calls than that: right after the save
        return path

    checkpoint.save = watched


def _no_space():
    raise OSError(errno.ENOSPC, "No space left on device")


def attempt(argv: list[str], log: str, fault: dict | None = None) -> None:
    """Run ``python -m mdc.train ARGV`` in this (forked) process; stdout and stderr go to ``log``.

    ``fault``: {"kind": "kill_in_save" | "enospc_in_save", "save": k, "call": c}, or
    {"kind": "enospc_in_metrics", "line": n} (the n-th metrics line of this attempt fails).
    """
    os.setsid()  # its own process group: the suite kills it with its loader workers
    multiprocessing.set_start_method("fork", force=True)  # loader workers as python -m mdc.train starts them
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    torch.set_num_threads(1)
    fault = fault or {}
    if fault.get("kind") == "kill_in_save":
        _in_save(fault["call"], fault["save"], _kill_self)
    elif fault.get("kind") == "enospc_in_save":
        _in_save(fault["call"], fault["save"], _no_space)
    elif fault.get("kind") == "enospc_in_metrics":
        write, lines = checkpoint.MetricsLog.write, {"n": 0}

        def full(self, row):
            lines["n"] += 1
            if lines["n"] == fault["line"]:
                raise OSError(errno.ENOSPC, "No space left on device", self.path)
            write(self, row)

        checkpoint.MetricsLog.write = full
    try:
        mdc.train.cli.main(argv)
    except SystemExit as exn:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exn.code if isinstance(exn.code, int) else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
