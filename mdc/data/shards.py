"""Tar shards as streams of samples: member grouping, the shuffle buffer, and fast exact resume.

A loader worker's stream (:mod:`mdc.data.pipeline`) is: shards -> samples (tar members grouped
by key, :func:`shard_samples`) -> [sample filter, when samples are split] -> seeded shuffle
buffer (:func:`shuffled`, webdataset's algorithm).

Fast exact resume. Resuming after ``start`` consumed samples used to replay all of it, reading
every consumed tar byte again. But the shuffle buffer's random choices depend only on how many
samples it holds, never on their content, so the replay can run on sample *ids* instead:
:func:`fast_forward` reads only the tar headers of the consumed shards (:func:`index_shard`),
replays the buffer on ids, then reads the few samples still in the buffer by seeking to their
members. The stream then continues from the next unread member of the current shard, with the
same buffer order and random state: the same samples in the same order as a full replay (tests
compare the two).

It applies to local, uncompressed tar files whose consumed part reads cleanly. Anything else
(``pipe:`` URLs, compressed or truncated shards, missing shards before the resume point)
makes :func:`fast_forward` return None, and the loader replays the stream as before.
"""
from __future__ import annotations

import itertools
import os
import random
import re
import tarfile
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from webdataset.tariterators import base_plus_ext, meta_prefix, meta_suffix, tar_file_iterator, url_opener

SKIP_META = r"__[^/]*__($|/)"  # webdataset's tar_file_iterator skips these member names


def open_at(url: str, offset: int) -> dict:
    """A local shard opened at ``offset`` (a member header), as ``url_opener`` yields shards."""
    stream = open(url, "rb")
    stream.seek(offset)
    return {"url": url, "stream": stream}


def shard_samples(shards: Iterable[dict], stats, opened: Iterable[dict] = ()) -> Iterator[dict]:
    """Open each shard and group its tar members into samples ``{__key__, __url__, ext: bytes}``.

    ``opened``: shards already opened (``{"url", "stream"}``), read before ``shards``; ``stats``: a
    :class:`mdc.data.pipeline.SkipStats`. Grouping restarts at every shard, so a truncated shard
    can never leak a partial sample into the next one. Open errors count as ``missing_shard``
    (file not found) or ``unreadable_shard``; any read error inside a tar counts once as
    ``unreadable_shard`` and ends that shard (samples completed before it are kept).
    """
    def on_open_error(exn: Exception) -> bool:
        reason = "missing_shard" if isinstance(exn, FileNotFoundError) else "unreadable_shard"
        stats.record(reason, str(exn.args[-1]), detail=repr(exn))
        return True

    for shard in itertools.chain(opened, url_opener(shards, handler=on_open_error)):
        url, errors, current = shard["url"], [], None

        def stop(exn: Exception) -> bool:
            errors.append(exn)
            return False

        try:
            for member in tar_file_iterator(shard["stream"], handler=stop):
                prefix, suffix = base_plus_ext(member["fname"])
                if prefix is None:
                    continue
                suffix = suffix.lower()
                if current is None or prefix != current["__key__"] or suffix in current:
                    if current is not None:
                        yield current
                    current = {"__key__": prefix, "__url__": url}
                current[suffix] = member["data"]
        except Exception as exn:  # tar header errors are raised outside the member handler
            errors.append(exn)
        finally:
            try:
                shard["stream"].close()
            except Exception as exn:  # a pipe: command that failed reports it on close
                errors.append(exn)
        if current is not None:
            yield current
        if errors:
            stats.record("unreadable_shard", url, detail=repr(errors[0]))


def shuffled(samples: Iterator, bufsize: int, rng: random.Random, buf: list | None = None) -> Iterator:
    """webdataset's shuffle buffer (``wds.shuffle(bufsize, initial=bufsize, rng=rng)``), restartable.

    ``buf`` is the buffer's state: a generator stopped after a yield continues exactly like a new
    one given the same ``buf``, the rest of ``samples`` and ``rng`` (whose state it shares).
    """
    buf = [] if buf is None else buf
    samples = iter(samples)
    for sample in samples:
        buf.append(sample)
        if len(buf) < bufsize:
            try:
                buf.append(next(samples))
            except StopIteration:
                pass
        if len(buf) >= bufsize:
            yield _pick(buf, rng)
    while buf:
        yield _pick(buf, rng)


def _pick(buf: list, rng: random.Random):
    k = rng.randint(0, len(buf) - 1)
    sample, buf[k] = buf[k], buf[-1]
    buf.pop()
    return sample


@dataclass
class ShardIndex:
    """Where each sample of a tar shard lies: ``samples[k]`` maps ``__key__``/``__url__`` to their
    values and each member suffix to its (data offset, size); ``starts[k]`` is the byte offset of
    the header of sample k's first member."""

    url: str
    samples: list[dict]
    starts: list[int]

    def read(self, k: int, f) -> dict:
        """Sample k as the loader's tar reader yields it (``f``: this shard, opened in binary mode)."""
        sample = {}
        for name, value in self.samples[k].items():
            if name.startswith("__"):
                sample[name] = value
            else:
                f.seek(value[0])
                sample[name] = f.read(value[1])
        return sample


def index_shard(url: str) -> ShardIndex | None:
    """The index of a local uncompressed tar from its headers alone (no member data is read), or
    None when it is not one or does not read cleanly. Members are filtered and grouped into samples
    exactly as :func:`shard_samples` does."""
    if not os.path.isfile(url):
        return None
    try:
        with tarfile.open(url, "r:") as tar:  # "r:" refuses compressed tars
            members = tar.getmembers()
    except (OSError, tarfile.TarError, ValueError):
        return None
    size, samples, starts, current = os.path.getsize(url), [], [], None
    for m in members:
        name = m.name
        if not m.isreg() or ("/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix)) \
                or re.match(SKIP_META, name):
            continue
        if m.sparse is not None or m.offset_data + m.size > size:
            return None  # the reader would fail on its data
        prefix, suffix = base_plus_ext(name)
        if prefix is None:
            continue
        suffix = suffix.lower()
        if current is None or prefix != current["__key__"] or suffix in current:
            current = {"__key__": prefix, "__url__": url}
            samples.append(current)
            starts.append(m.offset)
        current[suffix] = (m.offset_data, m.size)
    return ShardIndex(url, samples, starts)


@dataclass
class Resumed:
    """The stream state after ``start`` samples: what a full replay would hold at that point."""

    buffer: list[dict]  # the shuffle buffer's samples, in buffer order (empty without shuffling)
    shard: tuple[str, int] | None  # (url, byte offset) of the current shard's next unread sample
    shards: Iterator[dict]  # the shards after it, still unread
    index: int  # position of the next unread sample in the stream of all samples (for the split filter)


class _Unindexable(Exception):
    pass


def fast_forward(shards: Iterator[dict], start: int, bufsize: int | None, rng: random.Random | None,
                 keep: Callable[[int], bool] | None = None) -> Resumed | None:
    """Replay ``start`` samples of a worker's stream on ids; None if a shard it reaches cannot be indexed.

    ``shards``: the worker's shard iterator ({"url": ...}); it is advanced past the shards the
    replay read. ``keep(i)``: whether the worker keeps sample i of the stream (split by sample).
    ``bufsize``/``rng``: the shuffle buffer (None: no shuffling); ``rng`` is advanced in place.
    """
    at = [None, 0, 0]  # (index, next sample in it, next stream position) after the last sample pulled

    def ids():
        position = 0
        for shard in shards:
            index = index_shard(shard["url"])  # not cached: only the shards still buffered stay in memory
            if index is None:
                raise _Unindexable(shard["url"])
            for k in range(len(index.samples)):
                at[:] = index, k + 1, position + 1
                if keep is None or keep(position):
                    yield index, k
                position += 1
            at[:] = None, 0, position

    buf: list = []
    source = ids() if bufsize is None else shuffled(ids(), bufsize, rng, buf)
    try:
        pulled = sum(1 for _ in itertools.islice(source, start))
    except _Unindexable:
        return None
    if pulled < start:  # the pass ended before the resume point: nothing is left
        return Resumed([], None, iter(()), at[2])
    index, k = at[0], at[1]
    shard = (index.url, index.starts[k]) if index is not None and k < len(index.samples) else None
    return Resumed(_read(buf), shard, shards, at[2])


def _read(ids: list[tuple[ShardIndex, int]]) -> list[dict]:
    files = {}
    try:
        out = []
        for index, k in ids:
            f = files.get(index.url) or files.setdefault(index.url, open(index.url, "rb"))
            out.append(index.read(k, f))
        return out
    finally:
        for f in files.values():
            f.close()
