"""The compute ladder (reproduce/studies/ladder/): every rung's runs per seed, each arm changing only what it says,
the 4x captions as the reference's Table 3, the kept models, and the seed plan's slope arithmetic."""
import math

import numpy as np
import pytest

from reproduce import power, registry
from reproduce.studies import ladder
from reproduce.studies.driver.study import plan_keys

DEFAULT = {"default": 3, "seeds": {}}


@pytest.fixture(scope="module")
def runs():
    return {r.name: r for r in ladder.study_runs("mini", DEFAULT)}


@pytest.fixture(scope="module")
def reference():
    return {r.name: r for r in registry.build("mini", 3)}


def test_every_rung_has_mdc_and_arc_with_their_readers_and_the_side_arms_mdc_alone(runs):
    assert len(runs) == len(ladder.study_runs("mini", DEFAULT))  # names are unique
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


def test_seed_zero_of_the_4x_rotary_and_dense_models_is_kept_and_steps_are_keyed(runs):
    kept = {n for n, r in runs.items() if r.notebook == "pretrain" and ladder.STUDY.keep(r)}
    assert kept == {"pretrain/ladder-x4-mdc-descriptive-s0", "pretrain/ladder-x4-arc-descriptive-s0",
                    "pretrain/ladder-rotary-x4-mdc-descriptive-s0", "pretrain/ladder-dense-mdc-descriptive-s0"}
    key = plan_keys(ladder.STUDY, list(runs.values()))
    assert key["repetition/x1-mdc-descriptive-s0"] != key["repetition/x2-mdc-descriptive-s0"]
    step = runs["repetition/x1-mdc-descriptive-s0"]
    assert step.params["checkpoint"] == "{run:pretrain/ladder-x1-mdc-descriptive-s0}" and step.params["n_scenes"] == 300


def test_the_slope_rows_scale_the_gaps_noise_by_the_rungs_spread():
    gap = {"per_seed": [-4.0, -5.0, -6.0], "mean": -5.0, "v_items": 0.1}
    closes, holds = ladder.slope_rows("probe", gap, rungs=(0.25, 0.5, 1, 2, 4), seeds=3)
    assert closes["slope effect"] == pytest.approx(5.0 / 4) and holds["margin m"] == pytest.approx(0.5)
    sxx = float(((np.log2([0.25, 0.5, 1, 2, 4])) ** 2).sum())  # 10: centred on 1x
    assert closes["seeds"] == power.needed_seeds(5.0 / 4, 1.0 / math.sqrt(sxx), 0.1 / sxx, 0.975)
    assert holds["seeds"] == power.needed_seeds(0.5, 1.0 / math.sqrt(sxx), 0.1 / sxx, 0.95)
    k = holds["seeds"]  # the power it prints is reproduce.power's: 80% at the seeds it asks, less with one fewer
    fewer, enough = (ladder.slope_rows("probe", gap, (0.25, 0.5, 1, 2, 4), seeds=n)[1]["power"] for n in (k - 1, k))
    assert k > 3 and holds["power"] <= fewer < 0.8 <= enough
