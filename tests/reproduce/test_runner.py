"""The reproduction runner: skips completed runs, reruns what a changed parameter touches, survives failures,
and writes cluster scripts; the registry names every artifact."""
import csv
import json
import os
import shutil
import time

import nbformat
import pytest

from conftest import alive, toy_calls, toy_notebook
from reproduce import graph, paper_profile, registry
from reproduce.running import attempt, cluster, folders, runner
from reproduce.__main__ import main
from reproduce.graph import Run

TOY = '''
import json, os, time
os.makedirs(output_dir, exist_ok=True)
mine = os.path.join(output_dir, "value.txt")  # like the trainer, a run refuses a folder holding another run
if os.path.exists(mine) and open(mine).read() != str(value):
    raise RuntimeError(f"{output_dir} belongs to a different run")
open(mine, "w").write(str(value))
if fail:
    raise RuntimeError("this run fails on purpose")
time.sleep(sleep)
with open(os.path.join(output_dir, "calls.txt"), "a") as f:
    f.write("x")
json.dump({"schema": "mdc.results/1", "kind": "toy", "results": {"value": value}},
          open(os.path.join(output_dir, "results.json"), "w"))
'''
PARAMETERS = 'output_dir = ""\nvalue = 0\nfail = False\nsleep = 0.0'  # the toy notebook's parameters cell


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy notebook in place of notebooks/; returns the output folder, not made yet."""
    monkeypatch.setattr(graph, "NOTEBOOKS", toy_notebook(tmp_path / "notebooks", "toy", PARAMETERS, TOY))
    return tmp_path / "out"


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """``_runs()`` executed once, shared by the tests that start from a finished output folder (each run is a
    notebook kernel: seconds): (out, outcome). Read it only; :func:`executed` gives a test its own copy."""
    base = tmp_path_factory.mktemp("first-run")
    with pytest.MonkeyPatch.context() as mp:  # the same notebook as toy's, so the same keys
        mp.setattr(graph, "NOTEBOOKS", toy_notebook(base / "notebooks", "toy", PARAMETERS, TOY))
        outcome = runner.run_all(_runs(), str(base / "out"), log=lambda *a: None)
    return base / "out", outcome


@pytest.fixture
def executed(toy, first_run):
    """A copy of :func:`first_run`'s output folder where :func:`toy` puts it: ``_runs()`` done there."""
    shutil.copytree(first_run[0], toy)
    return toy


def _runs(a=1, b=2, fail_b=False):
    return [Run("a", "toy", {"output_dir": "{run:a}", "value": a}),
            Run("b", "toy", {"output_dir": "{run:b}", "value": b, "fail": fail_b}, deps=("a",)),
            Run("c", "toy", {"output_dir": "{run:c}", "value": 3}, deps=("b",)),
            Run("d", "toy", {"output_dir": "{run:d}", "value": 4})]


def test_completed_runs_are_skipped_and_a_change_reruns_its_dependents(executed, first_run):
    out = executed
    assert {o["status"] for o in first_run[1].values()} == {"ok"}
    again = runner.run_all(_runs(), str(out), log=lambda *a: None)
    assert {o["status"] for o in again.values()} == {"skipped"}
    key = graph.keys(_runs())
    changed = runner.run_all(_runs(b=5), str(out), log=lambda *a: None)  # b changed: b and c rerun, a and d do not
    assert [changed[n]["status"] for n in "abcd"] == ["skipped", "ok", "ok", "skipped"]
    assert [toy_calls(out, n) for n in "abcd"] == [1, 1, 1, 1]  # b and c ran afresh in their folders...
    for n in "bc":  # ...and what the earlier runs left is kept beside them, named by its key
        assert toy_calls(out, f"{n}.superseded-{key[n]}") == 1
    rows = {r["name"]: r for r in csv.DictReader(open(out / "runs.csv"))}
    assert rows["a"]["status"] == "skipped" and float(rows["a"]["seconds"]) > 0  # measured figures kept
    assert float(rows["b"]["peak_mb"]) > 10  # the notebook kernel's memory is counted
    params = json.load(open(out / "b" / "parameters.json"))
    assert params["output_dir"] == str(out / "b") and (out / "b" / "toy.ipynb").is_file()


def test_a_cluster_job_keeps_its_lock_when_it_sets_an_old_run_aside(executed, monkeypatch):
    """``--run`` (one SLURM job) locks the run's own folder: moving the old run aside keeps the lock in place."""
    out = executed
    held, run_attempt = [], attempt.run_attempt

    def spy(out_, run, key, torchrun=None, science=None):
        held.append(os.path.isfile(os.path.join(out_, run.name, folders.RUNNER_LOCK)))
        return run_attempt(out_, run, key, torchrun, science)

    monkeypatch.setattr(attempt, "run_attempt", spy)
    only_b = runner.RunSettings(only={"b"})
    assert runner.run_all(_runs(b=5), str(out), only_b, log=lambda *a: None)["b"]["status"] == "ok"
    assert held == [True] and toy_calls(out, "b") == 1
    old = out / f"b.superseded-{graph.keys(_runs())['b']}"
    assert toy_calls(out, old.name) == 1 and not (old / folders.RUNNER_LOCK).exists()


def test_a_run_stopped_half_way_continues_in_its_folder(executed):
    out = executed
    os.remove(out / "b" / "done.json")  # killed before it finished: same parameters, not done
    (out / "b" / "checkpoint.txt").write_text("step 3")
    again = runner.run_all(_runs(), str(out), log=lambda *a: None)
    assert again["b"]["status"] == "ok" and toy_calls(out, "b") == 2
    assert (out / "b" / "checkpoint.txt").read_text() == "step 3"  # the notebook resumes from what it left
    assert not [p for p in os.listdir(out) if ".superseded-" in p]


def test_bookkeeping_parameters_leave_the_key_alone():
    """Checkpoint cadence and resumption do not change what a pretraining run trains (RESUME_FREE)."""
    def run(**extra):
        return [Run("p", "pretrain", {"output_dir": "{run:p}", "steps": 8, **extra})]
    assert graph.keys(run(save_every=2, keep_last=1)) == graph.keys(run(save_every=8, resume=False))
    assert graph.keys(run(steps=9)) != graph.keys(run())


def test_a_table2_part_carries_only_the_sizes_it_reads(monkeypatch):
    """A new size of the in-distribution suites re-keys the own parts alone, and a new order size the order
    parts alone: the pair parts' records (and the other part's) stay valid."""
    mini = registry.PROFILES["mini"]

    def table2_keys(**sizes):
        monkeypatch.setitem(registry.PROFILES, "mini",
                            {**mini, "compositionality": {**mini["compositionality"], **sizes}})
        runs = registry.build("mini", 1)
        return {k: v for k, v in graph.keys(runs).items() if k.startswith("compositionality/")}

    sizes = mini["compositionality"]
    before = table2_keys()
    own, order = table2_keys(own_items=sizes["own_items"] + 1), table2_keys(order_images=sizes["order_images"] + 1)
    assert len(before) == 9
    for name, key in before.items():
        assert (own[name] != key) == name.endswith("-own-s0"), name
        assert (order[name] != key) == name.endswith("-order-s0"), name


def test_a_notebook_saved_with_outputs_keeps_its_runs(toy):
    """Opening a notebook in Jupyter, running it and saving it (outputs, counts, metadata, a markdown note)
    does not change what its runs compute; a change to its code does."""
    before = graph.keys(_runs())
    path = os.path.join(graph.NOTEBOOKS, "toy.ipynb")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].execution_count = 7
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell("A note written while exploring."))
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.9"}
    nbformat.write(nb, path)
    assert graph.keys(_runs()) == before
    nb.cells[2].source += "\nprint('one more line')"
    nbformat.write(nb, path)
    assert graph.keys(_runs())["a"] != before["a"]


@pytest.mark.usefixtures("instant_runs")
def test_a_ready_evaluation_goes_before_the_next_pretraining_run(toy):
    runs = [Run("pre0", "toy", {"output_dir": "{run:pre0}"}), Run("pre1", "toy", {"output_dir": "{run:pre1}"}),
            Run("pre2", "toy", {"output_dir": "{run:pre2}"}),
            Run("probe0", "toy", {"output_dir": "{run:probe0}"}, deps=("pre0",)),
            Run("probe1", "toy", {"output_dir": "{run:probe1}"}, deps=("pre1",))]
    lines = []
    runner.run_all(runs[1:2], str(toy), log=lambda *a: None)  # pre1 completed by an earlier runner
    runner.run_all(runs, str(toy), log=lines.append)
    started = [line.split()[-1] for line in lines if " running " in line]
    assert started == ["probe1", "pre0", "probe0", "pre2"]


@pytest.mark.usefixtures("instant_runs")
def test_a_priority_handed_to_the_runner_orders_its_ready_runs(toy):
    """A study's part hands the runner the order its time budget was computed with (the longest chain first)."""
    runs = [Run(n, "toy", {"output_dir": f"{{run:{n}}}"}) for n in ("a", "b", "c")]
    runs.append(Run("d", "toy", {"output_dir": "{run:d}"}, deps=("c",)))
    lines = []
    runner.run_all(runs, str(toy), runner.RunSettings(priority={"c": 0, "d": 1, "b": 2, "a": 3}), log=lines.append)
    assert [line.split()[-1] for line in lines if " running " in line] == ["c", "d", "b", "a"]


def test_a_failed_run_is_reported_and_the_rest_complete(toy):
    outcome = runner.run_all(_runs(fail_b=True), str(toy), log=lambda *a: None)
    assert outcome["b"]["status"] == "failed" and "on purpose" in outcome["b"]["error"]
    assert outcome["c"]["status"] == "blocked" and "b" in outcome["c"]["error"]
    assert outcome["a"]["status"] == outcome["d"]["status"] == "ok"


def test_a_run_past_its_timeout_is_killed(toy):
    outcome = runner.run_all([Run("slow", "toy", {"output_dir": "{run:slow}", "sleep": 60.0}, timeout_s=8)],
                             str(toy), log=lambda *a: None)
    assert outcome["slow"]["status"] == "timeout" and outcome["slow"]["seconds"] < 30


def test_registry_lists_every_artifact_and_every_run_is_wired(capsys):
    assert main(["--list", "--profile", "smoke"]) == 0
    listed = capsys.readouterr().out
    paper = {"table1", "table2", "table3", "table4", "table5", "tables6-8", "fig3", "fig4", "fig5", "fig6"}
    assert all(name in listed for name in registry.ARTIFACTS)
    assert set(registry.ARTIFACTS) == paper | {"guidance", "claims"}
    for profile in ("smoke", "paper"):
        runs = registry.with_figures(registry.build(profile, seeds=2), "figs", profile, "records")
        graph.order(runs)  # every dependency exists, no cycle
        fed = {a for r in runs if r.notebook != "figures" for a in r.artifacts}
        synthetic_only = {"guidance", "claims"} if profile == "paper" else set()
        assert fed | {"tables6-8"} == set(registry.ARTIFACTS) - synthetic_only, profile
        assert all(os.path.isfile(graph.code_file(r.notebook)) for r in runs)
    only = registry.select(registry.with_figures(registry.build("smoke"), "figs", "smoke", "records"), ["table2"])
    assert {r.notebook for r in only} == {"data", "pretrain", "compositionality", "figures"}


def test_the_figures_run_builds_from_the_records_what_from_records_builds(tmp_path):
    """The runner's last run builds the artifacts itself (no notebook imports the reproduction): the files
    ``python -m reproduce --from-records`` writes from the same records, and its results name them."""
    from reproduce.running import ledger

    records = os.path.join(graph.ROOT, "reproduce", "records", "mini")
    runs = registry.select(registry.with_figures([], str(tmp_path / "figs"), "mini", records), ["table4"])
    assert [(r.name, r.notebook) for r in runs] == [("figures", "figures")]
    outcome = runner.run_all(runs, str(tmp_path / "out"), log=lambda *a: None)
    assert outcome["figures"]["status"] == "ok", outcome
    direct = registry.build_from_records(ledger.read_all(records), str(tmp_path / "direct"), only=["table4"])
    names = sorted(os.path.basename(path) for path in direct["table4"])
    assert sorted(os.listdir(tmp_path / "figs")) == names
    for path in direct["table4"]:
        assert (tmp_path / "figs" / os.path.basename(path)).read_bytes() == open(path, "rb").read()
    results = json.loads((tmp_path / "out" / "figures" / "results.json").read_text())
    assert results["kind"] == "figures" and results["parameters"]["only"] == ["table4"]
    assert sorted(os.path.basename(f) for f in results["results"]["files"]["table4"]) == names
    assert "Table 4" in (tmp_path / "out" / "figures" / "log.txt").read_text()  # the tables, printed


def test_slurm_scripts_chain_dependencies(tmp_path):
    runs = registry.build("paper", seeds=1)
    submit = cluster.slurm_scripts(runs, str(tmp_path / "runs" / "paper"), str(tmp_path / "slurm"), "paper", gpus=8)
    text = open(submit).read()
    names = [r.name for r in graph.order(runs)]
    probe = names.index("probe/vit-b-32-mdc-alt-s0")
    pre = names.index("pretrain/vit-b-32-mdc-alt-s0")
    assert f"job{probe}=$(sbatch --parsable --dependency=afterok:$job{pre} " in text
    script = next(p for p in os.listdir(tmp_path / "slurm") if p.startswith(f"{pre:03d}-"))
    body = open(tmp_path / "slurm" / script).read()
    assert "#SBATCH --gres=gpu:8" in body and "--run pretrain/vit-b-32-mdc-alt-s0" in body
    # each GPU's loader workers and its training process get a core: the graphed step's measured need, 11 workers
    # a GPU from 256-px shards (docs/benchmarks.md), where 8 workers starved it
    assert {r.params["workers"] for r in runs if r.notebook == "pretrain"} == {paper_profile.WORKERS["graphs"]} == {11}
    assert "#SBATCH --cpus-per-task=96" in body
    eager = registry.build("paper", seeds=1, step="eager")
    assert {r.params["workers"] for r in eager if r.notebook == "pretrain"} == {4}
    run = next(r for r in runs if r.name == "pretrain/vit-b-32-mdc-alt-s0")
    cmd = cluster.torchrun_command(run, str(tmp_path), gpus=8, nodes=2)
    assert cmd.startswith(f"{cluster.torchrun()} --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d")
    assert "-m mdc.train --resume" in cmd and "--preset vit-b-32" in cmd and "--objective mdc" in cmd


SPAWNER = '''
import os, subprocess, sys, time
os.makedirs(output_dir, exist_ok=True)
# as torchrun starts its workers: in a session of their own, out of the notebook's process group
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open(os.path.join(output_dir, "worker.pid"), "w").write(str(worker.pid))
time.sleep(300)
'''


def test_a_timeout_ends_what_the_run_started_in_sessions_of_its_own(toy):
    """A run past its timeout leaves nothing running: torchrun's workers (own sessions) went on training
    after their launcher's group was killed, on the first GPU run."""
    toy_notebook(graph.NOTEBOOKS, "spawner", 'output_dir = ""', SPAWNER)
    outcome = runner.run_all([Run("spawn", "spawner", {"output_dir": "{run:spawn}"}, timeout_s=20)], str(toy),
                             log=lambda *a: None)
    assert outcome["spawn"]["status"] == "timeout"
    worker = int((toy / "spawn" / "worker.pid").read_text())
    deadline = time.monotonic() + 5  # a killed process may take a moment to be reaped
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker), f"the run's worker {worker} outlived its timeout"
