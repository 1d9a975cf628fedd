"""Is the mini profile's ELBO budget enough? Table 2's decisions at the profile's budget against 256 copies.

The mini profile scores MDC's Monte-Carlo ELBO with 32 paired masked copies per candidate, doubled up
to 256 where an item's decision is within 3 standard errors (``reproduce/registry.py``,
:func:`mdc.scoring.elbo_sequential`). This study scores the same items of every synthetic Table 2 suite
under five budgets, all paired and stratified as the profile scores them:

- ``fixed``: 32 copies for every item (the budget before the sequential rule);
- ``sequential``: the profile's budget, 32 doubled up to 256 where the decision is unsure;
- ``continued``: every item continued to 256 with the same copies (the sequential rule never stopping):
  the decision more copies would have given; the budget is enough where ``sequential`` agrees with it on
  at least 98% of the items;
- ``fresh``: 256 fresh stratified copies (the reference of the first measurement), and ``fresh_seed1``
  the same with another noise seed: their agreement is the floor of any comparison between two
  independent 256-copy estimates (items whose candidates are within their noise).

The decision is the candidate with the highest score (ties to the first).

    python -m reproduce.studies.elbo_budget --checkpoint RUN_FOLDER --evalsets EVALSETS_DIR \\
        [--items 100] [--samples 32 256] [--out reproduce/studies/elbo_budget]

``--items``: the first N items of each suite (an agreement is a rate: a sample of items estimates it;
its Wilson 95% interval is printed). Writes ``results.json`` and ``results.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os

import numpy as np

import mdc
from mdc.eval import compositionality as comp

VARIANTS = ("elbo", "elbo_trained_t")
# the compared pairs of budgets: (budget, reference)
PAIRS = (("fixed", "continued"), ("sequential", "continued"), ("sequential", "fresh"), ("fresh", "fresh_seed1"))
ALWAYS = 1e9  # a tolerance no lead reaches: every item continues to the maximum


def budgets(low: int, high: int) -> dict[str, dict]:
    """Per budget, the ELBO keywords of :func:`mdc.score_candidates` and the noise seed."""
    return {"fixed": dict(num_samples=low, seed=0), "sequential": dict(num_samples=low, max_samples=high, seed=0),
            "continued": dict(num_samples=low, max_samples=high, tolerance=ALWAYS, seed=0),
            "fresh": dict(num_samples=high, seed=0), "fresh_seed1": dict(num_samples=high, seed=1)}


def subset(suite, n: int):
    """The first ``n`` items of a suite (every per-item field cut alike)."""
    cut = lambda values: None if values is None else values[:n]  # noqa: E731
    return dataclasses.replace(suite, items=suite.items[:n], candidates=suite.candidates[:n],
                               groups=suite.groups[:n], identical=cut(suite.identical), clusters=cut(suite.clusters))


def decisions(model, transform, suite, budget: dict) -> tuple[dict[str, np.ndarray], float]:
    """Per variant, the chosen candidate [N] under one budget, and the seconds it took."""
    scoring = comp.method_variants(model, ["elbo"], seed=budget["seed"], blind=False)
    scoring = {v: dict(kw, **budget) for v, kw in scoring.items()}
    scored = comp.score_variants(model, transform, suite, scoring, seed=budget["seed"])
    return {v: scored.scores[v].argmax(1) for v in VARIANTS if v in scored.scores}, scored.seconds


def study(checkpoint: str, evalsets: str, items: int, samples: tuple[int, int]) -> dict:
    model = mdc.load(checkpoint).eval()
    transform = mdc.image_transform(model)
    suites = comp.load_suites(evalsets, "all", attribute_min_count=1, order_seed=0)
    rows, seconds = [], dict.fromkeys(budgets(*samples), 0.0)
    for name, suite in suites.items():
        part = subset(suite, items)
        chosen = {}
        for b, kw in budgets(*samples).items():
            chosen[b], took = decisions(model, transform, part, kw)
            seconds[b] += took
        for v in VARIANTS:
            agree = {f"{a}~{ref}": int((chosen[a][v] == chosen[ref][v]).sum()) for a, ref in PAIRS}
            rows.append({"suite": name, "variant": v, "items": len(part.items), "agree": agree})
    return {"checkpoint": os.path.basename(os.path.normpath(checkpoint)), "samples": list(samples),
            "items_per_suite": items, "rows": rows, "seconds": seconds}


def wilson(agree: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a rate ``agree / n``."""
    if n == 0:
        return math.nan, math.nan
    p, d = agree / n, 1 + z**2 / n
    centre, half = (p + z**2 / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / d
    return centre - half, centre + half


def _cell(agree: int, n: int) -> str:
    a, b = wilson(agree, n)
    return f"{100 * agree / n:.1f}% [{100 * a:.1f}, {100 * b:.1f}]"


def markdown(res: dict) -> str:
    """One row per suite and variant, then the pooled rows: the share of items whose decision agrees, per
    compared pair of budgets, with its Wilson 95% interval; then each budget's seconds."""
    lo, hi = res["samples"]
    names = {"fixed": f"{lo}", "sequential": f"{lo}->{hi} seq.", "continued": f"{hi} continued",
             "fresh": f"{hi} fresh", "fresh_seed1": f"{hi} fresh, seed 1"}
    pairs = [f"{a}~{ref}" for a, ref in PAIRS]
    head = [f"{names[a]} vs {names[ref]}" for a, ref in PAIRS]
    lines = ["| suite | variant | items | " + " | ".join(head) + " |", "|---|---|---|" + "---|" * len(pairs)]
    for r in res["rows"]:
        lines.append(f"| {r['suite']} | {r['variant']} | {r['items']} | "
                     + " | ".join(_cell(r["agree"][p], r["items"]) for p in pairs) + " |")
    for v in VARIANTS:
        got = [r for r in res["rows"] if r["variant"] == v]
        n = sum(r["items"] for r in got)
        if n:
            lines.append(f"| all suites | {v} | {n} | "
                         + " | ".join(_cell(sum(r["agree"][p] for r in got), n) for p in pairs) + " |")
    lines += ["", "| budget | seconds (one thread) |", "|---|---|"]
    lines += [f"| {names[b]} | {t:.0f} |" for b, t in res["seconds"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reproduce.studies.elbo_budget", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="an MDC checkpoint or pretraining run folder")
    p.add_argument("--evalsets", required=True, help="the synthetic evaluation sets (python -m mdc.world.evalsets)")
    p.add_argument("--items", type=int, default=100, help="items per suite (the first N)")
    p.add_argument("--samples", type=int, nargs=2, default=(32, 256),
                   help="the profile's first count and its maximum (the reference)")
    p.add_argument("--out", default=os.path.join("reproduce", "studies", "elbo_budget"))
    args = p.parse_args(argv)
    res = study(args.checkpoint, args.evalsets, args.items, tuple(args.samples))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    table = markdown(res)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
