"""python -m reproduce.controls: the positive controls of Table 2 on the shipped weights, as a plain JSON."""
import json
import math

import numpy as np
import pytest

import mdc
from mdc.eval.suite_scoring import SuiteOptions, score_suite
from mdc.eval.suites import load_suites
from reproduce import controls


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("controls")
    result = controls.main(["--out", str(out), "--items", "4", "--samples", "2", "--suites",
                            "own_sugarcrepe/swap_att", "own_relation", "sugarcrepe/replace_att"])
    return out, result


def test_the_json_is_exactly_the_documented_object(run):
    out, result = run
    with open(out / "controls.json") as f:
        assert json.load(f) == result
    assert list(result) == ["suites"]
    kinds = {name: s["kind"] for name, s in result["suites"].items()}
    assert kinds == {"own_sugarcrepe/swap_att": "in-distribution", "own_relation": "in-distribution",
                     "sugarcrepe/replace_att": "unseen phrasing"}
    for s in result["suites"].values():
        assert set(s) == {"kind", "models"} and list(s["models"]) == ["mdc", "mdc_heuristic", "arc", "clip"]
        for name, m in s["models"].items():
            assert list(m) == ["own", "shuffled", "no_image"]
            assert all(0 <= m[k] <= 1 and m[k] * 4 == round(m[k] * 4) for k in ("own", "shuffled"))  # 4 items
            assert (m["no_image"] is None) == (name == "clip")
    md = (out / "controls.md").read_text()
    assert "| own_relation | in-distribution |" in md and "Binding (MDC)" in md and "margin 71 points" in md


def test_the_numbers_are_a_plain_scoring_of_the_shipped_weights(run):
    """ARC's own / shuffled accuracy recomputed by hand: exact log-likelihood of both captions with the item's
    image and with the shuffled item's image, true caption strictly higher."""
    out, result = run
    suite = load_suites(str(out / "evalsets"), ["own_relation"], attribute_min_count=1)["own_relation"]
    model = mdc.create_model("mini", objective="arc", pretrained="synthetic").eval()
    scored = score_suite(model, mdc.image_transform(model), suite, ["exact"],
                         SuiteOptions(blind=False, shuffled=True, elbo_trained_t=False))
    got = result["suites"]["own_relation"]["models"]["arc"]
    for key, variant in (("own", "exact"), ("shuffled", "exact_shuffled")):
        s = scored.scores[variant]
        assert got[key] == pytest.approx(float(np.mean(s[:, 0] > s[:, 1])))
    assert controls.accuracy(np.array([[1.0, 0.0], [0.0, 0.0]])) == 0.5  # a tie is an error
    assert controls.accuracy(np.array([[math.nan, 0.0]])) is None
