"""Compositionality evaluation (paper Sec. 4.2, Table 2): score every candidate caption of an
item with the model's likelihood (or CLIP's cosine) and count the items whose true caption wins.

Suites (``SUITES``, read by :mod:`mdc.eval.suites`): ARO VG-Relation, VG-Attribution,
COCO-Order, Flickr30k-Order and the seven SugarCrepe sub-files, published or synthetic (written in
templates: "unseen phrasing" for the descriptive models), and ``OWN_SUITES``, their in-distribution
analogues in the training captions' own words (:mod:`mdc.world.caption_edits`), Table 2's primary
columns ``OWN_COLUMNS``. Positive controls (:mod:`mdc.eval.positive_controls`): with ``shuffled`` every variant
is also scored with another item's image (``<variant>_shuffled``), beside its image-free ``_blind``.
Scorers (:data:`mdc.scoring.METHODS`): "exact" (ARC), "elbo" and "heuristic" (MDC), "cosine"
(CLIP). Each scored method is reported raw and length-normalised; "elbo" also as
``elbo_trained_t``, the ELBO summed only over the mask ratios the model was trained on
(``model.config.masking.trained_window``: ``t_interval``, or ``mask_ratio`` when fixed), estimated from the ELBO's own masked
copies (the ones whose mask count lies in that range; :func:`mdc.absorbing.elbo_score`).

How much of a score is the image's? Every likelihood variant is also scored without the image
(``<variant>_blind``): the learned null condition where the model has one (log p(t | null)), else
log p(t) ~ log (1/K) sum_k p(t | i_k), the log-mean-exp over K = ``blind_images`` reference images
of the suite other than the item's own (a fixed seeded draw of K + 1 distinct images; each costs one
more scoring of every candidate). ``<variant>_debiased`` = log p(t | i) - alpha log p(t)
(VisualGPTScore's) for "exact" and "elbo", whose two terms share their noise keys; the heuristic has
none (without the image it reveals in another order). A blind accuracy far from chance means the
text alone decides the suite (ARO's order tasks; SugarCrepe was filtered against it).

A run's suites are best scored together (:func:`score_suites`, :mod:`mdc.eval.suite_scoring`): each distinct
(image, caption) pair once, its ELBO noise keyed by the image, so every suite gets the scores it gets alone.

Results schema (the ``results`` part of a ``kind="compositionality"`` results file)::

    {
      "settings": {"methods": [...], "variants": [...], "num_samples": int, "max_samples": int | None, "paired": bool,
                   "stratified": bool, "seed": int, "t_interval_trained": [w_l, w_u], "blind_images": K,
                   "resamples": int, "level": 0.95, "attribute_min_count": 25, "debias_alpha": float,
                   "shuffled": bool, "order_images": int | None, "own_items": int | None},
      "columns": {                  # Table 2 columns that were evaluated, keys from COLUMNS:
        "aro_relation" | "aro_attribute" | "aro_coco_order" | "aro_flickr30k_order" |
        "sugarcrepe_add" | "sugarcrepe_replace" | "sugarcrepe_swap" |
        "own_relation" | "own_attribute" | "own_add" | "own_replace" | "own_swap": ENTRY},   # in-distribution
      "sugarcrepe_subsets": {"add_att" | ... | "swap_obj": ENTRY},
      "own_subsets": {"add_att" | ... | "swap_obj": ENTRY},  # the in-distribution sub-files (may be empty)
      "table2": {variant: {column: accuracy}},  # variant and variant + "_lengthnorm", for figures
      "item_scores": "item_scores.npz",  # written by the notebook: per-item scores (save_item_scores)
    }
    ENTRY = {
      "data": "synthetic" | "real", "sources": [benchmark files],
      "items": int, "images": int,  # items evaluated, and the distinct images they show (bootstrap clusters)
      "total": int,                 # items in the file(s)
      "missing": int,               # skipped: image absent (on_missing="skip")
      "excluded": int,              # left out by the suite's rule (symmetric relations, rare pairs)
      "chance": float,              # random-guess floor: 0.5 for pairs, 0.2 for order tasks
      "candidates": int, "ties": "win" | "error",  # the suite's tie rule (mdc.eval.accuracy)
      "aggregation": str, "tagger": "spacy" | "builtin" (order suites only), "seconds": float,
      "same_words": int,            # items whose false caption has the true one's words (bag-of-words ties)
      "scores": {variant: {         # variant: a method or "elbo_trained_t", each also + "_blind", "_debiased",
                                    # and + "_shuffled" (another item's image; runs before the controls: none)
          "accuracy": float, "ci": [lo, hi], "ties": int,   # ties: items decided by a tie
          "accuracy_lengthnorm": float, "ci_lengthnorm": [lo, hi], "ties_lengthnorm": int,
          "above_chance": bool,     # the interval lies above chance
          "image_adds": {"difference": float, "ci": [lo, hi]},  # accuracy - blind accuracy (variants with one)
          "per_group": {relation | attribute pair: accuracy},      # macro suites only
          "accuracy_macro": float, "ci_macro": [lo, hi],  # SugarCrepe columns: the mean over their sub-files
          "far_from_chance": bool}},  # blind variants: accuracy.BLIND_WARNING
      "records": {"ids": [...], "clusters": [...], "groups": [...],   # per item (suites and sub-files only:
          "correct": {variant (+ "_lengthnorm"): "0110..."}}}     # a pooled column is its sub-files')
    }

Accuracies are fractions in [0, 1]; a macro average with no group left is null. Intervals are 95%
percentile cluster-bootstrap intervals, the image being the resampling unit (:mod:`mdc.eval.accuracy`,
which holds every rule); "records" carry what recomputes them (:func:`mdc.eval.accuracy.item_outcomes`).
SugarCrepe's add / replace / swap columns pool their sub-files' items (``accuracy_macro`` beside it:
the mean over sub-files, SugarCrepe's own reporting); per token: :meth:`SuiteScores.normalised`.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from mdc.data import aro_sugarcrepe as comp
from mdc.eval.accuracy import (BLIND_WARNING, MACRO_SUITES, TIES_WIN, correct_and_ties, encode_outcomes,
                               interval, paired_difference, resample_stats, same_words, suite_accuracy)
from mdc.eval.positive_controls import cell_controls, control_margin, control_status
from mdc.eval.suite_scoring import (SuiteOptions, SuiteScores, image_keys, method_variants, resolve_methods,
                                    save_item_scores, score_suite, score_suites, score_suites_variants, score_variants,
                                    suite_options, variants, with_blind)
from mdc.eval.suites import OWN_SUITES, SUGARCREPE, SUITES, Suite, describe, load_suites, synthetic_data

__all__ = [  # the suites' and the scoring's names are part of this module's API: notebooks read them from here
    "COLUMNS", "OWN_COLUMNS", "OWN_SUITES", "SUGARCREPE", "SUITES", "TEMPLATE_COLUMNS", "controls_table", "Suite", "SuiteOptions", "SuiteScores", "describe", "image_table",
    "image_keys", "load_suites", "markdown_table", "method_variants", "resolve_methods", "save_item_scores",
    "score_suite", "score_suites", "score_suites_variants", "score_variants", "suite_options", "summarise",
    "synthetic_data", "variants", "with_blind"]

TEMPLATE_COLUMNS = ("aro_relation", "aro_attribute", "aro_coco_order", "aro_flickr30k_order",
                    "sugarcrepe_add", "sugarcrepe_replace", "sugarcrepe_swap")
#: Table 2's in-distribution columns (mdc.world.caption_edits): the primary ones for claim 3
OWN_COLUMNS = ("own_relation", "own_attribute", "own_add", "own_replace", "own_swap")
COLUMNS = (*TEMPLATE_COLUMNS, *OWN_COLUMNS)
# SugarCrepe-style sub-files: (suite prefix, results section of the sub-files, column prefix)
SUBFILES = (("sugarcrepe", "sugarcrepe_subsets", "sugarcrepe"), ("own_sugarcrepe", "own_subsets", "own"))
def _outcomes(parts: list[SuiteScores], v: str, suffix: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-item outcomes and ties [N] of variant ``v`` (``suffix`` "_lengthnorm": per token) under the suite's tie rule."""
    s0 = parts[0].suite
    scores = np.concatenate([p.normalised(v) if suffix else p.scores[v] for p in parts])
    return correct_and_ties(scores, s0.identical, s0.name in TIES_WIN)


def _entry(parts: list[SuiteScores], variant_names, resamples, level, seed, name, min_count) -> dict:
    """The ENTRY of one column or sub-file (``parts``: one suite, or the SugarCrepe sub-files pooled)."""
    suites = [p.suite for p in parts]
    s0 = suites[0]
    items = [it for s in suites for it in s.items]
    clusters = [c for s in suites for c in s.clusters]  # an image's items across sub-files resample together
    groups = [g for s in suites for g in s.groups] if s0.name in MACRO_SUITES else None
    entry = {"data": s0.data, "sources": [src for s in suites for src in s.sources],
             "items": len(items), "images": len(set(clusters)), "total": sum(s.total for s in suites),
             "missing": sum(s.missing for s in suites), "excluded": sum(s.excluded for s in suites),
             "chance": s0.chance, "candidates": len(s0.candidates[0]) if s0.candidates else 0,
             "ties": "win" if s0.name in TIES_WIN else "error",
             "aggregation": {"aro_relation": "macro over relations (symmetric relations excluded)",
                             "aro_attribute": f"macro over attribute pairs with >= {min_count} items in the file"}.get(
                 s0.name, "micro (item-weighted) average"),
             "same_words": sum(same_words(s.candidates) for s in suites),
             "seconds": sum(p.seconds for p in parts), "scores": {}}
    if s0.tagger is not None:
        entry["tagger"] = s0.tagger
    boot = dict(clusters=clusters, groups=groups, resamples=resamples, seed=[seed, zlib.crc32(name.encode())])
    correct = {}
    for v in variant_names:
        result = {}
        for suffix in ("", "_lengthnorm"):
            correct[v + suffix], ties = _outcomes(parts, v, suffix)
            acc, per_group = suite_accuracy(s0.name, items, correct[v + suffix], groups)
            ci = interval(resample_stats(correct[v + suffix], **boot)[:, 0], level)
            result |= {f"accuracy{suffix}": acc, f"ci{suffix}": list(ci), f"ties{suffix}": int(ties.sum())}
            if per_group is not None and not suffix:
                result["per_group"] = per_group
        result["above_chance"] = bool(result["ci"][0] > s0.chance)  # NaN: False
        if v.endswith("_blind"):
            result["far_from_chance"] = bool(abs(result["accuracy"] - s0.chance) >= BLIND_WARNING)  # NaN: False
        entry["scores"][v] = result
    for v in variant_names:
        if f"{v}_blind" in correct:  # the image's share: accuracy with it - without it, paired resamples
            d, lo, hi = paired_difference(correct[v], correct[f"{v}_blind"], level=level, **boot)
            entry["scores"][v]["image_adds"] = {"difference": d, "ci": [lo, hi]}
    if len(parts) == 1:  # per-item records: what a later build needs to recompute every interval
        entry["records"] = {"ids": [str(it["id"]) for it in items], "clusters": clusters,
                            "correct": {v: encode_outcomes(c) for v, c in correct.items()}}
        if groups is not None:
            entry["records"]["groups"] = groups
    return entry


def _subfiles(scored, columns, args, min_count, prefix, column_prefix) -> dict:
    """The SugarCrepe-style sub-files of ``prefix`` scored (their ENTRY each) and, into ``columns``, their
    add / replace / swap columns ``<column_prefix>_<column>`` (items pooled, the sub-file mean beside)."""
    names, resamples, level, seed = args
    subsets = {s: _entry([scored[f"{prefix}/{s}"]], *args, f"{prefix}/{s}", min_count)
               for s in comp.SUGARCREPE_SUBSETS if f"{prefix}/{s}" in scored}
    for column, files in comp.SUGARCREPE_COLUMNS.items():
        parts = [scored[f"{prefix}/{s}"] for s in files if f"{prefix}/{s}" in scored]
        if parts:
            name = f"{column_prefix}_{column}"
            entry = columns[name] = _entry(parts, *args, name, min_count)
            files_of = [p.suite.name for p in parts for _ in p.suite.items]
            clusters = [c for p in parts for c in p.suite.clusters]
            for v, result in entry["scores"].items():  # SugarCrepe's own number: the mean over sub-files
                c = np.concatenate([_outcomes([p], v, "")[0] for p in parts])
                stats = resample_stats(c, clusters, files_of, resamples, [seed, zlib.crc32(name.encode())])
                result["accuracy_macro"] = float(np.mean([subsets[p.suite.name.split("/")[1]]["scores"][v]["accuracy"]
                                                          for p in parts]))
                result["ci_macro"] = list(interval(stats[:, 0], level))
    return subsets


def summarise(scored: dict[str, SuiteScores], *, settings: dict | None = None, attribute_min_count=25,
              resamples=1000, level=0.95, seed=0) -> dict:
    """The ``results`` part of the results file (module docstring) from the scored suites.
    ``attribute_min_count`` names the filter the suites were read with (:func:`load_suites`)."""
    if not scored:
        raise ValueError("no suite was scored")
    names = list(next(iter(scored.values())).scores)
    args = (names, resamples, level, seed)
    singles = (*TEMPLATE_COLUMNS[:4], *OWN_COLUMNS[:2])
    columns = {n: _entry([scored[n]], *args, n, attribute_min_count) for n in singles if n in scored}
    sections = {}
    for prefix, section, column_prefix in SUBFILES:
        sections[section] = _subfiles(scored, columns, args, attribute_min_count, prefix, column_prefix)
    table = {f"{v}{suffix}": {c: e["scores"][v][f"accuracy{suffix}"] for c, e in columns.items()}
             for v in names for suffix in ("", "_lengthnorm")}
    return {"settings": {**(settings or {}), "variants": names, "resamples": resamples, "level": level,
                         "attribute_min_count": attribute_min_count,
                         "interval": "percentile cluster bootstrap, the image the resampling unit"},
            "columns": columns, **sections, "table2": table}


def markdown_table(results: dict, variants: Sequence[str] | None = None, section: str = "columns") -> str:
    """Accuracies (%) [95% interval] as Markdown: a row per variant (default: all, raw and
    length-normalised), a column per entry of ``results[section]`` and the chance row."""
    entries = results[section]
    cols = [c for c in COLUMNS if c in entries] if section == "columns" else list(entries)
    names = variants or [f"{v}{s}" for v in results["settings"]["variants"] for s in ("", "_lengthnorm")]
    lines = ["| | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for name in names:
        v, s = (name[:-11], "_lengthnorm") if name.endswith("_lengthnorm") else (name, "")
        cells = [entries[c]["scores"][v] for c in cols]
        lines.append(f"| {name} | " + " | ".join(
            "n/a" if x[f"accuracy{s}"] is None or np.isnan(x[f"accuracy{s}"]) else
            "{:.1f} [{:.1f}, {:.1f}]".format(*(100 * np.array([x[f"accuracy{s}"], *x[f"ci{s}"]], dtype=float)))
            for x in cells) + " |")
    lines.append("| chance | " + " | ".join(f"{100 * entries[c]['chance']:.0f}" for c in cols) + " |")
    return "\n".join(lines)


def image_table(results: dict) -> str:
    """How much of each score is the image's, as Markdown: per likelihood variant the raw and blind
    accuracy (%) per Table 2 column, the difference with its paired 95% interval (points) and the
    debiased accuracy where there is one; "!" marks a blind accuracy at least
    :data:`~mdc.eval.accuracy.BLIND_WARNING` from chance."""
    entries = results["columns"]
    cols = [c for c in COLUMNS if c in entries]
    alpha = results["settings"].get("debias_alpha", 1.0)
    pct = lambda x: "n/a" if x is None or np.isnan(x) else f"{100 * x:.1f}"  # noqa: E731
    lines = ["| | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    variants = results["settings"]["variants"]
    for v in (v for v in variants if f"{v}_blind" in variants):
        lines.append(f"| {v} | " + " | ".join(pct(entries[c]["scores"][v]["accuracy"]) for c in cols) + " |")
        blind = [entries[c]["scores"][f"{v}_blind"] for c in cols]
        lines.append(f"| {v} blind | " + " | ".join(pct(x["accuracy"]) + ("!" if x.get("far_from_chance") else "")
                                                    for x in blind) + " |")
        adds = [entries[c]["scores"][v]["image_adds"] for c in cols]
        lines.append(f"| {v}: the image adds | " + " | ".join(
            f"{pct(a['difference'])} [{pct(a['ci'][0])}, {pct(a['ci'][1])}]" for a in adds) + " |")
        if f"{v}_debiased" in variants:
            lines.append(f"| {v} debiased ({alpha:g}) | " + " | ".join(
                pct(entries[c]["scores"][f"{v}_debiased"]["accuracy"]) for c in cols) + " |")
    lines.append("| chance | " + " | ".join(f"{100 * entries[c]['chance']:.0f}" for c in cols) + " |")
    lines.append("| same-word pairs | " + " | ".join(f"{entries[c]['same_words']} of {entries[c]['items']}"
                                                     for c in cols) + " |")
    return "\n".join(lines)


def controls_table(results: dict) -> str:
    """The positive controls as Markdown: per Table 2 column each scorer's accuracy (%) with the item's own
    image / another item's image / no image, and the control's verdict (:mod:`mdc.eval.positive_controls`: some
    scorer's own - shuffled accuracy at least the margin for the column's items)."""
    entries, names = results["columns"], results["settings"]["variants"]
    cols = [c for c in COLUMNS if c in entries]
    scorers = [v for v in names if f"{v}_shuffled" in names]
    pct = lambda x: "-" if x is None or np.isnan(x) else f"{100 * x:.1f}"  # noqa: E731
    lines = ["| own / shuffled / no image | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for v in scorers:
        lines.append(f"| {v} | " + " | ".join(" / ".join(pct(x) for x in cell_controls(entries[c], v).values())
                                              for c in cols) + " |")
    lines.append("| control | " + " | ".join(
        f"{control_status([cell_controls(entries[c], v) for v in scorers], entries[c]['items'])} "
        f"(margin {100 * control_margin(entries[c]['items']):.0f})" for c in cols) + " |")
    return "\n".join(lines)
