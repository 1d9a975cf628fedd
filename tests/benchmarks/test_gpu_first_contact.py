"""benchmarks/gpu_first_contact.sh without CUDA: one line that says why, a non-zero exit, no folder written."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_first_contact.sh")


def _run(out, python, **extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHON": python, "OMP_NUM_THREADS": "1"} | extra
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
