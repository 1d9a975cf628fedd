"""What differs between the machines a study's parts run on: speed, which ``--machine-factor`` scales the
reference machine's estimates by (:func:`on_machine`, measured by :func:`machine_ratio`), and float results,
which can make a recorded pretraining run trained again on another machine another model (:func:`drifted`)."""
from __future__ import annotations

import os
import statistics

from reproduce.running import ledger
from reproduce.running.bookkeeping import another_checkpoint
from reproduce.running.folders import is_done
from reproduce.studies import words_runs as plan


ELSEWHERE = ("reference", "no record")  # the sources of an estimate that another machine made


def on_machine(est: tuple[float, str], factor: float) -> tuple[float, str]:
    """``est`` (seconds, source) on a machine ``factor`` times slower than the reference's: an estimate from the
    reference ledger or a step's default is scaled, one from the study's own records is not (this machine made it)."""
    seconds, source = est
    if factor == 1.0 or not source.startswith(ELSEWHERE):
        return est
    return seconds * factor, f"{source}; x {factor:g} on this machine"


def machine_ratio(outcome: dict[str, dict], est: dict[str, tuple[float, str]], factor: float = 1.0
                  ) -> tuple[float, int] | None:
    """(median of seconds taken over the reference machine's estimate, runs) of the runs in ``outcome`` that
    succeeded with an estimate from the reference ledger (``est`` scaled by ``factor``): the ``--machine-factor``
    of this machine; None without such a run."""
    ratios = [o["seconds"] * factor / est[n][0] for n, o in outcome.items() if o.get("status") == "ok"
              and o.get("seconds", 0) > 0 and n in est and est[n][1].startswith(ELSEWHERE[0])]
    return (statistics.median(ratios), len(ratios)) if ratios else None


def drifted(runs: list, key: dict, out: str, records: str) -> list[str]:
    """Float results differ across CPUs: a recorded pretraining run trained again on another machine can make another
    checkpoint. Where a done folder holds one, its record and those of every recorded run that read it are removed,
    to be made again from it, so that one run's readers read one model; returns the names removed."""
    gone = []
    for r in (r for r in runs if r.notebook == "pretrain" and ledger.done(records, r.name, key[r.name])):
        ids = is_done(out, r, key[r.name]) and another_checkpoint(out, records, r)
        if not ids:
            continue
        removed = [n for n in [r.name, *plan.readers(runs, r.name)] if ledger.read(records, n)]
        for name in removed:
            os.remove(ledger.path(records, name))
        print(f"words: {r.name} was trained again into checkpoint {ids[1]}, not the recorded {ids[0]}: records "
              f"removed, to be made again from it: {', '.join(removed)}")
        gone += removed
    return gone
