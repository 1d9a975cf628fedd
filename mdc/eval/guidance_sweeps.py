"""MC-Diffusion's guidance, evaluated: caption and compositionality sweeps over (guidance, strength).

The guidance itself (CFG, MCS as printed, MCS mirrored) is :mod:`mdc.guidance`. Sweeps run each
rule at guidance *strengths* s > 0, the distance from the rule's unguided scale (CFG at scale
1 + s, MCS as printed at s, mirrored MCS at 1 + s), so that one x value means the same for every
rule; strength 0, the plain model, is the unguided run every sweep starts with. This module runs it over evaluation
sets for ``notebooks/guidance.ipynb``: captions under each setting (:func:`caption_sweep`),
their CLIPScores (:func:`clipscore_sweep`), the results record (:func:`guidance_results`) and
the Table 2 suites scored under each setting (:func:`guided_compositionality`).

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
                "unavailable": {metric: why}}],                # the unguided run first
      "clip": {"checkpoint", "kind": "mdc" | "open_clip", "prefix"} | null,
      "unavailable": {metric: why},        # e.g. "clipscore": no clip_checkpoint given
      "compositionality": null | {"method": "heuristic" | "elbo",
                "table2": {label (+ "_lengthnorm"): {column: accuracy}},
                "columns": {column: {label: {"accuracy", "ci": [lo, hi]}}}},  # synthetic suites
      "files": {"predictions": path, "figure": path}   # {label: {image_id: caption}}; the trade-off figure
    }
"""
from __future__ import annotations

from typing import Sequence

import torch

from mdc.api import generate
from mdc.data.formats import load_image
from mdc.eval import compositionality as comp
from mdc.eval.clipscore import clip_scores, load_clip
from mdc.factory import image_transform
from mdc.guidance import GUIDANCE, RULES, check_guidance, scale_label, scale_of, strength_label, strength_of

__all__ = ["caption_sweep", "check_guidance", "clipscore_sweep", "guidance_results", "guided_compositionality",
           "runs_markdown", "RULES", "scale_label", "scale_of", "strength_label", "strength_of", "sweep_settings"]


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


@torch.no_grad()
def caption_sweep(model, items: Sequence[dict], settings: Sequence[tuple], *, length: int = 15, batch_size: int = 32,
                  device: str = "cpu", seed: int = 0) -> dict[str, dict]:
    """``{label: {image_id: caption}}`` (labels of :func:`strength_label`): MDC captions of every item
    under each (guidance, strength) of ``settings`` (:func:`sweep_settings`). MCS masks of the batch
    starting at item i use seed ``seed + i``."""
    for g, s in settings:
        check_guidance(model, g, None, s)
    model.to(device).eval()
    transform, out = image_transform(model), {strength_label(g, s): {} for g, s in settings}
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        images = torch.stack([transform(load_image(it)) for it in batch]).to(device)  # [B, 3, S, S]
        for g, s in settings:
            caps = generate(model, images, length, guidance=g, guidance_strength=s, guidance_seed=seed + start)
            out[strength_label(g, s)].update({it["image_id"]: c for it, c in zip(batch, caps)})
    return out


def clipscore_sweep(clip: str, items: Sequence[dict], captions: dict[str, dict], *, prefix: str | None = None,
                    device: str = "cpu") -> tuple[dict | None, dict | None, str | None]:
    """Mean CLIPScore and RefCLIPScore per label: ``({label: {clipscore, refclipscore}}, clip info, None)``,
    or ``(None, None, why)`` without a CLIP (``clip = ""``)."""
    if not clip:
        return None, None, ("no clip_checkpoint given: CLIPScore needs a CLIP (a checkpoint trained with "
                            "objective 'clip', or 'open_clip:<arch>:<local weights file>')")
    model = load_clip(clip, prefix, device)
    images, refs = [load_image(it) for it in items], [it["references"] for it in items]
    scores = {}
    for label, caps in captions.items():
        s = clip_scores(model, images, [caps[it["image_id"]] for it in items], refs)
        scores[label] = {k: float(v.mean()) for k, v in s.items()}
    return scores, {"checkpoint": clip, "kind": model.kind, "prefix": model.prefix}, None


def guidance_results(settings: Sequence[tuple], metrics: dict, clip: dict | None, clip_info: dict | None,
                     clip_reason: str | None, *, dataset: dict, length: int) -> dict:
    """The ``results`` of a guidance results file (module docstring) from the (guidance, strength)
    ``settings``, ``mdc.eval.captioning.evaluate_captions``' ``metrics`` and :func:`clipscore_sweep`."""
    runs, unavailable, reported = [], {}, ("bleu4", "meteor", "cider")
    for g, s in settings:
        label, m = strength_label(g, s), metrics[strength_label(g, s)]
        c, missing = (clip or {}).get(label, {}), {k: v for k, v in m["unavailable"].items() if k in reported}
        runs.append({"label": label, "guidance": g or "none", "strength": s, "scale": scale_of(g, s),
                     **{k: m[k] for k in reported},
                     "clipscore": c.get("clipscore"), "refclipscore": c.get("refclipscore"), "unavailable": missing})
        for key, why in missing.items():
            unavailable.setdefault(key, why)
    if clip_reason:
        unavailable["clipscore"] = unavailable["refclipscore"] = clip_reason
    return {"dataset": dict(dataset), "length": length, "runs": runs, "clip": clip_info, "unavailable": unavailable}


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


def runs_markdown(results: dict) -> str:
    """The runs of a guidance ``results`` as a Markdown table (metrics in %, CLIPScores as is, "-" where missing)."""
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    num = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["| run | BLEU-4 | METEOR | CIDEr | CLIPScore | RefCLIPScore |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {pct(r['bleu4'])} | {pct(r['meteor'])} | {pct(r['cider'])} | {num(r['clipscore'])} | "
              f"{num(r['refclipscore'])} |" for r in results["runs"]]
    return "\n".join(lines) + "\n"
