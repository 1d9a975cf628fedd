"""notebooks/pretrain.ipynb runs under papermill with smoke settings and writes results.json."""
import os

import nbformat
import papermill

import mdc
from mdc.eval.results import read_results
from conftest import SMALL

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "pretrain.ipynb")


def test_notebook_is_committed_clean_with_one_parameters_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def test_pretrain_notebook_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it
    out = tmp_path / "run"
    overrides = {k: v for k, v in SMALL.items() if k != "vocab"} | {"context_length": 32}  # the world's vocabulary
    papermill.execute_notebook(
        NOTEBOOK, str(tmp_path / "out.ipynb"), kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
        parameters=dict(objective="mdc", model_overrides=overrides, train_data="", data_samples=48, steps=3,
                        batch_size=8, workers=1, save_every=2, output_dir=str(out)),
    )
    record = read_results(out / "results.json", kind="pretrain")
    results = record["results"]
    assert results["steps"] == 3 and results["objective"] == "mdc" and record["model"]["image_size"] == 32
    assert os.path.isfile(results["loss_curve"]) and record["checkpoint_id"]
    assert mdc.load(results["checkpoint"]).config.image_size == 32
