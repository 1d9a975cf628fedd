"""The results ledger: every finished run leaves a small record; a recorded run is done without its folder,
executes again only when a run that executes reads its output; a time budget leaves runs for the next call;
checkpoints go once every reader is recorded; records say which code made them and nothing of the machine."""
import json
import os
import shutil
import time

import pytest

from conftest import toy_calls, toy_notebook
from reproduce import graph
from reproduce.running import attempt, ledger, runner
from reproduce.graph import Run
from reproduce.running.runner import RunSettings

TOY = '''
import json, os, time
os.makedirs(output_dir, exist_ok=True)
if checkpoint:
    os.makedirs(os.path.join(output_dir, "checkpoints", "step_1"), exist_ok=True)
time.sleep(sleep)
with open(os.path.join(output_dir, "calls.txt"), "a") as f:
    f.write("x")
json.dump({"schema": "mdc.results/1", "kind": "toy", "checkpoint": os.path.abspath(output_dir),
           "checkpoint_id": os.environ.get("TOY_CHECKPOINT_ID", "c1"),  # what a run's weights hash to
           "results": {"value": value, "correct": [1, 0, 1]}}, open(os.path.join(output_dir, "results.json"), "w"))
'''
PARAMETERS = 'output_dir = ""\nvalue = 0\nsleep = 0.0\ncheckpoint = False'  # the toy notebook's parameters cell


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy notebook in place of notebooks/; returns (out, records), neither made yet."""
    monkeypatch.setattr(graph, "NOTEBOOKS", toy_notebook(tmp_path / "notebooks", "toy", PARAMETERS, TOY))
    return str(tmp_path / "out"), str(tmp_path / "records")


@pytest.fixture(scope="module")
def first_ledger(tmp_path_factory):
    """``_runs()`` executed once with a ledger, shared by the tests that start from it (each run is a notebook
    kernel: seconds): (out, records, outcome). Read it only; :func:`recorded` gives a test its own copy."""
    base = tmp_path_factory.mktemp("first-ledger")
    out, records = str(base / "out"), str(base / "records")
    with pytest.MonkeyPatch.context() as mp:  # the same notebook as toy's, so the same keys
        mp.setattr(graph, "NOTEBOOKS", toy_notebook(base / "notebooks", "toy", PARAMETERS, TOY))
        outcome = runner.run_all(_runs(), out, RunSettings(records=records), log=lambda *a: None)
    return out, records, outcome


@pytest.fixture
def recorded(toy, first_ledger):
    """A fresh machine with the committed ledger only: a copy of :func:`first_ledger`'s records, no run folder;
    returns (out, records) like :func:`toy`."""
    out, records = toy
    shutil.copytree(first_ledger[1], records)
    return out, records


def _runs(b=2, sleep=0.0, checkpoint=False):
    return [Run("pre/a", "toy", {"output_dir": "{run:pre/a}", "value": 1, "checkpoint": checkpoint}),
            Run("eval/b", "toy", {"output_dir": "{run:eval/b}", "value": b, "sleep": sleep}, deps=("pre/a",),
                labels={"seed": 0}),
            Run("eval/c", "toy", {"output_dir": "{run:eval/c}", "value": 3, "sleep": sleep}, deps=("pre/a",))]


@pytest.mark.usefixtures("toy")  # the same notebook in graph.NOTEBOOKS: the digest and keys the records name
def test_every_finished_run_leaves_a_record_that_names_its_code_and_no_machine_path(first_ledger):
    out, records, outcome = first_ledger
    assert {o["status"] for o in outcome.values()} == {"ok"}
    found = ledger.read_all(records)
    assert sorted(found) == ["eval/b", "eval/c", "pre/a"]
    b = found["eval/b"]
    assert b["key"] == graph.keys(_runs())["eval/b"] and b["seed"] == 0 and b["params"]["output_dir"] == "{run:eval/b}"
    assert b["code"]["notebook"] == graph.code_digest(os.path.join(graph.NOTEBOOKS, "toy.ipynb"))
    assert b["code"]["package"] == ledger.package_digest() and b["device"]
    assert b["seconds"] > 0 and b["cpu_seconds"] > 0 and b["peak_mb"] > 0
    assert b["results"]["results"] == {"value": 2, "correct": [1, 0, 1]}
    assert b["results"]["checkpoint"] == "{out}/eval/b"  # the run tree, not this machine's path
    assert os.path.abspath(out) not in open(ledger.path(records, "eval/b")).read()


def test_a_recorded_run_is_done_without_its_folder(recorded):
    out, records = recorded
    outcome = runner.run_all(_runs(), out, RunSettings(records=records), log=lambda *a: None)
    assert {o["status"] for o in outcome.values()} == {"skipped"}
    assert not any(toy_calls(out, r.name) for r in _runs())


def test_a_recorded_run_executes_again_when_a_run_that_executes_reads_its_output(recorded):
    out, records = recorded
    lines = []
    # b changed: it reads pre/a's folder
    outcome = runner.run_all(_runs(b=5), out, RunSettings(records=records), log=lines.append)
    assert outcome["pre/a"]["status"] == "ok" and outcome["eval/b"]["status"] == "ok"
    assert outcome["eval/c"]["status"] == "skipped"
    assert any("pre/a: recorded, but eval/b reads its output" in line for line in lines)
    assert ledger.read(records, "eval/b")["results"]["results"]["value"] == 5


def test_a_recorded_run_named_again_executes_for_a_reader_a_later_runner_starts(recorded):
    """A run trained in pieces: a part that can retrain the recorded pieces but not finish the next one hands the
    runner those pieces without their reader; they execute, their folder is left for the next part."""
    out, records = recorded
    outcome = runner.run_all(_runs()[:1], out, RunSettings(records=records, again=("pre/a",)), log=lambda *a: None)
    assert outcome["pre/a"]["status"] == "ok" and toy_calls(out, "pre/a")
    outcome = runner.run_all(_runs()[:1], out, RunSettings(records=records, again=("pre/a",)), log=lambda *a: None)
    assert outcome["pre/a"]["status"] == "skipped"  # its folder is here now: nothing to do again


def test_a_recorded_run_that_executes_again_must_make_the_checkpoint_its_record_names(recorded, monkeypatch):
    """A pretraining run executed again for a reader whose key changed must make the weights its record names:
    other weights would leave its recorded readers (a probe) on another model than the new one. Then it fails,
    its reader is blocked and the ledger keeps what it had."""
    out, records = recorded
    before = {name: ledger.read(records, name) for name in ("pre/a", "eval/b")}
    monkeypatch.setenv("TOY_CHECKPOINT_ID", "c2")  # the same parameters train other weights
    outcome = runner.run_all(_runs(b=5), out, RunSettings(records=records), log=lambda *a: None)
    assert outcome["pre/a"]["status"] == "failed" and outcome["eval/b"]["status"] == "blocked"
    assert "made checkpoint c2, not the recorded c1" in outcome["pre/a"]["error"]
    assert {name: ledger.read(records, name) for name in before} == before
    again = runner.run_all(_runs(b=5), out, RunSettings(records=records), log=lambda *a: None)
    assert again["pre/a"]["status"] == "failed" and again["eval/b"]["status"] == "blocked"  # its folder is not done


def test_a_done_folder_holding_another_checkpoint_than_its_record_is_not_read(recorded, monkeypatch):
    """A folder done with the run's key may hold weights its record does not name (the record came from another
    machine, or the runner stopped before comparing): a new reader must not read them beside recorded readers of
    the recorded model. The run executes again and must make the recorded checkpoint."""
    out, records = recorded
    monkeypatch.setenv("TOY_CHECKPOINT_ID", "c2")
    runner.run_all(_runs(), out, log=lambda *a: None)  # folders of this machine's model, no ledger
    monkeypatch.delenv("TOY_CHECKPOINT_ID")  # this time the run makes the recorded model again
    lines = []
    outcome = runner.run_all(_runs(b=5), out, RunSettings(records=records), log=lines.append)
    assert outcome["pre/a"]["status"] == "ok" and outcome["eval/b"]["status"] == "ok"  # a reader of c1, not c2
    assert any(line.startswith("pre/a: its folder holds checkpoint c2, not the recorded c1") for line in lines)
    assert ledger.read(records, "eval/b")["results"]["results"]["value"] == 5


def test_the_dry_run_counts_a_recorded_run_that_executes_again(recorded):
    """What run_all would execute, the dry run says it would run and counts in the hours left: a recorded
    pretraining run whose output is gone, read by a run whose key changed."""
    out, records = recorded
    lines = []
    runner.dry_run(_runs(b=5), out, RunSettings(records=records), log=lines.append)
    state = {line.split("  (")[0].split()[-1]: line.split()[0] for line in lines if "  (" in line}
    assert state == {"pre/a": "would", "eval/b": "would", "eval/c": "done"}
    assert any("pre/a: recorded, but eval/b reads its output" in line for line in lines)


def test_a_run_recorded_under_another_key_says_why_it_executes_again(recorded):
    """A record made by other code or parameters is not this run's: the dry run says so rather than
    listing the run as if it had never run."""
    out, records = recorded
    lines = []
    runner.dry_run(_runs(b=5), out, RunSettings(records=records), log=lines.append)
    assert any(line.startswith("eval/b: recorded under another key") and "executes again" in line for line in lines)
    assert not any(line.startswith(("eval/c: recorded under", "pre/a: recorded under")) for line in lines)


def test_runs_done_before_the_ledger_get_their_records_from_their_folders(toy):
    out, records = toy
    runner.run_all(_runs(), out, log=lambda *a: None)  # no ledger yet
    outcome = runner.run_all(_runs(), out, RunSettings(records=records), log=lambda *a: None)
    assert {o["status"] for o in outcome.values()} == {"skipped"}
    assert sorted(ledger.read_all(records)) == ["eval/b", "eval/c", "pre/a"]


def test_a_run_done_before_the_ledger_is_recorded_with_the_seconds_it_took(toy):
    out, records = toy
    runner.run_all(_runs(sleep=0.3), out, log=lambda *a: None)  # no ledger yet: the folders hold what each took
    runner.run_all(_runs(sleep=0.3), out, RunSettings(records=records), log=lambda *a: None)
    assert ledger.read(records, "eval/b")["seconds"] >= 0.3  # not 0: the next estimate reads it


def test_a_time_budget_starts_no_run_past_it_and_the_next_call_finishes(toy):
    out, records = toy
    first = runner.run_all(_runs(sleep=1.5), out, RunSettings(records=records, time_budget_s=0.5), log=lambda *a: None)
    statuses = {n: o["status"] for n, o in first.items()}
    assert statuses["pre/a"] == "ok" and "left" in statuses.values()
    assert len(ledger.read_all(records)) < 3
    second = runner.run_all(_runs(sleep=1.5), out, RunSettings(records=records), log=lambda *a: None)
    assert {o["status"] for o in second.values()} <= {"ok", "skipped"} and len(ledger.read_all(records)) == 3


def test_an_estimate_comes_from_the_run_s_last_record(toy):
    out, records = toy
    run = _runs()[1]
    assert ledger.estimate_seconds(run, records, "mini") == 0  # no record, and no default for a toy notebook
    assert ledger.estimate_seconds(Run("p", "pretrain", {}), records, "mini") == ledger.DEFAULT_SECONDS["mini"]["pretrain"]
    runner.run_all(_runs(sleep=0.3), out, RunSettings(records=records), log=lambda *a: None)
    assert ledger.estimate_seconds(run, records, "mini") == ledger.read(records, "eval/b")["seconds"] >= 0.3


@pytest.mark.parametrize("keep", [False, True])
def test_checkpoints_go_once_every_reader_is_recorded(toy, keep):
    out, records = toy
    lines = []
    runner.run_all(_runs(checkpoint=True), out, RunSettings(records=records, keep_checkpoints=keep), log=lines.append)
    folder = os.path.join(out, "pre", "a")
    assert os.path.isdir(os.path.join(folder, "checkpoints")) == keep
    assert os.path.isfile(os.path.join(folder, "done.json")) == keep
    assert any("checkpoints removed" in line for line in lines) != keep
    again = runner.run_all(_runs(checkpoint=True), out, RunSettings(records=records), log=lambda *a: None)
    assert {o["status"] for o in again.values()} == {"skipped"}  # the records stand for the removed folder


def test_provenance_lists_records_of_different_package_versions(first_ledger):
    found = ledger.read_all(first_ledger[1])
    assert ledger.provenance(found) == f"From 3 run records of package {ledger.package_digest()}."
    assert ledger.provenance(found, of=181) == (f"From 3 of the ledger's 181 run records (those that feed it) of "
                                                f"package {ledger.package_digest()}.")
    found["eval/c"] = {**found["eval/c"], "code": {**found["eval/c"]["code"], "package": "0" * 16}}
    line = ledger.provenance(found)
    assert "2 package versions" in line and f"package {'0' * 16}: 1 (eval/c)" in line


def test_a_record_is_one_small_json_file(first_ledger):
    records = first_ledger[1]
    with open(ledger.path(records, "pre/a")) as f:
        record = json.load(f)
    assert record["schema"] == ledger.SCHEMA and os.path.getsize(ledger.path(records, "pre/a")) < 4000


@pytest.mark.usefixtures("instant_runs")
def test_depth_first_a_pretraining_run_s_evaluations_come_before_the_next_pretraining_run(toy):
    """Evaluations also need the evaluation data, which nothing else needs: it runs as soon as an evaluation
    waits for it, so a runner stopped by its budget leaves few checkpoints without their evaluations."""
    out, _ = toy
    runs = [Run("data/alt", "toy", {"output_dir": "{run:data/alt}"}),
            Run("pre/a", "toy", {"output_dir": "{run:pre/a}"}, deps=("data/alt",)),
            Run("pre/b", "toy", {"output_dir": "{run:pre/b}"}, deps=("data/alt",)),
            Run("data/eval", "toy", {"output_dir": "{run:data/eval}"}),
            Run("probe/a", "toy", {"output_dir": "{run:probe/a}"}, deps=("pre/a", "data/eval")),
            Run("probe/b", "toy", {"output_dir": "{run:probe/b}"}, deps=("pre/b", "data/eval"))]
    lines = []
    runner.run_all(runs, out, log=lines.append)
    started = [line.split()[-1] for line in lines if " running " in line]
    assert started == ["data/alt", "pre/a", "data/eval", "probe/a", "pre/b", "probe/b"]


def _estimates(monkeypatch, seconds):
    monkeypatch.setattr(ledger, "estimate_seconds", lambda run, records, profile, runs=None: seconds.get(run.name, 0.0))


@pytest.mark.usefixtures("instant_runs")
def test_the_run_at_the_head_of_the_longest_chain_starts_first(toy, monkeypatch):
    """Of two ready pretraining runs, the one whose reader takes longest goes first, whatever the order the
    registry lists them in: a session's long evaluation (MDC's Table 2) starts early enough to finish."""
    out, _ = toy
    runs = [Run("data/alt", "toy", {"output_dir": "{run:data/alt}"}),
            Run("pre/short", "toy", {"output_dir": "{run:pre/short}"}, deps=("data/alt",)),
            Run("pre/long", "toy", {"output_dir": "{run:pre/long}"}, deps=("data/alt",)),
            Run("eval/short", "toy", {"output_dir": "{run:eval/short}"}, deps=("pre/short",)),
            Run("eval/long", "toy", {"output_dir": "{run:eval/long}"}, deps=("pre/long",))]
    _estimates(monkeypatch, {"pre/short": 10, "pre/long": 10, "eval/short": 1, "eval/long": 100})
    lines = []
    runner.run_all(runs, out, log=lines.append)
    started = [line.split()[-1] for line in lines if " running " in line]
    assert started == ["data/alt", "pre/long", "eval/long", "pre/short", "eval/short"]


@pytest.mark.usefixtures("instant_runs")
def test_a_time_budget_starts_no_run_whose_readers_could_not_follow_it(toy, monkeypatch):
    """A checkpoint that its reader cannot use before the budget ends would be trained again by the next
    part: such a run is left, and a run whose readers fit still starts."""
    out, records = toy
    runs = [Run("pre/long", "toy", {"output_dir": "{run:pre/long}"}),
            Run("eval/long", "toy", {"output_dir": "{run:eval/long}"}, deps=("pre/long",)),
            Run("pre/short", "toy", {"output_dir": "{run:pre/short}"}),
            Run("eval/short", "toy", {"output_dir": "{run:eval/short}"}, deps=("pre/short",))]
    _estimates(monkeypatch, {"pre/long": 1, "eval/long": 1000, "pre/short": 1, "eval/short": 1})
    outcome = runner.run_all(runs, out, RunSettings(records=records, time_budget_s=60), log=lambda *a: None)
    assert {n: o["status"] for n, o in outcome.items()} == {
        "pre/long": "left", "eval/long": "left", "pre/short": "ok", "eval/short": "ok"}


def test_past_the_budget_a_short_reader_of_a_run_trained_in_this_part_still_starts(toy, monkeypatch):
    """A pretraining run that overran its estimate ends past the budget: its short reader (a tenth of the
    budget at most, shorter than the run it reads) still starts, else the next part would train that run
    again for a run of a few minutes. A long reader, or a run reading nothing trained here, is left."""
    out, records = toy
    runs = [Run("pre/a", "toy", {"output_dir": "{run:pre/a}", "sleep": 1.0}),
            Run("eval/short", "toy", {"output_dir": "{run:eval/short}"}, deps=("pre/a",)),
            Run("eval/long", "toy", {"output_dir": "{run:eval/long}"}, deps=("pre/a",)),
            Run("pre/other", "toy", {"output_dir": "{run:pre/other}"})]
    _estimates(monkeypatch, {"pre/a": 0.2, "eval/short": 0.01, "eval/long": 0.1, "pre/other": 0.01})
    outcome = runner.run_all(runs, out, RunSettings(records=records, time_budget_s=0.5), log=lambda *a: None)
    assert {n: o["status"] for n, o in outcome.items()} == {
        "pre/a": "ok", "eval/short": "ok", "eval/long": "left", "pre/other": "left"}


@pytest.mark.usefixtures("instant_runs")
def test_a_seed_s_runs_start_before_the_next_seed_s(toy, monkeypatch):
    out, _ = toy
    runs = [Run("pre/long-s1", "toy", {"output_dir": "{run:pre/long-s1}"}, labels={"seed": 1}),
            Run("pre/short-s0", "toy", {"output_dir": "{run:pre/short-s0}"}, labels={"seed": 0})]
    _estimates(monkeypatch, {"pre/long-s1": 100, "pre/short-s0": 1})
    lines = []
    runner.run_all(runs, out, log=lines.append)
    assert [line.split()[-1] for line in lines if " running " in line] == ["pre/short-s0", "pre/long-s1"]


def test_without_its_own_record_a_run_is_estimated_from_the_same_run_of_another_seed(toy):
    out, records = toy
    runs = [Run("eval/b-s0", "toy", {"output_dir": "{run:eval/b-s0}", "sleep": 0.3}, labels={"seed": 0})]
    runner.run_all(runs, out, RunSettings(records=records), log=lambda *a: None)
    seed1, other = Run("eval/b-s1", "toy", {}, labels={"seed": 1}), Run("eval/bb-s1", "toy", {}, labels={"seed": 1})
    assert ledger.estimate_seconds(seed1, records, "mini") == ledger.read(records, "eval/b-s0")["seconds"] >= 0.3
    assert ledger.estimate_seconds(other, records, "mini") == 0  # another run's record is not its own


@pytest.mark.usefixtures("instant_runs")
def test_a_finished_checkpoint_s_readers_go_before_a_longer_pretraining_run(toy, monkeypatch):
    """The chain orders runs of one depth only: a short evaluation of a checkpoint that is here goes before a
    pretraining run with a longer chain, or a time box ends with checkpoints whose evaluations never ran."""
    out, _ = toy
    runs = [Run("pre/a", "toy", {"output_dir": "{run:pre/a}"}),
            Run("probe/a", "toy", {"output_dir": "{run:probe/a}"}, deps=("pre/a",)),
            Run("pre/b", "toy", {"output_dir": "{run:pre/b}"}),
            Run("eval/b", "toy", {"output_dir": "{run:eval/b}"}, deps=("pre/b",))]
    _estimates(monkeypatch, {"pre/a": 1, "probe/a": 1, "pre/b": 100, "eval/b": 100})
    runner.run_all(runs, out, RunSettings(only={"pre/a"}), log=lambda *a: None)
    lines = []
    runner.run_all(runs, out, log=lines.append)
    assert [line.split()[-1] for line in lines if " running " in line] == ["probe/a", "pre/b", "eval/b"]


def test_a_resumed_pretraining_run_is_estimated_at_its_whole_length(tmp_path):
    """A run that resumed from a checkpoint records the wall time of its last attempt only (part 2 of the
    reference run started pretrain/arc-alt-s1 on seed 0's 571 s, half its 1,099 s, and overran its time box);
    a pretraining record's images over its throughput is the whole run's length."""
    record = {"schema": ledger.SCHEMA, "run": "pretrain/a-s0", "notebook": "pretrain", "seconds": 571.0,
              "results": {"results": {"steps": 2240, "global_batch": 64, "images_per_s": 130.5}}}
    os.makedirs(tmp_path / "pretrain")

    def keep(record):
        with open(tmp_path / "pretrain" / "a-s0.json", "w") as f:
            json.dump(record, f)

    keep(record)
    whole = 2240 * 64 / 130.5
    for name in ("pretrain/a-s0", "pretrain/a-s1"):  # its own record, and another seed's
        assert ledger.estimate_seconds(Run(name, "pretrain", {}), str(tmp_path), "mini") == pytest.approx(whole)
    keep({**record, "seconds": 2 * whole})  # a whole run's wall time, loading and saving included, is kept
    assert ledger.estimate_seconds(Run("pretrain/a-s1", "pretrain", {}), str(tmp_path), "mini") == 2 * whole


def test_a_record_s_wall_time_adds_up_the_attempts_of_its_run(toy):
    """An attempt stopped at its timeout and the attempt that finishes the run both count: the record says
    how long the run took, not its last attempt (the reference run's records held the last attempt only)."""
    out, records = toy
    run = Run("eval/slow", "toy", {"output_dir": "{run:eval/slow}", "sleep": 3.0}, timeout_s=2)
    outcome = runner.run_all([run], out, RunSettings(records=records), log=lambda *a: None)
    assert outcome["eval/slow"]["status"] == "timeout"
    start = time.perf_counter()
    run = Run("eval/slow", "toy", {"output_dir": "{run:eval/slow}", "sleep": 3.0})  # the same key
    outcome = runner.run_all([run], out, RunSettings(records=records), log=lambda *a: None)
    assert outcome["eval/slow"]["status"] == "ok"
    last_call = time.perf_counter() - start
    assert ledger.read(records, "eval/slow")["seconds"] >= last_call + 1.5  # the first attempt's 2 s


def test_an_attempt_whose_runner_was_stopped_counts_to_its_log_s_last_line(toy):
    """A runner killed mid-run never saw its attempt end: that attempt counts from its start to the last
    write of its log; an attempt of another run (another key) in the folder counts nothing."""
    out, records = toy
    run = Run("eval/b", "toy", {"output_dir": "{run:eval/b}"})
    key = graph.keys([run])["eval/b"]
    folder = os.path.join(out, "eval", "b")
    os.makedirs(folder)
    now = time.time()
    with open(os.path.join(folder, "run.json"), "w") as f:
        json.dump({"key": key, "started": now - 100, "earlier_s": 7.0}, f)
    with open(os.path.join(folder, "log.txt"), "w") as f:
        f.write("killed here\n")
    os.utime(os.path.join(folder, "log.txt"), (now - 40, now - 40))
    runner.run_all([run], out, RunSettings(records=records), log=lambda *a: None)
    assert 67.0 <= ledger.read(records, "eval/b")["seconds"] < 67.0 + 60
    runner.run_all([run], out, RunSettings(records=records), log=lambda *a: None)  # done: nothing added, nothing run
    assert ledger.read(records, "eval/b")["seconds"] < 67.0 + 60


def test_a_record_names_the_device_its_notebook_ran_on(monkeypatch):
    """On a GPU machine pretraining takes the GPU (``mdc.train``'s rule) while an evaluation runs where its
    notebook's ``device`` parameter says, the CPU unless the run names cuda: the machine's GPU is not the
    device of a probe that ran on its CPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Some GPU")
    assert ledger.device(Run("pretrain/m-s0", "pretrain", {})) == "cuda: Some GPU"
    assert ledger.device(Run("probe/m-s0", "linear_probe", {})).startswith("cpu: ")
    assert ledger.device(Run("probe/m-s0", "linear_probe", {"device": "cuda"})) == "cuda: Some GPU"
    assert ledger.device(Run("data/world", "data", {})).startswith("cpu: ")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cpu_record_names_the_threads_its_run_had(monkeypatch, threads):
    """A CPU run's numbers depend on its thread count in the last bit (a reduction split another way), and over a
    pretraining run that bit grows: the same seed trained with 1 and with 2 threads parts at step 115 and ends a
    point of probe apart. The record says the count, and the run is given the count its record says."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    assert ledger.device(Run("probe/m-s0", "linear_probe", {})).endswith(f", {threads} thread{'s' * (threads > 1)}")
    assert attempt.child_env()["OMP_NUM_THREADS"] == str(threads)


def test_torchrun_keeps_its_own_thread_count(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in attempt.child_env(torchrun=(8, 1))  # torchrun gives each process its own


def test_a_run_without_a_thread_count_is_given_the_runner_s(monkeypatch):
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    n = torch.get_num_threads()
    assert attempt.child_env()["OMP_NUM_THREADS"] == str(n)
    assert ledger.device(Run("data/world", "data", {})).endswith(f", {n} thread{'s' * (n > 1)}")
