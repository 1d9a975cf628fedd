"""The training data of a run: each rank's endless batch stream (:class:`DataStream`), and what a
configuration reads from local shards before training (:func:`check_shards`, :func:`count_samples`,
:func:`vocab_from_captions`)."""
from __future__ import annotations

import json
import os
import tarfile
import time
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import webdataset as wds
from webdataset.tariterators import base_plus_ext

from mdc.data.accounting import LoadStats, SkipStats, StreamPosition
from mdc.data.pipeline import iterate_batches, make_loader
from mdc.data.stats import iter_captions
from mdc.base.errors import ConfigError
from mdc.tokenizer import TextStats, Tokenizer
from mdc.train.distributed import host_group


def check_shards(urls: str) -> None:
    """Refuse (:class:`~mdc.base.errors.ConfigError` naming ``train_data``) a shard pattern whose local shards
    do not all exist, naming the first missing one and how many of how many are missing.

    The pattern is expanded as the loader expands it (``::`` and braces, webdataset's ``expand_urls``);
    ``pipe:`` commands and URLs cannot be checked and pass. Checked before a run writes anything: the
    loader would otherwise only count each missing shard as skipped, and a run with no shard at all
    fails after its folder exists.
    """
    paths = wds.shardlists.expand_urls(urls)
    missing = [p for p in paths if not urlparse(p).scheme and p != "-" and not os.path.isfile(p)]
    if missing:
        raise ConfigError(f"train_data: {len(missing)} of {len(paths)} shards do not exist, the first: "
                          f"{missing[0]!r}", "train_data")


def vocab_from_captions(urls: str) -> list[int]:
    """The sorted BPE ids of every ``.txt`` caption in local shards (no image is read).

    Under this compact vocabulary no training caption has an unknown token: the ids come
    from the model tokenizer's own ``encode`` (so a caption's literal "<end_of_text>" counts
    as text, as in training). Used as the ``vocab`` model override by ``vocab_from_data``:
    the way to train ``tiny`` (whose default vocabulary is the synthetic world's) on real
    captions. Every process reads all captions once.
    """
    check_shards(urls)
    paths = wds.shardlists.expand_urls(urls)
    for url in paths:
        if not os.path.isfile(url):
            raise ValueError(f"vocab_from_data reads the captions of local shards; {url!r} is not a local file")
    bpe, ids = Tokenizer(), set()
    for text in iter_captions(paths):
        ids.update(bpe.encode(text.strip()))
    return sorted(ids)


def count_samples(urls: str) -> int:
    """Samples in local tar shards: the epoch size when none is given.

    A shard with img2dataset's ``NAME_stats.json`` beside ``NAME.tar`` counts its ``successes``
    (the samples img2dataset wrote) without opening the tar; any other counts the distinct member
    keys in its tar headers. Under DDP rank 0 counts and broadcasts the number (or its error).
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return _count_local(urls)
    result = [None]
    if dist.get_rank() == 0:
        try:
            result = [_count_local(urls)]
        except Exception as exn:  # every rank raises it, none waits for a number
            result = [exn]
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _count_local(urls: str) -> int:
    check_shards(urls)
    total = 0
    for url in wds.shardlists.expand_urls(urls):
        if not os.path.isfile(url):
            raise ValueError(f"cannot count the samples of {url!r} (not a local file): give samples_per_epoch")
        stats = os.path.splitext(url)[0] + "_stats.json"
        if os.path.isfile(stats):
            with open(stats) as f:
                total += int(json.load(f)["successes"])
            continue
        with tarfile.open(url) as tar:
            total += len({base_plus_ext(m.name)[0] for m in tar if m.isfile()})
    return total


class DataStream:
    """A rank's endless batch stream: pass after pass (data epochs) over the shards.

    ``state_dict()`` (epoch, loader position, skip and caption counts) restores the stream so that the
    next batch is exactly the one that would have come next. Loaders are created under
    ``fork_rng`` because a DataLoader iterator draws its base seed from the global torch
    RNG, which must stay a function of the training steps alone.

    Under DDP the ranks' splits of a pass may hold different numbers of batches; the ranks
    still change data epochs together: for every micro-batch they agree (one all_reduce,
    MIN) that each of them has one, and when any rank's pass has ended all of them start
    the next epoch, dropping what the others had left of that pass (as ``drop_last`` does).
    The epoch counter is therefore the same on all ranks, and no shard is read twice in an
    epoch. (A resampled stream never ends: no agreement is needed.)

    ``cfg`` is the run's resolved :class:`~mdc.train.config.TrainConfig`. The stream also counts the seconds the
    loop waits in :meth:`next` (:meth:`take_wait`) and its workers' work (``load``): :mod:`mdc.train.progress`.
    """

    def __init__(self, cfg, tokenizer, image_size: int, state: dict | None = None, world: int = 1,
                 device: torch.device = torch.device("cpu")):
        self.cfg, self.tokenizer, self.image_size = cfg, tokenizer, image_size
        self.world, self.device = world, device
        self._group = host_group() if world > 1 and not cfg.resampled else None  # the epoch agreement's collective
        self.epoch = state["epoch"] if state else 0
        self.stats = SkipStats(dict(state["skipped"])) if state else SkipStats()
        self.text = TextStats(**state["text"]) if state and "text" in state else TextStats()  # running totals
        self.load = LoadStats()  # the workers' work since the last read (mdc.train.progress)
        # seconds next() waited since the last take_wait(): within a pass, and for the first batch of a loader (a
        # pass's, or a resumed run's) while its workers start
        self.waited = self.started = 0.0
        self._open(state["position"] if state else None)
        self._fresh = state is None  # no batch taken from this pass yet

    def _open(self, position: dict | None) -> None:
        c = self.cfg
        loader = make_loader(c.train_data, self.tokenizer, self.image_size, c.batch_size, num_workers=c.workers,
                             train=True, seed=c.seed, epoch=self.epoch, resampled=c.resampled,
                             shuffle_buffer=c.shuffle_buffer, partial=False, resume=position,
                             trim_multiple=16 if c.compile else 1,  # compiled: a handful of caption lengths
                             uint8=True,  # a quarter of the bytes to copy; the loop normalises on the device
                             draft=c.draft_decode,
                             pin_memory=torch.cuda.is_available())
        self.position = StreamPosition.from_state_dict(position) if position else StreamPosition(c.workers)
        self._starting = True  # the next batch is this loader's first: its workers start (take_wait counts it apart)
        with torch.random.fork_rng(devices=[]):
            self._batches = iterate_batches(iter(loader), self.stats, self.position, self.text, self.load)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 pixels [B, 3, H, W], tokens [B, L]); all ranks start the next data epoch when one's pass ends."""
        while True:
            first, start = self._starting, time.perf_counter()
            batch = next(self._batches, None)
            waited = time.perf_counter() - start  # the loader's alone: the ranks' agreement below is rank skew
            if first:
                self.started += waited
            else:
                self.waited += waited
            have = self._all_have(batch is not None)
            self._starting = False
            if have:
                self._fresh = False
                return batch
            if self._fresh:
                raise RuntimeError(f"a full pass over {self.cfg.train_data!r} gave a process no batch of "
                                   f"{self.cfg.batch_size} good samples (this process skipped: "
                                   f"{self.stats.as_dict()}); each process x worker needs at least that many")
            self.epoch += 1
            self._open(None)
            self._fresh = True

    def take_wait(self) -> tuple[float, float]:
        """(seconds waited for batches within a pass, for the first batch of a loader just opened) since the last
        call."""
        out, self.waited, self.started = (self.waited, self.started), 0.0, 0.0
        return out

    def _all_have(self, have: bool) -> bool:
        """Does every rank have a batch? (MIN over ranks; the same answer on all of them.)"""
        if self.world == 1 or self.cfg.resampled:
            return have
        flag = torch.tensor([int(have)])  # on the host: no wait for the device's queued steps
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return bool(flag)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position.state_dict(), "skipped": self.stats.as_dict(),
                "text": self.text.as_dict()}
