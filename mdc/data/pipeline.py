"""Image-caption training data: webdataset shards -> (images, tokens) batches.

Shards use img2dataset's layout: tar members ``KEY.jpg|jpeg|png|webp`` + ``KEY.txt``
(optional ``KEY.json``, ignored). An image may also be a ``KEY.npy`` member: a uint8 [H, W, 3]
array in NumPy's format (``python -m mdc.world.scenes --format npy``), read without decoding.
``urls`` is a brace pattern (``DIR/{000000..000009}.tar``, several joined with ``::``), a list
of paths, or ``pipe:`` commands.

Stream, per (node, DataLoader worker)::

    shard list (shuffled by (seed, epoch) when training, the same order on every rank; or seeded resampling)
      -> split by node -> split by worker -> tar members -> samples (grouped per shard)
      -> seeded shuffle buffer -> validate + decode (PIL) -> transform -> tokenize -> batch (``trim_multiple``:
      the tokens cut to the batch's longest caption on the host, so the training step reads no length)

Splitting. With at least world_size x num_workers shards, each (rank, worker) slot reads
its own shards (shard i goes to rank i mod world_size, then round-robin to its workers).
With fewer shards, some slots would get nothing (and under DDP, a rank with no data cannot
follow the others), so the split falls back to samples: every slot reads all shards in the
same seeded order and keeps the samples whose index in that stream, modulo
world_size x num_workers, equals its slot number ``rank * num_workers + worker``, before
shuffling. Each sample then belongs to exactly one slot: none is seen twice in a pass and
none is lost, at the cost of every slot reading (not decoding) every shard. Shard-level
errors are then counted and logged by slot 0 only.

Bad input never crashes the stream: it is skipped, logged (logger ``mdc.data.pipeline``, naming the shard URL
and sample key) and counted in a :class:`SkipStats` under one of ``SKIP_REASONS``. Loader batches are
``(images, tokens, meta)`` (images float32, or uint8 pixels with ``uint8``) with ``meta = {"worker", "position",
"last", "skipped", "keys", "text", "images", "seconds", "source_px"}`` (``keys``: the batch's sample keys, in row
order): ``skipped`` holds the counts incurred while that batch was assembled, ``text`` the
:class:`~mdc.tokenizer.TextStats` of its captions (tokens, unknown tokens under a compact vocabulary, truncated
captions) and the last three the worker's work on it (:class:`~mdc.data.accounting.LoadStats`), so counts made in
worker processes reach the main process with the data. :func:`iterate_batches` folds them into one
:class:`SkipStats` (a ``TextStats``, a ``LoadStats``) and yields plain ``(images, tokens)``.

Exact resume. All randomness (shard order, shuffle buffer, crops) is a function of
(seed, epoch, rank, worker, sample index), so a worker's stream is fixed. ``position``
is the number of post-shuffle samples that worker has consumed; :class:`StreamPosition`
tracks it per worker plus the worker due next in the DataLoader's round-robin. Saving
``position.state_dict()`` and passing it back as ``make_loader(..., resume=state)`` replays
the same batch sequence from the next batch on, and skip counts are not reported twice.
Local uncompressed shards are not read again: :mod:`mdc.data.shards` replays the shuffle
buffer on sample ids from the tar headers and seeks to the samples still buffered; other
sources replay the stream, dropping consumed samples before decoding. Resume needs the same urls, seed, epoch,
num_workers and world size; under DDP each rank saves its own state.
"""
from __future__ import annotations

import io
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset
from webdataset.utils import make_seed, pytorch_worker_info

from mdc.base.options import with_options
from mdc.data.accounting import SKIP_REASONS, LoadStats, SkipStats, StreamPosition, Uncounted  # noqa: F401 (re-exported)
from mdc.data.shards import fast_forward, open_at, shard_samples, shuffled
from mdc.data.transforms import CorruptImageError, ImageTransform, image_transform
from mdc.tokenizer import TextStats, trim_padding

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "npy")
MAX_CAPTION_CHARS = 10_000
@dataclass(frozen=True)
class StreamOptions:
    """How :func:`make_dataset` and :func:`make_loader` read a shard stream (one default each)."""

    train: bool = True  # shuffled shards and samples, random-resized crops; else file order, resize + centre crop
    shuffle_buffer: int = 1000  # samples in each worker's seeded shuffle buffer (training)
    resampled: bool = False  # draw shards with replacement forever, seeded per (rank, worker)
    seed: int = 0  # shard order, shuffle buffer and crops are functions of (seed, epoch, rank, worker, index)
    epoch: int = 0  # the pass
    crop_scale: tuple[float, float] | None = (0.9, 1.0)  # random-resized-crop scale; None: plain resize
    partial: bool = True  # a finite stream ends with each worker's partial batch (False drops it)
    resume: StreamPosition | Mapping | None = None  # where a saved stream continues (or its state_dict())
    fast_resume: bool = True  # resume by reading tar headers up to the resume point (False: replay the pass)
    trim_multiple: int | None = None  # each batch's tokens cut to its longest caption, rounded up to this (training)
    uint8: bool = False  # images as resized uint8 pixels, normalised where they are used (transforms.normalize)
    draft: bool = True  # a JPEG decoded at the smallest DCT scale its training crop allows (transforms.draft)

    def __post_init__(self):
        if isinstance(self.resume, Mapping):  # a saved state_dict()
            object.__setattr__(self, "resume", StreamPosition.from_state_dict(self.resume))


def iterate_batches(loader: Iterable, stats: SkipStats, position: StreamPosition | None = None,
                    text_stats: TextStats | None = None,
                    load: LoadStats | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(images, tokens)`` from a :func:`make_loader` loader.

    Each batch's skip counts are merged into ``stats``, its caption counts (unknown tokens,
    truncations) into ``text_stats`` and its workers' work into ``load`` if given, and ``position``, if given,
    is advanced. Empty batches (a worker's leftover skip counts at the end of a finite stream) only
    carry counts and are not yielded.
    """
    for images, tokens, meta in loader:
        stats.merge(meta["skipped"])
        if text_stats is not None:
            text_stats.merge(meta["text"])
        if load is not None:
            load.update(meta)
        if position is not None:
            position.update(meta)
        if len(images):
            yield images, tokens


# --------------------------------------------------------------------------- stream stages
def _decode(sample: dict, stats: SkipStats) -> tuple[Image.Image, str] | None:
    """Validate a raw sample; return (image, caption), or count the reason and return None. The image is opened
    (its format and size read), not decoded: bytes that fail to decode are counted where the transform reads them."""
    url, key = sample["__url__"], sample["__key__"]
    ext = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
    if ext is None:
        stats.record("missing_image", url, key)
        return None
    if "txt" not in sample:
        stats.record("missing_caption", url, key)
        return None
    try:
        caption = sample["txt"].decode("utf-8")
    except UnicodeDecodeError as exn:
        stats.record("caption_not_utf8", url, key, exn)
        return None
    if not caption.strip():
        stats.record("empty_caption", url, key)
        return None
    if len(caption) > MAX_CAPTION_CHARS:
        stats.record("caption_too_long", url, key, f"{len(caption)} characters")
        return None
    try:  # a PIL image opened, not yet decoded (the transform decodes it: a JPEG at the scale its crop allows)
        image = _npy_image(sample[ext]) if ext == "npy" else Image.open(io.BytesIO(sample[ext]))
    except Exception as exn:  # PIL and NumPy raise many types for bad bytes
        stats.record("corrupt_image", url, key, repr(exn))
        return None
    return image, caption.strip()


def _npy_image(data: bytes) -> Image.Image:
    """The RGB image of a ``.npy`` member holding a uint8 [H, W, 3] array (no pickles)."""
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise ValueError(f"a .npy image must be a uint8 [H, W, 3] array; got {array.dtype} {list(array.shape)}")
    return Image.fromarray(array)


def _collate(samples: list, tokenizer, transform: ImageTransform, trim: int | None = None):
    """(images [B, 3, H, W], tokens [B, L] cut to a multiple of ``trim``, TextStats: none from a plain callable)."""
    if not samples:
        return (torch.zeros(0, 3, transform.size, transform.size, dtype=torch.uint8 if transform.uint8 else None),
                torch.zeros(0, tokenizer.context_length, dtype=torch.long), TextStats())
    images, captions = zip(*samples)
    if hasattr(tokenizer, "tokenize"):
        tokens, text = tokenizer.tokenize(list(captions))
    else:
        tokens, text = tokenizer(list(captions)), TextStats()
    tokens = tokens if trim is None else trim_padding(tokens, tokenizer.eot_id, trim)
    return _stack(images), tokens, text


def _stack(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """[B, 3, H, W], contiguous, from the transform's [3, H, W] views of [H, W, 3] pixels: stacked as they lie
    (a copy each) and transposed once, three times as fast as stacking the strided views."""
    return torch.stack([im.permute(1, 2, 0) for im in images]).permute(0, 3, 1, 2).contiguous()


class ImageCaptionDataset(IterableDataset):
    """Iterable over (image [3,H,W], tokens [L]) or, with ``batch_size``, over
    ``(images [B,3,H,W], tokens [B,L], meta)`` batches. Build it with :func:`make_dataset`."""

    def __init__(self, urls: str | Sequence[str], tokenizer: Callable, transform: ImageTransform,
                 options: StreamOptions, *, stats: SkipStats | None = None, batch_size: int | None = None):
        super().__init__()
        self.urls = wds.shardlists.expand_urls(urls) if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError(f"no shard URLs in {urls!r}")
        self.tokenizer, self.transform, self.options = tokenizer, transform, options
        self.stats = stats if stats is not None else SkipStats()
        self.batch_size = batch_size

    def split_by_sample(self, world: int, num_workers: int) -> bool:
        """Too few shards for every (rank, worker) slot to own one: split the samples instead."""
        return not self.options.resampled and len(self.urls) < world * num_workers

    def _shards(self, rank: int, world: int, worker: int, num_workers: int):
        """(this (rank, logical worker) slot's shard iterator, (slots, slot) when samples are split, else None)."""
        o = self.options
        if o.resampled:  # independent seeded draws per (rank, worker): nothing to split
            seed_fn = lambda: make_seed(o.seed, o.epoch, rank, worker)  # noqa: E731
            return iter(wds.ResampledShards(self.urls, seed=o.seed, worker_seed=seed_fn, deterministic=True)), None
        shard_seed = make_seed(o.seed, o.epoch) if o.train else None  # same order on every rank
        shards = iter(wds.SimpleShardList(self.urls, seed=shard_seed))
        if self.split_by_sample(world, num_workers):
            return shards, (world * num_workers, rank * num_workers + worker)
        # by rank, then by the logical worker id (not wds.split_by_worker's physical one) so resume can rotate it
        shards = itertools.islice(shards, rank, None, world)
        return (s for i, s in enumerate(shards) if i % num_workers == worker), None

    def _samples(self, rank: int, world: int, worker: int, num_workers: int, stats: SkipStats,
                 start: int = 0) -> tuple[Iterator[dict], int]:
        """(this slot's samples after shuffling, the stream position of the first one).

        With ``start`` > 0 it first tries :func:`mdc.data.shards.fast_forward`, which reads only
        tar headers up to the resume point; otherwise the stream starts at position 0 and the
        caller drops what was consumed. When samples are split, every slot reads every shard and
        keeps the samples whose index in that stream is its slot number modulo the slots;
        shard-level errors are then counted (and logged) by slot 0 only.
        """
        o = self.options

        def plan():
            shards, split = self._shards(rank, world, worker, num_workers)
            keep = None if split is None else (lambda i: i % split[0] == split[1])
            rng = random.Random(make_seed(o.seed, o.epoch, rank, worker)) if o.train else None
            return shards, keep, rng, stats if split is None or split[1] == 0 else Uncounted()

        bufsize = o.shuffle_buffer if o.train else None
        shards, keep, rng, shard_stats = plan()
        resumed = fast_forward(shards, start, bufsize, rng, keep) if start else None
        if resumed is None:  # replay from the start of the pass
            shards, keep, rng, shard_stats = plan() if start else (shards, keep, rng, shard_stats)
            buffer, opened, index, start = [], [], 0, 0
        else:
            buffer, shards, index = resumed.buffer, resumed.shards, resumed.index
            opened = [] if resumed.shard is None else [open_at(*resumed.shard)]
        samples = enumerate(shard_samples(shards, shard_stats, opened), index)
        samples = (sample for i, sample in samples if keep is None or keep(i))
        return (samples if bufsize is None else shuffled(samples, bufsize, rng, buffer)), start

    def __iter__(self):
        o = self.options
        rank, world, physical, num_workers = pytorch_worker_info()
        offset, start = 0, 0
        if o.resume is not None:
            if o.resume.num_workers != num_workers:
                raise ValueError(f"resume state is for {o.resume.num_workers} workers, loader has {num_workers}")
            offset = o.resume.next_worker
        worker = (physical + offset) % num_workers  # logical worker: resume keeps the round-robin order
        if o.resume is not None:
            if worker in o.resume.finished:
                return
            start = o.resume.consumed[worker]
        stats = SkipStats() if self.batch_size else self.stats
        samples, first = self._samples(rank, world, worker, num_workers, stats, start if o.fast_resume else 0)
        good, keys, position, sides = [], [], first, []
        busy = time.perf_counter()  # when this worker began the batch it assembles (LoadStats: its work)
        for index, sample in enumerate(samples, first):
            position = index + 1
            if index < start:  # consumed before the resume point: its counts were reported then
                stats.clear()
                continue
            decoded = _decode(sample, stats)
            if decoded is None:
                continue
            image, caption = decoded
            crop_rng = np.random.default_rng((o.seed, o.epoch, rank, worker, index))
            side = max(image.size)  # as stored (a JPEG may decode smaller: draft)
            try:  # the pixels are decoded here
                item = (self.transform(image, crop_rng), caption)
            except CorruptImageError as exn:  # bad bytes, not a fault of the transform's (that one propagates)
                stats.record("corrupt_image", sample["__url__"], sample["__key__"], str(exn))
                continue
            if not self.batch_size:
                yield item[0], self.tokenizer([caption])[0]
                continue
            good.append(item)
            keys.append(sample["__key__"])
            sides.append(side)
            if len(good) == self.batch_size:
                yield self._batch(good, worker, position, stats, False, keys, work=(time.perf_counter() - busy, sides))
                good, keys, sides, busy = [], [], [], time.perf_counter()
        if self.batch_size and ((good and o.partial) or stats.total):
            kept = good if o.partial else []
            yield self._batch(kept, worker, position, stats, True, keys[: len(kept)],
                              work=(time.perf_counter() - busy, sides[: len(kept)]))

    def _batch(self, samples: list, worker: int, position: int, stats: SkipStats, last: bool, keys: list[str], *,
               work: tuple[float, list[int]]):
        """(images, tokens, meta) of a loader batch; the skip counts in ``stats`` move into ``meta``, and the
        worker's ``work`` on it (seconds, the images' stored sides) with them."""
        start = time.perf_counter()
        images, tokens, text = _collate(samples, self.tokenizer, self.transform, self.options.trim_multiple)
        seconds = work[0] + time.perf_counter() - start
        meta = {"worker": worker, "position": position, "last": last, "skipped": stats.as_dict(), "keys": keys,
                "text": text.as_dict(), "images": len(samples), "seconds": seconds, "source_px": float(sum(work[1]))}
        stats.clear()
        return images, tokens, meta


# --------------------------------------------------------------------------- public API
def make_dataset(urls: str | Sequence[str], tokenizer: Callable, image_size: int, options: StreamOptions | None = None,
                 *, stats: SkipStats | None = None, batch_size: int | None = None, **kw) -> ImageCaptionDataset:
    """An iterable dataset over img2dataset shards yielding ``(image [3,H,W], tokens [L])``, read as
    ``options`` say (a :class:`StreamOptions`, or its fields as keywords: ``train=False``; an unknown
    one is a ValueError naming it). Skips are counted into ``stats`` in the iterating process. With
    ``batch_size`` it yields loader batches ``(images, tokens, meta)`` (see the module docstring)."""
    o = with_options(StreamOptions, options, kw, "stream")
    transform = image_transform(image_size, o.train, crop_scale=o.crop_scale, seed=o.seed, uint8=o.uint8,
                                draft=o.draft)
    return ImageCaptionDataset(urls, tokenizer, transform, o, stats=stats, batch_size=batch_size)


def _as_is(batch):
    return batch


def make_loader(urls: str | Sequence[str], tokenizer: Callable, image_size: int, batch_size: int,
                options: StreamOptions | None = None, *, num_workers: int = 2, pin_memory: bool = False,
                **kw) -> DataLoader:
    """A DataLoader of ``(images [B,3,H,W] float, tokens [B,L] long, meta)``, batched in workers and
    read as ``options`` say (a :class:`StreamOptions`, or its fields as keywords: ``train=False``).

    Consume it with :func:`iterate_batches` (merges ``meta["skipped"]`` into a :class:`SkipStats`,
    tracks a :class:`StreamPosition`). Deterministic for a given (urls, seed, epoch, num_workers, world
    size). A finite stream ends with each worker's partial batch (unless ``partial=False``, like
    ``drop_last``) and, if skips remain unreported, an empty batch carrying them. One pass splits shards
    over nodes and workers, or samples when there are fewer shards than world_size x num_workers (see
    the module docstring); ``resampled=True``, where every (rank, worker) draws its own seeded infinite
    shard sequence, is the usual choice for DDP (all ranks see as many batches). ``resume``: a
    :class:`StreamPosition` (or its ``state_dict()``) saved after the last consumed batch; the loader
    continues with the next batch.
    """
    dataset = make_dataset(urls, tokenizer, image_size, options, batch_size=batch_size, **kw)
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_as_is,
                      pin_memory=pin_memory, persistent_workers=False)
