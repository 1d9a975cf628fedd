"""A study runs from its plan's pinned commit, so that ``mdc/`` keeps moving on main while its parts run for days.
``reproduce/studies/<name>/pin.json`` names the commit and its code's digest (:func:`code_digest`); main exports the
commit into ``reproduce/runs/pinned/<commit>/`` (ignored), refuses code there that is not the plan's, and runs the
study's module there (:func:`delegate`) with main's seeds, ledger, run folders and weights: the keys, the records'
package and every number come from the pinned code. ``--pin COMMIT`` writes the pin (commit the plan first).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

from mdc.base.errors import RunError
from reproduce.graph import ROOT

PINNED = "MDC_STUDY_MAIN"  # main's root, set for the pinned copy's processes: the code they run is the plan's
CODE = ("mdc/**/*.py", "reproduce/**/*.py", "notebooks/**/*.ipynb")
LEFT_OUT = (":(exclude)reproduce/weights", ":(exclude,glob)reproduce/studies/*/weights/**",
            ":(exclude,glob)reproduce/studies/*/records/**")  # outputs, not code: main's are written


def code_digest(root: str) -> str:
    """sha256 (16 hex) of the code a part executes under ``root``: :data:`CODE`, by relative path and content."""
    h = hashlib.sha256()
    files = {p for pattern in CODE for p in glob.glob(os.path.join(root, pattern), recursive=True)
             if not os.path.relpath(p, root).startswith(os.path.join("reproduce", "runs", ""))}  # outputs
    for path in sorted(files, key=lambda p: os.path.relpath(p, root)):
        h.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()[:16]


def export(study, commit: str, target: str) -> str:
    """The code of ``commit`` (:data:`CODE`'s folders but :data:`LEFT_OUT`) written to ``target``, whole or not at
    all; refused where the commit does not hold the study."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    archive = subprocess.run(["git", "archive", commit, "--", "mdc", "reproduce", "notebooks", *LEFT_OUT], cwd=ROOT,
                             capture_output=True)
    if archive.returncode:
        raise RunError(f"git archive {commit[:12]}: {archive.stderr.decode().strip()} (a shallow clone lacks older "
                       f"commits: git fetch --unshallow)")
    work = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".export-")
    subprocess.run(["tar", "-x", "-C", work], input=archive.stdout, check=True)
    where = os.path.join(work, "reproduce", "studies", study.name)
    if not (os.path.isfile(where + ".py") or os.path.isfile(os.path.join(where, "__main__.py"))):
        shutil.rmtree(work)
        raise RunError(f"commit {commit[:12]} has no reproduce.studies.{study.name} to run: pin one that holds it")
    os.replace(work, target)
    return target


def read_pin(study) -> dict:
    """The plan's pin; a plan without one is refused, naming the fix."""
    path = study.path("pin.json")
    if not os.path.isfile(path):
        raise RunError(f"{os.path.relpath(path, ROOT)} is missing: a study runs from a pinned commit; commit the "
                       f"plan and its code, then: python -m reproduce.studies.{study.name} --pin <commit>")
    with open(path) as f:
        return json.load(f)


def write_pin(study, commit: str) -> str:
    """Pin the study to ``commit`` (its full hash and its code's digest, in pin.json); returns what it wrote."""
    found = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True,
                           text=True)
    if found.returncode:
        raise RunError(f"--pin {commit}: not a commit of this repository")
    full = found.stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        pin = {"commit": full, "code": code_digest(export(study, full, os.path.join(tmp, "code")))}
    with open(study.path("pin.json"), "w") as f:
        json.dump(pin, f, indent=1)
        f.write("\n")
    return f"{study.name}: pinned to {full} (code {pin['code']}); commit {os.path.relpath(f.name, ROOT)}"


def pinned_copy(study, pin: dict) -> str:
    """The pinned commit's code, exported once, checked against the plan's digest at every call."""
    target = os.path.join(ROOT, "reproduce", "runs", "pinned", pin["commit"][:12])
    if not os.path.isdir(target):
        export(study, pin["commit"], target)
    found = code_digest(target)
    if found != pin["code"]:
        raise RunError(f"the code in {os.path.relpath(target, ROOT)} is {found}, not the plan's {pin['code']} "
                       f"(pin.json): remove that folder to export the pinned commit again, or pin anew")
    return target


def delegate(study, pin: dict, argv: list[str]) -> int:
    """``python -m reproduce.studies.<name> ARGV`` in the pinned copy (first on the path); its exit status."""
    code = pinned_copy(study, pin)
    env = dict(os.environ, PYTHONPATH=code + os.pathsep + os.environ.get("PYTHONPATH", ""), **{PINNED: ROOT})
    print(f"{study.name}: running the pinned commit {pin['commit'][:12]} (code {pin['code']})", flush=True)
    return subprocess.run([sys.executable, "-m", f"reproduce.studies.{study.name}", *argv], cwd=code,
                          env=env).returncode
