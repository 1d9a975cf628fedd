"""The paper's claims that rest on linear probes, each as the difference it names, with its 95% and 90%
intervals, the p-value of its claim's test (Holm-adjusted over the rows too) and a verdict that follows
from the intervals (``figures/claims.md``, drawn as a forest plot in ``figures/claims.png``; the build copies
its table into the README between ``<!-- claims:begin -->`` and ``<!-- claims:end -->``, and the sentence
counting its verdicts into the README and docs/results.md). The statistics live in :mod:`reproduce.claims.stats`.

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

Verdicts, each row tested at 5% on its own (LEVEL; the p-values in :mod:`reproduce.claims.stats` agree
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

Claim 8 (Table 3's captions) is judged in CIDEr-D points at matched length, paired by test image, with the
same intervals and verdicts (:mod:`reproduce.claims.caption_claims`, which states its margin and one-seed spread).
Claims that rest on other measurements (compositionality, Table 2; caption length, Fig. 6) are not judged
here: their tables carry the numbers (docs/results.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from reproduce.claims.caption_claims import CAPTION_CLAIMS, CaptionClaim, caption_difference
from reproduce.claims.caption_claims import FALLBACK_MARGIN as CAPTION_FALLBACK
from reproduce.claims.caption_claims import SEED_SD as CAPTION_SEED_SD
from reproduce.claims.caption_claims import margin as caption_margin
from reproduce.claims.stats import LEVEL, SEED_SD, TASKS, bits, difference, holm, tost_p, two_sided_p
from reproduce.artifacts.probe_records import informative_mean, probe_top1
from reproduce.artifacts.interval_figures import plot_forest
from reproduce.artifacts.tables import write_table

__all__ = ["CAPTION_CLAIMS", "CLAIMS", "Claim", "LEVEL", "SEED_SD", "TASKS", "build", "difference", "margins", "paired_items",
           "summary", "verdict", "write_block", "write_readme_table"]
MARGIN_FRACTION = 0.10  # of the caption style's gain over random init (module docstring)
FALLBACK_MARGIN = 2.0  # points, for a style whose records hold no random-init floor
METHODS = ("CLIP", "ARC", "MDC")  # whose gains over random init anchor the margin
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
SUMMARY = ("<!-- claims-summary:begin -->", "<!-- claims-summary:end -->")


@dataclass(frozen=True)
class Claim:
    """``a`` vs ``b``: label values a probe run must have (None: the label must be absent)."""
    claim: str  # the paper's statement, with its table or figure
    a: dict
    b: dict
    expect: str = "greater"  # "greater": a beats b; "equal": a is comparable to b
    what: str = ""  # the difference, "A - B, style"

    def __post_init__(self):
        if self.expect not in ("greater", "equal"):
            raise ValueError(f"Claim.expect must be 'greater' or 'equal', not {self.expect!r}")

    @property
    def sides(self) -> tuple[str, str]:
        """(A, B) as ``what`` names them ("MDC - ARC, alt" -> ("MDC", "ARC")); ("a", "b") if it names none."""
        names = self.what.rsplit(", ", 1)[0].split(" - ") if " - " in self.what else []
        return (names[0], names[1]) if len(names) == 2 else ("a", "b")


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
        out[t] = bits(r["correct"])
    return out


def margins(runs: list[dict]) -> dict[str, float]:
    """{caption style: margin in points}: MARGIN_FRACTION of the mean gain of CLIP, ARC and MDC (all pairs,
    default schedule) over their random-init encoders on mean4, over seeds (module docstring); a style
    without such runs is absent."""
    gains: dict[str, list[float]] = {}
    for r in runs:
        style, record = r["labels"].get("style"), r["record"]
        if r["notebook"] != "linear_probe" or not any(_matches(r["labels"], _main(m, style)) for m in METHODS):
            continue
        trained = informative_mean(probe_top1(record))
        floor = informative_mean(probe_top1(record, floor=True)) if "random_init" in record["results"] else None
        if trained is not None and floor is not None:
            gains.setdefault(style, []).append(100 * (trained - floor))
    return {s: round(MARGIN_FRACTION * float(np.mean(g)), 1) for s, g in gains.items()}


def verdict(expect: str, d: dict, margin: float = FALLBACK_MARGIN, sides: tuple[str, str] = ("a", "b")) -> str:
    """What the intervals of ``d`` (a :func:`difference`) say, at 5%, of a claim that A beats B (``greater``)
    or matches it within +-``margin`` points (``equal``); "(provisional)" with one seed (module docstring)."""
    a, b = sides
    inside = -margin < d["tost_low"] and d["tost_high"] < margin  # TOST: |difference| < margin
    if expect == "greater":
        if d["low"] > 0:
            word = f"reproduced, by less than {margin:g}" if inside else "reproduced"
        elif d["high"] < 0:
            word = f"contradicted: {a} below {b}"
        else:
            word = f"no effect of {margin:g} points" if inside else "not resolved"
    elif inside:
        word = "reproduced"
    elif d["high"] < -margin or d["low"] > margin:
        word = f"contradicted: {a} {'below' if d['high'] < 0 else 'above'} {b} by more than {margin:g}"
    else:
        direction = "below" if d["high"] < 0 else "above" if d["low"] > 0 else ""
        word = f"not resolved; {a} {direction} {b}" if direction else "not resolved"
    return word + (" (provisional)" if d["seeds"] == 1 else "")


def claim_p(expect: str, d: dict, margin: float) -> float:
    """The p-value of the test a claim is reproduced by: two-sided at 0 (``greater``), TOST at +-margin."""
    return two_sided_p(d) if expect == "greater" else tost_p(d, margin)


def write_block(path: str, markers: tuple[str, str], text: str) -> bool:
    """Replace the lines between the ``markers`` lines of ``path`` with ``text`` (lines); every other byte
    stays. Without the file or the markers, say so and leave it alone. Returns whether the file now holds ``text``."""
    begin, end = markers
    if not os.path.isfile(path):
        print(f"{path}: no such file; its claims block was not written")
        return False
    with open(path, newline="") as f:
        content = f.read()
    i = content.find(begin)
    j = content.find(end, i + len(begin)) if i >= 0 else -1
    if j < 0:
        print(f"{path}: no {begin} ... {end} lines; its claims block was not rewritten")
        return False
    start = content.index("\n", i) + 1  # the line after the begin marker
    stop = content.rfind("\n", 0, j) + 1  # the start of the end marker's line
    newline = "\r\n" if content[start - 2:start] == "\r\n" else "\n"
    block = "".join(line + newline for line in text.splitlines())
    if content[start:stop] != block:
        with open(path, "w", newline="") as f:
            f.write(content[:start] + block + content[stop:])
    return True


def write_readme_table(readme: str, table: str) -> bool:
    """The README's claim table (between ``<!-- claims:begin -->`` and ``<!-- claims:end -->``) becomes
    ``table``: :func:`write_block`."""
    return write_block(readme, (BEGIN, END), table)


def summary(rows: list[dict]) -> str:
    """The verdict counts of the claims table's ``rows``, in one sentence (the README and docs/results.md
    hold it between the summary markers; nobody types it)."""
    verdicts = [r["verdict"] for r in rows]
    count = lambda prefix: sum(v.startswith(prefix) for v in verdicts)  # noqa: E731
    direction = sum(v.startswith("not resolved; ") for v in verdicts)
    held = sum(r["verdict"].startswith("reproduced") and r["Holm p"] not in ("-", "")
               and float(r["Holm p"].lstrip("<")) < 0.05 for r in rows)  # "<0.001" included
    parts = [f"{count('reproduced')} reproduced", f"{count('contradicted')} contradicted",
             f"{count('no effect')} with no effect of the margin's size",
             f"{count('not resolved')} not resolved" + (f" ({direction} of them with a significant direction)"
                                                         if direction else "")]
    if count("not run"):
        parts.append(f"{count('not run')} not run")
    ran = sum(r["Holm p"] not in ("-", "") for r in rows)  # Holm's family: the rows with a p-value
    return (f"Of the {len(rows)} claim rows, each tested at 5%: {', '.join(parts)}; {held} of the "
            f"{count('reproduced')} reproduced rows keep p < 0.05 after Holm's adjustment over the {ran} rows "
            f"that ran.")


def _row(c: Claim, runs: list[dict], margin: dict[str, float]) -> dict:
    """A probe claim's table row (:func:`_verdict_row`), its margin that of its caption style."""
    style = c.a.get("style")
    note = "" if style in margin else " (fixed: no random-init floor recorded)"
    return _verdict_row(c, lambda: difference(paired_items(runs, c)), margin.get(style, FALLBACK_MARGIN), note)


def _caption_row(c: CaptionClaim, runs: list[dict]) -> dict:
    """A claim-8 row (:mod:`reproduce.claims.caption_claims`): CIDEr-D points, its margin a tenth of ARC's gain over its
    wrong-image control."""
    m = caption_margin(runs)
    return _verdict_row(c, lambda: caption_difference(runs, c), CAPTION_FALLBACK if m is None else m,
                        "" if m is not None else " (fixed: no wrong-image control of ARC recorded)")


def _verdict_row(c, measure, m: float, note: str) -> dict:
    """One claim's table row from ``measure()`` (a :func:`difference`), with its p-value as a float under
    ``_p`` (None: not run)."""
    test = ("two-sided at 0" if c.expect == "greater" else "TOST") + f"; margin +-{m:g}" + note
    row = {"claim": c.claim, "difference (mean4, points)": c.what, "test at 5%": test}
    try:
        d = measure()
    except ValueError as exn:
        return {**row, "seeds": "0", "mean": "-", "95% interval": "-", "90% interval": "-", "p": "-",
                "verdict": f"not run ({exn})", "_p": None, "_d": None, "_m": m}
    p = claim_p(c.expect, d, m)
    return {**row, "seeds": str(d["seeds"]), "mean": f"{d['mean']:+.1f}",
            "95% interval": f"[{d['low']:+.1f}, {d['high']:+.1f}]",
            "90% interval": f"[{d['tost_low']:+.1f}, {d['tost_high']:+.1f}]", "p": _p_text(p),
            "verdict": verdict(c.expect, d, m, c.sides), "_p": p, "_d": d, "_m": m}


def _forest_row(c, row: dict) -> dict:
    """A claim row as the forest plot draws it (:func:`reproduce.artifacts.interval_figures.plot_forest`); claim 8's
    rows on an axis of their own, in CIDEr-D points."""
    d = row["_d"]
    verdict_ = row["verdict"].split(" (", 1)[0] if d is None else row["verdict"]  # "not run", its reason in the table
    return {"group": c.claim, "label": c.what, "verdict": verdict_,
            "unit": f"difference, {'CIDEr-D' if isinstance(c, CaptionClaim) else 'mean4'} points", "margin": row["_m"],
            "tost": c.expect == "equal" or row["verdict"].startswith(("no effect", "reproduced, by less than")),
            **({k: d[k] for k in ("mean", "low", "high", "tost_low", "tost_high")} if d else {"mean": None})}


def _p_text(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def build(runs: list[dict], paper_dir: str, out: str) -> list[str]:
    """``claims.md/.csv/.tex``: per claim the difference, its test, seeds, mean, intervals, p-value,
    Holm-adjusted p-value and verdict. Built into the repository's ``figures/``, the README's claim table
    becomes the same table and the README and docs/results.md get its :func:`summary`."""
    margin = margins(runs)
    rows = [_row(c, runs, margin) for c in CLAIMS] + [_caption_row(c, runs) for c in CAPTION_CLAIMS]
    ran = [i for i, r in enumerate(rows) if r["_p"] is not None]
    adjusted = dict(zip(ran, holm([rows[i]["_p"] for i in ran])))
    plot_forest([_forest_row(c, r) for c, r in zip(CLAIMS + CAPTION_CLAIMS, rows)], os.path.join(out, "claims"))
    rows = [{**{k: v for k, v in r.items() if not k.startswith("_") and k != "verdict"},
             "Holm p": _p_text(adjusted[i]) if i in adjusted else "-", "verdict": r["verdict"]}
            for i, r in enumerate(rows)]
    anchors = ", ".join(f"{s} +-{m:g}" for s, m in sorted(margin.items())) or "none recorded"
    files = write_table(
        rows, os.path.join(out, "claims"),
        f"The paper's probe claims: difference in mean4 points (claim 8: in CIDEr-D points, paired by test image, "
        f"its margin a tenth of ARC's gain over its wrong-image control, its one-seed spread {CAPTION_SEED_SD:g} points; "
        f"reproduce/claims/caption_claims.py), mean over seeds of the paired per-seed "
        f"difference; 95% interval from the seeds' spread (Student's t, seeds - 1 df) and the test items' "
        f"(normal; the same items in every seed), each with its own quantile; the 90% interval likewise "
        f"(for two one-sided tests, TOST). With one seed the seeds' spread is taken as {SEED_SD:g} points and "
        f"the verdict is provisional. The margin m is {MARGIN_FRACTION:.0%} of the caption style's mean gain "
        f"of CLIP, ARC and MDC over random init ({anchors} points). Each row is tested at 5% on its own. 'A "
        f"beats B': reproduced if the 95% interval lies above 0, contradicted if below 0, no effect of m "
        f"points if the 90% interval lies inside +-m. 'Comparable': reproduced if the 90% interval lies "
        f"inside +-m (TOST), contradicted if the 95% interval lies beyond +-m; otherwise not resolved, with "
        f"the direction named where the 95% interval excludes 0. p: the p-value of the test the claim is "
        f"reproduced by (two-sided at 0, or TOST), consistent with the intervals; Holm p: adjusted by Holm's "
        f"method over the {len(adjusted)} claim rows that ran. {summary(rows)}")
    if os.path.realpath(out) == os.path.realpath(os.path.join(ROOT, "figures")):
        with open(files[0]) as f:
            write_readme_table(os.path.join(ROOT, "README.md"), "".join(line for line in f if line.startswith("|")))
        for doc in ("README.md", os.path.join("docs", "results.md")):
            write_block(os.path.join(ROOT, doc), SUMMARY, summary(rows))
    return files + [os.path.join(out, "claims.png"), os.path.join(out, "claims.pdf")]
