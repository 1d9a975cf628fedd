"""The learning curves' tables, figure and decision rules (reproduce/studies/curves/PLAN.md), from records.

Every model trains once on the 8x schedule and is read where each piece ends (arms ``at1`` ... ``at8``, times
``mini``'s 2,240 steps); ``x4`` is a model at the end of the 4x schedule (this study's for alt MDC and ARC and
descriptive CLIP, the ladder's rung for descriptive MDC and ARC, read from its ledger). Differences are paired by
seed: a probe's with the claims' interval (items and seeds, :func:`reproduce.claims.stats.difference`), another
instrument's with Student's t over seeds. The rules, fixed in PLAN.md before any piece was read:

1. **C\\*** per world: 4x where every compared method's mean probe change from the 4x end to ``at8`` lies within
   +-margin (:data:`MARGINS`), else 8x, "still learning"; beside each, "flat, shown" where the change's 90%
   interval lies within +-margin;
2. **transitions** per seed, the first milestone where each criterion (:data:`CRITERIA`) holds, inside the 8x run
   and across the ladder's separate-schedule rungs;
3. **flattened by 8x**: ``at8`` - ``at4`` per method and world: "flat" (90% interval within +-margin), "still
   learning" (95% interval above +margin), else "not resolved", with ``at8`` - ``at6`` beside;
4. **the 1x verdicts** of the claims (:data:`reproduce.claims.claim_rows.CLAIMS`, probe claims): "judged at 1x,
   before the transition" where its world's transition (:data:`CLAIM_TRANSITION`) is first met past 1x in a seed,
   else "judged past it".
"""
from __future__ import annotations

import math
import os

import numpy as np

from mdc.eval.positive_controls import control_margin
from reproduce.claims.claim_rows import CLAIMS
from reproduce.claims.stats import SEED_SD, difference
from reproduce.running import ledger
from reproduce.studies.driver import tables
from reproduce.studies.driver.study import records_of
from reproduce.studies.driver.tables import binding_measures, by_kind, render, repetition_measures, span, write

MINI_STEPS = 2240
MARGINS = {"descriptive": 2.5, "alt": 1.5}  # the claims' probe margins: C*'s rule (PLAN.md)
ORDER = ("at1", "at2", "at3", "at4", "at6", "at8", "x4")  # at1 first: the tables' reference arm
PIECES = ORDER[:-1]
LADDER_RUNGS = ("x0.5", "x1", "x2", "x4")  # the ladder's separate schedules, read across runs
LOSS_TAIL = 224  # a piece's training loss: the mean of its last logged losses (a tenth of mini's steps)
COMPARED = {"descriptive": ("mdc", "arc", "clip"), "alt": ("mdc", "arc")}  # C*'s methods per world
CONTROL_FAILED = "control failed"  # rule 2's binding criterion where that milestone's ARC does not bind (PLAN.md)


def _fewer_repeats(data: dict, arm: str, start: str, seed: int) -> bool:
    rep = data["repetition"]
    return rep[(arm, "mdc", seed)]["views"]["own"]["shape_twice"] <= 0.5 * rep[(start, "mdc", seed)]["views"][
        "own"]["shape_twice"]


def _probe_reaches(data: dict, arm: str, start: str, seed: int) -> bool:
    probe = data["probe descriptive"]
    return mean4(probe[(arm, "mdc", seed)]) >= mean4(probe[(arm, "arc", seed)])


def _binds(data: dict, arm: str, start: str, seed: int) -> bool | str:
    """The positive control first: that milestone's ARC binds."""
    if not binds(data["binding"][(arm, "arc", seed)], "arc"):
        return CONTROL_FAILED
    return binds(data["binding"][(arm, "mdc", seed)])


def _fewer_content_repeats(data: dict, arm: str, start: str, seed: int) -> bool:
    words = data["caption words"]
    first = words[(start, "mdc", seed)]
    return words[(arm, "mdc", seed)]["repeated content"] <= (first["repeated content"] +
                                                              first["references' repeated content"]) / 2


CRITERIA = {  # rule 2: criterion -> (its world (the alt one has no ladder rung), its test at a milestone)
    "MDC names a shape twice at most half as often as at the start": ("descriptive", _fewer_repeats),
    "MDC's probe reaches ARC's": ("descriptive", _probe_reaches),
    "MDC binds (own image - another's at least the control margin, interval above 0)": ("descriptive", _binds),
    "MDC repeats content words at most midway from the start to the references": ("alt", _fewer_content_repeats),
}


# rule 4: the transition a world's probe claims are read against: descriptive, the probe's own; alt has no probe
# criterion (no ARC-relative transition was planned there), so its captions' (met past 1x by construction)
CLAIM_TRANSITION = {"descriptive": "MDC's probe reaches ARC's",
                    "alt": "MDC repeats content words at most midway from the start to the references"}


def steps(arm: str) -> float:
    """An arm's pretraining steps: ``at<m>`` and ``x<m>`` are m times mini's."""
    return MINI_STEPS * float(arm[2:] if arm.startswith("at") else arm[1:])


def loss_measures(res: dict) -> dict:
    tail = res["losses"][-LOSS_TAIL:]
    return {"loss x 100": 100 * float(np.mean(tail)), "images/s": res.get("images_per_s")}


def collect(found: dict, ladder: dict) -> dict[str, dict]:
    """{instrument: {(arm, objective or stage, seed): results}} per world, the ladder's descriptive rungs added
    (``ladder``: its records) as arms of their own name (its x4 the descriptive MDC's and ARC's 4x end); the alt
    captions' measures once, under "caption words", by (arm, objective, seed) (:func:`alt_repetition`)."""
    runs = ledger.for_build(found)
    world = {w: [r for r in runs if r["labels"].get("style") == w] for w in MARGINS}
    rungs = [r for r in ledger.for_build(ladder) if r["labels"].get("arm") in LADDER_RUNGS
             and r["labels"].get("style") == "descriptive"]
    return {"probe descriptive": by_kind(world["descriptive"] + rungs, "linear_probe"),
            "probe alt": by_kind(world["alt"], "linear_probe"),
            "loss descriptive": by_kind(world["descriptive"], "pretrain"),
            "loss alt": by_kind(world["alt"], "pretrain"),
            "binding": by_kind(world["descriptive"] + rungs, "compositionality"),
            "repetition": by_kind(world["descriptive"] + rungs, "repetition"),
            "caption words": alt_repetition(by_kind(world["alt"], "captioning"),
                                            by_kind(world["alt"], "caption_words"))}


def series(data: dict, instrument: str, measures) -> dict:
    """{(arm, MODEL): {measure: {seed: value}}} of one instrument (``measures(results, objective)``)."""
    out: dict = {}
    for (arm, o, s), res in data[instrument].items():
        for k, v in measures(res, o).items():
            out.setdefault((arm, o.upper()), {}).setdefault(k, {})[s] = v
    return out


def alt_repetition(captions: dict, words: dict) -> dict:
    """{(arm, objective, seed): :func:`~reproduce.studies.driver.tables.caption_measures`} of the pretrained alt
    captions (repeated content words and the references', CIDEr-D with its wrong-image control, ...): MDC at the
    references' length (``mdc-ref``), ARC beam 6 (``arc-beam6-ref``)."""
    out = {}
    for (arm, stage, s), cap in captions.items():
        for o, name in (("mdc", "mdc-ref"), ("arc", "arc-beam6-ref")):
            m = tables.caption_measures(cap, words.get((arm, stage, s)), name)
            if m:
                out[(arm, o, s)] = m
    return out


def probe_change(data: dict, world: str, objective: str, later: str, earlier: str) -> dict:
    """``later`` - ``earlier`` of one model's probe mean4, paired by seed, with the claims' 95% and 90% intervals."""
    records = data[f"probe {world}"]
    seeds = sorted({s for (a, o, s) in records if o == objective and a == later and (earlier, o, s) in records})
    out = {"mean": math.nan, "low": math.nan, "high": math.nan, "tost_low": math.nan, "tost_high": math.nan,
           "seeds": len(seeds), "per_seed": []}
    if seeds:
        outcome = tables.PER_ITEM["probe"][0]
        pairs = [(outcome(records[(later, objective, s)], objective), outcome(records[(earlier, objective, s)],
                                                                               objective)) for s in seeds]
        out.update(difference(pairs, seed_sd=SEED_SD))
    return out


def within(d: dict, margin: float) -> bool:
    """A change's 90% interval lies within +-``margin``: flat, shown."""
    return margin > d["tost_high"] and d["tost_low"] > -margin


def c_star(data: dict, world: str) -> tuple[str, list[str]]:
    """Rule 1: (C* with its reason, a table row per compared method)."""
    margin, rows, means = MARGINS[world], [], []
    for o in COMPARED[world]:
        d = probe_change(data, world, o, "at8", "x4")
        shown = ("flat, shown" if within(d, margin) else "flat by its mean, not shown" if abs(d["mean"]) <= margin else "moves")
        rows.append(f"| {world} | {o.upper()} | {span(d['mean'], d['low'], d['high'])} | "
                    f"{span(d['mean'], d['tost_low'], d['tost_high'])} | {d['seeds']} | "
                    f"{'-' if math.isnan(d['mean']) else shown} |")
        means.append(d["mean"])
    if any(math.isnan(m) for m in means):
        return "not yet (a compared method lacks its 4x end or its at8 piece)", rows
    if all(abs(m) <= margin for m in means):
        return f"4x (every mean change within +-{margin})", rows
    gains = ", ".join(f"{o.upper()} {m:+.1f}" for o, m in zip(COMPARED[world], means))
    return f"8x, still learning (change per doubling from 4x to 8x: {gains})", rows


def flattened(data: dict, world: str, objective: str) -> str:
    """Rule 3's row of one method: at8 - at4, its reading, at8 - at6 beside."""
    margin, d, late = MARGINS[world], probe_change(data, world, objective, "at8", "at4"), probe_change(
        data, world, objective, "at8", "at6")
    if math.isnan(d["mean"]):
        word = "-"
    elif within(d, margin):
        word = "flat"
    else:
        word = "still learning" if d["low"] > margin else "not resolved"
    return (f"| {world} | {objective.upper()} | {span(d['mean'], d['low'], d['high'])} | "
            f"{span(d['mean'], d['tost_low'], d['tost_high'])} | {d['seeds']} | {word} | "
            f"{span(late['mean'], late['low'], late['high'])} |")


def mean4(res: dict) -> float:
    return tables.probe_measures(res)["mean4"]




def binds(res: dict, objective: str = "mdc") -> bool:
    """own_swap with the model's own image minus another item's at least the control margin of its items, the
    items' 95% interval above 0 (one seed: the items alone)."""
    own, other = tables.binding_outcomes(res, objective), tables.binding_outcomes(res, objective, "_shuffled")
    d = difference([(own, other)], seed_sd=0.0, tasks=tables.SWAPS)
    return d["mean"] >= 100 * control_margin(binding_measures(res, objective)["items"]) and d["low"] > 0


def first_met(data: dict, criterion: str, arms: tuple[str, ...], start: str, seed: int) -> float | str | None:
    """The steps of the first of ``arms`` (in order) where ``criterion`` holds in ``seed`` (``start``: the arm whose
    value a relative criterion starts from); None where no arm meets it, NaN where a record is missing,
    :data:`CONTROL_FAILED` where the binding criterion reaches a milestone whose ARC does not bind."""
    for arm in arms:
        met = _meets(data, criterion, arm, start, seed)
        if met is None:
            return math.nan
        if met:
            return met if met == CONTROL_FAILED else steps(arm)
    return None


def _meets(data: dict, criterion: str, arm: str, start: str, seed: int) -> bool | str | None:
    """Whether ``criterion`` holds at milestone ``arm`` (against ``start``); None where a measure is not read yet."""
    try:
        return CRITERIA[criterion][1](data, arm, start, seed)
    except KeyError:
        return None


def transitions(data: dict, seeds: list[int]) -> list[str]:
    """Rule 2's table: per criterion and seed, the step it is first met inside the 8x run and across the ladder's
    rungs, and the reading where both seeds agree."""
    def fmt(x):
        if isinstance(x, str):
            return x
        return "not yet read" if x is not None and math.isnan(x) else "not met" if x is None else f"{x:,.0f}"

    rows = []
    for criterion, (world, _) in CRITERIA.items():
        inside = [first_met(data, criterion, PIECES, "at1", s) for s in seeds]
        across = ([first_met(data, criterion, LADDER_RUNGS, "x1", s) for s in seeds] if world == "descriptive"
                  else [math.nan] * len(seeds))
        rows.append(f"| {criterion} | {world} | {' / '.join(fmt(x) for x in inside)} | "
                    f"{' / '.join(fmt(x) for x in across) if world == 'descriptive' else 'no rung'} | "
                    f"{compare(inside, across)} |")
    return rows


def compare(inside: list, across: list) -> str:
    if not inside or any(not isinstance(v, float) or math.isnan(v) for v in inside + across):
        return "-"
    signs = {np.sign(x - y) for x, y in zip(inside, across)}
    return ("seeds disagree" if len(signs) > 1 else {-1: "earlier inside a run", 1: "later inside a run",
                                                      0: "at the same step"}[signs.pop()])


def judged(data: dict, seeds: list[int]) -> list[str]:
    """Rule 4: each claim's 1x verdict (a probe's), before or past its world's probe transition
    (:data:`CLAIM_TRANSITION`) in every seed."""
    past = {}
    for world, criterion in CLAIM_TRANSITION.items():
        met = [first_met(data, criterion, PIECES, "at1", s) for s in seeds]
        past[world] = ("not yet read" if not met or any(x is not None and math.isnan(x) for x in met)
                       else "judged past the transition" if all(x == steps("at1") for x in met)
                       else "judged at 1x, before the transition")
    return [f"| {c.claim} | {c.what} | {CLAIM_TRANSITION[c.a['style']]} | {past[c.a['style']]} |" for c in CLAIMS]


def figure(data: dict, path: str) -> str:
    """Each instrument against steps on a log axis, the milestones as lines: per model the seeds' mean over the
    pieces (dots joined), the 4x ends (squares) and the ladder's other rungs (open circles)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("probe, descriptive: mean4", data["probe descriptive"], lambda r, o: mean4(r)),
              ("probe, alt: mean4", data["probe alt"], lambda r, o: mean4(r)),
              ("binding: own_swap own - another image", data["binding"],
               lambda r, o: binding_measures(r, o)["own - another"]),
              ("descriptive: shape named twice (%)", data["repetition"],
               lambda r, o: 100 * r["views"]["own"]["shape_twice"]),
              ("alt, pretrained captions: repeated content words (%)", data["caption words"],
               lambda r, o: r["repeated content"]),
              ("training loss (last tenth of a piece)", {**data["loss descriptive"], **{
                  (a, f"{o} alt", s): v for (a, o, s), v in data["loss alt"].items()}},
               lambda r, o: loss_measures(r)["loss x 100"] / 100)]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, (title, records, value) in zip(axes.flat, panels):
        models = sorted({o for (_, o, _) in records})
        for i, o in enumerate(models):
            for arms, style, label in ((PIECES, "o-", o.upper()), (("x4",), "s", None), (LADDER_RUNGS[:-1], "o", None)):
                pts = [(steps(a), np.mean(v)) for a in arms
                       if (v := [value(r, o.split()[0]) for (x, m, _), r in records.items() if x == a and m == o])]
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{i}", mfc="none" if style == "o" else f"C{i}", label=label)
        for m in PIECES:
            ax.axvline(steps(m), color="grey", lw=0.5, alpha=0.4)
        ax.set_xscale("log", base=2)
        ticks = sorted({steps(a) for a in PIECES + LADDER_RUNGS})
        ax.set_xticks(ticks, [f"{x / 1000:g}k" for x in ticks], fontsize=7)
        ax.set_xlim(0.8 * steps("x0.5"), 1.25 * steps("at8"))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("pretraining steps (log scale)", fontsize=8)
        if models:
            ax.legend(fontsize=7)
    fig.savefig(path, dpi=150, metadata={"Software": None})
    plt.close(fig)
    return path


def build(records: str, folder: str) -> str:
    """``folder``/tables.md (per instrument a milestone x model table, then the rules' readings) and
    ``folder``/curves.png."""
    found = ledger.read_all(records)
    ladder_folder = records_of("ladder", os.path.dirname(folder))
    ladder = ledger.read_all(ladder_folder) if os.path.isdir(ladder_folder) else {}
    data = collect(found, ladder)
    seeds = sorted({r["labels"]["seed"] for r in ledger.for_build(found) if r["labels"].get("arm") in PIECES})
    probe = lambda w: series(data, f"probe {w}", lambda r, o: tables.probe_measures(r))  # noqa: E731
    loss = lambda w: series(data, f"loss {w}", lambda r, o: loss_measures(r))  # noqa: E731
    alt_words = series(data, "caption words", lambda r, o: r)
    cstar = {w: c_star(data, w) for w in MARGINS}
    head = "| world | model | at8 - 4x end [95%] | [90%] | seeds | flat? |"
    text = write(folder, [
        "# Learning curves: tables",
        "Mean +- SD over seeds (n). Arms at1 ... at8 are one 8x run per model and seed, read where each piece ends "
        f"(times mini's {MINI_STEPS:,} steps); x4 is the end of a 4x schedule (descriptive MDC and ARC: the ladder's "
        "rung, read from its ledger; x0.5 to x2 are the ladder's other rungs). The last column is the change from "
        "at1, paired by seed (the probe's with the claims' interval).",
        render("Probe, descriptive (pooled mean4, its tasks, the grid relation; control: the random-init floor)",
               probe("descriptive"), "mean4", ORDER + LADDER_RUNGS[:-1]),
        render("Probe, alt", probe("alt"), "mean4", ORDER),
        render("Training loss (each piece's last tenth)", {**loss("descriptive"), **{
            (a, f"{m} alt"): v for (a, m), v in loss("alt").items()}}, "loss x 100", PIECES),
        render("Binding (own_swap, own_attribute: own / another item's / no image)",
               series(data, "binding", lambda r, o: {f"{c} {k}": v for c in ("own_swap", "own_attribute")
                                                     for k, v in binding_measures(r, o, c).items() if k != "items"}),
               "own_swap own", ORDER + LADDER_RUNGS[:-1]),
        render("Repetition, descriptive (captions at each scene's true length, %; controls: another scene's image, "
               "the true captions)", series(data, "repetition", lambda r, o: repetition_measures(r)), "shape_twice",
               ORDER + LADDER_RUNGS[:-1]),
        render("Repetition, alt (captions without fine-tuning; CIDEr-D x 100 with another image's references as the "
               "control; repeated content words %, the references' beside)", alt_words, "repeated content", ORDER),
        "## Rule 1: the judged compute C*\n\n" + "\n".join(
            [head, "|---|---|---|---|---|---|"] + cstar["descriptive"][1] + cstar["alt"][1]) + "\n\n" + "\n".join(
            f"- **C\\* {w}: {cstar[w][0]}**" for w in MARGINS),
        "## Rule 2: where each transition happens (steps; seeds " + " / ".join(map(str, seeds)) + ")\n\n" + "\n".join(
            ["| criterion | world | inside the 8x run | across the ladder's rungs | reading |", "|---|---|---|---|---|"]
            + transitions(data, seeds)),
        "## Rule 3: flattened by 8x (probe mean4, at8 - at4 paired by seed)\n\n" + "\n".join(
            ["| world | model | at8 - at4 [95%] | [90%] | seeds | reading | at8 - at6 [95%] |",
             "|---|---|---|---|---|---|---|"] + [flattened(data, w, o) for w in MARGINS for o in COMPARED[w]]),
        "## Rule 4: the README's 1x verdicts in this light\n\n" + "\n".join(
            ["| claim | difference | transition | its 1x verdict |", "|---|---|---|---|"] + judged(data, seeds)),
    ], found, "Seed 0's float16 weights (`mdc.load(<folder>)`)")
    if found:
        figure(data, os.path.join(folder, "curves.png"))
    return text
