"""The words study (reproduce/studies/words*.py): its run list and every arm's parameters, the reference profile's
runs left as they were, the dry run's arithmetic on a fake ledger, the time-budget selection, the driver's steps
and kept weights, and the report from records."""
import argparse
import copy
import itertools
import json
import math
import os

import pytest
import torch

import mdc
from mdc.base.errors import RunError
from mdc.eval.results import checkpoint_id
from reproduce import pretrained, registry
from reproduce.graph import Run, keys
from reproduce.running import ledger
from reproduce.studies import words, words_report
from reproduce.studies import words_machine as machine
from reproduce.studies import words_runs as plan

DEFAULT = {"default": 3, "seeds": {}}


@pytest.fixture(scope="module")
def mini():
    return {r.name: r for r in plan.study_runs("mini", DEFAULT)}


@pytest.fixture(scope="module")
def reference():
    return {r.name: r for r in registry.build("mini", 3)}


def _pre(runs, arm, objective, style="descriptive", seed=0):
    return runs[f"pretrain/words-{arm}-{objective}-{style}-s{seed}"]


def test_names_are_unique_and_every_arm_has_its_runs_per_seed(mini):
    runs = plan.study_runs("mini", DEFAULT)
    assert len(runs) == len({r.name for r in runs}) == len(mini)
    for arm in plan.arms():
        for objective in arm.objectives:
            for style in arm.styles:
                assert {f"pretrain/words-{arm.name}-{objective}-{style}-s{s}" for s in range(3)} <= set(mini)
            for s in range(3):
                tag = f"{arm.name}-{objective}-descriptive-s{s}"
                assert {f"probe/words-{tag}", f"neighbours/{tag}",
                        f"compositionality/words-{tag[:-3]}-binding-s{s}"} <= set(mini)
    assert not any("-x4-" in n for n in mini) and not any("words-hidden-arc" in n for n in mini)
    assert not any(n.startswith("pretrain/words-quarter") and n.endswith(("-alt-s0",)) for n in mini)
    every = {r.name for r in plan.study_runs("mini", DEFAULT, with_optional=True)}
    assert "pretrain/words-x4-arc-descriptive-s2" in every
    assert plan.ARMS[0].name == "paper" and all(isinstance(a.overrides, tuple) for a in plan.ARMS)


def test_the_paper_arm_is_the_reference_setting_renamed(mini, reference):
    for objective in ("mdc", "arc"):
        for style in ("descriptive", "alt"):
            mine, ref = _pre(mini, "paper", objective, style, 1), reference[f"pretrain/{objective}-{style}-s1"]
            assert {**mine.params, "output_dir": None} == {**ref.params, "output_dir": None} and mine.deps == ref.deps
        probe = mini[f"probe/words-paper-{objective}-descriptive-s1"].params
        assert {k: v for k, v in probe.items() if k not in ("checkpoint", "output_dir")} == {
            k: v for k, v in reference[f"probe/{objective}-descriptive-s1"].params.items()
            if k not in ("checkpoint", "output_dir")}


def test_each_arm_changes_only_what_it_says(mini, reference):
    base = reference["pretrain/mdc-descriptive-s0"].params
    for objective in ("mdc", "arc"):
        for style in ("descriptive", "alt"):
            assert _pre(mini, "rotary", objective, style).params["model_overrides"] == {"positions": "rotary"}
    hidden = _pre(mini, "hidden", "mdc")
    assert hidden.params["model_overrides"] == {"length_visible": False}
    assert _pre(mini, "hidden", "mdc", "alt").params["model_overrides"] == {"length_visible": False}
    quarter = _pre(mini, "quarter", "arc").params
    assert quarter["train_data"] == "{run:data/descriptive}/shards/{000000..000035}.tar"  # 36 of 144 shards
    assert (quarter["steps"], quarter["warmup_steps"]) == (base["steps"], base["warmup_steps"]) == (2240, 224)
    assert _pre(mini, "quarter", "arc").labels["pairs"] == 36_000  # a quarter of 143,360, in whole shards
    x2 = _pre(mini, "x2", "mdc").params
    assert (x2["steps"], x2["warmup_steps"], x2["save_every"]) == (4480, 448, 448)
    assert x2["train_data"] == base["train_data"] and x2["model_overrides"] == {}
    for arm in ("quarter", "x2"):
        p = _pre(mini, arm, "mdc").params
        assert {k: v for k, v in p.items() if k not in ("steps", "warmup_steps", "save_every", "train_data",
                                                      "output_dir")} == {
            k: v for k, v in base.items() if k not in ("steps", "warmup_steps", "save_every", "train_data",
                                                     "output_dir")}


def test_evaluations_read_their_arm_and_carry_the_study_sizes(mini):
    binding = mini["compositionality/words-rotary-mdc-descriptive-binding-s0"]
    assert binding.params["suites"] == list(plan.BINDING_SUITES) and binding.params["own_items"] == plan.OWN_ITEMS
    assert binding.deps == ("pretrain/words-rotary-mdc-descriptive-s0", "data/evalsets")
    step = mini["neighbours/hidden-mdc-descriptive-s1"]
    assert step.params["checkpoint"] == "{run:pretrain/words-hidden-mdc-descriptive-s1}" and step.params["binding"]
    assert mini["neighbours/paper-arc-descriptive-s1"].params["binding"] == []
    tuned, pre = mini["captioning/words-rotary-alt-finetuned-s2"], mini["captioning/words-rotary-alt-pretrained-s2"]
    assert tuned.params["finetune_steps"] == 6000 and pre.params["finetune_steps"] == 0
    assert tuned.deps == ("pretrain/words-rotary-mdc-alt-s2", "pretrain/words-rotary-arc-alt-s2", "data/evalsets")
    hidden = mini["captioning/words-hidden-alt-finetuned-s0"]
    assert hidden.params["arc_checkpoint"] == "" and hidden.params["lengths"] == [10, 15, 20, None]
    assert "lengths" not in tuned.params


def test_seeds_come_from_the_plan_per_objective_or_arm(tmp_path):
    path = tmp_path / "seeds.json"
    path.write_text(json.dumps({"default": 3, "seeds": {"arc": 5, "x2-mdc": 4}, "rows": []}))
    names = {r.name for r in plan.study_runs("mini", plan.read_seeds(str(path)))}
    assert "pretrain/words-paper-arc-descriptive-s4" in names and "pretrain/words-paper-mdc-descriptive-s3" not in names
    assert "pretrain/words-x2-mdc-descriptive-s3" in names and "pretrain/words-x2-mdc-descriptive-s4" not in names
    assert "captioning/words-paper-alt-finetuned-s3" not in names  # no MDC alt of seed 3
    assert plan.read_seeds(str(tmp_path / "none.json")) == DEFAULT


def test_the_reference_profiles_runs_are_unchanged():
    before = {p: [(r.name, copy.deepcopy(r.params), r.deps, r.labels) for r in registry.build(p, 1)]
              for p in ("mini", "smoke")}
    profiles = copy.deepcopy(registry.PROFILES)
    plan.study_runs("mini", DEFAULT, with_optional=True)
    plan.study_runs("smoke", DEFAULT)
    assert registry.PROFILES == profiles
    for p in ("mini", "smoke"):
        assert [(r.name, r.params, r.deps, r.labels) for r in registry.build(p, 1)] == before[p]


def test_step_keys_follow_their_dependencies(mini):
    runs = list(mini.values())
    key = plan.plan_keys(runs)
    assert set(key) == set(mini)
    assert key["neighbours/paper-mdc-descriptive-s0"] != key["neighbours/paper-mdc-descriptive-s1"]
    changed = [Run(r.name, r.notebook, {**r.params, "steps": 1}, r.deps, r.artifacts, r.labels)
               if r.name == "pretrain/words-paper-mdc-descriptive-s0" else r for r in runs]
    again = plan.plan_keys(changed)
    assert again["neighbours/paper-mdc-descriptive-s0"] != key["neighbours/paper-mdc-descriptive-s0"]
    assert again["neighbours/paper-mdc-descriptive-s1"] == key["neighbours/paper-mdc-descriptive-s1"]


# ------------------------------------------------------------------------------------------------ estimates
def _record(folder, name, notebook, params, seconds, results=None, seed=0, labels=None, package="p0"):
    path = ledger.path(str(folder), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"schema": ledger.SCHEMA, "run": name, "key": "k", "notebook": notebook, "params": params,
              "labels": labels or {}, "artifacts": [], "seed": seed, "code": {"notebook": "n", "package": package},
              "seconds": seconds, "results": {"schema": "mdc.results/1", "results": results or {}}}
    with open(path, "w") as f:
        json.dump(record, f)


def _fake_reference(folder, reference):
    for objective in ("mdc", "arc"):
        for style, seconds in (("descriptive", 1800.0), ("alt", 1600.0)):
            name = f"pretrain/{objective}-{style}-s0"
            _record(folder, name, "pretrain", reference[name].params, seconds)
        _record(folder, f"probe/{objective}-descriptive-s0", "linear_probe",
                reference[f"probe/{objective}-descriptive-s0"].params, 120.0)
    _record(folder, "data/descriptive", "data", {}, 100.0, {"lengths": {"max": 58}})
    tuned = {o: {"steps_taken": n, "batch_size": 32} for o, n in (("mdc", 2000), ("arc", 1000))}
    _record(folder, "captioning/alt-s0", "captioning", {}, 1500.0, {"finetune": tuned})


def test_the_dry_run_estimates_from_the_reference_ledger_scaled_by_steps(tmp_path, mini, reference):
    _fake_reference(tmp_path / "ref", reference)
    ref, study = str(tmp_path / "ref"), str(tmp_path / "study")

    def est(name):
        return plan.estimate(mini[name], mini, study, ref, "mini", reference)[0]

    assert est("pretrain/words-paper-mdc-descriptive-s0") == pytest.approx(1800)
    assert est("pretrain/words-x2-arc-descriptive-s1") == pytest.approx(3600)  # another seed's record, x 2 images
    assert est("pretrain/words-quarter-mdc-descriptive-s0") == pytest.approx(1800)  # steps held
    assert est("pretrain/words-hidden-mdc-alt-s0") == pytest.approx(1800 * 64 / 60)  # the descriptive run, x tokens
    assert est("probe/words-rotary-arc-descriptive-s2") == pytest.approx(120)
    per_image = 1600 / (2240 * 64)
    tuned = {"mdc": 2000 * 32 * per_image, "arc": 1000 * 32 * per_image}
    rest = 1500 - sum(tuned.values())
    assert est("captioning/words-paper-alt-pretrained-s0") == pytest.approx(rest)
    assert est("captioning/words-paper-alt-finetuned-s0") == pytest.approx(rest + 2 * sum(tuned.values()))
    assert est("captioning/words-hidden-alt-finetuned-s0") == pytest.approx(rest / 2 + 2 * tuned["mdc"])
    assert est("neighbours/paper-mdc-descriptive-s0") == plan.STEP_SECONDS["mdc"]
    # once the study records a seed of a run, that record is the estimate
    _record(tmp_path / "study", "pretrain/words-x2-arc-descriptive-s0", "pretrain",
            mini["pretrain/words-x2-arc-descriptive-s0"].params, 3000.0)
    assert est("pretrain/words-x2-arc-descriptive-s1") == pytest.approx(3000)


def test_a_machine_factor_scales_the_reference_estimates_not_the_studys_own_records():
    assert machine.on_machine((100.0, "reference pretrain/mdc-descriptive-s0 x 1.00"), 1.8) == pytest.approx(
        (180.0, "reference pretrain/mdc-descriptive-s0 x 1.00; x 1.8 on this machine"))
    assert machine.on_machine((30.0, "no record: the step's measured default"), 2.0)[0] == 60.0
    own = (5000.0, "the record of seed 0")  # made on this machine: already its speed
    assert machine.on_machine(own, 1.8) == own
    assert machine.on_machine((100.0, "reference x"), 1.0) == (100.0, "reference x")


def test_a_part_measures_its_runs_against_their_reference_estimates():
    est = {"pretrain/a-s0": (1000.0, "reference pretrain/a-s0"), "probe/a-s0": (100.0, "reference probe/a-s0"),
           "pretrain/b-s1": (900.0, "the record of seed 0"), "probe/c-s0": (100.0, "reference probe/c-s0")}
    outcome = {"pretrain/a-s0": {"status": "ok", "seconds": 1800.0}, "probe/a-s0": {"status": "ok", "seconds": 200.0},
               "pretrain/b-s1": {"status": "ok", "seconds": 9000.0},  # own record: not a reference estimate
               "probe/c-s0": {"status": "failed", "seconds": 1.0}}
    assert machine.machine_ratio(outcome, est) == pytest.approx((1.9, 2))  # the median of 1.8 and 2.0, of 2 runs
    assert machine.machine_ratio({}, est) is None
    scaled = {n: machine.on_machine(e, 2.0) for n, e in est.items()}  # measured against the reference's estimate
    assert machine.machine_ratio(outcome, scaled, 2.0) == pytest.approx((1.9, 2))
    with pytest.raises(RunError, match="--machine-factor must be > 0"):
        words.main(["--machine-factor", "0", "--dry-run", "--debug"])


def test_the_modes_exclude_each_other_so_a_dry_run_never_starts_a_part(monkeypatch, capsys):
    monkeypatch.setattr(words, "part", lambda args: pytest.fail("--dry-run with --time-budget started a part"))
    for modes in (["--dry-run", "--time-budget", "60"], ["--report", "--time-budget", "60"],
                  ["--plan-seeds", "--dry-run"]):
        with pytest.raises(SystemExit) as exit:
            words.main(modes)
        assert exit.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_the_dry_run_prints_every_run_and_sums_its_hours_by_arm(tmp_path, reference, monkeypatch):
    _fake_reference(tmp_path / "ref", reference)
    args = argparse.Namespace(scale="mini", seeds=str(tmp_path / "none.json"), with_optional=False,
                              records=str(tmp_path / "study"), reference=str(tmp_path / "ref"), out=str(tmp_path),
                              machine_factor=1.0)
    runs, key, by_name, est = words._setup(args)
    text = words.dry_run(args)
    assert sum(line.startswith(("would run", "recorded ")) for line in text.splitlines()) == len(runs)
    total = sum(s for s, _ in est.values()) / 3600
    assert f"total {total:.2f} run-hours ({total:.2f} left" in text
    by_arm = plan.run_hours(runs, {n: s for n, (s, _) in est.items()})
    assert math.isclose(sum(sum(v.values()) for v in by_arm.values()), total)
    for arm, styles in by_arm.items():
        assert f"  {arm:8s} {sum(styles.values()):6.2f}" in text
    assert "optional arm(s) x4: +" in text


# ------------------------------------------------------------------------------------------------ selection
def _chain_graph():
    runs = [Run("data/d", "data", {}), Run("pretrain/a-s0", "pretrain", {}, ("data/d",)),
            Run("probe/a-s0", "linear_probe", {}, ("pretrain/a-s0",)),
            Run("neighbours/a-s0", "neighbours", {}, ("pretrain/a-s0",)),
            Run("pretrain/b-s0", "pretrain", {}, ("data/d",)),
            Run("probe/b-s0", "linear_probe", {}, ("pretrain/b-s0",))]
    seconds = {"data/d": 10.0, "pretrain/a-s0": 100.0, "probe/a-s0": 20.0, "neighbours/a-s0": 5.0,
               "pretrain/b-s0": 100.0, "probe/b-s0": 20.0}
    return runs, seconds


def test_the_budget_starts_only_what_fits_with_its_readers():
    runs, seconds = _chain_graph()
    todo = {r.name for r in runs}
    start, left = plan.select(runs, seconds, todo, budget_s=140, jobs=1)
    assert start == ["data/d", "pretrain/a-s0", "probe/a-s0", "neighbours/a-s0"]  # a's chain: 130 s, 135 in all
    assert left == ["pretrain/b-s0", "probe/b-s0"]  # 255 s of runs at one at a time
    assert plan.select(runs, seconds, todo, budget_s=200, jobs=2)[1] == []  # 255 run-s at two, chain 130: 192.5 s
    assert plan.select(runs, seconds, todo, budget_s=140, jobs=2)[1] == ["pretrain/b-s0", "probe/b-s0"]
    assert plan.select(runs, seconds, todo, budget_s=100, jobs=2)[0] == []  # no chain fits: nothing starts
    done = todo - {"data/d", "pretrain/a-s0", "probe/a-s0"}  # recorded runs cost nothing
    assert plan.select(runs, seconds, done, budget_s=130, jobs=1)[0] == ["neighbours/a-s0", "pretrain/b-s0",
                                                                         "probe/b-s0"]


def _makespan(runs: list, seconds: dict, order: list) -> float:
    """When a runner two at a time ends ``runs``, starting ready ones in ``order`` whenever a slot is free."""
    deps = {r.name: set(r.deps) & {x.name for x in runs} for r in runs}
    now, done, running = 0.0, set(), {}
    while len(done) < len(runs):
        for n in order:
            if len(running) < 2 and n not in done and n not in running and deps[n] <= done:
                running[n] = now + seconds[n]
        now = min(running.values())
        done |= {n for n, end in running.items() if end == now}
        running = {n: end for n, end in running.items() if end > now}
    return now


def test_what_a_part_chooses_ends_within_its_budget_in_any_order_the_runner_starts_it():
    """The runner orders its ready runs by its own rule (runs that make deeper ones ready first), which started a
    long captioning chain last and ran part 8 15 minutes past its budget although its run-seconds at two at a time
    and its longest chain each fit. Whatever it chooses ends in time under every order of starting."""
    runs = [Run("pretrain/p-s0", "pretrain", {}), Run("captioning/p-s0", "captioning", {}, ("pretrain/p-s0",)),
            Run("probe/x-s0", "linear_probe", {}), Run("probe/y-s0", "linear_probe", {})]
    seconds = {"pretrain/p-s0": 50.0, "captioning/p-s0": 50.0, "probe/x-s0": 50.0, "probe/y-s0": 50.0}
    todo = {r.name for r in runs}
    for budget in (100, 125, 150, 175):
        start = [r for r in runs if r.name in plan.select(runs, seconds, todo, budget_s=budget, jobs=2)[0]]
        worst = max(_makespan(start, seconds, list(o)) for o in itertools.permutations(r.name for r in start))
        assert start and worst <= budget, (budget, [r.name for r in start], worst)


def test_a_retrain_that_drifts_supersedes_the_pretrain_and_its_recorded_readers(tmp_path, capsys):
    """Float results differ across CPUs: a recorded pretraining run trained again on another machine can make
    another checkpoint. Its recorded readers read the old one, so the run and they are recorded again."""
    runs, _ = _chain_graph()
    key = {r.name: "k" for r in runs}
    for r in runs:
        _record(tmp_path, r.name, r.notebook, {}, 1.0)
        record = ledger.read(str(tmp_path), r.name)
        record["results"]["checkpoint_id"] = "old"  # where a pretraining record names its checkpoint
        with open(ledger.path(str(tmp_path), r.name), "w") as f:
            json.dump(record, f)
    out = tmp_path / "out"
    for name in ("pretrain/a-s0", "pretrain/b-s0"):  # both trained again: b as recorded, a into another model
        (out / name).mkdir(parents=True)
        (out / name / "done.json").write_text(json.dumps({"key": "k"}))
        made = "new" if name == "pretrain/a-s0" else "old"
        (out / name / "results.json").write_text(json.dumps({"schema": "mdc.results/1", "checkpoint_id": made}))
    assert machine.drifted(runs, key, str(out), str(tmp_path)) == ["pretrain/a-s0", "probe/a-s0", "neighbours/a-s0"]
    assert [r.name for r in runs if ledger.read(str(tmp_path), r.name)] == ["data/d", "pretrain/b-s0", "probe/b-s0"]
    assert "into checkpoint new, not the recorded old" in capsys.readouterr().out
    assert machine.drifted(runs, key, str(out), str(tmp_path)) == []  # a's record is gone: nothing to compare


def test_a_pretraining_run_starts_only_with_every_reader_it_has_to_do():
    """Each part may run on another machine, where a checkpoint trained again is another model: a part that
    trains a checkpoint reads it with all its readers, never the cheap one now and the long one later."""
    runs = [Run("data/d", "data", {}), Run("pretrain/m-s0", "pretrain", {}, ("data/d",)),
            Run("pretrain/a-s0", "pretrain", {}, ("data/d",)),
            Run("captioning/pretrained-s0", "captioning", {}, ("pretrain/m-s0", "pretrain/a-s0")),
            Run("captioning/finetuned-s0", "captioning", {}, ("pretrain/m-s0", "pretrain/a-s0")),
            Run("pretrain/b-s0", "pretrain", {}, ("data/d",)),
            Run("probe/b-s0", "linear_probe", {}, ("pretrain/b-s0",))]
    seconds = {"data/d": 10.0, "pretrain/m-s0": 100.0, "pretrain/a-s0": 100.0, "captioning/pretrained-s0": 10.0,
               "captioning/finetuned-s0": 200.0, "pretrain/b-s0": 100.0, "probe/b-s0": 20.0}
    todo = {r.name for r in runs}
    assert plan.select(runs, seconds, todo, budget_s=150, jobs=2)[0] == ["data/d", "pretrain/b-s0", "probe/b-s0"]
    start = plan.select(runs, seconds, todo, budget_s=370, jobs=2)[0]  # m's and a's readers: 420 run-s, chain 310
    assert {"pretrain/m-s0", "captioning/pretrained-s0", "captioning/finetuned-s0"} <= set(start)


def test_a_part_hands_the_runner_what_it_chose_without_a_second_budget(tmp_path, monkeypatch):
    """The runner's own estimates (the profile's defaults) are not the study's: under a time budget of its own it
    left a chosen pretraining run unstarted. The part's selection is the budget; the runner executes it."""
    runs, seconds = _chain_graph()
    monkeypatch.setattr(words, "_setup", lambda args: (runs, {r.name: "k" for r in runs}, {r.name: r for r in runs},
                                                       {n: (s, "reference") for n, s in seconds.items()}))
    for quiet in ("keep_seed0", "_free"):
        monkeypatch.setattr(words, quiet, lambda *a: None)
    monkeypatch.setattr(words, "_run_steps", lambda *a: [])
    handed = {}
    monkeypatch.setattr(words.runner, "run_all", lambda real, out, settings: handed.update(
        runs=[r.name for r in real], budget=settings.time_budget_s) or {})
    args = argparse.Namespace(records=str(tmp_path / "records"), time_budget=140 / 60, out=str(tmp_path), scale="mini",
                              jobs=1, machine_factor=1.0, argv=[], weights=str(tmp_path / "weights"))
    assert words.part(args) == 0
    assert handed == {"runs": ["data/d", "pretrain/a-s0", "probe/a-s0"], "budget": None}


def test_the_steps_the_part_chose_run_past_its_deadline(monkeypatch):
    """A neighbour step left for later needs its checkpoint trained again on the next (another) machine, which
    makes another model and voids the pretraining run's other records: the part's own steps always run."""
    runs, _ = _chain_graph()
    by_name = {r.name: r for r in runs}
    monkeypatch.setattr(words, "_ready", lambda *a: True)
    ran = []
    monkeypatch.setattr(words.subprocess, "run", lambda command, **k: ran.append(command[-1]) or
                        argparse.Namespace(returncode=0, stdout="", stderr=""))
    args = argparse.Namespace(out="runs", scale="mini", records="records", seeds=plan.SEEDS, jobs=1,
                              with_optional=False)
    est = {"neighbours/a-s0": (300.0, "reference"), "neighbours/b-s0": (300.0, "reference")}
    steps = [by_name["neighbours/a-s0"], Run("neighbours/b-s0", "neighbours", {}, ("pretrain/b-s0",))]
    assert words._run_steps(steps, est, args, deadline=0.0, chosen={"neighbours/a-s0"}) == []
    assert ran == ["neighbours/a-s0"]  # b's step, ready from an earlier part, waits for a part with time


def test_a_part_refuses_a_ledger_of_another_package(tmp_path):
    _record(tmp_path, "data/descriptive", "data", {}, 1.0, package="another")
    with pytest.raises(RunError, match="one package digest"):
        words.one_digest(str(tmp_path))
    _record(tmp_path, "data/descriptive", "data", {}, 1.0, package=ledger.package_digest())
    words.one_digest(str(tmp_path))


# ------------------------------------------------------------------------------------------------ steps
def test_repetition_counts_words_and_content_words():
    r = words_report.repetition(["a red circle and a red square", "a star"])
    assert r["captions"] == 2 and r["words"] == 4.5
    assert r["repeated"] == pytest.approx((2 / 7 + 0) / 2)  # "a", "red" again
    assert r["repeated_content"] == pytest.approx((1 / 4 + 0) / 2)  # red, circle, red, square


def test_caption_words_reads_a_captioning_run_and_its_references(tmp_path):
    (tmp_path / "predictions.json").write_text(json.dumps({"mdc-10": {"0": "a red red circle"}}))
    images = [{"split": "test", "sentences": [{"raw": "a red circle"}]},
              {"split": "train", "sentences": [{"raw": "star star"}]}]
    (tmp_path / "captions.json").write_text(json.dumps({"images": images}))
    out = plan.caption_words_step({"captioning": str(tmp_path), "captions_json": str(tmp_path / "captions.json")})
    assert out["sets"]["mdc-10"]["repeated_content"] == pytest.approx(1 / 3) and out["references"]["repeated"] == 0


def test_seed_zero_is_kept_in_float16_and_loads(tmp_path):
    torch.manual_seed(0)
    model = mdc.create_model("tiny", "mdc", image_size=32, patch_size=8, vision_width=32, vision_layers=1,
                             vision_heads=2, text_width=32, text_layers=1, text_heads=2, embed_dim=32)
    model.save(tmp_path / "ckpt")
    record = {"run": "pretrain/words-paper-mdc-descriptive-s0", "key": "k",
              "results": {"checkpoint_id": checkpoint_id(tmp_path / "ckpt")}}
    target = pretrained.keep_at(str(tmp_path / "ckpt"), str(tmp_path / "kept"), record)
    loaded = mdc.load(target)
    assert words.kept(target, record) and loaded.config.objective == "mdc"
    state = loaded.state_dict()
    assert all(torch.equal(state[k], v.half().float()) for k, v in model.state_dict().items() if v.is_floating_point())
    listed = pretrained.listing(str(tmp_path / "kept"), {record["run"]: record})
    wanted = checkpoint_id(tmp_path / "ckpt")
    assert len(listed) == 1 and listed[0].endswith(f"{record['run']}, float16 of checkpoint {wanted}")
    other = {record["run"]: {**record, "results": {"checkpoint_id": "x"}}}
    assert pretrained.listing(str(tmp_path / "kept"), other)[0].endswith("NOT the checkpoint its record names")
    with pytest.raises(ValueError, match="is not the checkpoint"):
        pretrained.keep_at(str(tmp_path / "ckpt"), str(tmp_path / "k2"),
                           {**record, "results": {"checkpoint_id": "x"}})


# ------------------------------------------------------------------------------------------------ report
def _study_records(folder):
    """Two arms (paper, rotary) x MDC and ARC x three seeds: every kind of record the report reads."""
    tasks = ("object", "shape", "texture", "count", "relation")
    for seed in range(3):
        for arm in ("paper", "rotary"):
            for o in ("mdc", "arc"):
                lab = {"arm": arm, "objective": o, "style": "descriptive", "seed": seed}
                ones = 50 + 10 * seed + (5 if arm == "rotary" else 0)
                correct = "1" * ones + "0" * (200 - ones)
                top = {f"wds/{t}": {"top1": correct.count("1") / len(correct), "correct": correct} for t in tasks}
                _record(folder, f"probe/words-{arm}-{o}-descriptive-s{seed}", "linear_probe", {}, 1.0,
                        {"datasets": top, "grid": {"datasets": top}, "random_init": {"datasets": top}}, seed, lab)
                v = "elbo" if o == "mdc" else "exact"
                own = 0.95 if o == "arc" else 0.5 + 0.01 * seed
                scores = {v: {"accuracy": own}, f"{v}_shuffled": {"accuracy": 0.5}, f"{v}_blind": {"accuracy": 0.5}}
                cols = {c: {"items": 120, "scores": scores} for c in ("own_swap", "own_attribute")}
                _record(folder, f"compositionality/words-{arm}-{o}-descriptive-binding-s{seed}", "compositionality",
                        {}, 1.0, {"columns": cols}, seed, lab)
                s = 0.5 + 0.01 * seed if o == "arc" else (0.2 + 0.01 * seed if arm == "rotary" else 0.001 * seed)
                view = {"own": {"difference": s}, "other_image": {"difference": 0.0}}
                _record(folder, f"neighbours/{arm}-{o}-descriptive-s{seed}", "neighbours", {}, 1.0,
                        {"neighbours": {"measures": {"shape_after_colour": {plan_ratio(o): view}}}, "binding": {}},
                        seed, lab)
            lab = {"arm": arm, "style": "alt", "stage": "finetuned", "seed": seed}
            m = {"cider": 1.0, "cider_another_image": 0.2, "bleu4": 0.3, "words": 14.0, "repeated": 0.3}
            stop = {"mdc": {"stopped": "cap" if arm == "rotary" and seed == 0 else "plateau", "steps": 6000,
                            "best_step": 6000, "steps_taken": 6000}}
            _record(folder, f"captioning/words-{arm}-alt-finetuned-s{seed}", "captioning", {}, 1.0,
                    {"metrics": {"mdc-ref": m, "arc-beam6-ref": m}, "finetune": stop}, seed, lab)
            rep = (0.30 if arm == "paper" else 0.20) + 0.01 * seed
            _record(folder, f"caption_words/{arm}-alt-finetuned-s{seed}", "caption_words", {}, 1.0,
                    {"sets": {"mdc-ref": {"repeated_content": rep}, "arc-beam6-ref": {"repeated_content": 0.1}},
                     "references": {"repeated_content": 0.05}}, seed, lab)
        lab = {"arm": "paper", "style": "alt", "stage": "finetuned-t0-1", "seed": seed}  # MDC alone, t ~ U[0, 1]
        _record(folder, f"captioning/words-paper-alt-finetuned-t0-1-s{seed}", "captioning", {}, 1.0,
                {"metrics": {"mdc-ref": m}, "finetune": {"mdc": {"stopped": "plateau"}}}, seed, lab)
        _record(folder, f"caption_words/paper-alt-finetuned-t0-1-s{seed}", "caption_words", {}, 1.0,
                {"sets": {"mdc-ref": {"repeated_content": 0.35 + 0.01 * seed}},
                 "references": {"repeated_content": 0.05}}, seed, lab)


def _probe(arm, objective, seed, right, items=200):
    """A probe run as the report reads it: ``right`` of ``items`` correct on every task."""
    correct = "1" * right + "0" * (items - right)
    return {"notebook": "linear_probe", "labels": {"arm": arm, "objective": objective, "seed": seed},
            "record": {"results": {"datasets": {f"wds/{t}": {"correct": correct} for t in words_report.TASKS}}}}


def test_the_probe_gap_is_mdc_minus_arc_of_its_arm_and_its_change_from_the_paper_arms_gap():
    right = {("paper", "mdc"): 90, ("paper", "arc"): 100, ("rotary", "mdc"): 100, ("rotary", "arc"): 104,
             ("hidden", "mdc"): 94}  # the hidden arm has no ARC: its gap is against the paper arm's
    runs = [_probe(a, o, s, r + s) for (a, o), r in right.items() for s in range(3)]
    rows = {line.split(" | ")[0].strip("| "): line for line in words_report.probe_gap(runs).splitlines()}
    assert rows["paper"].startswith("| paper | -5.0 [") and "(reference arm)" in rows["paper"]
    assert rows["rotary"].startswith("| rotary | -2.0 [") and "| +3.0 [" in rows["rotary"]
    assert rows["hidden"].startswith("| hidden | -3.0 [") and "| +2.0 [" in rows["hidden"]
    assert words_report.probe_delta(runs, "hidden", "mdc")[0] == pytest.approx(2.0)


def plan_ratio(objective):
    return words_report.WORDS_RATIO[objective]


def test_the_report_builds_one_table_per_instrument_with_the_rules_verdicts(tmp_path):
    _study_records(tmp_path / "records")
    text = words_report.build(str(tmp_path / "records"), str(tmp_path))
    assert text.count("### ") == 5 and os.path.isfile(tmp_path / "words.png")
    assert (tmp_path / "tables.md").read_text() == text + "\n"
    words_table = text.split("### Neighbour use")[1].split("###")[0]
    assert "m_w = 5.1" in words_table  # a tenth of the paper ARC's S (50 to 52 points)
    assert "uses its words" in words_table.split("| rotary | MDC |")[1].split("\n")[0]
    assert "does not use its words" in words_table.split("| paper | MDC |")[1].split("\n")[0]
    binding_table = text.split("### Binding")[1].split("###")[0]
    assert binding_table.split("| paper | ARC |")[1].split("\n")[0].endswith("| binds |")
    assert "does not bind" in binding_table.split("| paper | MDC |")[1].split("\n")[0]
    captions = text.split("### Captions")[1]
    assert "repeats less" in captions.split("| rotary | finetuned mdc-ref |")[1].split("\n")[0]
    assert "-10.0 [" in captions.split("| rotary | finetuned mdc-ref |")[1].split("\n")[0]
    t01 = captions.split("| t0-1 | finetuned mdc-ref |")[1].split("\n")[0]  # against the paper arm's fine-tune
    assert "+5.0 [" in t01 and "repeats more" in t01
    assert "words-rotary-alt-finetuned-s0 mdc: stopped at its cap of 6000 steps" in text
    assert "From 54 run records of package p0." in text and "in float16 (`mdc.load(<folder>)`):\nnone kept" in text


@pytest.mark.slow
def test_a_smoke_part_runs_every_kind_through_the_runner_and_the_steps(tmp_path):
    """The whole study at the smoke profile's size, one seed (about 10 minutes on 2 cores): every run recorded in
    one package digest, seed 0's float16 weights loadable, the checkpoints freed, the report built."""
    (tmp_path / "seeds.json").write_text(json.dumps({"default": 1}))
    flags = ["--scale", "smoke", "--seeds", str(tmp_path / "seeds.json"), "--records", str(tmp_path / "records"),
             "--out", str(tmp_path / "runs"), "--weights", str(tmp_path / "weights")]
    assert words.main([*flags, "--time-budget", "60"]) == 0
    runs = plan.study_runs("smoke", plan.read_seeds(str(tmp_path / "seeds.json")))
    key = plan.plan_keys(runs)
    assert all(ledger.done(str(tmp_path / "records"), r.name, key[r.name]) for r in runs)
    assert len({r["code"]["package"] for r in ledger.read_all(str(tmp_path / "records")).values()}) == 1
    kept = mdc.load(tmp_path / "weights" / "pretrain" / "words-hidden-mdc-descriptive-s0")
    assert kept.config.length_visible is False
    assert mdc.load(tmp_path / "weights" / "pretrain" / "words-rotary-arc-descriptive-s0").config.positions == "rotary"
    assert not (tmp_path / "runs" / "smoke" / "pretrain" / "words-paper-mdc-descriptive-s0" / "checkpoints").exists()
    hidden = ledger.read(str(tmp_path / "records"), "captioning/words-hidden-alt-finetuned-s0")
    assert "mdc-None" in hidden["results"]["results"]["metrics"]  # the model's own length beside the fixed ones
    assert words.main([*flags, "--report"]) == 0 and (tmp_path / "tables.md").is_file()
