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
                 synthetic_images=3, strengths=[1.0, 3.0], length=5, metrics=["bleu", "cider"], composition_items=3,
                 composition_strengths=[2.0], output_dir=str(out))
    record = json.loads((out / "results.json").read_text())
    assert record["kind"] == "guidance" and record["model"]["extensions"]["guidance"]["cond_drop_prob"] == 0.1
    results = record["results"]
    assert set(results) == {"dataset", "length", "runs", "clip", "unavailable", "compositionality", "files"}
    assert results["dataset"]["images"] == 3 and results["length"] == 5
    labels = ["none", "cfg@s=1", "cfg@s=3", "mcs@s=1", "mcs@s=3", "mcs_mirror@s=1", "mcs_mirror@s=3"]
    assert [r["label"] for r in results["runs"]] == labels
    assert [(r["strength"], r["scale"]) for r in results["runs"]] == [(None, None), (1, 2), (3, 4), (1, 1), (3, 3),
                                                                      (1, 2), (3, 4)]
    for r in results["runs"]:
        assert r["bleu4"] is not None and r["cider"] is not None and r["meteor"] is None
        assert 0 <= r["clipscore"] <= 2.5 and 0 <= r["refclipscore"] <= 2.5
    assert {k: v for k, v in results["clip"].items() if k != "checkpoint_id"} == {
        "checkpoint": str(tmp_path / "clip"), "kind": "mdc", "prefix": ""}
    none = results["runs"][0]
    assert none["changed"] == none["word_edit"] == 0.0
    for r in results["runs"]:  # per-image outcomes: what the intervals resample
        assert sorted(r["per_image"]) == ["bleu", "cider", "clipscore"]
        assert len(r["per_image"]["clipscore"].split()) == 3 and len(r["per_image"]["bleu"].split()) == 18
        assert abs(sum(map(float, r["per_image"]["clipscore"].split())) / 3 - r["clipscore"]) < 1e-4
    assert results["unavailable"] == {"meteor": "not requested"}
    predictions = json.loads(open(results["files"]["predictions"]).read())
    assert list(predictions) == labels
    assert all(len(c.split()) <= 5 for c in predictions["mcs_mirror@s=3"].values())
    assert os.path.isfile(results["files"]["figure"]) and os.path.isfile(out / "guidance_tradeoff.pdf")
    table = results["compositionality"]["table2"]
    variants = ("none", "cfg@s=2", "mcs@s=2", "mcs_mirror@s=2")
    assert set(table) == {f"{v}{k}{s}" for v in variants for k in ("", "_blind")  # and without the image (the
                          for s in ("", "_lengthnorm")}  # heuristic scorer has no debiased variant)
    assert all(0 <= a <= 1 for row in table.values() for a in row.values() if a is not None)
    from reproduce.artifacts import paper_tables  # the table and figure from the results alone

    files = paper_tables.guidance([{"notebook": "guidance", "artifacts": ["guidance"], "record": record}], "", str(out / "fig"))
    rows = (out / "fig" / "guidance_tradeoff.md").read_text()
    assert len(files) == 5 and "CLIPScore - unguided" in rows and "[" in rows


def test_notebook_refuses_a_model_trained_without_guidance(tmp_path, run_notebook):
    small_model(**WORLD_SMALL).save(tmp_path / "plain")
    with pytest.raises(papermill.PapermillExecutionError, match="needs a model trained with cond_drop_prob > 0"):
        run_notebook("guidance", checkpoint=str(tmp_path / "plain"), output_dir=str(tmp_path / "run"))
