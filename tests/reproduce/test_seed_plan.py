"""reproduce.running.seed_plan: seeds per run from a plan file or the ledger, and the claim-row seeds a build holds."""
import csv
import json
import os

import pytest

from reproduce import registry
from reproduce.running import seed_plan
from reproduce.running.seed_plan import SeedPlan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = os.path.join(ROOT, "reproduce", "records", "mini")
PLAN = os.path.join(ROOT, "reproduce", "presets", "mini-seeds.json")  # the seed plan RECORDS was run with


def test_a_plan_gives_a_pretraining_run_and_its_probe_more_seeds_and_the_rest_the_default():
    plan = SeedPlan(2, (("mdc-alt", 4),))
    runs = seed_plan.apply(registry.build("mini", plan.most), plan)
    names = {r.name for r in runs}
    assert {"pretrain/mdc-alt-s3", "probe/mdc-alt-s3", "pretrain/arc-alt-s1", "captioning/alt-s1"} <= names
    assert not names & {"pretrain/arc-alt-s2", "probe/arc-alt-s2", "captioning/alt-s2", "captioning/alt-s3",
                        "compositionality/mdc-descriptive-pairs-s2"}
    assert all(d in names for r in runs for d in r.deps)  # every run keeps what it reads
    assert len(registry.build("mini", 2)) + 2 * 2 == len(runs)  # seeds 2 and 3 of mdc-alt and its probe
    counts = seed_plan.claim_seeds(runs)
    assert counts["MDC - BERT 15%, alt"] == 2 and counts["MDC - ARC, descriptive"] == 2
    assert counts["MDC at ARC's length - ARC (beam 6), CIDEr-D"] == 2  # claim 8: the captioning runs' seeds


def test_the_ledgers_plan_is_the_seeds_it_recorded():
    plan = seed_plan.from_ledger(RECORDS, registry.build("mini", 1))
    assert plan == seed_plan.read(PLAN)  # the plan it ran
    assert seed_plan.from_ledger("no-such-folder", registry.build("mini", 1)) == SeedPlan(1, ())


def test_a_plan_file_round_trips_and_a_bad_one_names_its_field(tmp_path):
    path = str(tmp_path / "plan.json")
    plan = SeedPlan(3, (("arc-descriptive", 6), ("mdc-alt", 6), ("mdc-wot-alt", 4)))
    seed_plan.write(path, plan, "from the power table")
    assert seed_plan.read(path) == plan
    assert plan.describe() == "6 seeds for arc-descriptive, mdc-alt, 4 seeds for mdc-wot-alt, 3 elsewhere"
    for bad, word in (({"default": 0}, "'default'"), ({"seeds": {"mdc-alt": "six"}}, "'mdc-alt'"),
                      ({"sedes": {}}, "unknown field 'sedes'"), ([3], "want")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=word):
            seed_plan.read(str(tmp_path / "bad.json"))


def _planned_runs():
    """The runs of the seed plan the committed ledger was run with."""
    plan = seed_plan.read(PLAN)
    return seed_plan.apply(registry.build("mini", plan.most), plan)


def test_richer_figures_names_the_rows_a_build_would_lose(tmp_path):
    (tmp_path / "claims.csv").write_text(open(os.path.join(ROOT, "figures", "claims.csv")).read())
    with open(tmp_path / "claims.csv", newline="") as f:
        held = [int(row["seeds"]) for row in csv.DictReader(f) if row["seeds"].isdigit()]
    lose = [n for n in held if n > 1]
    one = registry.build("mini", 1)
    why = seed_plan.richer_figures(str(tmp_path), one)
    assert why.startswith(f"{tmp_path} holds {max(lose)} seeds of {len(lose)} claim row(s)")
    assert why.endswith("this build 1")
    assert seed_plan.richer_figures(str(tmp_path), _planned_runs()) is None  # the build that wrote it
    assert seed_plan.richer_figures(str(tmp_path / "empty"), one) is None


def test_claim_8s_seeds_count_in_the_rule_like_the_probe_claims(tmp_path):
    """Claim 8's rows count like the probe rows: a figures folder whose only multi-seed rows are claim 8's (three
    captioning seeds) is richer than a one-seed build, and not richer than a three-seed one."""
    with open(os.path.join(ROOT, "figures", "claims.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["seeds"] = "3" if row["difference (mean4, points)"].endswith("CIDEr-D") else "1"
    with open(tmp_path / "claims.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert seed_plan.richer_figures(str(tmp_path), registry.build("mini", 3)) is None
    assert "holds 3 seeds of 3 claim row(s)" in seed_plan.richer_figures(str(tmp_path), registry.build("mini", 1))
