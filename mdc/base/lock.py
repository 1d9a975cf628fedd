"""One owner per folder: an exclusive OS lock that a process holds on a folder for its whole life.

:class:`FolderLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a lock file inside the folder
(``.train.lock`` for a training run, ``.reproduce.lock`` for the reproduction runner,
``.shards.lock`` for shard writing) and writes its holder into it: pid, host, start time and
command. A second process that asks for the same folder is refused at once with a
:class:`FolderInUseError` naming the folder and the holder (if it caught the holder between its lock
and its writing, it waits up to ``NAME_WAIT_S`` for the name). The kernel releases the lock when
the holder exits, however it exits: a SIGKILL or a lost machine leaves no stale lock (a leftover
lock *file* is harmless; the next owner locks it again). Children forked by the holder (DataLoader
workers, multiprocessing pools) close their copy of the descriptor at once, so a killed holder's
lock is free even while its workers are still winding down.

A lock released normally removes its file, so a finished run leaves no trace. Taking the lock
checks that the file it locked is still the one at the path (else it retries), which keeps that
removal race-free. ``flock`` is local to a machine on most network file systems' older clients;
on NFSv4 (Linux) it is honoured across clients.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time

from mdc.base.errors import RunError

__all__ = ["FolderInUseError", "FolderLock", "holder"]

_HELD: set[int] = set()  # descriptors of the locks this process holds
NAME_WAIT_S = 2.0  # how long a refused caller waits for a holder that has not yet written who it is


def _close_in_child() -> None:
    """After a fork: the child lets go of its copies (the parent's locks stay held by the parent)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class FolderInUseError(RunError):
    """Another process holds the folder's lock; ``holder`` is what it wrote (pid, host, ...), or {}."""

    def __init__(self, message: str, folder: str, holder: dict):
        super().__init__(message)
        self.folder, self.holder = folder, holder


def holder(path: str) -> dict:
    """What the holder of the lock file ``path`` wrote into it ({} if nothing readable)."""
    try:
        with open(path) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


class FolderLock:
    """An exclusive lock on ``folder`` (created if missing), taken by :meth:`acquire` or ``with``.

    ``owner`` says what holds it ("a training"), ``hint`` what a refused caller may do instead
    (both appear in the refusal). ``name`` is the lock file's name inside the folder.
    """

    def __init__(self, folder: str, name: str, owner: str = "another process", hint: str = ""):
        self.folder, self.owner, self.hint = os.path.abspath(folder), owner, hint
        self.path = os.path.join(self.folder, name)
        self.fd: int | None = None

    def acquire(self) -> "FolderLock":
        if self.fd is not None:
            raise RuntimeError(f"{self.path} is already held by this FolderLock")
        os.makedirs(self.folder, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._refusal() from None
            except BaseException:
                os.close(fd)
                raise
            try:  # the holder before us may have removed the file after we opened it: lock the one at the path
                mine, there = os.fstat(fd), os.stat(self.path)
                same = (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                "owner": self.owner, "command": " ".join(sys.argv)[:500]}
        data = json.dumps(info).encode()
        os.pwrite(fd, data, 0)  # then cut what a previous holder left beyond it: the file is never empty
        os.ftruncate(fd, len(data))
        self.fd = fd
        _HELD.add(fd)
        return self

    def _refusal(self) -> FolderInUseError:
        deadline = time.monotonic() + NAME_WAIT_S  # a holder names itself just after its flock succeeds
        while not (info := holder(self.path)).get("pid") and time.monotonic() < deadline:
            time.sleep(0.01)
        who = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
        if info.get("since"):
            who += f", since {info['since']}"
        what = info.get("owner") or "another process"
        return FolderInUseError(f"{self.folder} is in use by {what} ({who}): a folder has one owner at a time"
                                + (f"; {self.hint}" if self.hint else ""), self.folder, info)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.remove(self.path)  # still ours: nobody else can hold it while we do
        except OSError:
            pass
        _HELD.discard(self.fd)
        os.close(self.fd)  # closing the last descriptor releases the lock
        self.fd = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
