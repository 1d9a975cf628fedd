"""reproduce.claims.claim_rows: a probe claim's difference, its interval over seeds and test items (coverage checked by
simulation), the verdict it implies, and the README's copy of the claims table."""
import json
import os
from statistics import NormalDist

import numpy as np
import pytest

from conftest import write_records
from mdc.eval.results import write_results
from reproduce import registry
from reproduce.claims import claim_rows, stats
from reproduce.claims.claim_rows import TASKS, Claim, difference, paired_items, verdict, write_readme_table

N = 1000  # test items per task
LEARNABILITY = os.path.join(os.path.dirname(os.path.dirname(claim_rows.__file__)), "studies", "learnability", "runs.jsonl")


def _outcomes(rate: float, rng, n: int = N) -> str:
    return "".join("1" if x else "0" for x in rng.random(n) < rate)


def _run(name, labels, rates: dict, rng, n: int = N) -> dict:
    datasets = {f"wds/{t}": {"top1": rates[t], "correct": _outcomes(rates[t], rng, n)} for t in TASKS}
    return {"name": name, "notebook": "linear_probe", "labels": labels, "artifacts": ["claims"],
            "record": {"results": {"datasets": datasets}}}


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[dict, dict]:
    return {t: a for t in TASKS}, {t: b for t in TASKS}


def simulate(seed_sd: float, seeds: int, reps: int, rng, gap: float = 1.0, n: int = N, rho: float = 0.8,
             rates=(0.3, 0.4, 0.55, 0.7)) -> list[list[tuple[dict, dict]]]:
    """``reps`` claims of ``seeds`` (a, b) pairs whose true mean4 difference is ``gap`` points.

    Per replicate, each task has n items with a difficulty z_i ~ N(0, 1) shared by both models; model m
    "knows" item i when rho z_i + sqrt(1 - rho^2) e_mi < Phi^-1(rate) (the same rate for both, so the
    models agree on most items), for every seed. At seed s, model a gets an item right with probability
    0.1 + 0.8 known + (gap + u_s) / 2 and b with 0.1 + 0.8 known - (gap + u_s) / 2, u_s ~ N(0, seed_sd)
    (points, cut at +-9): the seed's expected difference is gap + u_s, its SD over seeds seed_sd."""
    q = np.array([NormalDist().inv_cdf(r) for r in rates])[:, None]  # [4, 1]
    z = rng.standard_normal((reps, 1, 4, n))
    known = [rho * z + np.sqrt(1 - rho**2) * rng.standard_normal((reps, 1, 4, n)) < q for _ in "ab"]
    shift = (gap + np.clip(rng.normal(0, seed_sd, (reps, seeds, 1, 1)), -9, 9)) / 200
    y = [(rng.random((reps, seeds, 4, n)) < 0.1 + 0.8 * kn + sign * shift).astype(np.uint8)
         for kn, sign in zip(known, (1, -1))]
    return [[tuple({t: ym[r, s, j] for j, t in enumerate(TASKS)} for ym in y) for s in range(seeds)]
            for r in range(reps)]


def coverage(difference=difference, reps: int = 400, seed: int = 0) -> dict[tuple[int, float], float]:
    """{(seeds, seed SD): share of the ``reps`` intervals of ``difference(pairs)`` that hold the true gap}."""
    rng = np.random.default_rng(seed)
    table = {}
    for k in (1, 3):
        for sd in (0.5, 1.0, 2.0, 2.5):
            hits = [d["low"] <= 1.0 <= d["high"] for d in map(difference, simulate(sd, k, reps, rng))]
            table[k, sd] = float(np.mean(hits))
    return table


def test_the_interval_covers_the_true_difference_at_the_measured_variance_components():
    table = coverage()
    print("\nseeds | seed SD 0.5 | 1 | 2 | 2.5\n" + "\n".join(
        f"{k} | " + " | ".join(f"{table[k, sd]:.1%}" for sd in (0.5, 1.0, 2.0, 2.5)) for k in (1, 3)))
    assert all(c >= 0.93 for c in table.values()), table


def test_the_item_part_alone_covers_about_95_percent():
    """No seed noise and seed_sd=0: the interval is the item variance's normal interval."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):  # a truly +5 points better encoder, both probed on 300 fresh items per task
        a = {t: (rng.random(300) < 0.55).astype(np.uint8) for t in TASKS}
        b = {t: (rng.random(300) < 0.50).astype(np.uint8) for t in TASKS}
        d = difference([(a, b)], seed_sd=0.0)
        hits += d["low"] <= 5.0 <= d["high"]
    assert 0.92 <= hits / 400 <= 0.98


def test_the_t_quantile():
    for p, df, want in ((0.975, 1, 12.706), (0.975, 2, 4.303), (0.95, 2, 2.920), (0.975, 10, 2.228),
                        (0.95, float("inf"), 1.645)):
        assert stats.t_quantile(p, df) == pytest.approx(want, abs=1e-3)


def test_the_one_seed_spread_is_the_largest_the_learnability_study_measured():
    """SEED_SD >= every seed SD of a difference of two c64x4 models' mean4 (seeds 0-2, the same test items)."""
    mean4 = {}
    with open(LEARNABILITY) as f:
        for r in map(json.loads, f):
            if r["config"].startswith("c64x4"):
                by_seed = mean4.setdefault((r["config"], r["objective"]), {})
                by_seed[r["seed"]] = np.mean([r["trained"][t] for t in TASKS])
    models = sorted(m for m, by_seed in mean4.items() if sorted(by_seed) == [0, 1, 2])
    sds = [np.std([mean4[a][s] - mean4[b][s] for s in range(3)], ddof=1) for i, a in enumerate(models)
           for b in models[i + 1:]]
    assert len(models) == 4 and max(sds) == pytest.approx(2.62, abs=0.01)
    assert max(sds) <= claim_rows.SEED_SD < max(sds) + 0.1


def test_the_difference_is_the_mean_over_seeds_of_the_paired_mean4_gap():
    right, wrong = np.ones(N, np.uint8), np.zeros(N, np.uint8)
    half = np.r_[np.ones(N // 2, np.uint8), np.zeros(N // 2, np.uint8)]
    d = difference([_pair(right, half), _pair(half, half)])  # +50 and 0 points
    assert d["seeds"] == 2 and d["mean"] == pytest.approx(25.0)
    assert d["low"] <= 25.0 <= d["high"]
    same = difference([_pair(half, half)])  # identical outcomes: only the assumed seed spread is left
    assert same["mean"] == 0.0 and same["high"] == pytest.approx(1.96 * claim_rows.SEED_SD, abs=0.01)
    assert same["low"] == -same["high"] and same["tost_high"] == pytest.approx(1.645 * claim_rows.SEED_SD, abs=0.01)
    assert difference([_pair(wrong, right)], seed_sd=0.0)["high"] == -100.0
    with pytest.raises(ValueError, match="same test items"):
        difference([_pair(half, half), _pair(half[:-1], half[:-1])])


def test_the_interval_carries_the_seed_spread_and_the_shared_items():
    rng = np.random.default_rng(0)
    base = (rng.random(N) < 0.5).astype(np.uint8)
    flip = lambda x, k: np.r_[1 - x[:k], x[k:]].astype(np.uint8)  # noqa: E731  (k items' outcomes changed)
    # seeds that disagree (+10, -10, +10 points) against seeds that agree (+3.3 each): same mean
    spread = difference([_pair(np.maximum(base, flip(base, 200)), base), _pair(base, np.maximum(base, flip(base, 200))),
                         _pair(np.maximum(base, flip(base, 200)), base)])
    agree = difference([_pair(np.maximum(base, flip(base, 67)), base)] * 3)
    assert spread["mean"] == pytest.approx(10 / 3, abs=0.5) and agree["mean"] == pytest.approx(spread["mean"], abs=0.5)
    assert spread["high"] - spread["low"] > 3 * (agree["high"] - agree["low"])
    assert spread["low"] < 0 < agree["low"]
    # the same items in three seeds are no more informative than in one (the seed part aside)
    one = difference([_pair(np.maximum(base, flip(base, 67)), base)], seed_sd=0.0)
    assert agree["v_seeds"] == 0.0 and agree["v_items"] == pytest.approx(one["v_items"])


def _d(low, high, seeds=3, tost=None):
    tost_low, tost_high = tost or (low, high)
    return dict(seeds=seeds, low=low, high=high, tost_low=tost_low, tost_high=tost_high)


def test_verdicts_follow_from_the_intervals():
    d, ab = _d, ("MDC", "ARC")
    assert verdict("greater", d(0.4, 3.0)) == "reproduced"
    assert verdict("greater", d(-3.0, -0.2), 2.0, ab) == "contradicted: MDC below ARC"
    assert verdict("greater", d(-0.5, 3.0)) == "not resolved"
    assert verdict("greater", d(0.4, 3.0, seeds=1)) == "reproduced (provisional)"
    assert verdict("greater", d(-0.5, 3.0, seeds=1)) == "not resolved (provisional)"
    # comparable: TOST at 5% reads the 90% interval; contradicted needs the 95% interval beyond the margin
    assert verdict("equal", d(-2.1, 1.9, tost=(-1.5, 1.5))) == "reproduced"
    assert verdict("equal", d(-2.1, 1.9, tost=(-1.5, 1.5), seeds=1)) == "reproduced (provisional)"
    assert verdict("equal", d(-1.5, 2.5, tost=(-1.0, 2.1))) == "not resolved"
    assert verdict("equal", d(2.1, 6.0), 2.0, ab) == "contradicted: MDC above ARC by more than 2"
    assert verdict("equal", d(-7.0, -2.5), 2.0, ab) == "contradicted: MDC below ARC by more than 2"
    assert verdict("equal", d(1.9, 6.0, tost=(2.2, 5.7))) == "not resolved; a above b"
    with pytest.raises(ValueError, match="expect"):
        Claim("x", {}, {}, expect="less")


def test_a_significant_direction_is_named_where_the_margin_is_not_resolved():
    """The reference run's MDC - ARC on descriptive captions: 95% [-8.4, -0.9], 90% [-7.2, -2.0]."""
    row = _d(-8.4, -0.9, tost=(-7.2, -2.0))
    assert verdict("equal", row, 2.4, ("MDC", "ARC")) == "not resolved; MDC below ARC"
    assert verdict("equal", row, 0.8, ("MDC", "ARC")) == "contradicted: MDC below ARC by more than 0.8"


def test_a_beats_claim_inside_the_margin_reads_as_no_effect_of_that_size():
    """The reference run's MDC - CLIP: 95% [-1.1, +1.8], 90% [-0.8, +1.5]."""
    assert verdict("greater", _d(-1.1, 1.8, tost=(-0.8, 1.5)), 2.4) == "no effect of 2.4 points"
    assert verdict("greater", _d(-1.1, 1.8, tost=(-0.8, 1.5)), 1.4) == "not resolved"
    assert verdict("greater", _d(0.2, 1.8, tost=(0.4, 1.5)), 2.4) == "reproduced, by less than 2.4"


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


def test_the_claims_table_from_records_shaped_as_the_registry_writes_them(tmp_path):
    """Every probe run of the mini profile's registry, with outcomes drawn so that MDC beats CLIP by a wide
    margin and equals ARC: the table names each claim, its seeds and the verdicts those imply."""
    rng = np.random.default_rng(0)
    index = {}
    for r in registry.build("mini", seeds=3):
        if r.notebook != "linear_probe":
            continue
        rate = {"MDC": 0.6, "ARC": 0.6, "CLIP": 0.3}.get(r.labels["method"], 0.45)
        path = str(tmp_path / r.name / "results.json")
        datasets = {f"wds/{t}": {"top1": rate, "correct": _outcomes(rate, rng)} for t in TASKS}
        floor = {"datasets": {f"wds/{t}": {"top1": 0.25} for t in TASKS}}  # gains: 35, 35 and 5 points
        write_results(path, "linear_probe", {"datasets": datasets, "random_init": floor})
        index[r.name] = {"notebook": r.notebook, "labels": r.labels, "artifacts": list(r.artifacts), "results": path}
    assert all("claims" in v["artifacts"] for v in index.values())
    records = write_records(tmp_path / "records", index)
    files = registry.build_artifacts(records, str(tmp_path / "figures"), "unused", ["claims"])
    table = open(files["claims"][0]).read()
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(claim_rows.CLAIMS) + len(claim_rows.CAPTION_CLAIMS)
    assert all("not run (no captioning run" in row[-1] for row in rows[len(claim_rows.CLAIMS):])  # no captioning here
    rows = rows[: len(claim_rows.CLAIMS)]
    by_what = {row[1]: row for row in rows}
    verdicts = {what: row[-1].rstrip(" |") for what, row in by_what.items()}
    assert verdicts["MDC - CLIP, descriptive"] == "reproduced" and verdicts["MDC - BERT 15%, alt"] == "reproduced"
    assert verdicts["MDC - ARC, descriptive"] in ("reproduced", "not resolved")
    assert by_what["MDC - ARC, descriptive"][2] == "TOST; margin +-2.5"  # 10% of the mean gain, 25 points
    assert by_what["MDC - CLIP, descriptive"][2] == "two-sided at 0; margin +-2.5"
    assert all(row[6].startswith("[") and row[7] != "-" and row[8] != "-" for row in rows)  # 90% interval, p, Holm
    assert all(row[3] == "3" for row in rows)  # every claim found its runs, in all three seeds
    # both sides at the same rate: the 90% interval within the margin
    assert verdicts["all pairs - 25% of them, descriptive"] == "no effect of 2.5 points"


def test_a_claim_without_runs_says_so(tmp_path):
    files = registry.build_artifacts(str(tmp_path / "records"), str(tmp_path / "figures"), "unused", ["claims"])
    assert open(files["claims"][0]).read().count("not run (no seed has runs on both sides)") == len(claim_rows.CLAIMS)
    assert os.path.isfile(files["claims"][1]) and os.path.isfile(files["claims"][2])


ROWS = claim_rows.CLAIMS + claim_rows.CAPTION_CLAIMS  # the probe claims' rows and claim 8's

README = """# Title

Intro.

<!-- claims:begin -->
| old | table |
|---|---|
| x | y |
<!-- claims:end -->

After, with trailing spaces   
and no final newline"""


def test_the_readme_block_becomes_the_table_and_nothing_else_changes(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_bytes(README.encode())
    table = "| claim | verdict |\n|---|---|\n| 1. a | reproduced (provisional) |\n"
    assert write_readme_table(str(readme), table)
    text = readme.read_bytes().decode()
    begin, end = text.index(claim_rows.BEGIN), text.index(claim_rows.END)
    assert text[begin:end] == claim_rows.BEGIN + "\n" + table
    assert text[:begin] == README[:README.index(claim_rows.BEGIN)] and text[end:] == README[README.index(claim_rows.END):]
    assert write_readme_table(str(readme), table) and readme.read_bytes().decode() == text  # idempotent


def test_a_readme_without_markers_is_left_alone(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_bytes(README.replace(claim_rows.END, "").encode())
    assert not write_readme_table(str(readme), "| a |\n")
    assert readme.read_bytes() == README.replace(claim_rows.END, "").encode()
    assert "not rewritten" in capsys.readouterr().out


def test_only_a_build_into_the_repositorys_figures_rewrites_its_readme(tmp_path, monkeypatch):
    monkeypatch.setattr(claim_rows, "ROOT", str(tmp_path))
    (tmp_path / "README.md").write_bytes(README.encode())
    claim_rows.build([], "unused", str(tmp_path / "elsewhere"))
    assert (tmp_path / "README.md").read_bytes() == README.encode()
    files = claim_rows.build([], "unused", str(tmp_path / "figures"))
    table = "".join(line for line in open(files[0]) if line.startswith("|"))
    assert table.count("not run (") == len(ROWS)
    assert claim_rows.BEGIN + "\n" + table + claim_rows.END in (tmp_path / "README.md").read_text()


def test_the_verdict_counts_are_written_by_the_build_not_typed(tmp_path, monkeypatch):
    """The README's and docs/results.md's summary sentence between the summary markers is the table's."""
    monkeypatch.setattr(claim_rows, "ROOT", str(tmp_path))
    stale = "Five rows are reproduced and seven not resolved."
    block = f"{claim_rows.SUMMARY[0]}\n{stale}\n{claim_rows.SUMMARY[1]}\n"
    (tmp_path / "README.md").write_text(README + "\n" + block)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("# Results\n\n" + block + "More.\n")
    claim_rows.build([], "unused", str(tmp_path / "figures"))
    want = (f"Of the {len(ROWS)} claim rows, each tested at 5%: 0 reproduced, 0 contradicted, 0 with no "
            f"effect of the margin's size, 0 not resolved, {len(ROWS)} not run; 0 of the 0 reproduced rows "
            f"keep p < 0.05 after Holm's adjustment over the 0 rows that ran.")
    for doc in (tmp_path / "README.md", tmp_path / "docs" / "results.md"):
        assert stale not in doc.read_text() and f"{claim_rows.SUMMARY[0]}\n{want}\n{claim_rows.SUMMARY[1]}" in doc.read_text()
    assert (tmp_path / "docs" / "results.md").read_text().endswith(claim_rows.SUMMARY[1] + "\nMore.\n")


def test_the_summary_counts_each_verdict_and_the_rows_holm_keeps():
    verdicts = (("reproduced", "<0.001"), ("reproduced", "0.052"), ("not resolved; MDC below ARC", "1.000"),
                ("no effect of 2.4 points", "1.000"), ("contradicted: MDC below ARC", "0.010"), ("not resolved", "0.900"))
    rows = [{"verdict": v, "Holm p": h} for v, h in verdicts]
    assert claim_rows.summary(rows) == (
        "Of the 6 claim rows, each tested at 5%: 2 reproduced, 1 contradicted, 1 with no effect of the margin's "
        "size, 2 not resolved (1 of them with a significant direction); 1 of the 2 reproduced rows keep p < 0.05 "
        "after Holm's adjustment over the 6 rows that ran.")


def test_the_margin_is_a_tenth_of_the_styles_gain_over_random_init():
    rng = np.random.default_rng(0)

    def run(method, style, rate, floor, **extra):
        r = _run(f"probe/{method}-{style}", dict(claim_rows._main(method, style), seed=0, **extra),
                 {t: rate for t in TASKS}, rng)
        r["record"]["results"]["random_init"] = {"datasets": {f"wds/{t}": {"top1": floor} for t in TASKS}}
        return r

    runs = [run("MDC", "alt", 0.40, 0.25), run("ARC", "alt", 0.45, 0.25), run("CLIP", "alt", 0.35, 0.25),
            run("MDC", "descriptive", 0.55, 0.25), run("BERT", "alt", 0.9, 0.1, mask_ratio=0.15)]  # BERT: no anchor
    assert claim_rows.margins(runs) == {"alt": 1.5, "descriptive": 3.0}


def test_holms_family_is_the_rows_that_ran():
    """A row not run has no p-value and is not in Holm's family: the summary says over how many rows it is."""
    rows = [{"verdict": "reproduced", "Holm p": "0.010"}, {"verdict": "not run (no records)", "Holm p": "-"}]
    assert claim_rows.summary(rows).endswith("1 of the 1 reproduced rows keep p < 0.05 after Holm's adjustment over "
                                         "the 1 rows that ran.")
