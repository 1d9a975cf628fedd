"""notebooks/linear_probe.ipynb runs under papermill with smoke settings and writes its results file."""
import os

import nbformat
import papermill

from conftest import SMALL, small_model
from mdc.eval.results import read_results

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "linear_probe.ipynb")


def test_notebook_is_committed_clean_with_one_parameters_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert len([c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]) == 1
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def test_linear_probe_notebook_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    small_model("arc").save(tmp_path / "ckpt")
    out = tmp_path / "probe"
    papermill.execute_notebook(
        NOTEBOOK, str(tmp_path / "out.ipynb"), kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
        parameters=dict(checkpoint=str(tmp_path / "ckpt"), synthetic_tasks=["shape", "count"], n_probe_train=40,
                        n_probe_test=16, epochs=2, output_dir=str(out)))
    rec = read_results(out / "results.json", kind="linear_probe")
    res = rec["results"]
    assert set(res["datasets"]) == {"wds/shape", "wds/count"} == set(res["random_init"]["datasets"])
    assert res["datasets"]["wds/shape"]["n_train"] == 40 and res["datasets"]["wds/count"]["classes"] == 4
    assert 0.0 <= res["average"] <= 1.0 and rec["model"]["objective"] == "arc" and rec["checkpoint_id"]
    assert os.listdir(out / "features")  # the cache
