"""Positive controls of a compositionality suite: does the image decide it at all?

Every Table 2 cell is read beside three accuracies of the same scorer on the same items and noise
keys (:func:`cell_controls`): with the item's own image, with another item's image (``<variant>_shuffled``:
a fixed, seeded derangement of the suite's images, :func:`mdc.eval.suites.shuffled_images`) and with no
image (``<variant>_blind``, :mod:`mdc.eval.compositionality`). A scorer that reads the image must lose
accuracy when shown the wrong one; a scorer whose accuracy does not move is deciding from the text.

The rule, fixed before any model was scored (:func:`control_margin`): a suite's control passes when at
least one scorer's own-image accuracy beats its shuffled-image accuracy by at least
``2 sqrt(0.5 / n)`` (rounded up to a whole point), n the suite's items: two standard errors of the
difference of two accuracies near 50% over n items each, taken as independent. Own- and shuffled-image
outcomes of one item share captions and noise, so the true standard error is smaller and the margin
errs towards "control failed". At n = 150 the margin is 12 points, at n = 500 7 points. A suite whose
control failed is no verdict on any method (:func:`control_status`).

The binding diagnostic for the MDC scorers (:func:`binding_scores`): for a swap item (the false caption
the true one with two objects' attribute words exchanged, every mention), mask exactly the positions
where the two captions differ, keep the rest visible, and compare log p(true words) with log p(swapped
words) at those positions, one forward pass: does the model put each attribute on the right object when
everything else is given?
"""
from __future__ import annotations

import math

import numpy as np
import torch

from mdc.data.formats import load_image
from mdc.distribution import encode, encode_null

STATUS = ("passed", "control failed", "not run")


def control_margin(n: int) -> float:
    """The least own - shuffled accuracy difference (a fraction) that shows the image decides a suite of
    ``n`` items: 2 sqrt(0.5 / n), rounded up to a whole point (module docstring)."""
    if n < 1:
        raise ValueError(f"a suite needs items; got n={n}")
    return math.ceil(100 * 2 * math.sqrt(0.5 / n) - 1e-9) / 100


def cell_controls(entry: dict, variant: str) -> dict:
    """``{"own", "shuffled", "no_image"}`` accuracies of ``variant`` in one results ENTRY; ``no_image`` None
    for a scorer without an image-free score (CLIP's cosine)."""
    scores = entry["scores"]
    blind = scores.get(f"{variant}_blind")
    return {"own": scores[variant]["accuracy"], "shuffled": scores[f"{variant}_shuffled"]["accuracy"],
            "no_image": None if blind is None else blind["accuracy"]}


def control_status(cells: list[dict], n: int) -> str:
    """"passed" when some scorer's own-image accuracy beats its shuffled-image one by :func:`control_margin`
    (``n`` items), "control failed" when none does, "not run" when no scorer has a shuffled-image accuracy."""
    pairs = [(c["own"], c["shuffled"]) for c in cells if c["own"] is not None and c["shuffled"] is not None
             and not (np.isnan(c["own"]) or np.isnan(c["shuffled"]))]
    if not pairs:
        return "not run"
    return "passed" if any(own - other >= control_margin(n) - 1e-9 for own, other in pairs) else "control failed"


@torch.no_grad()
def binding_scores(model, images: torch.Tensor, true: list[str], swapped: list[str], null: bool = False) -> torch.Tensor:
    """[N] log p(true words) - log p(swapped words) at the positions where caption ``true[i]`` and ``swapped[i]``
    differ, those positions masked and the rest of the caption visible, given image ``images[i]`` [N, 3, S, S]
    (``null``: the model's learned null condition instead). NaN where the two captions' token counts differ
    or they do not differ (no binding to test). > 0: the true assignment of words to objects wins."""
    tok = model.tokenizer
    t, s = tok.tokenize(true)[0].to(images.device), tok.tokenize(swapped)[0].to(images.device)  # [N, L]
    differ = t != s  # [N, L] the swapped words' positions
    x = t.masked_fill(differ, tok.mask_id)  # [N, L] the rest of the caption visible
    logp = (encode_null if null else encode)(model, images).log_probs(x)  # [N, L, V]
    gap = (logp.gather(-1, t[..., None]) - logp.gather(-1, s[..., None])).squeeze(-1)  # [N, L]
    out = torch.where(differ, gap, torch.zeros_like(gap)).sum(1).double().cpu()  # [N]
    same_length = (t == tok.eot_id).float().argmax(1) == (s == tok.eot_id).float().argmax(1)  # [N]
    return torch.where(same_length.cpu() & differ.any(1).cpu(), out, torch.full_like(out, math.nan))


def binding_accuracy(model, transform, suite, other: np.ndarray | None = None, batch_size: int = 32) -> dict:
    """The binding diagnostic over a swap suite's items (true caption first, swapped second): the fraction
    of testable items (equal token counts) whose true assignment wins with their own image, with the
    image of item ``other[i]`` (the shuffled-image control, :func:`mdc.eval.suites.shuffled_images`) and,
    for a model with a null condition, with none; ``items``: the testable items."""
    device = next(model.parameters()).device
    image = lambda i: transform(load_image(suite.items[i]))  # noqa: E731
    views = {"own": list(range(len(suite.items)))}
    if other is not None and (other >= 0).all():
        views["shuffled"] = other.tolist()
    out = {}
    for view, index in views.items():
        scores = []
        for b in range(0, len(index), batch_size):
            rows = range(b, min(b + batch_size, len(index)))
            images = torch.stack([image(index[i]) for i in rows]).to(device)  # [B, 3, S, S]
            scores.append(binding_scores(model, images, [suite.candidates[i][0] for i in rows],
                                         [suite.candidates[i][1] for i in rows]))
        s = torch.cat(scores).numpy()
        out[view] = float(np.mean(s[~np.isnan(s)] > 0)) if (~np.isnan(s)).any() else None
        out["items"] = int((~np.isnan(s)).sum())
    out.setdefault("shuffled", None)
    out["no_image"] = None  # a model without a learned null condition has no one-pass image-free binding
    if getattr(model, "cond_null", None) is not None:
        images = torch.stack([image(i) for i in range(len(suite.items))]).to(device)
        s = binding_scores(model, images, [c[0] for c in suite.candidates], [c[1] for c in suite.candidates],
                           null=True).numpy()
        out["no_image"] = float(np.mean(s[~np.isnan(s)] > 0)) if (~np.isnan(s)).any() else None
    return out
