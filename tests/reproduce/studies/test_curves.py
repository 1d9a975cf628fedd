"""The learning-curve study (reproduce/studies/curves/): one 8x schedule a model and seed in pieces that end at the
milestones, each piece read by its world's instruments, the 4x end points beside them, the order a part takes
them in, the kept models and the seed plan."""
import json
import subprocess

import pytest

import mdc
from reproduce import registry
from reproduce.graph import ROOT
from reproduce.running import ledger
from reproduce.studies import curves
from reproduce.studies.driver import cli, pin
from reproduce.studies.driver import estimate as cost
from reproduce.studies.driver.study import plan_keys, read_seeds

PLAN = {"default": 2, "seeds": {"clip": 1}}


@pytest.fixture(scope="module")
def plan():
    return curves.study_runs("mini", PLAN)


@pytest.fixture(scope="module")
def runs(plan):
    return {r.name: r for r in plan}


def test_each_model_is_one_8x_schedule_in_pieces_that_end_at_the_milestones(runs):
    base = {r.name: r for r in registry.build("mini", 2)}
    for style, objectives in (("descriptive", ("mdc", "arc", "clip")), ("alt", ("mdc", "arc"))):
        for o in objectives:
            for s in range(1 if o == "clip" else 2):
                pieces = [runs[f"pretrain/curves-at{m}-{o}-{style}-s{s}"] for m in curves.MILESTONES]
                ref = base[f"pretrain/{o}-{style}-s{s}"].params
                assert [p.params["stop_at"] for p in pieces] == [2240 * m for m in curves.MILESTONES]
                assert all(p.params["steps"] == 17920 and p.params["warmup_steps"] == 1792 for p in pieces)
                assert "resume_from" not in pieces[0].params
                for before, piece in zip(pieces, pieces[1:]):
                    assert piece.params["resume_from"] == f"{{run:{before.name}}}" and before.name in piece.deps
                    assert piece.labels["from_step"] == before.params["stop_at"]
                same = ("steps", "warmup_steps", "save_every", "output_dir", "stop_at", "resume_from")
                assert {k: v for k, v in pieces[0].params.items() if k not in same} == {
                    k: v for k, v in ref.items() if k not in same}
    assert not any("-s2" in n or "clip-descriptive-s1" in n for n in runs)  # the seed plan's 2 and 1


def test_every_piece_has_its_worlds_instruments_and_the_4x_end_points_theirs(runs):
    for m in curves.MILESTONES:
        for o in ("mdc", "arc"):
            assert {f"probe/curves-at{m}-{o}-descriptive-s0", f"repetition/at{m}-{o}-descriptive-s0",
                    f"compositionality/curves-at{m}-{o}-descriptive-binding-s0",
                    f"probe/curves-at{m}-{o}-alt-s0"} <= set(runs)
        assert f"probe/curves-at{m}-clip-descriptive-s0" in runs
        assert not any(n.startswith("compositionality/") and "clip" in n for n in runs)
        captions = runs[f"captioning/curves-at{m}-alt-pretrained-s1"]
        assert captions.params["finetune_steps"] == 0
        assert captions.params["mdc_checkpoint"] == f"{{run:pretrain/curves-at{m}-mdc-alt-s1}}"
        assert f"caption_words/at{m}-alt-pretrained-s1" in runs
    ends = {n for n in runs if n.startswith("pretrain/curves-x4")}
    assert ends == {f"pretrain/curves-{a}-clip-descriptive-s0" for a in ("x4", "x4-half")} | {
        f"pretrain/curves-{a}-{o}-alt-s{s}" for a in ("x4", "x4-half") for o in ("mdc", "arc") for s in (0, 1)}
    end, half = runs["pretrain/curves-x4-mdc-alt-s0"], runs["pretrain/curves-x4-half-mdc-alt-s0"]
    assert (end.params["steps"], end.params["stop_at"], half.params["stop_at"]) == (8960, 8960, 4480)
    assert end.params["resume_from"] == f"{{run:{half.name}}}" and end.labels["from_step"] == 4480
    assert not [r for r in runs.values() if half.name in r.deps and r.name != end.name]  # read at its end alone
    assert {"probe/curves-x4-mdc-alt-s1", "captioning/curves-x4-alt-pretrained-s1",
            "probe/curves-x4-clip-descriptive-s0"} <= set(runs)


def test_a_part_takes_one_models_pieces_after_another(plan, runs):
    """Seed by seed, descriptive MDC's pieces and their readers come before ARC's, which come before the alt pair's:
    a part that ends between pieces leaves few runs whose checkpoint the next part needs."""
    names = [r.name for r in plan]
    assert names.index("caption_words/at8-alt-pretrained-s0") < names.index("pretrain/curves-at1-mdc-descriptive-s1")
    assert names.index("repetition/at8-mdc-descriptive-s0") < names.index("pretrain/curves-at1-arc-descriptive-s0")
    assert names.index("probe/curves-at8-arc-descriptive-s0") < names.index("pretrain/curves-at1-mdc-alt-s0")
    assert all(names.index(d) < names.index(r.name) for r in plan for d in r.deps)
    seconds = {r.name: 600.0 if r.notebook == "pretrain" else 60.0 for r in plan}
    start, _ = cost.select(plan, seconds, set(names), budget_s=4000, jobs=2)  # MDC's 8x run: 3,720 s, ARC's beside
    assert "pretrain/curves-at8-mdc-descriptive-s0" in start and "pretrain/curves-at4-arc-descriptive-s0" in start
    assert "pretrain/curves-at6-arc-descriptive-s0" not in start
    assert not [n for n in start if "-alt-" in n or n.endswith("-s1") or "clip" in n]


def test_seed_zero_is_kept_at_1_2_4_and_8x_and_the_keys_are_unique(plan, runs):
    kept = {r.name for r in plan if r.notebook == "pretrain" and curves.STUDY.keep(r)}
    assert kept == {f"pretrain/curves-at{m}-{o}-{s}-s0" for m in (1, 2, 4, 8)
                    for o, s in (("mdc", "descriptive"), ("arc", "descriptive"), ("clip", "descriptive"),
                                 ("mdc", "alt"), ("arc", "alt"))}
    assert len(set(plan_keys(curves.STUDY, plan).values())) == len(plan)


def test_the_committed_seed_plan_is_the_one_the_tests_read():
    assert read_seeds(curves.STUDY.path("seeds.json")) == PLAN


@pytest.mark.slow
def test_a_smoke_part_trains_the_pieces_through_the_runner_and_reads_each(tmp_path, monkeypatch):
    """The study at the smoke profile's size, one seed, pinned to this tree's commit: every piece continues the one
    before it and every reader is recorded in one package digest, seed 0's float16 pieces load, the checkpoints
    are freed once read."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with pin.exported(curves.STUDY, head) as root:
        pinned = {"commit": head, **pin.digests(curves.STUDY, root)}
    monkeypatch.setattr(cli.pinning, "read_pin", lambda study: pinned)
    (tmp_path / "seeds.json").write_text(json.dumps({"default": 1}))
    flags = ["--scale", "smoke", "--seeds", str(tmp_path / "seeds.json"), "--records", str(tmp_path / "records"),
             "--out", str(tmp_path / "runs"), "--weights", str(tmp_path / "weights")]
    assert cli.main(curves.STUDY, [*flags, "--time-budget", "60"]) == 0
    plan = curves.study_runs("smoke", read_seeds(str(tmp_path / "seeds.json")))
    key = plan_keys(curves.STUDY, plan, pinned)
    records = str(tmp_path / "records")
    assert all(ledger.done(records, r.name, key[r.name]) for r in plan)
    assert len({r["code"]["package"] for r in ledger.read_all(records).values()}) == 1
    pieces = [ledger.read(records, f"pretrain/curves-at{m}-mdc-alt-s0") for m in curves.MILESTONES]
    assert [p["results"]["results"]["steps"] for p in pieces] == [p["params"]["stop_at"] for p in pieces]
    assert len({p["results"]["checkpoint_id"] for p in pieces}) == len(pieces)
    first = pieces[1]["results"]["results"]["losses"]
    assert len(first) == pieces[1]["params"]["stop_at"] - pieces[0]["params"]["stop_at"]  # its own steps only
    assert mdc.load(tmp_path / "weights" / "pretrain" / "curves-at8-clip-descriptive-s0").config.objective == "clip"
    assert not (tmp_path / "runs" / "smoke" / "pretrain" / "curves-at1-mdc-descriptive-s0" / "checkpoints").exists()
