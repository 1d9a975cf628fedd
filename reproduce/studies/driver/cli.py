"""A study's command line (``python -m reproduce.studies.<name>``), the same for every study:

    --dry-run                   every run, its state and estimate, the run-hours by arm (the default)
    --time-budget MINUTES       a part: what fits, through the runner, then the steps
    --report                    the tables and the figure, from the records
    --pin COMMIT                pin the plan to a commit (pin.json)
    --plan-seeds                seeds.json from the reference ledger, by reproduce.power

Everything runs from this tree; what decides a result comes from the plan's pin (:mod:`reproduce.studies.driver.pin`):
the keys are computed from its digests and a part executes its exported science. Without a pin a dry run keys the
runs with this tree's code (to plan the study) and a part is refused. ``--machine-factor`` scales the reference
machine's estimates.
"""
from __future__ import annotations

import argparse
import os
import sys

from mdc.base.cli import ArgumentParser, report
from mdc.base.errors import RunError
from reproduce.graph import ROOT
from reproduce.studies.driver import estimate as cost
from reproduce.studies.driver import pin as pinning
from reproduce.studies.driver.part import part, setup, step, todo
from reproduce.studies.driver.study import REFERENCE, Study, read_seeds, run_hours

OUTPUTS = ("out", "records", "weights", "seeds", "reference")  # paths, made absolute


def dry_run(study: Study, args) -> str:
    """Every run with its state and estimate, the run-hours by arm and style, the total against the budget."""
    runs, key, _, est = setup(study, args)
    out = os.path.join(args.out, args.scale)
    need = todo(study, runs, key, out, args.records)
    seconds = {n: s for n, (s, _) in est.items()}
    est.update({r.name: cost.left(r, key[r.name], out, est[r.name]) for r in runs if r.name in need})
    lines = [f"{study.name} study, scale {args.scale}: {len(runs)} runs ({len(runs) - len(need)} recorded), seeds "
             f"{read_seeds(args.seeds)}, ledger {os.path.relpath(args.records, ROOT)}"]
    lines += [f"{'would run' if r.name in need else 'recorded':9s} {r.name}  ({r.notebook}; "
              f"~{est[r.name][0] / 60:.1f} min: {est[r.name][1]})" for r in runs]
    where = "the reference 2-core machine" if args.machine_factor == 1.0 else \
        f"this machine, x {args.machine_factor:g} the reference's (a record that does not say its machine: as is)"
    lines.append(f"\nrun-hours by arm on {where} (one thread a run, two at a time):")
    lines += [f"  {arm:8s} {sum(styles.values()):6.2f}  (" + ", ".join(f"{s} {h:.2f}" for s, h in styles.items())
              + ")" for arm, styles in run_hours(runs, seconds).items()]
    total, left, budget = sum(seconds.values()) / 3600, sum(est[n][0] for n in need) / 3600, study.budget_run_hours
    lines.append(f"total {total:.2f} run-hours ({left:.2f} left, {left / 2:.1f} hours of wall time at two runs at "
                 f"a time); budget about {budget:.0f}: "
                 + ("fits" if total <= budget + 1e-9 else f"exceeds it by {total - budget:.2f}"))
    optional = {a.name for a in study.arms if a.optional}
    if optional and not args.with_optional:
        _, _, _, more = setup(study, argparse.Namespace(**{**vars(args), "with_optional": True}))
        extra = sum(s for n, (s, _) in more.items() if n not in est) / 3600
        lines.append(f"optional arm(s) {', '.join(sorted(optional))}: +{extra:.2f} run-hours, {total + extra:.2f} in "
                     f"all: " + ("fits" if total + extra <= budget + 1e-9 else "does not fit: left out"))
    return "\n".join(lines)


def main(study: Study, argv=None) -> int:
    doc = (getattr(sys.modules.get(f"reproduce.studies.{study.name}"), "__doc__", None) or study.name).strip()
    p = ArgumentParser(prog=f"python -m reproduce.studies.{study.name}", description=doc.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    mode = p.add_mutually_exclusive_group()  # one thing a call does: a dry run never starts a part
    mode.add_argument("--dry-run", action="store_true", help="every run, its estimate and state (the default)")
    mode.add_argument("--time-budget", type=float, metavar="MINUTES", help="execute a part of this many minutes")
    mode.add_argument("--report", action="store_true", help="the tables and the figure from the records")
    mode.add_argument("--pin", metavar="COMMIT", help="pin the plan to this commit (writes pin.json)")
    mode.add_argument("--plan-seeds", action="store_true", help="write seeds.json from the reference (power)")
    mode.add_argument("--step", metavar="RUN", help="one step of the plan as a part runs it (on the pin's science)")
    p.add_argument("--out", help="run folders: OUT/<scale>/ (default reproduce/runs/<study>)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--machine-factor", type=float, default=1.0, metavar="F", help="this machine's run time over "
                   "the reference machine's: scales the estimates from the reference ledger and from records made on "
                   "other machines (a part measures it and writes it into its records)")
    p.add_argument("--scale", default="mini", choices=("mini", "smoke"), help="the registry profile")
    p.add_argument("--records", help="the study's ledger (default its folder's records/)")
    p.add_argument("--reference", help="the reference run's ledger (estimates, seeds)")
    p.add_argument("--seeds", help="the seed plan (default its folder's seeds.json)")
    p.add_argument("--weights", help="seed 0's float16 weights (default its folder's weights/)")
    p.add_argument("--with-optional", action="store_true", help="the optional arms too")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    defaults = dict(out=os.path.join(ROOT, "reproduce", "runs", study.name), records=study.path("records"),
                    weights=study.path("weights"), seeds=study.path("seeds.json"), reference=REFERENCE)
    for k in OUTPUTS:
        setattr(args, k, os.path.abspath(getattr(args, k) or defaults[k]))
    args.pinned = pinning.read_pin(study) if os.path.isfile(study.path("pin.json")) else None
    return report(lambda: _main(study, args), p, debug=args.debug)


def _main(study: Study, args) -> int:
    if args.machine_factor <= 0:
        raise RunError(f"--machine-factor must be > 0, got {args.machine_factor}")
    if args.time_budget is not None and args.time_budget <= 0:
        raise RunError(f"--time-budget must be > 0 minutes, got {args.time_budget}")
    if args.step:  # one step, as a part runs it: on the pin's science, recorded with its digests
        runs, key, by_name, _ = setup(study, args, estimates=False)
        with pinning.science(study, args.pinned or pinning.read_pin(study)) as science:
            print(step(study, by_name[args.step], key[args.step], args, science))
    elif args.pin:
        print(pinning.write_pin(study, args.pin))
    elif args.report:
        print(study.report(args.records, study.path() if args.records == study.path("records") else
                           os.path.dirname(args.records.rstrip(os.sep))))
    elif args.time_budget:
        return part(study, args)
    elif args.plan_seeds:
        if study.plan_seeds is None:
            raise RunError(f"the {study.name} study has no seed plan to write here (its seeds.json is committed)")
        print(study.plan_seeds(args))
    else:
        print(("" if args.pinned else f"{study.name}: no pin yet: the dry run of this tree's code; a part needs a "
               "pin\n") + dry_run(study, args))
    return 0
