"""notebooks/captioning.ipynb runs under papermill with smoke settings and writes the documented results."""
import json
import os

import papermill
import pytest

from conftest import WORLD_SMALL, committed_notebook, small_model

@pytest.fixture
def checkpoints(tmp_path):
    for objective in ("mdc", "arc"):
        small_model(objective, **WORLD_SMALL).save(tmp_path / objective)
    return str(tmp_path / "mdc"), str(tmp_path / "arc")


def test_notebook_is_committed_clean_with_one_parameters_cell():
    nb, _ = committed_notebook("captioning")
    assert "Table 3" in nb.cells[0].source and "Fig. 6" in nb.cells[0].source


def test_captioning_notebook_smoke(tmp_path, run_notebook, checkpoints, fake_judge):  # noqa: F811
    out = tmp_path / "run"
    run_notebook("captioning", mdc_checkpoint=checkpoints[0], arc_checkpoint=checkpoints[1], max_images=3,
                 synthetic_images=[8, 4], finetune_steps=2, finetune_batch_size=4, metrics=["bleu", "rouge_l", "cider"],
                 judge_endpoint=fake_judge[0], judge_model="fake", output_dir=str(out))
    record = json.loads((out / "results.json").read_text())
    assert record["kind"] == "captioning" and record["model"]["objective"] == "mdc"
    results = record["results"]
    assert set(results) == {"dataset", "metrics", "judge", "unavailable", "checkpoints", "finetune", "files", "examples"}
    assert len(results["examples"]) == 3 and all(os.path.isfile(e["image_path"]) for e in results["examples"])
    dataset = results["dataset"]
    assert dataset | {"captions_json": None, "reference_words": None} == {
        "name": "coco", "captions_json": None, "format": "karpathy", "split": "test", "reference_words": None,
        "images_evaluated": 3, "images_total": 4, "images_missing": 0, "image_ids": dataset["image_ids"]}
    assert len(dataset["image_ids"]) == 3 and dataset["reference_words"] > 3
    assert list(results["metrics"]) == ["arc-greedy", "arc-beam6", "arc-beam6-ref", "mdc-10", "mdc-15", "mdc-20",
                                        "mdc-arc", "mdc-ref"]  # ARC first: MDC is matched to its lengths
    for m in results["metrics"].values():
        assert m["bleu4"] is not None and m["cider"] is not None and m["meteor"] is None and m["spice"] is None
        assert 0 < m["bp"] <= 1 and m["words"] > 0 and len(m["cider_per_image"]) == 3
    assert results["unavailable"] == {"meteor": "not requested", "spice": "not requested"}
    judge = results["judge"]
    assert judge["images"] == 3 and judge["valid"] + judge["invalid"] == 3 and len(judge["models"]) == 4  # the paper's
    assert set(results["finetune"]) == {"mdc", "arc"} and len(results["finetune"]["arc"]["loss"]) == 2
    assert [s for s, _ in results["finetune"]["mdc"]["val"]] == [0, 2]  # the stopping rule read the validation loss
    assert results["checkpoints"]["arc"]["path"] == checkpoints[1]
    assert os.path.isdir(results["checkpoints"]["mdc"]["finetuned"])
    predictions = json.loads(open(results["files"]["predictions"]).read())
    assert len(predictions["mdc-15"]) == 3 and all(len(c.split()) <= 15 for c in predictions["mdc-15"].values())
    assert open(results["files"]["table"]).readline().startswith("method,length_coco,words,bp,coco_bleu4")
    assert os.path.isfile(results["files"]["figure"]) and os.path.isfile(results["files"]["judge_answers"])
    assert os.path.isfile(out / "fig6_captions.pdf")


def test_captioning_notebook_names_swapped_checkpoints(tmp_path, run_notebook, checkpoints):
    with pytest.raises(papermill.PapermillExecutionError, match=r"mdc_checkpoint = .* holds an 'arc' captioner, expected 'mdc'"):
        run_notebook("captioning", mdc_checkpoint=checkpoints[1], arc_checkpoint=checkpoints[0],
                     synthetic_images=[4, 4], output_dir=str(tmp_path / "run"))
