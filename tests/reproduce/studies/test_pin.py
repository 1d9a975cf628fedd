"""A study's pin freezes its science and nothing else (reproduce/studies/driver/pin.py): in a repository made here, a
toy study's parts run from main, with main's runner, while main's package, notebook, step and runner move on; its
records keep the pinned science's keys and digests and the next part runs. main's definitions reproduce the keys of
the committed ledgers with their pins' digests."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import SUBPROCESS_ENV, toy_notebook

from mdc.base.errors import RunError
from reproduce import registry
from reproduce.graph import ROOT, keys
from reproduce.running import ledger
from reproduce.studies import ladder, words
from reproduce.studies.driver import cli, compute, pin
from reproduce.studies.driver.study import Study, plan_keys, read_seeds

TOY = '''"""A toy study: a notebook run and a step reading it, each saying which code ran it."""
from reproduce.graph import Run
from reproduce.studies.driver.study import Study


def check(p: dict) -> dict:
    import mdc
    return {"step": "pinned", "moved": getattr(mdc, "MOVED", False)}


def runs(scale, plan, optional):
    return [run for s in range(plan["default"]) for run in (
        Run(f"toy/a-s{s}", "toy", {"output_dir": f"{{run:toy/a-s{s}}}", "n": s}, labels={"seed": s}),
        Run(f"check/a-s{s}", "check", {"n": s, "toy": f"{{run:toy/a-s{s}}}"}, (f"toy/a-s{s}",), labels={"seed": s}))]


STUDY = Study("toy", (), runs, steps={"check": check})
'''
MAIN = "import sys\n\nfrom reproduce.studies.driver.cli import main\nfrom reproduce.studies.toy import STUDY\n\n" \
       "sys.exit(main(STUDY))\n"
NOTEBOOK = ("import os\nimport mdc\nfrom mdc.eval.results import write_results\n"
            "write_results(os.path.join(output_dir, 'results.json'), 'toy', {'notebook': 'pinned', "
            "'moved': getattr(mdc, 'MOVED', False)})")


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def _toy(repo, *args):
    return subprocess.run([sys.executable, "-m", "reproduce.studies.toy", *args], cwd=repo,
                          env=SUBPROCESS_ENV | {"PYTHONPATH": str(repo)}, capture_output=True, text=True)


def _seeds(repo, n):
    (repo / "reproduce" / "studies" / "toy" / "seeds.json").write_text(json.dumps({"default": n}))


@pytest.fixture
def repo(tmp_path):
    """This tree's code with the toy study and its notebook, committed in a repository of its own."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "records", "weights", "runs", "words", "ladder", "pretrained")
    for folder in ("mdc", "reproduce", "notebooks"):
        shutil.copytree(os.path.join(ROOT, folder), repo / folder, ignore=skip)
    toy_notebook(repo / "notebooks", "toy", "output_dir = ''\nn = 0", NOTEBOOK)
    (repo / "reproduce" / "studies" / "toy").mkdir()
    (repo / "reproduce" / "studies" / "toy" / "__init__.py").write_text(TOY)
    (repo / "reproduce" / "studies" / "toy" / "__main__.py").write_text(MAIN)
    _seeds(repo, 1)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "plan")
    return repo


def _move_on(repo):
    """main moves on: its package, the toy notebook and step, and the runner (which says so when it runs)."""
    with open(repo / "mdc" / "__init__.py", "a") as f:
        f.write("MOVED = True\n")
    for path, old, new in (
            (repo / "reproduce" / "studies" / "toy" / "__init__.py", '"step": "pinned"', '"step": "main"'),
            (repo / "notebooks" / "toy.ipynb", "'notebook': 'pinned'", "'notebook': 'main'"),
            (repo / "reproduce" / "running" / "runner.py", "    runs = order(runs)\n    key = keys(runs, digests(",
             "    log(\"main's runner\")\n    runs = order(runs)\n    key = keys(runs, digests(")):
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
    _git(repo, "commit", "-q", "-am", "main moves on")


def test_a_part_runs_from_main_on_the_pinned_science_and_main_moving_on_changes_no_record(repo):
    assert _toy(repo, "--pin", "HEAD").returncode == 0
    pinned = json.loads((repo / "reproduce" / "studies" / "toy" / "pin.json").read_text())
    first = _toy(repo, "--time-budget", "5")
    assert first.returncode == 0, first.stdout + first.stderr
    records = repo / "reproduce" / "studies" / "toy" / "records"
    before = {p: p.read_bytes() for p in records.rglob("*.json")}
    assert len(before) == 2

    _move_on(repo)
    _seeds(repo, 2)  # the plan's next seed, for the next part
    dry = _toy(repo, "--dry-run")
    assert "4 runs (2 recorded)" in dry.stdout, dry.stdout + dry.stderr
    second = _toy(repo, "--time-budget", "5")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "main's runner" in second.stdout  # the runner that ran is main's
    assert {p: p.read_bytes() for p in before} == before  # no record changed

    for s in (0, 1):
        run = ledger.read(str(records), f"toy/a-s{s}")
        step = ledger.read(str(records), f"check/a-s{s}")
        assert run["results"]["results"] == {"notebook": "pinned", "moved": False}  # the pinned notebook and mdc
        assert step["results"]["results"] == {"step": "pinned", "moved": False}  # the pinned step on the pinned mdc
        assert run["code"] == {"notebook": pinned["notebooks"]["toy"], "package": pinned["package"]}
        assert step["code"] == {"notebook": pinned["steps"], "package": pinned["package"]}
    assert pinned["package"] != ledger.package_digest(str(repo))
    assert not list((repo / "reproduce" / "runs" / "pinned").iterdir())  # each part's export is gone

    # a step run by hand from main takes the same path: the pinned step, its digest, the same key
    key = ledger.read(str(records), "check/a-s1")["key"]
    os.remove(records / "check" / "a-s1.json")
    again = _toy(repo, "--step", "check/a-s1")
    assert again.returncode == 0, again.stderr
    step = ledger.read(str(records), "check/a-s1")
    assert step["key"] == key and step["code"]["notebook"] == pinned["steps"]
    assert step["results"]["results"]["step"] == "pinned"

    # definitions on main that no longer give the recorded keys: the part refuses, naming them
    toy = repo / "reproduce" / "studies" / "toy" / "__init__.py"
    toy.write_text(toy.read_text().replace('"n": s}, labels', '"n": s + 1}, labels'))
    refused = _toy(repo, "--time-budget", "5")
    assert refused.returncode == 1 and "do not reproduce 4 recorded key(s) (toy/a-s0, check/a-s0, toy/a-s1" \
        in refused.stderr


def test_main_reproduces_the_keys_of_its_ledgers_with_their_pins_digests():
    """The reference ledger, the words study and the ladder, every record (181, 168, 153): the key main's
    definitions give it with its ledger's pin (the migration of the older pins: their records' digests)."""
    with open(os.path.join(ROOT, "reproduce", "records", "mini", "pin.json")) as f:
        reference = json.load(f)
    records = ledger.read_all(os.path.join(ROOT, "reproduce", "records", "mini"))
    key = keys(registry.build("mini", 8), reference["notebooks"])
    assert len(records) == 181 and {n: r["key"] for n, r in records.items()} == {n: key[n] for n in records}
    assert {r["code"]["package"] for r in records.values()} == {reference["package"]}
    for study, count in ((words.STUDY, 168), (ladder.STUDY, 153)):
        pinned = pin.read_pin(study)
        runs = study.runs("mini", read_seeds(study.path("seeds.json")), True)
        key, records = plan_keys(study, runs, pinned), ledger.read_all(study.path("records"))
        assert len(records) == count and {n: r["key"] for n, r in records.items()} == {n: key[n] for n in records}
        assert {r["code"]["package"] for r in records.values()} == {pinned["package"]}
        assert {r["code"]["notebook"] for r in records.values() if r["notebook"] in study.steps} == {pinned["steps"]}


def test_a_step_refuses_steps_that_are_not_the_pins(capsys):
    """The words study's pin predates the shared driver: its steps as this tree has them are not the pinned ones."""
    assert compute.main(["step", "words", "neighbours", "unread.json", "unwritten.json", pin.read_pin(words.STUDY)[
        "steps"]]) == 1
    assert "not the pin's a14a0aee4b22" in capsys.readouterr().err


def test_an_export_that_fails_leaves_nothing_behind():
    parent = os.path.join(ROOT, "reproduce", "runs", "pinned")
    before = set(os.listdir(parent)) if os.path.isdir(parent) else set()
    with pytest.raises(RunError, match="has no reproduce.studies.no_such_study"):
        with pin.exported(Study("no_such_study", (), lambda *a: []), "HEAD"):
            pass
    assert set(os.listdir(parent)) == before


def test_a_plan_without_a_pin_is_refused_in_one_line_naming_the_fix(capsys):
    study = Study("no_such_study", (), lambda *a: [])
    with pytest.raises(SystemExit) as exit:
        cli.main(study, ["--time-budget", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 1 and len(err) == 1
    assert "pin.json is missing" in err[0] and "python -m reproduce.studies.no_such_study --pin <commit>" in err[0]
