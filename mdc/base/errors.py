"""What a user did wrong: the error types the library raises for bad values and stopped runs.

:class:`ConfigError` is a bad value of an option (a ``ValueError``, so existing handlers keep
working): its message names the option and the value, ``batch_size must be >= 1, got 0``, and
``names`` lists the options the message mentions. :class:`RunError` is a run that stopped for a
reason the user must act on (its folder is in use, a peer process died, the loss diverged).
:class:`WeightsError` is a weights file that is missing or corrupt, named in the message.
How the command lines print them is :mod:`mdc.base.cli`.
"""
from __future__ import annotations

import re
from typing import Mapping

__all__ = ["ConfigError", "RunError", "WeightsError", "must"]


class ConfigError(ValueError):
    """A bad value of an option. ``names``: the options the message mentions by name (the first
    leads it), which a command line rewrites as its flags."""

    def __init__(self, message: str, *names: str):
        super().__init__(message)
        self.names = names

    def flagged(self, flag_of: Mapping[str, str]) -> str:
        """The message with each of ``names`` written as its flag (``batch_size`` -> ``--batch-size``)."""
        text = str(self)
        for name in sorted(self.names, key=len, reverse=True):
            if name in flag_of:  # whole words only: not inside a longer name or an existing flag
                text = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", flag_of[name], text)
        return text


def must(name: str, value, need: str) -> ConfigError:
    """``ConfigError("<name> must be <need>, got <value>")``."""
    return ConfigError(f"{name} must be {need}, got {value!r}", name)


class RunError(RuntimeError):
    """A run stopped for a reason the user must act on; the message says what and what to do."""


class WeightsError(OSError):
    """A weights file (a checkpoint's or a shipped model's) is missing or does not hold what it should;
    the message names the file."""
