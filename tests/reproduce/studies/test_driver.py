"""The study driver (reproduce/studies/driver/): the time-budget selection, a part's hand-over to the runner and its
steps, drift across machines, the machine factor, one package digest, kept float16 weights."""
import argparse
import contextlib
import itertools
import json

import pytest
import torch
from conftest import study_record

import mdc
from mdc.base.errors import RunError
from mdc.eval.results import checkpoint_id
from reproduce import pretrained
from reproduce.graph import Run
from reproduce.running import ledger
from reproduce.studies.driver import cli, part, steps
from reproduce.studies.driver import estimate as cost
from reproduce.studies.words import STUDY


def _chain_graph():
    runs = [Run("data/d", "data", {}), Run("pretrain/a-s0", "pretrain", {}, ("data/d",)),
            Run("probe/a-s0", "linear_probe", {}, ("pretrain/a-s0",)),
            Run("neighbours/a-s0", "neighbours", {"checkpoint": "{run:pretrain/a-s0}"}, ("pretrain/a-s0",)),
            Run("pretrain/b-s0", "pretrain", {}, ("data/d",)),
            Run("probe/b-s0", "linear_probe", {}, ("pretrain/b-s0",))]
    seconds = {"data/d": 10.0, "pretrain/a-s0": 100.0, "probe/a-s0": 20.0, "neighbours/a-s0": 5.0,
               "pretrain/b-s0": 100.0, "probe/b-s0": 20.0}
    return runs, seconds


def test_the_budget_starts_only_what_fits_with_its_readers():
    runs, seconds = _chain_graph()
    todo = {r.name for r in runs}
    start, left = cost.select(runs, seconds, todo, budget_s=140, jobs=1)
    assert start == ["data/d", "pretrain/a-s0", "probe/a-s0", "neighbours/a-s0"]  # a's chain: 130 s, 135 in all
    assert left == ["pretrain/b-s0", "probe/b-s0"]  # 255 s of runs at one at a time
    assert cost.select(runs, seconds, todo, budget_s=135, jobs=2)[1] == []  # a and b side by side: 135 s
    assert cost.select(runs, seconds, todo, budget_s=130, jobs=2)[1] == ["pretrain/b-s0", "probe/b-s0"]  # b's
    # probe beside a's after both pieces, then the neighbour step: 135 s
    assert cost.select(runs, seconds, todo, budget_s=100, jobs=2)[0] == []  # no chain fits: nothing starts
    done = todo - {"data/d", "pretrain/a-s0", "probe/a-s0"}  # recorded runs cost nothing
    assert cost.select(runs, seconds, done, budget_s=130, jobs=1)[0] == ["neighbours/a-s0", "pretrain/b-s0",
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


def test_two_runs_in_pieces_train_side_by_side_in_one_part():
    """Two chains of pieces (the curves study's MDC and ARC, each a piece then its readers then the next piece)
    fit a part that lasts one chain at two at a time. Graham's bound (run-seconds over two plus half the longest
    chain) chose one chain and left a core idle for the whole part."""
    runs, seconds = _pieces()
    runs += [Run(r.name.replace("s0", "s1"), r.notebook, r.params, tuple(d.replace("s0", "s1") for d in r.deps),
                 labels=r.labels) for r in runs[1:]]
    seconds |= {n.replace("s0", "s1"): s for n, s in seconds.items()}
    todo = {r.name for r in runs}
    start, left = cost.select(runs, seconds, todo, budget_s=250, jobs=2)  # data, two pieces each side by side, four probes
    assert left == [] and cost.makespan(runs, seconds, set(start), 2) == 250


def test_what_a_part_chooses_ends_within_its_budget_in_the_order_it_hands_the_runner():
    """The runner ordered its ready runs by its own rule (runs that make deeper ones ready first), which started a
    long captioning chain last and ran part 8 15 minutes past its budget. A part now hands the runner the order its
    selection assumed (:func:`estimate.priority`): what it chooses ends in time in that order."""
    runs = [Run("pretrain/p-s0", "pretrain", {}), Run("captioning/p-s0", "captioning", {}, ("pretrain/p-s0",)),
            Run("probe/x-s0", "linear_probe", {}), Run("probe/y-s0", "linear_probe", {})]
    seconds = {"pretrain/p-s0": 50.0, "captioning/p-s0": 50.0, "probe/x-s0": 50.0, "probe/y-s0": 50.0}
    todo = {r.name for r in runs}
    for budget in (100, 125, 150, 175):
        start = [r for r in runs if r.name in cost.select(runs, seconds, todo, budget_s=budget, jobs=2)[0]]
        rank = cost.priority(runs, seconds, {r.name for r in start})
        ends = _makespan(start, seconds, sorted(rank, key=rank.get))
        assert start and ends <= budget and ends == cost.makespan(runs, seconds, set(rank), 2), (budget, ends)
    assert len(start) == 4 and cost.makespan(runs, seconds, todo, 2) == 100  # the chain first, the probes beside


def test_steps_start_once_the_runner_has_ended():
    """A part runs its steps after the runner (:func:`part.run_steps`): the selection counts them there."""
    runs, seconds = _chain_graph()
    names = {r.name for r in runs}
    assert cost.makespan(runs, seconds, names, 2) == 135  # data, the two pieces, the probes, the neighbour step
    assert cost.makespan(runs, seconds, names, 2, last=("neighbours",)) == 135
    assert cost.makespan(runs, seconds, names - {"probe/b-s0"}, 2) == 130  # the step beside a's probe...
    assert cost.makespan(runs, seconds, names - {"probe/b-s0"}, 2, last=("neighbours",)) == 135  # ...or after it
    assert cost.makespan(runs, seconds, names, 1, last=("neighbours",)) == 255


def test_a_retrain_that_drifts_supersedes_the_pretrain_and_its_recorded_readers(tmp_path, capsys):
    """Float results differ across CPUs: a recorded pretraining run trained again on another machine can make
    another checkpoint. Its recorded readers read the old one, so the run and they are recorded again."""
    runs, _ = _chain_graph()
    key = {r.name: "k" for r in runs}
    for r in runs:
        study_record(tmp_path, r.name, r.notebook, {}, 1.0)
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
    assert part.drifted(STUDY, runs, key, str(out), str(tmp_path)) == ["pretrain/a-s0", "probe/a-s0", "neighbours/a-s0"]
    assert [r.name for r in runs if ledger.read(str(tmp_path), r.name)] == ["data/d", "pretrain/b-s0", "probe/b-s0"]
    assert "into checkpoint new, not the recorded old" in capsys.readouterr().out
    assert part.drifted(STUDY, runs, key, str(out), str(tmp_path)) == []  # a's record is gone: nothing to compare


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
    assert cost.select(runs, seconds, todo, budget_s=150, jobs=2)[0] == ["data/d", "pretrain/b-s0", "probe/b-s0"]
    start = cost.select(runs, seconds, todo, budget_s=370, jobs=2)[0]  # m's and a's readers: 420 run-s, chain 310
    assert {"pretrain/m-s0", "captioning/pretrained-s0", "captioning/finetuned-s0"} <= set(start)


def _part_handing(monkeypatch, tmp_path, runs: list, seconds: dict, minutes: float) -> dict:
    """Run a part of ``minutes`` over ``runs`` (estimates ``seconds``) with the runner replaced: returns what it
    was handed (``runs``, and its settings)."""
    monkeypatch.setattr(part, "setup", lambda study, args: (runs, {r.name: "k" for r in runs},
                                                            {r.name: r for r in runs},
                                                            {n: (s, "reference") for n, s in seconds.items()}))
    for quiet in ("keep", "free"):
        monkeypatch.setattr(part, quiet, lambda *a: None)
    monkeypatch.setattr(part, "run_steps", lambda *a: [])
    monkeypatch.setattr(part.pinning, "science", lambda study, pin: contextlib.nullcontext("science"))
    handed = {}
    monkeypatch.setattr(part.runner, "run_all", lambda real, out, settings: handed.update(
        runs=[r.name for r in real], settings=settings) or {})
    args = argparse.Namespace(records=str(tmp_path / "records"), time_budget=minutes, out=str(tmp_path), scale="mini",
                              jobs=1, machine_factor=1.0, argv=[], weights=str(tmp_path / "weights"),
                              pinned={"package": "p0"})
    assert part.part(STUDY, args) == 0
    return handed


def test_a_part_hands_the_runner_what_it_chose_without_a_second_budget(tmp_path, monkeypatch):
    """The runner's own estimates (the profile's defaults) are not the study's: under a time budget of its own it
    left a chosen pretraining run unstarted. The part's selection is the budget; the runner executes it."""
    handed = _part_handing(monkeypatch, tmp_path, *_chain_graph(), minutes=140 / 60)
    assert handed["runs"] == ["data/d", "pretrain/a-s0", "probe/a-s0"] and handed["settings"].time_budget_s is None
    assert handed["settings"].priority == {"data/d": 0, "pretrain/a-s0": 1, "probe/a-s0": 2}


def test_a_part_hands_the_runner_the_recorded_pieces_it_chose_to_train_again(tmp_path, monkeypatch):
    """Recorded pieces whose checkpoints are gone, chosen for a next piece the part cannot finish, are trained: the
    runner had taken them as done (no run it was handed read them) and left a core idle for the whole part."""
    runs, seconds = _pieces()
    third = Run("pretrain/at3-s0", "pretrain", {"steps": 400, "stop_at": 300, "resume_from": "{run:pretrain/at2-s0}"},
                ("data/d", "pretrain/at2-s0"), labels={"from_step": 200})
    runs, seconds = runs + [third], seconds | {third.name: 100.0}
    for r in runs[:5]:
        study_record(tmp_path / "records", r.name, r.notebook, {}, 1.0)
    handed = _part_handing(monkeypatch, tmp_path, runs, seconds, minutes=250 / 60)
    assert handed["runs"] == ["data/d", "pretrain/at1-s0", "pretrain/at2-s0"]
    assert set(handed["settings"].again) == {"data/d", "pretrain/at1-s0", "pretrain/at2-s0"}  # the data's is gone


def test_the_steps_the_part_chose_run_past_its_deadline(monkeypatch):
    """A neighbour step left for later needs its checkpoint trained again on the next (another) machine, which
    makes another model and voids the pretraining run's other records: the part's own steps always run."""
    runs, _ = _chain_graph()
    by_name = {r.name: r for r in runs}
    monkeypatch.setattr(part, "_ready", lambda *a: True)
    ran = []
    monkeypatch.setattr(part, "step", lambda study, run, *a: ran.append(run.name) or "")
    args = argparse.Namespace(out="runs", scale="mini", records="records", seeds=STUDY.path("seeds.json"), jobs=1,
                              with_optional=False, machine_factor=1.0)
    est = {"neighbours/a-s0": (300.0, "reference"), "neighbours/b-s0": (300.0, "reference")}
    later = Run("neighbours/b-s0", "neighbours", {"checkpoint": "{run:pretrain/b-s0}"}, ("pretrain/b-s0",))
    steps = [by_name["neighbours/a-s0"], later]
    assert part.run_steps(STUDY, steps, ({s.name: "k" for s in steps}, est), args, deadline=0.0,
                          chosen={"neighbours/a-s0"}, science="science") == []
    assert ran == ["neighbours/a-s0"]  # b's step, ready from an earlier part, waits for a part with time


def test_a_part_refuses_a_ledger_of_another_package(tmp_path):
    study_record(tmp_path, "data/descriptive", "data", {}, 1.0, package="another")
    with pytest.raises(RunError, match="one package digest"):
        part.one_digest(str(tmp_path), "pinned")
    study_record(tmp_path, "data/descriptive", "data", {}, 1.0, package="pinned")
    part.one_digest(str(tmp_path), "pinned")


def test_a_machine_factor_scales_the_reference_estimates_not_the_studys_own_records():
    assert cost.on_machine((100.0, "reference pretrain/mdc-descriptive-s0 x 1.00"), 1.8) == pytest.approx(
        (180.0, "reference pretrain/mdc-descriptive-s0 x 1.00; x 1.8 on this machine"))
    assert cost.on_machine((30.0, "no record: the step's measured default"), 2.0)[0] == 60.0
    own = (5000.0, "the record of seed 0")  # made on this machine: already its speed
    assert cost.on_machine(own, 1.8) == own
    assert cost.on_machine((100.0, "reference x"), 1.0) == (100.0, "reference x")


def test_a_begun_pretraining_run_counts_the_steps_it_has_left(tmp_path):
    """A run longer than one part resumes in the next from its newest checkpoint: a part spends only its steps left.
    A folder of another run (key), a done run and an evaluation count whole."""
    run, probe = Run("pretrain/a-s0", "pretrain", {"steps": 1000}), Run("probe/a-s0", "linear_probe", {})
    folder = tmp_path / "pretrain" / "a-s0"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "latest.json").write_text(json.dumps({"path": "step_000300"}))
    (folder / "run.json").write_text(json.dumps({"key": "k1", "started": 0.0}))
    est = (600.0, "reference pretrain/a-s0")
    assert cost.left(run, "k1", str(tmp_path), est) == pytest.approx(
        (420.0, "reference pretrain/a-s0; resumes at step 300 of 1,000"))
    assert cost.left(run, "k2", str(tmp_path), est) == est  # another run's folder: set aside, trained whole
    assert cost.left(probe, "k1", str(tmp_path), est) == est
    (folder / "results.json").write_text("{}")
    (folder / "done.json").write_text(json.dumps({"key": "k1"}))
    assert cost.left(run, "k1", str(tmp_path), est) == est  # done: the plan's total keeps its whole cost


def test_a_record_made_on_a_slower_machine_estimates_its_next_seed_at_this_machines_speed(tmp_path):
    """The ladder's seed-0 records were made on a machine 3 times the reference's, seed 1 on one at 0.8: taken as
    this machine's seconds, a part on the fast machine chose a third of what fitted, and one on the slow machine
    would have chosen three times too much from the fast records. A record says what machine made it."""
    run = Run("pretrain/a-s1", "pretrain", {"steps": 10}, labels={"seed": 1})
    study_record(tmp_path, "pretrain/a-s0", "pretrain", {"steps": 10}, 3000.0)
    as_is = ledger.estimate(run, str(tmp_path), "mini")
    assert as_is == (3000.0, "the record of seed 0") and cost.on_machine(as_is, 0.8) == as_is  # it does not say
    record = json.loads(open(ledger.path(str(tmp_path), "pretrain/a-s0")).read()) | {"machine_factor": 3.0}
    open(ledger.path(str(tmp_path), "pretrain/a-s0"), "w").write(json.dumps(record))
    seconds, source = ledger.estimate(run, str(tmp_path), "mini")
    assert seconds == pytest.approx(1000.0) and ledger.REFERENCE_SPEED in source
    assert cost.on_machine((seconds, source), 0.8)[0] == pytest.approx(800.0)
    assert cost.on_machine((seconds, source), 1.0)[0] == pytest.approx(1000.0)


def test_a_part_writes_the_factor_it_measured_into_the_records_it_made(tmp_path):
    runs = [Run(f"probe/a-s{s}", "linear_probe", {}) for s in (0, 1)]
    for r, finished in zip(runs, ("2026-12-01T10:00:00Z", "2026-12-02T15:00:00Z")):
        study_record(tmp_path, r.name, r.notebook, {}, 100.0)
        record = ledger.read(str(tmp_path), r.name) | {"finished": finished, "machine_factor": 1.0}
        open(ledger.path(str(tmp_path), r.name), "w").write(json.dumps(record))
    assert part.measured_in(str(tmp_path), runs, "2026-12-02T14:00:00Z", 0.8312) == ["probe/a-s1"]
    assert [ledger.machine_factor(ledger.read(str(tmp_path), r.name)) for r in runs] == [1.0, 0.831]


def test_a_part_measures_its_runs_against_their_reference_estimates():
    est = {"pretrain/a-s0": (1000.0, "reference pretrain/a-s0"), "probe/a-s0": (100.0, "reference probe/a-s0"),
           "pretrain/b-s1": (900.0, "the record of seed 0"), "probe/c-s0": (100.0, "reference probe/c-s0"),
           "probe/d-s1": (100.0, f"the record of seed 0; {ledger.REFERENCE_SPEED} (made at x 3)"),
           "probe/e-s0": (100.0, "no record: the step's measured default")}
    outcome = {"pretrain/a-s0": {"status": "ok", "seconds": 1800.0}, "probe/a-s0": {"status": "ok", "seconds": 200.0},
               "pretrain/b-s1": {"status": "ok", "seconds": 9000.0},  # a record that does not say its machine
               "probe/c-s0": {"status": "failed", "seconds": 1.0}, "probe/d-s1": {"status": "ok", "seconds": 190.0},
               "probe/e-s0": {"status": "ok", "seconds": 9.0}}  # a default measures nothing
    assert cost.machine_ratio(outcome, est) == pytest.approx((1.9, 3))  # the median of 1.8, 1.9 and 2.0
    assert cost.machine_ratio({}, est) is None
    scaled = {n: cost.on_machine(e, 2.0) for n, e in est.items()}  # measured against the reference's estimate
    assert cost.machine_ratio(outcome, scaled, 2.0) == pytest.approx((1.9, 3))
    with pytest.raises(RunError, match="--machine-factor must be > 0"):
        cli.main(STUDY, ["--machine-factor", "0", "--dry-run", "--debug"])


def test_seed_zero_is_kept_in_float16_and_loads(tmp_path):
    torch.manual_seed(0)
    model = mdc.create_model("tiny", "mdc", image_size=32, patch_size=8, vision_width=32, vision_layers=1,
                             vision_heads=2, text_width=32, text_layers=1, text_heads=2, embed_dim=32)
    model.save(tmp_path / "ckpt")
    record = {"run": "pretrain/words-paper-mdc-descriptive-s0", "key": "k",
              "results": {"checkpoint_id": checkpoint_id(tmp_path / "ckpt")}}
    target = pretrained.keep_at(str(tmp_path / "ckpt"), str(tmp_path / "kept"), record)
    loaded = mdc.load(target)
    assert part.kept(target, record) and loaded.config.objective == "mdc"
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


def test_repetition_counts_words_and_content_words():
    r = steps.repetition(["a red circle and a red square", "a star"])
    assert r["captions"] == 2 and r["words"] == 4.5
    assert r["repeated"] == pytest.approx((2 / 7 + 0) / 2)  # "a", "red" again
    assert r["repeated_content"] == pytest.approx((1 / 4 + 0) / 2)  # red, circle, red, square


def test_caption_words_reads_a_captioning_run_and_its_references(tmp_path):
    (tmp_path / "predictions.json").write_text(json.dumps({"mdc-10": {"0": "a red red circle"}}))
    images = [{"split": "test", "sentences": [{"raw": "a red circle"}]},
              {"split": "train", "sentences": [{"raw": "star star"}]}]
    (tmp_path / "captions.json").write_text(json.dumps({"images": images}))
    out = steps.caption_words({"captioning": str(tmp_path), "captions_json": str(tmp_path / "captions.json")})
    assert out["sets"]["mdc-10"]["repeated_content"] == pytest.approx(1 / 3) and out["references"]["repeated"] == 0


def _pieces():
    """One run trained in two pieces (at1: steps 0-100 of a 400-step schedule; at2 continues it to 200), each read
    by a probe."""
    first = Run("pretrain/at1-s0", "pretrain", {"steps": 400, "stop_at": 100, "batch_size": 8}, ("data/d",),
                labels={"from_step": 0})
    second = Run("pretrain/at2-s0", "pretrain", {"steps": 400, "stop_at": 200, "batch_size": 8,
                                                 "resume_from": "{run:pretrain/at1-s0}"}, ("data/d", first.name),
                 labels={"from_step": 100})
    runs = [Run("data/d", "data", {}), first, Run("probe/at1-s0", "linear_probe", {}, (first.name,)), second,
            Run("probe/at2-s0", "linear_probe", {}, (second.name,))]
    return runs, {"data/d": 10.0, first.name: 100.0, "probe/at1-s0": 20.0, second.name: 100.0, "probe/at2-s0": 20.0}


def test_a_run_in_pieces_starts_piece_by_piece_each_with_its_readers():
    """A piece that continues a run does not make the run before it one indivisible chain: a part may train the
    first piece and its readers and leave the next to a later part (which trains the first again if its folder
    is gone)."""
    runs, seconds = _pieces()
    todo = {r.name for r in runs}
    assert cost.select(runs, seconds, todo, budget_s=140, jobs=1)[0] == ["data/d", "pretrain/at1-s0", "probe/at1-s0"]
    assert cost.select(runs, seconds, todo, budget_s=260, jobs=1)[1] == []


def test_a_piece_is_estimated_and_resumed_by_the_steps_it_trains(tmp_path):
    runs, _ = _pieces()
    second = runs[3]
    assert ledger.trained_steps(second.params, second.labels) == 100
    reference = tmp_path / "reference"
    study_record(reference, "pretrain/mdc-descriptive-s0", "pretrain", {"steps": 50, "batch_size": 8}, 60.0,
                 labels={"objective": "mdc", "style": "descriptive"})
    assert cost.pretrain_factor(second, ledger.read(str(reference), "pretrain/mdc-descriptive-s0"),
                                str(reference))[0] == 2.0  # 100 steps of 8 over 50 of 8, not 400 or 200
    folder = tmp_path / "out" / "pretrain" / "at2-s0"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "latest.json").write_text(json.dumps({"path": "step_000175"}))
    (folder / "run.json").write_text(json.dumps({"key": "k1", "started": 0.0}))
    assert cost.left(second, "k1", str(tmp_path / "out"), (600.0, "x"))[0] == pytest.approx(150.0)  # 25 of 100 left
    record = {"notebook": "pretrain", "seconds": 10.0, "labels": second.labels,
              "results": {"results": {"steps": 200, "global_batch": 8, "images_per_s": 8.0}}}
    assert ledger.run_seconds(record) == 100.0  # its 100 steps' images over its speed, not the stop step's 200


def test_an_arm_that_continues_another_trains_the_next_piece_of_its_run():
    """Arms ``after`` another train one schedule in pieces: the same run's parameters, its stop, the checkpoint it
    continues (read as a dependency) and the step it starts from."""
    from reproduce import registry
    from reproduce.studies.driver.study import Arm, pretrain_run

    ref = {r.name: r for r in registry.build("mini", 1)}
    first = Arm("at1", ("mdc",), ("descriptive",), steps=8, stop=1)
    second = Arm("at2", ("mdc",), ("descriptive",), steps=8, stop=2, after=first)
    a, b = (pretrain_run("s", ref["pretrain/mdc-descriptive-s0"], ref["data/descriptive"], arm, "mdc", "descriptive", 0)
            for arm in (first, second))
    assert (a.params["steps"], a.params["stop_at"], b.params["stop_at"]) == (17920, 2240, 4480)
    assert "resume_from" not in a.params and b.params["resume_from"] == "{run:pretrain/s-at1-mdc-descriptive-s0}"
    assert b.deps == ("data/descriptive", a.name) and (a.labels["from_step"], b.labels["from_step"]) == (0, 2240)
    assert {k: v for k, v in a.params.items() if k not in ("stop_at", "output_dir")} == {
        k: v for k, v in b.params.items() if k not in ("stop_at", "resume_from", "output_dir")}


def test_a_piece_that_only_the_next_piece_reads_is_chosen_alone():
    """The first half of a schedule read by nothing but its second half (a run longer than a part, read at its
    end) is a part's work of its own."""
    runs, seconds = _pieces()
    runs = [r for r in runs if r.name != "probe/at1-s0"]
    todo = {r.name for r in runs}
    assert cost.select(runs, seconds, todo, budget_s=140, jobs=1)[0] == ["data/d", "pretrain/at1-s0"]


def test_a_piece_s_checkpoint_outlives_the_part_until_the_next_piece_is_recorded(tmp_path):
    """The next piece resumes from the piece before it: its checkpoint is freed only once that piece is recorded,
    even while a step waits on the next piece (the part left it unfinished)."""
    runs, _ = _pieces()
    step = Run("neighbours/at2-s0", "neighbours", {"checkpoint": "{run:pretrain/at2-s0}"}, ("pretrain/at2-s0",))
    runs, key, out = runs + [step], {r.name: "k" for r in runs + [step]}, tmp_path / "out"
    for r in runs[:3]:  # the data, the first piece and its probe are recorded; the second piece was stopped
        study_record(tmp_path, r.name, r.notebook, {}, 1.0)
        (out / r.name / "checkpoints").mkdir(parents=True)
        (out / r.name / "done.json").write_text(json.dumps({"key": "k"}))
    part.free(STUDY, runs, key, str(out), str(tmp_path), str(tmp_path / "weights"))
    assert (out / "pretrain/at1-s0" / "checkpoints").is_dir() and (out / "pretrain/at1-s0" / "done.json").is_file()
    study_record(tmp_path, "pretrain/at2-s0", "pretrain", {}, 1.0)  # the next piece is recorded: at1's may go
    study_record(tmp_path, "probe/at2-s0", "linear_probe", {}, 1.0)
    part.free(STUDY, runs, key, str(out), str(tmp_path), str(tmp_path / "weights"))
    assert not (out / "pretrain/at1-s0" / "checkpoints").exists()
