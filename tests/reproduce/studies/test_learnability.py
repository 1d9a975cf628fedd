"""The learnability study's rule and the `mini` configuration it froze (model "mini", preset file
reproduce/presets/mini.json)."""
import json
import os
import subprocess
import sys

import pytest

import mdc
from mdc.world.scenes import write_shards
from mdc.factory import model_config
from mdc.train import TrainConfig
from reproduce import registry
from reproduce.studies import learnability as study
from reproduce.studies import learnability_rules as rules
from reproduce.studies import learnability_runs as runs

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
    folder = os.path.join(os.path.dirname(study.__file__), "learnability")
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


def test_writing_the_record_keeps_its_rows_and_adds_the_working_folders(tmp_path, monkeypatch, capsys):
    """``--summary --write DIR`` from a working folder that holds this session's runs only (the folder of
    earlier sessions is gone): DIR keeps every row it had, gains the new ones once, and decides from all."""
    monkeypatch.setattr(rules, "CONFIGS", {"a": dict(model={"image_size": 32}, style="descriptive", batch=64,
                                                     steps=100)})

    def full(seed, gap):
        return [_row("a", o, seed, gap) | {"gap": dict.fromkeys(rules.TASKS, gap), "wall_s": 60.0, "cpu_s": 120.0}
                for o in ("mdc", "arc", "clip")]

    def lines(rows):
        return "".join(json.dumps(r) + "\n" for r in rows)

    record, work = tmp_path / "record", tmp_path / "work"
    record.mkdir()
    work.mkdir()
    earlier, probe = full(0, 21.0), {"checkpoint": "runs/x", "seed": 7, "gap_mean4": 21.1}
    (record / "runs.jsonl").write_text(lines(earlier))
    (record / "probes.jsonl").write_text(lines([probe]))
    (record / "timing.jsonl").write_text(lines([{"config": "a", "mdc": 1.0, "arc": 1.0, "clip": 1.0}]))
    (work / "runs.jsonl").write_text(lines(earlier[:1] + full(1, 22.0)))  # one row the record already has
    study.main(["--summary", "--out", str(work), "--write", str(record)])
    kept = [json.loads(line) for line in (record / "runs.jsonl").read_text().splitlines()]
    assert kept == earlier + full(1, 22.0)
    assert (record / "probes.jsonl").read_text() == lines([probe])
    decision = json.loads((record / "decision.json").read_text())["configs"]["a"]
    assert decision["objectives"]["mdc"]["seeds"] == 2 and decision["minutes"] == 100 / 60
    assert "| a | mdc | 2 | 21.5 ± 0.7 |" in capsys.readouterr().out


def test_train_cli_runs_the_mini_preset_and_the_study_probes_the_run(tmp_path, monkeypatch):
    write_shards(str(tmp_path / "shards"), 8, "descriptive", seed=0, image_size=64, shard_size=8)
    out = subprocess.run([sys.executable, "-m", "mdc.train", "--preset", MINI, "--objective", "mdc",
                          "--train-data", str(tmp_path / "shards"), "--steps", "2", "--batch-size", "4",
                          "--global-batch", "4", "--warmup-steps", "1", "--output-dir", str(tmp_path / "run"),
                          "--workers", "0", "--seed", "3"], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    model = mdc.load(str(tmp_path / "run"))
    assert model.config.name == "mini" and model.config.image_size == 64 and model.config.vision_stem == "conv"

    monkeypatch.setattr(runs, "evalsets", lambda root, size: _tiny_evalsets(root, size))
    row = runs.probe_checkpoint(str(tmp_path / "run"), str(tmp_path / "study"))
    assert row["seed"] == 3 and row["train"]["preset"] == MINI and set(row["gap"]) == set(rules.TASKS)
    again = runs.probe_checkpoint(str(tmp_path / "run" / "checkpoints" / "step_000002"), str(tmp_path / "study"))
    assert again["random_init"] == row["random_init"] and again["trained"] == row["trained"]  # seeded, same weights
    assert len((tmp_path / "study" / "probes.jsonl").read_text().splitlines()) == 2


def test_ceiling_labels_name_the_largest_object_and_the_count():
    from mdc.world.render import COLOURS, SHAPES, TEXTURES

    shapes, colours = list(SHAPES), list(COLOURS)
    small = dict(shape=shapes[0], colour=colours[0], texture=TEXTURES[0], radius=0.1)
    large = dict(shape=shapes[3], colour=colours[2], texture=TEXTURES[1], radius=0.3)
    assert runs.scene_labels({"objects": [small, large, small]}) == [3, 2, 1, 2]


def test_a_learning_rate_variant_keeps_its_recipe(monkeypatch):
    monkeypatch.setattr(rules, "CONFIGS", {"a": dict(model={}, style="descriptive", batch=64, steps=10, lr=3e-3)})
    assert rules.recipe("a")["lr"] == 3e-3 and rules.recipe("a@0.001") == dict(rules.CONFIGS["a"], lr=1e-3)


def _toy_ceiling(monkeypatch, steps: int) -> None:
    """The ceiling's config "toy" at a toy size, on tiny evaluation sets."""
    monkeypatch.setattr(rules, "CONFIGS", {"toy": dict(
        model=dict(rules.BASE, image_size=16, patch_size=4, vision_stem="conv", vision_width=32, vision_layers=1,
                   vision_heads=2, text_width=32, text_layers=1, text_heads=2, embed_dim=32),
        style="descriptive", steps=steps, batch=8, lr=1e-3, warmup=1)})
    monkeypatch.setattr(runs, "evalsets", lambda root, size: _tiny_evalsets(root, size))


def test_the_ceiling_trains_on_labels_and_probes_beside_random_init(tmp_path, monkeypatch):
    """End to end at a toy size: labels from the training scenes, the probe on every task, one row."""
    _toy_ceiling(monkeypatch, steps=3)
    row = runs.ceiling_run("toy", 0, str(tmp_path), lr=2e-3)
    assert row["objective"] == "labels" and row["recipe"]["lr"] == 2e-3 and set(row["gap"]) == set(rules.TASKS)
    assert json.loads((tmp_path / "ceiling.jsonl").read_text())["gap_mean4"] == pytest.approx(row["gap_mean4"])


def _tiny_evalsets(root, size):
    from mdc.world.evalsets import write_evalsets

    out = os.path.join(root, f"eval-{size}px")
    write_evalsets(out, seed=1, image_size=size, n_probe_train=16, n_probe_test=8, n_items=1, n_caption_train=0)
    return out


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


def test_timing_measures_steady_steps_whatever_the_start_up_costs(tmp_path, monkeypatch):
    """Seconds per step from the runs' own per-step speeds after their first steps, so that a start-up
    (workers, torch.compile) that varies between runs cannot make a step cost less than nothing."""
    monkeypatch.setattr(rules, "CONFIGS", {"a": dict(model={"image_size": 16}, style="descriptive", batch=64, steps=100,
                                                     lr=1e-3, warmup=1)})
    monkeypatch.setattr(runs, "shards", lambda *a, **k: "unused")
    monkeypatch.setattr(runs, "loader_rate", lambda *a, **k: 1000.0)
    start_ups = iter([0.4, 0.0, 0.4, 0.0])  # a longer start-up (compilation) in the first of two runs

    def fake_train(output_dir, steps, **kw):
        import time

        time.sleep(next(start_ups))
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "metrics.jsonl"), "w") as f:  # 10 s to start, then 0.5 s a step
            f.writelines(json.dumps({"step": s + 1, "images_per_s": 6.4 if s == 0 else 128.0}) + "\n"
                         for s in range(steps))

    monkeypatch.setattr("mdc.train.train", fake_train)
    row = runs.timing("a", str(tmp_path), steps=40, objectives=("mdc", "clip"))
    assert row["mdc"] == pytest.approx(0.5) and row["clip"] == pytest.approx(0.5)
    assert row["mdc_images_per_s"] == pytest.approx(128.0) and row["mdc_run_min"] == pytest.approx(100 * 0.5 / 60)


def test_the_relation_label_is_where_the_largest_object_is_relative_to_the_smallest():
    from mdc.world.graphs import relation
    from mdc.world.text import RELATIONS

    big, small, mid = dict(x=0.2, y=0.5, radius=0.3), dict(x=0.8, y=0.5, radius=0.1), dict(x=0.5, y=0.9, radius=0.2)
    objects = [mid, small, big]
    scene = {"objects": objects, "relations": [{"subject": i, "relation": relation(a, b), "object": j}
                                              for i, a in enumerate(objects) for j, b in enumerate(objects) if i != j]}
    assert runs.relation_label(scene) == list(RELATIONS).index("left of")
    assert runs.relation_label({"objects": [big], "relations": []}) == -100


def test_the_relation_ceiling_keeps_its_own_record_and_weights(tmp_path, monkeypatch):
    _toy_ceiling(monkeypatch, steps=2)
    row = runs.ceiling_run("toy", 0, str(tmp_path), relation=True)
    assert row["objective"] == "labels+relation" and not (tmp_path / "ceiling.jsonl").exists()
    assert json.loads((tmp_path / "ceiling_relation.jsonl").read_text())["objective"] == "labels+relation"
    assert (tmp_path / "ceiling" / "toy-s0-relation.pt").is_file()
