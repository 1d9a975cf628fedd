import os

import pytest
import torch

import mdc
from mdc.tokenizer import compact_vocab

CAPTIONS = [
    "a red circle left of a blue square",
    "a green star above a small yellow triangle",
    "two blue squares below a striped cross",
    "a large purple circle right of a star",
]
# Subprocesses (notebook kernels, torchrun workers) import the checkout under test, not whatever
# `mdc` the environment has installed (a worktree beside the editable install, say).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))

VOCAB = compact_vocab(CAPTIONS + ["a green square", "the red star above a circle"])
SMALL = dict(vocab=VOCAB, image_size=32, patch_size=8, vision_width=64, vision_layers=2, vision_heads=2,
             text_width=64, text_layers=2, text_heads=2, embed_dim=64, context_length=24)
# SMALL on the synthetic world's own vocabulary (what the notebooks' data is captioned with)
WORLD_SMALL = {k: v for k, v in SMALL.items() if k != "vocab"} | {"context_length": 32}


def committed_notebook(name: str):
    """notebooks/<name>.ipynb as committed, checked clean: one ``parameters`` cell, the python3
    kernel, no outputs. Returns (notebook, its parameters cell)."""
    import nbformat

    nb = nbformat.read(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    return nb, tagged[0]


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    """``run(name, **parameters)`` executes notebooks/<name>.ipynb under papermill in tmp_path, its
    kernel on one thread; returns the executed notebook."""
    import papermill

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits the environment

    def run(name: str, **parameters):
        return papermill.execute_notebook(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), str(tmp_path / "out.ipynb"),
                                          kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
                                          parameters=parameters)

    return run


@pytest.fixture
def one_thread():
    """One torch thread for the test: fast when the 2 cores are shared, and identical for runs compared bitwise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def small_model(objective="mdc", **kw):
    """A very small model (32 px, width 64, 2+2 layers, compact vocabulary) for fast tests."""
    return mdc.create_model("tiny", objective=objective, **{**SMALL, **kw})


@pytest.fixture
def images():
    return torch.randn(len(CAPTIONS), 3, 32, 32)
