"""A part of a study, from main on its pin's science (:mod:`~reproduce.studies.driver.pin`): the runs that fit
``--time-budget`` minutes through the runner into ``OUT/<scale>/`` with the study's ledger, then its steps
(:func:`step`), each in a process of one thread on the pinned export. Checkpoints stay while a step or a kept model
(``Study.keep``: float16 in ``weights/<run>/``) reads them; a recorded pretraining run whose checkpoint a step needs
is trained again, and where it drifts into another model its readers are recorded again (:func:`drifted`). One
package digest a ledger (:func:`one_digest`); main's definitions must reproduce every record's key
(:func:`unreproduced`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from mdc.base.errors import RunError
from mdc.eval.results import checkpoint_id, read_results
from reproduce import pretrained, registry
from reproduce.graph import resolve, run_dir
from reproduce.running import ledger, runner
from reproduce.running.bookkeeping import Book, another_checkpoint
from reproduce.running.folders import is_done
from reproduce.studies.driver import estimate as cost
from reproduce.studies.driver import pin as pinning
from reproduce.studies.driver.study import Study, plan_keys, read_seeds, reads_checkpoint, readers, with_deps


def setup(study: Study, args, estimates: bool = True) -> tuple[list, dict, dict, dict]:
    """(runs, keys, runs by name, estimates: {name: (seconds, source)}, empty unless ``estimates``); the keys of the
    pin's science where the study has one (``args.pinned``)."""
    runs = study.runs(args.scale, read_seeds(args.seeds), args.with_optional)
    key, by_name = plan_keys(study, runs, args.pinned), {r.name: r for r in runs}
    ref = {r.name: r for r in registry.build(args.scale, 1)}  # the evaluation sets' sizes, for the cost model
    reference = args.reference if args.scale == "mini" else None  # the reference ledger is mini's
    steps = {kind: study.step_estimate for kind in study.steps}
    est = {r.name: cost.on_machine(cost.estimate(r, by_name, args.records, reference, steps, args.scale, ref),
                                   args.machine_factor) for r in runs} if estimates else {}
    return runs, key, by_name, est


def todo(study: Study, runs: list, key: dict, out: str, records: str) -> set[str]:
    """The runs a part would execute: the runner's (:class:`Book`), the steps not recorded, and the recorded
    pretraining runs whose checkpoints a step to do reads and are gone."""
    real = [r for r in runs if r.notebook not in study.steps]
    book = Book(real, {r.name: key[r.name] for r in real}, out, records, True, lambda *_: None)
    steps = [r for r in runs if r.notebook in study.steps]
    need = set(book.needed) | {r.name for r in steps if not ledger.done(records, r.name, key[r.name])}
    return need | {r.deps[0] for r in steps if r.name in need and reads_checkpoint(r)
                   and r.deps[0] not in book.in_folder}


def one_digest(records: str, package: str) -> None:
    """A study runs on one package digest (its pin's): refuse a part when the ledger holds records of another."""
    digests = {r["code"]["package"] for r in ledger.read_all(records).values()}
    if digests - {package}:
        raise RunError(f"the ledger {records} holds records of package {', '.join(sorted(digests))}, the pin's is "
                       f"{package}: the study's records come from one package digest (pin that code, or start "
                       f"another ledger with --records)")


def unreproduced(runs: list, key: dict, records: str) -> list[str]:
    """The recorded runs whose key main's definitions (with the pin's digests) do not give: their parameters, or a
    run they read, are not the ones recorded."""
    return [r.name for r in runs if (ledger.read(records, r.name) or {}).get("key", key[r.name]) != key[r.name]]


def part(study: Study, args) -> int:
    """One part within ``--time-budget`` minutes (module docstring) on the pin's exported science; 1 where a run or
    step failed."""
    args.pinned = pin = args.pinned or pinning.read_pin(study)  # refused, naming the fix, without one
    one_digest(args.records, pin["package"])
    deadline, began = time.monotonic() + 60 * args.time_budget, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs, key, by_name, est = setup(study, args)
    if wrong := unreproduced(runs, key, args.records):
        raise RunError(f"main's definitions of the {study.name} study do not reproduce {len(wrong)} recorded key(s) "
                       f"({', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''}): restore the parameters they "
                       f"were recorded with; a study's records come from one plan")
    out = os.path.join(args.out, args.scale)
    if not todo(study, runs, key, out, args.records):
        print(f"{study.name}: 0 runs left (build the tables: --report)")
        return 0
    with pinning.science(study, pin) as science:
        return _part(study, args, science, deadline, began, (runs, key, by_name, est))


def _part(study: Study, args, science: str, deadline: float, began: str, plan: tuple) -> int:
    runs, key, by_name, est = plan
    out = os.path.join(args.out, args.scale)
    seconds = {n: cost.left(by_name[n], key[n], out, e)[0] for n, e in est.items()}  # a begun run: its steps left

    def choose() -> tuple[set, list, list]:  # what to do, what fits, the recorded pretraining runs it retrains
        drifted(study, runs, key, out, args.records)
        need = todo(study, runs, key, out, args.records)
        start, left = cost.select(runs, seconds, need, max(0.0, deadline - time.monotonic()), args.jobs,
                                  last=tuple(study.steps))
        print(f"{study.name}: {len(start)} runs fit this part, {len(left)} left for later")
        return need, start, [n for n in start if by_name[n].notebook == "pretrain" and n not in need]

    need, start, again = choose()
    for name in again:
        _retrain(by_name[name], runs, out, science)
    if again:  # a retrain that made another checkpoint has its readers to do again
        need, start, again = choose()
    real = with_deps([by_name[n] for n in start if by_name[n].notebook not in study.steps and n not in again],
                     by_name)
    outcome = {}
    if real:
        order = cost.priority(runs, seconds, {r.name for r in real if r.name in start})  # the selection's
        settings = runner.RunSettings(jobs=args.jobs, records=args.records, keep_checkpoints=True, profile=args.scale,
                                      machine_factor=args.machine_factor, science=science,  # the selection: budget
                                      priority=order, again=[r.name for r in real if r.name in need])
        outcome = runner.run_all(real, out, settings)
    steps = [r for r in runs if r.notebook in study.steps and r.name in need]  # this part's, and any now ready
    failed = run_steps(study, steps, (key, est), args, deadline, set(start), science)
    keep(study, runs, key, out, args.records, args.weights)
    free(study, runs, key, out, args.records, args.weights)
    failed += [n for n, o in outcome.items() if o["status"] not in ("ok", "skipped", "left")]
    if measured := cost.machine_ratio(outcome, est, args.machine_factor):
        print(f"{study.name}: runs took {measured[0]:.2f} x their reference estimates (median of {measured[1]}): "
              f"this machine's --machine-factor, now in the {len(measured_in(args.records, runs, began, measured[0]))}"
              f" records this part wrote")
    print(f"{study.name}: {len(todo(study, runs, key, out, args.records))} runs left (0: build the tables, --report)")
    return 1 if failed else 0


def measured_in(records: str, runs: list, since: str, factor: float) -> list[str]:
    """Write ``factor`` as the machine factor of the records of ``runs`` finished at or after ``since`` (this part's,
    which carry the ``--machine-factor`` it was given); returns their names."""
    names = []
    for r in runs:
        record = ledger.read(records, r.name)
        if record and record.get("finished", "") >= since:
            record["machine_factor"] = round(factor, 3)
            ledger.save(records, record)
            names.append(r.name)
    return names


def _retrain(run, runs: list, out: str, science: str) -> None:
    """Train a recorded pretraining run again (its folder gone) outside the ledger, for a reader the part chose."""
    runner.run_all(with_deps([run], {r.name: r for r in runs}), out, runner.RunSettings(records=None, science=science))
    if not os.path.isfile(os.path.join(run_dir(out, run), "results.json")):
        raise RunError(f"{run.name} was trained again for its readers but made no checkpoint")


def drifted(study: Study, runs: list, key: dict, out: str, records: str) -> list[str]:
    """A recorded pretraining run trained again on another CPU can make another checkpoint: where a done folder holds
    one, its record and its readers' are removed, to be made again from it (one run's readers read one model)."""
    gone = []
    for r in (r for r in runs if r.notebook == "pretrain" and ledger.done(records, r.name, key[r.name])):
        ids = is_done(out, r, key[r.name]) and another_checkpoint(out, records, r)
        if not ids:
            continue
        removed = [n for n in [r.name, *readers(runs, r.name)] if ledger.read(records, n)]
        for name in removed:
            os.remove(ledger.path(records, name))
        print(f"{study.name}: {r.name} was trained again into checkpoint {ids[1]}, not the recorded {ids[0]}: "
              f"records removed, to be made again from it: {', '.join(removed)}")
        gone += removed
    return gone


def _ready(step, out: str, records: str) -> bool:
    """A step's input is here: its pretraining run's recorded checkpoint, or its run's finished folder."""
    if not reads_checkpoint(step):
        return all(os.path.isfile(os.path.join(out, d, "results.json")) for d in step.deps[:1])
    wanted = (ledger.read(records, step.deps[0]) or {}).get("results", {}).get("checkpoint_id")
    return wanted is not None and _checkpoint(os.path.join(out, step.deps[0])) == wanted


def run_steps(study: Study, steps: list, plan: tuple[dict, dict], args, deadline: float, chosen: set[str],
              science: str) -> list[str]:
    """The steps whose input is here, ``--jobs`` at a time (:func:`step`; ``plan``: the keys and the estimates):
    those the part ``chosen`` and those reading a run folder (seconds long; the folders do not outlive the session)
    always, others while they fit; returns those that failed."""
    key, est = plan
    out = os.path.join(args.out, args.scale)
    run, used = [], 0.0
    for s in (s for s in steps if _ready(s, out, args.records)):
        spend = 0.0 if not reads_checkpoint(s) or s.name in chosen else est[s.name][0]
        if used + spend <= args.jobs * max(0.0, deadline - time.monotonic()):
            run.append(s)
            used += spend

    def one(s) -> str | None:
        try:
            print(f"{study.name}: step {s.name}: ok\n{step(study, s, key[s.name], args, science)}", flush=True)
        except RunError as e:
            print(f"{study.name}: step {s.name}: failed\n{str(e)[-1500:]}", flush=True)
            return s.name
        return None

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        return [n for n in pool.map(one, run) if n]


def step(study: Study, run, key: str, args, science: str) -> str:
    """Execute one step on the pinned ``science`` in a process of one thread (:mod:`~.compute`): its results file in
    its folder, then its record with the pin's digests (``args.pinned``); returns the step's output."""
    out = os.path.join(args.out, args.scale)
    folder = run_dir(out, run)
    params, results = os.path.join(folder, "parameters.json"), os.path.join(folder, "results.json")
    os.makedirs(folder, exist_ok=True)
    with open(params, "w") as f:
        json.dump(resolve(run.params, out), f, indent=1)
    started = time.perf_counter()
    with open(os.path.join(folder, "log.txt"), "w+") as log:
        proc = subprocess.Popen([sys.executable, "-P", pinning.COMPUTE, "step", study.name, run.notebook, params,
                                 results, args.pinned["steps"]], cwd=science, stdout=log, stderr=subprocess.STDOUT,
                                env={**pinning.science_env(science), "OMP_NUM_THREADS": "1"})
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time and peak memory
        proc.returncode, seconds = os.waitstatus_to_exitcode(status), time.perf_counter() - started
        log.seek(0)
        text = log.read()
    if proc.returncode:
        raise RunError(f"{run.name}: {text.strip()}")
    written = read_results(results)
    if reads_checkpoint(run) and written["checkpoint_id"] != (ledger.read(args.records, run.deps[0]) or {}).get(
            "results", {}).get("checkpoint_id"):
        raise RunError(f"{run.name}: {written['checkpoint']} is not the checkpoint the record of {run.deps[0]} names")
    outcome = {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024,
               "device": ledger.cpu_device(), "machine_factor": args.machine_factor}
    ledger.write(args.records, run, key, written, out, args.pinned["steps"], outcome, args.pinned["package"])
    return text


def keep(study: Study, runs: list, key: dict, out: str, records: str, weights: str) -> list[str]:
    """The runs ``study.keep`` names in float16 under ``weights/<run name>/``, once recorded and while their
    checkpoints are here; returns the folders written."""
    written = []
    for r in (r for r in runs if r.notebook == "pretrain" and study.keep(r)):
        record, target = ledger.read(records, r.name), os.path.join(weights, r.name)
        if record is None or record["key"] != key[r.name] or kept(target, record):
            continue
        if _checkpoint(run_dir(out, r)):
            written.append(pretrained.keep_at(run_dir(out, r), target, record))
    return written


def kept(target: str, record: dict) -> bool:
    return pretrained.kept_checkpoint(target) == record["results"].get("checkpoint_id")


def _checkpoint(folder: str) -> str | None:
    try:
        return checkpoint_id(folder)
    except (FileNotFoundError, ValueError):
        return None


def free(study: Study, runs: list, key: dict, out: str, records: str, weights: str) -> None:
    """The runner's :meth:`Book.free_checkpoints`, sparing the pretraining runs a step or a kept model waits on (they
    stay in the graph: a piece they feed that is not recorded keeps the checkpoint it resumes from)."""
    waiting = {r.deps[0] for r in runs if r.notebook in study.steps and reads_checkpoint(r)
               and not ledger.done(records, r.name, key[r.name])}
    waiting |= {r.name for r in runs if r.notebook == "pretrain" and study.keep(r) and ledger.read(records, r.name)
                and not kept(os.path.join(weights, r.name), ledger.read(records, r.name))}
    real = [r for r in runs if r.notebook not in study.steps]
    Book(real, {r.name: key[r.name] for r in real}, out, records, False, lambda *_: None).free_checkpoints(
        frozenset(waiting))
