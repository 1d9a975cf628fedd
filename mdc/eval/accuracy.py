"""Accuracy of a multiple-choice benchmark (Table 2): which items count as correct, the suites'
official aggregations, and cluster-bootstrap intervals. Pure numpy: scores in, numbers out.

Rules, stated here and in the functions below:

- Ties follow each benchmark's own scorer, a rule stated once in :mod:`mdc.data.aro_sugarcrepe`
  (:data:`TIES_WIN`, :func:`correct_and_ties`, re-exported here).
- Aggregations: VG-Relation is a macro average over relations, VG-Attribution over attribute pairs
  (pairs with fewer than 25 items in the file are dropped once, when the file is read, as ARO does),
  the order tasks and SugarCrepe are item averages (:func:`suite_accuracy`).
- Intervals: percentile cluster bootstrap (:func:`resample_stats`). The resampling unit is the
  image: items that share an image (COCO-Order's five captions, SugarCrepe items of one COCO image
  across sub-files) are drawn together. The groups of a macro average are fixed once from the full
  file; a resample averages the fixed groups that it drew at least one item of.
- A score without the image whose accuracy lies at least :data:`BLIND_WARNING` from chance means
  the captions' text alone separates the suite's candidates.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from mdc.data import aro_sugarcrepe as comp
from mdc.data.aro_sugarcrepe import TIES_WIN, correct_and_ties

__all__ = ["BLIND_WARNING", "MACRO_SUITES", "TIES_WIN", "correct_and_ties", "decode_outcomes",
           "encode_outcomes", "interval", "item_outcomes", "over_seeds", "paired_difference", "resample_stats", "same_words", "suite_accuracy"]

BLIND_WARNING = 0.10  # |blind accuracy - chance| at which the text alone decides a suite
MACRO_SUITES = ("aro_relation", "aro_attribute")  # suites averaged over groups (relations, attribute pairs)


def suite_accuracy(name: str, items: list, correct: np.ndarray, groups: Sequence | None = None) -> tuple[float, dict | None]:
    """The official number of suite ``name`` from per-item outcomes ``correct`` [N] and, for the
    macro suites, the accuracy per group (``groups`` [N]: relation or attribute pair, already
    filtered by the suite's rule); NaN without items."""
    if not items:
        return float("nan"), ({} if name in MACRO_SUITES else None)
    if name == "aro_relation":
        return comp.vg_relation_accuracy(items, correct)
    if name == "aro_attribute":
        return comp.vg_attribution_accuracy(items, correct, min_count=1)  # the file's filter is already applied
    return float(np.mean(correct)), None


def _codes(labels, n: int) -> np.ndarray:
    return np.unique(np.asarray([""] * n if labels is None else [str(x) for x in labels]), return_inverse=True)[1]


def resample_stats(outcomes, clusters=None, groups=None, resamples: int = 1000, seed=0) -> np.ndarray:
    """Cluster-bootstrap replicates [R, M] of the accuracy of each outcome row (``outcomes`` [M, N]
    or [N], values in [0, 1]); every row shares each resample (paired). A resample draws C clusters
    with replacement out of the C in ``clusters`` [N] (default: each item its own) and weights each
    item by its cluster's draws. Statistic: the mean over the fixed ``groups`` [N] of each group's
    weighted accuracy, over the groups with a drawn item; without groups, the weighted item mean."""
    y = np.atleast_2d(np.asarray(outcomes, dtype=np.float64))  # [M, N]
    M, N = y.shape
    if N == 0:
        return np.full((resamples, M), np.nan)
    cl = _codes(clusters if clusters is not None else range(N), N)
    onehot = np.eye(_codes(groups, N).max() + 1)[_codes(groups, N)]  # [N, G]
    C, rng, out = cl.max() + 1, np.random.default_rng(seed), []
    for start in range(0, resamples, 100):
        draws = rng.multinomial(C, np.full(C, 1.0 / C), size=min(100, resamples - start))  # [r, C]
        w = draws[:, cl].astype(np.float64)  # [r, N] item weights
        counts = w @ onehot  # [r, G]
        hits = np.stack([w @ (row[:, None] * onehot) for row in y], 1)  # [r, M, G]
        drawn = counts > 0
        acc = np.where(drawn[:, None], hits / np.maximum(counts, 1e-12)[:, None], 0.0)
        out.append(acc.sum(2) / np.maximum(drawn.sum(1), 1)[:, None])  # [r, M]
    return np.concatenate(out)


def interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates [R]; NaN if none is finite."""
    replicates = np.asarray(replicates, dtype=np.float64)
    if not np.isfinite(replicates).any():
        return float("nan"), float("nan")
    lo, hi = np.nanpercentile(replicates, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def paired_difference(a, b, clusters=None, groups=None, resamples: int = 1000, seed=0,
                      level: float = 0.95) -> tuple[float, float, float]:
    """(accuracy of a - accuracy of b, lo, hi) for two outcome vectors [N] of the same items (e.g.
    with and without the image): both aggregated alike, the interval from the same resamples."""
    y = np.stack([np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])  # [2, N]
    stats, point = resample_stats(y, clusters, groups, resamples, seed), _point(y, groups)
    return (float(point[0] - point[1]), *interval(stats[:, 0] - stats[:, 1], level))


def _point(y: np.ndarray, groups) -> np.ndarray:
    """The statistic of :func:`resample_stats` on the full sample: [M]."""
    N = y.shape[1]
    if N == 0:
        return np.full(len(y), np.nan)
    codes = _codes(groups, N)
    return np.stack([np.bincount(codes, row) / np.bincount(codes) for row in y]).mean(1)


def encode_outcomes(values) -> str:
    """Per-item 0/1 outcomes [N] as one string of '0' and '1' (a results record's compact form)."""
    return "".join("1" if v else "0" for v in values)


def decode_outcomes(text: str) -> np.ndarray:
    """The 0/1 outcomes [N] (bool) of :func:`encode_outcomes`."""
    return np.frombuffer(text.encode(), dtype=np.uint8) == ord("1")


def item_outcomes(results: dict, column: str, variant: str, macro: bool = False) -> tuple[np.ndarray, list, list | None, list]:
    """(outcomes [N] bool, image clusters [N], groups [N] or None, item ids [N]) of ``variant`` (may end in
    "_lengthnorm") in ``column`` of a results dict, from its records; a pooled SugarCrepe column (or its
    in-distribution ``own_*`` analogue) from its
    sub-files' (ids prefixed by the sub-file; ``macro``: groups = sub-files, for the mean over sub-files)."""
    if column in results["columns"] and "records" in results["columns"][column]:
        r = results["columns"][column]["records"]
        return decode_outcomes(r["correct"][variant]), r["clusters"], r.get("groups"), r["ids"]
    prefix, section = ("own_", "own_subsets") if column.startswith("own_") else ("sugarcrepe_", "sugarcrepe_subsets")
    subsets = results.get(section, {})  # the in-distribution sub-files: own_subsets
    files = [f for f in comp.SUGARCREPE_COLUMNS[column.removeprefix(prefix)] if f in subsets]
    recs = [(f, subsets[f]["records"]) for f in files]
    if not recs:
        raise KeyError(f"{column}: no sub-file was evaluated")
    return (np.concatenate([decode_outcomes(r["correct"][variant]) for _, r in recs]),
            [c for _, r in recs for c in r["clusters"]], [f for f, r in recs for _ in r["ids"]] if macro else None,
            [f"{f}/{i}" for f, r in recs for i in r["ids"]])


def over_seeds(results: Sequence[dict], column: str, variant: str, baseline: str | None = None,
               resamples: int = 1000, level: float = 0.95, macro: bool = False) -> tuple[float, float, float] | None:
    """(accuracy, lo, hi) of ``variant`` in ``column`` over the seeds' results dicts (or of ``variant``
    minus ``baseline``, paired), from their records: the mean over seeds of the seeds' accuracies
    (= the statistic of the seed-averaged per-item outcomes, for the same items in every seed) with
    the cluster-bootstrap interval of those seed-averaged outcomes, i.e. test-item noise only (one
    seed: its own interval). None when a seed lacks records or the seeds' items differ."""
    try:
        got = [[item_outcomes(r, column, v, macro) for v in (variant, baseline) if v] for r in results]
    except KeyError:
        return None
    ids, clusters, groups = got[0][0][3], got[0][0][1], got[0][0][2]
    if not ids or any(o[3] != ids for seed in got for o in seed):
        return None
    y = np.mean([[o[0] for o in seed] for seed in got], axis=0)  # [1 or 2, N] seed-averaged outcomes
    stats = resample_stats(y, clusters, groups, resamples, seed=0)
    point = _point(y, groups)
    if baseline:
        return float(point[0] - point[1]), *interval(stats[:, 0] - stats[:, 1], level)
    return float(point[0]), *interval(stats[:, 0], level)


def same_words(candidates: Sequence[Sequence[str]]) -> int:
    """Items with a false candidate made of the true caption's words in another order (lower-cased word
    multisets equal): a bag-of-words model cannot separate them (ARO's point about order)."""
    bag = lambda text: sorted(re.findall(r"\w+", text.lower()))  # noqa: E731
    return sum(any(bag(c) == bag(cands[0]) for c in cands[1:]) for cands in candidates)
