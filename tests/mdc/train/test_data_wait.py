"""A run says when it waits on its data: the share of each interval its loop waited for batches and the loader's
own images/s in metrics.jsonl, and one warning naming --workers and the images' stored size past 10%."""
import itertools
import json
import logging
import time

import pytest

from mdc.data.transforms import ImageTransform
from mdc.data.writer import write_tar
from mdc.train import loop, progress, train
from conftest import TRAIN_MODEL, png

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    members = []
    for i in range(96):  # 12 batches of 8: the runs' 8 steps read one pass
        members += [(f"{i:04d}.png", png((5 * i % 256, 90, 160), (40, 30))), (f"{i:04d}.txt", b"a red circle")]
    return write_tar(str(tmp_path_factory.mktemp("wait") / "000000.tar"), members)


def run(shard, out, caplog, workers, **kw):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mdc.train"):
        results = train(**dict(train_data=shard, output_dir=str(out), model_overrides=TRAIN_MODEL, batch_size=8,
                               steps=8, log_every=2, workers=workers, shuffle_buffer=8, lr=1e-3) | kw)
    rows = [json.loads(line) for line in open(results["metrics"])]
    warned = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    return results, rows, warned


def test_a_slow_loader_is_named_in_the_log_and_the_metrics(shard, tmp_path, caplog, monkeypatch):
    decode = ImageTransform.__call__

    def slow(self, image, rng=None):  # 40 ms an image: at most 25 images/s from the one worker
        time.sleep(0.04)
        return decode(self, image, rng)

    monkeypatch.setattr(ImageTransform, "__call__", slow)  # the worker is forked: it decodes slowly too
    results, rows, warned = run(shard, tmp_path / "slow", caplog, workers=1)
    assert all(r["data_wait"] > progress.DATA_WAIT_WARN for r in rows) and results["data_wait"] > 0.5
    assert all(0 < r["loader_images_per_s"] < 25 for r in rows)  # the worker's own rate, beside the steps'
    assert len(warned) == 1 and "--workers 1" in warned[0] and "40 px on their longer side" in warned[0]
    assert "mdc.data.convert --image-size 256" in warned[0]


def slow_steps(monkeypatch, seconds=0.25):
    """Each step takes ``seconds`` more: a worker keeps a batch of 8 tiny PNGs ready."""
    step = loop.accumulate

    def slow_step(*args, **kw):
        time.sleep(seconds)
        return step(*args, **kw)

    monkeypatch.setattr(loop, "accumulate", slow_step)


def test_a_fed_run_waits_little_and_says_nothing(shard, tmp_path, caplog, monkeypatch):
    slow_steps(monkeypatch)
    results, rows, warned = run(shard, tmp_path / "fed", caplog, workers=1)
    assert all(r["data_wait"] < progress.DATA_WAIT_WARN for r in rows) and not warned, rows
    assert all(r["loader_images_per_s"] > r["images_per_s"] for r in rows), rows
    assert all(r["data_start_s"] >= 0 for r in rows) and rows[0]["data_start_s"] > 0  # the workers' start, apart


def test_a_resumed_run_counts_its_workers_start_apart(shard, tmp_path, caplog, monkeypatch):
    """A resumed loader starts its workers as a new pass does: that first wait is data_start_s, not data_wait. A
    worker's first batch takes 0.4 s, the rest no time at all: no margin between two timings that load could close
    (a worker 25 ms an image, 200 ms a batch, ran close behind the 250 ms steps)."""
    decode, images = ImageTransform.__call__, itertools.count()  # each worker counts from the parent's 0

    def slow_to_start(self, image, rng=None):
        if next(images) < 8:
            time.sleep(0.05)
        return decode(self, image, rng)

    monkeypatch.setattr(ImageTransform, "__call__", slow_to_start)
    slow_steps(monkeypatch)
    run(shard, tmp_path / "run", caplog, workers=1, steps=4, save_every=2)
    _, rows, warned = run(shard, tmp_path / "run", caplog, workers=1, steps=8, save_every=2, resume=True,
                          force_resume=True)  # longer than the run resumed
    resumed = [r for r in rows if r["step"] > 4]
    assert resumed[0]["data_start_s"] > 0.1 and all(r["data_wait"] < progress.DATA_WAIT_WARN for r in resumed)
    assert not warned, resumed


def test_the_data_wait_is_the_loaders_alone_not_the_ranks_agreement(monkeypatch):
    """The ranks agree that each has a batch (an all-reduce); time another rank makes this one wait there is rank
    skew, not data wait. A clock that moves one second a reading, and ten in the agreement, tells them apart
    whatever the machine's load."""
    from mdc.train import stream

    now = [0.0]

    def tick():
        now[0] += 1.0
        return now[0]

    def agree(have):  # another rank 10 s behind
        now[0] += 10.0
        return have

    monkeypatch.setattr(stream.time, "perf_counter", tick)
    data = object.__new__(stream.DataStream)
    data._starting, data._fresh, data.waited, data.started = False, False, 0.0, 0.0
    data._batches, data._all_have = iter([("pixels", "tokens")]), agree
    assert data.next() == ("pixels", "tokens") and data.take_wait() == (1.0, 0.0)
