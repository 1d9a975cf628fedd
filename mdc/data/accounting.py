"""What a shard stream accounts for besides its batches: the inputs it skipped and why (:class:`SkipStats`,
``SKIP_REASONS``), where each worker stands for exact resume (:class:`StreamPosition`) and the work its workers did
(:class:`LoadStats`). Counts made in DataLoader workers travel to the main process in each batch's ``meta``
(:mod:`mdc.data.pipeline`)."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Mapping

logger = logging.getLogger("mdc.data.pipeline")  # skips are logged under the stream's name

SKIP_REASONS = (
    "missing_shard",     # a URL that does not exist (counted per shard)
    "unreadable_shard",  # open/read error or truncation inside a tar (counted per shard)
    "missing_image",     # a key with no jpg/jpeg/png/webp/npy member
    "corrupt_image",     # image bytes PIL cannot decode, or a .npy that is not a uint8 [H, W, 3] array
    "missing_caption",   # an image without .txt
    "empty_caption",     # empty or whitespace-only .txt
    "caption_not_utf8",  # .txt that is not valid UTF-8
    "caption_too_long",  # more than MAX_CAPTION_CHARS characters
)


@dataclass
class SkipStats:
    """Counts of skipped inputs by reason (one of ``SKIP_REASONS``); mergeable."""

    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, reason: str, n: int = 1) -> None:
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}; expected one of {SKIP_REASONS}")
        self.counts[reason] = self.counts.get(reason, 0) + n

    def record(self, reason: str, url: str, key: str | None = None, detail: object = "") -> None:
        """Count one skip and log a warning naming the shard and sample key."""
        self.add(reason)
        where = url if key is None else f"{url} key {key}"
        logger.warning("skipped %s: %s%s", reason, where, f" ({detail})" if detail else "")

    def merge(self, other: "SkipStats | Mapping[str, int]") -> "SkipStats":
        """Add ``other``'s counts into this object (in place) and return it."""
        for reason, n in (other.counts if isinstance(other, SkipStats) else other).items():
            self.add(reason, n)
        return self

    def clear(self) -> None:
        self.counts.clear()

    def as_dict(self) -> dict[str, int]:
        return {reason: self.counts[reason] for reason in SKIP_REASONS if reason in self.counts}


class Uncounted(SkipStats):
    """A sink for skips that another (rank, worker) slot counts and logs."""

    def record(self, reason: str, url: str, key: str | None = None, detail: object = "") -> None:
        pass


@dataclass
class StreamPosition:
    """Per-worker stream positions of a loader: what exact resume needs.

    ``consumed[w]`` is the number of post-shuffle samples worker ``w`` has used (good and
    skipped); ``finished`` lists workers whose last batch has been used; ``next_worker`` is
    the worker whose batch the DataLoader hands out next.
    """

    num_workers: int
    consumed: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    next_worker: int = 0
    batches: int = 0  # batches seen, for logging

    def __post_init__(self):
        self.num_workers = max(1, self.num_workers)
        if not self.consumed:
            self.consumed = [0] * self.num_workers

    def update(self, meta: Mapping) -> None:
        """Advance past one loader batch, given its ``meta``."""
        self.consumed[meta["worker"]] = meta["position"]
        if meta["last"]:
            self.finished.append(meta["worker"])
        self.next_worker = (meta["worker"] + 1) % self.num_workers
        self.batches += 1

    def state_dict(self) -> dict:
        return {"num_workers": self.num_workers, "consumed": list(self.consumed), "finished": list(self.finished),
                "next_worker": self.next_worker, "batches": self.batches}

    @classmethod
    def from_state_dict(cls, state: Mapping) -> "StreamPosition":
        return cls(state["num_workers"], list(state["consumed"]), list(state["finished"]),
                   state["next_worker"], state["batches"])


@dataclass
class LoadStats:
    """The loader's own work since the last :meth:`take`: batches and images assembled, the seconds its workers
    spent assembling them (read, decode, crop, tokenize; not the time a batch waited in a queue) and the images'
    stored size (the longer side, summed). ``rate(workers)``: the images/s ``workers`` such workers deliver
    together, each on a core of its own."""

    batches: int = 0
    images: int = 0
    seconds: float = 0.0
    source_px: float = 0.0

    def update(self, meta: Mapping) -> None:
        """Add one loader batch's work (its ``meta``: ``images``, ``seconds``, ``source_px``)."""
        self.batches += 1
        self.images += meta.get("images", 0)
        self.seconds += meta.get("seconds", 0.0)
        self.source_px += meta.get("source_px", 0.0)

    def rate(self, workers: int) -> float:
        return max(workers, 1) * self.images / self.seconds if self.seconds else float("nan")

    def side(self) -> float:
        """The images' mean stored size (longer side, pixels)."""
        return self.source_px / self.images if self.images else float("nan")

    def take(self) -> "LoadStats":
        """The counts so far, and start again from zero."""
        out = dataclasses.replace(self)
        self.__init__()
        return out

