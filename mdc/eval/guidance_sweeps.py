"""MC-Diffusion's guidance, evaluated: caption and compositionality sweeps over (guidance, strength).

The guidance itself (CFG, MCS as printed, MCS mirrored) is :mod:`mdc.mc_diffusion.guidance`. Sweeps run each
rule at guidance *strengths* s > 0, the distance from the rule's unguided scale (CFG at scale
1 + s, MCS as printed at s, mirrored MCS at 1 + s), so that one x value means the same for every
rule; strength 0, the plain model, is the unguided run every sweep starts with. This module runs it over evaluation
sets for ``notebooks/guidance.ipynb``: captions under each setting (:func:`caption_sweep`),
their CLIPScores (:func:`clipscore_sweep`), the results record (:func:`guidance_results`) and
the Table 2 suites scored under each setting (:func:`guided_compositionality`).

Comparing rules at one strength says little: one s scales different log-ratios (CFG: log p(y) -
log p(null); MCS: log p(y) - log p(y_M), ~10% of the tokens masked), so a rule that "hurts
CLIPScore less" may simply change less. The sweep therefore records, per run, how far its captions
moved from the unguided ones (``changed``, ``word_edit``), and the per-image outcomes that give
bootstrap intervals (:func:`run_intervals`); the figure draws each rule's frontier (a reference
metric against CLIPScore over its own strengths) and CLIPScore against the distance moved.

Cost: every setting captions the same images, so each batch is encoded once for all settings,
MCS's masked condition once for both MCS rules and every strength (its masks depend on the seed
only), and the cross-attention keys/values once per condition pair (:func:`caption_sweep`); the
CLIP embeds the images and references once for all runs (:func:`clipscore_sweep`). The numbers are
those of running each setting alone (tests/mdc/test_guidance.py).

Results of ``notebooks/guidance.ipynb`` (``kind="guidance"``, :mod:`mdc.eval.results`)::

    {
      "dataset": {"captions_json", "format", "split", "images": int},
      "length": int,                       # MDC caption length (tokens)
      "runs": [{"label": "none" | "cfg@s=2" | "mcs_mirror@s=0.5" | ...,   # strength_label(guidance, strength)
                "guidance": "none" | "cfg" | "mcs" | "mcs_mirror",
                "strength": float | null,          # the sweep's x: distance from the unguided scale
                "scale": float | null,             # the guidance scale it ran at (scale_of(guidance, strength))
                "bleu4", "meteor", "cider": float | null,      # pycocoevalcap fractions; null: not computed
                "clipscore", "refclipscore": float | null,     # mean over images; null: no CLIP
                "changed": float,                  # fraction of images whose caption differs from the unguided one
                "word_edit": float,                # mean word-level edit distance to it / the longer caption
                "per_image": {"clipscore": "0.8123 ...",      # per image, in dataset order (space-separated;
                              "cider": "1.2345 ...",          # CIDEr with the whole set's IDF)
                              "bleu": "t r c1 c2 c3 c4 ..."},  # BLEU counts: length, closest reference
                                                              # length, clipped n-gram matches n = 1..4
                "unavailable": {metric: why}}],                # the unguided run first
      "clip": {"checkpoint", "checkpoint_id", "kind": "mdc" | "open_clip", "prefix"} | null,
      "unavailable": {metric: why},        # e.g. "clipscore": no clip_checkpoint given
      "compositionality": null | {"method": "heuristic" | "elbo",
                "table2": {label (+ "_lengthnorm"): {column: accuracy}},
                "columns": {column: {label: {"accuracy", "ci": [lo, hi]}}}},  # synthetic suites
      "files": {"predictions": path, "figure": path}   # {label: {image_id: caption}}; the trade-off figure
    }
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch

from mdc import sampler
from mdc.data.formats import load_image
from mdc.distribution import CaptionDistribution
from mdc.eval import compositionality as comp
from mdc.eval.clipscore import clip_score, load_clip, ref_clip_score
from mdc.eval.metrics import ptb_tokenize
from mdc.eval.results import checkpoint_id
from mdc.factory import image_transform
from mdc.mc_diffusion.guidance import (GUIDANCE, RULES, Guide, check_guidance, is_unguided, scale_label, scale_of,
                                       strength_label, strength_of)
from mdc.model import evaluating

logger = logging.getLogger(__name__)
__all__ = ["caption_sweep", "check_guidance", "clipscore_sweep", "guidance_results", "guided_compositionality",
           "reference_outcomes", "run_intervals", "runs_markdown", "RULES", "scale_label", "scale_of",
           "strength_label", "strength_of", "sweep_settings"]


def sweep_settings(strengths: Sequence[float], guidances: Sequence[str] = GUIDANCE) -> list[tuple]:
    """[(None, None), (guidance, strength) for each guidance and strength > 0]: the unguided run
    (strength 0 for every rule) first."""
    for g in guidances:
        if g not in GUIDANCE:
            raise ValueError(f"unknown guidance {g!r}; choose from {GUIDANCE}")
    for s in strengths:
        if not float(s) >= 0:
            raise ValueError(f"guidance strengths must be >= 0; got {s}")
        if float(s) == 0:
            raise ValueError("strength 0 is the unguided run, which every sweep has first: give strengths > 0")
    return [(None, None)] + [(g, float(s)) for g in guidances for s in strengths]


def _distributions(model, images: torch.Tensor, settings: Sequence[tuple], seed: int) -> dict[str, CaptionDistribution]:
    """:meth:`Guide.of` of every setting (MCS masks from ``seed``), sharing what the settings share: the image
    encoded once (``condition``), and one guide's condition pair (its cross-attention keys/values) for its rule
    at every strength, and for both MCS rules (their masks depend on the seed only). Same numbers."""
    v = model.condition(images)  # [B, T, W]
    pairs: dict[str, CaptionDistribution] = {}  # "plain" | "null" | "masked" -> the first guide built on it
    out = {}
    for g, s in settings:
        scale = scale_of(g, s)
        kind = "plain" if is_unguided(g, scale) else "null" if g == "cfg" else "masked"
        if kind not in pairs:
            pairs[kind] = Guide.of(model, images, g, scale, seed=seed, condition=v)
        out[strength_label(g, s)] = pairs[kind] if kind == "plain" else Guide(model, pairs[kind].context, g, scale)
    return out


@torch.no_grad()
def caption_sweep(model, items: Sequence[dict], settings: Sequence[tuple], *, length: int = 15, batch_size: int = 32,
                  device: str = "cpu", seed: int = 0) -> dict[str, dict]:
    """``{label: {image_id: caption}}`` (labels of :func:`strength_label`): MDC captions of every item
    under each (guidance, strength) of ``settings`` (:func:`sweep_settings`), those of ``mdc.generate``
    with each setting; a batch's encodings are shared between settings (:func:`_distributions`). MCS
    masks of the batch starting at item i use seed ``seed + i``."""
    for g, s in settings:
        check_guidance(model, g, None, s)
    model.to(device).eval()
    transform, out = image_transform(model), {strength_label(g, s): {} for g, s in settings}
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        images = torch.stack([transform(load_image(it)) for it in batch]).to(device)  # [B, 3, S, S]
        with evaluating(model, "auto"):  # as mdc.generate encodes
            dists = _distributions(model, images, settings, seed + start)
        for label, dist in dists.items():
            caps = sampler.generate(model, images, length, encode=lambda m, x, d=dist: d)
            out[label].update({it["image_id"]: c for it, c in zip(batch, caps)})
    return out


def clipscore_sweep(clip: str, items: Sequence[dict], captions: dict[str, dict], *, prefix: str | None = None,
                    device: str = "cpu") -> tuple[dict | None, dict | None, str | None]:
    """CLIPScore and RefCLIPScore per label: ``({label: {clipscore, refclipscore, per_image}}, clip info, None)``
    (means over images; ``per_image``: the CLIPScores [N], in item order), or ``(None, None, why)``
    without a CLIP (``clip = ""``). Images and references are embedded once for every label."""
    if not clip:
        return None, None, ("no clip_checkpoint given: CLIPScore needs a CLIP (a checkpoint trained with "
                            "objective 'clip', or 'open_clip:<arch>:<local weights file>')")
    model = load_clip(clip, prefix, device)
    refs = [it["references"] for it in items]
    image = model.images([load_image(it) for it in items])  # [N, E]
    ref = list(model.texts([r for rs in refs for r in rs]).split([len(rs) for rs in refs]))
    scores = {}
    for label, caps in captions.items():
        text = model.texts([caps[it["image_id"]] for it in items])  # [N, E]
        per_image = clip_score(image, text)
        scores[label] = {"clipscore": float(per_image.mean()),
                         "refclipscore": float(ref_clip_score(image, text, ref).mean()),
                         "per_image": per_image.tolist()}
    info = {"checkpoint": clip, "checkpoint_id": None if model.kind == "open_clip" else checkpoint_id(clip),
            "kind": model.kind, "prefix": model.prefix}
    return scores, info, None


# ----------------------------------------------------------------------------- per-image outcomes, distances
def reference_outcomes(captions: dict[str, dict], references: dict, image_ids: Sequence) -> dict[str, dict] | None:
    """Per image (``image_ids`` order), per label: ``{"cider": [N], "bleu": [N, 6]}``: pycocoevalcap's
    per-image CIDEr (IDF from the whole set's references; its mean is the corpus CIDEr) and BLEU counts
    (length, closest reference length, clipped 1..4-gram matches; summed, they give corpus BLEU-4,
    :func:`bleu4`). One PTB tokenizer run for every label; None if it fails."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer
    from pycocoevalcap.cider.cider import Cider

    try:
        gts = ptb_tokenize({i: list(references[i]) for i in image_ids})
        res = ptb_tokenize({(label, i): [c[i]] for label, c in captions.items() for i in image_ids})
    except Exception as exn:  # Java missing, ...: evaluate_captions names the reason
        logger.warning("per-image reference outcomes unavailable: %s", exn)
        return None
    out = {}
    for label in captions:
        hyp = {i: res[(label, i)] for i in image_ids}
        _, cider = Cider().compute_score({i: gts[i] for i in image_ids}, hyp)
        bleu = BleuScorer(n=4)
        for i in image_ids:
            bleu += (hyp[i][0], gts[i])
        counts = [[c["testlen"], min((abs(r - c["testlen"]), r) for r in c["reflen"])[1], *c["correct"]]
                  for c in bleu.ctest]
        out[label] = {"cider": [float(x) for x in cider], "bleu": counts}
    return out


def bleu4(counts: np.ndarray) -> np.ndarray:
    """Corpus BLEU-4 (pycocoevalcap's formula, "closest" reference length) of the images' counts
    [..., N, 6] (:func:`reference_outcomes`), summed over the images."""
    guess = np.stack([np.maximum(counts[..., 0] - k, 0) for k in range(4)], -1).sum(-2)  # [..., 4]
    t, r, correct = counts[..., 0].sum(-1), counts[..., 1].sum(-1), counts[..., 2:].sum(-2)
    score = np.ones(t.shape)
    for k in range(4):
        score = score * ((correct[..., k] + 1e-15) / (guess[..., k] + 1e-9))  # as pycocoevalcap rounds
    ratio = (t + 1e-15) / (r + 1e-9)
    return score ** 0.25 * np.where(ratio < 1, np.exp(1 - 1 / np.minimum(ratio, 1)), 1.0)


def _word_edit(a: str, b: str) -> float:
    """Word-level Levenshtein distance of two captions over the longer one's length (0: the same words)."""
    x, y = a.split(), b.split()
    row = list(range(len(y) + 1))
    for i, wx in enumerate(x, 1):
        prev, row[0] = row[0], i
        for j, wy in enumerate(y, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (wx != wy))
    return row[-1] / max(len(x), len(y), 1)


def _pack(values, digits: int | None = None) -> str:
    flat = np.asarray(values).reshape(-1).tolist()
    return " ".join(str(int(v)) if digits is None else f"{v:.{digits}f}" for v in flat)


def guidance_results(settings: Sequence[tuple], metrics: dict, clip: dict | None, clip_info: dict | None,
                     clip_reason: str | None, *, dataset: dict, length: int, captions: dict | None = None,
                     outcomes: dict | None = None, image_ids: Sequence | None = None) -> dict:
    """The ``results`` of a guidance results file (module docstring) from the (guidance, strength)
    ``settings``, ``mdc.eval.captioning.evaluate_captions``' ``metrics``, :func:`clipscore_sweep`, and,
    for distances and per-image outcomes, the ``captions``, :func:`reference_outcomes` and ``image_ids``."""
    runs, unavailable, reported = [], {}, ("bleu4", "meteor", "cider")
    base = captions.get("none") if captions else None
    for g, s in settings:
        label, m = strength_label(g, s), metrics[strength_label(g, s)]
        c, missing = (clip or {}).get(label, {}), {k: v for k, v in m["unavailable"].items() if k in reported}
        run = {"label": label, "guidance": g or "none", "strength": s, "scale": scale_of(g, s),
               **{k: m[k] for k in reported},
               "clipscore": c.get("clipscore"), "refclipscore": c.get("refclipscore"), "unavailable": missing}
        if base is not None and image_ids is not None:
            pairs = [(captions[label][i], base[i]) for i in image_ids]
            run["changed"] = float(np.mean([a != b for a, b in pairs]))
            run["word_edit"] = float(np.mean([_word_edit(a, b) for a, b in pairs]))
            per = {"clipscore": _pack(c["per_image"], 4)} if "per_image" in c else {}
            if outcomes and label in outcomes:
                per.update(cider=_pack(outcomes[label]["cider"], 4), bleu=_pack(outcomes[label]["bleu"]))
            run["per_image"] = per
        runs.append(run)
        for key, why in missing.items():
            unavailable.setdefault(key, why)
    if clip_reason:
        unavailable["clipscore"] = unavailable["refclipscore"] = clip_reason
    return {"dataset": dict(dataset), "length": length, "runs": runs, "clip": clip_info, "unavailable": unavailable}


def run_intervals(results: dict, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, dict]:
    """Percentile bootstrap intervals over images, ``{label: {metric: [lo, hi]}}``, from the runs'
    ``per_image`` outcomes: "clipscore", "cider" (means of per-image values), "bleu4" (corpus BLEU-4
    of the resampled images' summed counts) and "delta_clipscore" (minus the unguided run's, paired).
    Every run resamples the same images, so intervals of different runs compare paired. Runs without
    per-image outcomes (older files) get none."""
    per = {r["label"]: r.get("per_image") or {} for r in results["runs"]}
    n = next((len(p[k].split()) for p in per.values() for k in ("clipscore", "cider") if k in p), 0)
    if not n:
        return {}
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))  # [R, N]
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    unpack = lambda text: np.array(text.split(), dtype=float)  # noqa: E731
    draws = {}
    for label, p in per.items():
        d = {k: unpack(p[k])[idx].mean(1) for k in ("clipscore", "cider") if k in p}
        if "bleu" in p:
            d["bleu4"] = bleu4(unpack(p["bleu"]).reshape(n, 6)[idx])  # [R, N, 6] -> [R]
        draws[label] = d
    base = draws.get("none", {}).get("clipscore")
    out = {}
    for label, d in draws.items():
        if base is not None and "clipscore" in d:
            d["delta_clipscore"] = d["clipscore"] - base
        out[label] = {k: [float(x) for x in np.percentile(v, q)] for k, v in d.items()}
    return out


def guided_compositionality(model, suites: dict, settings: Sequence[tuple], *, method: str = "heuristic",
                            num_samples: int = 256, seed: int = 0, batch_size: int = 32, device: str = "cpu",
                            resamples: int = 200, blind: bool = True) -> dict:
    """Does guided scoring change compositionality? Every suite (``mdc.eval.compositionality.load_suites``)
    scored by the MDC scorer ``method`` under each (guidance, strength) (one scoring variant each,
    :func:`mdc.eval.compositionality.score_variants`), aggregated as Table 2 (``summarise``). Returns
    ``{"method", "table2": {label: {column: accuracy}}`` (labels of :func:`strength_label`, plus ``label_lengthnorm``),
    ``"columns": {column: {label: {"accuracy", "ci"}}}}``. The ELBO's noise (and, for the ELBO,
    MCS's masks) come from ``seed``; the heuristic scorer's MCS masks from seed 0. ``blind``: each
    setting's image-free and debiased scores too (``label_blind``, ``label_debiased``,
    :func:`mdc.eval.compositionality.with_blind`)."""
    for g, s in settings:
        check_guidance(model, g, None, s)
    elbo = dict(num_samples=num_samples, seed=seed) if method == "elbo" else {}
    scoring = {strength_label(g, s): dict(method=method, guidance=g, guidance_strength=s, **elbo) for g, s in settings}
    scoring = comp.with_blind(model, scoring) if blind else scoring
    model.to(device).eval()
    transform = image_transform(model)
    scored = {name: comp.score_variants(model, transform, suite, scoring, batch_size=batch_size, device=device)
              for name, suite in suites.items()}
    summary = comp.summarise(scored, resamples=resamples, seed=seed)
    columns = {c: {v: {"accuracy": e["scores"][v]["accuracy"], "ci": e["scores"][v]["ci"]} for v in e["scores"]}
               for c, e in summary["columns"].items()}
    return {"method": method, "table2": summary["table2"], "columns": columns}


def runs_markdown(results: dict, intervals: dict | None = None) -> str:
    """The runs of a guidance ``results`` as a Markdown table (metrics in %, CLIPScores as is, "-" where
    missing), with :func:`run_intervals`' 95% intervals where given and the fraction of captions changed."""
    ci = intervals or {}

    def cell(r, key, scale, digits):
        value, lo_hi = r.get(key), ci.get(r["label"], {}).get(key)
        text = "-" if value is None else f"{scale * value:.{digits}f}"
        if value is None or lo_hi is None:
            return text
        return f"{text} [{scale * lo_hi[0]:.{digits}f}, {scale * lo_hi[1]:.{digits}f}]"

    lines = ["| run | BLEU-4 | METEOR | CIDEr | CLIPScore | RefCLIPScore | changed |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {cell(r, 'bleu4', 100, 1)} | {cell(r, 'meteor', 100, 1)} | "
              f"{cell(r, 'cider', 100, 1)} | {cell(r, 'clipscore', 1, 3)} | {cell(r, 'refclipscore', 1, 3)} | "
              f"{cell(r, 'changed', 100, 0)} |"
              for r in results["runs"]]
    return "\n".join(lines) + "\n"
