"""The compute ladder's tables, figure and decision rules (reproduce/studies/ladder/PLAN.md), from records.

Every quantity is a linear contrast of one instrument's outcome over (arm, objective) models, per seed
(:func:`contrast`): the gap MDC - ARC at a rung, a side arm minus its learned-position partner, and the gap's
slope per doubling of steps, sum_r w_r (MDC_r - ARC_r) with w_r = (x_r - mean x) / Sxx, x_r = log2(rung). Its 95%
interval is the claims' (:func:`reproduce.claims.stats.difference`: items and seeds) where the instrument records
per-item outcomes (the probe's four tasks; own_swap's two subsets), Student's t over seeds otherwise (the
repetition step); one seed gives the mean alone. The rules, fixed in PLAN.md before any rung was read:

- the slope **closes** the gap where its interval lies on the side that shrinks the reference's 1x gap (its sign
  from seeds.json), **holds** where it lies within +-m (seeds.json's margin m, half the reference's seed SD),
  else it is not resolved; beside it the first rung whose gap interval contains 0, and where it closes, the
  extrapolated crossover 2^(-a / b) of the fit a + b log2(rung) to the rungs' mean gaps;
- binding verdicts need the positive control: the 1x ARC binds (own - another item's image at least
  :func:`mdc.eval.positive_controls.control_margin` of own_swap's items, its interval above 0), else they read
  "control failed"; whether each rung's ARC binds is printed beside its gap;
- rotary at 4x closes the probe gap where the rotary-x4 gap's interval reaches 0; rotary and dense context
  repeat less where their shape_twice minus the learned-position MDC's lies below -m (dense: more above +m);
- the 4x captions stand beside the words study's 1x paper arm (another package digest): no verdict.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from mdc.eval.positive_controls import control_margin
from reproduce import registry
from reproduce.cost import paper_cost
from reproduce.running import ledger
from reproduce.studies.driver import tables
from reproduce.studies.driver.study import records_of
from reproduce.studies.driver.tables import (binding_measures, by_kind, render, repetition_measures, span, verdict,
                                             write)

ORDER = ("x1", "x0.5", "x2", "x4", "dense", "rotary-x1", "rotary-x4")  # x1 first: the tables' reference arm
RUNG_ARMS = ("x0.5", "x1", "x2")  # the ladder whose slope the rules judge (PLAN.md)
OPTIONAL_RUNGS = ("x4",)  # run only with --with-optional: shown beside the ladder, outside its slope
PARTNER = {"dense": "x1", "rotary-x1": "x1", "rotary-x4": "x4"}  # a side arm's learned-position rung
MINI_STEPS = 2240
PAPER_RUN = "pretrain/vit-b-32-mdc-descriptive-s0"  # the crossover's GPU-hours: one paper-profile MDC pretraining
# instrument: (notebook, the gap's measure, seeds.json's quantity)
INSTRUMENTS = {"probe": ("linear_probe", "mean4", "probe gap (mean4)"),
               "binding": ("compositionality", "own_swap own", "binding gap (own_swap)"),
               "repetition": ("repetition", "shape_twice", "repetition gap (shape named twice)")}
# instrument: its outcome per record and seed (per item where it records them: tables.PER_ITEM; else points)
OUTCOMES = {"probe": tables.PER_ITEM["probe"], "binding": tables.PER_ITEM["binding"],
            "repetition": (lambda res, objective: 100 * res["views"]["own"]["shape_twice"],)}


def rung(arm: str) -> float | None:
    """An arm's multiple of mini's steps where it is a rung (x0.5 ... x2, optional x4), else None."""
    return float(arm[1:]) if arm.startswith("x") else None


def contrast(data: dict, instrument: str, terms: list[tuple[float, str, str]]) -> dict:
    """:func:`reproduce.studies.driver.tables.contrast` of one instrument's records (module docstring)."""
    return tables.contrast(data[instrument], terms, *OUTCOMES[instrument])


def slope(data: dict, instrument: str, arms: list[str]) -> tuple[dict, float]:
    """The gap's slope per doubling over ``arms`` (the rungs), per seed with every rung, and the fit's mean
    intercept at 1x over the same seeds (NaN with fewer than two rungs)."""
    if len(arms) < 2:
        return contrast(data, instrument, [(1, "no rung", "mdc")]), math.nan
    x = np.log2([rung(a) for a in arms])
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    b = contrast(data, instrument, [t for wi, a in zip(w, arms) for t in ((wi, a, "mdc"), (-wi, a, "arc"))])
    mean_gap = contrast(data, instrument, [t for a in arms for t in ((1 / len(arms), a, "mdc"),
                                                                     (-1 / len(arms), a, "arc"))])
    return b, mean_gap["mean"] - b["mean"] * float(x.mean())


def judge_slope(b: dict, reference_gap: float, margin: float) -> str:
    if math.isnan(b["low"]) or math.isnan(reference_gap):
        return "not resolved"
    if (b["low"] > 0) if reference_gap < 0 else (b["high"] < 0):
        return "closes"
    return "holds" if -margin < b["low"] and b["high"] < margin else "not resolved"


def plan_rows(folder: str) -> dict:
    """{quantity: (the reference's 1x gap, margin m)} from seeds.json's power rows (the plan's numbers)."""
    path = os.path.join(folder, "seeds.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {r["quantity"]: (r["gap"], r["margin m"]) for r in rows if r["test"] == "holds"}


def paper_hours() -> float:
    """GPU-hours of the paper profile's :data:`PAPER_RUN` at its dry run's MFU."""
    run = next(r for r in registry.build("paper", 1) if r.name == PAPER_RUN)
    return paper_cost.plan([run], "out", {})[0].gpu_hours(paper_cost.MFU)


def gap_table(data: dict, instrument: str, rows: dict) -> str:
    """Per arm MDC - ARC (a side arm against its partner rung's ARC) and, for a side arm, its MDC minus the
    partner's; then the slope, its verdict, the first rung whose interval holds 0 and any crossover."""
    _, measure, quantity = INSTRUMENTS[instrument]
    ref_gap, m = rows.get(quantity, (math.nan, math.nan))
    models = {(a, o) for (a, o, _) in data[instrument]}
    ladder = [a for a in RUNG_ARMS if {(a, "mdc"), (a, "arc")} <= models]
    beyond = [a for a in OPTIONAL_RUNGS if {(a, "mdc"), (a, "arc")} <= models]
    head = f"| arm | steps | {measure}: MDC - ARC [95%] | seed SD (n) | side arm MDC - partner's MDC [95%] | verdict |"
    lines = [f"### {instrument.capitalize()} gap (points)", "", head, "|---|---|---|---|---|---|"]
    first = None
    for a in ladder + beyond + [a for a in PARTNER if (a, "mdc") in models]:
        partner = PARTNER.get(a, a)
        g = contrast(data, instrument, [(1, a, "mdc"), (-1, partner, "arc")])
        side = contrast(data, instrument, [(1, a, "mdc"), (-1, partner, "mdc")]) if a in PARTNER else None
        if first is None and a in ladder and g["low"] <= 0 <= g["high"]:
            first = a
        note = side_verdict(instrument, a, g, side, m)
        if instrument == "binding" and rung(a):
            note = f"ARC {control_binds(data, a)}"
        sd = "-" if math.isnan(g["sd"]) else f"{g['sd']:.2f}"
        moved = span(side["mean"], side["low"], side["high"]) if side else ""
        lines.append(f"| {a} | {MINI_STEPS * rung(partner):,.0f} | {span(g['mean'], g['low'], g['high'])} | "
                     f"{sd} ({g['seeds']}) | {moved} | {note} |")
    b, a0 = slope(data, instrument, ladder)
    word = judge_slope(b, ref_gap, m)
    if instrument == "binding" and control_binds(data, "x1") != "binds":
        word = "control failed (the 1x ARC does not bind)"
    lines += ["", f"Slope per doubling of steps over {', '.join(ladder) or 'no rung'} ({b['seeds']} seeds with every "
                  f"rung): {span(b['mean'], b['low'], b['high'])}; the reference ledger's 1x gap (the seed plan's "
                  f"input, not the x1 rung's) {ref_gap:+.1f}, margin m = {m:.2f}: **{word}**. First rung whose gap interval contains 0: {first or 'none'}."]
    if word == "closes" and b["mean"]:
        x, hours = 2 ** (-a0 / b["mean"]), paper_hours()
        lines.append(f"Extrapolated crossover (assumes the multiple carries across scale): {x:.1f}x mini's steps "
                     f"({MINI_STEPS * x:,.0f} steps); {x * hours:,.0f} GPU-hours as the paper profile's {PAPER_RUN} "
                     f"(its dry run: {hours:,.0f} at MFU {paper_cost.MFU}).")
    return "\n".join(lines)


def side_verdict(instrument: str, arm: str, gap: dict, side: dict | None, m: float) -> str:
    if arm == "rotary-x4" and instrument == "probe":
        return "closes the probe gap at 4x" if gap["high"] >= 0 else "not resolved"
    if side is None or instrument != "repetition" or not arm.startswith(("rotary", "dense")):
        return ""
    if side["high"] < -m:
        return "repeats less"
    return "repeats more" if arm == "dense" and side["low"] > m else "not resolved"


def control_binds(data: dict, arm: str) -> str:
    """Whether ``arm``'s ARC binds: own_swap own - another item's image (Student's t over seeds) at least the
    control margin of own_swap's items, its interval above 0."""
    found = {s: binding_measures(r, "arc") for (a, o, s), r in data["binding"].items() if a == arm and o == "arc"}
    if not found:
        return "not resolved"
    items = min(m["items"] for m in found.values())
    return verdict({s: m["own - another"] for s, m in found.items()}, 100 * control_margin(items), 0.0,
                   ("binds", "does not bind"))


def series_of(runs: list[dict]) -> tuple[dict, dict]:
    """({instrument: {(arm, objective, seed): results}}, {table: {(arm, model): {measure: {seed: value}}}})."""
    return {i: by_kind(runs, nb) for i, (nb, *_) in INSTRUMENTS.items()}, tables.series_of(
        runs, ("repetition", "repetition", lambda res, objective: repetition_measures(res)),
        lambda arm, stage, sets: [((arm, f"{stage} {name}"), name) for name in ("mdc-ref", "arc-beam6-ref")])


def figure(data: dict, path: str) -> str:
    """Per instrument: MDC and ARC (and the rotary MDC) against steps on a log axis, mean with Student's t 95%
    interval over seeds; beneath, the gap MDC - ARC with its interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), sharex=True, constrained_layout=True)
    for col, instrument in enumerate(INSTRUMENTS):
        top, bottom = axes[0, col], axes[1, col]
        lines, gaps = plotted(data, instrument)
        for label, points in lines.items():
            _bars(top, points, label)
        _bars(bottom, gaps, "MDC - ARC")
        top.set_ylim(*ylim(lines.values()))
        bottom.set_ylim(*ylim([gaps], gap=True))
        bottom.axhline(0, color="grey", lw=0.8)
        top.set_title(f"{instrument}: {INSTRUMENTS[instrument][1]} (points)", fontsize=9)
        top.legend(fontsize=7)
        bottom.set_ylabel("MDC - ARC, 95% interval", fontsize=8)
        bottom.set_xscale("log", base=2)
        steps = ticks(lines, gaps)
        bottom.set_xticks(steps, [f"{x:,.0f}" for x in steps])
        bottom.set_xlabel("pretraining steps (log scale)", fontsize=8)
    fig.savefig(path, dpi=150, metadata={"Software": None})
    plt.close(fig)
    return path


def plotted(data: dict, instrument: str) -> tuple[dict[str, list], list]:
    """The figure's points for ``instrument``: per line (MDC, ARC, the rotary MDC) its (steps, contrast) for the
    arms with seeds, a side arm at its partner rung's steps; and the gap MDC - ARC where both have seeds."""
    rungs = RUNG_ARMS + OPTIONAL_RUNGS
    lines = {}
    for objective, arms, label in (("mdc", rungs, "MDC"), ("arc", rungs, "ARC"),
                                   ("mdc", ("rotary-x1", "rotary-x4"), "MDC rotary")):
        pts = [(MINI_STEPS * rung(PARTNER.get(a, a)), contrast(data, instrument, [(1, a, objective)])) for a in arms]
        lines[label] = [(x, c) for x, c in pts if c["seeds"]]
    gaps = [(MINI_STEPS * rung(a), contrast(data, instrument, [(1, a, "mdc"), (-1, a, "arc")])) for a in rungs]
    return lines, [(x, c) for x, c in gaps if c["seeds"]]


def ticks(lines: dict[str, list], gaps: list) -> list[int]:
    """The step axis's ticks: the judged rungs and every step a point is drawn at (an optional rung before its gap)."""
    return sorted({MINI_STEPS * rung(a) for a in RUNG_ARMS} | {x for pts in (*lines.values(), gaps) for x, _ in pts})


def ylim(series, gap: bool = False) -> tuple[float, float]:
    """A panel's y-range: its means and interval ends (and a gap's 0) within what its measure can be (a share in
    points, or a ``gap``, a difference of two), padded; a wider interval (two seeds: Student's t of one degree of
    freedom) runs off the panel instead of pressing every other point into a line."""
    bound = (-100.0, 100.0) if gap else (0.0, 100.0)
    ends = [v for pts in series for _, c in pts for v in (c["mean"], c["low"], c["high"]) if not math.isnan(v)]
    ends += [0.0] * gap  # the line a gap is read against
    low, high = max(min(ends, default=bound[0]), bound[0]), min(max(ends, default=bound[1]), bound[1])
    pad = 0.05 * ((high - low) or 1.0)
    return low - pad, high + pad


def _moved(data: dict, instrument: str, arm: str, objective: str) -> tuple[float, float, float]:
    """An arm's model minus the same model at x1: the gap table's contrast and interval (none with one seed)."""
    c = contrast(data, instrument, [(1, arm, objective), (-1, "x1", objective)])
    return c["mean"], c["low"], c["high"]


def _bars(ax, points: list, label: str) -> None:
    if points:
        x, c = zip(*points)
        m = np.array([p["mean"] for p in c])
        err = np.nan_to_num([[p["mean"] - p["low"] for p in c], [p["high"] - p["mean"] for p in c]])
        ax.errorbar(x, m, yerr=err, fmt="o-", capsize=3, label=label)


def build(records: str, folder: str) -> str:
    """``folder``/tables.md (per instrument its rung x model table and its gap table with the verdicts, the 4x
    captions, the fine-tuning check, kept weights, the records' package) and ``folder``/ladder.png."""
    found = ledger.read_all(records)
    runs = ledger.for_build(found)
    data, series = series_of(runs)
    words = records_of("words", os.path.dirname(folder))  # the 1x captions' reference (paper arm)
    for (arm, model), values in (series_of(ledger.for_build(ledger.read_all(words)))[1]["captions"].items()
                                 if os.path.isdir(words) else ()):
        if arm == "paper" and model.split(" ")[0] in ("pretrained", "finetuned"):
            series["captions"][("words 1x", model)] = values
    rows = plan_rows(folder)
    reps = [r["views"]["references"] for r in data["repetition"].values()]
    ceiling = (f"the true captions (the ceiling): shape named twice {100 * reps[0]['shape_twice']:.1f}%, pairs exist "
               f"{100 * reps[0]['pairs_exist']:.1f}%" if reps else "no record yet")
    text = write(folder, [
        "# The compute ladder: tables",
        "Mean +- SD over seeds (n); differences paired by seed with their 95% intervals; the verdicts follow the "
        "decision rules of reproduce/studies/ladder/PLAN.md. Arms x0.5 to x2 are the rungs (times mini's "
        f"{MINI_STEPS:,} steps) whose slope is judged; dense pairs with x1. The optional arms (x4, rotary-x1 with x1, "
        "rotary-x4 with x4) appear only where they were run (--with-optional; the budget left them out).",
        render("Probe (pooled mean4, its tasks, the grid relation; control: the random-init floor)", series["probe"],
               "mean4", ORDER, deltas=lambda a, m: _moved(data, "probe", a, m.lower())),
        gap_table(data, "probe", rows),
        render("Binding (own_swap, own_attribute: own / another item's / no image)", series["binding"],
               "own_swap own", ORDER, deltas=lambda a, m: _moved(data, "binding", a, m.lower())),
        gap_table(data, "binding", rows),
        render(f"Repetition (descriptive captions at each scene's true length, %; controls: another scene's image "
               f"and {ceiling})", series["repetition"], "shape_twice", ORDER),
        gap_table(data, "repetition", rows),
        render("Captions at 4x (alt world; CIDEr-D x 100 with another image's references as the control; repetition "
               "in %), beside the words study's 1x paper arm", series["captions"], "CIDEr", ("words 1x", "x4"))
        if any(arm == "x4" for arm, _ in series["captions"])
        else "### Captions at 4x\n\nNot run: an optional arm (the budget, PLAN.md).",
    ], found, "Seed 0's float16 weights (`mdc.load(<folder>)`)")
    if found:
        figure(data, os.path.join(folder, "ladder.png"))
    return text
