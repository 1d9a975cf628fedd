"""Learnability of the synthetic world on a CPU: which (world, model, budget) lets the paper's
questions be answered before any method is compared (the study behind the `mini` profile).

    python -m reproduce.studies.learnability --configs s32 s48 --seeds 0 1 2 [--out DIR]
    python -m reproduce.studies.learnability --summary      # the table from the runs so far
    python -m reproduce.studies.learnability --probe runs/my-mini-mdc   # any run of mdc.train, e.g. of mini's preset
    python -m reproduce.studies.learnability --summary --write reproduce/studies/learnability  # into the record

Every run is real (:mod:`reproduce.studies.learnability_runs`): synthetic shards -> ``mdc.train.train``
(the pretraining loop of the notebooks) -> ``mdc.eval.probe`` (CLIP_benchmark's linear probe) on the
synthetic probe tasks at the run's resolution. Beside each trained encoder the same architecture is probed at its
random initialisation (same seed): the *gap* is trained minus random-init top-1, in points.
Wall and CPU time (this process and its data workers) are recorded per run. Rows go to the working
folder (``--out``); ``--write`` adds the ones the committed record lacks to it, and it only ever grows.

The rule that picks `mini` is fixed in ``RULE`` (:mod:`reproduce.studies.learnability_rules`, with the
candidates and the decisions they take) before any method is compared, and it is the same for the
three objectives: the cheapest configuration in which MDC, ARC and CLIP each beat their random-init
encoder by at least ``min_gap`` points on the mean of the four informative tasks, with a seed
standard deviation of that gap below ``max_std``, within ``max_minutes`` of wall time per
pretraining run on 2 CPU cores. This module is the study's command line.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

from reproduce.studies import learnability_rules as rules
from reproduce.studies import learnability_runs as runs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="*", default=[], choices=sorted(rules.CONFIGS))
    p.add_argument("--objectives", nargs="+", default=["mdc", "arc", "clip"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--out", default=os.path.join("runs", "studies", "learnability"))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="with --timing: torch.compile the loss")
    p.add_argument("--summary", action="store_true", help="print the table of the runs so far")
    p.add_argument("--ceiling", action="store_true", help="the supervised ceiling of the configurations' encoders")
    p.add_argument("--relation", action="store_true", help="with --ceiling: a relation head beside the four")
    p.add_argument("--lr", type=float, nargs="*", help="learning rates in place of the recipe's, each in turn")
    p.add_argument("--probe", nargs="+", metavar="RUN", help="probe checkpoints (or run folders) trained "
                                                                "elsewhere beside their random init")
    p.add_argument("--timing", action="store_true", help="time the configurations (on an otherwise idle machine)")
    p.add_argument("--write", metavar="DIR", help="with --summary: add the runs' rows to the record in DIR (rows "
                                                  "it lacks, appended) and write its decisions from it")
    args = p.parse_args(argv)
    if args.summary and args.write:
        added = rules.merge_records(args.out, args.write)
        with open(os.path.join(args.write, "decision.json"), "w") as f:
            json.dump(rules.decide(args.write), f, indent=1)
        with open(os.path.join(args.write, "ceiling_decision.json"), "w") as f:
            json.dump(rules.decide_ceiling(args.write), f, indent=1)
        print(rules.summary(args.write))
        print(f"rows added to {args.write}: " + (", ".join(f"{name} {n}" for name, n in added.items())
                                                  or f"none ({args.out} holds no record)"))
        return
    if args.probe:
        for path in args.probe:
            row = runs.probe_checkpoint(path, args.out)
            print(json.dumps({k: row[k] for k in ("checkpoint", "objective", "seed", "gap_mean4")} |
                             {"gap": {t: round(row["gap"][t], 1) for t in rules.RULE["tasks"]}}), flush=True)
        return
    if args.ceiling:
        for seed in args.seeds:
            for name in args.configs:
                for lr in args.lr or [None]:
                    row = runs.ceiling_run(name, seed, args.out, lr, args.relation)
                    print(json.dumps({k: row[k] for k in ("config", "seed", "wall_s", "final_loss", "gap_mean4")}
                                     | {"lr": row["recipe"]["lr"]}), flush=True)
        return
    if args.timing:
        for name in args.configs:
            print(json.dumps(runs.timing(name, args.out, workers=args.workers, compile=args.compile,
                                         objectives=args.objectives)), flush=True)
        return
    for seed in args.seeds:
        for name in args.configs:
            for objective, lr in itertools.product(args.objectives, args.lr or [None]):
                row = runs.run(name, objective, seed, args.out, args.workers, lr)
                print(json.dumps({k: row[k] for k in ("config", "objective", "seed", "wall_s", "gap_mean4")}),
                      flush=True)
    print(rules.summary(args.out))


if __name__ == "__main__":
    main()
