"""benchmarks/gpu_runs.py on the CPU: the records it reads, the runs it times and ends, the commands it builds
(the mini run is the reference run's), and a failing step reported as its result."""
import json
import os
import sys
import time

import pytest

from benchmarks import gpu_runs
from conftest import alive
from mdc.train.cli import parse_args
from mdc.train.config import TrainConfig


def test_times_are_put_beside_the_committed_cpu_records():
    cpu = gpu_runs.record("pretrain/mdc-descriptive-s0")
    assert cpu["seconds"] > 0 and cpu["cpu_seconds"] > 0 and cpu["device"].startswith("cpu")
    here = gpu_runs.beside(cpu["seconds"] / 4, "pretrain/mdc-descriptive-s0")
    assert here["record"] == cpu and here["record_over_here"] == 4.0
    assert gpu_runs.beside(10, "pretrain/no-such-run") == {"seconds": 10, "record": None, "record_over_here": None}


def test_each_step_adds_its_figures_to_one_json_file(tmp_path):
    path = str(tmp_path / "runs.json")
    gpu_runs.update(path, "torchrun", {"ok": True})
    gpu_runs.update(path, "mini-train", {"ok": False})
    assert json.loads(open(path).read()) == {"torchrun": {"ok": True}, "mini-train": {"ok": False}}


def test_a_run_is_ended_by_its_budget_or_its_condition_with_its_children():
    sleeper = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
               "'import time; time.sleep(60)']); time.sleep(60)"]
    assert gpu_runs.run(sleeper, budget=1.0)["ended"] == "budget"
    ended = gpu_runs.run(sleeper, budget=30.0, until=lambda: True)
    assert ended["ended"] == "killed" and ended["seconds"] < 10 and ended["rc"] != 0
    exited = gpu_runs.run([sys.executable, "-c", "raise SystemExit(3)"], budget=30.0)
    assert exited["rc"] == 3 and exited["ended"] == "exited"


def test_checkpoints_and_metrics_of_a_run_folder(tmp_path):
    assert gpu_runs.latest_step(str(tmp_path)) == 0 and gpu_runs.metrics(str(tmp_path)) == []
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"step": 200, "path": "step_000200"}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0}\n')
    assert gpu_runs.latest_step(str(tmp_path)) == 200 and gpu_runs.metrics(str(tmp_path))[-1]["loss"] == 2.0


def _config(command: list[str], tmp_path) -> TrainConfig:
    """The resolved configuration of a ``... -m mdc.train ARGS`` command, on one empty shard."""
    argv = command[command.index("mdc.train") + 1:]
    data = argv[argv.index("--train-data") + 1]
    os.makedirs(data, exist_ok=True)
    open(os.path.join(data, "000000.tar"), "w").close()
    return TrainConfig(**parse_args(argv)).resolved(world_size=1)


def test_the_mini_run_is_the_reference_runs_recipe(tmp_path):
    c = _config(gpu_runs.mini_train_command(str(tmp_path)), tmp_path)
    params = json.loads(open(os.path.join(gpu_runs.RECORDS, "pretrain", "mdc-descriptive-s0.json")).read())["params"]
    for name in ("model", "objective", "steps", "batch_size", "lr", "weight_decay", "warmup_steps", "seed",
                 "save_every", "keep_last"):
        assert getattr(c, name) == params[name], name
    assert c.steps == gpu_runs.MINI_STEPS
    data = json.loads(open(os.path.join(gpu_runs.RECORDS, "data", "descriptive.json")).read())["params"]
    assert {k: data[k] for k in gpu_runs.MINI_DATA} == gpu_runs.MINI_DATA


def test_the_torchrun_command_runs_one_process_that_resumes(tmp_path):
    command = gpu_runs.torchrun_command(str(tmp_path))
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert command[command.index("--nproc_per_node") + 1] == "1"
    c = _config(command, tmp_path)
    assert c.resume and c.steps == gpu_runs.TORCHRUN_STEPS and c.steps % c.save_every == 0


def test_the_graphs_run_is_the_torchrun_run_replayed_as_cuda_graphs(tmp_path):
    eager = _config(gpu_runs.torchrun_command(str(tmp_path)), tmp_path)
    graphs = _config(gpu_runs.torchrun_command(str(tmp_path), "graphs-run", gpu_runs.GRAPHS), tmp_path)
    assert graphs.compile and graphs.compile_mode == "reduce-overhead" and not eager.compile
    assert graphs.output_dir == str(tmp_path / "graphs-run") and graphs.train_data == eager.train_data
    differ = {f for f in vars(eager) if getattr(eager, f) != getattr(graphs, f)}
    assert differ == {"compile", "compile_mode", "output_dir"}


def test_a_runs_speed_is_its_median_past_the_warm_up():
    rows = [{"step": i, "images_per_s": 10.0 if i < 3 else 1000.0 + i} for i in range(30)]
    assert gpu_runs.steady_speed(rows) == 1016.0  # the first tenth (compiling) left out
    assert gpu_runs.steady_speed([]) is None and gpu_runs.steady_speed([{"step": 1}]) is None


def _fake_legs(calls: list):
    """A stand-in for gpu_runs.run: the shards command writes one shard; a leg with a stop condition is killed at
    step 200 (its checkpoint), the next runs to the end; each writes its run folder's metrics (graphs at 3x eager's
    images/s) and checkpoint pointer."""
    def run(cmd, budget, until=None):
        calls.append(cmd)
        if "mdc.train" not in cmd:  # the shards
            out = cmd[cmd.index("--out") + 1]
            os.makedirs(out, exist_ok=True)
            open(os.path.join(out, "000000.tar"), "w").close()
            return {"rc": 0, "seconds": 1.0, "ended": "exited"}
        folder = cmd[cmd.index("--output-dir") + 1]
        os.makedirs(os.path.join(folder, "checkpoints"), exist_ok=True)
        last = 200 if until else gpu_runs.TORCHRUN_STEPS
        speed = 3000.0 if "--compile" in cmd else 1000.0
        with open(os.path.join(folder, "metrics.jsonl"), "a") as f:
            for step in range(gpu_runs.latest_step(folder) + 1, last + 1):
                f.write(json.dumps({"step": step, "loss": 5 - step / 100, "images_per_s": speed}) + "\n")
        with open(os.path.join(folder, "checkpoints", "latest.json"), "w") as f:
            json.dump({"step": last}, f)
        return {"rc": -9 if until else 0, "seconds": 1.0, "ended": "killed" if until else "exited"}
    return run


def test_the_graphs_step_reuses_the_eager_steps_shards_and_stands_beside_its_run(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_runs, "run", _fake_legs(calls))
    alone = gpu_runs.step_graphs(str(tmp_path / "alone"), 60)
    assert alone["ok"] and "eager" not in alone and alone["images_per_s"] == 3000.0
    assert "mdc.world.scenes" in calls[0]  # no shards yet: written
    calls.clear()
    work = tmp_path / "both"
    assert gpu_runs.step_torchrun(str(work), 60)["ok"]
    graphs = gpu_runs.step_graphs(str(work), 60)
    assert [c[c.index("-m") + 1] for c in calls].count("mdc.world.scenes") == 1  # the graphs step reused them
    assert graphs["ok"] and graphs["data"] == {"reused": str(work / "torchrun-data")}
    assert graphs["eager"] == {"images_per_s": 1000.0, "final_loss": 2.0, "graphs_over_eager": 3.0}
    assert graphs["final_loss"] == 2.0 and graphs["first_leg"]["checkpoint_step"] == 200


def test_loss_differences_split_at_the_resume():
    a = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}, {"step": 3, "loss": 1.0}, {"step": 4, "loss": 0.5}]
    b = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.7}, {"step": 3, "loss": 1.0}, {"step": 4, "loss": 0.9}]
    d = gpu_runs.loss_differences(a, b, split=2)
    assert d["before"] == {"steps": 2, "mean": pytest.approx(0.1), "max": pytest.approx(0.2), "equal": 1}
    assert d["after"] == {"steps": 2, "mean": pytest.approx(0.2), "max": pytest.approx(0.4), "equal": 1}
    assert gpu_runs.loss_differences(a, b, split=4)["after"] is None


def test_the_twins_step_puts_each_resumed_run_beside_an_uninterrupted_one(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_runs, "run", _fake_legs(calls))
    out = gpu_runs.step_twins(str(tmp_path), 60)
    assert out["ok"] and [c[c.index("-m") + 1] for c in calls].count("mdc.world.scenes") == 1  # shards once
    folders = [c[c.index("--output-dir") + 1] for c in calls if "mdc.train" in c]
    assert folders == [str(tmp_path / f) for f in ("twins-eager", "twins-eager", "twins-eager-whole", "twins-graphs",
                                                   "twins-graphs", "twins-graphs-whole")]
    assert ["--compile" in c for c in calls if "mdc.train" in c] == [False] * 3 + [True] * 3
    for name in ("eager", "graphs"):  # the fake writes one loss curve: equal step by step
        assert out[name]["resumed_at"] == 200 and out[name]["uninterrupted"]["rc"] == 0
        assert out[name]["differences"]["before"] == {"steps": 200, "mean": 0.0, "max": 0.0, "equal": 200}
        assert out[name]["differences"]["after"]["equal"] == gpu_runs.TORCHRUN_STEPS - 200


def test_a_failing_step_is_reported_as_its_result(tmp_path, monkeypatch, capsys):
    def broken(work, budget):
        raise RuntimeError("no shards")

    monkeypatch.setitem(gpu_runs.STEPS, "torchrun", broken)
    path = tmp_path / "runs.json"
    assert gpu_runs.main(["torchrun", "--work", str(tmp_path / "w"), "--json", str(path)]) == 1
    result = json.loads(path.read_text())["torchrun"]
    assert result["ok"] is False and result["error"] == "RuntimeError: no shards"
    assert "RuntimeError: no shards" in capsys.readouterr().err


def test_a_kill_ends_workers_that_left_the_process_group(tmp_path):
    """torchrun starts its workers in sessions of their own: the kill must reach them too."""
    marker = tmp_path / "worker.pid"
    code = ("import subprocess, sys, time; "
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            f"open({str(marker)!r}, 'w').write(str(w.pid)); time.sleep(60)")
    result = gpu_runs.run([sys.executable, "-c", code], budget=30, until=marker.exists)
    assert result["ended"] == "killed"
    worker = int(marker.read_text())
    deadline = time.monotonic() + 5  # a killed process may take a moment to be reaped
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker), f"worker {worker} outlived the kill"
