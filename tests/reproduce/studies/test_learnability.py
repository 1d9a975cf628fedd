"""The learnability study's rule, the `mini` configuration it froze (model "mini", preset file
reproduce/presets/mini.json) and its decisions from its records."""
import json
import os

import pytest

import mdc
from mdc.factory import model_config
from mdc.train import TrainConfig
from reproduce import registry
from reproduce.studies import learnability as rules

MINI = os.path.relpath(registry.MINI_PRESET)  # as the documented commands give it, from the repository root
CHOSEN = "c64x4"  # the ceiling's choice c64 (learnability/ceiling_decision.json) at 4x the first study's steps
FIRST = "s32q"  # the first study's choice (learnability/decision.json), the `mini` of the committed figures


def test_the_frozen_model_is_the_studied_configuration():
    frozen, studied = model_config("mini"), model_config("tiny", **rules.CONFIGS[CHOSEN]["model"])
    assert {**vars(frozen), "name": None} == {**vars(studied), "name": None}
    for objective in ("mdc", "arc", "clip"):
        model = mdc.create_model("mini", objective=objective)
        assert model.config.image_size == 64 and model.config.vision_stem == "conv"
        assert model.config.objective == objective


def test_the_mini_preset_is_the_studied_recipe():
    c = TrainConfig(output_dir="x", preset=MINI, objective="mdc", train_data="x.tar").resolved(world_size=1)
    recipe = rules.CONFIGS[CHOSEN]
    assert (c.model, c.steps, c.batch_size, c.accum_steps, c.lr, c.warmup_steps) == \
        ("mini", recipe["steps"], recipe["batch"], 1, recipe["lr"], recipe["warmup"])
    assert c.epochs is None and c.weight_decay == 0.1


def test_the_mini_preset_gives_clip_the_learning_rate_its_rule_chose():
    """learnability.md, "Rule for CLIP's learning rate": CLIP (and CLIP-LB) 3e-4, MDC and ARC 1e-3, through the
    public command line's config and in every pretraining run of `make reproduce`."""
    chosen = {"mdc": 1e-3, "arc": 1e-3, "clip": 3e-4}
    for objective, lr in chosen.items():
        c = TrainConfig(output_dir="x", preset=MINI, objective=objective, train_data="x.tar")
        assert c.resolved(world_size=1).lr == lr, objective
    pretraining = [r for r in registry.build("mini", seeds=1) if r.notebook == "pretrain"]
    assert {r.name for r in pretraining if r.params["objective"] == "clip"} == \
        {"pretrain/clip-alt-s0", "pretrain/clip-descriptive-s0", "pretrain/cliplb-descriptive-s0"}
    assert [(r.name, r.params["lr"]) for r in pretraining if r.params["lr"] != chosen[r.params["objective"]]] == []


def test_the_decision_files_name_the_frozen_configuration():
    folder = rules.FOLDER
    first = json.load(open(os.path.join(folder, "decision.json")))
    assert first["choice"] == FIRST and first["rule"]["max_minutes"] == rules.RULE["max_minutes"]
    ceiling = json.load(open(os.path.join(folder, "ceiling_decision.json")))
    assert ceiling["rule"] == json.loads(json.dumps(rules.CEILING_RULE))
    assert rules.CONFIGS[ceiling["choice"]]["model"] == rules.CONFIGS[CHOSEN]["model"]
    assert ceiling["candidates"][ceiling["choice"]]["lr"] == rules.CONFIGS[CHOSEN]["lr"]


def _row(config, objective, seed, gap):
    return {"config": config, "objective": objective, "seed": seed, "gap_mean4": gap}


def test_rule_prefers_a_passing_configuration_then_falls_back_to_the_best_weakest_objective(tmp_path, monkeypatch):
    cfg = dict(model={"image_size": 32}, style="descriptive", batch=64)
    monkeypatch.setattr(rules, "CONFIGS", {"a": dict(cfg, steps=100), "b": dict(cfg, model={"image_size": 48},
                                                                                  steps=100),
                                           "a_long": dict(cfg, steps=1000)})
    rows = [_row("a", o, s, g) for s in range(3) for o, g in (("mdc", 9 + s * 0.1), ("arc", 12), ("clip", 30))]
    rows += [_row("b", o, s, g) for s in range(3) for o, g in (("mdc", 10), ("arc", 11), ("clip", 10.5 + s))]
    rows += [_row("a_long", o, 0, 40) for o in ("mdc", "arc", "clip")]  # strong but unaffordable
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    timing = [{"config": "a", "mdc": 1.0, "arc": 1.2, "clip": 1.5}, {"config": "b", "mdc": 1.0, "arc": 1.0, "clip": 1.0}]
    (tmp_path / "timing.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timing))
    d = rules.decide(str(tmp_path))
    assert d["by"] == "fallback" and d["choice"] == "b"  # weakest objective: b 10 > a 9.1
    assert d["configs"]["a_long"]["minutes"] == pytest.approx(1000 * 1.5 / 60)  # a's step cost, 10x the steps
    assert "a_long" not in d["weakest_gap"]
    passing = [_row("a", o, s, 25 + 0.5 * s) for s in range(3) for o in ("mdc", "arc", "clip")]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in passing + rows[9:]))
    d = rules.decide(str(tmp_path))  # a passes (gaps >= 20, std 0.5), b does not
    assert d["by"] == "rule" and d["choice"] == "a"
    spread = [_row("a", o, s, 25 + 2 * s) for s in range(3) for o in ("mdc", "arc", "clip")]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in spread + rows[9:]))
    assert rules.decide(str(tmp_path))["by"] == "fallback"  # std 2 > 1.5


def test_a_configuration_timed_in_several_settings_costs_its_fastest(tmp_path, monkeypatch):
    """Timing passes with and without workers or torch.compile: the order they ran in must not matter."""
    cfg = dict(model={"image_size": 32}, style="descriptive", batch=64, steps=600)
    monkeypatch.setattr(rules, "CONFIGS", {"a": cfg})
    rows = [_row("a", o, 0, 10) for o in ("mdc", "arc", "clip")]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    timing = [{"config": "a", "workers": 1, "mdc": 0.5, "arc": 0.5, "clip": 0.4},
              {"config": "a", "workers": 1, "compile": True, "mdc": 0.6, "arc": 0.55, "clip": 0.45}]
    (tmp_path / "timing.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timing))
    assert rules.decide(str(tmp_path))["configs"]["a"]["minutes"] == pytest.approx(600 * 0.5 / 60)


def test_ceiling_rule_takes_each_candidates_lower_loss_then_the_cheapest_reaching_the_target(tmp_path):
    def row(config, lr, loss, gap):
        return {"config": config, "recipe": {"lr": lr}, "final_loss": loss, "gap_mean4": gap}

    rows = [row("a", 3e-3, 4.0, 20.0), row("a", 1e-3, 3.5, 28.0), row("b", 1e-3, 3.0, 25.0)]
    (tmp_path / "ceiling.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = rules.decide_ceiling(str(tmp_path))
    assert d["choice"] == "a" and d["candidates"]["a"]["lr"] == 1e-3 and d["by"].startswith("highest")
    rows += [row("b", 3e-3, 2.0, 60.0), row("c", 1e-3, 1.0, 55.0)]
    (tmp_path / "ceiling.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="timing"):
        rules.decide_ceiling(str(tmp_path))
    (tmp_path / "timing.jsonl").write_text(json.dumps({"config": "b", "mdc": 0.5, "arc": 0.6, "clip": 0.4}) + "\n"
                                           + json.dumps({"config": "c", "mdc": 0.3, "arc": 0.3, "clip": 0.3}) + "\n")
    assert rules.decide_ceiling(str(tmp_path))["choice"] == "c"  # both reach 50; c is cheaper


def test_the_committed_decisions_recompute_from_the_committed_records():
    """The study is finished (its driver retired): its records still give both decisions, exactly."""
    for name, decide in (("decision.json", rules.decide), ("ceiling_decision.json", rules.decide_ceiling)):
        with open(os.path.join(rules.FOLDER, name)) as f:
            assert json.loads(json.dumps(decide(rules.FOLDER))) == json.load(f), name
