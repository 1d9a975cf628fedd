"""The reproduction runner owns its output folder: a second runner is refused naming the first; a
runner killed in the middle of a notebook takes the notebook down with it, and nothing it left
half-written is counted as done on the next run."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import SUBPROCESS_ENV, alive, toy_notebook
from mdc.base.lock import FolderInUseError, FolderLock
from reproduce import graph
from reproduce.running import runner
from reproduce.__main__ import main
from reproduce.graph import Run


SLOW = '''
import json, os, time
os.makedirs(output_dir, exist_ok=True)
with open(os.path.join(output_dir, f"started-{value}.txt"), "w") as f:
    f.write(str(os.getpid()))
with open(os.path.join(output_dir, "results.json"), "w") as f:
    f.write('{"schema": "mdc.results/1", "kind": "toy", "results": {"value": ')  # half-written while it works
time.sleep(sleep)
with open(os.path.join(output_dir, "calls.txt"), "a") as f:
    f.write("x")
json.dump({"schema": "mdc.results/1", "kind": "toy", "results": {"value": value}},
          open(os.path.join(output_dir, "results.json"), "w"))
'''

RUNNER = textwrap.dedent('''
    import json, sys
    from reproduce import graph
    from reproduce.running import runner
    from reproduce.graph import Run
    graph.NOTEBOOKS, out, value, sleep = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    outcome = runner.run_all([Run("a", "slow", {"output_dir": "{run:a}", "value": value, "sleep": sleep})], out,
                             log=lambda *a: None)
    print(json.dumps(outcome["a"]["status"]))
''')


@pytest.fixture
def notebooks(tmp_path, monkeypatch):
    folder = toy_notebook(tmp_path / "notebooks", "slow", 'output_dir = ""\nvalue = 0\nsleep = 0.0', SLOW)
    monkeypatch.setattr(graph, "NOTEBOOKS", folder)
    return folder


def _run(value, sleep=0.0):
    return [Run("a", "slow", {"output_dir": "{run:a}", "value": value, "sleep": sleep})]


def _spawn(notebooks, out, value, sleep):
    return subprocess.Popen([sys.executable, "-c", RUNNER, notebooks, str(out), str(value), str(sleep)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)


def test_a_runner_on_a_folder_in_use_is_refused(notebooks, tmp_path):
    out = tmp_path / "out"
    with FolderLock(str(out), ".reproduce.lock", "a reproduction runner"):
        with pytest.raises(FolderInUseError, match=f"in use by a reproduction runner \\(pid {os.getpid()}"):
            runner.run_all(_run(1), str(out), log=lambda *a: None)
    assert not (out / "a").exists()  # nothing ran


def test_two_runners_started_together(notebooks, tmp_path):
    out = tmp_path / "out"
    procs = [_spawn(notebooks, out, 1, 3.0) for _ in range(2)]
    done = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in done)
    assert codes[0] == 0 and codes[1] != 0, done
    loser = next(d for d in done if d[0] != 0)
    winner = procs[next(i for i, d in enumerate(done) if d[0] == 0)]
    assert f"is in use by a reproduction runner (pid {winner.pid}" in loser[2], loser[2][-2000:]
    assert (out / "a" / "calls.txt").read_text() == "x"  # the notebook ran once
    assert json.loads((out / "a" / "results.json").read_text())["results"]["value"] == 1


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see the notebook process end")
def test_a_killed_runner_takes_its_notebook_down_and_nothing_half_written_counts_as_done(notebooks, tmp_path):
    out = tmp_path / "out"
    assert runner.run_all(_run(1), str(out), log=lambda *a: None)["a"]["status"] == "ok"
    proc = _spawn(notebooks, out, 2, 30.0)  # parameters changed: the run executes again, slowly
    started = out / "a" / "started-2.txt"
    deadline = time.time() + 120
    while not (started.exists() and started.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    kernel = int(started.read_text())
    os.kill(proc.pid, signal.SIGKILL)  # the runner only, as a lost terminal or an OOM kill would
    proc.wait()
    deadline = time.time() + 15
    while alive(kernel) and time.time() < deadline:
        time.sleep(0.2)
    assert not alive(kernel), "the notebook outlived its runner and would keep writing into the run folder"
    # back to the first parameters: results.json is half-written by the killed attempt, so the run is not done
    again = runner.run_all(_run(1), str(out), log=lambda *a: None)
    assert again["a"]["status"] == "ok"
    assert json.loads((out / "a" / "results.json").read_text())["results"]["value"] == 1


@pytest.mark.parametrize("argv, line", [
    (["--seeds", "0"], "error: --seeds must be >= 1, got 0"),
    (["--jobs", "0"], "error: --jobs must be >= 1, got 0"),
    (["--nodes", "0"], "error: --nodes must be >= 1, got 0"),
    (["--gpus-per-node", "-1"], "error: --gpus-per-node must be >= 0, got -1"),
    (["--nodes", "2"], "error: --nodes needs --gpus-per-node or --slurm"),
    (["--run", "x", "--slurm", "s"], "error: --run executes one job here; --slurm writes job scripts instead"),
    (["--only", "table9"], "error: --only: unknown artifact 'table9'"),
    (["--jobs", "x"], "error: argument --jobs: invalid int value: 'x'"),
])
def test_runner_command_line_refuses_bad_values_in_one_line(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    monkeypatch.setattr(runner, "run_all", lambda *a, **k: pytest.fail("a bad value reached the runner"))
    with pytest.raises(SystemExit) as info:
        main(["--profile", "smoke", "--out", str(tmp_path / "runs")] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith(line), err
    assert not (tmp_path / "runs").exists()


def test_one_run_says_it_ran_that_run_not_the_whole_profile(tmp_path, capsys, monkeypatch):
    """``--run`` executes one job: its closing line names that run, and promises no tables or figures."""
    def one(runs, out, settings, **kwargs):
        return {r.name: {"status": "ok" if r.name in settings.only else "skipped"} for r in runs}
    monkeypatch.setattr(runner, "run_all", one)
    assert main(["--profile", "smoke", "--out", str(tmp_path / "runs"), "--run", "data/descriptive"]) == 0
    out = capsys.readouterr().out
    assert "data/descriptive complete" in out and "runs complete" not in out and "tables and figures" not in out, out
