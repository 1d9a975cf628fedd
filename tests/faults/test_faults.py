"""The fault suite (``make test-faults``): faults injected into real runs, and what survives them.

- SIGKILL of the trainer at random moments and inside checkpoint saves, many times, resuming after
  each: the final weights equal an uninterrupted run's, bit for bit;
- a full disk (ENOSPC) during a checkpoint save or a metrics line: the last good checkpoint stays;
- two trainings into one folder, two runners on one folder, a 2-rank run into a folder in use;
- SIGKILL of the reproduction runner in the middle of a notebook, then a re-run;
- SIGKILL of one of two gloo ranks, or SIGSTOP of one at random moments: the other exits with a clear
  error in bounded time;
- bad values on every command line: one line, exit status 2.

Training attempts are forked from a forkserver that has imported mdc.train (tests/faults/faultkit.py),
so a kill cycle takes about a second on 2 CPU cores. The suite writes what it did and saw into
docs/reliability.md (between its markers) when all of it runs: run it and commit that file.
``MDC_FAULT_KILLS`` sets the number of trainer kills (default 24), ``MDC_FAULT_HANGS`` the number of hung
ranks (default 10), ``MDC_FAULT_SEED`` the random moments (default 0), ``MDC_FAULT_DOC`` another file to write.
"""
import contextlib
import io
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from safetensors.torch import load_file

import faultkit
import mdc.data.convert
import mdc.train.cli
import mdc.world.scenes
import reproduce.__main__
from mdc.base import checkpoint
from mdc.base.lock import FolderLock
from reproduce import graph
from reproduce.running import folders, runner
from reproduce.graph import Run
from conftest import SUBPROCESS_ENV, TRAIN_MODEL, alive, latest_weights, same_weights, toy_notebook

pytestmark = pytest.mark.faults

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.environ.get("MDC_FAULT_DOC", os.path.join(ROOT, "docs", "reliability.md"))
BEGIN, END = "<!-- fault-suite:begin -->", "<!-- fault-suite:end -->"
KILLS = int(os.environ.get("MDC_FAULT_KILLS", "24"))
HANGS, HANG_TIMEOUT = int(os.environ.get("MDC_FAULT_HANGS", "10")), 4  # SIGSTOPs of a rank; MDC_DIST_TIMEOUT
RNG = random.Random(int(os.environ.get("MDC_FAULT_SEED", "0")))
STEPS, SAVE = 24, 3  # steps of a run; a checkpoint every SAVE steps (the last 2 kept)
MODEL = json.dumps(TRAIN_MODEL)
FAULTS: dict[str, list] = {}  # row key -> [fault, injected, outcome, mismatches]
INPUTS: list[list] = []  # [command, exit status, message]
ORDER = ["kill_random", "kill_save", "enospc_save", "enospc_metrics", "two_trainings", "lock_ddp", "gloo_kill",
         "gloo_hang", "runner_kill", "two_runners"]


# ----------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module", autouse=True)
def table(request):
    """Write the suite's tables into docs/reliability.md once every test of the module has run; a run of
    part of it (``-k``) leaves the file alone, as its tables would call the others "did not complete"."""
    selected = {item.originalname for item in request.session.items if item.module is sys.modules[__name__]}
    every = selected >= {name for name in globals() if name.startswith("test_")}
    start = time.perf_counter()
    yield
    if every:
        _write_doc(time.perf_counter() - start)


@pytest.fixture(scope="module")
def forkserver():
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["faultkit"])
    return ctx


def _argv(data, out, workers=0, objective="mdc", steps=STEPS):
    return ["--train-data", data, "--output-dir", str(out), "--model-overrides", MODEL, "--objective", objective,
            "--batch-size", "4", "--steps", str(steps), "--save-every", str(SAVE), "--keep-last", "2", "--workers",
            str(workers), "--shuffle-buffer", "8", "--lr", "1e-3", "--warmup-steps", "2", "--no-progress", "--resume"]


def _start(ctx, argv, log, fault=None):
    proc = ctx.Process(target=faultkit.attempt, args=(argv, str(log), fault))
    proc.start()
    return proc


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the attempt and its loader workers
    except ProcessLookupError:
        proc.kill()


def _finish(ctx, argv, log, fault=None, timeout=300):
    proc = _start(ctx, argv, log, fault)
    proc.join(timeout)
    if proc.exitcode is None:
        _kill(proc)
        proc.join()
    return proc.exitcode, open(log).read()


@pytest.fixture(scope="module")
def references(forkserver, scene_shards, tmp_path_factory):
    """Uninterrupted runs' weights, with 0 and 1 loader workers."""
    refs = {}
    for workers in (0, 1):
        out = tmp_path_factory.mktemp(f"reference{workers}")
        code, log = _finish(forkserver, _argv(scene_shards, out / "run", workers), out / "log.txt")
        assert code == 0, log[-3000:]
        refs[workers] = latest_weights(out / "run")
    return refs


def _check_consistent(run):
    """After any fault: latest.json, if any, names a complete checkpoint of the step it says."""
    pointer = os.path.join(run, "checkpoints", "latest.json")
    if not os.path.exists(pointer):
        return None
    latest = json.load(open(pointer))
    folder = checkpoint.latest(str(run))
    assert set(os.listdir(folder)) >= {"model.safetensors", "config.json", "trainer.pt", "train_config.json"}
    assert checkpoint.load_trainer_state(folder)["step"] == latest["step"]
    load_file(os.path.join(folder, "model.safetensors"))
    return latest["step"]


def _check_finished(run, reference) -> bool:
    """A completed run: its weights equal the reference; its log and checkpoints hold one copy of each step."""
    assert _check_consistent(run) == STEPS
    steps = [json.loads(line)["step"] for line in open(os.path.join(run, "metrics.jsonl"))]
    assert steps == list(range(1, STEPS + 1)), steps
    entries = sorted(os.listdir(os.path.join(run, "checkpoints")))
    assert entries == ["latest.json", f"step_{STEPS - SAVE:06d}", f"step_{STEPS:06d}"], entries  # keep_last=2
    assert not os.path.exists(os.path.join(run, ".train.lock"))
    return same_weights(latest_weights(run), reference)


def _plain(text: str, *folders) -> str:
    """A message without this machine's paths, pids and host name."""
    for i, folder in enumerate(folders):
        text = text.replace(str(folder), "RUN" if i == 0 else f"RUN{i}")
    text = re.sub(r"pid \d+", "pid PID", text.replace(socket.gethostname(), "HOST"))
    text = re.sub(r"\[127\.0\.0\.1\]:\d+", "[127.0.0.1]:PORT", text)
    return re.sub(r"since [\d-]+ [\d:]+", "since TIME", text)


def _last_line(log: str) -> str:
    lines = [line for line in log.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ----------------------------------------------------------------------------- trainer kills
def test_random_sigkills_of_training_resume_to_the_same_weights(forkserver, scene_shards, references, tmp_path):
    """KILLS SIGKILLs, half at random moments and half inside a checkpoint save (at its k-th write,
    fsync, rename or removal), resuming after each; every completed run is compared bitwise."""
    kills = {"random": 0, "save": 0}
    calls, runs, mismatches, lost = set(), 0, 0, []
    while sum(kills.values()) < KILLS or runs < 2:
        workers, run = runs % 2, tmp_path / f"run{runs}"
        budget = 0 if sum(kills.values()) >= KILLS else min(6, KILLS - sum(kills.values()))
        for attempt in range(budget + 1):
            log = tmp_path / f"run{runs}-{attempt}.txt"
            before = _check_consistent(run) or 0
            in_save = attempt < budget and attempt % 2 == 1
            fault = {"kind": "kill_in_save", "save": RNG.randint(1, 3), "call": RNG.randint(1, 12)} if in_save else None
            proc = _start(forkserver, _argv(scene_shards, run, workers), log, fault)
            if attempt < budget and not in_save:
                proc.join(RNG.uniform(0.05, 1.5))
                if proc.exitcode is None:
                    _kill(proc)
            proc.join(120)
            assert proc.exitcode in (0, -signal.SIGKILL), open(log).read()[-3000:]
            if proc.exitcode == 0:
                break
            kills["save" if in_save else "random"] += 1
            if in_save:
                calls.add(fault["call"])
            after = _check_consistent(run)  # a kill never leaves latest.json pointing at a partial checkpoint
            lost.append((after or 0) >= before)
        else:
            pytest.fail("a run did not finish after its kills")
        mismatches += not _check_finished(run, references[workers])
        runs += 1
    FAULTS["kill_random"] = ["SIGKILL of the trainer and its loader workers at a random moment (0.05-1.5 s into "
                             "an attempt), then `--resume`", f"{kills['random']} kills",
                             "latest.json always named a complete checkpoint; every resumed run ended on the "
                             "uninterrupted run's weights, bit for bit, with metrics.jsonl holding steps 1-24 once "
                             "each and no temporary folder or lock file left", None]
    FAULTS["kill_save"] = ["SIGKILL inside a checkpoint save, at the k-th of its writes, fsyncs, renames and "
                           f"removals (k drawn from 1-12; seen: {len(calls)} distinct k), then `--resume`",
                           f"{kills['save']} kills", "as above", None]
    summary = f"{mismatches} of {runs} runs ({sum(kills.values())} kills, 0 and 1 loader workers)"
    FAULTS["kill_random"][3] = FAULTS["kill_save"][3] = summary
    assert all(lost), "a kill moved latest.json backwards"
    assert mismatches == 0 and sum(kills.values()) >= KILLS


def test_full_disk_during_a_save_keeps_the_last_good_checkpoint(forkserver, scene_shards, references, tmp_path):
    outcomes = []
    for call in (1, 2):  # the weights' write, then the trainer state's
        run = tmp_path / f"run{call}"
        code, log = _finish(forkserver, _argv(scene_shards, run), tmp_path / f"log{call}.txt",
                            {"kind": "enospc_in_save", "save": 3, "call": call})
        line = _last_line(log)
        assert code == 1 and line.startswith("error: no space left on device while writing checkpoint") \
            and f"step_{3 * SAVE:06d}" in line and "Traceback" not in log, log[-3000:]
        assert _check_consistent(run) == 2 * SAVE  # the last good checkpoint
        assert not [n for n in os.listdir(run / "checkpoints") if ".tmp-" in n]
        assert not (run / ".train.lock").exists()
        code, log = _finish(forkserver, _argv(scene_shards, run), tmp_path / f"resume{call}.txt")
        assert code == 0, log[-3000:]
        outcomes.append(_check_finished(run, references[0]))
        message = _plain(line, run)
    FAULTS["enospc_save"] = ["full disk (ENOSPC) while writing the third checkpoint: its weights, or its trainer "
                             "state", "2", f"exit 1 with one line, `{message}`; latest.json still named step {2 * SAVE}, "
                             "complete, with no temporary folder left; `--resume` once space is back ended on "
                             "the uninterrupted run's weights", f"{outcomes.count(False)} of 2 runs"]
    assert all(outcomes)


def test_full_disk_while_logging_metrics(forkserver, scene_shards, references, tmp_path):
    run = tmp_path / "run"
    code, log = _finish(forkserver, _argv(scene_shards, run), tmp_path / "log.txt",
                        {"kind": "enospc_in_metrics", "line": 7})
    line = _last_line(log)
    assert code == 1 and "No space left on device" in line and "Traceback" not in log, log[-3000:]
    assert _check_consistent(run) == 2 * SAVE
    code, log = _finish(forkserver, _argv(scene_shards, run), tmp_path / "resume.txt")
    assert code == 0, log[-3000:]
    same = _check_finished(run, references[0])
    FAULTS["enospc_metrics"] = ["full disk while appending the 7th line of metrics.jsonl", "1",
                                f"exit 1 with one line, `{_plain(line, run)}`; `--resume` dropped the lines past "
                                "the checkpoint and ended on the uninterrupted run's weights", f"{int(not same)} of 1"]
    assert same


def test_two_trainings_into_one_folder(forkserver, scene_shards, tmp_path):
    run = tmp_path / "run"
    procs = {o: _start(forkserver, _argv(scene_shards, run, objective=o), tmp_path / f"{o}.txt")
             for o in ("mdc", "arc")}
    for proc in procs.values():
        proc.join(300)
    codes = {o: p.exitcode for o, p in procs.items()}
    assert sorted(codes.values()) == [0, 1], codes
    winner = next(o for o, c in codes.items() if c == 0)
    loser = next(o for o in codes if o != winner)
    line = _last_line(open(tmp_path / f"{loser}.txt").read())
    assert f"is in use by a training (pid {procs[winner].pid} on host {socket.gethostname()}" in line, line
    assert json.load(open(run / "train_config.json"))["objective"] == winner
    assert [json.loads(x)["step"] for x in open(run / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert sorted(os.listdir(run)) == ["checkpoints", "metrics.jsonl", "train_config.json"]
    FAULTS["two_trainings"] = ["an MDC and an ARC training started together into one `--output-dir`", "1",
                               f"one refused at once with exit 1, `{_plain(line, run)}`; the other completed and "
                               "the folder holds its run only (its train_config.json, 24 metrics lines, its "
                               "checkpoints)", "-"]


# ----------------------------------------------------------------------------- two gloo ranks
def _ranks(data, out, steps, extra_env=None, lock_env=None):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    procs = []
    for rank in (0, 1):
        env = SUBPROCESS_ENV | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} | (extra_env or {})
        cmd = [sys.executable, "-m", "mdc.train", *_argv(data, out, steps=steps)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    return procs


def _stderrs(procs) -> str:
    """The end of each rank's stderr, for a failed assertion (either rank may be the one that failed)."""
    return "\n".join(f"--- rank {r}:\n{p.communicate()[1][-3000:]}" for r, p in enumerate(procs))


def _wait_for_steps(run, n, procs, timeout=180):
    deadline = time.time() + timeout
    path = os.path.join(run, "metrics.jsonl")
    while time.time() < deadline and all(p.poll() is None for p in procs):
        if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
            return
        time.sleep(0.05)
    pytest.fail(f"the 2-rank run did not reach step {n}: {[p.poll() for p in procs]}")


def test_one_of_two_gloo_ranks_killed(scene_shards, tmp_path):
    steps = 12
    ref = _ranks(scene_shards, tmp_path / "ref", steps)
    assert [p.wait(300) for p in ref] == [0, 0], _stderrs(ref)
    procs = _ranks(scene_shards, tmp_path / "run", steps)
    _wait_for_steps(tmp_path / "run", 3, procs)
    os.killpg(procs[1].pid, signal.SIGKILL)
    start = time.monotonic()
    code = procs[0].wait(120)
    seconds = time.monotonic() - start
    err = procs[0].communicate()[1]
    procs[1].wait()
    line = _last_line(err)
    assert code == 1 and line.startswith("error: rank 0 of 2 lost contact with the other processes") \
        and "Traceback" not in err, err[-3000:]
    resumed = _ranks(scene_shards, tmp_path / "run", steps)
    assert [p.wait(300) for p in resumed] == [0, 0], _stderrs(resumed)
    same = same_weights(latest_weights(tmp_path / "ref"), latest_weights(tmp_path / "run"))
    FAULTS["gloo_kill"] = ["SIGKILL of one of two gloo ranks (processes started without torchrun's agent), "
                           "then both restarted with `--resume`", "1",
                           f"the other rank exited in {seconds:.1f} s with exit 1 and one line, "
                           f"`{_plain(line, tmp_path / 'run')}`; the resumed pair ended on an uninterrupted "
                           "2-rank run's weights, bit for bit", f"{int(not same)} of 1"]
    assert same and seconds < 60


def test_one_of_two_gloo_ranks_hung(scene_shards, tmp_path):
    """SIGSTOP of rank 1 at HANGS random moments of a run; rank 0 must say so and exit every time. A collective
    still pending with the silent peer when the process tears its process group down deadlocks that teardown
    (the pending work's gloo thread waits for the interpreter's lock, held by the thread that joins it): with a
    4 s timeout, about one stop in four did so before the command line learnt to end such a process at once."""
    seconds, lines, hung = [], [], 0
    for i in range(HANGS):
        run = tmp_path / f"run{i}"
        procs = _ranks(scene_shards, run, 200, extra_env={"MDC_DIST_TIMEOUT": str(HANG_TIMEOUT)})
        _wait_for_steps(run, 3, procs)
        time.sleep(RNG.uniform(0, 2))  # a random moment of a step: forward, backward, a checkpoint save
        os.kill(procs[1].pid, signal.SIGSTOP)  # alive but silent: no connection is reset
        start = time.monotonic()
        try:
            code = procs[0].wait(HANG_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        seconds.append(time.monotonic() - start)
        err = procs[0].communicate()[1]
        procs[1].wait()
        if code is None:
            hung += 1
            continue
        lines.append(_last_line(err))
        assert code == 1 and lines[-1].startswith("error: rank 0 of 2 lost contact with the other processes") \
            and "Traceback" not in err, err[-3000:]
    FAULTS["gloo_hang"] = ["SIGSTOP of one of two gloo ranks (hung, its connections open) at a random moment "
                           f"(0-2 s after step 3), with `MDC_DIST_TIMEOUT={HANG_TIMEOUT}`", str(HANGS),
                           f"the other rank exited within {max(seconds):.1f} s every time, with exit 1 and one line, "
                           f"e.g. `{_plain(lines[0], tmp_path / 'run0')}`" if lines else "never exited", "-"]
    assert hung == 0, f"rank 0 did not exit within {HANG_TIMEOUT + 30} s of its peer's stop, {hung} of {HANGS} times"


def test_a_two_rank_training_into_a_folder_in_use(scene_shards, tmp_path):
    with FolderLock(str(tmp_path / "run"), ".train.lock", "a training"):
        start = time.monotonic()
        procs = _ranks(scene_shards, tmp_path / "run", 4)
        codes = [p.wait(120) for p in procs]
        seconds = time.monotonic() - start
    errs = [_last_line(p.communicate()[1]) for p in procs]
    assert codes == [1, 1] and all(f"is in use by a training (pid {os.getpid()}" in e for e in errs), errs
    assert os.listdir(tmp_path / "run") == []  # nothing written, the lock file gone with its holder
    FAULTS["lock_ddp"] = ["a 2-rank (gloo) training into a folder another training holds", "1",
                          f"both ranks exited 1 within {seconds:.1f} s of their start, each with one line, "
                          f"`{_plain(errs[0], tmp_path / 'run')}`; nothing written", "-"]


# ----------------------------------------------------------------------------- the runner
SLOW = '''
import json, os, time
os.makedirs(output_dir, exist_ok=True)
with open(os.path.join(output_dir, f"kernel-{os.getpid()}.pid"), "w") as f:
    f.write(str(os.getpid()))
with open(os.path.join(output_dir, "results.json"), "w") as f:
    f.write('{"schema": "mdc.results/1", "kind": "toy", "results": {"value": ')  # half-written while it works
time.sleep(sleep)
json.dump({"schema": "mdc.results/1", "kind": "toy", "results": {"value": value}},
          open(os.path.join(output_dir, "results.json"), "w"))
'''

RUNNER = textwrap.dedent('''
    import json, sys
    from reproduce import graph
    from reproduce.running import runner
    from reproduce.graph import Run
    graph.NOTEBOOKS, out, value = sys.argv[1], sys.argv[2], int(sys.argv[3])
    runs = [Run(name, "slow", {"output_dir": "{run:%s}" % name, "value": value, "sleep": 1.5},
                deps=(("a",) if name == "b" else ())) for name in ("a", "b")]
    outcome = runner.run_all(runs, out, log=lambda *a: None)
    print(json.dumps({n: o["status"] for n, o in outcome.items()}))
''')


@pytest.fixture
def notebooks(tmp_path):
    return toy_notebook(tmp_path / "notebooks", "slow", 'output_dir = ""\nvalue = 0\nsleep = 0.0', SLOW)


def _runner(notebooks, out, value):
    return subprocess.Popen([sys.executable, "-c", RUNNER, notebooks, str(out), str(value)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)


def _kernels(out) -> list[int]:
    return [int(p.read_text()) for p in out.glob("*/kernel-*.pid") if p.read_text()]


def _results_value(out, name):
    try:
        return json.loads((out / name / "results.json").read_text())["results"]["value"]
    except (OSError, ValueError):
        return None


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see notebook kernels end")
def test_sigkill_of_the_runner_mid_notebook(notebooks, tmp_path, monkeypatch):
    """Kill the runner at random moments of a two-notebook graph (and once after the parameters changed),
    re-run each time: every notebook dies with its runner, the re-run completes, and no run whose results
    are half-written or belong to other parameters is counted as done."""
    out, kills, waits = tmp_path / "out", 0, []
    monkeypatch.setattr(graph, "NOTEBOOKS", notebooks)
    for value, kill in ((1, True), (1, True), (1, False), (2, True), (2, True), (1, False)):
        runs = [Run(n, "slow", {"output_dir": "{run:%s}" % n, "value": value, "sleep": 1.5},
                    deps=(("a",) if n == "b" else ())) for n in ("a", "b")]
        key = graph.keys(runs)
        proc = _runner(notebooks, out, value)
        if not kill:  # the re-run: it completes, with the results of these parameters
            assert proc.wait(300) == 0, proc.communicate()[1][-3000:]
            assert _results_value(out, "a") == _results_value(out, "b") == value
            continue
        started, deadline = set(_kernels(out)), time.time() + 120
        while set(_kernels(out)) == started and time.time() < deadline:
            time.sleep(0.05)
        assert set(_kernels(out)) != started, "no notebook started"
        time.sleep(RNG.uniform(0.0, 1.2))
        proc.kill()  # the runner only: SIGKILL
        proc.wait()
        kills += 1
        start = time.monotonic()
        while any(map(alive, _kernels(out))) and time.monotonic() - start < 30:
            time.sleep(0.1)
        waits.append(time.monotonic() - start)
        assert not any(map(alive, _kernels(out))), "a notebook outlived its runner"
        for r in runs:  # counted as done only with complete results of these parameters
            if folders.is_done(str(out), r, key[r.name]):
                assert _results_value(out, r.name) == value
    FAULTS["runner_kill"] = ["SIGKILL of the reproduction runner at a random moment of a notebook (a graph of two), "
                             "twice with the first parameters, twice after they changed, each pair followed by a "
                             "re-run with the first ones",
                             f"{kills}", f"every notebook process was gone within {max(waits):.1f} s of its "
                             "runner; every re-run completed, and only runs with complete results of the current "
                             "parameters were counted as done", "0"]


def test_two_runners_on_one_folder(notebooks, tmp_path):
    out = tmp_path / "out"
    procs = [_runner(notebooks, out, 1) for _ in range(2)]
    done = [(p.wait(300), *p.communicate()) for p in procs]
    assert sorted(c for c, _, _ in done)[0] == 0 and sorted(c for c, _, _ in done)[1] != 0, done
    loser = next(e for c, _, e in done if c != 0)
    winner = procs[next(i for i, (c, _, _) in enumerate(done) if c == 0)]
    assert f"is in use by a reproduction runner (pid {winner.pid}" in loser
    line = next(x for x in loser.splitlines() if "is in use by" in x)
    line = line[line.index("FolderInUseError: ") + len("FolderInUseError: "):] if "FolderInUseError: " in line else line
    FAULTS["two_runners"] = ["two runners started together on one output folder", "1",
                             f"one refused at once: `{_plain(line, out)}`; the other ran each notebook once", "-"]


# ----------------------------------------------------------------------------- bad input
BAD_INPUTS = [
    ("mdc.train", ["--batch-size", "0"]), ("mdc.train", ["--accum-steps", "0"]), ("mdc.train", ["--steps", "0"]),
    ("mdc.train", ["--steps", "-5"]), ("mdc.train", ["--epochs", "0"]), ("mdc.train", ["--lr", "0"]),
    ("mdc.train", ["--lr", "nan"]), ("mdc.train", ["--weight-decay", "-1"]), ("mdc.train", ["--warmup-steps", "-1"]),
    ("mdc.train", ["--warmup-steps", "10"]), ("mdc.train", ["--grad-clip-norm", "0"]),
    ("mdc.train", ["--workers", "-1"]), ("mdc.train", ["--shuffle-buffer", "0"]), ("mdc.train", ["--seed", "-1"]),
    ("mdc.train", ["--save-every", "0"]), ("mdc.train", ["--keep-last", "0"]), ("mdc.train", ["--global-batch", "0"]),
    ("mdc.train", ["--global-batch", "100"]), ("mdc.train", ["--mask-ratio", "0"]),
    ("mdc.train", ["--t-interval", "0.9", "0.1"]), ("mdc.train", ["--model", "vit-h-14"]),
    ("mdc.train", ["--model-overrides", '{"vision_width": 90}']),
    ("mdc.train", ["--model-overrides", '{"text_heads": 3}']), ("mdc.train", ["--model-overrides", "[1]"]),
    ("mdc.train", ["--model-overrides", '{"time_weighting": false}']), ("mdc.train", ["--force-resume"]),
    ("mdc.train", ["--objective", "clip", "--t-interval", "0.2", "0.8"]),
    ("mdc.train", ["--mask-ratio", "0.5", "--t-sampling", "stratified"]), ("mdc.train", ["--epochs", "2"]),
    ("mdc.train", ["--batch-size", "x"]), ("mdc.train", ["--train-data", "shards/{000000..000002}.tar"]),
    ("reproduce", ["--jobs", "0"]), ("reproduce", ["--seeds", "0"]), ("reproduce", ["--nodes", "2"]),
    ("reproduce", ["--only", "table9"]),
    ("mdc.world.scenes", ["--num", "0"]), ("mdc.world.scenes", ["--shard-size", "0"]),
    ("mdc.world.scenes", ["--workers", "0"]), ("mdc.data.convert", ["--shard-size", "0"]),
    ("mdc.data.convert", ["--image-size", "-1"]),
]


def test_bad_values_on_every_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv("MDC_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_all", lambda *a, **k: pytest.fail("a bad value reached the runner"))
    (tmp_path / "img").mkdir()
    base = {"mdc.train": ["--train-data", "x.tar", "--output-dir", "run", "--steps", "10"],
            "reproduce": ["--profile", "smoke", "--out", "runs"],
            "mdc.world.scenes": ["--out", "shards", "--style", "alt", "--num", "4"],
            "mdc.data.convert": ["--folder", "img", "--out", "shards"]}
    mains = {"mdc.train": mdc.train.cli.main, "reproduce": reproduce.__main__.main,
             "mdc.world.scenes": mdc.world.scenes.main, "mdc.data.convert": mdc.data.convert.main}
    for command, argv in BAD_INPUTS:
        args = base[command] + argv
        if command == "mdc.train" and argv == ["--epochs", "0"]:
            args = [a for a in args if a not in ("--steps", "10")]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
            mains[command](args)
        lines = err.getvalue().strip().splitlines()
        assert info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (command, argv, lines)
        INPUTS.append([f"python -m {command} ... {' '.join(argv)}", 2, lines[0]])
    assert os.listdir(tmp_path) == ["img"]  # nothing was written


# ----------------------------------------------------------------------------- the document
def _write_doc(seconds: float) -> None:
    rows = ["| fault injected | times | outcome | final-weight mismatches |", "|---|---|---|---|"]
    for key in ORDER:
        fault, times, outcome, mismatches = FAULTS.get(key, [key, "-", "**did not complete** (see the test log)", "-"])
        rows.append(f"| {fault} | {times} | {outcome} | {mismatches} |")
    rows += ["", "| bad input | exit status | what the command prints |", "|---|---|---|"]
    rows += [f"| `{command}` | {code} | `{message}` |" for command, code, message in INPUTS] or \
        ["| (not run) | - | - |"]
    kills = sum(int(FAULTS[k][1].split()[0]) for k in ("kill_random", "kill_save") if k in FAULTS)
    head = (f"Written by `make test-faults` (tests/faults/test_faults.py) in {seconds:.0f} s: {kills} trainer kills, "
            f"{len(INPUTS)} bad inputs.")
    text = open(DOC).read()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    with open(DOC, "w") as f:
        f.write(text[:start] + "\n" + head + "\n\n" + "\n".join(rows) + "\n" + text[end:])
