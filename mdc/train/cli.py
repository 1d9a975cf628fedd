"""The command line: ``python -m mdc.train`` and ``torchrun -m mdc.train``, one flag per
:class:`~mdc.train.config.TrainConfig` field, generated from the field.

The flag is the field's name with dashes (``--batch-size``), its help the field's ``help``. The
type follows the annotation: ``int``/``float`` are parsed as such, a ``Literal`` gives the choices,
a ``tuple[float, float]`` two values, a ``dict`` JSON; a bool field is a switch, ``--name`` when it
is off by default and ``--no-name`` when on. A field without a default is a required flag.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing

from mdc.train.config import TrainConfig
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
    parser = argparse.ArgumentParser(prog="python -m mdc.train", description=DESCRIPTION,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}  # one_of name -> its group
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag, kw = _flag(field, hints[field.name])
        one_of = field.metadata.get("one_of")
        if one_of and one_of not in groups:
            groups[one_of] = parser.add_mutually_exclusive_group()
        (groups[one_of] if one_of else parser).add_argument(flag, **kw)
    return parser


def parse_args(argv: list[str] | None = None) -> dict:
    """CLI flags (open_clip style) -> keyword arguments of :func:`~mdc.train.loop.train`."""
    args = vars(make_parser().parse_args(argv))
    return {name: tuple(value) if isinstance(value, list) else value for name, value in args.items()}


def main(argv: list[str] | None = None) -> dict:
    results = train(**parse_args(argv))
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(results))
    return results
