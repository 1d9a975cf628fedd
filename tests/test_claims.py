"""reproduce.claims: a probe claim's difference, its two-level bootstrap interval and the verdict it implies."""
import json
import os

import numpy as np
import pytest

from mdc.eval.results import write_results
from reproduce import claims, registry
from reproduce.claims import TASKS, Claim, difference, paired_items, verdict

N = 1000  # test items per task


def _outcomes(rate: float, rng, n: int = N) -> str:
    return "".join("1" if x else "0" for x in rng.random(n) < rate)


def _run(name, labels, rates: dict, rng, n: int = N) -> dict:
    datasets = {f"wds/{t}": {"top1": rates[t], "correct": _outcomes(rates[t], rng, n)} for t in TASKS}
    return {"name": name, "notebook": "linear_probe", "labels": labels, "artifacts": ["claims"],
            "record": {"results": {"datasets": datasets}}}


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[dict, dict]:
    return {t: a for t in TASKS}, {t: b for t in TASKS}


def test_the_difference_is_the_mean_over_seeds_of_the_paired_mean4_gap():
    right, wrong = np.ones(N, np.uint8), np.zeros(N, np.uint8)
    half = np.r_[np.ones(N // 2, np.uint8), np.zeros(N // 2, np.uint8)]
    d = difference([_pair(right, half), _pair(half, half)])  # +50 and 0 points
    assert d["seeds"] == 2 and d["mean"] == pytest.approx(25.0)
    assert d["low"] <= 25.0 <= d["high"]
    same = difference([_pair(half, half)])  # identical outcomes: no item resample can separate them
    assert (same["mean"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    assert difference([_pair(wrong, right)])["high"] == -100.0


def test_the_interval_carries_the_seed_spread_not_only_the_items():
    rng = np.random.default_rng(0)
    base = (rng.random(N) < 0.5).astype(np.uint8)
    flip = lambda x, k: np.r_[1 - x[:k], x[k:]].astype(np.uint8)  # noqa: E731  (k items' outcomes changed)
    # seeds that disagree (+10, -10, +10 points) against seeds that agree (+3.3 each): same mean
    spread = difference([_pair(np.maximum(base, flip(base, 200)), base), _pair(base, np.maximum(base, flip(base, 200))),
                         _pair(np.maximum(base, flip(base, 200)), base)])
    items_only = difference([_pair(np.maximum(base, flip(base, 67)), base)] * 3)
    assert spread["mean"] == pytest.approx(10 / 3, abs=0.5) and items_only["mean"] == pytest.approx(spread["mean"],
                                                                                                     abs=0.5)
    assert spread["high"] - spread["low"] > 3 * (items_only["high"] - items_only["low"])
    assert spread["low"] < 0 < items_only["low"]


def test_the_item_interval_covers_the_true_gap_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    hits = 0
    for trial in range(200):  # a truly +5 points better encoder, both probed on 300 fresh items per task
        a = {t: (rng.random(300) < 0.55).astype(np.uint8) for t in TASKS}
        b = {t: (rng.random(300) < 0.50).astype(np.uint8) for t in TASKS}
        d = difference([(a, b)], resamples=400, seed=trial)
        hits += d["low"] <= 5.0 <= d["high"]
    assert 0.88 <= hits / 200 <= 0.99


def test_verdicts_follow_from_the_interval():
    assert verdict("greater", 0.4, 3.0) == "reproduced" and verdict("greater", -3.0, -0.2) == "contradicted"
    assert verdict("greater", -0.5, 3.0) == "not resolved"
    assert verdict("equal", -1.5, 1.9) == "reproduced" and verdict("equal", -1.5, 2.5) == "not resolved"
    assert verdict("equal", 2.0, 6.0) == "contradicted" and verdict("equal", -7.0, -2.5) == "contradicted"
    with pytest.raises(ValueError, match="expect"):
        Claim("x", {}, {}, expect="less")


def test_pairs_need_one_run_per_seed_and_the_same_items():
    rng = np.random.default_rng(0)
    rates = {t: 0.5 for t in TASKS}
    claim = Claim("x", dict(method="MDC", t_interval=None), dict(method="ARC"), what="MDC - ARC")
    runs = [_run("probe/mdc-s0", dict(method="MDC", seed=0), rates, rng),
            _run("probe/mdc-t-s0", dict(method="MDC", seed=0, t_interval=[0.0, 1.0]), rates, rng),  # not selected
            _run("probe/arc-s0", dict(method="ARC", seed=0), rates, rng),
            _run("probe/arc-s1", dict(method="ARC", seed=1), rates, rng)]  # no MDC partner: left out
    assert len(paired_items(runs, claim)) == 1
    with pytest.raises(ValueError, match="two probe runs of seed 0"):
        paired_items(runs + [_run("probe/mdc-again-s0", dict(method="MDC", seed=0), rates, rng)], claim)
    with pytest.raises(ValueError, match="same test items"):
        paired_items([runs[0], _run("probe/arc-s0", dict(method="ARC", seed=0), rates, rng, n=N - 1)], claim)
    old = dict(runs[2], record={"results": {"datasets": {f"wds/{t}": {"top1": 0.5} for t in TASKS}}})
    with pytest.raises(ValueError, match="rerun its linear_probe"):
        paired_items([runs[0], old], claim)


def test_the_claims_table_from_an_index_shaped_as_the_registry_writes_it(tmp_path):
    """Every probe run of the mini profile's registry, with outcomes drawn so that MDC beats CLIP by a wide
    margin and equals ARC: the table names each claim, its seeds and the verdicts those imply."""
    rng = np.random.default_rng(0)
    index = {}
    for r in registry.build("mini", seeds=2):
        if r.notebook != "linear_probe":
            continue
        rate = {"MDC": 0.6, "ARC": 0.6, "CLIP": 0.3}.get(r.labels["method"], 0.45)
        path = str(tmp_path / r.name / "results.json")
        datasets = {f"wds/{t}": {"top1": rate, "correct": _outcomes(rate, rng)} for t in TASKS}
        write_results(path, "linear_probe", {"datasets": datasets})
        index[r.name] = {"notebook": r.notebook, "params": {}, "labels": r.labels, "artifacts": list(r.artifacts),
                         "results": path}
    assert all("claims" in v["artifacts"] for v in index.values())
    with open(tmp_path / "index.json", "w") as f:
        json.dump(index, f)
    files = registry.build_artifacts(str(tmp_path / "index.json"), str(tmp_path / "figures"), "unused", ["claims"])
    table = open(files["claims"][0]).read()
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    by_what = {row[1]: row for row in rows}
    assert len(rows) == len(claims.CLAIMS)
    assert by_what["MDC - CLIP, descriptive"][2] == "2" and by_what["MDC - CLIP, descriptive"][5] == "reproduced |"
    assert by_what["MDC - ARC, descriptive"][5] in ("reproduced |", "not resolved |")
    assert by_what["MDC - BERT 15%, alt"][5] == "reproduced |"
    assert all(row[2] == "2" for row in rows)  # every claim found its runs, in both seeds
    assert by_what["all pairs - 25% of them, descriptive"][5] == "not resolved |"  # both sides at the same rate


def test_a_claim_without_runs_says_so(tmp_path):
    with open(tmp_path / "index.json", "w") as f:
        json.dump({}, f)
    files = registry.build_artifacts(str(tmp_path / "index.json"), str(tmp_path / "figures"), "unused", ["claims"])
    assert open(files["claims"][0]).read().count("not run (no seed has runs on both sides)") == len(claims.CLAIMS)
    assert os.path.isfile(files["claims"][1]) and os.path.isfile(files["claims"][2])
