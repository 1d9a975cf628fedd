"""python -m reproduce: run the paper's experiments and rebuild every table and figure.

    python -m reproduce --list                              # the artifacts and what feeds them
    python -m reproduce --profile smoke                     # everything, a handful of steps (minutes)
    python -m reproduce --profile mini                      # the synthetic world: the seeds the ledger holds
    python -m reproduce --profile mini --seeds 3            # seeds 0-2 of every run
    python -m reproduce --profile mini --seed-plan PLAN.json   # seeds per run from a plan (python -m reproduce.power)
    python -m reproduce --profile mini --only table2 fig4   # just these artifacts (and their runs)
    python -m reproduce --profile mini --dry-run            # what would run, what is done
    python -m reproduce --profile paper --gpus-per-node 8   # GPU node; data paths from MDC_* variables
    python -m reproduce --profile paper --slurm slurm/      # write one sbatch script per run + submit.sh
    python -m reproduce --profile paper --dry-run [--step eager]  # the plan costed: commands, data, GPU-hours
    python -m reproduce --profile mini --seeds 3 --time-budget 150   # a part: stop starting runs after 150 min
    python -m reproduce --profile mini --from-records               # every artifact from the ledger alone
    python -m reproduce --profile mini --seeds 1 --overwrite-figures # let a build with fewer seeds replace figures/

Completed runs are skipped (keyed by notebook, parameters and dependencies); a failed run is
reported at the end and the exit status is non-zero. Every finished run writes a small record into
the ledger (--records; for mini the committed reproduce/records/mini/), from which the tables and
figures are built; a run whose record carries its key is done even with no run folder. A run that writes
a ledger of the repository (reproduce/records/<name>/, mini's default) keeps the float16 weights of every
seed of the descriptive MDC, ARC and CLIP in reproduce/weights/<name>/ (--kept-weights DIR: there instead;
reproduce/pretrained.py). Without --seeds or --seed-plan a build takes the seeds the ledger holds
(reproduce/running/seed_plan.py). A build with fewer seeds of some claim row than the figures folder's claims.csv
holds goes to OUT/<profile>/figures instead, in one line, unless --overwrite-figures. One runner per output
folder: a second one on the same OUT/<profile>/ is refused, naming the first. A bad value prints one line,
``error: --jobs must be >= 1, got 0``, and exits 2; --debug (or MDC_DEBUG=1) shows the traceback.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from mdc.base.cli import ArgumentParser, report
from mdc.base.errors import ConfigError, RunError, must
from reproduce import paper_profile, preflight, registry
from reproduce.cost import cost_table, paper_cost
from reproduce.graph import keys, run_dir
from reproduce.running import bookkeeping, cluster, ledger, runner, seed_plan


def check(args: argparse.Namespace) -> None:
    """Refuse (ConfigError) bad values and contradictory flags before anything runs."""
    for name, least in (("seeds", 1), ("jobs", 1), ("nodes", 1), ("gpus_per_node", 0)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            raise must(name, getattr(args, name), f">= {least}")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise must("mfu", args.mfu, "in (0, 1]")
    if args.step is not None and args.profile != "paper":
        raise ConfigError("step chooses the paper profile's pretraining step; the synthetic profiles train eager",
                          "step")
    if args.nodes > 1 and not (args.gpus_per_node or args.slurm):
        raise ConfigError("nodes needs gpus_per_node or slurm", "nodes", "gpus_per_node", "slurm")
    if args.time_budget is not None and args.time_budget <= 0:
        raise must("time_budget", args.time_budget, "> 0 minutes")
    if args.from_records and (args.run or args.slurm or args.dry_run):
        raise ConfigError("from_records builds the artifacts from the ledger; it runs nothing", "from_records")
    if args.seed_plan and (args.seeds is not None or args.profile == "paper"):
        raise ConfigError("seed_plan gives the seeds of a synthetic profile's runs; give it or seeds, not both",
                          "seed_plan", "seeds")
    if args.run and args.slurm:
        raise ConfigError("run executes one job here; slurm writes job scripts instead", "run", "slurm")
    unknown = [a for a in args.only or () if a not in registry.ARTIFACTS]
    if unknown:
        raise ConfigError(f"only: unknown artifact {unknown[0]!r}; choose from {', '.join(registry.ARTIFACTS)}",
                          "only")


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m reproduce", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--profile", default="mini", choices=[*registry.PROFILES, "paper"])
    p.add_argument("--only", nargs="+", metavar="ARTIFACT", help=f"artifacts: {', '.join(registry.ARTIFACTS)}")
    p.add_argument("--list", action="store_true", help="list the artifacts and their runs, then stop")
    p.add_argument("--dry-run", action="store_true", help="say what would run and what is done")
    p.add_argument("--seeds", type=int, help="seeds per run (0 .. N-1; default: the seeds the ledger holds)")
    p.add_argument("--seed-plan", metavar="FILE", help="seeds per run from a plan (python -m reproduce.power "
                   "--write-plan FILE)")
    p.add_argument("--overwrite-figures", action="store_true",
                   help="build into the figures folder even where its claims.csv holds more seeds than this build")
    p.add_argument("--jobs", type=int, default=1, help="runs executed at the same time")
    p.add_argument("--out", default=os.path.join("reproduce", "runs"), help="runs go to OUT/<profile>/")
    p.add_argument("--figures", help="where tables and figures go (default: figures/ for mini, else OUT/<profile>/figures)")
    p.add_argument("--run", help="execute this one run only (used by the SLURM scripts)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="pretraining runs under torchrun with this many GPUs")
    p.add_argument("--nodes", type=int, default=1, help="nodes per pretraining run (torchrun rendezvous)")
    p.add_argument("--slurm", metavar="DIR", help="write sbatch scripts and submit.sh to DIR instead of running")
    p.add_argument("--step", choices=list(paper_profile.STEPS), help="paper profile: the pretraining step, eager, "
                   "compiled whole, or compiled and replayed as CUDA graphs (the default)")
    p.add_argument("--mfu", type=float, help="paper --dry-run: model FLOPs utilisation assumed for GPU-hours (of an "
                   "H100's bf16 peak; default: the step's measured one, reproduce.cost.paper_cost.STEP_MFU)")
    p.add_argument("--records", help="the ledger: one record per finished run (default: reproduce/records/mini for "
                   "mini, else OUT/<profile>/records)")
    p.add_argument("--from-records", action="store_true", help="build every artifact from the records alone")
    p.add_argument("--time-budget", type=float, metavar="MINUTES",
                   help="start no run that would not finish within MINUTES; the rest is left for the next call")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep checkpoints whose every reader is recorded (default: removed)")
    p.add_argument("--kept-weights", metavar="DIR", help="where every seed of the descriptive MDC, ARC and CLIP "
                   "leaves its weights in float16 (default: reproduce/weights/<name> for a ledger "
                   "reproduce/records/<name>, else none)")
    p.add_argument("--debug", action="store_true", help="on an error, show the traceback (or set MDC_DEBUG=1)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    return report(lambda: _main(args, argv), p, debug=args.debug)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    check(args)

    out = os.path.join(args.out, args.profile)
    figures = args.figures or ("figures" if args.profile == "mini" else os.path.join(out, "figures"))
    records = args.records or (os.path.join("reproduce", "records", "mini") if args.profile == "mini"
                               else os.path.join(out, "records"))
    planned = _planned_runs(args, records)
    richer = None if args.overwrite_figures else seed_plan.richer_figures(figures, planned)
    if richer:
        figures = os.path.join(out, "figures")
        print(f"{richer}: tables and figures go to {figures} instead (--overwrite-figures writes there)")
    runs = registry.with_figures(planned, os.path.abspath(figures), args.profile, os.path.abspath(records))
    runs = registry.select(runs, args.only)
    if args.list:
        for name, artifact in registry.ARTIFACTS.items():
            feeding = [r.name for r in runs if name in r.artifacts and r.notebook != "figures"]
            print(f"{name:10s} {artifact.description}\n{'':10s} {len(feeding)} runs: {', '.join(feeding[:6])}"
                  f"{' ...' if len(feeding) > 6 else ''}")
        return 0
    if args.from_records:
        return _from_records(runs, records, figures, args)
    if args.profile == "paper" and not args.dry_run:
        _preflight(_to_run(runs, records, args))
    if args.slurm:
        path = cluster.slurm_scripts(runs, out, args.slurm, args.profile, gpus=args.gpus_per_node or 8,
                                     nodes=args.nodes, step=args.step)
        print(f"wrote {len(runs)} job scripts; submit them with: bash {path}")
        return 0
    settings = runner.RunSettings(
        jobs=args.jobs, torchrun=(args.gpus_per_node, args.nodes) if args.gpus_per_node else None,
        only={args.run} if args.run else None,  # --run: its dependencies ran as earlier jobs
        records=records, time_budget_s=None if args.time_budget is None else args.time_budget * 60,
        keep_checkpoints=args.keep_checkpoints or bool(args.only),  # --only: a partial graph
        profile=args.profile, kept_weights=_kept_weights(args, records))
    if args.dry_run and args.profile != "paper":  # the paper profile's plan is its cost (below)
        runner.dry_run(runs, out, settings, flops=_flops)
    outcome = {} if args.dry_run else runner.run_all(runs, out, settings)
    failed = {n: o for n, o in outcome.items() if o["status"] not in ("ok", "skipped", "left")}
    if failed:
        _say_failed(failed, runs, out)
        return 1
    left = [n for n, o in outcome.items() if o["status"] == "left"]
    if args.dry_run and args.profile == "paper":  # what it would cost (reproduce/cost/paper_cost.py)
        mfu = args.mfu or paper_cost.STEP_MFU[_step(args)]
        print("\n" + cost_table.render(paper_cost.plan(runs, out, step=args.step), mfu))
    if left:
        print(f"\ntime budget reached: {len(left)} of {len(outcome)} runs left ({', '.join(left[:3])}"
              f"{', ...' if len(left) > 3 else ''}); records in {records}; continue with: "
              f"python -m reproduce {' '.join(shlex.quote(a) for a in argv)}")
    elif args.run and not args.dry_run:  # one job of the graph: the figures come from their own run
        print(f"\n{args.run} complete in {os.path.join(out, args.run)}")
    elif not args.dry_run:
        print(f"\nall {len(outcome)} runs complete; tables and figures in {figures}; records in {records}; "
              f"per-run times in {os.path.join(out, 'runs.csv')}")
    return 0


def _preflight(runs: list) -> None:
    """Refuse (ConfigError, exit 2) before anything starts where the data ``runs`` read is not there."""
    if lines := preflight.missing(runs):
        raise ConfigError("the data of the selected runs is not ready (docs/paper_scale.md, \"Data\"); nothing "
                          "was started:\n" + "\n".join(lines))


def _say_failed(failed: dict, runs: list, out: str) -> None:
    """Each failed run: its status, its log's tail, its last error line and the whole log's path."""
    print(f"\n{len(failed)} run(s) did not complete:", file=sys.stderr)
    by_name = {r.name: r for r in runs}
    for name, o in failed.items():
        log = os.path.join(run_dir(out, by_name[name]), "log.txt")
        cause = preflight.last_error(o["error"])
        print(f"- {name}: {o['status']}\n{o['error'][-800:]}\n  {cause or 'no error line'} (the whole log: {log})",
              file=sys.stderr)


def _step(args: argparse.Namespace) -> str:
    """The paper profile's pretraining step: ``--step``, else CUDA graphs."""
    return args.step or "graphs"


def _to_run(runs: list, records: str, args: argparse.Namespace) -> list:
    """The runs this call would start: ``--run``'s, else those without a record of their key."""
    if args.run:
        return [r for r in runs if r.name == args.run]
    key = keys(runs)
    return [r for r in runs if not ledger.done(records, r.name, key[r.name])]


def _planned_runs(args: argparse.Namespace, records: str) -> list:
    """The profile's runs for ``--seeds``, ``--seed-plan`` or the seeds the ledger holds (one line naming the
    plan where it came from a file or the ledger)."""
    if args.profile == "paper":
        return registry.build("paper", args.seeds or 1, _step(args))
    if args.seeds is not None:
        return registry.build(args.profile, args.seeds)
    if args.seed_plan:
        plan, source = seed_plan.read(args.seed_plan), args.seed_plan
    else:
        plan, source = seed_plan.from_ledger(records, registry.build(args.profile, 1)), f"the ledger {records}"
    if not args.list:
        print(f"seed plan ({source}): {plan.describe()}")
    return seed_plan.apply(registry.build(args.profile, plan.most), plan)


def _kept_weights(args: argparse.Namespace, records: str) -> str | None:
    """Where the runs of reproduce.pretrained.KEEP leave their float16 weights: --kept-weights, else beside a
    ledger of the repository (reproduce/records/<name>: a reference run, mini's by default) in
    reproduce/weights/<name>, else nowhere (a test or an ad-hoc ledger keeps nothing unless asked)."""
    if args.kept_weights:
        return args.kept_weights
    ledgers = os.path.join(ledger.ROOT, "reproduce", "records")
    if os.path.dirname(os.path.abspath(records)) == ledgers:
        return os.path.join(ledger.ROOT, "reproduce", "weights", os.path.basename(os.path.abspath(records)))
    return None


def _seeds_flag(args: argparse.Namespace) -> str:
    return f"--seeds {args.seeds} " if args.seeds else f"--seed-plan {args.seed_plan} " if args.seed_plan else ""


def _flops(run) -> float | None:
    """A synthetic-world run's FLOPs for --dry-run: counted for pretraining runs (reproduce/cost/paper_cost.py)."""
    return paper_cost.synthetic_pretrain_flops(run) if run.notebook == "pretrain" else None


def _from_records(runs: list, records: str, figures: str, args: argparse.Namespace) -> int:
    """Every artifact of ``runs`` built from the ledger alone; a missing record is one line naming it."""
    found = ledger.read_all(records)
    missing = [r.name for r in runs if r.notebook not in bookkeeping.READS_RECORDS_ONLY and r.name not in found]
    if missing:
        raise RunError(f"no record of run {missing[0]} in {records} ({len(missing)} of {len(runs) - 1} missing); "
                       f"make them with: python -m reproduce --profile {args.profile} "
                       f"{_seeds_flag(args)}--records {records}")
    wanted = {r.name: found[r.name] for r in runs if r.notebook not in bookkeeping.READS_RECORDS_ONLY}  # registry order
    files = registry.build_from_records(wanted, figures, only=args.only)
    print(f"{sum(map(len, files.values()))} files of {len(files)} artifacts in {figures}, from "
          f"{len(wanted)} records in {records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
