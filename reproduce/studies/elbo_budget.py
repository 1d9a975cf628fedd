"""Is the mini profile's ELBO budget enough? Table 2's decisions at the profile's sample count against S = 256.

The mini profile scores MDC's Monte-Carlo ELBO with 32 paired masked copies per candidate
(``reproduce/registry.py``). This study scores the same items of every synthetic Table 2 suite with
that count and with a reference count (256), both paired and stratified as the profile scores them,
and counts the items whose decision (the candidate with the highest score, ties to the first) is the
same. The profile's count is enough where they agree on at least 98% of the items.

    python -m reproduce.studies.elbo_budget --checkpoint RUN_FOLDER --evalsets EVALSETS_DIR \\
        [--items 100] [--samples 32 256] [--out reproduce/studies/elbo_budget]

``--items``: the first N items of each suite (the agreement is a rate: a sample of items estimates it;
its binomial 95% interval is printed). Writes ``results.json`` and ``results.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

import numpy as np

import mdc
from mdc.eval import compositionality as comp

VARIANTS = ("elbo", "elbo_trained_t")


def subset(suite, n: int):
    """The first ``n`` items of a suite (every per-item field cut alike)."""
    cut = lambda values: None if values is None else values[:n]  # noqa: E731
    return dataclasses.replace(suite, items=suite.items[:n], candidates=suite.candidates[:n],
                               groups=suite.groups[:n], identical=cut(suite.identical), clusters=cut(suite.clusters))


def decisions(model, transform, suite, num_samples: int, seed: int) -> dict[str, np.ndarray]:
    """Per variant, the chosen candidate [N] under ``num_samples`` paired masked copies."""
    scored = comp.score_suite(model, transform, suite, ["elbo"], num_samples=num_samples, seed=seed, blind=False,
                              elbo_trained_t=True)
    return {v: scored.scores[v].argmax(1) for v in VARIANTS if v in scored.scores}


def wilson(agree: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a rate ``agree / n``."""
    if n == 0:
        return math.nan, math.nan
    p, d = agree / n, 1 + z**2 / n
    centre, half = (p + z**2 / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / d
    return centre - half, centre + half


def study(checkpoint: str, evalsets: str, items: int, samples: tuple[int, int], seed: int = 0) -> dict:
    model = mdc.load(checkpoint).eval()
    transform = mdc.image_transform(model)
    suites = comp.load_suites(evalsets, "all", attribute_min_count=1, order_seed=seed)
    rows, started = [], time.perf_counter()
    for name, suite in suites.items():
        part = subset(suite, items)
        low, high = (decisions(model, transform, part, s, seed) for s in samples)
        for v in low:
            agree = int((low[v] == high[v]).sum())
            rows.append({"suite": name, "variant": v, "items": len(part.items), "agree": agree})
    n, agree = sum(r["items"] for r in rows if r["variant"] == "elbo"), sum(
        r["agree"] for r in rows if r["variant"] == "elbo")
    return {"checkpoint": os.path.basename(os.path.normpath(checkpoint)), "samples": list(samples), "items_per_suite": items,
            "seed": seed, "rows": rows, "elbo_agree": agree, "elbo_items": n, "seconds": time.perf_counter() - started}


def markdown(res: dict) -> str:
    lo, hi = res["samples"]
    lines = [f"| suite | variant | items | same decision at S = {lo} and S = {hi} | 95% interval |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        a, b = wilson(r["agree"], r["items"])
        lines.append(f"| {r['suite']} | {r['variant']} | {r['items']} | {100 * r['agree'] / r['items']:.1f}% "
                     f"| [{100 * a:.1f}, {100 * b:.1f}] |")
    for v in VARIANTS:
        got = [r for r in res["rows"] if r["variant"] == v]
        n, agree = sum(r["items"] for r in got), sum(r["agree"] for r in got)
        if n:
            a, b = wilson(agree, n)
            lines.append(f"| all suites | {v} | {n} | {100 * agree / n:.1f}% | [{100 * a:.1f}, {100 * b:.1f}] |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reproduce.studies.elbo_budget", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="an MDC checkpoint or pretraining run folder")
    p.add_argument("--evalsets", required=True, help="the synthetic evaluation sets (python -m mdc.world.evalsets)")
    p.add_argument("--items", type=int, default=100, help="items per suite (the first N)")
    p.add_argument("--samples", type=int, nargs=2, default=(32, 256), help="the profile's count and the reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("reproduce", "studies", "elbo_budget"))
    args = p.parse_args(argv)
    res = study(args.checkpoint, args.evalsets, args.items, tuple(args.samples), args.seed)
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
