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
          "far_from_chance": bool}}}  # blind variants: accuracy.BLIND_WARNING
    }

Accuracies are fractions in [0, 1]; a macro average with no group left is null. The rules behind
them (ties are errors, the suites' aggregations, the intervals) live in :mod:`mdc.eval.accuracy`.
SugarCrepe's add / replace / swap columns pool their sub-files' items (``accuracy_macro`` beside it:
the mean over sub-files); the length-normalised score is :meth:`SuiteScores.normalised`.
"""
from __future__ import annotations

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
from mdc.eval.accuracy import BLIND_WARNING, MACRO_SUITES, bootstrap_ci, correct_and_ties, same_words, suite_accuracy
from mdc.eval.suites import SUGARCREPE, SUITES, Suite, describe, load_suites, synthetic_data
from mdc.scoring import METHODS
from mdc.tokenizer import caption_mask

__all__ = [  # the suites' names are part of this module's API: notebooks read them from here
    "COLUMNS", "SUGARCREPE", "SUITES", "Suite", "SuiteScores", "describe", "image_table", "load_suites",
    "markdown_table", "mean_image", "method_variants", "resolve_methods", "save_item_scores", "score_suite",
    "score_variants", "summarise", "synthetic_data", "trained_t_interval", "variants", "with_blind"]

COLUMNS = ("aro_relation", "aro_attribute", "aro_coco_order", "aro_flickr30k_order",
           "sugarcrepe_add", "sugarcrepe_replace", "sugarcrepe_swap")


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
    """``scoring`` with ``<variant>_blind`` after each likelihood variant, the same scorer without the
    image and with the same noise keys as the raw score: keyword
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


def _entry(parts: list[SuiteScores], variant_names, min_count, resamples, level, seed, name) -> dict:
    """The ENTRY of one column or sub-file (``parts``: one suite, or the SugarCrepe sub-files pooled)."""
    suites = [p.suite for p in parts]
    s0 = suites[0]
    macro = s0.name in MACRO_SUITES
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
            acc, per_group = suite_accuracy(s0.name, items, correct, scores, min_count, identical is not None)
            ci = bootstrap_ci(correct, groups if macro else None, min_count if s0.name == "aro_attribute" else 1,
                              resamples, boot_seed, level)
            result |= {f"accuracy{suffix}": acc, f"ci{suffix}": list(ci), f"ties{suffix}": int(ties.sum())}
            if per_group is not None and not suffix:
                result["per_group"] = per_group
        if v.endswith("_blind"):
            result["far_from_chance"] = bool(abs(result["accuracy"] - s0.chance) >= BLIND_WARNING)  # NaN: False
        entry["scores"][v] = result
    return entry


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
    return {"settings": {**(settings or {}), "variants": names, "resamples": resamples, "level": level,
                         "attribute_min_count": attribute_min_count},
            "columns": columns, "sugarcrepe_subsets": subsets, "table2": table}


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
    """How much of each score is the image's, as Markdown: per likelihood variant the raw, blind and
    debiased accuracy (%) per Table 2 column; "!" marks a blind accuracy at least
    :data:`~mdc.eval.accuracy.BLIND_WARNING` from chance."""
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
