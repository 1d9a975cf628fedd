"""notebooks/pretrain.ipynb runs under papermill with smoke settings and writes results.json."""
import os

import mdc
from mdc.eval.results import read_results
from conftest import WORLD_SMALL, committed_notebook


def test_notebook_is_committed_clean_with_one_parameters_cell():
    committed_notebook("pretrain")


def test_pretrain_notebook_smoke(tmp_path, run_notebook):
    out = tmp_path / "run"
    run_notebook("pretrain", objective="mdc", model_overrides=WORLD_SMALL, train_data="", data_samples=48, steps=3,
                 batch_size=8, workers=1, save_every=2, output_dir=str(out))
    record = read_results(out / "results.json", kind="pretrain")
    results = record["results"]
    assert results["steps"] == 3 and results["objective"] == "mdc" and record["model"]["image_size"] == 32
    assert os.path.isfile(results["loss_curve"]) and record["checkpoint_id"]
    assert mdc.load(results["checkpoint"]).config.image_size == 32
    assert record["parameters"]["compile_mode"] is None  # the eager step, recorded (the paper profile's is graphed)
