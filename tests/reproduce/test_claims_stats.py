"""reproduce.claims.stats: the exact t tail, p-values that agree with the claims' intervals, Holm's adjustment."""
from statistics import NormalDist

import numpy as np
import pytest

from reproduce.claims import stats
from reproduce.claims.stats import difference
from test_claims import simulate


def test_p_values_agree_with_the_intervals():
    """Two-sided p < 0.05 exactly when the 95% interval excludes 0, TOST's p < 0.05 exactly when the 90%
    interval lies inside the margin; at the interval's end the p-value is 5%."""
    rng = np.random.default_rng(3)
    for pairs in simulate(2.0, 3, 30, rng, gap=2.0) + simulate(1.0, 1, 10, rng, gap=0.5):
        d = difference(pairs)
        assert (stats.two_sided_p(d) < 0.05) == (d["low"] > 0 or d["high"] < 0)
        assert stats.two_sided_p(d, d["low"]) == pytest.approx(0.05, abs=1e-6)
        assert stats.two_sided_p(d, d["high"]) == pytest.approx(0.05, abs=1e-6)
        for m in (1.0, 2.0, 4.0):
            assert (stats.tost_p(d, m) < 0.05) == (-m < d["tost_low"] and d["tost_high"] < m)
        assert stats.one_sided_p(d, d["mean"] - d["tost_low"]) == pytest.approx(0.05, abs=1e-6)


def test_the_p_value_of_one_seed_is_the_normal_one():
    d = dict(seeds=1, mean=3.0, v_items=1.0, v_seeds=1.0)  # sd sqrt(2), z = 3 / sqrt(2)
    assert stats.two_sided_p(d) == pytest.approx(2 * NormalDist().cdf(-3 / np.sqrt(2)), rel=1e-6)


def test_the_t_tail_is_exact():
    for x, df, want in ((2.0, 1, 0.1475836), (2.0, 2, 0.0917517), (3.182446, 3, 0.025), (1.0, 30, 0.1626543)):
        assert stats.t_sf(x, df) == pytest.approx(want, abs=1e-6)


def test_holm_adjusts_step_down_and_keeps_the_order():
    assert stats.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert stats.holm([0.3, 0.001]) == pytest.approx([0.3, 0.002])
    assert stats.holm([0.6, 0.6]) == [1.0, 1.0]
