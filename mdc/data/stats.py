"""Caption token-length statistics of webdataset shards (the paper's Fig. 3).

Only the ``.txt`` members of each tar are read (no image is decoded), so a shard of thousands of
samples is scanned in well under a second.
"""
from __future__ import annotations

import glob
import tarfile
import warnings
from typing import Iterable, Iterator

import numpy as np
from braceexpand import braceexpand

from mdc.tokenizer import Tokenizer


def shard_paths(shards: str | Iterable[str]) -> list[str]:
    """Paths of ``shards``: a brace pattern (``DIR/{000000..000009}.tar``), a glob, or a list of them."""
    patterns = [shards] if isinstance(shards, str) else list(shards)
    paths = []
    for pattern in patterns:
        for p in braceexpand(pattern):
            paths.extend(sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p])
    return paths


def iter_captions(shards: str | Iterable[str]) -> Iterator[str]:
    """The UTF-8 ``.txt`` captions of the shards, in shard and member order.

    A caption that is not UTF-8 is skipped with a warning naming the shard and member; an
    unreadable shard is skipped with a warning (the statistics describe what can be read).
    """
    for path in shard_paths(shards):
        try:
            with tarfile.open(path, "r") as tar:
                for member in tar:
                    if member.isfile() and member.name.endswith(".txt"):
                        try:
                            yield tar.extractfile(member).read().decode("utf-8")
                        except UnicodeDecodeError:
                            warnings.warn(f"skipped {path} member {member.name}: caption is not UTF-8")
        except (OSError, tarfile.TarError) as err:
            warnings.warn(f"skipped unreadable shard {path}: {err}")


def caption_lengths(shards: str | Iterable[str], tokenizer=None, max_samples: int | None = None) -> np.ndarray:
    """Token lengths of the shards' captions, without SOT/EOT (full CLIP BPE unless ``tokenizer``).

    ``tokenizer`` is anything with ``encode(text) -> list`` (e.g. ``mdc.get_tokenizer(...)``).
    """
    if tokenizer is None:
        tokenizer = Tokenizer()
    lengths = []
    for text in iter_captions(shards):
        if max_samples is not None and len(lengths) >= max_samples:
            break
        lengths.append(len(tokenizer.encode(text)))
    return np.asarray(lengths, dtype=np.int64)


def length_histogram(lengths, bins: int | Iterable[int] = 20) -> tuple[np.ndarray, np.ndarray]:
    """``(fraction per bin, bin edges)`` of the lengths; the fractions sum to 1 (empty input: zeros)."""
    counts, edges = np.histogram(np.asarray(lengths), bins=bins if isinstance(bins, int) else list(bins))
    total = counts.sum()
    return (counts / total if total else counts.astype(np.float64)), edges
