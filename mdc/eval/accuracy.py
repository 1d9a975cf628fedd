"""Accuracy of a multiple-choice benchmark (Table 2): which items count as correct, the suites'
official aggregations, and percentile bootstrap intervals. Pure numpy: scores in, numbers out.

Rules, stated once here and in the functions below:

- Ties are errors: an item is correct only if its true caption (column 0) scores strictly above
  every other candidate. On the order tasks a perturbation that is the true caption's very string
  is not a competitor (:func:`correct_and_ties`).
- Aggregations: VG-Relation is a macro average over relations, VG-Attribution over attribute pairs
  with at least ``min_count`` items, the order tasks and SugarCrepe are item averages
  (:func:`suite_accuracy`).
- Intervals: percentile bootstrap, items resampled with replacement and the suite's own
  aggregation re-run on each resample (:func:`bootstrap_ci`).
- A score without the image whose accuracy lies at least :data:`BLIND_WARNING` from chance means
  the captions' text alone separates the suite's candidates.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from mdc.data import aro_sugarcrepe as comp

__all__ = ["BLIND_WARNING", "MACRO_SUITES", "bootstrap_ci", "correct_and_ties", "same_words", "suite_accuracy"]

BLIND_WARNING = 0.10  # |blind accuracy - chance| at which the text alone decides a suite
MACRO_SUITES = ("aro_relation", "aro_attribute")  # suites averaged over groups (relations, attribute pairs)


def correct_and_ties(scores: np.ndarray, identical: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per item [N]: whether the true caption (column 0) scores strictly above every competitor,
    and whether the item is lost by a tie (it would be correct if ties counted as wins).
    ``identical`` [N, K] marks candidates that are the true caption's very string: not competitors."""
    true, others = scores[:, :1], scores[:, 1:]
    same = np.zeros_like(others, dtype=bool) if identical is None else identical[:, 1:]
    correct = ((true > others) | same).all(1)
    return correct, ~correct & ((true >= others) | same).all(1)


def suite_accuracy(name: str, items: list, correct: np.ndarray, scores: np.ndarray, min_count: int,
                   order: bool = False) -> tuple[float, dict | None]:
    """The official number of suite ``name`` and, for the macro suites, the accuracy per group
    (relation or attribute pair); NaN without items. ``order``: an order task (ARO's own rule on the
    true caption's score against its perturbations'); ``scores`` [N, K], ``correct`` [N]."""
    if not items:
        return float("nan"), ({} if name in MACRO_SUITES else None)
    if name == "aro_relation":
        return comp.vg_relation_accuracy(items, correct)
    if name == "aro_attribute":
        return comp.vg_attribution_accuracy(items, correct, min_count)
    if order:
        return comp.order_accuracy(items, scores[:, 0], scores[:, 1:]), None
    return float(np.mean(correct)), None


def bootstrap_ci(correct, groups=None, min_count: int = 1, resamples: int = 1000, seed=0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the accuracy: items resampled with replacement ``resamples`` times;
    each resample re-runs the aggregation, the mean over ``groups`` of per-group accuracy (groups
    with fewer than ``min_count`` resampled items dropped), or the item mean without groups."""
    correct = np.asarray(correct, dtype=np.float64)
    N = len(correct)
    if N == 0:
        return float("nan"), float("nan")
    codes = np.unique(np.asarray(groups if groups is not None else [""] * N), return_inverse=True)[1]
    onehot = np.eye(codes.max() + 1)[codes]  # [N, G]
    rng, stats = np.random.default_rng(seed), []
    for start in range(0, resamples, 100):
        weights = rng.multinomial(N, np.full(N, 1.0 / N), size=min(100, resamples - start))  # [R, N]
        counts, hits = weights @ onehot, weights @ (onehot * correct[:, None])  # [R, G]
        kept = counts >= min_count  # [R, G] groups counted in each resample
        acc = np.where(kept, hits / np.maximum(counts, 1), 0.0)
        stats.append(np.where(kept.any(1), acc.sum(1) / np.maximum(kept.sum(1), 1), np.nan))  # [R]
    stats = np.concatenate(stats)
    if not np.isfinite(stats).any():
        return float("nan"), float("nan")
    lo, hi = np.nanpercentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def same_words(candidates: Sequence[Sequence[str]]) -> int:
    """Items with a false candidate made of the true caption's words in another order (lower-cased word
    multisets equal): a bag-of-words model cannot separate them (ARO's point about order)."""
    bag = lambda text: sorted(re.findall(r"\w+", text.lower()))  # noqa: E731
    return sum(any(bag(c) == bag(cands[0]) for c in cands[1:]) for cands in candidates)
