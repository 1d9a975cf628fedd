"""How long a study's runs take before they run (:func:`estimate`), and which of them fit a part (:func:`select`).
The reference machine's estimates are scaled to this one by ``--machine-factor`` (:func:`on_machine`), which each
part measures (:func:`machine_ratio`) and writes into its records: a record made on a machine three times slower
than this one estimates a third of its seconds here (:func:`reproduce.running.ledger.machine_factor`)."""
from __future__ import annotations

import glob
import os
import statistics

from mdc.base.checkpoint import latest
from mdc.factory import model_config
from reproduce.graph import Run, run_dir
from reproduce.registry import run_name
from reproduce.running import ledger
from reproduce.running.folders import is_done, recorded_key

ELSEWHERE = ("reference", "no record")  # the sources of an estimate that another machine made


def reference_name(run: Run) -> str:
    """The reference run a study run is estimated from (the same seed; ledger.estimate falls back to others)."""
    kind, seed, labels = run.name.split("/", 1)[0], run.labels.get("seed", 0), run.labels
    if kind == "captioning":
        return run_name(kind, seed, "alt")
    if kind == "compositionality":
        return run_name(kind, seed, labels["objective"], "descriptive", "own")
    if kind == "pretrain" and not run.params.get("model_overrides", {}).get("length_visible", True):
        return run_name(kind, seed, labels["objective"], "descriptive")  # the longest captions: the most positions
    if kind in ("pretrain", "probe"):
        return run_name(kind, seed, labels["objective"], labels["style"])
    return run.name


def pretrain_factor(run: Run, record: dict, reference: str) -> tuple[float, str]:
    """A pretraining run's seconds over its reference record's: images (steps x batch), and with the caption length
    hidden the context over the longest descriptive caption (the positions the decoder reads: an upper bound)."""
    images = ledger.trained_steps(run.params, run.labels) * run.params["batch_size"]
    then = ledger.trained_steps(record["params"], record.get("labels")) * record["params"]["batch_size"]
    factor, notes = images / then, [f"images x {images / then:.2f}"]
    if not run.params.get("model_overrides", {}).get("length_visible", True):
        data = ledger.read(reference, "data/descriptive") or {}
        longest = (((data.get("results") or {}).get("results") or {}).get("lengths") or {}).get("max")
        if longest:
            tokens = model_config(run.params["model"]).context_length / (longest + 2)
            factor, notes = factor * tokens, notes + [f"tokens x {tokens:.2f} (context over SOT + {longest} + EOT)"]
    return factor, ", ".join(notes)


def caption_factor(run: Run, record: dict, reference: str) -> tuple[float, str]:
    """A captioning run's seconds over its reference record's: the record's fine-tuning (steps taken x batch x the
    alt MDC pretraining run's seconds per image) out, the run's own in (its cap over the record's, its models)."""
    r = record["results"]["results"]
    pre = ledger.read(reference, run_name("pretrain", record.get("seed") or 0, "mdc", "alt")) or ledger.read(
        reference, run_name("pretrain", 0, "mdc", "alt"))
    per_image = ledger.run_seconds(pre) / (pre["params"]["steps"] * pre["params"]["batch_size"])
    tuned = {o: f["steps_taken"] * f["batch_size"] * per_image for o, f in (r.get("finetune") or {}).items() if f}
    seconds = ledger.run_seconds(record)
    rest = max(seconds - sum(tuned.values()), 0.1 * seconds)
    models = [o for o in ("mdc", "arc") if run.params.get(f"{o}_checkpoint")]
    cap = run.params["finetune_steps"] / record["params"]["finetune_steps"] if run.params["finetune_steps"] else 0
    new = rest * len(models) / 2 + sum(tuned.get(o, 0.0) * cap for o in models)
    return new / seconds, (f"fine-tuning {sum(tuned.values()):.0f} s of {seconds:.0f} s, now "
                           f"{new - rest * len(models) / 2:.0f} s ({'+'.join(models)})")


def estimate(run: Run, by_name: dict, records: str | None, reference: str | None, steps: dict,
             profile: str = "mini", ref_runs: dict | None = None) -> tuple[float, str]:
    """(seconds, where from) of ``run``: the study's own record of its stem (any seed); else for a step (``steps``:
    kind -> its seconds at mini) its measured default; else its reference record as
    :func:`reproduce.running.ledger.estimate` gives it, a pretraining or captioning run's scaled by its factor."""
    stem = run.name.rsplit("-s", 1)[0]
    if records and (ledger.read(records, run.name) or glob.glob(ledger.path(records, glob.escape(stem) + "-s*"))):
        return ledger.estimate(run, records, profile, by_name)
    if run.notebook in steps:
        return steps[run.notebook](run) * (1 if profile == "mini" else 0.1), "no record: the step's measured default"
    name = reference_name(run)
    record = ledger.read(reference, name) if reference else None
    if record is None and reference:
        found = glob.glob(ledger.path(reference, glob.escape(name.rsplit("-s", 1)[0]) + "-s*"))
        record = ledger.read(reference, os.path.relpath(sorted(found)[0], reference)[:-5]) if found else None
    if record is None:
        return ledger.estimate(run, None, profile, by_name)
    proxy = Run(record["run"], run.notebook, run.params, deps=run.deps, labels=run.labels)
    seconds, note = ledger.estimate(proxy, reference, profile, ref_runs or by_name)
    factor, why = {"pretrain": pretrain_factor, "captioning": caption_factor}.get(
        run.notebook, lambda *_: (1.0, ""))(run, record, reference)
    note = note if note.startswith(("the record of", "its record")) or not note else note.split(":")[0]
    return seconds * factor, f"reference {record['run']}" + (f" x {factor:.2f}: {why}" if why else "") + (
        f" ({note})" if note and "as recorded" not in note else "")


def at_reference_speed(source: str) -> bool:
    """Is an estimate from this source in the reference machine's seconds: the reference ledger's, a step's
    default, or a record that says what machine made it? (Else a record that does not: this machine's, as is.)"""
    return source.startswith(ELSEWHERE) or ledger.REFERENCE_SPEED in source


def on_machine(est: tuple[float, str], factor: float) -> tuple[float, str]:
    """``est`` (seconds, source) on a machine ``factor`` times slower than the reference's: an estimate in the
    reference machine's seconds (:func:`at_reference_speed`) is scaled, a record that does not say what machine
    made it is taken as this machine's."""
    seconds, source = est
    if factor == 1.0 or not at_reference_speed(source):
        return est
    return seconds * factor, f"{source}; x {factor:g} on this machine"


def left(run: Run, key: str, out: str, est: tuple[float, str]) -> tuple[float, str]:
    """``est`` of a pretraining run scaled to the steps it has left where its folder holds it begun (a checkpoint
    of this run's key, not done): the runner resumes it from the newest, so a run longer than one part ends in the
    next while its folder lasts."""
    folder = run_dir(out, run)
    begun = run.notebook == "pretrain" and recorded_key(folder) == key and not is_done(out, run, key)
    newest = latest(folder) if begun else None
    if newest is None:
        return est
    done, start = int(os.path.basename(newest).removeprefix("step_")), run.labels.get("from_step", 0)
    stop = run.params.get("stop_at") or run.params["steps"]
    return est[0] * max(0.0, (stop - done) / (stop - start)), f"{est[1]}; resumes at step {done:,} of {stop:,}"


def machine_ratio(outcome: dict[str, dict], est: dict[str, tuple[float, str]], factor: float = 1.0
                  ) -> tuple[float, int] | None:
    """(median of seconds taken over the reference machine's estimate, runs) of the succeeded runs in ``outcome``
    estimated in the reference machine's seconds (``est`` scaled by ``factor``), a step's default aside (no
    measurement): this machine's ``--machine-factor``."""
    ratios = [o["seconds"] * factor / est[n][0] for n, o in outcome.items() if o.get("status") == "ok"
              and o.get("seconds", 0) > 0 and n in est and at_reference_speed(est[n][1])
              and not est[n][1].startswith(ELSEWHERE[1])]
    return (statistics.median(ratios), len(ratios)) if ratios else None


def priority(runs: list[Run], seconds: dict[str, float], names: set[str]) -> dict[str, int]:
    """The order in which a part's runner starts the ready runs of ``names``, as ranks (0 first): the longest chain
    first (a run's seconds and its longest reader's among ``names``, read to the end: its critical path), plan
    order among equals. :func:`select` computes a part's time with it, and the part hands it to the runner."""
    index = {r.name: i for i, r in enumerate(runs)}
    readers: dict[str, list[str]] = {n: [] for n in names}
    for r in runs:
        for d in r.deps:
            if r.name in names and d in names:
                readers[d].append(r.name)
    tail: dict[str, float] = {}

    def chain(n: str) -> float:
        if n not in tail:
            tail[n] = seconds[n] + max((chain(x) for x in readers[n]), default=0.0)
        return tail[n]

    return {n: i for i, n in enumerate(sorted(names, key=lambda n: (-chain(n), index[n])))}


def makespan(runs: list[Run], seconds: dict[str, float], names: set[str], jobs: int, last=()) -> float:
    """Seconds until ``jobs`` workers end ``names`` (inputs outside them done), each free worker starting the ready
    run :func:`priority` ranks first (the runner with that order); runs of the notebooks ``last`` (a study's
    steps, :func:`reproduce.studies.driver.part.run_steps`) start once all the others have ended."""
    by_name = {r.name: r for r in runs}
    steps = {n for n in names if by_name[n].notebook in last}
    return _list_schedule(runs, seconds, steps, jobs, _list_schedule(runs, seconds, names - steps, jobs, 0.0))


def _list_schedule(runs: list[Run], seconds: dict[str, float], names: set[str], jobs: int, now: float) -> float:
    rank, by_name = priority(runs, seconds, names), {r.name: r for r in runs}
    waiting, running, ended = sorted(names, key=rank.get), [], set()
    while waiting or running:
        for n in [n for n in waiting if all(d in ended or d not in names for d in by_name[n].deps)]:
            if len(running) >= jobs:
                break
            waiting.remove(n)
            running.append((now + seconds[n], rank[n], n))
        first = min(running)
        running.remove(first)
        now, ended = first[0], ended | {first[2]}
    return now


def select(runs: list[Run], seconds: dict[str, float], todo: set[str], budget_s: float,
           jobs: int = 2, last=()) -> tuple[list[str], list[str]]:
    """(runs to start, runs left) within ``budget_s`` of wall time at ``jobs`` at a time: the runs no run to do reads
    (the evaluations), in plan order, each with the runs to do it reads, while the whole ends in time as the
    runner starts it (:func:`makespan`, the notebooks ``last`` after the rest). A pretraining run starts only with
    every reader it has to do, so no checkpoint is trained for nothing or trained again; the next piece of a run
    trained in pieces (``resume_from``) is no such reader: each piece is chosen with its own."""
    by_name = {r.name: r for r in runs}

    def continues(r: Run) -> bool:  # the next piece of a run trained in pieces
        return r.notebook == "pretrain" and bool(r.params.get("resume_from"))

    # read by a run to do: chosen with its reader (a piece read by its next piece alone: on its own)
    inputs = {d for r in runs if r.name in todo and not continues(r) for d in r.deps}
    chosen: set[str] = set()

    def closure(name: str) -> set[str]:  # name, the runs to do it reads, and a checkpoint's readers to do
        out, grow = set(), [name]
        while grow:
            x = grow.pop()
            if x in todo and x not in out and x not in chosen:
                out.add(x)
                grow += by_name[x].deps  # and a checkpoint's readers: the next part may run on another machine
                grow += [r.name for r in runs if x in r.deps and by_name[x].notebook == "pretrain"
                         and not continues(r)]  # a run's next piece: a part of its own
        return out

    for r in runs:
        if r.name not in todo or r.name in chosen or r.name in inputs:
            continue
        add = closure(r.name)
        if makespan(runs, seconds, chosen | add, jobs, last) <= budget_s:
            chosen |= add
    return [r.name for r in runs if r.name in chosen], [r.name for r in runs if r.name in todo - chosen]
