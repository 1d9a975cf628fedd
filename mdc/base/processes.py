"""Ending a process with everything it started, as a crash or a time limit should.

A process group is not enough: ``torchrun`` starts each worker in a session of its own, so a SIGKILL
to the launcher's group leaves the workers training on, holding their GPUs and writing into the run
folder (seen on the first GPU run). :func:`kill_tree` reads the process tree from ``/proc`` before it
kills, then ends the group and every process below the root.
"""
from __future__ import annotations

import os
import signal


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name, in parentheses, may hold spaces
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(0), [])
        found += below
        todo += below
    return found


def kill_tree(pid: int, group: bool = True) -> None:
    """SIGKILL every process below ``pid``, then ``pid``'s process group (``group``; ``pid`` leads it) or
    ``pid`` alone, last, so that a process may end its own tree; processes already gone are skipped. The
    caller still reaps its own child."""
    below = descendants(pid)
    targets = [(os.kill, p) for p in below] + [(os.killpg if group else os.kill, pid)]
    for kill, target in targets:
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
