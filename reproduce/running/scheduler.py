"""Which run starts next, and how many run at once: the loop that executes a graph of runs.

Runs come in dependency order (:func:`reproduce.graph.order`). Each turn first settles what will not
execute: a run whose dependency was left (by the time box) is left too, one whose dependency failed is
blocked, and one done earlier (its folder or its record: :class:`reproduce.running.bookkeeping.Book`) is skipped, its
record written from its folder if the ledger lacks it. Then, of the runs ready (every dependency ok or
skipped), up to ``jobs`` run at once, each an attempt in its own subprocess
(:func:`reproduce.running.attempt.run_attempt`) on a worker thread, in this order: depth first (the runs that
make the deepest runs ready, deeper ones first), so a seed's evaluations (and the data only they read)
follow its pretraining run instead of waiting behind every other pretraining run (results sooner, few
checkpoints waiting for their evaluations); then a seed's runs before the next seed's, and the longest
chain first, so the longest evaluation starts early in a time box. A caller may hand it an order of its own
(``priority``: a study's part, whose time budget was computed with it).

Under a time budget a run starts only if its estimate (its last record, scaled where its parameters changed,
or the profile's default: :func:`reproduce.running.ledger.estimate_seconds`) with its longest reader's still to run fits in what is left:
a checkpoint left unread is trained again by the next part. A run that does not fit is ``left``; the
running ones finish. One exception bounds the cost of an estimate that was short: a run that reads a run
executed in this part and is both shorter than it and a tenth of the budget at most (a probe after a
pretraining run that ended just past the budget) still starts, since leaving it would have the next part
execute that run again.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from reproduce.running import attempt
from reproduce.running.bookkeeping import READS_RECORDS_ONLY, Book
from reproduce.running.folders import done_seconds, set_aside
from reproduce.graph import Run


def quiet(status: str, error: str = "") -> dict:
    """The outcome of a run that did not execute."""
    return {"status": status, "seconds": 0.0, "peak_mb": 0.0, "error": error}


class Scheduler:
    """Executes ``book.runs`` (dependencies first): ``jobs`` at a time, within ``budget_s`` seconds if given,
    each run's ``estimate`` (seconds) deciding what fits; the runs in ``skipped`` count as done (a cluster
    job executes one run of the graph). ``torchrun=(gpus_per_node, nodes)``: pretraining under torchrun.
    ``priority``: {run: rank}, the order ready runs start in (lowest first; runs it does not rank last)."""

    def __init__(self, book: Book, estimate: dict[str, float], jobs: int = 1, budget_s: float | None = None,
                 torchrun: tuple[int, int] | None = None, skipped=(), priority: dict[str, int] | None = None):
        self.book, self.estimate, self.budget_s, self.torchrun = book, estimate, budget_s, torchrun
        self.priority = priority
        self.jobs = max(1, jobs)
        self.start = time.perf_counter()
        self.outcome: dict[str, dict] = {name: quiet("skipped") for name in skipped}
        self.pending = [r for r in book.runs if r.name not in self.outcome]
        self.running: dict = {}  # future -> run
        self.depth: dict[str, int] = {}
        self.readers: dict[str, list[Run]] = {r.name: [] for r in book.runs}
        for r in book.runs:  # dependencies first (order()), so theirs are known
            self.depth[r.name] = 1 + max((self.depth[d] for d in r.deps), default=-1)
            for d in r.deps:
                self.readers[d].append(r)

    def run(self) -> dict[str, dict]:
        """Execute every pending run; returns {name: outcome}."""
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            while self.pending or self.running:
                self.settle()
                self.start_ready(pool)
                if self.running:
                    self.collect()
        return self.outcome

    def status(self, name: str) -> str | None:
        return self.outcome.get(name, {}).get("status")

    def _served(self, r: Run) -> bool:
        return all(self.status(d) in ("ok", "skipped") for d in r.deps)

    def reach(self, r: Run) -> int:
        """The depth of the deepest run that ``r`` would make ready (its own if none): depth first."""
        ready_after = [self.depth[x.name] for x in self.readers[r.name] if x.notebook not in READS_RECORDS_ONLY
                       and all(d == r.name or self.status(d) in ("ok", "skipped") for d in x.deps)]
        return max([self.depth[r.name], *ready_after])

    def chain(self, r: Run) -> float:
        """``r``'s estimate and its longest reader's still to run: the time before its output has served."""
        follow = [self.estimate[x.name] for x in self.readers[r.name] if x.notebook not in READS_RECORDS_ONLY
                  and x.name in self.book.needed and self.status(x.name) is None]
        return self.estimate[r.name] + max(follow, default=0.0)

    def saves(self, r: Run) -> bool:
        """Whether ``r`` starts past the budget: it is short (a tenth of the budget at most) and reads a run
        executed in this part that takes longer, which the next part would execute again were ``r`` left."""
        own = self.estimate[r.name]
        return own <= self.budget_s / 10 and any(self.status(d) == "ok" and self.estimate[d] > own for d in r.deps)

    def _log(self, done: int, status: str, message: str) -> None:
        self.book.log(f"[{done}/{len(self.book.runs)}] {status:8s} {message}")

    def settle(self) -> None:
        """Dependencies first: settle the pending runs that are left, blocked or completed earlier."""
        for r in list(self.pending):
            if any(self.status(d) == "left" for d in r.deps):
                self.outcome[r.name] = quiet("left")
            elif any(self.status(d) not in (None, "ok", "skipped") for d in r.deps):
                failed = [d for d in r.deps if self.status(d) not in ("ok", "skipped")]
                self.outcome[r.name] = quiet("blocked", f"dependency failed: {', '.join(failed)}")
                self._log(len(self.outcome), "blocked", f"{r.name} (a dependency failed)")
            elif r.name not in self.book.needed and self._served(r):
                self.outcome[r.name] = quiet("skipped")
                if r.name not in self.book.recorded:
                    # done before the ledger: its record and the seconds it took, from its folder
                    self.book.record(r, {"seconds": done_seconds(self.book.out, r)})
                self._log(len(self.outcome), "done", f"{r.name} (completed earlier, same parameters)")
            else:
                continue
            self.pending.remove(r)

    def start_ready(self, pool: ThreadPoolExecutor) -> None:
        """Start the ready runs in the module docstring's order while fewer than ``jobs`` run."""
        ready = [r for r in self.pending if self._served(r)]
        if self.priority is not None:
            order = sorted(ready, key=lambda r: self.priority.get(r.name, len(self.priority)))
        else:
            order = sorted(ready, key=lambda r: (-self.reach(r), -self.depth[r.name], r.labels.get("seed", -1),
                                                 -self.chain(r)))
        for r in order:
            if len(self.running) >= self.jobs:
                break
            self.pending.remove(r)
            elapsed = time.perf_counter() - self.start
            if self.budget_s is not None and elapsed + self.chain(r) > self.budget_s and not self.saves(r):
                self.outcome[r.name] = quiet("left")
                continue
            key = self.book.key[r.name]
            moved = set_aside(self.book.out, r, key)
            if moved:
                self.book.log(f"{r.name}: its folder held a run with other parameters; moved to {moved}")
            self._log(len(self.outcome) + len(self.running) + 1, "running", r.name)
            self.running[pool.submit(attempt.run_attempt, self.book.out, r, key, self.torchrun,
                                     self.book.science)] = r

    def collect(self) -> None:
        """Wait for a running run to end; a run that succeeded is recorded and frees the checkpoints it can."""
        finished, _ = wait(self.running, return_when=FIRST_COMPLETED)
        for fut in finished:
            r = self.running.pop(fut)
            o = self.outcome[r.name] = fut.result()
            if o["status"] == "ok" and (why := self.book.differs(r)):
                o.update(status="failed", error=why)
                self.book.refuse(r, why)
            if o["status"] == "ok":
                self.book.in_folder.add(r.name)
                self.book.record(r, o)
                self.book.free_checkpoints()
            self._log(len(self.outcome), o["status"], f"{r.name} in {o['seconds']:.0f} s, peak {o['peak_mb']:.0f} MB")
