"""The reproduction as a graph of notebook runs: what a run is, its folder, its content key, the order.

A run's *key* hashes its notebook's code cells, its parameters and the keys of the runs it depends
on, so changing a parameter reruns that run and everything downstream of it, and nothing else; a
notebook saved from Jupyter with outputs, metadata or a markdown note keeps its runs. Parameters
that only steer bookkeeping (checkpoint cadence, resumption: the trainer's ``RESUME_FREE`` but for
the run's folder) stay out of the key.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import nbformat

from mdc.train.config import RESUME_FREE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
# The run without a notebook: the figures, which the runner builds from the records itself (reproduce.running.execute
# --figures, as python -m reproduce --from-records builds them); its code, for its key, is that module's.
CODE = {"figures": os.path.join(ROOT, "reproduce", "running", "execute.py")}
# parameters that change no result, so not a run's key: the trainer's RESUME_FREE but the run's own folder,
# and the probe's shared cache of random-init features (verified on read)
BOOKKEEPING = tuple(name for name in RESUME_FREE if name != "output_dir") + ("random_init_cache",)


@dataclass(frozen=True)
class Run:
    """One notebook execution of the reproduction."""

    name: str  # unique within a profile, also its folder: "pretrain/mdc-alt-s0"
    notebook: str  # notebooks/<notebook>.ipynb (the figures: :data:`CODE`)
    params: dict  # papermill parameters; "{run:<name>}" in a string is replaced by that run's folder
    deps: tuple[str, ...] = ()  # runs that must succeed first
    artifacts: tuple[str, ...] = ()  # the paper artifacts it feeds
    labels: dict = field(default_factory=dict)  # what the figures need to place it (method, style, seed, ...)
    timeout_s: int = 3600
    gpus: int = 0  # > 1: a pretraining run that may execute under torchrun (see torchrun_command)


def run_dir(out: str, run: Run) -> str:
    return os.path.join(out, run.name)


def resolve(value, out: str):
    """Replace ``{run:<name>}`` in strings (recursively) with ``<out>/<name>``."""
    if isinstance(value, str):
        while "{run:" in value:
            start = value.index("{run:")
            end = value.index("}", start)
            value = value[:start] + os.path.join(out, value[start + 5 : end]) + value[end + 1 :]
        return value
    if isinstance(value, dict):
        return {k: resolve(v, out) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve(v, out) for v in value]
    return value


def code_file(notebook: str, science: str | None = None) -> str:
    """The code a run of ``notebook`` executes: notebooks/<notebook>.ipynb (of the tree ``science`` where given: a
    study's pinned export), or the figures' module (:data:`CODE`)."""
    folder = os.path.join(science, "notebooks") if science else NOTEBOOKS
    return CODE.get(notebook) or os.path.join(folder, f"{notebook}.ipynb")


def code_digest(path: str) -> str:
    """sha256 of a notebook's code cells: saving it with outputs, counts, metadata or prose keeps it (of a
    module's text, for the figures)."""
    if path.endswith(".py"):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()


def digests(runs: list[Run], science: str | None = None) -> dict[str, str]:
    """{notebook: :func:`code_digest`} of the notebooks ``runs`` execute (in the tree ``science`` where given)."""
    return {nb: code_digest(code_file(nb, science)) for nb in {r.notebook for r in runs}}


def keys(runs: list[Run], code: dict[str, str] | None = None) -> dict[str, str]:
    """Content key of every run: its notebook's code (its digest in ``code``, default this tree's: a study's pin
    names its commit's), parameters and the keys of its dependencies."""
    by_name, out = {r.name: r for r in runs}, {}
    code = digests(runs) if code is None else code

    def key(name: str) -> str:
        if name not in out:
            r = by_name[name]
            nb = code[r.notebook]
            params = {k: v for k, v in r.params.items() if k not in BOOKKEEPING}
            payload = json.dumps([r.notebook, nb, params, [key(d) for d in r.deps]], sort_keys=True)
            out[name] = hashlib.sha256(payload.encode()).hexdigest()[:16]
        return out[name]

    for r in runs:
        key(r.name)
    return out


def order(runs: list[Run]) -> list[Run]:
    """Topological order (dependencies first); errors on unknown or circular dependencies."""
    by_name = {r.name: r for r in runs}
    done, seen, out = set(), set(), []

    def visit(r: Run):
        if r.name in done:
            return
        if r.name in seen:
            raise ValueError(f"circular dependency at run {r.name!r}")
        seen.add(r.name)
        for d in r.deps:
            if d not in by_name:
                raise ValueError(f"run {r.name!r} depends on unknown run {d!r}")
            visit(by_name[d])
        done.add(r.name)
        out.append(r)

    for r in runs:
        visit(r)
    return out
