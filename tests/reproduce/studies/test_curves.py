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


# ------------------------------------------------------------------------------------------------ report
ITEMS = 1000
# probe right answers of 1,000 a task at each arm (+ the seed): descriptive MDC passes ARC at 4x and still gains
# 6 points from 4x to 8x; ARC and alt flatten; CLIP still gains 4 from its 4x end
PROBE = {("descriptive", "mdc"): {"at1": 450, "at2": 600, "at3": 700, "at4": 800, "at6": 850, "at8": 860, "x4": 850,
                                  "x0.5": 400, "x1": 450, "x2": 600},
         ("descriptive", "arc"): {"at1": 550, "at2": 650, "at3": 720, "at4": 780, "at6": 790, "at8": 795, "x4": 790,
                                  "x0.5": 450, "x1": 520, "x2": 700},
         ("descriptive", "clip"): {"at1": 500, "at2": 520, "at3": 530, "at4": 540, "at6": 560, "at8": 580, "x4": 540},
         ("alt", "mdc"): {"at1": 400, "at2": 450, "at3": 480, "at4": 502, "at6": 505, "at8": 505, "x4": 500},
         ("alt", "arc"): {"at1": 420, "at2": 460, "at3": 480, "at4": 490, "at6": 492, "at8": 493, "x4": 490}}
TWICE = {"at1": 0.66, "at2": 0.6, "at3": 0.2, "at4": 0.1, "at6": 0.05, "at8": 0.05,  # MDC names a shape twice
         "x0.5": 0.64, "x1": 0.66, "x2": 0.66, "x4": 0.05}
CONTENT = {"at1": 0.3, "at2": 0.25, "at3": 0.15, "at4": 0.12, "at6": 0.1, "at8": 0.1, "x4": 0.12}  # alt MDC; refs 0.1


def _bits(right: int, n: int = ITEMS) -> str:
    return "1" * right + "0" * (n - right)


def _curves_records(root):
    """The study's ledger (``root``/curves/records) and the ladder's (``root``/ladder/records), made up: the
    module's tables, two seeds (one for CLIP); MDC binds from at6 on (own 55 of 60 against 30 with another
    image), never on the ladder's rungs; ARC binds everywhere."""
    from conftest import study_record

    from reproduce.claims.stats import TASKS
    from reproduce.studies.driver.tables import SWAPS
    for (style, o), arms in PROBE.items():
        for arm, right in arms.items():
            ladder = arm.startswith("x") and style == "descriptive" and o != "clip"
            folder = root / ("ladder" if ladder else "curves") / "records"
            study = "ladder" if ladder else "curves"
            for seed in range(3 if ladder else 1 if o == "clip" else 2):
                lab = {"arm": arm, "objective": o, "style": style, "seed": seed}
                top = {f"wds/{t}": {"top1": (right + seed) / ITEMS, "correct": _bits(right + seed)} for t in TASKS}
                study_record(folder, f"probe/{study}-{arm}-{o}-{style}-s{seed}", "linear_probe", {}, 1.0,
                             {"datasets": top}, seed, lab)
                if not ladder:
                    losses = [1.0 - right / ITEMS] * 300
                    study_record(folder, f"pretrain/{study}-{arm}-{o}-{style}-s{seed}", "pretrain", {}, 1.0,
                                 {"losses": losses, "images_per_s": 50.0}, seed, lab)
                if style != "descriptive" or o == "clip" or arm == "x4" and not ladder:
                    continue
                v = "elbo" if o == "mdc" else "exact"
                own = 55 if o == "arc" or arm in ("at6", "at8") else 30
                scores = {v: {"accuracy": own / 60}, f"{v}_shuffled": {"accuracy": 0.5}, f"{v}_blind": {"accuracy": 0.5}}
                subsets = {s: {"records": {"correct": {v: _bits(own, 60), f"{v}_shuffled": _bits(30, 60)},
                                           "ids": list(range(60))}} for s in SWAPS}
                columns = {c: {"items": 120, "scores": scores} for c in ("own_swap", "own_attribute")}
                study_record(folder, f"compositionality/{study}-{arm}-{o}-descriptive-binding-s{seed}",
                             "compositionality", {}, 1.0, {"columns": columns, "own_subsets": subsets}, seed, lab)
                twice = TWICE[arm] if o == "mdc" else 0.01
                view = {"shape_twice": twice, "shape_twice_many": twice, "pairs_exist": 0.5}
                study_record(folder, f"repetition/{arm}-{o}-descriptive-s{seed}", "repetition", {}, 1.0,
                             {"views": {"own": view, "other_image": {**view, "pairs_exist": 0.05}}}, seed, lab)
    for arm, content in CONTENT.items():
        for seed in range(2):
            lab = {"arm": arm, "style": "alt", "stage": "pretrained", "seed": seed}
            m = {"cider": 0.5, "cider_another_image": 0.1, "bleu4": 0.2, "words": 14.0, "repeated": 0.3}
            folder = root / "curves" / "records"
            study_record(folder, f"captioning/curves-{arm}-alt-pretrained-s{seed}", "captioning", {}, 1.0,
                         {"metrics": {"mdc-ref": m, "arc-beam6-ref": m}}, seed, lab)
            study_record(folder, f"caption_words/{arm}-alt-pretrained-s{seed}", "caption_words", {}, 1.0,
                         {"sets": {"mdc-ref": {"repeated_content": content}, "arc-beam6-ref": {"repeated_content": 0.1}},
                          "references": {"repeated_content": 0.1}}, seed, lab)


def _row(text: str, start: str) -> list[str]:
    return next(line for line in text.splitlines() if line.startswith(start)).strip("| ").split(" | ")


def test_the_report_reads_each_rule_of_the_plan(tmp_path):
    from reproduce.studies.curves import report

    _curves_records(tmp_path)
    text = report.build(str(tmp_path / "curves" / "records"), str(tmp_path / "curves"))
    assert (tmp_path / "curves" / "curves.png").is_file()
    # rule 1: descriptive CLIP still gains 4.0 from its 4x end to at8 (MDC 1.0 and ARC 0.5 from the ladder's x4)
    assert _row(text, "| descriptive | MDC | +1.0")[-1] == "flat, shown"
    assert _row(text, "| descriptive | CLIP | +4.0")[-1] == "moves"
    assert "**C\\* descriptive: 8x, still learning (change per doubling from 4x to 8x: MDC +1.0, ARC +0.5, CLIP " \
           "+4.0)**" in text
    assert "**C\\* alt: 4x (every mean change within +-1.5)**" in text
    # rule 2: seeds 0 / 1, inside the run and across the ladder's rungs
    assert _row(text, "| MDC names a shape twice")[2:] == ["6,720 / 6,720", "8,960 / 8,960", "earlier inside a run"]
    assert _row(text, "| MDC's probe reaches")[2:] == ["8,960 / 8,960", "8,960 / 8,960", "at the same step"]
    assert _row(text, "| MDC binds")[2:] == ["13,440 / 13,440", "not met / not met", "-"]
    assert _row(text, "| MDC repeats content")[2:] == ["6,720 / 6,720", "no rung", "-"]
    # rule 3: at8 - at4
    assert _row(text, "| descriptive | MDC | +6.0")[5] == "still learning"
    assert _row(text, "| descriptive | ARC | +1.5")[5] == "flat"
    assert _row(text, "| alt | MDC | +0.3")[5] == "flat"
    # rule 4: MDC's probe reaches ARC's at 4x (descriptive), its alt repetition halves at 3x
    assert _row(text, "| 2. Captioners beat CLIP on descriptive captions (Tab. 1) | MDC - CLIP")[-2:] == [
        "MDC's probe reaches ARC's", "judged at 1x, before the transition"]
    assert _row(text, "| 1. MDC's probe is comparable to ARC's (Tab. 1) | MDC - ARC, alt")[-1] == (
        "judged at 1x, before the transition")
    assert _row(text, "| at6 | MDC | 91.7 +- 0.0 (2)")[-1].startswith("+41.7 [")  # own_swap: from 50.0 at at1


def test_binding_transitions_need_that_milestones_arc_to_bind(tmp_path):
    """PLAN.md's positive control: where ARC does not bind at a milestone, MDC's binding criterion there reads
    "control failed" instead of a step."""
    from reproduce.studies.curves import report

    _curves_records(tmp_path)
    folder = tmp_path / "curves" / "records" / "compositionality"
    for arm in ("at6", "at8"):
        for seed in (0, 1):
            path = folder / f"curves-{arm}-arc-descriptive-binding-s{seed}.json"
            record = json.loads(path.read_text())
            for subset in record["results"]["results"]["own_subsets"].values():
                subset["records"]["correct"]["exact"] = _bits(30, 60)  # as with another image: no binding
            path.write_text(json.dumps(record))
    text = report.build(str(tmp_path / "curves" / "records"), str(tmp_path / "curves"))
    assert _row(text, "| MDC binds")[2:] == ["control failed / control failed", "not met / not met", "-"]
