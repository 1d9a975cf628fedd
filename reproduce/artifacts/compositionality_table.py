"""Table 2, compositionality, rebuilt from the run records: per scorer (CLIP cosine, ARC exact, MDC Monte
Carlo and heuristic) each suite's accuracy with its 95% cluster-bootstrap interval, and where scored each
likelihood scorer per token, without the image, what the image adds and image-debiased, with the paper's
row beside ours. :data:`TABLE2_RULES` says how the numbers are computed; they become the notes under
the table."""
from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from mdc.eval.accuracy import over_seeds
from mdc.eval.compositionality import OWN_COLUMNS, TEMPLATE_COLUMNS
from mdc.eval.positive_controls import control_margin, control_status
from reproduce.artifacts.interval_figures import plot_controls
from reproduce.artifacts.tables import cell, paper_cell, paper_table, write_table

# Table 2: the paper's row (reproduce/paper/table2_compositionality.csv) of each scorer
PAPER_ROWS = {"cosine": "CLIP", "exact": "ARC", "elbo": "MDC (Monte Carlo)", "heuristic": "MDC (Heuristic)"}
# How Table 2's numbers are computed (mdc.eval.accuracy, mdc.eval.compositionality): notes under the table
TABLE2_RULES = {
    "ties": "each benchmark's own rule: ARO's argmax takes the first maximum, so a tie with the true caption is "
            "correct on the order tasks (true caption listed first) and an error on VG-Relation and VG-Attribution "
            "(false caption first); SugarCrepe counts pos > neg, a tie is an error",
    "interval": "95% percentile cluster bootstrap (1000 resamples) with the image as the unit: an image's items "
                "(COCO-Order's five captions, SugarCrepe items of one image across sub-files) resample together; "
                "the macro suites' groups are fixed from the full file; over several seeds, the mean over seeds "
                "and the interval of the seed-averaged per-item outcomes (test-item noise only); ↑: the interval "
                "lies above chance",
    "per token": "the score divided by the caption's token count (exact: the caption tokens and [EOT]; elbo, "
                 "heuristic: the caption tokens); cosine is left unchanged",
    "SugarCrepe": "add = {add_att, add_obj}, replace = {replace_att, replace_obj, replace_rel}, swap = {swap_att, "
                  "swap_obj}; the sub-files' items pooled, and (sub-file mean) SugarCrepe's own mean over sub-files",
    "no image": "the same scorer without the image: the model's learned null condition for the MDC scorers of a "
                "model trained with one (cond_drop_prob > 0), else log p(t) estimated as the log-mean-exp of "
                "log p(t | i_k) over K other images of the suite (K in the run's settings, blind_images); the same "
                "noise keys as the score with the image",
    "the image adds": "accuracy with the image minus without it (points), with its paired cluster-bootstrap interval",
    "image-debiased": "log p(t | i) - alpha log p(t) (VisualGPTScore's debiasing), for exact and Monte Carlo only: "
                      "the heuristic without the image reveals in another order",
    "*": "a no-image accuracy at least 10 points from chance: the text alone separates the captions",
    "in-distribution": "the own_* columns: each scene's own descriptive caption (the style the models were trained "
                       "on) edited into its negative (mdc.world.caption_edits); claim 3 is read from these, where "
                       "the control passes",
    "unseen phrasing": "the template suites (ARO / SugarCrepe items written in templates no descriptive model saw); "
                       "they measure how a scorer copes with unfamiliar text as much as compositionality",
    "own / shuffled / no image": "each scorer's cell: its accuracy with the item's own image [interval], then with "
                                 "another item's image (a fixed seeded derangement of the suite's images) and "
                                 "without an image",
    "control": "passed when some scorer's own-image accuracy beats its shuffled-image accuracy by 2 sqrt(0.5 / n) "
               "(rounded up to a whole point, n the column's items; mdc.eval.positive_controls), fixed before any model was "
               "scored; 'control failed': the image does not decide the column for any scorer, which is then no "
               "verdict on any method",
}
SUBSETS = ("sugarcrepe_subsets", "own_subsets")
# The scorers' names in the controls' figure
SHORT_NAMES = {"cosine": "CLIP", "exact": "ARC", "elbo": "MDC\nMonte Carlo", "heuristic": "MDC\nheuristic"}


def _mean(results: list[dict], column: str, variant: str) -> float | None:
    """The mean over seeds of ``variant``'s accuracy in ``column``; None where a seed did not score it."""
    got = [r["columns"][column]["scores"].get(variant, {}).get("accuracy") for r in results if column in r["columns"]]
    return None if not got or any(g is None for g in got) else float(np.mean(got))


def _controls_cell(results: list[dict], column: str, base: str) -> str:
    """" / shuffled / no image" accuracies (%, mean over seeds) beside a scorer's own-image cell."""
    shuffled, blind = _mean(results, column, f"{base}_shuffled"), _mean(results, column, f"{base}_blind")
    pct = lambda x: "-" if x is None or np.isnan(x) else f"{100 * x:.1f}"  # noqa: E731
    return f" / {pct(shuffled)} / {pct(blind)}"


def _control(by_variant: dict, column: str, scorers: list[str]) -> tuple[int, str] | None:
    """The column's items and its control's verdict (mdc.eval.positive_controls.control_status) over the scorers'
    seed means; None where no scorer scored the column."""
    n = next((r["columns"][column]["items"] for v in scorers for r in by_variant[v] if column in r["columns"]), None)
    if n is None:
        return None
    cells = [{"own": _mean(by_variant[v], column, v), "shuffled": _mean(by_variant[v], column, f"{v}_shuffled")}
             for v in scorers]
    return n, control_status(cells, n)


def _control_row(by_variant: dict, columns: list[str]) -> dict:
    """Per column the control's verdict over the scorers' seed means, with the margin (points) for the column's
    items."""
    row = {"method": "control (own - shuffled >= margin, some scorer)", "seeds": ""}
    scorers = [v for v in ("cosine", "exact", "elbo", "heuristic") if v in by_variant]
    for c in columns:
        control = _control(by_variant, c, scorers)
        row[c] = "-" if control is None else f"{control[1]} (margin {100 * control_margin(control[0]):.0f})"
    return row


def _control_panels(by_variant: dict, columns: list[str]) -> list[dict]:
    """Per in-distribution column scored, what :func:`reproduce.artifacts.interval_figures.plot_controls` draws:
    each scorer's accuracy (%, [95% interval]) with its own image, another item's and none, the column's margin
    and control status."""
    panels = []
    for c in (c for c in columns if c in OWN_COLUMNS):
        scorers = [v for v in SHORT_NAMES if any(c in r["columns"] for r in by_variant.get(v, ()))]
        if not scorers:
            continue
        kinds = (("own", ""), ("shuffled", "_shuffled"), ("blind", "_blind"))
        got = {SHORT_NAMES[v]: {kind: _percent(over_seeds(by_variant[v], c, v + suffix)) for kind, suffix in kinds}
               for v in scorers}
        n, status = _control(by_variant, c, scorers)
        panels.append({"column": c, "items": n, "margin": 100 * control_margin(n), "status": status, "scorers": got})
    return panels


def _percent(got) -> tuple[float, float, float] | None:
    return None if got is None else tuple(100 * x for x in got)


def _table2_cell(results: list[dict], column: str, variant: str, baseline: str | None = None,
                 macro: bool = False) -> str:
    """"acc [lo, hi]" (percent; ↑ when the interval lies above chance) of ``variant`` over the seeds'
    results, or the difference from ``baseline`` (points), from their per-item records
    (:func:`mdc.eval.accuracy.over_seeds`); without records "mean ± std" over seeds."""
    got = over_seeds(results, column, variant, baseline, macro=macro)
    if got is None:
        return "-" if baseline or macro else cell([r["table2"].get(variant, {}).get(column) for r in results])
    a, lo, hi = (100 * x for x in got)
    if np.isnan(a):
        return "-"
    if baseline:
        return f"{a:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    return f"{a:.1f} [{lo:.1f}, {hi:.1f}]" + ("↑" if lo > 100 * results[0]["columns"][column]["chance"] else "")


def table2_models(runs: list[dict]) -> list[tuple[dict, dict]]:
    """Table 2's results, one per model, with its labels (but ``part``): the runs of one model's parts (the same
    labels but for ``part``: reproduce.registry.TABLE2_PARTS, disjoint suites) joined into one."""
    models: dict[str, list[dict]] = {}
    for r in runs:
        if r["notebook"] == "compositionality" and "table2" in r["artifacts"]:
            model = json.dumps({k: v for k, v in r["labels"].items() if k != "part"}, sort_keys=True)
            models.setdefault(model, []).append(r)
    joined = []
    for parts in models.values():
        results = {**parts[0]["record"]["results"], "columns": {}, **{s: {} for s in SUBSETS}, "table2": {}}
        for r in parts:
            part = r["record"]["results"]
            twice = set(results["columns"]) & set(part.get("columns", {}))
            if twice:
                raise ValueError(f"{r['name']}: Table 2 column(s) {sorted(twice)} scored by another part as well")
            results["columns"] |= part.get("columns", {})
            for section in SUBSETS:
                results[section] |= part.get(section, {})
            for variant, cells in part["table2"].items():
                results["table2"].setdefault(variant, {}).update(cells)
        joined.append(({k: v for k, v in parts[0]["labels"].items() if k != "part"}, results))
    return joined


def _header(column: str) -> str:
    return f"{column} ({'in-distribution' if column in OWN_COLUMNS else 'unseen phrasing'})"


def _row(label: str, results: list[dict], variant: str, base: str, kind: str, far: set, ref, columns) -> dict:
    """One scorer's row: per column its cell (the scorer's own row: with the controls beside it)."""
    row = {"method": label, "seeds": str(len(results))}
    for c in columns:
        row[_header(c)] = (_table2_cell(results, c, base, f"{base}_blind") if kind == "_adds" else
                           _table2_cell(results, c, variant) + ("*" if c in far else ""))
        if not kind and any(c in r["columns"] for r in results):
            row[_header(c)] += _controls_cell(results, c, base)
        if c in TEMPLATE_COLUMNS:
            row[f"{c} (paper)"] = paper_cell(ref[c]) if ref else "-"
    for c in TEMPLATE_COLUMNS[4:] if kind in ("", "_lengthnorm") else ():
        row[f"{c} (sub-file mean)"] = _table2_cell(results, c, variant, macro=True)
    return row


def table2(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """Table 2: compositionality per scorer (CLIP cosine, ARC exact, MDC Monte Carlo and heuristic), the
    in-distribution columns first, then the unseen-phrasing (template) ones; each scorer's cell the accuracy
    with its 95% interval and its controls (another item's image, no image), a control row under them; where
    scored, each likelihood scorer without the image, what the image adds (with - without, paired interval)
    and image-debiased (rows below it)."""
    paper = {p["method"]: p for p in paper_table(paper_dir, "table2_compositionality")}
    by_variant, far = defaultdict(list), defaultdict(set)  # far: blind cells at least 10 points from chance
    for _, results in table2_models(runs):
        for variant in results["table2"]:
            if variant.endswith(("_blind_lengthnorm", "_debiased_lengthnorm")) or "_shuffled" in variant:
                continue  # per token, only the raw scores; the shuffled-image controls go beside their scorer
            by_variant[variant].append(results)
            far[variant] |= {c for c, e in results.get("columns", {}).items()
                             if e["scores"].get(variant, {}).get("far_from_chance")}
    by_variant |= {f"{v}_adds": by_variant[v] for v in list(by_variant) if f"{v}_blind" in by_variant}
    order = ["cosine", "exact", "elbo", "heuristic", "elbo_trained_t"]
    kinds = ("", "_lengthnorm", "_blind", "_adds", "_debiased")
    columns = [c for c in OWN_COLUMNS if any(c in r["columns"] for rs in by_variant.values() for r in rs)]
    columns += TEMPLATE_COLUMNS

    def split(variant):  # (base, kind)
        kind = next((k for k in kinds[1:] if variant.endswith(k)), "")
        return variant.removesuffix(kind) if kind else variant, kind

    rows = []
    for variant in sorted(by_variant, key=lambda v: (order.index(split(v)[0]) if split(v)[0] in order else 9,
                                                     kinds.index(split(v)[1]))):
        base, kind = split(variant)
        name = "MDC (Monte Carlo, trained t only)" if base == "elbo_trained_t" else PAPER_ROWS.get(base, base)
        label = name + {"": "", "_lengthnorm": " per token", "_blind": ", no image",
                        "_adds": ", the image adds (points)", "_debiased": ", image-debiased"}[kind]
        ref = paper.get(PAPER_ROWS.get(base)) if not kind else None
        rows.append(_row(label, by_variant[variant], variant, base, kind, far[variant], ref, columns))
    control = _control_row(by_variant, columns)
    rows.append({**{k: "" for k in rows[0]}, "method": control["method"],
                 **{_header(c): control[c] for c in columns}} if rows else control)
    caption = ("Table 2: compositionality accuracy (%) [95% cluster-bootstrap interval, the image the unit], "
               "↑ interval above chance; chance 50 (pairs), 20 (order); ties as each benchmark scores them; "
               "in-distribution columns (the models' own caption style, claim 3's) before the unseen-phrasing "
               "(template) ones; a scorer's cell: own image [interval] / another item's image / no image; "
               "the control row: whether the image decides the column at all")
    if any(split(v)[1] == "_blind" for v in by_variant):
        caption += ("; no image: the scorer without the image (null condition, or log-mean-exp over K other "
                    "images), the image adds: with - without (points, paired interval), image-debiased: "
                    "log p(t|i) - log p(t); * no-image accuracy at least 10 points from chance (the text alone "
                    "decides); SugarCrepe's published text-only baselines sit near 50 by construction")
    files = write_table(rows, os.path.join(out, "table2_compositionality"), caption, TABLE2_RULES)
    panels = _control_panels(by_variant, columns)
    if panels:  # runs scored with the controls
        plot_controls(panels, os.path.join(out, "table2_controls"))
        files += [os.path.join(out, "table2_controls.png"), os.path.join(out, "table2_controls.pdf")]
    return files
