"""notebooks/compositionality.ipynb runs under papermill with smoke settings and writes its results file."""
import os

import numpy as np
import papermill
import pytest

from conftest import committed_notebook, small_model
from mdc.eval.compositionality import COLUMNS
from mdc.eval.results import read_results

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOTEBOOK = os.path.join(ROOT, "notebooks", "compositionality.ipynb")


def test_notebook_is_committed_clean_with_one_parameters_cell():
    nb, parameters = committed_notebook("compositionality")
    assert "Table 2" in nb.cells[0].source
    lines = [line for line in parameters.source.splitlines() if line.strip()]
    assert all(line.count("=") == 1 and "  # " in line for line in lines)  # one literal and a comment per line
    assert len(papermill.inspect_notebook(NOTEBOOK)) == len(lines)  # papermill reads every one


def test_compositionality_notebook_smoke(tmp_path, run_notebook):
    checkpoint = tmp_path / "ckpt"
    small_model("mdc").save(str(checkpoint))
    out = tmp_path / "run"
    run_notebook("compositionality", checkpoint=str(checkpoint), num_samples=2, n_items=4, attribute_min_count=1,
                 tagger="builtin", batch_size=4, resamples=20, own_items=2, output_dir=str(out))
    record = read_results(out / "results.json", kind="compositionality")
    results = record["results"]
    assert record["parameters"]["num_samples"] == 2 and record["model"]["objective"] == "mdc"
    assert set(record["parameters"]) == set(papermill.inspect_notebook(NOTEBOOK))  # every parameter, as run
    assert record["checkpoint_id"] and record["runtime_s"] > 0
    assert set(results) >= {"settings", "columns", "sugarcrepe_subsets", "own_subsets", "table2", "item_scores"}
    assert set(results["columns"]) == set(COLUMNS) - {"aro_flickr30k_order"}  # no Flickr30k in the synthetic world
    assert {"own_relation", "own_attribute", "own_add", "own_replace", "own_swap"} <= set(results["columns"])
    raw = ["elbo", "elbo_trained_t", "heuristic"]  # each with its shuffled-image, image-free and debiased scores
    debiased = ["elbo", "elbo_trained_t"]  # the heuristic has none: without the image it reveals in another order
    kinds = ("", "_shuffled", "_blind")
    assert results["settings"]["variants"] == [f"{v}{k}" for v in raw for k in kinds] + [f"{v}_debiased" for v in debiased]
    assert results["settings"]["debias_alpha"] == 1.0 and results["settings"]["blind_images"] == 8
    assert results["settings"]["shuffled"] is True and results["settings"]["own_items"] == 2
    own = results["columns"]["own_relation"]
    assert (own["items"], own["total"]) == (2, 4)  # each in-distribution file's first 2 of its 4 items
    assert set(results["table2"]) == {f"{v}{k}{s}" for v in raw for k in kinds for s in ("", "_lengthnorm")} \
        | {f"{v}_debiased{s}" for v in debiased for s in ("", "_lengthnorm")}
    entry = results["columns"]["aro_relation"]
    assert entry["items"] == entry["total"] == 4 and entry["chance"] == 0.5 and entry["data"] == "synthetic"
    assert results["columns"]["aro_coco_order"]["chance"] == 0.2
    assert set(entry["scores"]["heuristic"]) >= {"accuracy", "ci", "ties", "accuracy_lengthnorm", "ci_lengthnorm",
                                                 "above_chance", "image_adds"}
    order = results["columns"]["aro_coco_order"]
    assert order["images"] == 4 and len(order["records"]["correct"]["elbo"]) == 20  # per-item outcomes, 5 per image
    assert set(order["records"]) == {"ids", "clusters", "correct"} and order["ties"] == "win"
    with np.load(out / results["item_scores"]) as scores:
        assert scores["aro_coco_order/elbo"].shape == (20, 5)
    table = (out / "table2.md").read_text()
    assert "| elbo_trained_t_lengthnorm |" in table and "| chance |" in table and "paper" not in table  # the report's


def test_notebook_names_a_missing_dataset_path(tmp_path, run_notebook):
    checkpoint = tmp_path / "ckpt"
    small_model("clip").save(str(checkpoint))
    with pytest.raises(papermill.PapermillExecutionError, match=r"aro_dir: .*no_aro does not exist"):
        run_notebook("compositionality", checkpoint=str(checkpoint), data_dir=None, aro_dir=str(tmp_path / "no_aro"),
                     vg_image_dir=str(tmp_path), output_dir=str(tmp_path / "run"))
