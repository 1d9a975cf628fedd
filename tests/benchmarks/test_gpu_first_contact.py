"""benchmarks/gpu_first_contact.sh without CUDA: one line that says why, a non-zero exit, no folder written."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import SUBPROCESS_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_first_contact.sh")


def _stand_in(tmp_path, records: str, record: str) -> str:
    """An interpreter stand-in that says CUDA is there and, when its arguments match ``records`` (a bash case
    pattern), appends ``record`` (evaluated by bash) to the file $SEEN."""
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\ncase "$*" in\n  *cuda.is_available*) echo ;;\n'
                      f'  {records}) echo {record} >> "$SEEN" ;;\nesac\n')
    python.chmod(0o755)
    return str(python)


def _run(out, python, **extra):
    """The script with only `extra` of its own settings: a developer's MDC_GPU_* or PYTHONPATH would change it."""
    ambient = {k: v for k, v in SUBPROCESS_ENV.items() if k != "PYTHONPATH" and not k.startswith("MDC_GPU_")}
    env = ambient | {"PYTHON": python} | extra
    return subprocess.run(["bash", SCRIPT, str(out)], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would run")
@pytest.mark.parametrize("steps", [{}, {"MDC_GPU_STEPS": "env:10 static:330 loader:120"}])  # first contact, static step
def test_without_cuda_the_script_refuses_in_one_line(tmp_path, steps):
    done = _run(tmp_path / "out", sys.executable, **steps)
    assert done.returncode == 2 and done.stdout == ""
    built = f"with CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
    assert done.stderr.splitlines() == [f"no CUDA device (torch {torch.__version__}, built {built}); "
                                        "benchmarks/gpu_first_contact.sh needs a CUDA machine"]
    assert not (tmp_path / "out").exists()


def test_without_torch_the_script_refuses_in_one_line(tmp_path):
    done = _run(tmp_path / "out", "false")  # an interpreter that cannot import anything
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["no CUDA device: false cannot import torch; "
                                        "benchmarks/gpu_first_contact.sh needs a CUDA machine"]


@pytest.mark.parametrize("profile", [None, "0"])
def test_the_static_step_profiles_unless_told_not_to(tmp_path, profile):
    """The static step asks the bench for MDC's training with a profile, but a user's MDC_GPU_PROFILE=0 (a try that
    needs no profile) is kept: the interpreter stand-in records what the bench is given."""
    seen = tmp_path / "seen"
    python = _stand_in(tmp_path, '*"-m benchmarks gpu"*', '"$MDC_GPU_PARTS $MDC_GPU_OBJECTIVES $MDC_GPU_PROFILE"')
    extra = {"MDC_GPU_STEPS": "static:30", "SEEN": str(seen)} | ({"MDC_GPU_PROFILE": profile} if profile else {})
    done = _run(tmp_path / "out", python, **extra)
    assert done.returncode == 0, done.stderr
    assert seen.read_text().split() == ["training", "mdc", profile or "1"]


def test_the_graphs_step_runs_after_torchrun_in_one_scratch_folder(tmp_path):
    """Each named step runs in order, both on the one scratch folder (the graphs step reuses the eager step's
    shards and is put beside its run): the interpreter stand-in records its arguments."""
    seen, work = tmp_path / "seen", tmp_path / "work"
    python = _stand_in(tmp_path, "*benchmarks.gpu_runs*", '"$*"')
    done = _run(tmp_path / "out", python, MDC_GPU_STEPS="torchrun:30 graphs:40", MDC_GPU_WORK=str(work),
                SEEN=str(seen))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert seen.read_text().splitlines() == [
        f"-m benchmarks.gpu_runs {step} --work {work} --json {out}/runs.json --budget {limit - 10}"
        for step, limit in (("torchrun", 30), ("graphs", 40))]
    assert [line.split()[:2] for line in (out / "summary.txt").read_text().splitlines()[1:3]] == [
        ["torchrun", "ok"], ["graphs", "ok"]]
