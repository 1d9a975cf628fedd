"""The compute ladder (reproduce/studies/ladder/): every rung's runs per seed, each arm changing only what it says,
the optional arms (4x, its captions as the reference's Table 3, rotary) only where asked, the kept models, and the
seed plan's slope arithmetic."""
import json
import math

import numpy as np
import pytest
from conftest import study_record

from reproduce import power, registry
from reproduce.claims.stats import TASKS
from reproduce.running import ledger
from reproduce.studies import ladder
from reproduce.studies.driver import tables
from reproduce.studies.driver.study import plan_keys
from reproduce.studies.ladder import report

DEFAULT = {"default": 3, "seeds": {}}


@pytest.fixture(scope="module")
def runs():
    return {r.name: r for r in ladder.study_runs("mini", DEFAULT, with_optional=True)}


@pytest.fixture(scope="module")
def reference():
    return {r.name: r for r in registry.build("mini", 3)}


def test_every_rung_has_mdc_and_arc_with_their_readers_and_the_side_arms_mdc_alone(runs):
    assert len(runs) == len(ladder.study_runs("mini", DEFAULT, with_optional=True))  # names are unique
    for arm in ladder.ARMS:
        for o in ("mdc", "arc"):
            for s in range(3):
                tag = f"{arm.name}-{o}-descriptive-s{s}"
                wanted = {f"pretrain/ladder-{tag}", f"probe/ladder-{tag}", f"repetition/{tag}",
                          f"compositionality/ladder-{arm.name}-{o}-descriptive-binding-s{s}"}
                assert wanted <= set(runs) if o in arm.objectives else not wanted & set(runs)
    assert {a.name for a in ladder.ARMS if a.objectives == ("mdc",)} == {"dense", "rotary-x1", "rotary-x4"}
    alt = {n for n in runs if n.startswith("pretrain/") and "-alt-" in n}
    assert alt == {f"pretrain/ladder-x4-{o}-alt-s{s}" for o in ("mdc", "arc") for s in range(3)}


def test_each_arm_changes_only_the_steps_positions_or_t_interval(runs, reference):
    base = reference["pretrain/mdc-descriptive-s1"].params
    moved = ("steps", "warmup_steps", "save_every", "output_dir", "model_overrides", "t_interval")
    assert not any("x0.25" in n for n in runs)  # dropped for the budget before any rung was read
    assert ladder.RUNGS == (0.5, 1, 2)
    for arm, steps, warmup in (("x0.5", 1120, 112), ("x1", 2240, 224), ("x2", 4480, 448),
                               ("x4", 8960, 896), ("rotary-x4", 8960, 896), ("dense", 2240, 224)):
        p = runs[f"pretrain/ladder-{arm}-mdc-descriptive-s1"].params
        assert (p["steps"], p["warmup_steps"], p["save_every"]) == (steps, warmup, math.ceil(steps / 10))
        assert {k: v for k, v in p.items() if k not in moved} == {k: v for k, v in base.items() if k not in moved}
        assert p["model_overrides"] == ({"positions": "rotary"} if arm.startswith("rotary") else {})
        assert p.get("t_interval") == ([0.0, 1.0] if arm == "dense" else base.get("t_interval"))
    x1 = runs["pretrain/ladder-x1-arc-descriptive-s2"].params
    assert {**x1, "output_dir": None} == {**reference["pretrain/arc-descriptive-s2"].params, "output_dir": None}


def test_the_4x_captions_are_the_reference_captioning_run_on_the_4x_models(runs, reference):
    tuned, pre = runs["captioning/ladder-x4-alt-finetuned-s2"], runs["captioning/ladder-x4-alt-pretrained-s2"]
    ref = reference["captioning/alt-s2"].params
    assert tuned.params["finetune_steps"] == ref["finetune_steps"] and pre.params["finetune_steps"] == 0
    assert tuned.deps == ("pretrain/ladder-x4-mdc-alt-s2", "pretrain/ladder-x4-arc-alt-s2", "data/evalsets")
    same = ("output_dir", "mdc_checkpoint", "arc_checkpoint")
    assert {k: v for k, v in tuned.params.items() if k not in same} == {k: v for k, v in ref.items() if k not in same}
    assert runs["caption_words/x4-alt-finetuned-s2"].deps[0] == tuned.name


def test_the_plan_runs_the_ladder_and_dense_and_the_optional_arms_only_where_asked(runs):
    """The budget (PLAN.md) left out x4, its alt captions and the rotary arms: a part without --with-optional
    neither runs them nor makes the alt world they alone read; the plan's runs keep their names and order."""
    plan = [r.name for r in ladder.study_runs("mini", DEFAULT)]
    assert plan == [n for n in runs if n in set(plan)]
    assert {n.split("/")[1].split("-descriptive")[0] for n in plan if n.startswith("pretrain/")} == {
        f"ladder-{a}-{o}" for a in ("x0.5", "x1", "x2") for o in ("mdc", "arc")} | {"ladder-dense-mdc"}
    assert "data/alt" not in plan and "data/alt" in runs
    assert not any(n.startswith("captioning/") for n in plan) and len(plan) == 1 + 1 + 3 * 7 * 4
    assert {a.name for a in ladder.ARMS if a.optional} == {"x4", "rotary-x1", "rotary-x4"}


def test_seed_zero_of_the_top_rungs_and_dense_is_kept_and_steps_are_keyed(runs):
    kept = {n for n, r in runs.items() if r.notebook == "pretrain" and ladder.STUDY.keep(r)}
    assert kept == {f"pretrain/ladder-{a}-descriptive-s0" for a in ("x2-mdc", "x2-arc", "x4-mdc", "x4-arc",
                                                                    "rotary-x4-mdc", "dense-mdc")}
    key = plan_keys(ladder.STUDY, list(runs.values()))
    assert key["repetition/x1-mdc-descriptive-s0"] != key["repetition/x2-mdc-descriptive-s0"]
    step = runs["repetition/x1-mdc-descriptive-s0"]
    assert step.params["checkpoint"] == "{run:pretrain/ladder-x1-mdc-descriptive-s0}" and step.params["n_scenes"] == 300


def test_the_slope_rows_scale_the_gaps_noise_by_the_rungs_spread():
    gap = {"per_seed": [-4.0, -5.0, -6.0], "mean": -5.0, "v_items": 0.1}
    closes, holds = power.slope_rows("probe", gap, rungs=(0.25, 0.5, 1, 2, 4), seeds=3)
    assert closes["slope effect"] == pytest.approx(5.0 / 4) and holds["margin m"] == pytest.approx(0.5)
    sxx = float(((np.log2([0.25, 0.5, 1, 2, 4])) ** 2).sum())  # 10: centred on 1x
    assert closes["seeds"] == power.needed_seeds(5.0 / 4, 1.0 / math.sqrt(sxx), 0.1 / sxx, 0.975)
    assert holds["seeds"] == power.needed_seeds(0.5, 1.0 / math.sqrt(sxx), 0.1 / sxx, 0.95)
    k = holds["seeds"]  # the power it prints is reproduce.power's: 80% at the seeds it asks, less with one fewer
    fewer, enough = (power.slope_rows("probe", gap, (0.25, 0.5, 1, 2, 4), seeds=n)[1]["power"] for n in (k - 1, k))
    assert k > 3 and holds["power"] <= fewer < 0.8 <= enough


# ------------------------------------------------------------------------------------------------ report
ITEMS = 1000
PLAN_ROWS = [{"quantity": q, "test": t, "gap": g, "margin m": m} for q, g, m in (
    ("probe gap (mean4)", -4.7, 0.52), ("binding gap (own_swap)", -48.3, 1.17),
    ("repetition gap (shape named twice)", 63.8, 1.12)) for t in ("closes", "holds")]


def _bits(right: int, n: int = ITEMS) -> str:
    return "1" * right + "0" * (n - right)


def _ladder_records(folder, arc_binds=True):
    """Every rung's MDC and ARC and the side arms, three seeds. Probe (of 1,000 items a task): MDC right
    500 + 20 log2(rung), ARC 560 + 5 log2(rung) (+ the seed), so the gap is -6 + 1.5 log2(rung) points; the
    rotary-x4 MDC matches the 4x ARC. Binding: ARC 95% own (50% with another image unless ``arc_binds``),
    MDC 50%, at every rung. Repetition: MDC names a shape twice in 60% + seed points, ARC 2%, dense MDC 30%."""
    models = [(a, o) for a in ("x0.5", "x1", "x2", "x4") for o in ("mdc", "arc")]
    models += [("dense", "mdc"), ("rotary-x1", "mdc"), ("rotary-x4", "mdc")]
    for seed in range(3):
        for arm, o in models:
            x = math.log2(report.rung(report.PARTNER.get(arm, arm)))
            lab = {"arm": arm, "objective": o, "style": "descriptive", "seed": seed}
            right = (560 + 5 * x if o == "arc" or arm == "rotary-x4" else 500 + 20 * x) + seed
            top = {f"wds/{t}": {"top1": right / ITEMS, "correct": _bits(int(right))} for t in TASKS}
            study_record(folder, f"probe/ladder-{arm}-{o}-descriptive-s{seed}", "linear_probe", {}, 1.0,
                         {"datasets": top}, seed, lab)
            v = "elbo" if o == "mdc" else "exact"
            own = 0.95 if o == "arc" else 0.5
            other = 0.5 if arc_binds or o == "mdc" else own
            scores = {v: {"accuracy": own}, f"{v}_shuffled": {"accuracy": other}, f"{v}_blind": {"accuracy": 0.5}}
            subsets = {s: {"records": {"correct": {v: _bits(int(60 * own), 60)}, "ids": list(range(60))}}
                       for s in tables.SWAPS}
            columns = {c: {"items": 120, "scores": scores} for c in ("own_swap", "own_attribute")}
            study_record(folder, f"compositionality/ladder-{arm}-{o}-descriptive-binding-s{seed}", "compositionality",
                         {}, 1.0, {"columns": columns, "own_subsets": subsets}, seed, lab)
            twice = 0.02 if o == "arc" else 0.3 if arm == "dense" else 0.6 + 0.01 * seed
            view = {"shape_twice": twice, "shape_twice_many": twice, "pairs_exist": 0.5}
            study_record(folder, f"repetition/{arm}-{o}-descriptive-s{seed}", "repetition", {}, 1.0,
                         {"views": {"own": view, "other_image": {**view, "pairs_exist": 0.05},
                                    "references": {"shape_twice": 0.0, "shape_twice_many": 0.0, "pairs_exist": 1.0}}},
                         seed, lab)
        lab = {"arm": "x4", "style": "alt", "stage": "finetuned", "seed": seed}
        m = {"cider": 0.5 + 0.1 * seed, "cider_another_image": 0.1, "bleu4": 0.2, "words": 14.0, "repeated": 0.3}
        study_record(folder, f"captioning/ladder-x4-alt-finetuned-s{seed}", "captioning", {}, 1.0,
                     {"metrics": {"mdc-ref": m, "arc-beam6-ref": m}, "finetune": {"mdc": {"stopped": "plateau"}}},
                     seed, lab)
        study_record(folder, f"caption_words/x4-alt-finetuned-s{seed}", "caption_words", {}, 1.0,
                     {"sets": {"mdc-ref": {"repeated_content": 0.2}}, "references": {"repeated_content": 0.05}},
                     seed, lab)


def _mdc_binding(folder, arm: str, seed: int, right: int) -> None:
    """Rewrite ``arm``'s MDC binding record of ``seed``: right on ``right`` of each own_swap subset's 60 items."""
    path = folder / f"compositionality/ladder-{arm}-mdc-descriptive-binding-s{seed}.json"
    record = json.loads(path.read_text())
    for subset in record["results"]["results"]["own_subsets"].values():
        subset["records"]["correct"]["elbo"] = _bits(right, 60)
    path.write_text(json.dumps(record))


def _line(text: str, table: str, start: str) -> str:
    return text.split(f"### {table}")[1].split(start, 1)[1].split("\n")[0]


def test_contrasts_are_gaps_and_slopes_per_seed_with_the_claims_interval(tmp_path):
    _ladder_records(tmp_path)
    data, _ = report.series_of(ledger.for_build(ledger.read_all(str(tmp_path))))
    gap = report.contrast(data, "probe", [(1, "x1", "mdc"), (-1, "x1", "arc")])
    assert gap["mean"] == pytest.approx(-6.0) and gap["seeds"] == 3 and gap["low"] < -6 < gap["high"] < 0
    b, a = report.slope(data, "probe", ["x0.5", "x1", "x2"])
    assert b["mean"] == pytest.approx(1.5) and a == pytest.approx(-6.0) and 0 < b["low"] < 1.5 < b["high"]
    one = report.contrast({"probe": {k: v for k, v in data["probe"].items() if k[2] == 0}}, "probe",
                          [(1, "x1", "mdc"), (-1, "x1", "arc")])
    assert one["seeds"] == 1 and one["mean"] == pytest.approx(-6.0) and math.isnan(one["low"])  # no seeds' spread
    rep = report.contrast(data, "repetition", [(1, "x2", "mdc"), (-1, "x2", "arc")])  # Student's t over seeds
    assert rep["mean"] == pytest.approx(59.0) and rep["per_seed"] == pytest.approx([58, 59, 60])
    moved = data["binding"][("x2", "arc", 1)]["own_subsets"]["swap_obj"]["records"]
    moved["ids"] = moved["ids"][1:] + [60]  # one seed's ARC scored on other items: no per-item contrast
    with pytest.raises(ValueError, match="the records of .* were scored on different items"):
        report.contrast(data, "binding", [(1, "x2", "mdc"), (-1, "x2", "arc")])
    assert report.judge_slope({"low": 0.1, "high": 2.0}, -4.7, 0.5) == "closes"
    assert report.judge_slope({"low": -0.3, "high": 0.4}, -4.7, 0.5) == "holds"
    assert report.judge_slope({"low": -0.3, "high": 0.4}, 60.0, 0.5) == "holds"
    assert report.judge_slope({"low": -2.0, "high": -0.1}, 60.0, 0.5) == "closes"
    assert report.judge_slope({"low": -0.3, "high": 0.9}, -4.7, 0.5) == "not resolved"


def test_the_report_judges_each_gap_by_the_plans_rules(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "paper_hours", lambda: 100.0)  # the paper profile's cost: tested in tests/reproduce
    _ladder_records(tmp_path / "records")
    (tmp_path / "seeds.json").write_text(json.dumps({"rows": PLAN_ROWS}))
    text = report.build(str(tmp_path / "records"), str(tmp_path))
    assert (tmp_path / "tables.md").read_text() == text + "\n" and (tmp_path / "ladder.png").is_file()
    probe = text.split("### Probe gap")[1].split("###")[0]
    assert "over x0.5, x1, x2 (3 seeds with every rung): +1.5 [" in probe and "**closes**" in probe
    assert _line(text, "Probe gap", "| x4 | 8,960 |").startswith(" -3.0 [")  # beside the ladder, outside its slope
    assert "16.0x mini's steps (35,840 steps); 1,600 GPU-hours" in probe  # 2^(6 / 1.5): labelled an extrapolation
    assert _line(text, "Probe gap", "| rotary-x4 |").endswith("| closes the probe gap at 4x |")
    assert "**holds**" in text.split("### Repetition gap")[1] and "**holds**" in text.split("### Binding gap")[1]
    assert _line(text, "Binding gap", "| x0.5 |").endswith("| ARC binds |")
    assert _line(text, "Repetition gap", "| dense |").split(" | ")[-2:] == ["-31.0 [-33.5, -28.5]", "repeats less |"]
    assert _line(text, "Repetition gap", "| x1 | 2,240 |").startswith(" +59.0 [") and "First rung" in text
    assert "the true captions (the ceiling): shape named twice 0.0%, pairs exist 100.0%" in text
    assert _line(text, "Captions at 4x", "| x4 | finetuned mdc-ref | ").startswith("60.0 +- 10.0 (3) | 10.0 +- 0.0 (3)")
    assert "From 105 run records of package p0." in text


def test_an_optional_rung_of_fewer_seeds_leaves_the_ladders_slope_its_seeds(tmp_path, monkeypatch):
    """The 4x rung is optional: were it run for seed 0 alone, the slope over the plan's rungs keeps all three seeds
    (a slope over every rung found would have kept seed 0 alone), and its one seed's differences carry no interval
    in any table (no seeds' spread to give one)."""
    monkeypatch.setattr(report, "paper_hours", lambda: 100.0)
    _ladder_records(tmp_path / "records")
    for seed in (1, 2):
        for o in ("mdc", "arc"):
            for name in (f"probe/ladder-x4-{o}-descriptive-s{seed}", f"repetition/x4-{o}-descriptive-s{seed}",
                         f"compositionality/ladder-x4-{o}-descriptive-binding-s{seed}"):
                (tmp_path / "records" / f"{name}.json").unlink()
    text = report.build(str(tmp_path / "records"), str(tmp_path))
    assert "over x0.5, x1, x2 (3 seeds with every rung): +1.5 [" in text.split("### Probe gap")[1]
    assert _line(text, "Probe gap", "| x4 | 8,960 |") == " -3.0 | - (1) |  |  |"  # its one seed, no interval
    moved = _line(text, "Probe (", "| x4 | MDC |").rstrip(" |").split(" | ")[-1]
    assert moved == "+4.0"  # x4 MDC - x1 MDC of one seed: no interval here either, as the binding column has none


def test_binding_verdicts_need_the_1x_arc_to_bind(tmp_path):
    _ladder_records(tmp_path / "records", arc_binds=False)
    text = report.build(str(tmp_path / "records"), str(tmp_path))
    assert "**control failed (the 1x ARC does not bind)**" in text.split("### Binding gap")[1]
    assert _line(text, "Binding gap", "| x1 |").endswith("| ARC does not bind |")


def test_a_binding_difference_has_one_interval_in_both_tables(tmp_path):
    """The binding table's arm - x1 column and the gap table's side-arm column are the same contrast (dense MDC
    minus x1 MDC): both carry the claims' interval over items and seeds, not one of them Student's t over seeds."""
    _ladder_records(tmp_path / "records")
    for seed in range(3):  # the dense MDC right on 25 + 5 seed of each subset's 60 items: x1's 30 give a spread
        _mdc_binding(tmp_path / "records", "dense", seed, 25 + 5 * seed)
    text = report.build(str(tmp_path / "records"), str(tmp_path))
    table = _line(text, "Binding (", "| dense | MDC |").rstrip(" |").split(" | ")[-1]
    assert table == _line(text, "Binding gap", "| dense |").split(" | ")[-2] != "+0.0 [+0.0, +0.0]"


def test_every_plotted_rung_has_its_tick_before_its_gap_does(tmp_path):
    """The first 4x run (MDC, no ARC partner yet) is drawn at 8,960 steps with no gap beneath it: the shared step
    axis still labels it."""
    _ladder_records(tmp_path)
    for f in tmp_path.glob("*/ladder-x4-arc-*"):
        f.unlink()
    data, _ = report.series_of(ledger.for_build(ledger.read_all(str(tmp_path))))
    top, gaps = report.plotted(data, "probe")
    assert 8960 in [x for x, _ in top["MDC"]] and 8960 not in [x for x, _ in gaps]
    assert report.ticks(top, gaps) == [1120, 2240, 4480, 8960]


def test_an_interval_wider_than_a_share_runs_off_its_panel(tmp_path):
    """Two seeds give Student's t one degree of freedom: the 4x MDC that binds in one seed and not in the other has
    an interval far past 0-100%, and the binding panel held it all, pressing every other point into a line. A panel
    shows what its measure can be (a share, or a difference of two); a wider interval runs off it."""
    _ladder_records(tmp_path)
    _mdc_binding(tmp_path, "x4", 0, 30)
    _mdc_binding(tmp_path, "x4", 1, 60)
    (tmp_path / "compositionality/ladder-x4-mdc-descriptive-binding-s2.json").unlink()
    data, _ = report.series_of(ledger.for_build(ledger.read_all(str(tmp_path))))
    lines, gaps = report.plotted(data, "binding")
    wide = dict(lines["MDC"])[8960]
    assert wide["seeds"] == 2 and wide["low"] < -100 and wide["high"] > 200
    (low, high), (gap_low, gap_high) = report.ylim(lines.values()), report.ylim([gaps], gap=True)
    means = [c["mean"] for pts in lines.values() for _, c in pts]
    assert -5 <= low <= min(means) and max(means) <= high <= 105
    assert -110 <= gap_low and 0 < gap_high <= 110  # padded by 5% of the panel's span; the gap's 0 in view
