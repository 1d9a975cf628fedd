"""The words study (reproduce/studies/words/): its run list and every arm's parameters, the reference profile's
runs left as they were, the dry run's arithmetic on a fake ledger, its steps, and the report from records."""
import argparse
import copy
import json
import math
import os
import subprocess

import pytest
from conftest import study_record

import mdc
from reproduce import registry
from reproduce.graph import ROOT, Run
from reproduce.running import ledger
from reproduce.studies import words
from reproduce.studies.driver import cli, part, pin, study, tables
from reproduce.studies.driver import estimate as cost
from reproduce.studies.words import report as words_report

STUDY = words.STUDY
STEPS = {kind: STUDY.step_estimate for kind in STUDY.steps}

DEFAULT = {"default": 3, "seeds": {}}


@pytest.fixture(scope="module")
def mini():
    return {r.name: r for r in words.study_runs("mini", DEFAULT)}


@pytest.fixture(scope="module")
def reference():
    return {r.name: r for r in registry.build("mini", 3)}


def _pre(runs, arm, objective, style="descriptive", seed=0):
    return runs[f"pretrain/words-{arm}-{objective}-{style}-s{seed}"]


def test_names_are_unique_and_every_arm_has_its_runs_per_seed(mini):
    runs = words.study_runs("mini", DEFAULT)
    assert len(runs) == len({r.name for r in runs}) == len(mini)
    for arm in [a for a in words.ARMS if not a.optional]:
        for objective in arm.objectives:
            for style in arm.styles:
                assert {f"pretrain/words-{arm.name}-{objective}-{style}-s{s}" for s in range(3)} <= set(mini)
            for s in range(3):
                tag = f"{arm.name}-{objective}-descriptive-s{s}"
                assert {f"probe/words-{tag}", f"neighbours/{tag}",
                        f"compositionality/words-{tag[:-3]}-binding-s{s}"} <= set(mini)
    assert not any("-x4-" in n for n in mini) and not any("words-hidden-arc" in n for n in mini)
    assert not any(n.startswith("pretrain/words-quarter") and n.endswith(("-alt-s0",)) for n in mini)
    every = {r.name for r in words.study_runs("mini", DEFAULT, with_optional=True)}
    assert "pretrain/words-x4-arc-descriptive-s2" in every
    assert words.ARMS[0].name == "paper" and all(isinstance(a.overrides, tuple) for a in words.ARMS)


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
    assert binding.params["suites"] == list(words.BINDING_SUITES) and binding.params["own_items"] == words.OWN_ITEMS
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
    names = {r.name for r in words.study_runs("mini", study.read_seeds(str(path)))}
    assert "pretrain/words-paper-arc-descriptive-s4" in names and "pretrain/words-paper-mdc-descriptive-s3" not in names
    assert "pretrain/words-x2-mdc-descriptive-s3" in names and "pretrain/words-x2-mdc-descriptive-s4" not in names
    assert "captioning/words-paper-alt-finetuned-s3" not in names  # no MDC alt of seed 3
    assert study.read_seeds(str(tmp_path / "none.json")) == DEFAULT


def test_the_reference_profiles_runs_are_unchanged():
    before = {p: [(r.name, copy.deepcopy(r.params), r.deps, r.labels) for r in registry.build(p, 1)]
              for p in ("mini", "smoke")}
    profiles = copy.deepcopy(registry.PROFILES)
    words.study_runs("mini", DEFAULT, with_optional=True)
    words.study_runs("smoke", DEFAULT)
    assert registry.PROFILES == profiles
    for p in ("mini", "smoke"):
        assert [(r.name, r.params, r.deps, r.labels) for r in registry.build(p, 1)] == before[p]


def test_step_keys_follow_their_dependencies(mini):
    runs = list(mini.values())
    key = study.plan_keys(STUDY, runs)
    assert set(key) == set(mini)
    assert key["neighbours/paper-mdc-descriptive-s0"] != key["neighbours/paper-mdc-descriptive-s1"]
    changed = [Run(r.name, r.notebook, {**r.params, "steps": 1}, r.deps, r.artifacts, r.labels)
               if r.name == "pretrain/words-paper-mdc-descriptive-s0" else r for r in runs]
    again = study.plan_keys(STUDY, changed)
    assert again["neighbours/paper-mdc-descriptive-s0"] != key["neighbours/paper-mdc-descriptive-s0"]
    assert again["neighbours/paper-mdc-descriptive-s1"] == key["neighbours/paper-mdc-descriptive-s1"]


# ------------------------------------------------------------------------------------------------ estimates
def _fake_reference(folder, reference):
    for objective in ("mdc", "arc"):
        for style, seconds in (("descriptive", 1800.0), ("alt", 1600.0)):
            name = f"pretrain/{objective}-{style}-s0"
            study_record(folder, name, "pretrain", reference[name].params, seconds)
        study_record(folder, f"probe/{objective}-descriptive-s0", "linear_probe",
                     reference[f"probe/{objective}-descriptive-s0"].params, 120.0)
    study_record(folder, "data/descriptive", "data", {}, 100.0, {"lengths": {"max": 58}})
    tuned = {o: {"steps_taken": n, "batch_size": 32} for o, n in (("mdc", 2000), ("arc", 1000))}
    study_record(folder, "captioning/alt-s0", "captioning", {"finetune_steps": 3000}, 1500.0, {"finetune": tuned})


def test_the_dry_run_estimates_from_the_reference_ledger_scaled_by_steps(tmp_path, mini, reference):
    _fake_reference(tmp_path / "ref", reference)
    ref, ledger_ = str(tmp_path / "ref"), str(tmp_path / "study")

    def est(name):
        return cost.estimate(mini[name], mini, ledger_, ref, STEPS, "mini", reference)[0]

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
    assert est("neighbours/paper-mdc-descriptive-s0") == words.STEP_SECONDS["mdc"]
    # once the study records a seed of a run, that record is the estimate
    study_record(tmp_path / "study", "pretrain/words-x2-arc-descriptive-s0", "pretrain",
                 mini["pretrain/words-x2-arc-descriptive-s0"].params, 3000.0)
    assert est("pretrain/words-x2-arc-descriptive-s1") == pytest.approx(3000)


def test_the_modes_exclude_each_other_so_a_dry_run_never_starts_a_part(monkeypatch, capsys):
    monkeypatch.setattr(cli, "part", lambda study, args: pytest.fail("--dry-run with --time-budget started a part"))
    for modes in (["--dry-run", "--time-budget", "60"], ["--report", "--time-budget", "60"],
                  ["--plan-seeds", "--dry-run"]):
        with pytest.raises(SystemExit) as exit:
            cli.main(STUDY, modes)
        assert exit.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_the_dry_run_prints_every_run_and_sums_its_hours_by_arm(tmp_path, reference, monkeypatch):
    _fake_reference(tmp_path / "ref", reference)
    args = argparse.Namespace(scale="mini", seeds=str(tmp_path / "none.json"), with_optional=False, pinned=None,
                              records=str(tmp_path / "study"), reference=str(tmp_path / "ref"), out=str(tmp_path),
                              machine_factor=1.0)
    runs, key, by_name, est = part.setup(STUDY, args)
    text = cli.dry_run(STUDY, args)
    assert sum(line.startswith(("would run", "recorded ")) for line in text.splitlines()) == len(runs)
    total = sum(s for s, _ in est.values()) / 3600
    assert f"total {total:.2f} run-hours ({total:.2f} left" in text
    by_arm = study.run_hours(runs, {n: s for n, (s, _) in est.items()})
    assert math.isclose(sum(sum(v.values()) for v in by_arm.values()), total)
    for arm, styles in by_arm.items():
        assert f"  {arm:8s} {sum(styles.values()):6.2f}" in text
    assert "optional arm(s) x4: +" in text


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
                study_record(folder, f"probe/words-{arm}-{o}-descriptive-s{seed}", "linear_probe", {}, 1.0,
                             {"datasets": top, "grid": {"datasets": top}, "random_init": {"datasets": top}}, seed, lab)
                v = "elbo" if o == "mdc" else "exact"
                own = 0.95 if o == "arc" else 0.5 + 0.01 * seed
                scores = {v: {"accuracy": own}, f"{v}_shuffled": {"accuracy": 0.5}, f"{v}_blind": {"accuracy": 0.5}}
                cols = {c: {"items": 120, "scores": scores} for c in ("own_swap", "own_attribute")}
                study_record(folder, f"compositionality/words-{arm}-{o}-descriptive-binding-s{seed}",
                             "compositionality", {}, 1.0, {"columns": cols}, seed, lab)
                s = 0.5 + 0.01 * seed if o == "arc" else (0.2 + 0.01 * seed if arm == "rotary" else 0.001 * seed)
                view = {"own": {"difference": s}, "other_image": {"difference": 0.0}}
                study_record(folder, f"neighbours/{arm}-{o}-descriptive-s{seed}", "neighbours", {}, 1.0,
                             {"neighbours": {"measures": {"shape_after_colour": {plan_ratio(o): view}}}, "binding": {}},
                             seed, lab)
            lab = {"arm": arm, "style": "alt", "stage": "finetuned", "seed": seed}
            m = {"cider": 1.0, "cider_another_image": 0.2, "bleu4": 0.3, "words": 14.0, "repeated": 0.3}
            stop = {"mdc": {"stopped": "cap" if arm == "rotary" and seed == 0 else "plateau", "steps": 6000,
                            "best_step": 6000, "steps_taken": 6000}}
            study_record(folder, f"captioning/words-{arm}-alt-finetuned-s{seed}", "captioning", {}, 1.0,
                         {"metrics": {"mdc-ref": m, "arc-beam6-ref": m}, "finetune": stop}, seed, lab)
            rep = (0.30 if arm == "paper" else 0.20) + 0.01 * seed
            study_record(folder, f"caption_words/{arm}-alt-finetuned-s{seed}", "caption_words", {}, 1.0,
                         {"sets": {"mdc-ref": {"repeated_content": rep}, "arc-beam6-ref": {"repeated_content": 0.1}},
                          "references": {"repeated_content": 0.05}}, seed, lab)
        lab = {"arm": "paper", "style": "alt", "stage": "finetuned-t0-1", "seed": seed}  # MDC alone, t ~ U[0, 1]
        study_record(folder, f"captioning/words-paper-alt-finetuned-t0-1-s{seed}", "captioning", {}, 1.0,
                     {"metrics": {"mdc-ref": m}, "finetune": {"mdc": {"stopped": "plateau"}}}, seed, lab)
        study_record(folder, f"caption_words/paper-alt-finetuned-t0-1-s{seed}", "caption_words", {}, 1.0,
                     {"sets": {"mdc-ref": {"repeated_content": 0.35 + 0.01 * seed}},
                      "references": {"repeated_content": 0.05}}, seed, lab)


def _probe(arm, objective, seed, right, items=200):
    """A probe run as the report reads it: ``right`` of ``items`` correct on every task."""
    correct = "1" * right + "0" * (items - right)
    return {"notebook": "linear_probe", "labels": {"arm": arm, "objective": objective, "seed": seed},
            "record": {"results": {"datasets": {f"wds/{t}": {"correct": correct} for t in tables.TASKS}}}}


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
def test_a_smoke_part_runs_every_kind_through_the_runner_and_the_steps(tmp_path, monkeypatch):
    """The whole study at the smoke profile's size, one seed (about 10 minutes on 2 cores), pinned to this tree's
    commit: every run recorded in one package digest, seed 0's float16 weights loadable, the checkpoints freed, the
    report built."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with pin.exported(STUDY, head) as root:
        pinned = {"commit": head, **pin.digests(STUDY, root)}
    monkeypatch.setattr(cli.pinning, "read_pin", lambda study: pinned)
    (tmp_path / "seeds.json").write_text(json.dumps({"default": 1}))
    flags = ["--scale", "smoke", "--seeds", str(tmp_path / "seeds.json"), "--records", str(tmp_path / "records"),
             "--out", str(tmp_path / "runs"), "--weights", str(tmp_path / "weights")]
    assert cli.main(STUDY, [*flags, "--time-budget", "60"]) == 0
    runs = words.study_runs("smoke", study.read_seeds(str(tmp_path / "seeds.json")))
    key = study.plan_keys(STUDY, runs, pinned)
    assert all(ledger.done(str(tmp_path / "records"), r.name, key[r.name]) for r in runs)
    assert len({r["code"]["package"] for r in ledger.read_all(str(tmp_path / "records")).values()}) == 1
    kept = mdc.load(tmp_path / "weights" / "pretrain" / "words-hidden-mdc-descriptive-s0")
    assert kept.config.length_visible is False
    assert mdc.load(tmp_path / "weights" / "pretrain" / "words-rotary-arc-descriptive-s0").config.positions == "rotary"
    assert not (tmp_path / "runs" / "smoke" / "pretrain" / "words-paper-mdc-descriptive-s0" / "checkpoints").exists()
    hidden = ledger.read(str(tmp_path / "records"), "captioning/words-hidden-alt-finetuned-s0")
    assert "mdc-None" in hidden["results"]["results"]["metrics"]  # the model's own length beside the fixed ones
    assert cli.main(STUDY, [*flags, "--report"]) == 0 and (tmp_path / "tables.md").is_file()
