"""Does MDC catch ARC with compute? The compute ladder on the study driver (its plan: reproduce/studies/ladder/PLAN.md).

Rungs (:data:`RUNGS`): MDC and ARC pretrained on descriptive captions at half to twice ``mini``'s 2,240 steps
over the same pairs (warm-up scaled, cosine to the end). Beside them: ``dense``, MDC pretrained at t ~ U[0, 1] at
1x. Optional (``--with-optional``; left out for the budget, PLAN.md): the ``x4`` rung, also on alt captions,
captioned pretrained and fine-tuned as the reference's Table 3, and ``rotary-x1`` and ``rotary-x4``, MDC with rotary
positions (ARC's partner: the rung's ARC). Every descriptive model gets its probe (pooled and grid, the random-init
floor), its binding part (the reference's ``own`` part on :data:`BINDING_SUITES`, own / another item's / no image)
and the step ``repetition/<arm>-<objective>-descriptive-s<seed>`` (:func:`mdc.eval.repetition.descriptive_repetition`:
captions at each scene's true length, with the references and another item's image as controls); every captioning
run the step ``caption_words/...``.
The tables, figure and verdicts: :mod:`reproduce.studies.ladder.report`.
"""
from __future__ import annotations

import glob
import json
import math
import os

import numpy as np

from reproduce import power
from reproduce.graph import ROOT, Run
from reproduce.registry import run_name
from reproduce.studies.driver.steps import caption_words, repetition, repetition_step
from reproduce.studies.driver.study import (Arm, Study, arm_runs, captioned, descriptive_models, records_of,
                                            repetition_run)
from reproduce.studies.ladder import report

BINDING_SUITES = ("own_attribute", "own_sugarcrepe/swap_att", "own_sugarcrepe/swap_obj")
OWN_ITEMS = 60  # images a file, as the words study's power rule asked (59 for own_swap, MDC - ARC)
REPETITION_SCENES = {"mini": 300, "smoke": 8}
# seconds of a step with no record: the repetition instrument on the reference's kept weights, one thread on the
# 2-core machine beside a test suite (MDC 150-180 s, ARC 78-112 s), rounded up
STEP_SECONDS = {"mdc": 180.0, "arc": 120.0, "caption_words": 15.0}
RUNGS = (0.5, 1, 2)  # times mini's steps: the ladder (1/4 and 4 were dropped before any rung was read: the budget)
AFFORDED = 3  # seeds a model the budget affords (PLAN.md: the dry run at 3 seeds, measured on this machine's runs)
STAGES = ("pretrained", "finetuned")  # the 4x captions: as the reference's Table 3 (its cap, its stopping rule)

ARMS = tuple(Arm(f"x{m:g}", ("mdc", "arc"), ("descriptive",), steps=m) for m in RUNGS) + (
    Arm("dense", ("mdc",), ("descriptive",), params=(("t_interval", [0.0, 1.0]),)),
    Arm("x4", ("mdc", "arc"), ("descriptive", "alt"), steps=4, optional=True),
    Arm("rotary-x1", ("mdc",), ("descriptive",), (("positions", "rotary"),), optional=True),
    Arm("rotary-x4", ("mdc",), ("descriptive",), (("positions", "rotary"),), steps=4, optional=True),
)
KEPT = ("x2", "dense", "x4", "rotary-x4")  # seed 0's descriptive models kept in float16 (the top rungs)


def descriptive_runs(ref: dict, arm: Arm, objective: str, seed: int, scale: str) -> list[Run]:
    """Pretraining on descriptive captions, its probe, its binding part and its repetition step."""
    pre, probe, binding = descriptive_models("ladder", ref, arm, objective, seed, BINDING_SUITES, OWN_ITEMS)
    return [pre, probe, binding, repetition_run("ladder", pre, REPETITION_SCENES[scale])]


def caption_runs(ref: dict, arm: Arm, pre: dict[str, Run], seed: int) -> list[Run]:
    """The 4x alt models captioned (the reference's captioning run: pretrained, and fine-tuned at its cap) and
    their caption-word steps."""
    return [r for stage in STAGES for r in captioned("ladder", ref[run_name("captioning", seed, "alt")], arm, pre,
                                                     stage)]


study_runs = arm_runs("ladder", ARMS, descriptive_runs, caption_runs)  # every run, seed by seed


# ------------------------------------------------------------------------------------------------ the seed plan
def _reference_repetition(weights: str, path: str) -> dict:
    """:func:`mdc.eval.repetition.descriptive_repetition` of the reference's kept descriptive MDC and ARC (seeds
    0-7, ``reproduce/weights/mini``): measured once into ``path``, the instrument's seed spread before any rung."""
    if not os.path.isfile(path):
        import mdc
        from mdc.eval.repetition import descriptive_repetition

        out = {os.path.relpath(f, weights): descriptive_repetition(mdc.load(f).eval(), REPETITION_SCENES["mini"], 0)
               for f in sorted(glob.glob(os.path.join(weights, "pretrain", "*-descriptive-s*")))
               if os.path.basename(f).split("-")[0] in ("mdc", "arc")}
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    with open(path) as f:
        found = json.load(f)
    own = {o: [r["views"]["own"] for n, r in sorted(found.items()) if n.split("/")[1].startswith(o)]
           for o in ("mdc", "arc")}
    gaps = [100 * (m["shape_twice"] - a["shape_twice"]) for m, a in zip(own["mdc"], own["arc"])]
    v = sum(100**2 * np.mean([x["shape_twice"] for x in own[o]]) * (1 - np.mean([x["shape_twice"] for x in own[o]]))
            / REPETITION_SCENES["mini"] for o in own)
    return {"per_seed": gaps, "mean": float(np.mean(gaps)), "v_items": float(v)}


def plan_seeds(args) -> str:
    """Seeds per ladder model before any rung is read (:func:`reproduce.power.slope_rows` per instrument over
    :data:`RUNGS` at :data:`AFFORDED` seeds, from the reference):
    the most any resolvable row (at most ``power.MAX_SEEDS``) asks, at least ``power.FLOOR_SEEDS``, and at most
    :data:`AFFORDED`; the other arms the floor. A sensitivity row (the probe's seed SD pooled with the words study's
    arms) decides nothing. Writes ``args.seeds``; returns the table."""
    study = os.path.dirname(args.seeds)
    words = records_of("words", os.path.dirname(study))
    probe = power.probe_gaps(args.reference, "probe/{o}-descriptive-s{s}")

    def slope(name, gap):
        return power.slope_rows(name, gap, RUNGS, AFFORDED)

    rows = slope("probe gap (mean4)", probe)  # own_swap: swap_att and swap_obj, the study's items each
    rows += slope("binding gap (own_swap)", power.binding_gaps(args.reference, 2 * OWN_ITEMS))
    weights = os.path.join(ROOT, "reproduce", "weights", "mini")
    rows += slope("repetition gap (shape named twice)",
                  _reference_repetition(weights, os.path.join(study, "reference_repetition.json")))
    arms = [power.probe_gaps(words, f"probe/words-{a}-{{o}}-descriptive-s{{s}}")
            for a in ("paper", "rotary", "quarter", "x2")]
    pooled = [g - np.mean(d["per_seed"]) for d in (probe, *arms) for g in d["per_seed"]]
    dof = sum(len(d["per_seed"]) - 1 for d in (probe, *arms))
    sensitivity = {**probe, "per_seed": list(np.asarray(pooled) * math.sqrt((len(pooled) - 1) / dof))}
    rows += [{**r, "quantity": "probe gap, seed SD pooled with the words study's arms (sensitivity)"}
             for r in slope("", sensitivity)]
    asked = max([power.FLOOR_SEEDS] + [r["seeds"] for r in rows if "sensitivity" not in r["quantity"]
                                       and r["seeds"] is not None and r["seeds"] <= power.MAX_SEEDS])
    k = min(asked, AFFORDED)
    ladder = {f"{a.name}-{o}": k for a in ARMS if a.name.startswith("x") for o in a.objectives}
    plan = {"about": "python -m reproduce.studies.ladder --plan-seeds: reproduce.power's seeds for the slope of each "
                     "gap per doubling, from the reference before any rung was read", "default": power.FLOOR_SEEDS,
            "seeds": ladder, "rows": rows}
    with open(args.seeds, "w") as f:
        json.dump(plan, f, indent=1, default=float)
        f.write("\n")
    head = (f"| quantity | test | reference seeds | 1x gap | seed SD | slope effect / doubling | margin m | seeds for "
            f"80% | power at {AFFORDED} |")
    return "\n".join([head, "|---|---|---|---|---|---|---|---|---|"] + [
        f"| {r['quantity']} | {r['test']} | {r['reference seeds']} | {r['gap']:.1f} | {r['seed SD']:.2f} | "
        f"{r['slope effect']:.2f} | {r['margin m']:.2f} | {r['seeds'] or 'never'} | {100 * r['power']:.0f}% |"
        for r in rows]) + (f"\n\nseeds: {k} for every rung's MDC and ARC (power asks {asked}, the budget affords "
                          f"{AFFORDED}), {power.FLOOR_SEEDS} for the other arms")


STUDY = Study(
    "ladder", ARMS, study_runs, steps={"repetition": repetition_step, "caption_words": caption_words},
    step_code=(repetition,),
    step_seconds=STEP_SECONDS,
    keep=lambda run: not run.labels.get("seed") and run.labels.get("arm") in KEPT
    and run.labels.get("style") == "descriptive",
    report=report.build, plan_seeds=plan_seeds, budget_run_hours=45.0)
