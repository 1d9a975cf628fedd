"""notebooks/linear_probe.ipynb runs under papermill with smoke settings and writes its results file."""
import os

from conftest import committed_notebook, small_model
from mdc.eval.results import read_results


def test_notebook_is_committed_clean_with_one_parameters_cell():
    committed_notebook("linear_probe")


def test_linear_probe_notebook_smoke(tmp_path, run_notebook):
    small_model("arc").save(tmp_path / "ckpt")
    out = tmp_path / "probe"
    run_notebook("linear_probe", checkpoint=str(tmp_path / "ckpt"), synthetic_tasks=["shape", "count"],
                 n_probe_train=40, n_probe_test=16, epochs=2, output_dir=str(out),
                 random_init_cache=str(tmp_path / "shared"))
    rec = read_results(out / "results.json", kind="linear_probe")
    res = rec["results"]
    assert set(res["datasets"]) == {"wds/shape", "wds/count"} == set(res["random_init"]["datasets"])
    assert res["datasets"]["wds/shape"]["n_train"] == 40 and res["datasets"]["wds/count"]["classes"] == 4
    assert 0.0 <= res["average"] <= 1.0 and rec["model"]["objective"] == "arc" and rec["checkpoint_id"]
    assert len(os.listdir(out / "features")) == 1  # the trained encoder's cache (pooled and grid features)
    assert len(list((out / "features").rglob("*pooled+grid4*.safetensors"))) == 4  # one file per split for both
    assert len(list((tmp_path / "shared").rglob("*.safetensors"))) == 4  # the random init's, shared by runs
    assert "random_init_cache" not in rec["parameters"]  # it changes no number
    grid = res["grid"]  # the grid probe beside the pooled one, with its own floor
    assert grid["grid"] == rec["parameters"]["grid"] == 4
    assert set(grid["datasets"]) == set(grid["random_init"]["datasets"]) == {"wds/shape", "wds/count"}
    assert grid["datasets"]["wds/count"]["n_test"] == 16 and len(grid["datasets"]["wds/count"]["correct"]) == 16


def test_the_grid_probe_can_be_left_out(tmp_path, run_notebook):
    small_model("mdc").save(tmp_path / "ckpt")
    run_notebook("linear_probe", checkpoint=str(tmp_path / "ckpt"), synthetic_tasks=["relation"], n_probe_train=8,
                 n_probe_test=4, epochs=1, grid=0, random_init_floor=False, output_dir=str(tmp_path / "probe"))
    assert "grid" not in read_results(tmp_path / "probe" / "results.json", kind="linear_probe")["results"]
