"""Where each method learns: learning curves to 8x of ``mini``'s steps on one schedule, in both caption worlds (its
plan: reproduce/studies/curves/PLAN.md).

One run a model and seed, trained on the 8x schedule (17,920 steps of 64, 1,792 warm-up steps, cosine to the end)
in pieces that end at :data:`MILESTONES` (1, 2, 3, 4, 6 and 8 times ``mini``'s 2,240 steps): the piece
``pretrain/curves-at<m>-<objective>-<style>-s<seed>`` continues the piece before it from its checkpoint
(``mdc.train``'s ``stop_at`` and ``resume_from``: together the run trained in one go, bit for bit), so each piece
fits a part and is read where it ends. Per piece:

- descriptive MDC and ARC: the probe, the binding part (the reference's ``own`` part on :data:`BINDING_SUITES`, own /
  another item's / no image) and the step ``repetition/<arm>-<objective>-descriptive-s<seed>`` (shapes named twice at
  each scene's true length, :func:`~reproduce.studies.driver.steps.repetition_step`);
- descriptive CLIP: the probe;
- alt MDC and ARC: the probe of each, and ``captioning/curves-<arm>-alt-pretrained-s<seed>`` (the reference's
  captioning run without fine-tuning: CIDEr-D at the references' length with another image's references) with the
  step ``caption_words/...`` (repeated content words).

Beside the pieces, the end points of the 4x schedule the ladder did not keep (arm ``x4``, its first half the piece
``x4-half``, read by nothing else): MDC and ARC on alt and CLIP on descriptive, read the same way. The descriptive MDC and ARC at 4x on their own schedule are the ladder's.
The training loss at each milestone is each piece's own (its record's ``losses``). The tables, figure and rules:
:mod:`reproduce.studies.curves.report`.
"""
from __future__ import annotations

import json
import os

from reproduce import power
from reproduce.graph import Run
from reproduce.registry import run_name
from reproduce.studies.driver.steps import caption_words, repetition, repetition_step
from reproduce.studies.driver.study import (Arm, Study, arm_runs, captioned, descriptive_models, pretrain_run, reader,
                                            records_of, repetition_run)
from reproduce.studies.curves import report
from reproduce.studies.curves.report import MARGINS

MILESTONES = (1, 2, 3, 4, 6, 8)  # times mini's steps where a piece ends, on the 8x schedule
SCHEDULE = 8  # the pieces' schedule, times mini's steps
BINDING_SUITES = ("own_attribute", "own_sugarcrepe/swap_att", "own_sugarcrepe/swap_obj")
OWN_ITEMS = 60  # images a file, as the words study's power rule asked (59 for own_swap, MDC - ARC)
REPETITION_SCENES = {"mini": 300, "smoke": 8}
# seconds of a step with no record: the ladder's repetition steps (MDC 22-42 s, ARC 14-20 s at factors 0.7-1.3) and
# caption-word steps (under a second), rounded up
STEP_SECONDS = {"mdc": 60.0, "arc": 30.0, "caption_words": 15.0}
AFFORDED = 2  # seeds of MDC and ARC a world the budget affords (PLAN.md: the dry run)
KEPT = ("at1", "at2", "at4", "at8")  # seed 0's pieces kept in float16


def pieces(objectives: tuple[str, ...], style: str) -> tuple[Arm, ...]:
    """The arms of one schedule's pieces, each continuing the one before."""
    arms: list[Arm] = []
    for m in MILESTONES:
        arms.append(Arm(f"at{m:g}", objectives, (style,), steps=SCHEDULE, stop=m, after=arms[-1] if arms else None))
    return tuple(arms)


def end_point(objectives: tuple[str, ...], style: str) -> tuple[Arm, Arm]:
    """The 4x schedule in two pieces (each fits a part), read where it ends."""
    half = Arm("x4-half", objectives, (style,), steps=4, stop=2)
    return half, Arm("x4", objectives, (style,), steps=4, stop=4, after=half)


ARMS = (pieces(("mdc", "arc", "clip"), "descriptive") + pieces(("mdc", "arc"), "alt")
        + end_point(("mdc", "arc"), "alt") + end_point(("clip",), "descriptive"))
UNREAD = ("x4-half",)  # pieces read by their next piece alone


def descriptive_runs(ref: dict, arm: Arm, objective: str, seed: int, scale: str) -> list[Run]:
    """A descriptive model: CLIP's pretraining and probe; MDC's and ARC's with their binding part and repetition
    step."""
    if arm.name in UNREAD or objective == "clip":
        pre = pretrain_run("curves", ref[run_name("pretrain", seed, objective, "descriptive")],
                           ref["data/descriptive"], arm, objective, "descriptive", seed)
        probe = reader(ref[run_name("probe", seed, objective, "descriptive")], f"probe/{pre.name.split('/', 1)[1]}",
                       pre)
        return [pre] if arm.name in UNREAD else [pre, probe]
    pre, probe, binding = descriptive_models("curves", ref, arm, objective, seed, BINDING_SUITES, OWN_ITEMS)
    return [pre, probe, binding, repetition_run("curves", pre, REPETITION_SCENES[scale])]


def alt_runs(ref: dict, arm: Arm, pre: dict[str, Run], seed: int) -> list[Run]:
    """The alt models' probes, and their captions without fine-tuning with the caption-word step."""
    if arm.name in UNREAD:
        return []
    probes = [reader(ref[run_name("probe", seed, o, "alt")], f"probe/{r.name.split('/', 1)[1]}", r)
              for o, r in pre.items()]
    return probes + captioned("curves", ref[run_name("captioning", seed, "alt")], arm, pre, "pretrained")


CHAINS = (("descriptive", "mdc"), ("descriptive", "arc"), ("alt", None), ("descriptive", "clip"))


def chain(run: Run, by_name: dict) -> int:
    """Which of :data:`CHAINS` (a world's model, or the alt pair with their captions) a run belongs to; the 4x
    end points and the data after them."""
    if run.labels.get("arm", "").startswith("x") or run.notebook == "data":
        return len(CHAINS)
    style, objective = run.labels.get("style"), run.labels.get("objective")
    if objective is None and run.deps and run.deps[0] in by_name:
        style, objective = by_name[run.deps[0]].labels.get("style"), by_name[run.deps[0]].labels.get("objective")
    return next(i for i, (s, o) in enumerate(CHAINS) if s == style and o in (None, objective))


def study_runs(scale: str = "mini", plan: dict | None = None, with_optional: bool = False) -> list[Run]:
    """Every run: the data, then seed by seed one model's pieces after another (descriptive MDC, ARC, the alt
    pair, CLIP) and the 4x end points, so that a part carries few runs to the next."""
    runs = arm_runs("curves", ARMS, descriptive_runs, alt_runs)(scale, plan, with_optional)
    by_name = {r.name: r for r in runs}
    data = [r for r in runs if r.notebook == "data"]
    rest = [r for r in runs if r.notebook != "data"]
    return data + sorted(rest, key=lambda r: (r.labels.get("seed", 0), chain(r, by_name)))


# ------------------------------------------------------------------------------------------------ the seed plan
def plan_seeds(args) -> str:
    """Seeds per model before any piece is read: :func:`reproduce.power.change_rows` for C*'s rule (the probe's
    change over a doubling, flat within the world's margin) with the ladder's per-seed change of each method's
    mean4 from 2x to 4x (separate schedules, as C* compares them) as the seed SD; at least 2 (the issue's floor)
    and at most :data:`AFFORDED` for MDC and ARC, 1 for CLIP. Writes ``args.seeds``; returns the table."""
    ladder = records_of("ladder", os.path.dirname(os.path.dirname(args.seeds)))
    rows = []
    for objective in ("mdc", "arc"):
        change = power.probe_changes(ladder, "probe/ladder-x2-{o}-descriptive-s{s}",
                                     "probe/ladder-x4-{o}-descriptive-s{s}", objective)
        for style, margin in MARGINS.items():
            rows += power.change_rows(f"{objective.upper()} probe change, 2x to 4x (margin of {style})", change,
                                      margin, AFFORDED)
    asked = max(r["seeds"] or power.SEARCH for r in rows)
    k = max(2, min(asked, AFFORDED))
    plan = {"about": "python -m reproduce.studies.curves --plan-seeds: reproduce.power's seeds for C*'s rule, from the "
                     "ladder's 2x-to-4x probe changes before any piece was read", "default": k,
            "seeds": {"clip": 1}, "rows": rows}
    with open(args.seeds, "w") as f:
        json.dump(plan, f, indent=1, default=float)
        f.write("\n")
    head = f"| quantity | test | seeds | mean change | seed SD | margin m | seeds for 80% | power at {AFFORDED} |"
    return "\n".join([head, "|---|---|---|---|---|---|---|---|"] + [
        f"| {r['quantity']} | {r['test']} | {r['reference seeds']} | {r['change']:.1f} | {r['seed SD']:.2f} | "
        f"{r['margin m']:.1f} | {r['seeds'] or 'never'} | {100 * r['power']:.0f}% |" for r in rows]) + (
        f"\n\nseeds: {k} for MDC and ARC in each world (power asks {asked}, the budget affords {AFFORDED}), 1 for "
        f"CLIP")


STUDY = Study(
    "curves", ARMS, study_runs, steps={"repetition": repetition_step, "caption_words": caption_words},
    step_code=(repetition,), step_seconds=STEP_SECONDS,
    keep=lambda run: not run.labels.get("seed") and run.labels.get("arm") in KEPT,
    report=report.build, plan_seeds=plan_seeds, budget_run_hours=50.0)
