"""Claim 8 (Table 3: MDC samples captions comparable to ARC's) as claim rows: paired differences in CIDEr-D
points between two caption sets of the same captioning runs, with the intervals, p-values and verdicts of
the probe claims (:mod:`reproduce.claims.claim_rows`, :mod:`reproduce.claims.stats`).

Why CIDEr-D and why these pairs, decided before the rows were read: CIDEr-D's corpus score is the mean of
its per-image scores (its IDF comes from the references alone), so a difference of two caption sets is a
mean of per-image differences, paired by image as the probe claims pair test items; BLEU's per-image scores
do not average to its corpus score. The rows compare at matched length, where a length-sensitive metric
compares captioners rather than lengths:

- MDC at ARC's length (each image's ARC beam-6 caption length, in tokens) against ARC (beam 6);
- MDC and ARC both at the references' median length per image (ARC's [EOT] held back until it);
- MDC-10 against ARC (beam 6), the paper's own comparison, lengths unmatched (labelled so).

Each is an "equal" claim (the paper: MDC's captions are reasonable, comparable to ARC's; it does not say
better). The interval. For seed s and test image i, D_si = CIDEr_a - CIDEr_b; d_s = 100 mean_i D_si; the
items part of the variance uses the per-image differences averaged over seeds (the captioning test set is
the same in every seed: one data run), the seeds part the spread of d_s (Student's t, seeds - 1 df), as in
:func:`reproduce.claims.stats.difference`. With one seed the seeds' spread is taken as SEED_SD.

SEED_SD (one seed only, CIDEr points): from the three-seed reference run of ``mini`` (package
e9db34bbab887a3f), whose seed SDs of CIDEr were 13.6 (MDC-10) and 7.3 (ARC): a difference of the two has an
SD of about sqrt(13.6^2 + 7.3^2) = 15.4 if they vary independently; rounded up to 16.

The margin: MARGIN_FRACTION (10%, as the probe claims' fraction of the gain over random init) of what ARC
(beam 6) gains by reading its image: its CIDEr-D minus its CIDEr-D with each caption scored against another
image's references (the wrong-image control, :func:`mdc.eval.metrics.another_image_cider`), the mean over the
seeds in the records. A difference under a tenth of the reference captioner's image-given gain is one we would
not call a difference in captioning. Without that control in the records (runs before it was kept),
FALLBACK_MARGIN (8 points: a tenth of the reference run's 80.1 CIDEr).
"""
from __future__ import annotations

import numpy as np

from reproduce.claims.stats import difference

__all__ = ["CAPTION_CLAIMS", "CaptionClaim", "SEED_SD", "margin", "paired_images"]

SEED_SD = 16.0  # CIDEr points: a difference's seed SD with one seed (module docstring)
MARGIN_FRACTION = 0.10  # of ARC (beam 6)'s CIDEr
FALLBACK_MARGIN = 8.0  # CIDEr points, without the wrong-image control of ARC in the records
REFERENCE = "arc-beam6"  # the caption set the margin is a fraction of
CLAIM = "8. MDC's captions are comparable to ARC's (Tab. 3)"


class CaptionClaim:
    """Caption set ``a`` against caption set ``b`` of the same captioning runs (names as the results hold them)."""

    def __init__(self, a: str, b: str, what: str, expect: str = "equal"):
        self.claim, self.a, self.b, self.what, self.expect = CLAIM, a, b, what, expect

    @property
    def sides(self) -> tuple[str, str]:
        """(A, B) as ``what`` names them: "A - B, how, metric" -> (A, B)."""
        a, rest = self.what.split(" - ", 1)
        return a, rest.split(", ", 1)[0]


CAPTION_CLAIMS = (
    CaptionClaim("mdc-arc", "arc-beam6", "MDC at ARC's length - ARC (beam 6), CIDEr-D"),
    CaptionClaim("mdc-ref", "arc-beam6-ref", "MDC - ARC (beam 6), both at the references' length, CIDEr-D"),
    CaptionClaim("mdc-10", "arc-beam6", "MDC-10 - ARC (beam 6), lengths unmatched, CIDEr-D"),
)


def _captioning(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r["notebook"] == "captioning" and "table3" in r["artifacts"]]


def paired_images(runs: list[dict], claim: CaptionClaim) -> list[tuple[dict, dict]]:
    """[({"cider": per-image CIDEr of a}, {"cider": ... of b})] per seed whose captioning run holds both sets'
    per-image scores; the same images, in the same order, in every seed."""
    pairs, by_seed, images = [], {}, None
    for r in _captioning(runs):
        seed = r["labels"].get("seed", 0)
        if seed in by_seed:
            raise ValueError(f"claim {claim.what!r}: two captioning runs of seed {seed} ({by_seed[seed]} and {r['name']})")
        by_seed[seed] = r["name"]
        results = r["record"]["results"]
        metrics = results["metrics"]
        if not all("cider_per_image" in metrics.get(s, {}) for s in (claim.a, claim.b)):
            continue
        ids = results["dataset"].get("image_ids")
        if images is not None and ids != images:
            raise ValueError(f"claim {claim.what!r}: {r['name']} captioned other test images than the seeds before it")
        images = ids
        pairs.append(({"cider": np.asarray(metrics[claim.a]["cider_per_image"])},
                      {"cider": np.asarray(metrics[claim.b]["cider_per_image"])}))
    if not pairs:
        raise ValueError(f"no captioning run holds per-image CIDEr of {claim.a} and {claim.b} (records written "
                         f"before they were kept, or a set not captioned)")
    return pairs


def margin(runs: list[dict]) -> float | None:
    """MARGIN_FRACTION of ARC (beam 6)'s mean gain in CIDEr-D (points) over its wrong-image control across the
    captioning runs; None where no run holds both."""
    sets = [r["record"]["results"]["metrics"].get(REFERENCE, {}) for r in _captioning(runs)]
    gains = [m["cider"] - m["cider_another_image"] for m in sets
             if m.get("cider") is not None and m.get("cider_another_image") is not None]
    return round(MARGIN_FRACTION * 100 * float(np.mean(gains)), 1) if gains else None


def caption_difference(runs: list[dict], claim: CaptionClaim) -> dict:
    """:func:`reproduce.claims.stats.difference` of the claim's per-image CIDEr, in CIDEr points."""
    return difference(paired_images(runs, claim), seed_sd=SEED_SD, tasks=("cider",))
