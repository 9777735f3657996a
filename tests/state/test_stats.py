"""The gain intervals every stage's verdict uses (state/stats.py)."""

import math

import numpy as np
import pytest

from mart.state.stats import (
    Interval,
    difference_interval,
    gain_interval,
    relative_spread,
)


def test_a_clear_throughput_gain_has_an_interval_above_zero():
    iv = gain_interval([100, 102, 98], [130, 128, 133])
    assert 25 < iv.estimate < 35
    assert iv.confirms_gain and not iv.confirms_loss and iv.excludes_zero
    assert iv.lo < iv.estimate < iv.hi
    assert (iv.n_baseline, iv.n_candidate, iv.method, iv.relative) == (3, 3, "welch-t-log", True)


def test_a_gain_inside_the_noise_is_not_confirmed():
    iv = gain_interval([100, 140, 70], [110, 80, 150])
    assert not iv.excludes_zero and iv.covers(0.0)


def test_one_measurement_a_side_gives_no_interval_and_confirms_nothing():
    iv = gain_interval([100], [200])
    assert iv.estimate == pytest.approx(100.0)
    assert not iv.known and not iv.confirms_gain and iv.method == "none"
    assert "no interval" in iv.describe()


def test_a_single_candidate_measurement_borrows_the_baselines_spread():
    iv = gain_interval([100, 101, 99, 100], [150])
    assert iv.known and iv.confirms_gain


def test_pairing_cancels_drift_that_hits_both_sides():
    # the machine slows down over time; the candidate is 5% faster at every moment
    drift = [1.0, 0.7, 0.5, 0.35]
    base = [100 * d for d in drift]
    cand = [105 * d * (1 + e) for d, e in zip(drift, [0.004, -0.003, 0.002, -0.001])]
    assert not gain_interval(base, cand).confirms_gain
    paired = gain_interval(base, cand, paired=True)
    assert paired.confirms_gain and paired.method == "paired-t-log"
    assert paired.covers(5.0)


def test_the_t_interval_covers_the_true_gain_at_about_its_level():
    rng = np.random.default_rng(7)
    hits, n = 0, 400
    for _ in range(n):
        b = 100 * np.exp(rng.normal(0, 0.1, 3))
        c = 110 * np.exp(rng.normal(0, 0.1, 3))
        hits += gain_interval(b, c).covers(10.0)
    assert 0.85 <= hits / n <= 0.95


def test_score_differences():
    d = difference_interval([0.40, 0.41, 0.39], [0.45, 0.46, 0.44])
    assert not d.relative and d.confirms_gain and d.estimate == pytest.approx(0.05)


def test_interval_round_trips_and_rejects_bad_input():
    iv = gain_interval([100, 102], [110, 111])
    assert Interval.from_json(iv.to_json()) == iv
    with pytest.raises(ValueError):
        gain_interval([], [1.0])
    with pytest.raises(ValueError):
        gain_interval([0.0, 1.0], [1.0, 2.0])
    assert relative_spread([1.0]) is None
    assert math.isclose(relative_spread([9.0, 11.0]), math.sqrt(2) / 10)
