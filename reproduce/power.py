"""How many seeds (and test items) each claim row needs: a power table read from the run records, and the
seed plan it implies.

    python -m reproduce.power [--records DIR] [--write-plan FILE] [--max-seeds 10]

Per claim row (:data:`reproduce.claims.claim_rows.CLAIMS`), from the records (default ``reproduce/records/mini``):
the per-seed differences d_1 .. d_k (mean4 points, paired by seed), their mean d, their SD s (sample SD,
k - 1 df; with one seed the claims' SEED_SD), the test items' variance v_items at the current N items
per task (:func:`reproduce.claims.stats.difference`: the same estimate the claim's interval uses) and
the row's margin m (:func:`reproduce.claims.claim_rows.margins`).

The tests a row could be resolved by, at 5%, from its current mean (as the claim's verdict reads it):
- "A beats B": the difference is 0, two-sided (p = 0.975 quantiles), effect e = |d| (reproduced or
  contradicted); and where |d| < m, two one-sided tests at +-m (p = 0.95 quantiles), e = m - |d| (no
  effect of m points); the row shows the one that needs fewer seeds;
- "comparable", |d| < m: two one-sided tests at +-m (p = 0.95 quantiles); effect e = m - |d|;
- "comparable", |d| >= m: the difference lies beyond +-m, two-sided (p = 0.975); effect e = |d| - m.

The claims' variance decomposition at K seeds and N items per task (seeds part and items part):
V(K, N) = v_items * N0 / N + s^2 / K, N0 the current items per task; the test rejects when e exceeds
h(K, N) = sqrt(z_p^2 v_items N0 / N + q_p(K - 1)^2 s^2 / K) (z_p normal, q_p Student's t with K - 1 df,
as the interval). Power at the current mean, treating d as normal with variance V:
power(K, N) = Phi((e - h(K, N)) / sqrt(V(K, N))). Seeds needed: the smallest K >= 2 with power >= 80% at
N = N0 (K up to 10,000). As K grows h -> z_p sqrt(v_items N0 / N) and V -> v_items N0 / N, so where
e <= (z_p + z_0.8) sqrt(v_items) (z_0.8 = 0.8416) no number of seeds reaches 80% at N0 items: the row
says "never", with the items per task that unlimited seeds would need, N* = N0 v_items (z_p + z_0.8)^2
/ e^2, and the seeds needed at 2 N* items. e = 0 is "never" at any number of items.

v_items is the claims' estimate, which also holds each seed's own item noise (conservative, by about
that noise / k), and both s and d come from k seeds: with 3 seeds s is uncertain by a factor of about 2,
so the seeds needed are a plan, not a promise.

Table 2 (claim 3, no claim row here): per column and difference (MDC's Monte Carlo score against ARC's exact
and CLIP's cosine), the images at which the items' part of the 95% half-width equals the seeds' part
(:func:`table2_items`: the rule that sizes the probe's test sets, counted in images, the bootstrap's unit). The
``mini`` profile scores ARO's order task on as many images as its largest row needs (``reproduce/registry.py``).

The seed plan (``--write-plan``, read by ``python -m reproduce --seed-plan FILE``): a row is resolvable
when its seeds needed are finite and at most ``--max-seeds``; each pretraining run that feeds one or more
resolvable rows (a probe on either side) gets the most seeds those rows need, at least FLOOR_SEEDS;
every other run gets FLOOR_SEEDS.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from statistics import NormalDist

import numpy as np

from mdc.base.cli import ArgumentParser, report
from mdc.eval.accuracy import item_outcomes
from mdc.eval.compositionality import OWN_COLUMNS, TEMPLATE_COLUMNS
from reproduce import registry
from reproduce.artifacts import compositionality_table
from reproduce.claims import claim_rows
from reproduce.running import ledger
from reproduce.claims.stats import LEVEL, difference, probe_outcomes, quantiles, t_quantile
from reproduce.running.seed_plan import SeedPlan, write

POWER = 0.80
FLOOR_SEEDS = 3  # every run of a plan, at least
MAX_SEEDS = 10  # a row that needs more is left at the floor
SEARCH = 10_000  # the most seeds searched
SEARCH_SEEDS = 10  # the seeds a ledger's records are looked for at
# claim 3 (Table 2): MDC on par with ARC and above CLIP, each by its Table 2 scorer
TABLE2_DIFFERENCES = ((("MDC", "elbo"), ("ARC", "exact")), (("MDC", "elbo"), ("CLIP", "cosine")))


def needed_seeds(e: float, s: float, v_items: float, p: float, scale: float = 1.0) -> int | None:
    """The smallest K >= 2 (up to SEARCH) with power >= POWER (module docstring) for effect ``e``, seed SD
    ``s``, items variance ``v_items`` times ``scale`` (N0 / N), quantile ``p``; None if none."""
    z, zb = NormalDist().inv_cdf(p), NormalDist().inv_cdf(POWER)
    vi = v_items * scale
    if e <= 0 or e <= (z + zb) * math.sqrt(vi):
        return None

    def enough(k: int) -> bool:
        h = math.sqrt(z**2 * vi + t_quantile(p, k - 1) ** 2 * s**2 / k)
        return e - h >= zb * math.sqrt(vi + s**2 / k)

    if not enough(SEARCH):
        return None
    lo, hi = 1, SEARCH  # enough(hi); power grows with k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def slope_rows(name: str, gap: dict, rungs: tuple[float, ...], seeds: int) -> list[dict]:
    """Power rows for the slope of a gap per doubling of compute over ``rungs`` (times a run's steps): "closes" (it
    differs from 0, at the slope that closes the gap over the rungs' span) and "holds" (two one-sided tests at +-m,
    m half the gap's seed SD, at a true slope of 0), with the seeds for 80% power and the power at ``seeds``.
    ``gap``: {per_seed, mean, v_items} (:func:`probe_gaps`, :func:`binding_gaps`). The per-seed slope of an OLS fit
    over the rungs has the gap's seed SD and items' variance over Sxx = sum (log2 rung - mean)^2."""
    x = np.log2(rungs)
    sxx, span = float(((x - x.mean()) ** 2).sum()), float(x.max() - x.min())
    sd, v = float(np.std(gap["per_seed"], ddof=1)), gap["v_items"] / sxx
    rows = []
    for test, e, p in (("closes", abs(gap["mean"]) / span, 0.975), ("holds", sd / 2, 0.95)):
        s, z = sd / math.sqrt(sxx), NormalDist().inv_cdf(p)
        h = math.sqrt(z**2 * v + t_quantile(p, seeds - 1) ** 2 * s**2 / seeds)
        rows.append({"quantity": name, "test": test, "reference seeds": len(gap["per_seed"]), "gap": gap["mean"],
                     "seed SD": sd, "slope effect": e, "margin m": sd / 2, "seeds": needed_seeds(e, s, v, p),
                     "power": NormalDist().cdf((e - h) / math.sqrt(v + s**2 / seeds))})
    return rows


def change_rows(name: str, change: dict, margin: float, seeds: int) -> list[dict]:
    """Power rows for a change of one quantity between two points of compute (paired by seed): "flat" (two
    one-sided tests at +-``margin`` at a true change of 0) and "moves" (it differs from 0 at a true change of
    ``margin``), with the seeds for 80% power and the power at ``seeds``. ``change``: {per_seed, mean, v_items}
    (:func:`probe_changes`)."""
    sd, v = float(np.std(change["per_seed"], ddof=1)), change["v_items"]
    rows = []
    for test, p in (("flat", 0.95), ("moves", 0.975)):
        z = NormalDist().inv_cdf(p)
        h = math.sqrt(z**2 * v + t_quantile(p, seeds - 1) ** 2 * sd**2 / seeds)
        rows.append({"quantity": name, "test": test, "reference seeds": len(change["per_seed"]),
                     "change": change["mean"], "seed SD": sd, "margin m": margin,
                     "seeds": needed_seeds(margin, sd, v, p),
                     "power": NormalDist().cdf((margin - h) / math.sqrt(v + sd**2 / seeds))})
    return rows


def probe_changes(records: str, before: str, after: str, objective: str) -> dict | None:
    """The claims' difference (:func:`reproduce.claims.stats.difference`) of mean4, ``after`` - ``before`` (probe
    record patterns, ``{o}``: objective, ``{s}``: seed), of one objective, paired by seed, in the ledger ``records``."""
    def outcomes(pattern, s):
        r = ledger.read(records, pattern.format(o=objective, s=s))
        return r and probe_outcomes(r["results"]["results"])

    pairs = [(a, b) for a, b in ((outcomes(after, s), outcomes(before, s)) for s in range(SEARCH_SEEDS)) if a and b]
    return difference(pairs) if pairs else None


def probe_gaps(records: str, pattern: str) -> dict | None:
    """The claims' difference (:func:`reproduce.claims.stats.difference`) of mean4, MDC - ARC, paired by seed, over
    the probe records ``pattern`` (``{o}``: objective, ``{s}``: seed) in the ledger ``records``."""
    def outcomes(o, s):
        r = ledger.read(records, pattern.format(o=o, s=s))
        return r and probe_outcomes(r["results"]["results"])

    pairs = [(m, a) for m, a in ((outcomes("mdc", s), outcomes("arc", s)) for s in range(SEARCH_SEEDS)) if m and a]
    return difference(pairs) if pairs else None


def binding_gaps(records: str, items: int) -> dict:
    """own_swap accuracy, MDC's ELBO - ARC's exact, per seed of the reference ledger ``records``, with the items'
    variance of one seed's difference at ``items`` items a model."""
    found = {o: [ledger.read(records, registry.run_name("compositionality", s, o, "descriptive", "own"))
                 for s in range(SEARCH_SEEDS)] for o in ("mdc", "arc")}
    acc = {o: [100 * r["results"]["results"]["columns"]["own_swap"]["scores"][v]["accuracy"] for r in found[o] if r]
           for o, v in (("mdc", "elbo"), ("arc", "exact"))}
    gaps = [m - a for m, a in zip(acc["mdc"], acc["arc"])]
    v = sum(np.mean(acc[o]) * (100 - np.mean(acc[o])) / items for o in acc)
    return {"per_seed": gaps, "mean": float(np.mean(gaps)), "v_items": float(v)}


def targets(claim: claim_rows.Claim, mean: float, margin: float) -> list[tuple[str, float, float]]:
    """The (test, effect e, quantile p) a row could be resolved by from its current ``mean`` (module docstring)."""
    if claim.expect == "greater":
        return [("differs from 0", abs(mean), 0.975)] + (
            [(f"TOST at +-{margin:g}", margin - abs(mean), 0.95)] if abs(mean) < margin else [])
    if abs(mean) < margin:
        return [(f"TOST at +-{margin:g}", margin - abs(mean), 0.95)]
    return [(f"beyond +-{margin:g}", abs(mean) - margin, 0.975)]


def row_power(claim: claim_rows.Claim, d: dict, margin: float) -> dict:
    """One row of the power table from a :func:`reproduce.claims.stats.difference` ``d``: the row's test
    that needs the fewest seeds (the fewest items where no number of seeds will do)."""
    k, n0 = d["seeds"], d["items"] // len(claim_rows.TASKS)
    s = float(math.sqrt(d["v_seeds"] * k)) if k > 1 else claim_rows.SEED_SD
    options = [_option(test, e, p, s, d["v_items"], n0) for test, e, p in targets(claim, d["mean"], margin)]
    best = min(options, key=lambda o: (o["_seeds"] is None, o["_seeds"] or 0, o["_items"]))
    row = {"claim row": claim.what, "margin": f"+-{margin:g}",
           "per-seed differences": ", ".join(f"{x:+.2f}" for x in d["per_seed"]), "mean": f"{d['mean']:+.2f}",
           "seed SD": f"{s:.2f}", "items SD": f"{math.sqrt(d['v_items']):.2f}"}
    return {**row, **{key: v for key, v in best.items() if key != "_items"}}


def _option(test: str, e: float, p: float, s: float, v_items: float, n0: int) -> dict:
    """Seeds (and items) for 80% power of one test of effect ``e`` at quantile ``p``."""
    z, zb = NormalDist().inv_cdf(p), NormalDist().inv_cdf(POWER)
    seeds = needed_seeds(e, s, v_items, p)
    out = {"test at 5%": test, "effect": f"{e:.2f}", "_seeds": seeds, "_items": n0}
    if seeds is not None:
        return {**out, "seeds for 80% power": str(seeds), "items per task": f"{n0:,}"}
    if e <= 0:
        return {**out, "seeds for 80% power": "never (the mean sits on the boundary)", "items per task": "-",
                "_items": math.inf}
    n_star = math.ceil(n0 * v_items * (z + zb) ** 2 / e**2)
    at_double = needed_seeds(e, s, v_items, p, n0 / (2 * n_star))
    return {**out, "seeds for 80% power": f"never at {n0:,} items", "_items": n_star,
            "items per task": f"> {n_star:,} (at {2 * n_star:,}: "
                              f"{f'{at_double} seeds' if at_double else f'more than {SEARCH:,} seeds'})"}


def power_table(runs: list[dict]) -> list[dict]:
    """Every claim row's power row (module docstring); ``_seeds`` holds the seeds needed (None: never)."""
    margin = claim_rows.margins(runs)
    rows = []
    for c in claim_rows.CLAIMS:
        try:
            d = difference(claim_rows.paired_items(runs, c))
        except ValueError as exn:
            rows.append({"claim row": c.what, "seeds for 80% power": f"not run ({exn})", "_seeds": None})
            continue
        rows.append(row_power(c, d, margin.get(c.a.get("style"), claim_rows.FALLBACK_MARGIN)))
    return rows


def plan_from(rows: list[dict], profile: str = "mini", max_seeds: int = MAX_SEEDS) -> SeedPlan:
    """The seed plan the power ``rows`` imply (module docstring)."""
    want: dict[str, int] = {}
    probes = [r for r in registry.build(profile, 1) if r.notebook == "linear_probe"]
    for c, row in zip(claim_rows.CLAIMS, rows):
        k = row["_seeds"]
        if k is None or k > max_seeds:
            continue
        for r in probes:
            if any(all(r.labels.get(key) == v for key, v in side.items()) for side in (c.a, c.b)):
                name = r.deps[0].split("/", 1)[1].rsplit("-s", 1)[0]  # pretrain/<name>-s0
                want[name] = max(want.get(name, FLOOR_SEEDS), k)
    return SeedPlan(FLOOR_SEEDS, tuple(sorted((n, k) for n, k in want.items() if k > FLOOR_SEEDS)))


def markdown(rows: list[dict]) -> str:
    columns = [c for c in dict.fromkeys(k for r in rows for k in r) if not c.startswith("_")]
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                     + ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows])


def claim_test_items(runs: list[dict]) -> dict[str, dict]:
    """Per claim row of :data:`reproduce.claims.claim_rows.CLAIMS` with probe records: the test items per task at which
    its items' part of the 95% half-width (z^2 v_items, :func:`reproduce.claims.claim_rows.difference`) would equal the
    seeds' part (q^2 v_seeds) at the same seeds. v_items falls as 1 / N (the items' own variance read from
    the records), so ``needed`` = N z^2 v_items / (q^2 v_seeds). The rule that sizes the probe tasks'
    test sets (:data:`mdc.world.evalsets.PROBE_TEST_ITEMS`): at least the largest ``needed`` over the rows, so
    that no row's interval is mostly item noise and the next thing a row needs is seeds."""
    out = {}
    for c in claim_rows.CLAIMS:
        try:
            pairs = claim_rows.paired_items(runs, c)
            d = difference(pairs)
        except ValueError:
            continue
        n, k = len(pairs[0][0][claim_rows.TASKS[0]]), d["seeds"]
        z, q = quantiles(1 - (1 - LEVEL) / 2, k)
        items, seeds = z * math.sqrt(d["v_items"]), q * math.sqrt(d["v_seeds"])
        out[c.what] = {"n": n, "seeds": k, "items_half": items, "seeds_half": seeds,
                       "needed": math.ceil(n * (items / seeds) ** 2) if seeds > 0 else None}
    return out


def _per_image(outcomes, clusters) -> dict[str, float]:
    """An item outcome per image [its items' mean], the unit Table 2's intervals resample."""
    sums: dict[str, list[float]] = {}
    for y, c in zip(outcomes, clusters):
        sums.setdefault(c, []).append(float(y))
    return {c: sum(v) / len(v) for c, v in sums.items()}


def table2_items(runs: list[dict]) -> list[dict]:
    """Per Table 2 column and claim 3's differences (:data:`TABLE2_DIFFERENCES`), the images per column at
    which its items' part of the 95% half-width would equal its seeds' part: :func:`claim_test_items`'s rule,
    counted in images (the bootstrap's unit, so COCO-Order's five captions of an image count once), from the
    per-item outcomes the compositionality records hold, paired by seed and image. A column needs at least
    two seeds on both sides (a seeds' part measured, not assumed) and the same items in every seed."""
    by_model = {(labels.get("method"), labels.get("seed")): results
                for labels, results in compositionality_table.table2_models(runs)}
    rows = []
    for column in (*OWN_COLUMNS, *TEMPLATE_COLUMNS):
        for (a, va), (b, vb) in TABLE2_DIFFERENCES:
            pairs = []
            for seed in sorted(s for m, s in by_model if m == a and (b, s) in by_model):
                try:
                    sides = [_per_image(*item_outcomes(by_model[m, seed], column, v)[:2])
                             for m, v in ((a, va), (b, vb))]
                except KeyError:
                    break
                images = sorted(sides[0])
                if sorted(sides[1]) != images or (pairs and len(pairs[0][0][column]) != len(images)):
                    break
                pairs.append(tuple({column: np.array([side[i] for i in images])} for side in sides))
            if len(pairs) < 2:
                continue
            d = difference(pairs, tasks=(column,))
            z, q = quantiles(1 - (1 - LEVEL) / 2, d["seeds"])
            items, seeds, n = z * math.sqrt(d["v_items"]), q * math.sqrt(d["v_seeds"]), len(pairs[0][0][column])
            rows.append({"column": column, "difference": f"{a} {va} - {b} {vb}", "mean": f"{d['mean']:+.1f}",
                         "seeds": d["seeds"], "images": n, "items' half-width": f"{items:.2f}",
                         "seeds' half-width": f"{seeds:.2f}",
                         "images needed": math.ceil(n * (items / seeds) ** 2) if seeds > 0 else "any"})
    return rows


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m reproduce.power", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", default=os.path.join("reproduce", "records", "mini"), help="the ledger")
    p.add_argument("--profile", default="mini", help="the profile whose runs the plan names")
    p.add_argument("--write-plan", metavar="FILE", help="write the seed plan the table implies")
    p.add_argument("--max-seeds", type=int, default=MAX_SEEDS, help="a row needing more is left at the floor")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    return report(lambda: _main(args), p, debug=args.debug)


def _main(args: argparse.Namespace) -> int:
    found = ledger.read_all(args.records)
    if not found:
        raise ValueError(f"--records {args.records}: no run records there")
    runs = ledger.for_build(found)
    rows = power_table(runs)
    print(markdown(rows))
    plan = plan_from(rows, args.profile, args.max_seeds)
    print(f"\nseed plan (rows needing at most {args.max_seeds} seeds; at least {FLOOR_SEEDS} everywhere): "
          f"{plan.describe()}")
    if args.write_plan:
        write(args.write_plan, plan, f"python -m reproduce.power --records {args.records}: seeds for 80% power at "
                                     f"each resolvable claim row's current mean, at least {FLOOR_SEEDS}")
        print(f"wrote {args.write_plan}; run it with: python -m reproduce --profile {args.profile} "
              f"--seed-plan {args.write_plan}")
    images = table2_items(runs)
    if images:
        print("\nTable 2 (claim 3), images per column at which the items' part of a difference's 95% half-width "
              "equals its seeds' part:\n\n" + markdown(images))
    return 0


if __name__ == "__main__":
    sys.exit(main())
