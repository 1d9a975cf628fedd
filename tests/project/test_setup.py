"""Packaging: pyproject and environment.yml agree; pins keep CPU torch; heavy deps import."""
import re
import subprocess
import sys
import tomllib

import yaml
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _norm(spec: str) -> str:
    return re.sub(r"\s+", "", spec).lower()


def _declared() -> list[str]:
    """Core dependencies and every extra of pyproject.toml (the self-referencing 'all' left out)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [d for name, group in project["optional-dependencies"].items() if name != "all" for d in group]
    return project["dependencies"] + extras


def test_environment_yml_mirrors_pyproject():
    deps = _declared()
    spec = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    env = [p for p in pip if p != "-e ."]
    assert sorted(map(_norm, env)) == sorted(map(_norm, deps))


def test_lock_pins_cpu_safe_versions():
    lock = dict(line.split("==", 1) for line in (ROOT / "requirements.lock").read_text().split()
                if "==" in line)
    assert lock["torch"] == "2.13.0"
    assert lock["torchvision"] == "0.28.0"
    major, minor = map(int, lock["numpy"].split(".")[:2])
    assert (major, minor) < (2, 4)
    deps = _declared()
    names = {re.split(r"[<>=!~ ]", d)[0].lower().replace("_", "-") for d in deps}
    locked = {n.lower().replace("_", "-") for n in lock}
    assert names <= locked, names - locked


def test_core_dependencies_leave_notebook_and_eval_tools_to_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~ ]", d)[0] for d in project["dependencies"]}
    assert {"torch", "timm", "safetensors", "webdataset", "open-clip-torch"} <= core
    assert not core & {"jupyterlab", "papermill", "nbval", "matplotlib", "seaborn", "pycocoevalcap", "clip-benchmark",
                       "pytest"}
    assert set(project["optional-dependencies"]) >= {"notebooks", "eval", "test"}


def test_timm_and_open_clip_import_after_mdc():
    code = "import mdc, mdc.model; mdc.model.patch_torchvision(); import timm, open_clip, torchvision; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_make_reproduce_passes_a_time_budget_to_a_new_ledger():
    """``make reproduce RECORDS=<folder> TIME_BUDGET=<minutes>`` runs a part, as the README says."""
    out = subprocess.run(["make", "-n", "reproduce", "RECORDS=build/new", "TIME_BUDGET=150", "STAMP="], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "--records build/new --seeds 3 --time-budget 150" in " ".join(out.replace("\\\n", " ").split())
    plain = subprocess.run(["make", "-n", "reproduce", "STAMP="], cwd=ROOT, capture_output=True, text=True).stdout
    assert "--time-budget" not in plain and "--from-records" in plain


def test_the_readmes_python_snippet_runs_as_written():
    """The README's first Python block, executed as a newcomer would paste it: captions at the references'
    lengths, one ELBO per caption."""
    text = (ROOT / "README.md").read_text()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert len(scope["captions"]) == 4 and all(isinstance(c, str) and c for c in scope["captions"])
    assert [len(scope["tok"].encode(c)) for c in scope["captions"]] == scope["lengths"]
    assert scope["scores"].shape[0] == 4 and bool(scope["loss"].isfinite())
