"""The ledger's book-keeping while a graph executes (:mod:`reproduce.running.ledger`): which runs are done and
where (a run folder, a record), which must execute, the record each finished run writes, and the
checkpoints no unrecorded run reads any more.

A run whose record carries its current key counts as done even where no run folder exists; it executes
again only when a run that will execute needs its output (a checkpoint, data), and then must make the
checkpoint its record names (:meth:`Book.differs`); a folder done with its key that holds other weights
than its record names (:func:`another_checkpoint`) is not read. Once every run that reads
a pretraining run's checkpoints has a record, its checkpoints are removed (unless kept) and its folder no
longer counts as done: the record stands for it. With ``kept_weights``, a run of
:data:`reproduce.pretrained.KEEP` leaves its weights there in float16 before its record is written
(:func:`reproduce.pretrained.keep`), so a recorded run of a reference run always has them.
"""
from __future__ import annotations

import contextlib
import os
import shutil

from mdc.eval.results import read_results
from reproduce import pretrained
from reproduce.running import ledger
from reproduce.running.folders import is_done
from reproduce.graph import ROOT, Run, digests, run_dir

READS_RECORDS_ONLY = ("figures",)  # notebooks that need their dependencies' records, not their folders


def another_checkpoint(out: str, records: str | None, r: Run) -> tuple[str, str] | None:
    """(recorded, made): the checkpoint ids of ``r``'s record and of its folder's results where they differ (the
    same parameters trained again on another machine, or by another code path, made other weights); None where
    they are the same or either names none."""
    old = ((ledger.read(records, r.name) or {}).get("results") or {}).get("checkpoint_id") if records else None
    new = read_results(os.path.join(run_dir(out, r), "results.json")).get("checkpoint_id") if old else None
    return (old, new) if old and new and old != new else None


class Book:
    """What is done and where: run folders, the ledger, the records to write and the checkpoints to free."""

    def __init__(self, runs, key, out, records, keep_checkpoints, log, *, kept_weights=None, machine_factor=None,
                 science=None, again=()):
        self.runs, self.key, self.out, self.records, self.keep, self.log = runs, key, out, records, keep_checkpoints, log
        self.kept_weights = kept_weights  # where the float16 weights of the runs in pretrained.KEEP go
        self.machine_factor = machine_factor  # into each record: the machine's run time over the reference's
        self.science = science  # the tree whose mdc/ and notebooks/ the runs execute (None: this one)
        self.again = set(again)  # recorded runs executed where their folder is gone: a later runner reads them
        self.digest, self.package = digests(runs, science), ledger.package_digest(science or ROOT)
        self.in_folder = {r.name for r in runs if is_done(out, r, key[r.name])}
        self.recorded = {r.name for r in runs if ledger.done(records, r.name, key[r.name])}
        for r in runs:
            ids = r.name in self.in_folder & self.recorded and another_checkpoint(out, records, r)
            if ids:
                self.in_folder.discard(r.name)
                log(f"{r.name}: its folder holds checkpoint {ids[1]}, not the recorded {ids[0]}: no run reads it")
        self.needed = self._needed()

    def _needed(self) -> set[str]:
        """Runs to execute: those not done, ``again`` where its folder is not here, and the recorded runs whose
        output (folder) one of them reads."""
        needed = {r.name for r in self.runs if r.name not in self.in_folder | self.recorded}
        needed |= {r.name for r in self.runs if r.name in self.again and r.name not in self.in_folder}
        for r in self.runs:
            if r.name in needed and self.records and ledger.read(self.records, r.name):
                self.log(f"{r.name}: recorded under another key (its notebook's code, its parameters or a run it "
                         "reads changed since): it executes again")
        for r in reversed(self.runs):  # dependants first
            if r.name in needed and r.notebook not in READS_RECORDS_ONLY:
                for d in r.deps:
                    if d not in self.in_folder and d not in needed:
                        needed.add(d)
                        self.log(f"{d}: recorded, but {r.name} reads its output, which is not here: it executes again")
        return needed

    def differs(self, r: Run) -> str | None:
        """Why ``r``, a recorded run executed again for a reader (same key), may not replace its record: its
        folder's weights are not the checkpoint the record names, so its recorded readers read another model.
        None where it made the same (or either names none)."""
        ids = r.name in self.recorded and another_checkpoint(self.out, self.records, r)
        if ids:
            return (f"{r.name} executed again with its recorded parameters but made checkpoint {ids[1]}, not the "
                    f"recorded {ids[0]}: the runs that read its record read another model; the record is kept")
        return None

    def refuse(self, r: Run, why: str) -> None:
        """Leave ``r``'s folder not done (it holds weights its record does not name), saying why."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(run_dir(self.out, r), "done.json"))
        self.log(why)

    def record(self, r: Run, outcome: dict) -> None:
        """Write ``r``'s record from its folder's results.json (a run just done, or done before the ledger), its
        kept weights first (``kept_weights``): a run whose weights could not be kept gets no record, and the next
        runner keeps them as it records the run from its folder."""
        if not self.records or r.notebook in READS_RECORDS_ONLY:  # the figures are built from records, not one
            return
        results = read_results(os.path.join(run_dir(self.out, r), "results.json"))
        if self.kept_weights and pretrained.is_kept(r.name):
            kept = pretrained.keep(run_dir(self.out, r), self.kept_weights,
                                   {"run": r.name, "key": self.key[r.name], "results": results})
            self.log(f"{r.name}: float16 weights kept in {kept}")
        ledger.write(self.records, r, self.key[r.name], results, self.out, self.digest[r.notebook],
                     outcome | ({"machine_factor": self.machine_factor} if self.machine_factor else {}), self.package)
        self.recorded.add(r.name)

    def free_checkpoints(self, spare: frozenset = frozenset()) -> None:
        """Remove the checkpoints of runs whose every reader has a record (unless kept), but those of ``spare``."""
        if self.keep or not self.records:
            return
        for r in self.runs:
            if r.name in spare:
                continue
            folder = os.path.join(run_dir(self.out, r), "checkpoints")
            readers = [d.name for d in self.runs if r.name in d.deps and d.notebook not in READS_RECORDS_ONLY]
            if readers and os.path.isdir(folder) and set(readers) <= self.recorded and r.name in self.recorded:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(run_dir(self.out, r), "done.json"))  # the record stands for it now
                shutil.rmtree(folder)
                self.in_folder.discard(r.name)
                self.log(f"{r.name}: every run that reads its checkpoints is recorded; checkpoints removed")
