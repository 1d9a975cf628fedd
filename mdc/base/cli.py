"""How the command lines report what went wrong: one line, ``error: ...``, and argparse's exit codes.

The command lines (``python -m mdc.train``, ``python -m mdc.world.scenes``, ``python -m
mdc.data.convert``, ``python -m reproduce``) parse with :class:`ArgumentParser` and run their
work through :func:`report`: a bad value (:class:`mdc.base.errors.ConfigError`) or a usage error prints
one line on stderr with the options written as flags, ``error: --batch-size must be >= 1, got 0``,
and exits with status 2 (argparse's convention); an expected failure (``ValueError``, ``OSError``,
:class:`mdc.base.errors.RunError`) prints ``error: ...`` and exits with status 1. ``--debug`` or the
environment variable ``MDC_DEBUG=1`` lets the exception through with its traceback. Anything else
is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Iterable, TypeVar

from mdc.base.errors import ConfigError, RunError

__all__ = ["ArgumentParser", "DEBUG_ENV", "debugging", "flags", "report"]

DEBUG_ENV = "MDC_DEBUG"
T = TypeVar("T")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, ``error: ...``, with exit status 2."""

    def error(self, message: str):
        _say(message)
        raise SystemExit(2)


def flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{destination: its flag} of a parser's options (the longest spelling)."""
    return {a.dest: max(a.option_strings, key=len) for a in parser._actions if a.option_strings}


def debugging(argv_flag: bool = False) -> bool:
    """``--debug`` was given or ``MDC_DEBUG`` is set (to anything but 0 or nothing)."""
    return argv_flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report(work: Callable[[], T], parser: argparse.ArgumentParser | None = None, debug: bool = False,
           expected: Iterable[type[BaseException]] = (ValueError, OSError, RunError),
           ends_process: Iterable[type[BaseException]] = ()) -> T:
    """``work()``; a :class:`ConfigError` exits 2 and an ``expected`` error exits 1, each after one
    ``error: ...`` message on stderr, unless debugging (then it propagates with its traceback).

    An error of ``ends_process`` ends the process at once after its message (or its traceback, when
    debugging), without the interpreter's teardown: one that leaves native threads the teardown would
    wait for forever (a rank that lost its peers, see :class:`mdc.train.PeerLostError`)."""
    try:
        return work()
    except ConfigError as exn:
        if debugging(debug):
            raise
        _say(exn.flagged(flags(parser)) if parser is not None else str(exn))
        raise SystemExit(2) from None
    except tuple(expected) as exn:
        if isinstance(exn, tuple(ends_process)):
            if debugging(debug):
                traceback.print_exc()
            else:
                _say(str(exn))
            _end_now(1)
        if debugging(debug):
            raise
        if isinstance(exn, OSError) and exn.strerror:  # "No space left on device: 'path'", not "[Errno 28] ..."
            _say(exn.strerror + (f": {exn.filename!r}" if exn.filename else ""))
        else:
            _say(str(exn) or type(exn).__name__)
        raise SystemExit(1) from None


def _end_now(status: int) -> None:
    """Exit with ``status`` now, once what was printed is flushed (``os._exit``: no atexit handlers, no
    teardown of the objects still alive)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _say(message: str) -> None:
    rank = os.environ.get("RANK")  # under torchrun every rank reports: say which
    prefix = f"rank {rank}: " if rank not in (None, "0") else ""
    print(f"{prefix}error: {message}", file=sys.stderr, flush=True)
