"""The words study's tables, figure and decision rules (reproduce/studies/words/PLAN.md), from records.

Every table is one instrument (:func:`reproduce.studies.driver.tables.render`): a row per arm and model, each
measure as mean +- SD over seeds (n), its difference from the paper arm paired by seed with a 95% interval, the
controls beside it and, where a rule is fixed, the verdict (:func:`judges`; the rules are PLAN.md's):

- uses its words: S (the shape word's accuracy after the true colour minus another; MDC at mask ratio 0.75, ARC
  teacher-forced); control the paper arm's ARC, margin m_w a tenth of its S;
- binds: own_swap with the own image minus another item's; the mean at least the control margin
  (:func:`mdc.eval.positive_controls.control_margin`) and the interval above 0; control the paper arm's ARC;
- repeats less: repeated content words at the references' length, arm minus paper, beyond m_r (a tenth of the
  paper arm's excess over its references). The row ``t0-1`` (MDC fine-tuned at t ~ U[0, 1]) against the paper's.
"""
from __future__ import annotations

import math
import os

import numpy as np

from mdc.eval.positive_controls import control_margin
from reproduce.running import ledger
from reproduce.studies.driver import tables
from reproduce.studies.driver.tables import by_kind, interval, paired, probe_difference, render, span, verdict, write

MARGIN_FRACTION = 0.10
WORDS_RATIO = {"mdc": "0.75", "arc": "teacher_forced"}
MATCHED = {"mdc": "mdc-ref", "arc": "arc-beam6-ref"}
ORDER = ("paper", "t0-1", "rotary", "hidden", "quarter", "x2", "x4")
T01 = ("finetuned-t0-1", "t0-1", "finetuned")  # the paper arm's MDC fine-tuned at t ~ U[0, 1]: stage -> arm, stage


def words_measures(res: dict, objective: str) -> dict:
    m = res["neighbours"]["measures"]
    ratio = WORDS_RATIO[objective]
    out = {"S": 100 * m["shape_after_colour"][ratio]["own"]["difference"],
           "S, another image": 100 * m["shape_after_colour"][ratio]["other_image"]["difference"]}
    if "colour_given_shape" in m:
        out["colour given shape: visible - hidden"] = 100 * m["colour_given_shape"][ratio]["own"]["difference"]
    for suite, b in (res.get("binding") or {}).items():
        out[f"diagnostic {suite.split('/')[-1]}"] = None if b.get("own") is None else 100 * b["own"]
    return out


def probe_delta(runs: list[dict], arm: str, objective: str) -> tuple[float, float, float]:
    """mean4 of ``arm`` minus the paper arm's, paired by seed, with the claims' 95% interval."""
    return probe_difference(runs, [(arm, objective)], [("paper", objective)])


def probe_gap(runs: list[dict]) -> str:
    """A table: per arm, MDC's mean4 minus ARC's (the arm's ARC, else the paper arm's), and that gap minus the
    paper arm's, paired by seed, with the claims' 95% intervals."""
    arms = {(a, o) for (a, o, _) in by_kind(runs, "linear_probe")}
    lines = ["### Probe gap (mean4: MDC - ARC, points; an arm without ARC against the paper arm's ARC)", "",
             "| arm | MDC - ARC [95%] | gap - the paper arm's gap [95%] |", "|---|---|---|"]
    for arm in sorted({a for a, o in arms if o == "mdc"}, key=lambda a: ORDER.index(a) if a in ORDER else 99):
        arc = (arm, "arc") if (arm, "arc") in arms else ("paper", "arc")
        gap = probe_difference(runs, [(arm, "mdc")], [arc])
        moved = probe_difference(runs, [(arm, "mdc"), ("paper", "arc")], [arc, ("paper", "mdc")])
        lines.append(f"| {arm} | {span(*gap)} | {'(reference arm)' if arm == 'paper' else span(*moved)} |")
    return "\n".join(lines)


def series_of(runs: list[dict]) -> dict[str, dict]:
    """{instrument: {(arm, model): {measure: {seed: value}}}} from the records; the paper arm's MDC fine-tuned at
    t ~ U[0, 1] in a row of its own, the model's own length named so."""
    def captions(arm, stage, sets):
        arm, stage = T01[1:] if stage == T01[0] else (arm, stage)  # its own row, against the paper's fine-tune
        return [((arm, f"{stage} {'own length' if name == 'mdc-None' else name}"), name) for name in sets]

    return tables.series_of(runs, ("neighbours", "words", words_measures), captions)


def judges(series: dict) -> dict:
    """The decision rules (module docstring) as functions of (arm, model), from the controls in ``series``."""
    words, binding, captions = series["words"], series["binding"], series["captions"]
    control = interval(list(words.get(("paper", "ARC"), {}).get("S", {}).values()))
    m_w = MARGIN_FRACTION * control[0] if control[1] > 0 else math.nan  # NaN: the control failed

    def uses(arm, model):
        return verdict(words[(arm, model)].get("S", {}), m_w, words=("uses its words", "does not use its words"))

    def binds(arm, model):
        items = 60 * 2  # own_swap: swap_att and swap_obj at OWN_ITEMS each
        return verdict(binding[(arm, model)].get("own_swap own - another", {}), 100 * control_margin(items), 0.0,
                       ("binds", "does not bind"))

    def repeats(arm, model):
        stage, name = model.split(" ", 1)
        if name not in MATCHED.values() or arm == "paper":
            return ""
        paper = captions.get(("paper", model), {})
        refs = [v for v in paper.get("references' repeated content", {}).values() if v is not None]
        own = [v for v in paper.get("repeated content", {}).values() if v is not None]
        m_r = MARGIN_FRACTION * (np.mean(own) - np.mean(refs)) if own and refs else math.nan
        mean, lo, hi = paired(captions[(arm, model)].get("repeated content", {}), paper.get("repeated content", {}))
        if math.isnan(lo) or math.isnan(m_r):
            return "not resolved"
        return "repeats less" if hi < -abs(m_r) else "repeats more" if lo > abs(m_r) else "not resolved"

    return {"words": uses, "binding": binds, "captions": repeats, "margin_words": m_w}


def figure(series: dict, runs: list[dict], path: str) -> str:
    """One figure: each instrument's headline, arm minus paper with its 95% interval, per arm and model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("probe", "mean4 (points)", "mean4"),
              ("binding", "own_swap: own - another image", "own_swap own - another"),
              ("words", "S: shape after true - another colour", "S"),
              ("captions", "repeated content words, matched length", "repeated content")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), constrained_layout=True)
    for ax, (instrument, label, measure) in zip(axes, panels):
        rows = [k for k in sorted(series[instrument], key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, k[1]))
                if k[0] != "paper" and (instrument != "captions" or k[1].split(" ", 1)[-1] in MATCHED.values())]
        for y, (arm, model) in enumerate(rows):
            if instrument == "probe":
                mean, lo, hi = probe_delta(runs, arm, model.lower())
            else:
                mean, lo, hi = paired(series[instrument][(arm, model)].get(measure, {}),
                                      series[instrument].get(("paper", model), {}).get(measure, {}))
            if not math.isnan(mean):
                ax.errorbar(mean, y, xerr=None if math.isnan(lo) else [[mean - lo], [hi - mean]], fmt="o", capsize=3)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), [f"{a} {m}" for a, m in rows], fontsize=7)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("arm - paper, 95% interval", fontsize=7)
    fig.savefig(path, dpi=150, metadata={"Software": None})
    plt.close(fig)
    return path


def build(records: str, folder: str) -> str:
    """``folder``/tables.md (one table per instrument, the verdicts, the fine-tuning check, ``folder``/weights'
    kept models, the records' package) and ``folder``/words.png from the ledger ``records``; returns the text."""
    found = ledger.read_all(records)
    runs = ledger.for_build(found)
    series = series_of(runs)
    rule = judges(series)
    text = write(folder, [
        "# The words study: tables",
        "Mean +- SD over seeds (n); arm - paper paired by seed, with its 95% interval; the verdicts follow the "
        "decision rules of reproduce/studies/words/PLAN.md.",
        render("Probe (pooled mean4, its tasks, the grid relation; control: the random-init floor)", series["probe"],
               "mean4", ORDER, deltas=lambda a, m: probe_delta(runs, a, m.lower())),
        probe_gap(runs),
        render("Binding (own_swap, own_attribute: own / another item's / no image; MDC's diagnostic in the next table)",
               series["binding"], "own_swap own", ORDER, judge=rule["binding"]),
        render(f"Neighbour use (S in points; m_w = {rule['margin_words']:.1f}, a tenth of the paper ARC's S)",
               series["words"], "S", ORDER, judge=rule["words"]),
        render("Captions (alt world; CIDEr-D x 100 with another image's references as the control; repetition in %)",
               series["captions"], "repeated content", ORDER, judge=rule["captions"]),
    ], found, "Seed 0 of every arm's descriptive MDC and ARC, in float16 (`mdc.load(<folder>)`)")
    if found:
        figure(series, runs, os.path.join(folder, "words.png"))
    return text

