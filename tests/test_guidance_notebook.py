"""notebooks/guidance.ipynb runs under papermill with smoke settings and writes the documented results."""
import json
import os

import papermill
import pytest

from conftest import WORLD_SMALL, committed_notebook, small_model


def test_notebook_is_committed_clean_with_one_parameters_cell():
    nb, parameters = committed_notebook("guidance")
    assert "MC-Diffusion" in nb.cells[0].source and "write_results" in nb.cells[-1].source
    assert all("#" in line for line in parameters.source.splitlines())  # a comment on every parameter


def test_guidance_notebook_smoke(tmp_path, run_notebook):
    small_model(cond_drop_prob=0.1, cond_mask_prob=0.5, **WORLD_SMALL).save(tmp_path / "mdc")
    small_model("clip", **WORLD_SMALL).save(tmp_path / "clip")
    out = tmp_path / "run"
    run_notebook("guidance", checkpoint=str(tmp_path / "mdc"), clip_checkpoint=str(tmp_path / "clip"),
                 synthetic_images=3, scales=[1.0, 3.0], length=5, metrics=["bleu", "cider"], composition_items=3,
                 composition_scales=[2.0], output_dir=str(out))
    record = json.loads((out / "results.json").read_text())
    assert record["kind"] == "guidance" and record["model"]["cond_drop_prob"] == 0.1
    results = record["results"]
    assert set(results) == {"dataset", "length", "runs", "clip", "unavailable", "compositionality", "files"}
    assert results["dataset"]["images"] == 3 and results["length"] == 5
    assert [r["label"] for r in results["runs"]] == ["none", "cfg@1", "cfg@3", "mcs@1", "mcs@3"]
    for r in results["runs"]:
        assert r["bleu4"] is not None and r["cider"] is not None and r["meteor"] is None
        assert 0 <= r["clipscore"] <= 2.5 and 0 <= r["refclipscore"] <= 2.5
    assert results["clip"] == {"checkpoint": str(tmp_path / "clip"), "kind": "mdc", "prefix": ""}
    assert results["unavailable"] == {"meteor": "not requested"}
    predictions = json.loads(open(results["files"]["predictions"]).read())
    assert predictions["cfg@1"] == predictions["none"]  # CFG at scale 1 is the plain model
    assert all(len(c.split()) <= 5 for c in predictions["mcs@3"].values())
    assert os.path.isfile(results["files"]["figure"]) and os.path.isfile(out / "guidance_tradeoff.pdf")
    table = results["compositionality"]["table2"]
    assert set(table) == {f"{v}{s}" for v in ("none", "cfg@2", "mcs@2") for s in ("", "_lengthnorm")}
    assert all(0 <= a <= 1 for row in table.values() for a in row.values() if a is not None)


def test_notebook_refuses_a_model_trained_without_guidance(tmp_path, run_notebook):
    small_model(**WORLD_SMALL).save(tmp_path / "plain")
    with pytest.raises(papermill.PapermillExecutionError, match="needs a model trained with cond_drop_prob > 0"):
        run_notebook("guidance", checkpoint=str(tmp_path / "plain"), output_dir=str(tmp_path / "run"))
