"""Compositionality evaluation (paper Sec. 4.2, Table 2): score every candidate caption of an
item with the model's likelihood (or CLIP's cosine) and count the items whose true caption wins.

Suites (``SUITES``, read by :mod:`mdc.eval.suites`): ARO VG-Relation, VG-Attribution,
COCO-Order, Flickr30k-Order and the seven SugarCrepe sub-files, published or synthetic.
Scorers (:data:`mdc.scoring.METHODS`): "exact" (ARC), "elbo" and "heuristic" (MDC), "cosine"
(CLIP). Each scored method is reported raw and length-normalised; "elbo" also as
``elbo_trained_t``, the ELBO summed only over the mask ratios the model was trained on
(``model.config.t_interval``, or ``mask_ratio`` when fixed).

How much of a score is the image's? Every likelihood variant is also scored without the image
(``<variant>_blind``: the learned null condition where the model has one, else the suite's mean
image) and debiased (``<variant>_debiased`` = log p(t | i) - alpha log p(t), VisualGPTScore's
correction). A blind accuracy far from chance means the text alone decides the suite: published
benchmarks share this (ARO's order tasks are solved by text-only models; SugarCrepe was filtered
until its text-only baselines, Vera and a grammar model, sat near 50%).

Results schema (the ``results`` part of a ``kind="compositionality"`` results file)::

    {
      "rules": {"tie": str, "length_normalisation": str, "interval": str, "sugarcrepe_columns": str},
      "settings": {"methods": [...], "variants": [...], "num_samples": int, "paired": bool,
                   "stratified": bool, "seed": int, "t_interval_trained": [w_l, w_u],
                   "resamples": int, "level": 0.95, "attribute_min_count": 25, "debias_alpha": float},
      "columns": {                  # Table 2 columns that were evaluated, keys from COLUMNS:
        "aro_relation" | "aro_attribute" | "aro_coco_order" | "aro_flickr30k_order" |
        "sugarcrepe_add" | "sugarcrepe_replace" | "sugarcrepe_swap": ENTRY},
      "sugarcrepe_subsets": {"add_att" | ... | "swap_obj": ENTRY},
      "table2": {variant: {column: accuracy}},  # variant and variant + "_lengthnorm", for figures
      "item_scores": "item_scores.npz",  # written by the notebook: per-item scores (save_item_scores)
    }
    ENTRY = {
      "data": "synthetic" | "real", "sources": [benchmark files],
      "items": int,                 # items evaluated (counted in the accuracy)
      "total": int,                 # items in the file(s)
      "missing": int,               # skipped: image absent (on_missing="skip")
      "excluded": int,              # left out by the suite's rule (symmetric relations, rare pairs)
      "chance": float,              # random-guess floor: 0.5 for pairs, 0.2 for order tasks
      "candidates": int,            # captions per item, the true one included
      "aggregation": str, "tagger": "spacy" | "builtin" (order suites only), "seconds": float,
      "same_words": int,            # items whose false caption has the true one's words (bag-of-words ties)
      "scores": {variant: {         # variant: a method or "elbo_trained_t", each also + "_blind", "_debiased"
          "accuracy": float, "ci": [lo, hi], "ties": int,   # ties: items lost by a tie (correct if ties won)
          "accuracy_lengthnorm": float, "ci_lengthnorm": [lo, hi], "ties_lengthnorm": int,
          "per_group": {relation | attribute pair: accuracy},      # macro suites only
          "accuracy_macro": float,  # SugarCrepe columns: the mean over their sub-files
          "far_from_chance": bool}}}  # blind variants: RULES["blind_warning"]
    }

Accuracies are fractions in [0, 1]; a macro average with no group left is null. ``PAPER_ROWS``
names the paper's Table 2 row of each method, ``PAPER_TABLE2`` holds its numbers.
"""
from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from mdc.api import score_candidates
from mdc.data import aro_sugarcrepe as comp
from mdc.data.formats import load_image
from mdc.distribution import encode_null
from mdc.eval.suites import SUGARCREPE, SUITES, Suite, describe, load_suites, synthetic_data
from mdc.scoring import METHODS
from mdc.tokenizer import caption_mask

__all__ = [  # the suites' names are part of this module's API: notebooks read them from here
    "BLIND_WARNING", "COLUMNS", "PAPER_ROWS", "PAPER_TABLE2", "RULES", "SUGARCREPE", "SUITES", "Suite", "SuiteScores",
    "bootstrap_ci", "correct_and_ties", "describe", "image_table", "load_suites", "markdown_table", "mean_image",
    "method_variants", "resolve_methods", "same_words", "save_item_scores", "score_suite", "score_variants",
    "summarise", "synthetic_data", "trained_t_interval", "variants", "with_blind"]

COLUMNS = ("aro_relation", "aro_attribute", "aro_coco_order", "aro_flickr30k_order",
           "sugarcrepe_add", "sugarcrepe_replace", "sugarcrepe_swap")
PAPER_ROWS = {"cosine": "CLIP", "exact": "ARC", "elbo": "MDC (Monte Carlo)", "heuristic": "MDC (Heuristic)"}
PAPER_TABLE2 = {  # the paper's Table 2 (%); it names neither the backbone nor the data of these models
    "CLIP": (53.6, 59.7, 27.2, 29.5, 66.5, 72.8, 61.3), "ARC": (82.7, 76.0, 97.7, 98.4, 97.6, 77.4, 76.9),
    "MDC (Monte Carlo)": (85.1, 84.3, 89.0, 89.0, 85.6, 75.8, 75.2),
    "MDC (Heuristic)": (84.6, 81.2, 98.4, 98.8, 97.8, 77.9, 78.5)}
RULES = {
    "tie": "an item is correct only if its true caption scores strictly above every other candidate; "
           "ties count as errors (order tasks: a perturbation identical to the true caption is not a competitor)",
    "length_normalisation": "score divided by the caption's token count (exact: the caption tokens and [EOT]; "
                            "elbo, heuristic: the caption tokens); cosine is left unchanged",
    "interval": "percentile bootstrap: items resampled with replacement, the suite's own aggregation re-run",
    "sugarcrepe_columns": "add = {add_att, add_obj}, replace = {replace_att, replace_obj, replace_rel}, "
                          "swap = {swap_att, swap_obj}; item-weighted means (sub-files' items pooled), and the "
                          "macro average over the sub-files beside it (accuracy_macro)",
    "blind": "<variant>_blind: the same scorer without the image: the model's learned null condition for the MDC "
             "scorers of a model trained with one (cond_drop_prob > 0), else the suite's mean image (every "
             "image of the suite averaged after the transform); same noise keys as the raw score",
    "debiased": "<variant>_debiased: log p(t | i) - alpha log p(t), the raw score minus alpha times the blind "
                "one (VisualGPTScore's debiasing; alpha = 0 is the raw score)",
    "blind_warning": "a blind accuracy at least 10 points from chance: the text alone separates the captions",
}
BLIND_WARNING = 0.10  # |blind accuracy - chance| that flags a column (RULES["blind_warning"])


def resolve_methods(objective: str, methods="auto") -> list[str]:
    """"auto": every scorer of the objective (ARC: exact; MDC: elbo, heuristic; CLIP: cosine);
    else the given method(s), each of which must fit the objective."""
    if methods == "auto":
        return list(METHODS[objective])
    methods = [methods] if isinstance(methods, str) else list(methods)
    known = sorted({m for ms in METHODS.values() for m in ms})
    for m in methods:
        if m not in known:
            raise ValueError(f"unknown method {m!r}; choose from {known} or 'auto'")
        if m not in METHODS[objective]:
            raise ValueError(f"method {m!r} does not fit a {objective!r} checkpoint; "
                             f"{objective!r} models are scored with {list(METHODS[objective])}")
    return methods


def trained_t_interval(config) -> tuple[float, float]:
    """The mask ratios a model was trained on: ``(r, r)`` for a fixed ``mask_ratio``, else ``t_interval``."""
    return (config.mask_ratio,) * 2 if config.mask_ratio is not None else tuple(config.t_interval)


def variants(methods: Sequence[str], elbo_trained_t: bool = True) -> list[str]:
    """Score variants reported: each method, plus ``elbo_trained_t`` after ``elbo`` if asked."""
    return [v for m in methods for v in ([m, "elbo_trained_t"] if m == "elbo" and elbo_trained_t else [m])]


@dataclass
class SuiteScores:
    """Per-item scores of one suite: ``scores[variant]`` [N, K] and caption token counts ``tokens`` [N, K];
    ``methods[variant]`` the scorer behind each variant ("exact", "elbo", "heuristic", "cosine")."""
    suite: Suite
    scores: dict = field(default_factory=dict)
    tokens: np.ndarray | None = None
    seconds: float = 0.0
    methods: dict = field(default_factory=dict)

    def normalised(self, variant: str) -> np.ndarray:
        """Length-normalised scores [N, K]: divided by the tokens scored (+1 for exact's [EOT]); cosine as is."""
        method = self.methods.get(variant, variant)
        if method == "cosine":
            return self.scores[variant]
        return self.scores[variant] / (self.tokens + (method == "exact"))


class _Images(torch.utils.data.Dataset):
    def __init__(self, items, transform):
        self.items, self.transform = items, transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.transform(load_image(self.items[i]))  # [3, S, S]; VG items cropped to their bbox


def method_variants(model, methods, *, num_samples=1024, seed=0, elbo_trained_t=True, stratified=True,
                    max_rows=256, blind=True) -> dict[str, dict]:
    """The score variants of ``methods`` (:func:`variants`) as :func:`mdc.score_candidates` keywords:
    ``{variant: {"method": ..., ...}}``; the ELBO's keyed noise and intervals as in :func:`score_suite`.
    ``blind``: each likelihood variant's image-free baseline too (:func:`with_blind`)."""
    elbo = dict(method="elbo", num_samples=num_samples, seed=seed, max_rows=max_rows, stratified=stratified)
    intervals = {"elbo": (0.0, 1.0), "elbo_trained_t": trained_t_interval(model.config)}
    scoring = {v: dict(elbo, t_interval=intervals[v]) if v in intervals else dict(method=v)
               for v in variants(resolve_methods(model.config.objective, methods), elbo_trained_t)}
    return with_blind(model, scoring) if blind else scoring


def with_blind(model, scoring: dict[str, dict]) -> dict[str, dict]:
    """``scoring`` with ``<variant>_blind`` after each likelihood variant (RULES["blind"]): keyword
    ``image`` = "null" (the learned null condition: plain MDC scorers of a model trained with one) or
    "mean" (the suite's mean image: every other scorer, guided ones included). Cosine has none."""
    null = getattr(model, "cond_null", None) is not None
    out = {}
    for v, kw in scoring.items():
        out[v] = kw
        if kw["method"] != "cosine":
            plain_mdc = kw["method"] in ("elbo", "heuristic") and kw.get("guidance") is None
            out[f"{v}_blind"] = dict(kw, image="null" if null and plain_mdc else "mean")
    return out


def score_suite(model, transform, suite: Suite, methods: Sequence[str], *, num_samples=1024, paired=True, seed=0,
                batch_size=32, device="cpu", elbo_trained_t=True, stratified=True, max_rows=256,
                workers=0, blind=True, debias_alpha=1.0) -> SuiteScores:
    """Score every candidate of every item with each method's variants (:func:`method_variants`),
    with their image-free and debiased scores unless ``blind=False``. ELBO noise is keyed by the
    item's id (:meth:`Suite.keys`) and shared by its candidates when ``paired`` (common random
    numbers); ``max_rows`` bounds the masked copies in one forward pass."""
    scoring = method_variants(model, methods, num_samples=num_samples, seed=seed, elbo_trained_t=elbo_trained_t,
                              stratified=stratified, max_rows=max_rows, blind=blind)
    return score_variants(model, transform, suite, scoring, paired=paired, batch_size=batch_size, device=device,
                          workers=workers, debias_alpha=debias_alpha)


def mean_image(loader) -> torch.Tensor | None:
    """The mean [3, S, S] of every image the loader yields (float64 sum: the same whatever the batch
    size); None when it yields none."""
    total, n = None, 0
    for images in loader:
        total = images.double().sum(0) if total is None else total + images.double().sum(0)
        n += len(images)
    return None if total is None else (total / n).float()


@torch.no_grad()
def score_variants(model, transform, suite: Suite, scoring: dict[str, dict], *, paired=True, batch_size=32,
                   device="cpu", workers=0, debias_alpha=1.0) -> SuiteScores:
    """Score every candidate of every item under each variant of ``scoring``, ``{name: keywords of
    mdc.score_candidates}`` (``method`` and its options, e.g. ``guidance``, and ``image``: "mean" or
    "null" for an image-free score, :func:`with_blind`): the candidates of ``batch_size`` items in one
    call per variant, each image encoded once per call. A variant whose keywords equal an earlier
    one's reuses its scores (e.g. ``elbo_trained_t`` of a model trained on t in [0, 1] is ``elbo``).
    Every ``v`` scored with its ``v_blind`` also gets ``v_debiased`` = v - ``debias_alpha`` v_blind."""
    start, model = time.time(), model.to(device)
    keys, tok = suite.keys(), model.tokenizer
    same = {v: next(u for u in scoring if scoring[u] == kw) for v, kw in scoring.items()}  # first equal variant
    out = SuiteScores(suite, {v: [] for v in scoring}, methods={v: kw["method"] for v, kw in scoring.items()})
    tokens = []
    loader = torch.utils.data.DataLoader(_Images(suite.items, transform), batch_size=batch_size, num_workers=workers)
    mean = mean_image(loader) if any(kw.get("image") == "mean" for kw in scoring.values()) else None
    first = 0
    for images in loader:  # [B, 3, S, S]
        images, rows = images.to(device), slice(first, first + len(images))
        cands, first = suite.candidates[rows], first + len(images)
        ids = tok.tokenize([c for cs in cands for c in cs])[0]  # [B*K, L]
        tokens.append(caption_mask(ids, tok.sot_id, tok.eot_id).sum(1).view(len(cands), -1).numpy())
        for v, kw in scoring.items():
            if same[v] != v:  # the same scores: no need to score twice
                out.scores[v].append(out.scores[same[v]][-1])
                continue
            kw = dict(kw)
            image = kw.pop("image", None)
            x = mean.to(device).expand_as(images) if image == "mean" else images  # [B, 3, S, S]
            if image == "null":
                kw["encode"] = encode_null
            s = score_candidates(model, x, cands, paired=paired, item_keys=keys[rows], **kw)  # [B, K]
            out.scores[v].append(s.double().cpu().numpy())
    K = len(suite.candidates[0]) if suite.candidates else 0
    out.scores = {v: np.concatenate(s) if s else np.zeros((0, K)) for v, s in out.scores.items()}
    for v in scoring:
        if f"{v}_blind" in scoring:  # VisualGPTScore's debiased score: log p(t | i) - alpha log p(t)
            out.scores[f"{v}_debiased"] = out.scores[v] - debias_alpha * out.scores[f"{v}_blind"]
            out.methods[f"{v}_debiased"] = out.methods[v]
    out.tokens = np.concatenate(tokens) if tokens else np.zeros((0, K), dtype=np.int64)
    out.seconds = time.time() - start
    return out


def correct_and_ties(scores: np.ndarray, identical: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per item [N]: whether the true caption (column 0) scores strictly above every competitor,
    and whether the item is lost by a tie (it would be correct if ties counted as wins).
    ``identical`` [N, K] marks candidates that are the true caption's very string: not competitors."""
    true, others = scores[:, :1], scores[:, 1:]
    same = np.zeros_like(others, dtype=bool) if identical is None else identical[:, 1:]
    correct = ((true > others) | same).all(1)
    return correct, ~correct & ((true >= others) | same).all(1)


def bootstrap_ci(correct, groups=None, min_count: int = 1, resamples: int = 1000, seed: int = 0,
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


def _accuracy(suite: Suite, items: list, correct: np.ndarray, scores: np.ndarray, min_count: int):
    """The suite's official number (and per-group accuracies for macro suites); NaN without items."""
    if not items:
        return float("nan"), ({} if suite.name in ("aro_relation", "aro_attribute") else None)
    if suite.name == "aro_relation":
        return comp.vg_relation_accuracy(items, correct)
    if suite.name == "aro_attribute":
        return comp.vg_attribution_accuracy(items, correct, min_count)
    if suite.identical is not None:
        return comp.order_accuracy(items, scores[:, 0], scores[:, 1:]), None
    return float(np.mean(correct)), None


def _entry(parts: list[SuiteScores], variant_names, min_count, resamples, level, seed, name) -> dict:
    """The ENTRY of one column or sub-file (``parts``: one suite, or the SugarCrepe sub-files pooled)."""
    suites = [p.suite for p in parts]
    s0 = suites[0]
    macro = s0.name in ("aro_relation", "aro_attribute")
    entry = {"data": s0.data, "sources": [src for s in suites for src in s.sources],
             "items": sum(len(s.items) for s in suites), "total": sum(s.total for s in suites),
             "missing": sum(s.missing for s in suites), "excluded": sum(s.excluded for s in suites),
             "chance": s0.chance, "candidates": len(s0.candidates[0]) if s0.candidates else 0,
             "aggregation": {"aro_relation": "macro over relations (symmetric relations excluded)",
                             "aro_attribute": f"macro over attribute pairs with >= {min_count} items"}.get(
                 s0.name, "micro (item-weighted) average"),
             "same_words": sum(same_words(s.candidates) for s in suites),
             "seconds": sum(p.seconds for p in parts), "scores": {}}
    if s0.tagger is not None:
        entry["tagger"] = s0.tagger
    items = [it for s in suites for it in s.items]
    groups = [g for s in suites for g in s.groups]
    identical = s0.identical
    boot_seed = [seed, zlib.crc32(name.encode())]
    for v in variant_names:
        result = {}
        for suffix, get in (("", lambda p: p.scores[v]), ("_lengthnorm", lambda p: p.normalised(v))):
            scores = np.concatenate([get(p) for p in parts])
            correct, ties = correct_and_ties(scores, identical)
            acc, per_group = _accuracy(s0, items, correct, scores, min_count)
            ci = bootstrap_ci(correct, groups if macro else None, min_count if s0.name == "aro_attribute" else 1,
                              resamples, boot_seed, level)
            result |= {f"accuracy{suffix}": acc, f"ci{suffix}": list(ci), f"ties{suffix}": int(ties.sum())}
            if per_group is not None and not suffix:
                result["per_group"] = per_group
        if v.endswith("_blind"):
            result["far_from_chance"] = bool(abs(result["accuracy"] - s0.chance) >= BLIND_WARNING)  # NaN: False
        entry["scores"][v] = result
    return entry


def same_words(candidates: Sequence[Sequence[str]]) -> int:
    """Items with a false candidate made of the true caption's words in another order (lower-cased word
    multisets equal): a bag-of-words model cannot separate them (ARO's point about order)."""
    bag = lambda text: sorted(re.findall(r"\w+", text.lower()))  # noqa: E731
    return sum(any(bag(c) == bag(cands[0]) for c in cands[1:]) for cands in candidates)


def summarise(scored: dict[str, SuiteScores], *, settings: dict | None = None, attribute_min_count=25,
              resamples=1000, level=0.95, seed=0) -> dict:
    """The ``results`` part of the results file (module docstring) from the scored suites."""
    if not scored:
        raise ValueError("no suite was scored")
    names = list(next(iter(scored.values())).scores)
    args = (names, attribute_min_count, resamples, level, seed)
    columns = {name: _entry([scored[name]], *args, name) for name in COLUMNS[:4] if name in scored}
    subsets = {s.split("/")[1]: _entry([scored[s]], *args, s) for s in SUGARCREPE if s in scored}
    for column, files in comp.SUGARCREPE_COLUMNS.items():
        parts = [scored[f"sugarcrepe/{s}"] for s in files if f"sugarcrepe/{s}" in scored]
        if parts:
            entry = columns[f"sugarcrepe_{column}"] = _entry(parts, *args, f"sugarcrepe_{column}")
            for v, result in entry["scores"].items():  # the mean over sub-files beside the pooled items
                result["accuracy_macro"] = float(np.mean([subsets[s]["scores"][v]["accuracy"] for s in files
                                                          if s in subsets]))
    table = {f"{v}{suffix}": {c: e["scores"][v][f"accuracy{suffix}"] for c, e in columns.items()}
             for v in names for suffix in ("", "_lengthnorm")}
    return {"rules": RULES, "settings": {**(settings or {}), "variants": names, "resamples": resamples,
                                         "level": level, "attribute_min_count": attribute_min_count},
            "columns": columns, "sugarcrepe_subsets": subsets, "table2": table}


def markdown_table(results: dict, variants: Sequence[str] | None = None, section: str = "columns") -> str:
    """Accuracies (%) [95% interval] as Markdown: a row per variant (default: all, raw and
    length-normalised), a column per entry of ``results[section]``, the chance row and, for
    the Table 2 ``columns``, the paper's rows."""
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
    if section == "columns":
        lines += [f"| paper: {row} | " + " | ".join(f"{vals[COLUMNS.index(c)]:.1f}" for c in cols) + " |"
                  for row, vals in PAPER_TABLE2.items()]
    return "\n".join(lines)


def image_table(results: dict) -> str:
    """How much of each score is the image's, as Markdown: per likelihood variant the raw, blind and
    debiased accuracy (%) per Table 2 column; "!" marks a blind accuracy far from chance (RULES)."""
    entries = results["columns"]
    cols = [c for c in COLUMNS if c in entries]
    alpha = results["settings"].get("debias_alpha", 1.0)
    lines = ["| | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for v in results["settings"]["variants"]:
        if f"{v}_blind" not in results["settings"]["variants"]:
            continue
        for name, label in ((v, v), (f"{v}_blind", f"{v} blind"), (f"{v}_debiased", f"{v} debiased ({alpha:g})")):
            got = [entries[c]["scores"][name] for c in cols]
            flag = ["!" if x.get("far_from_chance") else "" for x in got]
            cells = ["n/a" if np.isnan(x["accuracy"]) else f"{100 * x['accuracy']:.1f}{f}" for x, f in zip(got, flag)]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| chance | " + " | ".join(f"{100 * entries[c]['chance']:.0f}" for c in cols) + " |")
    lines.append("| same-word pairs | " + " | ".join(f"{entries[c]['same_words']} of {entries[c]['items']}"
                                                     for c in cols) + " |")
    return "\n".join(lines)


def save_item_scores(path: str, scored: dict[str, SuiteScores]) -> str:
    """Per-item scores as ``.npz``: ``<suite>/ids`` [N], ``<suite>/tokens`` [N, K] and
    ``<suite>/<variant>`` [N, K] (column 0 = the true caption)."""
    arrays = {}
    for name, s in scored.items():
        arrays[f"{name}/ids"] = np.array([str(it["id"]) for it in s.suite.items])
        arrays[f"{name}/tokens"] = s.tokens
        arrays |= {f"{name}/{v}": a for v, a in s.scores.items()}
    np.savez_compressed(path, **arrays)
    return path
