"""Packaging: pyproject and environment.yml agree; pins keep CPU torch; heavy deps import."""
import re
import subprocess
import sys
import tomllib

import yaml
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _norm(spec: str) -> str:
    return re.sub(r"\s+", "", spec).lower()


def test_environment_yml_mirrors_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
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
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ ]", d)[0].lower().replace("_", "-") for d in deps}
    locked = {n.lower().replace("_", "-") for n in lock}
    assert names <= locked, names - locked


def test_timm_and_open_clip_import_after_mdc():
    code = "import mdc, mdc.model; mdc.model.patch_torchvision(); import timm, open_clip, torchvision; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
