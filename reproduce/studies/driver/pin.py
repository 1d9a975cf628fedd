"""A study's pin: the science that decides its results, frozen at one commit while main moves on.

``reproduce/studies/<name>/pin.json`` names the commit and the digests of what decides a result there: the package
(``mdc/``), each notebook's code cells and the study's steps (the functions that compute an outcome without a
notebook). A run's key and its record's code are computed from these digests alone, so the driver, runner, ledger,
scheduler and report, which always run from main, can change without changing a key or refusing a part. A part
executes the commit's science from an export (:func:`science`): the runner runs its notebooks with its ``mdc`` first
on the kernel's path, a step runs in a process of its own on the export (:mod:`.compute`, which checks the steps'
digest); the export is removed when the part ends. The runs' parameters are main's definitions, which must reproduce
the pinned records' keys: a part refuses to start while one does not (:func:`reproduce.studies.driver.part.part`).
``--pin COMMIT`` writes the pin.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from mdc.base.errors import RunError
from reproduce.graph import ROOT, code_digest
from reproduce.running.ledger import package_digest

EXPORTED = ("mdc", "notebooks", "reproduce")  # a step's module imports its own commit's reproduce
LEFT_OUT = (":(exclude)reproduce/weights", ":(exclude)reproduce/records", ":(exclude)reproduce/runs",
            ":(exclude,glob)reproduce/studies/*/weights/**", ":(exclude,glob)reproduce/studies/*/records/**")
COMPUTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compute.py")  # run as a script on an export


def export(study, commit: str, target: str) -> str:
    """The science of ``commit`` (:data:`EXPORTED` but :data:`LEFT_OUT`) written to ``target``; refused where the
    commit does not hold the study."""
    archive = subprocess.run(["git", "archive", commit, "--", *EXPORTED, *LEFT_OUT], cwd=ROOT, capture_output=True)
    if archive.returncode:
        raise RunError(f"git archive {commit[:12]}: {archive.stderr.decode().strip()} (a shallow clone lacks older "
                       f"commits: git fetch --unshallow)")
    os.makedirs(target, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    where = os.path.join(target, "reproduce", "studies", study.name)
    if not (os.path.isfile(where + ".py") or os.path.isfile(os.path.join(where, "__init__.py"))):
        raise RunError(f"commit {commit[:12]} has no reproduce.studies.{study.name}: pin a commit that holds it")
    return target


@contextlib.contextmanager
def exported(study, commit: str):
    """:func:`export` into a fresh folder under ``reproduce/runs/pinned/`` (ignored), removed on leaving, whole or
    half-written."""
    parent = os.path.join(ROOT, "reproduce", "runs", "pinned")
    os.makedirs(parent, exist_ok=True)
    target = tempfile.mkdtemp(dir=parent, prefix=f"{study.name}-{commit[:12]}-")
    try:
        yield export(study, commit, target)
    finally:
        shutil.rmtree(target, ignore_errors=True)


def digests(study, root: str) -> dict:
    """What decides a result in the tree ``root``: its package's digest, each notebook's, and its study's steps'
    (:func:`reproduce.studies.driver.compute.step_digest`, computed on that tree)."""
    steps = subprocess.run([sys.executable, "-P", COMPUTE, "digest", study.name], cwd=root, env=science_env(root),
                           capture_output=True, text=True)
    if steps.returncode:
        raise RunError(f"the steps of reproduce.studies.{study.name} in that commit cannot be read: "
                       f"{steps.stderr.strip().splitlines()[-1:]}")
    return {**code_digests(root), "steps": steps.stdout.strip()}


def code_digests(root: str) -> dict:
    """The digests of the package and of each notebook's code cells in the tree ``root``."""
    notebooks = sorted(glob.glob(os.path.join(root, "notebooks", "*.ipynb")))
    return {"package": package_digest(root),
            "notebooks": {os.path.basename(p)[:-len(".ipynb")]: code_digest(p) for p in notebooks}}


def science_env(root: str) -> dict:
    """The environment of a process that runs ``root``'s science: that tree alone on the path."""
    return dict(os.environ, PYTHONPATH=root)


def read_pin(study) -> dict:
    """The plan's pin; a plan without one is refused, naming the fix."""
    path = study.path("pin.json")
    if not os.path.isfile(path):
        raise RunError(f"{os.path.relpath(path, ROOT)} is missing: a study runs from a pinned commit; commit the "
                       f"plan and its code, then: python -m reproduce.studies.{study.name} --pin <commit>")
    with open(path) as f:
        return json.load(f)


def write_pin(study, commit: str) -> str:
    """Pin the study to ``commit``: its full hash and its science's digests (:func:`digests`), in pin.json."""
    found = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True,
                           text=True)
    if found.returncode:
        raise RunError(f"--pin {commit}: not a commit of this repository")
    full = found.stdout.strip()
    with exported(study, full) as root:
        pin = {"commit": full, **digests(study, root)}
    with open(study.path("pin.json"), "w") as f:
        json.dump(pin, f, indent=1, sort_keys=True)
        f.write("\n")
    return f"{study.name}: pinned to {full} (package {pin['package']}); commit {os.path.relpath(f.name, ROOT)}"


@contextlib.contextmanager
def science(study, pin: dict):
    """The pinned commit's science, exported for a part and checked against the pin's package and notebook digests
    (a step checks its own: :mod:`.compute`); removed on leaving."""
    with exported(study, pin["commit"]) as root:
        found = code_digests(root)
        wrong = [f"notebook {nb}" for nb, d in pin["notebooks"].items() if found["notebooks"].get(nb) != d]
        if found["package"] != pin["package"]:
            wrong.insert(0, "package")
        if wrong:
            raise RunError(f"commit {pin['commit'][:12]} exports other science than pin.json names "
                           f"({', '.join(wrong)}): pin anew (--pin)")
        yield root
