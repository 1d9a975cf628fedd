"""The SugarCrepe-"add" control study: scoring with another item's image, end to end on tiny models."""
import json
import warnings

import mdc.eval.compositionality as C
from conftest import small_model
from mdc.world.evalsets import write_evalsets
from reproduce.studies import sugarcrepe_add as study


def _runs(tmp_path):
    """A profile's run folder as the study reads it: data/evalsets and two descriptive pretraining runs."""
    write_evalsets(str(tmp_path / "data" / "evalsets"), seed=0, image_size=32, n_probe_train=1, n_probe_test=1,
                   n_items=4, n_caption_train=1)
    for objective in ("mdc", "arc"):
        small_model(objective).save(str(tmp_path / "pretrain" / f"{objective}-descriptive-s0"))
    return str(tmp_path)


def test_shifted_gives_every_item_another_items_image(tmp_path):
    runs = _runs(tmp_path)
    suite = C.load_suites(f"{runs}/data/evalsets", ["sugarcrepe/add_obj"])["sugarcrepe/add_obj"]
    moved = study.shifted(suite)
    paths = [it["image_path"] for it in suite.items]
    assert [it["image_path"] for it in moved.items] == paths[1:] + paths[:1] and len(set(paths)) == len(paths)
    assert moved.candidates == suite.candidates and moved.keys() == suite.keys()  # same captions, same items


def test_the_study_scores_both_conditions_and_writes_its_tables(tmp_path):
    runs = _runs(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # synthetic captions exceed the tiny model's context
        study.main(["--runs", runs, "--out", str(tmp_path / "out"), "--num-samples", "2"])
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    keys = {(r["model"], r["scorer"], r["suite"], r["images"]) for r in result["rows"]}
    assert keys == {(m, s, suite, c) for m, scorers in (("MDC", ("elbo", "heuristic")), ("ARC", ("exact",)))
                    for s in scorers for suite in study.SUITES for c in study.CONDITIONS}
    for r in result["rows"]:
        assert r["items"] == 4 and 0 <= r["accuracy"] <= 100
        assert (r["extra_tokens"] == 0) == r["suite"].endswith("replace_att")  # add negatives are longer
    assert (tmp_path / "out" / "results.md").read_text().count("\n") == len(result["rows"]) + 2
