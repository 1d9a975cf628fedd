"""Option sets: a function's settings travel as one small frozen dataclass, each default written once.

A function that takes one (:class:`mdc.absorbing.ElboOptions`, :class:`mdc.unmasking.Unmasking`,
:class:`mdc.base.optim.FitOptions`, :class:`mdc.data.pipeline.StreamOptions`,
:class:`mdc.eval.suites.LoadOptions`, :class:`mdc.eval.suite_scoring.SuiteOptions`,
:class:`mdc.eval.captioning.FinetuneOptions`, :class:`mdc.eval.captioning.CaptionOptions`) takes its few
essential arguments, ``options`` (None: the defaults) and any of the dataclass's fields as keywords,
which replace those of ``options``: ``make_loader(urls, tok, 64, 32, train=False)`` is
``make_loader(urls, tok, 64, 32, StreamOptions(train=False))``. :func:`with_options` turns them into
one instance; a keyword that is not a field is a :class:`~mdc.base.errors.ConfigError` (a ValueError)
naming it and the known ones.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, TypeVar

from mdc.base.errors import ConfigError

O = TypeVar("O")


def with_options(cls: type[O], options: O | None, changes: Mapping[str, object], what: str) -> O:
    """``options`` (None: the defaults) with the fields named in ``changes`` replaced; ``what`` names
    the option set in errors (``unknown stream option 'x'; known: [...]``)."""
    if options is not None and not isinstance(options, cls):
        raise TypeError(f"options must be a {cls.__name__}, got {type(options).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    for name in changes:
        if name not in known:
            raise ConfigError(f"unknown {what} option {name!r}; known: {known}", name)
    return cls(**changes) if options is None else dataclasses.replace(options, **changes)
