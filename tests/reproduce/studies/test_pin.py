"""A study runs from its plan's pinned commit (reproduce/studies/driver/pin.py): in a repository made here, a toy
study's part executes the pinned code after main's package and the study's own step change, writes its record into
main's ledger with the pinned code's run key, and is refused when the pinned copy is not the plan's code; a plan
without a pin is refused."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import SUBPROCESS_ENV

from reproduce.graph import ROOT
from reproduce.running import ledger
from reproduce.studies.driver import cli, pin
from reproduce.studies.driver.study import Study, plan_keys

TOY = '''"""A toy study: one step that records which code ran it."""
from reproduce.graph import Run
from reproduce.running import ledger
from reproduce.studies.driver.study import Study


def check(p: dict) -> dict:
    return {"package": ledger.package_digest()}


STUDY = Study("toy", (), lambda scale, plan, optional: [Run("check/which-s0", "check", {"n": 1}, labels={"seed": 0})],
              steps={"check": check})
'''
MAIN = "import sys\n\nfrom reproduce.studies.driver.cli import main\nfrom reproduce.studies.toy import STUDY\n\n" \
       "sys.exit(main(STUDY))\n"


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def _toy(repo, *args):
    env = {k: v for k, v in SUBPROCESS_ENV.items() if k != pin.PINNED} | {"PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, "-m", "reproduce.studies.toy", *args], cwd=repo, env=env,
                          capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path):
    """This tree's code with the toy study, committed in a repository of its own."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "records", "weights", "runs", "words", "pretrained")
    for folder in ("mdc", "reproduce", "notebooks"):
        shutil.copytree(os.path.join(ROOT, folder), repo / folder, ignore=skip)
    (repo / "reproduce" / "studies" / "toy").mkdir()
    (repo / "reproduce" / "studies" / "toy" / "__init__.py").write_text(TOY)
    (repo / "reproduce" / "studies" / "toy" / "__main__.py").write_text(MAIN)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "plan")
    return repo


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_part_runs_the_pinned_code_after_main_moves_on_and_refuses_other_code(repo):
    assert _toy(repo, "--pin", "HEAD").returncode == 0
    pinned = json.loads((repo / "reproduce" / "studies" / "toy" / "pin.json").read_text())
    copy = repo / "reproduce" / "runs" / "pinned" / pinned["commit"][:12]

    with open(repo / "mdc" / "__init__.py", "a") as f:  # main moves on: the package and the study's own step
        f.write("# moved on\n")
    toy = repo / "reproduce" / "studies" / "toy" / "__init__.py"
    toy.write_text(toy.read_text().replace('"package": ledger.package_digest()}', '"package": "main"}'))
    _git(repo, "commit", "-q", "-am", "main moves on")

    ran = _toy(repo, "--time-budget", "5")
    assert ran.returncode == 0, ran.stderr
    record = json.loads((repo / "reproduce" / "studies" / "toy" / "records" / "check" / "which-s0.json").read_text())
    assert record["results"]["results"]["package"] != "main"  # the pinned step ran, on the pinned package
    assert record["code"]["package"] == ledger.package_digest(str(copy)) != ledger.package_digest(str(repo))
    keys = {where: plan_keys(m.STUDY, m.STUDY.runs("mini", {}, False))["check/which-s0"] for where, m in (
        ("pinned", _module(copy / "reproduce" / "studies" / "toy" / "__init__.py", "toy_pinned")),
        ("main", _module(toy, "toy_main")))}
    assert record["key"] == keys["pinned"] != keys["main"]  # the run's key is the pinned code's, not main's

    with open(copy / "mdc" / "__init__.py", "a") as f:  # the pinned copy is not the plan's code any more
        f.write("# edited\n")
    refused = _toy(repo, "--time-budget", "5")
    assert refused.returncode == 1 and f"not the plan's {pinned['code']}" in refused.stderr


def test_a_plan_without_a_pin_is_refused_in_one_line_naming_the_fix(capsys):
    study = Study("no_such_study", (), lambda *a: [])
    with pytest.raises(SystemExit) as exit:
        cli.main(study, ["--time-budget", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 1 and len(err) == 1
    assert "pin.json is missing" in err[0] and "python -m reproduce.studies.no_such_study --pin <commit>" in err[0]
