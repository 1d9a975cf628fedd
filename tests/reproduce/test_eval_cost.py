"""The parameter-aware estimate: a record made with other parameters is scaled by the cost model of its kind,
a record of the same work is taken as it is, a kind without a model says so; on made-up records."""
import json
import os

import pytest

from reproduce.cost import eval_cost
from reproduce.running import ledger, runner
from reproduce.graph import Run
from reproduce.running.runner import RunSettings

# made-up seconds per unit: round numbers, so that every scale below is exact
UNITS = {"linear_probe": {"extract_per_image": 1.0, "fit_pooled_per_row_epoch": 0.0, "fit_grid_per_row_epoch": 0.0},
         "compositionality": {o: {k: {"image": 1.0, "blind": 0.5, "shuffled": 1.0}
                                  for k in ("order", "template", "own")} for o in ("mdc", "arc", "clip")},
         "guidance": {"caption_none": 1.0, "caption_cfg": 2.0, "caption_mcs": 2.0, "caption_mcs_mirror": 2.0,
                      "composition": {"order": 10.0, "template": 1.0, "own": 1.0}}}
EVALSETS = Run("data/evalsets", "data", dict(kind="evalsets", n_probe_train=3000, n_probe_test=None, n_items=300))


@pytest.fixture(autouse=True)
def made_up_units(monkeypatch):
    monkeypatch.setattr(eval_cost, "units", lambda path=None: UNITS)


def _record(records, name, notebook, params, results, seconds, labels=None):
    record = {"schema": ledger.SCHEMA, "run": name, "key": "old", "notebook": notebook, "params": params,
              "labels": labels or {}, "seed": 0, "seconds": seconds, "results": results}
    os.makedirs(os.path.dirname(ledger.path(records, name)), exist_ok=True)
    with open(ledger.path(records, name), "w") as f:
        json.dump(record, f)


def _probe_record(records, name="probe/mdc-alt-s0", n_test=1000, grid=0, seconds=320.0):
    """A probe record; ``grid`` 0: a run made without the grid probe."""
    tasks = ("object", "shape", "texture", "count", "relation", "shape_texture", "colour", "background")
    r = {"datasets": {f"wds/{t}": {"n_train": 3000, "n_test": n_test} for t in tasks}}
    if grid:
        r["grid"] = {"datasets": {}}
    parameters = {"epochs": 10, "grid": grid}
    _record(records, name, "linear_probe", {"epochs": 10, "seed": 0},
            {"parameters": parameters, "results": r}, seconds)


def _probe_run(name="probe/mdc-alt-s0"):
    return Run(name, "linear_probe", {"epochs": 10, "seed": 0}, deps=("pretrain/x", "data/evalsets"))


def test_the_notebooks_defaults_are_read_from_their_parameters_cell():
    comp = eval_cost.notebook_defaults("compositionality")
    assert comp["shuffled"] is True and comp["blind"] is True and isinstance(comp["blind_images"], int)
    assert eval_cost.notebook_defaults("linear_probe")["grid"] == 4


def test_suites_count_their_candidate_captions_by_kind():
    assert eval_cost.planned_suites(["aro_coco_order"], 300) == {"order": 25 * 300}
    assert eval_cost.planned_suites(["aro_relation", "aro_attribute", "sugarcrepe", "own"], 300) == {
        "template": 2 * 300 * 9, "own": 2 * 300 * 9}
    columns = {"aro_relation": {"total": 300, "items": 300, "candidates": 2},
               "aro_attribute": {"total": 300, "items": 193, "candidates": 2},  # counted before the exclusions
               "aro_coco_order": {"total": 1500, "items": 1500, "candidates": 5}}
    assert eval_cost.recorded_suites(columns) == {"template": 1200, "order": 7500}
    # the order task of its first 20 images: 20 x 5 captions x 5 candidates, planned and recorded alike
    assert eval_cost.planned_suites("all", 300, order_images=20)["order"] == 25 * 20
    scored = {"aro_coco_order": {"total": 1500, "items": 100, "candidates": 5}}
    assert eval_cost.recorded_suites(scored) == {"order": 500}
    # the in-distribution suites' first 60 items a file: planned and recorded alike, the template suites untouched
    assert eval_cost.planned_suites("all", 300, own_items=60) == {"template": 2 * 300 * 9, "order": 25 * 300,
                                                                   "own": 2 * 60 * 9}
    assert eval_cost.recorded_suites({"own_swap": {"total": 900, "items": 180, "candidates": 2}}) == {"own": 360}


def test_a_probe_record_of_fewer_test_images_is_scaled_by_the_images(tmp_path):
    records = str(tmp_path)
    _probe_record(records)
    seconds, note = ledger.estimate(_probe_run(), records, "mini", {"data/evalsets": EVALSETS})
    # 8 x 3000 train + 4 x 2560 + 4 x 1000 test now, 8 x 4000 then; the extraction the whole model here
    assert seconds == pytest.approx(320.0 * 38240 / 32000)
    assert "images 32,000 -> 38,240" in note and "grid 0 -> 1" in note and "x 1.20" in note


def test_a_record_of_the_same_work_is_taken_as_it_is(tmp_path):
    records = str(tmp_path)
    _probe_record(records, n_test=None, grid=4)
    with open(ledger.path(records, "probe/mdc-alt-s0")) as f:
        record = json.load(f)
    for name, d in record["results"]["results"]["datasets"].items():
        d["n_test"] = 2560 if name.split("/")[1] in ("object", "shape", "texture", "count") else 1000
    with open(ledger.path(records, "probe/mdc-alt-s0"), "w") as f:
        json.dump(record, f)
    assert ledger.estimate(_probe_run(), records, "mini", {"data/evalsets": EVALSETS}) == (320.0, "")


def test_another_seed_s_record_is_scaled_and_named(tmp_path):
    records = str(tmp_path)
    _probe_record(records, name="probe/mdc-alt-s1", seconds=100.0)
    seconds, note = ledger.estimate(_probe_run(), records, "mini", {"data/evalsets": EVALSETS})
    assert seconds == pytest.approx(100.0 * 38240 / 32000) and note.startswith("the record of seed 0 x 1.20")


def _composition(records, shuffled=False, blind_images=4, seconds=1000.0):
    settings = {"variants": ["elbo", "elbo_blind", "heuristic", "heuristic_blind"], "blind_images": blind_images,
                "shuffled": shuffled}
    columns = {"aro_coco_order": {"total": 1500, "items": 1500, "candidates": 5}}
    _record(records, "compositionality/mdc-descriptive-order-s0", "compositionality", {"suites": ["aro_coco_order"]},
            {"parameters": {"blind": True, "shuffled": shuffled},
             "results": {"settings": settings, "columns": columns}}, seconds,
            labels={"method": "MDC"})


def _composition_run(blind_images=4):
    return Run("compositionality/mdc-descriptive-order-s0", "compositionality",
               dict(suites=["aro_coco_order"], blind_images=blind_images, num_samples=32),
               deps=("pretrain/mdc-descriptive-s0", "data/evalsets"), labels={"method": "MDC", "part": "order"})


def test_table2_s_shuffled_control_and_image_free_images_scale_a_record_made_without_them(tmp_path):
    records = str(tmp_path)
    _composition(records)  # a record made without the control: image 1 + 4 x 0.5 per candidate
    seconds, note = ledger.estimate(_composition_run(), records, "mini", {"data/evalsets": EVALSETS})
    assert seconds == pytest.approx(1000.0 * (1 + 2 + 1) / (1 + 2)) and "shuffled 0 -> 1" in note
    seconds, note = ledger.estimate(_composition_run(blind_images=2), records, "mini", {"data/evalsets": EVALSETS})
    assert seconds == pytest.approx(1000.0 * (1 + 1 + 1) / (1 + 2)) and "blind images 4 -> 2" in note
    _composition(records, shuffled=True)  # a record with the control, as the run is now
    assert ledger.estimate(_composition_run(), records, "mini", {"data/evalsets": EVALSETS}) == (1000.0, "")


def test_a_run_without_any_record_is_estimated_from_its_work_above_the_profile_s_default(tmp_path):
    """A new run of a modelled kind (a Table 2 part no seed has run): its work x the seconds per unit, the
    profile's default a floor for the fixed costs the units leave out; a kind without a model: the default."""
    run = Run("compositionality/mdc-descriptive-own-s0", "compositionality",
              dict(suites=["own"], blind_images=4, num_samples=32),
              deps=("pretrain/mdc-descriptive-s0", "data/evalsets"), labels={"method": "MDC", "part": "own"})
    seconds, note = ledger.estimate(run, str(tmp_path), "mini", {"data/evalsets": EVALSETS})
    assert seconds == pytest.approx(2 * 300 * 9 * (1 + 4 * 0.5 + 1))  # 5,400 candidates: image, K = 4 blind, shuffled
    assert note == "no record: its work x the cost model's seconds per unit"
    # the machine's speed from the records of its kind: an MDC Table 2 part that took half its modeled seconds
    _composition(str(tmp_path), shuffled=True, seconds=7500 * (1 + 4 * 0.5 + 1) / 2)
    seconds, note = ledger.estimate(run, str(tmp_path), "mini", {"data/evalsets": EVALSETS})
    assert seconds == pytest.approx(2 * 300 * 9 * (1 + 4 * 0.5 + 1) / 2)
    assert note.endswith("x 0.50 (recorded / modeled seconds of the 1 MDC compositionality record(s))")
    tiny = Run(run.name, "compositionality", dict(run.params, suites=["own_relation"]), deps=run.deps,
               labels=run.labels)
    small = Run("data/evalsets", "data", dict(EVALSETS.params, n_items=2))
    # a part no seed has measured floors at the notebook's default, not at the measured parts' sum (a 60-item own
    # part models at a fifth of the 300-item one, far below the order and pair parts together)
    assert ledger.estimate(tiny, str(tmp_path), "mini", {"data/evalsets": small}) == (
        ledger.DEFAULT_SECONDS["mini"]["compositionality"], "no record: the profile's default")
    whole = Run(run.name, "compositionality", tiny.params, deps=run.deps, labels={"method": "MDC"})
    assert ledger.estimate(whole, str(tmp_path), "mini", {"data/evalsets": small}) == (
        ledger.MDC_TABLE2_SECONDS["order"] + ledger.MDC_TABLE2_SECONDS["pairs"], "no record: the profile's default")
    assert ledger.estimate(Run("captioning/alt-s0", "captioning", {}), str(tmp_path), "mini")[1] == (
        "no record: the profile's default")


def test_the_guidance_sweep_without_its_guided_compositionality_keeps_its_captions(tmp_path):
    records = str(tmp_path)
    params = dict(max_images=300, strengths=[1.0, 2.0], composition_items=10, guidances=["cfg", "mcs"],
                  composition_strengths=[2.0])
    columns = {"aro_coco_order": {}, "sugarcrepe_add": {}}
    _record(records, "guidance/alt-s0", "guidance", params,
            {"parameters": params, "results": {"dataset": {"images": 300}, "compositionality": {"columns": columns}}},
            seconds=2000.0)
    run = Run("guidance/alt-s0", "guidance", dict(params, composition_items=0), deps=("data/evalsets",))
    captions = 300 * (1 + 2 * 2 + 2 * 2)  # unguided, then two rules at two strengths, 2 s per guided caption
    composition = (250 * 10.0 + 140 * 1.0) * 3  # 10 items: order 250 candidates, SugarCrepe 140; 3 settings
    seconds, note = ledger.estimate(run, records, "mini", {"data/evalsets": EVALSETS})
    assert seconds == pytest.approx(2000.0 * captions / (captions + composition))
    assert "composition settings 3 -> 0" in note


def test_a_kind_without_a_cost_model_is_taken_as_recorded_and_says_so(tmp_path):
    records = str(tmp_path)
    _record(records, "captioning/alt-s0", "captioning", {"max_images": 500}, {}, seconds=180.0)
    run = Run("captioning/alt-s0", "captioning", {"max_images": 300})
    seconds, note = ledger.estimate(run, records, "mini")
    assert seconds == 180.0 and note.startswith("as recorded: other parameters")
    assert ledger.estimate(Run("captioning/alt-s0", "captioning", {"max_images": 500}), records, "mini") == (180.0, "")


def test_the_dry_run_says_which_estimates_are_scaled_and_sums_evaluation_s_share(tmp_path):
    records = str(tmp_path / "records")
    _probe_record(records, seconds=600.0)
    _record(records, "pretrain/x", "pretrain", {}, {}, seconds=2400.0)
    runs = [EVALSETS, Run("pretrain/x", "pretrain", {}), _probe_run()]
    lines = []
    runner.dry_run(runs, str(tmp_path / "out"), RunSettings(records=records, profile="mini"), log=lines.append)
    probe = next(line for line in lines if line.startswith("would run probe/mdc-alt-s0"))
    assert "~12 min (its record x 1.20: images 32,000 -> 38,240" in probe
    assert "pretraining 0.67, evaluation 0.20 (23% of the two)" in lines[-1]
