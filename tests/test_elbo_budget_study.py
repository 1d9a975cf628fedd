"""The ELBO-budget study: the same items scored at two sample counts, the decisions compared per suite."""
import json

from conftest import WORLD_SMALL, small_model
from reproduce.studies import elbo_budget


def test_the_study_compares_decisions_per_suite_and_writes_its_table(evalsets, tmp_path):
    small_model(**WORLD_SMALL).save(tmp_path / "mdc")
    assert elbo_budget.main(["--checkpoint", str(tmp_path / "mdc"), "--evalsets", evalsets, "--items", "3",
                             "--samples", "2", "2", "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    suites = {r["suite"] for r in res["rows"]}
    assert "aro_coco_order" in suites and any(s.startswith("sugarcrepe/") for s in suites)
    assert {r["variant"] for r in res["rows"]} == {"elbo", "elbo_trained_t"}
    assert all(r["items"] == 3 for r in res["rows"])
    assert all(r["agree"] == r["items"] for r in res["rows"])  # the same count twice: the same keyed noise
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| all suites | elbo |" in table and "100.0%" in table


def test_wilson_interval():
    low, high = elbo_budget.wilson(98, 100)
    assert 0.92 < low < 0.94 and 0.99 < high < 1.0
