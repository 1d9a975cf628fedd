"""Does MDC use its words? The words study's driver (the plan: reproduce/studies/words/PLAN.md).

    python -m reproduce.studies.words --dry-run                         # every run, its estimate, the run-hours
    python -m reproduce.studies.words --time-budget 150 --out DIR       # a part: what fits, through the runner
    python -m reproduce.studies.words --report                          # the tables and the figure, from records
    python -m reproduce.studies.words --plan-seeds                      # seeds.json from the reference (power)

Arms, runs, estimates and the driver's two steps: :mod:`reproduce.studies.words_runs`; tables, figure, seeds and
decision rules: :mod:`reproduce.studies.words_report`. The estimates are the reference machine's;
``--machine-factor`` scales them to this one, as each part measures it (:mod:`reproduce.studies.words_machine`).
A part executes through the runner (:func:`reproduce.running.runner.run_all`) into ``DIR/<scale>/`` with the ledger
``reproduce/studies/words/records/``: only the runs that :func:`reproduce.studies.words_runs.select` fits into the
budget (estimated from the reference ledger, as ``--dry-run`` prints them), two at a time. Then the driver's steps,
each a subprocess of one thread with a record in the same ledger: ``neighbours`` (neighbour use,
``mdc.eval.neighbours``, and for MDC the binding diagnostic) on each descriptive pretraining run's checkpoint, and
``caption_words`` (repeated words) on each captioning run's captions. The checkpoints stay while a step still reads
them; seed 0 of every arm's descriptive MDC and ARC is kept in float16 in
``reproduce/studies/words/weights/<run name>/`` (``mdc.load`` reads it). A step whose checkpoint is gone (a fresh
machine) has its pretraining run trained again first; where this machine's floats make another checkpoint, the run
and its recorded readers are recorded again (:func:`reproduce.studies.words_machine.drifted`). The study runs on
one package digest: a part refuses to start when the ledger holds records of another.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from mdc.base.cli import ArgumentParser, report
from mdc.base.errors import RunError
from mdc.eval.results import checkpoint_id, read_results, write_results
from reproduce import pretrained, registry
from reproduce.graph import ROOT, resolve, run_dir
from reproduce.running import ledger, runner
from reproduce.running.bookkeeping import Book
from reproduce.studies import words_machine as machine
from reproduce.studies import words_report
from reproduce.studies import words_runs as plan
from reproduce.studies.words_runs import STEPS


def _quiet(*_):
    pass


def _setup(args, estimates: bool = True) -> tuple[list, dict, dict, dict]:
    """(runs, keys, runs by name, estimates: {name: (seconds, source)}, empty unless ``estimates``)."""
    runs = plan.study_runs(args.scale, plan.read_seeds(args.seeds), args.with_optional)
    key, by_name = plan.plan_keys(runs), {r.name: r for r in runs}
    ref = {r.name: r for r in registry.build(args.scale, 1)}  # the evaluation sets' sizes, for the cost model
    reference = args.reference if args.scale == "mini" else None  # the reference ledger is mini's
    est = {r.name: machine.on_machine(plan.estimate(r, by_name, args.records, reference, args.scale, ref),
                                      args.machine_factor) for r in runs} if estimates else {}
    return runs, key, by_name, est


def todo(runs: list, key: dict, out: str, records: str) -> set[str]:
    """The runs a part would execute: the runner's (:class:`Book`), the steps not recorded, and the recorded
    pretraining runs a step to do reads whose checkpoints are gone."""
    real = [r for r in runs if r.notebook not in STEPS]
    book = Book(real, {r.name: key[r.name] for r in real}, out, records, True, _quiet)
    need = set(book.needed) | {r.name for r in runs if r.notebook in STEPS and not ledger.done(records, r.name,
                                                                                                key[r.name])}
    for r in runs:
        if r.name in need and r.notebook == "neighbours" and r.deps[0] not in book.in_folder:
            need.add(r.deps[0])
    return need


def dry_run(args) -> str:
    """Every run with its state and estimate, the run-hours by arm and style, the total against the budget."""
    runs, key, _, est = _setup(args)
    need = todo(runs, key, os.path.join(args.out, args.scale), args.records)
    seconds = {n: s for n, (s, _) in est.items()}
    lines = [f"words study, scale {args.scale}: {len(runs)} runs ({len(runs) - len(need)} recorded), seeds "
             f"{plan.read_seeds(args.seeds)}, ledger {os.path.relpath(args.records, ROOT)}"]
    for r in runs:
        state = "would run" if r.name in need else "recorded"
        lines.append(f"{state:9s} {r.name}  ({r.notebook}; ~{seconds[r.name] / 60:.1f} min: {est[r.name][1]})")
    by_arm = plan.run_hours(runs, seconds)
    where = "the reference 2-core machine" if args.machine_factor == 1.0 else \
        f"this machine, x {args.machine_factor:g} the reference's where it has not measured"
    lines.append(f"\nrun-hours by arm on {where} (one thread a run, two at a time):")
    for arm, styles in by_arm.items():
        lines.append(f"  {arm:8s} {sum(styles.values()):6.2f}  (" + ", ".join(
            f"{s} {h:.2f}" for s, h in styles.items()) + ")")
    total, left = sum(seconds.values()) / 3600, sum(seconds[n] for n in need) / 3600
    lines.append(f"total {total:.2f} run-hours ({left:.2f} left, {left / 2:.1f} hours of wall time at two runs at "
                 f"a time); budget about {plan.BUDGET_RUN_HOURS:.0f}: "
                 + ("fits" if plan.fits(total) else f"exceeds it by {total - plan.BUDGET_RUN_HOURS:.2f}"))
    lines += _left_out(args, total)
    return "\n".join(lines)


def _left_out(args, total: float) -> list[str]:
    """What the plan leaves out: the optional arm (with its run-hours) and any run the notebooks cannot make."""
    lines = []
    if not args.with_optional:
        extra = argparse.Namespace(**{**vars(args), "with_optional": True})
        runs, _, _, est = _setup(extra)
        optional = {a.name for a in plan.ARMS if a.optional}
        more = sum(s for n, (s, _) in est.items() if any(f"-{a}-" in n or f"/{a}-" in n for a in optional)) / 3600
        verdict = "fits" if plan.fits(total + more) else "does not fit: left out"
        lines.append(f"optional arm(s) {', '.join(sorted(optional))}: +{more:.2f} run-hours, {total + more:.2f} in "
                     f"all: {verdict}")
    if not plan.t_interval_finetune():
        lines.append("not built: the paper arm's MDC fine-tuned at t ~ U[0, 1] (its captioning run needs a "
                     "finetune_t_interval parameter of notebooks/captioning.ipynb, which it does not have yet)")
    return lines


def one_digest(records: str) -> None:
    """The study runs on one package digest: refuse a part when the ledger holds records of another."""
    digests = {r["code"]["package"] for r in ledger.read_all(records).values()}
    now = ledger.package_digest()
    if digests - {now}:
        raise RunError(f"the ledger {records} holds records of package {', '.join(sorted(digests))}, this tree is "
                       f"{now}: the study's records come from one package digest (restore that code, or start "
                       f"another ledger with --records)")


def part(args) -> int:
    """One part within ``--time-budget`` minutes (module docstring)."""
    one_digest(args.records)
    deadline = time.monotonic() + 60 * args.time_budget
    runs, key, by_name, est = _setup(args)
    out = os.path.join(args.out, args.scale)
    seconds = {n: s for n, (s, _) in est.items()}

    def choose() -> tuple[set, list, list]:  # what to do, what fits, the recorded pretraining runs it retrains
        machine.drifted(runs, key, out, args.records)
        need = todo(runs, key, out, args.records)
        start, left = plan.select(runs, seconds, need, max(0.0, deadline - time.monotonic()), args.jobs)
        print(f"words: {len(start)} runs fit this part, {len(left)} left for later")
        return need, start, [n for n in start if by_name[n].notebook == "pretrain" and n not in need]

    need, start, again = choose()
    for name in again:
        _retrain(by_name[name], runs, out)
    if again:  # a retrain that made another checkpoint has its readers to do again
        need, start, again = choose()
    real = _with_deps([by_name[n] for n in start if by_name[n].notebook not in STEPS and n not in again], by_name)
    outcome = {}
    if real:
        settings = runner.RunSettings(jobs=args.jobs, records=args.records, keep_checkpoints=True,
                                      profile=args.scale)  # no budget of its own: the selection is the budget
        outcome = runner.run_all(real, out, settings)
    steps = [r for r in runs if r.notebook in STEPS and r.name in need]  # this part's, and any other now ready
    failed = _run_steps(steps, est, args, deadline, set(start))
    keep_seed0(runs, key, out, args.records, args.weights)
    _free(runs, key, out, args.records, args.weights)
    failed += [n for n, o in outcome.items() if o["status"] not in ("ok", "skipped", "left")]
    if measured := machine.machine_ratio(outcome, est, args.machine_factor):
        print(f"words: this part's runs took {measured[0]:.2f} times their reference estimates (median of "
              f"{measured[1]}): the --machine-factor of this machine")
    remaining = todo(runs, key, out, args.records)
    if remaining:
        print(f"words: {len(remaining)} runs left; continue with: python -m reproduce.studies.words "
              f"{' '.join(shlex.quote(a) for a in args.argv)}")
    else:
        print("words: every run of the plan is recorded; build the tables with --report")
    return 1 if failed else 0


def _with_deps(runs: list, by_name: dict) -> list:
    """``runs`` and every run they read (recorded or not): the runner takes a whole graph."""
    names: dict[str, None] = {}

    def add(r):
        for d in r.deps:
            add(by_name[d])
        names.setdefault(r.name)

    for r in runs:
        add(r)
    return [by_name[n] for n in names]


def _retrain(run, runs: list, out: str) -> None:
    """Train a recorded pretraining run again (its folder gone) outside the ledger, for a reader the part chose."""
    runner.run_all(_with_deps([run], {r.name: r for r in runs}), out, runner.RunSettings(records=None))
    if not os.path.isfile(os.path.join(run_dir(out, run), "results.json")):
        raise RunError(f"{run.name} was trained again for its readers but made no checkpoint")


def _ready(step, out: str, records: str) -> bool:
    """A step's input is here: its pretraining run's recorded checkpoint, or its captioning run's captions."""
    source = os.path.join(out, step.deps[0])
    if step.notebook == "caption_words":
        return os.path.isfile(os.path.join(source, "predictions.json"))
    wanted = (ledger.read(records, step.deps[0]) or {}).get("results", {}).get("checkpoint_id")
    return wanted is not None and _has_checkpoint(source) and checkpoint_id(source) == wanted


def _run_steps(steps: list, est: dict, args, deadline: float, chosen: set[str]) -> list[str]:
    """The driver's steps whose input is here: those the part ``chosen`` and a caption-word count (seconds long)
    whatever is left, as their inputs do not outlive the run folders; others while their estimates fit what is left.
    ``--jobs`` at a time, each ``python -m reproduce.studies.words --step NAME`` with one thread; returns the ones
    that failed."""
    out = os.path.join(args.out, args.scale)
    ready = [s for s in steps if _ready(s, out, args.records)]
    run, used = [], 0.0
    for s in ready:
        cost = 0.0 if s.notebook == "caption_words" or s.name in chosen else est[s.name][0]
        if used + cost <= args.jobs * max(0.0, deadline - time.monotonic()):
            run.append(s)
            used += cost
    flags = ["--scale", args.scale, "--out", args.out, "--records", args.records]
    if args.seeds != plan.SEEDS:
        flags += ["--seeds", args.seeds]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "reproduce.studies.words", *flags, *(["--with-optional"] * args.with_optional)]

    def one(step) -> str | None:
        done = subprocess.run([*command, "--step", step.name], cwd=ROOT, env=env, capture_output=True, text=True)
        print(f"words: step {step.name}: {'ok' if done.returncode == 0 else 'failed'}\n{done.stdout}"
              + ("" if done.returncode == 0 else done.stderr[-1500:]), flush=True)
        return None if done.returncode == 0 else step.name

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        return [n for n in pool.map(one, run) if n]


def step(args) -> int:
    """Execute one step in this process (``--step NAME``): its results file, then its record."""
    runs, key, by_name, _ = _setup(args, estimates=False)
    run, out = by_name[args.step], os.path.join(args.out, args.scale)
    params = resolve(run.params, out)
    started, cpu = time.perf_counter(), time.process_time()
    results = plan.STEP_FUNCTIONS[run.notebook](params)
    if run.notebook == "neighbours":  # the instrument's own table, for every arm and model, in the part's log
        from mdc.eval.neighbours import format_neighbour_use
        print(f"{run.name}\n{format_neighbour_use(results['neighbours'])}")
    folder = run_dir(out, run)
    source = params.get("checkpoint")
    written = write_results(os.path.join(folder, "results.json"), run.notebook, results, parameters=run.params,
                            checkpoint=source, runtime_s=time.perf_counter() - started)
    if source and written["checkpoint_id"] != (ledger.read(args.records, run.deps[0]) or {}).get(
            "results", {}).get("checkpoint_id"):
        raise RunError(f"{run.name}: {source} is not the checkpoint the record of {run.deps[0]} names")
    outcome = {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu, "peak_mb": 0.0,
               "device": f"cpu: {platform.machine()}, {os.cpu_count()} cores"}
    ledger.write(args.records, run, key[run.name], read_results(os.path.join(folder, "results.json")), out,
                 plan.step_digest(), outcome)
    return 0


def reference_neighbours(weights: str, path: str) -> str:
    """Neighbour use (the ``neighbours`` step's call: 1,000 objects, seed 0) of every kept seed of the reference
    run's descriptive MDC and ARC (``reproduce/weights/mini``), written to ``path``: the instrument's seed spread
    before any arm is read, which the seed plan reads."""
    import mdc
    from mdc.eval.neighbours import neighbour_use

    out = {}
    for folder in sorted(glob.glob(os.path.join(weights, "pretrain", "*-descriptive-s*"))):
        run = os.path.relpath(folder, weights)
        if run.split("/")[1].split("-")[0] in ("mdc", "arc"):
            started = time.perf_counter()
            out[run] = neighbour_use(mdc.load(folder).eval(), n_items=plan.NEIGHBOUR_ITEMS["mini"], seed=0)
            out[run]["seconds"] = round(time.perf_counter() - started, 1)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return f"neighbour use of {len(out)} reference models written to {os.path.relpath(path, ROOT)}"


def keep_seed0(runs: list, key: dict, out: str, records: str, weights: str) -> list[str]:
    """Seed 0 of every arm's descriptive MDC and ARC in float16 under ``weights/<run name>/`` (config.json,
    model.safetensors, kept.json), once recorded and while its checkpoint is here; returns the folders written."""
    written = []
    for r in runs:
        if r.notebook != "pretrain" or r.labels.get("seed") or r.labels.get("style") != "descriptive":
            continue
        record, target = ledger.read(records, r.name), os.path.join(weights, r.name)
        if record is None or record["key"] != key[r.name] or kept(target, record):
            continue
        if os.path.isdir(run_dir(out, r)) and _has_checkpoint(run_dir(out, r)):
            written.append(pretrained.keep_at(run_dir(out, r), target, record))
    return written


def kept(target: str, record: dict) -> bool:
    return pretrained.kept_checkpoint(target) == record["results"].get("checkpoint_id")


def _has_checkpoint(folder: str) -> bool:
    try:
        checkpoint_id(folder)
        return True
    except (FileNotFoundError, ValueError):
        return False


def _free(runs: list, key: dict, out: str, records: str, weights: str) -> None:
    """Remove the checkpoints of pretraining runs whose every reader (the steps and seed 0's kept weights
    included) is recorded: the runner's rule (:meth:`Book.free_checkpoints`) over the runs no step still waits on."""
    waiting = {r.deps[0] for r in runs if r.notebook == "neighbours" and not ledger.done(records, r.name, key[r.name])}
    waiting |= {r.name for r in runs if r.notebook == "pretrain" and not r.labels.get("seed")
                and r.labels.get("style") == "descriptive" and ledger.read(records, r.name)
                and not kept(os.path.join(weights, r.name), ledger.read(records, r.name))}
    real = [r for r in runs if r.notebook not in STEPS and r.name not in waiting]
    Book(real, {r.name: key[r.name] for r in real}, out, records, False, _quiet).free_checkpoints()


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m reproduce.studies.words", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    mode = p.add_mutually_exclusive_group()  # one thing a call does: a dry run never starts a part
    mode.add_argument("--dry-run", action="store_true",
                      help="every run, its estimate and state, the run-hours (the default)")
    mode.add_argument("--time-budget", type=float, metavar="MINUTES", help="execute a part of this many minutes")
    p.add_argument("--out", default=os.path.join("reproduce", "runs", "words"), help="run folders: OUT/<scale>/")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--machine-factor", type=float, default=1.0, metavar="F", help="this machine's run time over "
                   "the reference machine's: scales the estimates from the reference ledger (a part prints it)")
    mode.add_argument("--report", action="store_true", help="the tables and the figure from the records")
    mode.add_argument("--plan-seeds", action="store_true", help="write the seed plan from the reference (power)")
    mode.add_argument("--reference-neighbours", metavar="WEIGHTS", help="neighbour use of the reference's kept "
                      "weights (reproduce/weights/mini), which --plan-seeds reads")
    p.add_argument("--scale", default="mini", choices=("mini", "smoke"), help="the registry profile")
    p.add_argument("--records", default=plan.RECORDS, help="the study's ledger")
    p.add_argument("--reference", default=plan.REFERENCE, help="the reference run's ledger (estimates, seeds)")
    p.add_argument("--seeds", default=plan.SEEDS, help="the seed plan (JSON)")
    p.add_argument("--weights", default=plan.WEIGHTS, help="seed 0's float16 weights")
    p.add_argument("--with-optional", action="store_true", help="the optional arm (x4) too")
    mode.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--debug", action="store_true")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    args.argv = argv
    return report(lambda: _main(args), p, debug=args.debug)


def _main(args) -> int:
    if args.machine_factor <= 0:
        raise RunError(f"--machine-factor must be > 0, got {args.machine_factor}")
    if args.step:
        return step(args)
    if args.reference_neighbours:
        print(reference_neighbours(args.reference_neighbours, words_report.REFERENCE_NEIGHBOURS))
        return 0
    if args.plan_seeds:
        print(words_report.write_seed_plan(args.reference, args.seeds))
        return 0
    if args.report:
        print(words_report.build(args.records, plan.STUDY if args.records == plan.RECORDS else
                                 os.path.dirname(args.records.rstrip(os.sep))))
        return 0
    if args.time_budget is not None:
        if args.time_budget <= 0:
            raise RunError(f"--time-budget must be > 0 minutes, got {args.time_budget}")
        return part(args)
    print(dry_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
