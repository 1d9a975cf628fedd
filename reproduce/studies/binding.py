"""What MDC needs to bind attributes to objects: Table 2's binding control over the training budget.

On the shipped seed-0 ``mini`` weights (``docs/evaluation.md``, ``python -m reproduce.controls``) ARC picks a
scene's own descriptive caption over the one with two objects' colours swapped (the ``own_*`` swap suites)
and MDC sits at chance, while both detect a replaced colour. This study asks whether that is a property of
the objective at this scale or of the budget. Arms, all seed 0 on the descriptive captions of the ``mini``
profile (``reproduce/presets/mini.json``: 2,240 steps of 64, 224 warm-up steps), the recipe unchanged but for:

- ``mdc-x1``, ``mdc-x2``, ``mdc-x4`` and ``arc-x1``, ``arc-x2``, ``arc-x4``: 1, 2 and 4 times the steps (and the
  warm-up), the same shards seen again; ``x1`` is the shipped weights (``pretrained="synthetic"``), not
  trained again;
- ``mdc-x1-t0.0-1.0``, ``mdc-x1-t0.3-0.8``, ``mdc-x1-t0.4-0.9``: MDC with the other t intervals the reference run
  defines (``reproduce/registry.py:T_INTERVALS``, Table 5), here on descriptive captions.

Each arm is scored as ``reproduce.controls`` scores the shipped weights (same items, evaluation sets of
seed 0, 60 items per suite, 16 paired ELBO copies): accuracy with the item's own image and with another
item's image on the swap suites (``own_sugarcrepe/swap_att``, ``own_attribute``, ``own_sugarcrepe/swap_obj``)
and on ``own_sugarcrepe/replace_att``, the control that the model reads the image at all; MDC's binding
diagnostic (the swapped words masked, the rest visible) beside it. No change to the world or the recipe
follows from it.

    python -m reproduce.studies.binding --work DIR [--arms NAME ...] [--time-budget MINUTES] [--items 60]
    python -m reproduce.studies.binding --report        # binding.md from the records alone

Each arm's record is ``reproduce/studies/binding/<arm>.json`` (commit them as they land): an arm with a
record is not run again, so the study continues over sessions; its training folder lives under
``--work`` only. A 1x run takes about 34 minutes on one core of the reference machine, so ``x4`` needs
about 2.3 hours: ``--time-budget`` starts no arm whose estimate does not fit. Two processes with disjoint
``--arms`` use the two cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from argparse import ArgumentParser
from dataclasses import dataclass

import mdc
from mdc.base import checkpoint as ckpt
from mdc.eval.positive_controls import binding_accuracy
from mdc.eval.suite_scoring import SuiteOptions, score_suite
from mdc.eval.suites import load_suites, shuffled_images, synthetic_data
from reproduce.controls import accuracy
from reproduce.graph import ROOT
from reproduce.registry import T_INTERVALS

RECORDS = os.path.join(ROOT, "reproduce", "studies", "binding")
PRESET = os.path.join("reproduce", "presets", "mini.json")
SWAPS = ("own_sugarcrepe/swap_att", "own_attribute", "own_sugarcrepe/swap_obj")
SUITES = (*SWAPS, "own_sugarcrepe/replace_att")
ONE_X_SECONDS = 2040  # pretrain/mdc-descriptive-s0 of the reference ledger (2,010 s) and its scoring, on one core
DATA = dict(num=143360, style="descriptive", seed=0, image_size=64, shard_size=1000)  # as the mini profile's


@dataclass(frozen=True)
class Arm:
    objective: str  # "mdc" or "arc"
    budget: int = 1  # times mini's steps
    t_interval: tuple[float, float] | None = None  # None: the objective's default

    @property
    def name(self) -> str:
        t = f"-t{self.t_interval[0]:.1f}-{self.t_interval[1]:.1f}" if self.t_interval else ""
        return f"{self.objective}-x{self.budget}{t}"

    @property
    def shipped(self) -> bool:
        return self.budget == 1 and self.t_interval is None


ARMS = tuple([Arm(o, b) for o in ("mdc", "arc") for b in (1, 2, 4)]
             + [Arm("mdc", 1, tuple(t)) for t in T_INTERVALS])


def train_command(arm: Arm, data: str, run_dir: str, preset: str = PRESET) -> list[str]:
    """``python -m mdc.train`` for ``arm``: the mini preset with its steps and warm-up times the budget."""
    with open(os.path.join(ROOT, preset)) as f:
        p = json.load(f)
    cmd = [sys.executable, "-m", "mdc.train", "--objective", arm.objective, "--preset", preset, "--train-data", data,
           "--output-dir", run_dir, "--seed", "0", "--steps", str(p["steps"] * arm.budget),
           "--warmup-steps", str(p["warmup_steps"] * arm.budget), "--save-every", str(p["steps"] // 2),
           "--keep-last", "1", "--no-progress", "--resume"]
    return cmd + (["--t-interval", *map(str, arm.t_interval)] if arm.t_interval else [])


def model_of(arm: Arm, work: str, trainer=None):
    """The arm's model: the shipped weights for the 1x default, else trained under ``work`` (``trainer(cmd)``
    runs the command; default: a subprocess that must succeed); returns (model, training seconds or None)."""
    if arm.shipped:
        return mdc.create_model("mini", objective=arm.objective, pretrained="synthetic"), None
    data = os.path.join(work, "data")
    if not os.path.isdir(data):  # written aside, then renamed: a folder named data is whole
        subprocess.run([sys.executable, "-m", "mdc.world.scenes", "--out", data + ".partial", "--workers", "2",
                        *[x for k, v in DATA.items() for x in (f"--{k.replace('_', '-')}", str(v))]], check=True)
        os.replace(data + ".partial", data)
    run_dir = os.path.join(work, arm.name)
    start = time.perf_counter()
    (trainer or (lambda cmd: subprocess.run(cmd, cwd=ROOT, check=True)))(train_command(arm, data, run_dir))
    return mdc.load(ckpt.latest(run_dir)), round(time.perf_counter() - start, 1)


def score(model, suites: dict, seed: int = 0, num_samples: int = 16) -> dict:
    """Own- and shuffled-image accuracy of ``model`` on each suite (MDC's ELBO, ARC's exact likelihood), and for
    MDC the binding diagnostic on the swap suites."""
    model = model.eval()
    objective = model.config.objective
    variant = "elbo" if objective == "mdc" else "exact"
    transform = mdc.image_transform(model)
    options = SuiteOptions(num_samples=num_samples, seed=seed, elbo_trained_t=False, blind=False, shuffled=True)
    out = {"suites": {}, "binding": {}}
    for name, suite in suites.items():
        scored = score_suite(model, transform, suite, [variant], options)
        out["suites"][name] = {"own": accuracy(scored.scores[variant]),
                               "shuffled": accuracy(scored.scores[f"{variant}_shuffled"]), "items": len(suite.items)}
        if objective == "mdc" and name in SWAPS:
            out["binding"][name] = binding_accuracy(model, transform, suite, shuffled_images(suite, seed))
    return out


def run_arm(arm: Arm, work: str, suites: dict, records: str = RECORDS, trainer=None) -> dict:
    """Train (unless shipped) and score one arm; writes and returns its record."""
    model, seconds = model_of(arm, work, trainer)
    record = {"arm": arm.name, "objective": arm.objective, "budget": arm.budget,
              "t_interval": list(arm.t_interval) if arm.t_interval else None,
              "weights": "shipped seed-0 mini" if arm.shipped else "trained here, seed 0",
              "train_seconds": seconds, **score(model, suites)}
    os.makedirs(records, exist_ok=True)
    with open(os.path.join(records, arm.name + ".json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def pending(arms, records: str, budget_s: float | None) -> tuple[list[Arm], list[Arm]]:
    """(arms to run now, arms left for later): arms without a record, in order, while their estimates fit."""
    todo = [a for a in arms if not os.path.isfile(os.path.join(records, a.name + ".json"))]
    now, used = [], 0.0
    for arm in todo:
        cost = 300 if arm.shipped else ONE_X_SECONDS * arm.budget
        if budget_s is None or used + cost <= budget_s:
            now.append(arm)
            used += cost
    return now, [a for a in todo if a not in now]


def report(records: str = RECORDS) -> str:
    """binding.md: one row per arm with a record, accuracies in % (own / shuffled image)."""
    rows = []
    for arm in ARMS:
        path = os.path.join(records, arm.name + ".json")
        if os.path.isfile(path):
            with open(path) as f:
                rows.append(json.load(f))
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}"  # noqa: E731
    head = ("| arm | " + " | ".join(SUITES) + " | binding (MDC): " + ", ".join(SWAPS) + " |\n|---|"
            + "---|" * (len(SUITES) + 1))
    lines = [f"| {r['arm']} | " + " | ".join(f"{pct(r['suites'][s]['own'])} / {pct(r['suites'][s]['shuffled'])}"
                                             for s in SUITES)
             + " | " + ", ".join(f"{pct(b['own'])} / {pct(b['shuffled'])}" for b in r["binding"].values()) + " |"
             for r in rows]
    missing = [a.name for a in ARMS if a.name not in {r["arm"] for r in rows}]
    return ("Accuracy (%), own image / another item's image, seed 0.\n\n" + head + "\n" + "\n".join(lines)
            + (f"\n\nNot yet run: {', '.join(missing)}.\n" if missing else "\n"))


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", help="scratch folder: shards, training runs, evaluation sets")
    p.add_argument("--arms", nargs="+", choices=[a.name for a in ARMS], help="default: every arm")
    p.add_argument("--time-budget", type=float, help="minutes: start no arm whose estimate does not fit")
    p.add_argument("--items", type=int, default=60, help="items per suite")
    p.add_argument("--records", default=RECORDS)
    p.add_argument("--report", action="store_true", help="write binding.md from the records and stop")
    args = p.parse_args(argv)
    if not args.report:
        if not args.work:
            p.error("--work is required unless --report")
        arms = [a for a in ARMS if not args.arms or a.name in args.arms]
        deadline = None if args.time_budget is None else time.monotonic() + 60 * args.time_budget
        suites = None
        while True:  # the budget is read again before each arm: the arms before it may have run slow
            left = None if deadline is None else deadline - time.monotonic()
            now, later = pending(arms, args.records, left)
            if not now:
                break
            suites = suites or load_suites(synthetic_data(os.path.join(args.work, "evalsets"), 0, 64, args.items),
                                           list(SUITES), attribute_min_count=1)
            print(f"binding: {now[0].name}", flush=True)
            run_arm(now[0], args.work, suites, args.records)
        if later:
            print(f"binding: left for later (over the budget): {' '.join(a.name for a in later)}")
    text = report(args.records)
    with open(os.path.join(os.path.dirname(args.records.rstrip("/")), "binding.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
