"""The paper's claims that rest on linear probes, each as the difference it names, with a 95% interval
and a verdict that follows from the interval (``figures/claims.md``; the README's claim table).

A claim compares two groups of probe runs, ``a`` and ``b`` (selected by their labels), on mean4: the
mean top-1 over the informative synthetic tasks (object, shape, texture, count). Runs of the same seed
are paired: both encoders were probed on the same test items. The difference in points is the mean
over seeds of ``mean4(a) - mean4(b)``. Its interval is a two-level bootstrap: each replicate draws the
seeds with replacement and, within every drawn seed, the test items of each task with replacement
(the same items for ``a`` and ``b``); the interval is the 2.5th and 97.5th percentiles of the replicates.
With one seed only the items are resampled, and the table says how many seeds there were.

Verdicts, fixed before the runs they judge were read:
- ``greater`` (the paper says ``a`` beats ``b``): reproduced if the interval lies above 0,
  contradicted if it lies below 0, otherwise not resolved;
- ``equal`` (the paper says ``a`` is comparable to ``b``): reproduced if the interval lies inside
  +-``EQUAL_MARGIN`` points, contradicted if it lies wholly outside, otherwise not resolved.

Claims that rest on other measurements (compositionality, Table 2; caption length, Fig. 6 and
Table 3) are judged in the README from their own tables.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from reproduce.report import write_table

TASKS = ("object", "shape", "texture", "count")  # mean4
EQUAL_MARGIN = 2.0  # points of mean4 within which two methods count as comparable
RESAMPLES = 4000


@dataclass(frozen=True)
class Claim:
    """``a`` vs ``b``: label values a probe run must have (None: the label must be absent)."""
    claim: str  # the paper's statement, with its table or figure
    a: dict
    b: dict
    expect: str = "greater"  # "greater": a beats b; "equal": a is comparable to b
    what: str = ""  # the difference, in words

    def __post_init__(self):
        if self.expect not in ("greater", "equal"):
            raise ValueError(f"Claim.expect must be 'greater' or 'equal', not {self.expect!r}")


def _main(method: str, style: str) -> dict:
    """A method's run at the profile's defaults (all pairs, default noise schedule)."""
    return dict(method=method, style=style, fraction=1.0, t_interval=None)


CLAIMS = (
    *(Claim("1. MDC's probe is comparable to ARC's (Tab. 1)", _main("MDC", s), _main("ARC", s), "equal",
            f"MDC - ARC, {s}") for s in ("descriptive", "alt")),
    *(Claim("2. Captioners beat CLIP on descriptive captions (Tab. 1)", _main(m, "descriptive"),
            _main("CLIP", "descriptive"), what=f"{m} - CLIP, descriptive") for m in ("MDC", "ARC")),
    *(Claim("4. The 1/t weight helps (Tab. 4)", _main("MDC", s), _main("MDC (w/o t)", s),
            what=f"MDC - MDC w/o 1/t, {s}") for s in ("alt", "descriptive")),
    Claim("5. t ~ U[0.5, 1] beats U[0, 1] (Tab. 5)", _main("MDC", "alt"),
          dict(method="MDC", style="alt", t_interval=[0.0, 1.0]), what="[0.5, 1] - [0, 1], alt"),
    *(Claim("6. MDC beats every fixed masking ratio (Fig. 4)", _main("MDC", "alt"),
            dict(method="BERT", style="alt", mask_ratio=r), what=f"MDC - BERT {r:.0%}, alt")
      for r in (0.15, 0.4, 0.7, 1.0)),
    Claim("7. More pairs give better probes (Fig. 5)", _main("MDC", "descriptive"),
          dict(method="MDC", style="descriptive", fraction=0.25), what="all pairs - 25% of them, descriptive"),
)


def _matches(labels: dict, want: dict) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def paired_items(runs: list[dict], claim: Claim) -> list[tuple[dict, dict]]:
    """[(a, b)] per seed present on both sides: each ``{task: array of 0/1}``, the per-item outcomes (1: right)."""
    def side(want: dict) -> dict[int, dict]:
        by_seed: dict[int, dict] = {}
        for r in runs:
            if r["notebook"] != "linear_probe" or not _matches(r["labels"], want):
                continue
            seed = r["labels"].get("seed", 0)
            if seed in by_seed:
                raise ValueError(f"claim {claim.what!r}: two probe runs of seed {seed} match {want} "
                                 f"({by_seed[seed]['name']} and {r['name']})")
            by_seed[seed] = {"name": r["name"], **_outcomes(r)}
        return by_seed

    a, b = side(claim.a), side(claim.b)
    pairs = []
    for seed in sorted(set(a) & set(b)):
        ra, rb = a[seed], b[seed]
        for t in TASKS:
            if len(ra[t]) != len(rb[t]):
                raise ValueError(f"claim {claim.what!r}, seed {seed}: {ra['name']} and {rb['name']} were probed on "
                                 f"{len(ra[t])} and {len(rb[t])} {t} items; pairs need the same test items")
        pairs.append(({t: ra[t] for t in TASKS}, {t: rb[t] for t in TASKS}))
    return pairs


def _outcomes(run: dict) -> dict[str, np.ndarray]:
    datasets = run["record"]["results"]["datasets"]
    out = {}
    for t in TASKS:
        r = datasets.get(f"wds/{t}")
        if r is None or "correct" not in r:
            raise ValueError(f"{run['name']}: no per-item outcomes for task {t!r} (probe results written before "
                             f"they were recorded): rerun its linear_probe")
        out[t] = np.frombuffer(r["correct"].encode(), dtype=np.uint8) - ord("0")
    return out


def difference(pairs: list[tuple[dict, dict]], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Mean over seeds of mean4(a) - mean4(b), in points, and its two-level bootstrap 95% interval."""
    if not pairs:
        raise ValueError("no seed has runs on both sides")
    rng = np.random.default_rng(seed)
    k = len(pairs)
    diffs = [{t: a[t].astype(np.int8) - b[t].astype(np.int8) for t in TASKS} for a, b in pairs]  # per item: -1, 0, 1
    observed = float(np.mean([np.mean([d[t].mean() for t in TASKS]) for d in diffs]))

    def resampled(d: np.ndarray, n: int) -> np.ndarray:  # [n] means of d over N items drawn with replacement
        counts = rng.multinomial(len(d), [np.mean(d == v) for v in (-1, 0, 1)], size=n)  # [n, 3]
        return (counts[:, 2] - counts[:, 0]) / len(d)

    # [k, resamples * k]: each seed's mean4 difference under independent item resamples, so that a seed
    # drawn twice in a replicate gets two resamples of its items
    boot = np.stack([np.mean([resampled(d[t], resamples * k) for t in TASKS], axis=0) for d in diffs])
    drawn = rng.integers(k, size=(resamples, k))  # [resamples, k] seeds drawn with replacement
    replicates = boot[drawn, np.arange(resamples * k).reshape(resamples, k)].mean(1)
    lo, hi = np.percentile(replicates, [2.5, 97.5])
    return {"seeds": k, "mean": 100 * observed, "low": 100 * float(lo), "high": 100 * float(hi)}


def verdict(expect: str, low: float, high: float, margin: float = EQUAL_MARGIN) -> str:
    """What the interval [low, high] (points) says of a claim that ``a`` beats (``greater``) or matches
    (``equal``) ``b``."""
    if expect == "greater":
        return "reproduced" if low > 0 else "contradicted" if high < 0 else "not resolved"
    if -margin < low and high < margin:
        return "reproduced"
    return "contradicted" if low >= margin or high <= -margin else "not resolved"


def build(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """``claims.md/.csv/.tex``: per claim the difference, seeds, mean, 95% interval and verdict."""
    rows = []
    for c in CLAIMS:
        row = {"claim": c.claim, "difference (mean4, points)": c.what}
        try:
            d = difference(paired_items(runs, c))
        except ValueError as exn:
            rows.append({**row, "seeds": "0", "mean": "-", "95% interval": "-", "verdict": f"not run ({exn})"})
            continue
        rows.append({**row, "seeds": str(d["seeds"]), "mean": f"{d['mean']:+.1f}",
                     "95% interval": f"[{d['low']:+.1f}, {d['high']:+.1f}]",
                     "verdict": verdict(c.expect, d["low"], d["high"])})
    return write_table(rows, os.path.join(out, "claims"),
                       f"The paper's probe claims: difference in mean4 points, mean over seeds, 95% interval over "
                       f"seeds and test items (two-level bootstrap, {RESAMPLES} replicates); 'comparable' means "
                       f"within +-{EQUAL_MARGIN:g} points")
