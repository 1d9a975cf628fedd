"""The statistics of a probe claim (:mod:`reproduce.claims.claim_rows`): the paired difference over seeds and test
items, its intervals, the p-values that agree with them, and Holm's adjustment over the claim rows.

The interval (the derivation is in :mod:`reproduce.claims.claim_rows`' docstring): d +- h(p), where
h(p) = sqrt(z_p^2 v_items + q_p^2 v_seeds), z_p the normal and q_p Student's t (seeds - 1 df; normal with
one seed) quantile at p. The 95% interval takes p = 0.975, the 90% one (TOST) p = 0.95.

The p-values are the same rule read the other way, so that a p-value below 5% and the interval excluding
the null value are one statement: the one-sided p-value of an excess e = d - null (in the direction
tested) is the tail probability P at which h(1 - P) = e (for e <= 0, 1 minus that of -e); the two-sided
p-value is twice the one-sided p-value of |e|. So two-sided p < 0.05 exactly when the 95% interval
excludes the null value, and both one-sided p-values of TOST < 0.05 exactly when the 90% interval lies
inside the margin. The quantiles come from an exact Student's t tail (integer df) inverted by bisection.

Holm (1979): with m p-values in increasing order p_(1) <= ... <= p_(m), the adjusted p_(i) is
max over j <= i of min(1, (m - j + 1) p_(j)); a row whose adjusted p is below 5% holds with the family's
chance of any false rejection at most 5%.
"""
from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

TASKS = ("object", "shape", "texture", "count")  # mean4
SEED_SD = 2.7  # points: seed SD of a difference with one seed (reproduce.claims.claim_rows' docstring)
LEVEL = 0.95


def bits(correct: str) -> np.ndarray:
    """A record's per-item outcomes, written as a string of 0s and 1s, as an array of 0/1 (uint8)."""
    return np.frombuffer(correct.encode(), np.uint8) - ord("0")


def probe_outcomes(results: dict) -> dict[str, np.ndarray]:
    """{task: per-item 0/1} of a linear-probe record's results over :data:`TASKS` (its datasets' ``correct``)."""
    return {t: bits(results["datasets"][f"wds/{t}"]["correct"]) for t in TASKS}


def t_sf(x: float, df: float) -> float:
    """P(T > x) for Student's t with integer ``df`` (normal for infinite df); Abramowitz-Stegun 26.7.3-4."""
    if x < 0:
        return 1.0 - t_sf(-x, df)
    if math.isinf(df):
        return NormalDist().cdf(-x)
    df = int(df)
    theta = math.atan(x / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: A = 2/pi (theta + sin cos (1 + 2/3 cos^2 + ...)), terms up to cos^(df-2)
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        inside = 2 / math.pi * (theta + (s * math.cos(theta) * total if df > 1 else 0.0))
    else:  # even: A = sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...), terms up to cos^(df-2)
        term, total = 1.0, 1.0
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        inside = s * total
    return max(0.0, (1.0 - inside) / 2)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile at ``p`` (normal for infinite df), by bisection on :func:`t_sf`; above 300 df
    the Cornish-Fisher expansion to 1/df^3 (error below 1e-8 there)."""
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if df > 300:
        z = NormalDist().inv_cdf(p)
        return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1 - p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, df) > 1 - p else (lo, mid)
    return (lo + hi) / 2


def quantiles(p: float, seeds: int) -> tuple[float, float]:
    """(z, q) at ``p``: the items' normal quantile and the seeds' t quantile with k - 1 df (z with one seed)."""
    return t_quantile(p, math.inf), t_quantile(p, math.inf if seeds == 1 else seeds - 1)


def half_width(d: dict, p: float) -> float:
    """h(p) of a :func:`difference` ``d``: its items part at the normal quantile, its seeds part at t's."""
    z, q = quantiles(p, d["seeds"])
    return math.sqrt(z**2 * d["v_items"] + q**2 * d["v_seeds"])


def difference(pairs: list[tuple[dict, dict]], seed_sd: float = SEED_SD, level: float = LEVEL,
               tasks: tuple[str, ...] = TASKS) -> dict:
    """Mean over seeds of mean4(a) - mean4(b), in points, and its intervals (module docstring):
    ``low``/``high`` at ``level``, ``tost_low``/``tost_high`` at 1 - 2 (1 - level) for TOST; ``v_items``
    and ``v_seeds``; ``seeds``; ``per_seed`` (the d_s). ``seed_sd`` (points) stands for the seeds' spread
    with one seed. ``tasks``: the keys of each side's per-item outcomes, averaged with equal weight (mean4's
    four tasks; claim 8's one, per-image CIDEr-D as a fraction, so that 100 x is CIDEr points)."""
    if not pairs:
        raise ValueError("no seed has runs on both sides")
    k = len(pairs)
    if any(len({len(p[side][t]) for p in pairs}) > 1 for t in tasks for side in (0, 1)):
        raise ValueError("every seed must be probed on the same test items")
    D = {t: np.stack([a[t].astype(float) - b[t].astype(float) for a, b in pairs]) for t in tasks}  # [k, N_t]
    per_seed = 100 * np.mean([D[t].mean(1) for t in tasks], axis=0)  # [k] d_s
    v_items = 100**2 / len(tasks)**2 * sum(D[t].mean(0).var(ddof=1) / D[t].shape[1] for t in tasks)
    v_seeds = seed_sd**2 if k == 1 else per_seed.var(ddof=1) / k
    mean = float(per_seed.mean())
    out = {"seeds": k, "mean": mean, "v_items": float(v_items), "v_seeds": float(v_seeds),
           "per_seed": [float(x) for x in per_seed], "items": int(sum(D[t].shape[1] for t in tasks))}
    for name, p in (("", 1 - (1 - level) / 2), ("tost_", level)):
        half = half_width(out, p)
        out[f"{name}low"], out[f"{name}high"] = mean - half, mean + half
    return out


def one_sided_p(d: dict, excess: float) -> float:
    """The tail probability P at which h(1 - P) = ``excess`` (the mean's distance beyond the null value, in
    the direction tested); 1 minus that of -excess when excess < 0 (module docstring)."""
    if excess < 0:
        return 1.0 - one_sided_p(d, -excess)
    if excess == 0 or d["v_items"] + d["v_seeds"] == 0:
        return 0.5 if excess == 0 else 0.0
    lo, hi = -30.0, math.log(0.5)  # bisection on log P: h(1 - P) falls as P grows
    if half_width(d, 1 - math.exp(lo)) < excess:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if half_width(d, 1 - math.exp(mid)) > excess else (lo, mid)
    return math.exp((lo + hi) / 2)


def two_sided_p(d: dict, null: float = 0.0) -> float:
    """p-value of mean = ``null``: below 1 - LEVEL exactly when the 95% interval excludes ``null``."""
    return min(1.0, 2 * one_sided_p(d, abs(d["mean"] - null)))


def tost_p(d: dict, margin: float) -> float:
    """p-value of two one-sided tests of |mean| >= ``margin``: the larger of the two one-sided p-values,
    below 1 - LEVEL exactly when the 90% interval lies inside +-margin."""
    return max(one_sided_p(d, d["mean"] + margin), one_sided_p(d, margin - d["mean"]))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``ps`` (module docstring), in the order given."""
    m = len(ps)
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out
