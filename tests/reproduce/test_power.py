"""reproduce.power: the seeds (and test items) a claim row needs for 80% power, recomputed here from the
records by the docstring's formula, and the seed plan they imply."""
import math
import os
from statistics import NormalDist

import numpy as np
import pytest

from reproduce import power
from reproduce.claims import claim_rows
from reproduce.running import ledger, seed_plan
from reproduce.claims.claim_rows import TASKS
from reproduce.claims.stats import difference, t_quantile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = os.path.join(ROOT, "reproduce", "records", "mini")


def _power(e, s, v_items, p, k):
    """Power at k seeds, written out as the module docstring states it."""
    z, q = NormalDist().inv_cdf(p), t_quantile(p, k - 1)
    h = math.sqrt(z**2 * v_items + q**2 * s**2 / k)
    return NormalDist().cdf((e - h) / math.sqrt(v_items + s**2 / k))


@pytest.fixture(scope="module")
def runs():
    return ledger.for_build(ledger.read_all(RECORDS))


def test_seeds_needed_is_the_first_k_with_80_percent_power():
    for e, s, vi, p in ((2.23, 1.45, 0.26, 0.975), (8.3, 4.96, 0.24, 0.975), (1.0, 0.5, 0.05, 0.95)):
        k = power.needed_seeds(e, s, vi, p)
        assert _power(e, s, vi, p, k) >= 0.8 > _power(e, s, vi, p, k - 1) or k == 2


def test_never_where_the_item_noise_alone_leaves_too_little():
    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)
    assert power.needed_seeds(0.99 * z * 0.5, 0.1, 0.25, 0.975) is None  # e below (z + z_0.8) items SD
    assert power.needed_seeds(1.2 * z * 0.5, 0.1, 0.25, 0.975) is not None
    assert power.needed_seeds(0.0, 1.0, 0.01, 0.975) is None


def test_the_table_recomputed_from_the_records(runs):
    rows = {r["claim row"]: r for r in power.power_table(runs)}
    assert list(rows) == [c.what for c in claim_rows.CLAIMS]
    margins = claim_rows.margins(runs)
    for c in claim_rows.CLAIMS:
        d = difference(claim_rows.paired_items(runs, c))
        row, m = rows[c.what], margins[c.a["style"]]
        s = math.sqrt(sum((x - d["mean"]) ** 2 for x in d["per_seed"]) / (d["seeds"] - 1))
        assert row["per-seed differences"] == ", ".join(f"{x:+.2f}" for x in d["per_seed"])
        assert row["seed SD"] == f"{s:.2f}" and row["items SD"] == f"{math.sqrt(d['v_items']):.2f}"
        tests = [("differs from 0", abs(d["mean"]), 0.975)] if c.expect == "greater" else []
        if abs(d["mean"]) < m:
            tests.append((f"TOST at +-{m:g}", m - abs(d["mean"]), 0.95))
        elif c.expect == "equal":
            tests.append((f"beyond +-{m:g}", abs(d["mean"]) - m, 0.975))
        need = {}
        for name, e, p in tests:
            z = NormalDist().inv_cdf(p) + NormalDist().inv_cdf(0.8)
            if e <= z * math.sqrt(d["v_items"]):  # more seeds cannot get there: the limit as k grows
                need[name] = None
                continue
            need[name] = next(k for k in range(2, 10_001) if _power(e, s, d["v_items"], p, k) >= 0.8)
        finite = {n: k for n, k in need.items() if k is not None}
        if finite:
            assert row["seeds for 80% power"] == str(min(finite.values())), c.what
            assert row["test at 5%"] in [n for n, k in finite.items() if k == min(finite.values())]
        else:
            n0 = d["items"] // len(TASKS)
            assert row["seeds for 80% power"] == f"never at {n0:,} items" and row["items per task"].startswith("> ")


def test_a_row_no_number_of_seeds_resolves_names_the_items_it_needs(runs):
    """Where the item noise alone is too large for the effect, the row gives the items per task that unlimited
    seeds would need: N* = N0 v_items (z_p + z_0.8)^2 / e^2 (and what twice that would take)."""
    margins = claim_rows.margins(runs)
    for c, row in zip(claim_rows.CLAIMS, power.power_table(runs)):
        if not row["seeds for 80% power"].startswith("never at"):
            continue
        d = difference(claim_rows.paired_items(runs, c))
        m, test = margins.get(c.a["style"], claim_rows.FALLBACK_MARGIN), row["test at 5%"]
        e = {"T": m - abs(d["mean"]), "b": abs(d["mean"]) - m, "d": abs(d["mean"])}[test[0]]
        p = 0.95 if test.startswith("TOST") else 0.975
        z = NormalDist().inv_cdf(p) + NormalDist().inv_cdf(0.8)
        n_star = math.ceil(d["items"] // len(TASKS) * d["v_items"] * z**2 / e**2)
        assert row["items per task"].startswith(f"> {n_star:,} (at {2 * n_star:,}: "), c.what
    # the same on a difference made for it: 1,000 items a task, an items' variance too large for TOST's effect
    # of 0.5 (the mean 2.0 inside a margin of 2.5)
    d = {"seeds": 3, "items": 4000, "v_items": 0.25, "v_seeds": 1.0, "mean": 2.0, "per_seed": [1.0, 2.0, 3.0]}
    row = power.row_power(claim_rows.CLAIMS[0], d, 2.5)
    e = 0.5
    n_star = math.ceil(1000 * 0.25 * (NormalDist().inv_cdf(0.95) + NormalDist().inv_cdf(0.8)) ** 2 / e**2)
    assert row["seeds for 80% power"] == "never at 1,000 items" and row["items per task"].startswith(f"> {n_star:,} ")


def test_the_plan_gives_the_runs_of_resolvable_rows_their_seeds_and_three_elsewhere(runs):
    rows = power.power_table(runs)
    plan = power.plan_from(rows)
    assert plan.default == power.FLOOR_SEEDS and all(n > 3 for _, n in plan.seeds)
    need = {r["claim row"]: r["_seeds"] for r in rows}
    if need["MDC - ARC, descriptive"] and need["MDC - ARC, descriptive"] <= power.MAX_SEEDS:
        assert plan.of("arc-descriptive") >= need["MDC - ARC, descriptive"]
    assert plan.of("cliplb-descriptive") == 3  # feeds no claim row
    rows[[r["claim row"] for r in rows].index("MDC - BERT 100%, alt")]["_seeds"] = power.MAX_SEEDS + 1
    assert power.plan_from(rows).of("bert-r1.00-alt") == 3  # needs more than MAX_SEEDS: left at the floor


def test_the_command_prints_the_table_and_writes_a_plan_the_runner_reads(tmp_path, capsys):
    path = str(tmp_path / "plan.json")
    assert power.main(["--records", RECORDS, "--write-plan", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| claim row | margin | per-seed differences |") and "seed plan" in out
    assert seed_plan.read(path) == power.plan_from(power.power_table(ledger.for_build(ledger.read_all(RECORDS))))
    with pytest.raises(SystemExit) as exit_:
        power.main(["--records", str(tmp_path / "none")])
    assert exit_.value.code == 1 and "no run records" in capsys.readouterr().err


# ------------------------------------------------------------ the test items a claim row needs
def _probe_runs(tile: int = 1) -> list[dict]:
    """MDC and CLIP on descriptive captions, three seeds, 400 items per task (each repeated ``tile`` times)."""
    rng = np.random.default_rng(0)
    known = {t: rng.random(400) < 0.5 for t in TASKS}  # items both models know, shared by every seed
    runs = []
    for seed, shift in enumerate((0.02, 0.03, 0.025)):
        for method, rate in (("MDC", 0.5 + shift), ("CLIP", 0.5)):
            datasets = {}
            for t in TASKS:
                right = np.where(known[t], rng.random(400) < 0.9, rng.random(400) < rate - 0.4)
                datasets[f"wds/{t}"] = {"correct": "".join("1" if x else "0" for x in np.repeat(right, tile))}
            labels = dict(method=method, style="descriptive", fraction=1.0, seed=seed)
            runs.append({"name": f"probe/{method}-s{seed}", "notebook": "linear_probe", "labels": labels,
                         "artifacts": ["claims"], "record": {"results": {"datasets": datasets}}})
    return runs


def test_the_items_a_row_needs_do_not_depend_on_how_many_it_had():
    """Four copies of every item: the same item variance at four times the items, so the items' half-width
    halves, the seeds' stays, and the items needed stay where they were."""
    one, four = (power.claim_test_items(_probe_runs(tile))["MDC - CLIP, descriptive"] for tile in (1, 4))
    assert (one["n"], four["n"], one["seeds"]) == (400, 1600, 3)
    assert math.isclose(four["seeds_half"], one["seeds_half"])
    assert math.isclose(four["items_half"], one["items_half"] / 2, rel_tol=0.01)
    assert abs(four["needed"] - one["needed"]) <= 0.01 * one["needed"]
    assert one["needed"] == math.ceil(400 * (one["items_half"] / one["seeds_half"]) ** 2)
    assert set(power.claim_test_items(_probe_runs())) == {"MDC - CLIP, descriptive"}  # rows without records are left out


# ------------------------------------------------------------ the images a Table 2 column needs
def _table2_runs(captions: int = 2, seeds=(0, 1, 2)) -> list[dict]:
    """MDC and ARC on COCO-Order, 6 images of ``captions`` captions each (an image's captions share their
    outcome), ARC always wrong; MDC's outcomes differ by seed."""
    mdc = {0: [1, 1, 0, 1, 0, 0], 1: [1, 0, 0, 1, 1, 0], 2: [1, 1, 1, 1, 0, 0]}
    runs = []
    for seed in seeds:
        for method, variant, right in (("MDC", "elbo", mdc[seed]), ("ARC", "exact", [0] * 6)):
            records = {"ids": [f"{i}.{c}" for i in range(6) for c in range(captions)],
                       "clusters": [f"images/{i}.png" for i in range(6) for _ in range(captions)],
                       "correct": {variant: "".join(str(y) for y in right for _ in range(captions))}}
            results = {"columns": {"aro_coco_order": {"records": records}}, "table2": {}}
            runs.append({"name": f"compositionality/{method}-order-s{seed}", "notebook": "compositionality",
                         "artifacts": ["table2"], "labels": dict(method=method, seed=seed, part="order"),
                         "record": {"results": results}})
    return runs


def test_table2_images_needed_recomputed_by_hand():
    (row,) = power.table2_items(_table2_runs())  # MDC - CLIP has no CLIP runs: no row
    D = 100 * np.array([[1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0]], float)  # [seed, image]
    v_items, v_seeds = D.mean(0).var(ddof=1) / 6, D.mean(1).var(ddof=1) / 3
    items, seeds = 1.959964 * math.sqrt(v_items), t_quantile(0.975, 2) * math.sqrt(v_seeds)
    assert (row["column"], row["difference"]) == ("aro_coco_order", "MDC elbo - ARC exact")
    assert (row["seeds"], row["images"]) == (3, 6)
    assert row["mean"] == f"{D.mean():+.1f}" and row["items' half-width"] == f"{items:.2f}"
    assert row["seeds' half-width"] == f"{seeds:.2f}" and row["images needed"] == math.ceil(6 * (items / seeds) ** 2)


def test_table2_counts_images_not_captions_and_needs_two_seeds():
    """An image's captions resample together: five captions an image need as many images as two."""
    assert power.table2_items(_table2_runs(captions=5)) == power.table2_items(_table2_runs(captions=2))
    assert power.table2_items(_table2_runs(seeds=(0,))) == []  # no seeds' spread measured
