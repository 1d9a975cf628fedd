"""Positive controls: the margin rule, the verdicts and the MDC binding diagnostic."""
import math
import warnings

import numpy as np
import pytest
import torch

from conftest import small_model
from mdc.distribution import encode
from mdc.eval import positive_controls as K


def test_the_margin_is_two_standard_errors_of_a_difference_at_fifty_percent_rounded_up():
    assert K.control_margin(150) == 0.12 and K.control_margin(500) == 0.07 and K.control_margin(20) == 0.32
    for n in (10, 99, 1000):
        assert K.control_margin(n) >= 2 * math.sqrt(0.5 / n) > K.control_margin(n) - 0.01
    with pytest.raises(ValueError):
        K.control_margin(0)


def test_a_suite_passes_when_some_scorer_loses_the_margin_without_its_image():
    margin = K.control_margin(100)  # 0.15
    reads = {"own": 0.5 + margin, "shuffled": 0.5, "no_image": 0.5}
    text_only = {"own": 0.9, "shuffled": 0.9 - margin + 0.01, "no_image": 0.9}  # the text decides
    assert K.control_status([text_only, reads], 100) == "passed"
    assert K.control_status([text_only], 100) == "control failed"
    assert K.control_status([{"own": 0.9, "shuffled": None, "no_image": 0.5}], 100) == "not run"
    assert K.control_status([{"own": 0.9, "shuffled": float("nan"), "no_image": None}], 100) == "not run"


def test_cell_controls_never_invent_a_control_the_run_did_not_score():
    entry = {"scores": {"cosine": {"accuracy": 0.8}, "cosine_shuffled": {"accuracy": 0.55}}}  # no image-free score
    assert K.cell_controls(entry, "cosine") == {"own": 0.8, "shuffled": 0.55, "no_image": None}
    entry["scores"] |= {"exact": {"accuracy": 0.8}, "exact_shuffled": {"accuracy": 0.5}, "exact_blind": {"accuracy": 0.6}}
    assert K.cell_controls(entry, "exact") == {"own": 0.8, "shuffled": 0.5, "no_image": 0.6}


def test_binding_compares_the_true_and_the_swapped_words_with_the_rest_visible():
    model, images = small_model().eval(), torch.randn(3, 3, 32, 32)
    true = ["a red circle left of a blue square", "a red circle left of a blue square", "a red circle"]
    swapped = ["a blue circle left of a red square", "a red circle left of a blue square", "a red big circle"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = K.binding_scores(model, images, true, swapped).numpy()
        back = K.binding_scores(model, images, swapped, true).numpy()
    assert np.isfinite(s[0]) and math.isnan(s[1]) and math.isnan(s[2])  # identical / unequal length: untestable
    assert s[0] == pytest.approx(-back[0], abs=1e-5)  # the same masked context: the comparison is antisymmetric
    tok = model.tokenizer
    t, w = tok.tokenize(true[:1])[0], tok.tokenize(swapped[:1])[0]
    x = t.masked_fill(t != w, tok.mask_id)
    with torch.no_grad():
        logp = encode(model, images[:1]).log_probs(x)  # [1, L, V]
    d = (t != w)[0]
    hand = (logp[0, d].gather(-1, t[0, d, None]) - logp[0, d].gather(-1, w[0, d, None])).sum()  # by hand
    assert s[0] == pytest.approx(float(hand), abs=1e-4)
