"""The paper's claims that rest on linear probes, each as the difference it names, with a 95% interval
and a verdict that follows from the interval (``figures/claims.md``; the build copies its table into the
README between ``<!-- claims:begin -->`` and ``<!-- claims:end -->``).

A claim compares two groups of probe runs, ``a`` and ``b`` (selected by their labels), on mean4: the
mean top-1 over the informative synthetic tasks (object, shape, texture, count). Runs of the same seed
are paired: both encoders were probed on the same test items, and every seed on the same items too.

The interval. For seed s = 1..k and item i of task t (N_t items), D_sti = y_a - y_b in {-1, 0, 1}
(1: right). The seed's difference is d_s = 100 * mean_t mean_i D_sti (points); the claim's is
d = mean_s d_s. Var(d) has two parts:

- test items, shared by all seeds (so item noise does not average out over seeds):
  v_items = 100^2 / 16 * sum_t var_i(Dbar_ti) / N_t, where Dbar_ti = mean_s D_sti and var_i is the
  sample variance over the task's items. It also holds each seed's own item-level noise, which s^2
  below holds again: conservative, by about that noise / k;
- training (seeds): v_seeds = s^2 / k, s^2 the sample variance of d_1..d_k. With one seed there is no
  s^2, and v_seeds = SEED_SD^2, taken as known.

The 95% interval is d +- sqrt(z^2 v_items + q^2 v_seeds): each part scaled by its own quantile, z = 1.96
for the items (thousands of them: their variance counts as known) and q the 97.5% quantile of Student's
t with k - 1 df for the seeds (q = z with one seed, SEED_SD being taken as known). It is the t-interval
when the seeds dominate, the normal one when the items do, and conservative in between. One t with
Welch-Satterthwaite df was tried and undercovers with 3 seeds (93% at a seed SD of 2.5 points): its df
grow exactly when s^2 happens to be small.

Why each claim's own seeds, not a seed variance pooled over the claims: the seed SD of a difference is
not one number (0.6 to 2.6 points over the pairs the learnability study measured; CLIP's mean4 at lr
1e-3 had a seed SD of 2.4 points, ARC's 0.5), and the claims share runs (MDC on alt captions is in seven),
so a pooled variance would be too small for some claims and its degrees of freedom overstated. The
price: with 2 or 3 seeds t has few df (12.7 at 2 seeds, 4.3 at 3) and the interval is wide.

SEED_SD (one seed only): the learnability study's largest seed SD of a difference of two trained models'
mean4 on the same test items (``reproduce/studies/learnability/runs.jsonl``, config c64x4, seeds 0-2:
CLIP at lr 1e-3 - CLIP at lr 3e-4, 2.62 points; ARC - CLIP 2.52, MDC - CLIP 2.05, MDC - ARC 1.26),
rounded up. A one-seed verdict leans on it, so it says "provisional".

Coverage (``tests/reproduce/test_claims.py``: two models' outcomes on the same 4 x 1,000 items, correlated
through item difficulty; seed SD of the difference 0.5 / 1 / 2 / 2.5 points; 400 replicates each):
one seed 100 / 100 / 99 / 96%, three seeds 98 / 99 / 97 / 98%. The two-level bootstrap this replaced
(seeds, then items within each drawn seed): 90 / 84 / 57 / 48% and 85 / 85 / 82 / 76%.

The margin. A difference counts as one of "that size" from m = MARGIN_FRACTION (10%) of the gain over
random init on the row's caption style: the mean, over CLIP, ARC and MDC (all pairs, default schedule)
and their seeds, of mean4(trained) - mean4(its random-init encoder), read from the same records. Why
this anchor, decided before the verdicts it gives were computed: a probe difference means something only
against what pretraining adds at this scale (mean4 gains of 10 to 27 points at ``mini``, against the
paper's tens of points), and that differs by caption style (alt captions teach less), so the margin
follows the style's gain; a tenth of it is the smallest difference we would call a difference in what
pretraining taught the encoder. A style whose records hold no random-init floor falls back to
FALLBACK_MARGIN points, and the row says so.

Verdicts, each row tested at 5% on its own (LEVEL; the p-values in :mod:`reproduce.claims_stats` agree
with the intervals):
- ``greater`` (the paper says ``a`` beats ``b``): "reproduced" if the 95% interval lies above 0 (and
  "reproduced, by less than m" if the 90% interval also lies inside +-m); "contradicted: A below B" if it
  lies below 0; "no effect of m points" if the 90% interval lies inside +-m (two one-sided tests, TOST:
  the difference is smaller than the margin either way); otherwise "not resolved";
- ``equal`` (the paper says ``a`` is comparable to ``b``, within +-m): "reproduced" if TOST rejects
  |difference| >= m (the 90% interval inside +-m); "contradicted: A below (above) B by more than m" if
  the 95% interval lies wholly below -m (above +m); otherwise "not resolved", followed by "; A below
  (above) B" where the 95% interval excludes 0 (a significant direction the margin does not resolve);
- with one seed every verdict is followed by "(provisional)".
Each row's p-value is that of the test its claim is reproduced by (``greater``: two-sided, difference 0;
``equal``: TOST at +-m); the table adds those p-values Holm-adjusted over the family of claim rows (the
verdicts stay per row, at 5%). The build also writes the verdict counts (:func:`summary`) into the
README and docs/results.md between ``<!-- claims-summary:begin -->`` and ``<!-- claims-summary:end -->``.

Claims that rest on other measurements (compositionality, Table 2; caption length, Fig. 6 and
Table 3) are not judged here: their tables carry the numbers (docs/results.md).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from reproduce.tables import write_table

TASKS = ("object", "shape", "texture", "count")  # mean4
EQUAL_MARGIN = 2.0  # points of mean4 within which two methods count as comparable
SEED_SD = 2.7  # points: seed SD of a difference with one seed (the largest measured, 2.62, rounded up)
LEVEL = 0.95
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"


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


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile, by integrating the density (normal for infinite df)."""
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    x = np.linspace(0.0, 80.0, 80_001)  # covers p <= 0.995 for df >= 1
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    cdf = 0.5 + np.r_[0.0, np.cumsum((f[1:] + f[:-1]) / 2 * np.diff(x))]
    return float(np.interp(p, cdf, x))


def difference(pairs: list[tuple[dict, dict]], seed_sd: float = SEED_SD, level: float = LEVEL) -> dict:
    """Mean over seeds of mean4(a) - mean4(b), in points, and its intervals (module docstring):
    ``low``/``high`` at ``level``, ``tost_low``/``tost_high`` at 1 - 2 (1 - level) for TOST; ``v_items``
    and ``v_seeds``; ``seeds``. ``seed_sd`` (points) stands for the seeds' spread with one seed."""
    if not pairs:
        raise ValueError("no seed has runs on both sides")
    k = len(pairs)
    if any(len({len(p[side][t]) for p in pairs}) > 1 for t in TASKS for side in (0, 1)):
        raise ValueError("every seed must be probed on the same test items")
    D = {t: np.stack([a[t].astype(float) - b[t].astype(float) for a, b in pairs]) for t in TASKS}  # [k, N_t]
    per_seed = 100 * np.mean([D[t].mean(1) for t in TASKS], axis=0)  # [k] d_s
    v_items = 100**2 / len(TASKS)**2 * sum(D[t].mean(0).var(ddof=1) / D[t].shape[1] for t in TASKS)
    v_seeds = seed_sd**2 if k == 1 else per_seed.var(ddof=1) / k
    mean = float(per_seed.mean())
    out = {"seeds": k, "mean": mean, "v_items": float(v_items), "v_seeds": float(v_seeds)}
    for name, p in (("", 1 - (1 - level) / 2), ("tost_", level)):
        z, q = _t_quantile(p, math.inf), _t_quantile(p, math.inf if k == 1 else k - 1)
        half = math.sqrt(z**2 * v_items + q**2 * v_seeds)
        out[f"{name}low"], out[f"{name}high"] = mean - half, mean + half
    return out


def verdict(expect: str, d: dict, margin: float = EQUAL_MARGIN) -> str:
    """What the intervals of ``d`` (a :func:`difference`) say of a claim that ``a`` beats (``greater``) or
    matches within +-``margin`` points (``equal``) ``b``; "(provisional)" with one seed."""
    if expect == "greater":
        word = "reproduced" if d["low"] > 0 else "contradicted" if d["high"] < 0 else "not resolved"
    elif -margin < d["tost_low"] and d["tost_high"] < margin:
        word = "reproduced"
    else:
        word = "contradicted" if d["low"] >= margin or d["high"] <= -margin else "not resolved"
    return word + (" (provisional)" if d["seeds"] == 1 else "")


def write_readme_table(readme: str, table: str) -> bool:
    """Replace the lines between ``<!-- claims:begin -->`` and ``<!-- claims:end -->`` of ``readme`` with
    ``table`` (Markdown lines); every other byte stays. Without the markers, say so and leave it alone.
    Returns whether the README now holds ``table``."""
    with open(readme, newline="") as f:
        text = f.read()
    i = text.find(BEGIN)
    j = text.find(END, i + len(BEGIN)) if i >= 0 else -1
    if j < 0:
        print(f"{readme}: no {BEGIN} ... {END} lines; its claim table was not rewritten")
        return False
    start = text.index("\n", i) + 1  # the line after the begin marker
    stop = text.rfind("\n", 0, j) + 1  # the start of the end marker's line
    newline = "\r\n" if text[start - 2:start] == "\r\n" else "\n"
    block = "".join(line + newline for line in table.splitlines())
    if text[start:stop] != block:
        with open(readme, "w", newline="") as f:
            f.write(text[:start] + block + text[stop:])
    return True


def build(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """``claims.md/.csv/.tex``: per claim the difference, seeds, mean, intervals and verdict. Built into the
    repository's ``figures/``, the README's claim table becomes the same table."""
    rows = []
    for c in CLAIMS:
        row = {"claim": c.claim, "difference (mean4, points)": c.what}
        try:
            d = difference(paired_items(runs, c))
        except ValueError as exn:
            rows.append({**row, "seeds": "0", "mean": "-", "95% interval": "-", "90% interval (TOST)": "-",
                         "verdict": f"not run ({exn})"})
            continue
        tost = f"[{d['tost_low']:+.1f}, {d['tost_high']:+.1f}]" if c.expect == "equal" else "-"
        rows.append({**row, "seeds": str(d["seeds"]), "mean": f"{d['mean']:+.1f}",
                     "95% interval": f"[{d['low']:+.1f}, {d['high']:+.1f}]", "90% interval (TOST)": tost,
                     "verdict": verdict(c.expect, d)})
    files = write_table(
        rows, os.path.join(out, "claims"),
        f"The paper's probe claims: difference in mean4 points, mean over seeds of the paired per-seed "
        f"difference; 95% interval from the seeds' spread (Student's t, seeds - 1 df) and the test items' "
        f"(normal; the same items in every seed), each with its own quantile. With one seed the seeds' "
        f"spread is taken as {SEED_SD:g} points, the largest the learnability study measured, and the verdict "
        f"is provisional. 'a beats b': reproduced if the interval lies above 0, contradicted if "
        f"below 0. 'Comparable' (within +-{EQUAL_MARGIN:g} points): reproduced by two one-sided tests at 5% "
        f"(the 90% interval inside +-{EQUAL_MARGIN:g}), contradicted if the 95% interval lies outside it. "
        f"Otherwise not resolved")
    if os.path.realpath(out) == os.path.realpath(os.path.join(ROOT, "figures")):
        with open(files[0]) as f:
            write_readme_table(os.path.join(ROOT, "README.md"), "".join(line for line in f if line.startswith("|")))
    return files
