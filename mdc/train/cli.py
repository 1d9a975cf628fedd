"""The command line: ``python -m mdc.train`` and ``torchrun -m mdc.train``, one flag per
:class:`~mdc.train.config.TrainConfig` field, generated from the field.

The flag is the field's name with dashes (``--batch-size``), its help the field's ``help``. The
type follows the annotation: ``int``/``float`` are parsed as such, a ``Literal`` gives the choices,
a ``tuple[float, float]`` two values, a ``dict`` JSON; a bool field is a switch, ``--name`` when it
is off by default and ``--no-name`` when on. A field without a default is a required flag.

Errors (:mod:`mdc.base.errors`): a bad value prints one line, ``error: --batch-size must be >= 1, got 0``,
and exits with status 2, before anything is written; a run that stops for a reason the user must
act on (its folder in use, a resume of a different run, a full disk) prints ``error: ...`` and
exits with status 1. ``--debug`` (or ``MDC_DEBUG=1``) shows the traceback instead. A rank that lost its
peers (:class:`~mdc.train.PeerLostError`) ends its process right after its message, without tearing down its
process group, which could wait forever for a collective still pending with a silent peer. Besides the
checks of :meth:`TrainConfig.resolved`, the command line refuses flags that contradict each other
(:func:`check_flags`): MDC's objective flags with another objective, ``--mask-ratio`` with
``--t-interval`` or ``--t-sampling``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing

from mdc.base.cli import ArgumentParser, report
from mdc.base.errors import ConfigError
from mdc.train.config import TrainConfig
from mdc.train.distributed import PeerLostError
from mdc.train.loop import train

DESCRIPTION = "Pretraining: one loop for MDC, ARC and CLIP, from a laptop CPU to multi-node DDP."


def _flag(field: dataclasses.Field, hint) -> tuple[str, dict]:
    """(flag, add_argument keywords) of a TrainConfig field whose resolved annotation is ``hint``."""
    meta = field.metadata
    kw = {"help": meta["help"].replace("%", "%%")} if meta.get("help") else {}
    kw |= {key: meta[key] for key in ("choices", "metavar") if key in meta}
    flag = "--" + field.name.replace("_", "-")
    if hint is bool:
        if field.default:
            return "--no-" + flag[2:], kw | {"dest": field.name, "action": "store_false"}
        return flag, kw | {"action": "store_true"}
    if field.default is dataclasses.MISSING:
        kw["required"] = True
    elif field.default is not None:
        kw["default"] = field.default
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: what X is
        hint, args = args[0], typing.get_args(args[0])
    if typing.get_origin(hint) is typing.Literal:
        kw["choices"] = list(args)
    elif typing.get_origin(hint) is tuple:
        kw |= {"type": args[0], "nargs": len(args)}
    elif hint is dict:
        kw["type"] = json.loads
    elif hint in (int, float):
        kw["type"] = hint
    return flag, kw


def make_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m mdc.train", description=DESCRIPTION,
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}  # one_of name -> its group
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag, kw = _flag(field, hints[field.name])
        one_of = field.metadata.get("one_of")
        if one_of and one_of not in groups:
            groups[one_of] = parser.add_mutually_exclusive_group()
        (groups[one_of] if one_of else parser).add_argument(flag, **kw)
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback (or set MDC_DEBUG=1)")
    return parser


TUPLES = {f.name for f in dataclasses.fields(TrainConfig) if "tuple" in str(f.type)}  # nargs flags: lists -> tuples


def _kwargs(args: argparse.Namespace) -> dict:
    return {name: tuple(value) if name in TUPLES and isinstance(value, list) else value
            for name, value in vars(args).items() if name != "debug"}


def parse_args(argv: list[str] | None = None) -> dict:
    """CLI flags (open_clip style) -> keyword arguments of :func:`~mdc.train.loop.train`."""
    return _kwargs(make_parser().parse_args(argv))


MDC_FLAGS = ("t_interval", "mask_ratio", "t_sampling")  # flags of the MDC objective (and --no-time-weighting)


def check_flags(kwargs: dict) -> None:
    """Refuse flags that contradict each other (the Python API, which always passes the notebooks'
    defaults, leaves these to the model): MDC's objective flags with another objective, and
    ``--mask-ratio`` (a fixed ratio) with ``--t-interval`` or ``--t-sampling`` (how t is drawn)."""
    given = [n for n in MDC_FLAGS if kwargs.get(n) is not None] + \
        (["time_weighting"] if kwargs.get("time_weighting") is False else [])
    if given and kwargs.get("objective", "mdc") != "mdc":
        raise ConfigError(f"{given[0]} applies to the mdc objective only, not {kwargs['objective']}", given[0])
    if kwargs.get("mask_ratio") is not None:
        for other in ("t_interval", "t_sampling"):
            if kwargs.get(other) is not None:
                raise ConfigError(f"mask_ratio fixes the mask ratio; {other} contradicts it", "mask_ratio", other)


def _train(kwargs: dict) -> dict:
    check_flags(kwargs)
    return train(**kwargs)


def main(argv: list[str] | None = None) -> dict:
    """``python -m mdc.train``: train, print the results as one JSON line (rank 0); see the module
    docstring for how errors are reported."""
    parser = make_parser()
    args = parser.parse_args(argv)
    results = report(lambda: _train(_kwargs(args)), parser, debug=args.debug, ends_process=(PeerLostError,))
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(results))
    return results
