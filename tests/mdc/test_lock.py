"""One owner per folder: a training holds its run folder's lock for its whole life; a second process
is refused at once, naming the holder; a SIGKILL leaves no stale lock."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from mdc.base.lock import FolderInUseError, FolderLock
from mdc.train import train
from conftest import SUBPROCESS_ENV, TRAIN_MODEL, train_cli


def _args(data, out, **kw):
    return dict(train_data=data, output_dir=str(out), model_overrides=TRAIN_MODEL, batch_size=4, lr=1e-3, workers=0,
                shuffle_buffer=8, steps=2, save_every=1, progress=False) | kw


def test_the_lock_names_its_holder_and_goes_away_when_released(tmp_path):
    with FolderLock(str(tmp_path / "run"), ".x.lock", "a test") as lock:
        info = json.loads(open(lock.path).read())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["owner"] == "a test"
        with pytest.raises(FolderInUseError, match=rf"run is in use by a test \(pid {os.getpid()} on host "
                                                   rf"{socket.gethostname()}, since .*\): a folder has one owner"):
            FolderLock(str(tmp_path / "run"), ".x.lock").acquire()  # a second descriptor, even in this process
    assert os.listdir(tmp_path / "run") == []  # released: no lock file left
    FolderLock(str(tmp_path / "run"), ".x.lock").acquire().release()


def test_a_training_into_a_folder_in_use_is_refused_before_writing_anything(scene_shards, tmp_path, one_thread):
    run = tmp_path / "run"
    with FolderLock(str(run), ".train.lock", "a training"):
        before = sorted(os.listdir(run))
        with pytest.raises(FolderInUseError, match=rf"in use by a training \(pid {os.getpid()} on host "
                                                   rf"{socket.gethostname()}.*--output-dir"):
            train(**_args(scene_shards, run))
        assert sorted(os.listdir(run)) == before == [".train.lock"]
    results = train(**_args(scene_shards, run))  # free again: it trains, and leaves no lock file
    assert results["steps"] == 2 and ".train.lock" not in os.listdir(run)


def test_a_refusal_waits_for_the_holder_to_write_its_name(tmp_path):
    """The holder writes who it is just after its flock succeeds; a process refused in between must
    still name it (under load that window is long enough for "pid ? on host ?")."""
    import fcntl
    import threading

    lock = FolderLock(str(tmp_path / "run"), ".x.lock", "a test")
    os.makedirs(lock.folder)
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, nothing written yet
    info = {"pid": 4242, "host": "elsewhere", "since": "2026-01-01 00:00:00", "owner": "a training"}
    late = threading.Timer(0.3, lambda: os.pwrite(fd, json.dumps(info).encode(), 0))
    late.start()
    try:
        with pytest.raises(FolderInUseError, match=r"in use by a training \(pid 4242 on host elsewhere, since "):
            lock.acquire()
    finally:
        late.join()
        os.close(fd)


def test_two_trainings_started_together_into_one_folder(scene_shards, tmp_path):
    """An MDC and an ARC training, same --output-dir, started at once: exactly one refuses, naming the
    other's pid and host; the other completes and the folder holds its run only."""
    run, steps = tmp_path / "run", 40
    argv = {objective: train_cli(_args(scene_shards, run, objective=objective, steps=steps, save_every=10))
            for objective in ("mdc", "arc")}
    procs = {objective: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=SUBPROCESS_ENV) for objective, cmd in argv.items()}
    done = {objective: (p.wait(timeout=600), *p.communicate()) for objective, p in procs.items()}
    codes = sorted(code for code, _, _ in done.values())
    assert codes == [0, 1], {o: (c, e[-1500:]) for o, (c, _, e) in done.items()}
    winner = next(o for o, (c, _, _) in done.items() if c == 0)
    loser = next(o for o in done if o != winner)
    message = done[loser][2].strip().splitlines()
    assert len(message) == 1 and message[0].startswith(f"error: {run} is in use by a training "
                                                       f"(pid {procs[winner].pid} on host {socket.gethostname()}")
    assert json.loads((run / "train_config.json").read_text())["objective"] == winner
    assert [json.loads(line)["step"] for line in open(run / "metrics.jsonl")] == list(range(1, steps + 1))
    saved = sorted(os.listdir(run / "checkpoints"))
    assert saved == ["latest.json"] + [f"step_{s:06d}" for s in range(10, steps + 1, 10)]
    for name in saved[1:]:
        assert json.loads((run / "checkpoints" / name / "train_config.json").read_text())["objective"] == winner
    assert sorted(os.listdir(run)) == ["checkpoints", "metrics.jsonl", "train_config.json"]


HOLDER = textwrap.dedent('''
    import os, sys, time
    from mdc.base.lock import FolderLock
    lock = FolderLock(sys.argv[1], ".train.lock", "a training").acquire()
    if os.fork() == 0:  # a worker the holder forked (as a DataLoader does); it outlives the holder a while
        time.sleep(60)
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
''')


def test_sigkill_leaves_no_stale_lock_even_while_forked_workers_live(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True,
                            env=SUBPROCESS_ENV, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError, match=f"pid {proc.pid}"):
            FolderLock(str(tmp_path / "run"), ".train.lock").acquire()
        os.kill(proc.pid, signal.SIGKILL)  # the holder only: its forked worker lives on
        proc.wait()
        start = time.monotonic()
        FolderLock(str(tmp_path / "run"), ".train.lock").acquire().release()  # free at once
        assert time.monotonic() - start < 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker
