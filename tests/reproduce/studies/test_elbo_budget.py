"""The ELBO-budget study: the same items scored at two sample counts, the decisions compared per suite."""
import json

import mdc
from conftest import WORLD_SMALL, small_model
from mdc.eval import compositionality as comp
from reproduce.studies import elbo_budget


def test_the_study_compares_decisions_per_suite_and_writes_its_table(evalsets, tmp_path):
    small_model(**WORLD_SMALL).save(tmp_path / "mdc")
    assert elbo_budget.main(["--checkpoint", str(tmp_path / "mdc"), "--evalsets", evalsets, "--items", "3",
                             "--samples", "2", "8", "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    suites = {r["suite"] for r in res["rows"]}
    assert "aro_coco_order" in suites and any(s.startswith("sugarcrepe/") for s in suites)
    assert {r["variant"] for r in res["rows"]} == {"elbo", "elbo_trained_t"}
    assert all(r["items"] == 3 for r in res["rows"])
    assert set(res["seconds"]) == {"fixed", "sequential", "continued", "fresh", "fresh_seed1"}
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| all suites | elbo |" in table and "| 2->8 seq. | " in table


def test_a_budget_that_always_continues_is_the_sequential_rule_at_its_maximum(evalsets):
    """``continued`` spends the maximum on every item; where the sequential rule stops it is the fixed budget."""
    model = small_model(**WORLD_SMALL).eval()
    suite = elbo_budget.subset(next(iter(comp.load_suites(evalsets, "all", attribute_min_count=1).values())), 4)
    transform = mdc.image_transform(model)
    got = {b: elbo_budget.decisions(model, transform, suite, kw)[0]["elbo"]
           for b, kw in elbo_budget.budgets(2, 2).items()}
    assert all((d == got["fixed"]).all() for d in got.values() if d is not got["fresh_seed1"])


def test_wilson_interval():
    low, high = elbo_budget.wilson(98, 100)
    assert 0.92 < low < 0.94 and 0.99 < high < 1.0
