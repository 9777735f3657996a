"""bench/noise.py's figures: the share of the noise-free gain a noisy session's winner keeps (against the same
scenario and seed with the noise at 0), and whether its reported interval covers the winner's true gain."""

from __future__ import annotations

import pytest

from bench.noise import covered, figures


def _run(scale, seed, gain, iv=None, kept=False, rejected=None, scenario="s"):
    return {"scenario": scenario, "seed": seed, "noise_scale": scale, "true_gain_pct": gain, "kept_baseline": kept,
            "rejected_true_gain_pct": rejected, "disturbed": 0,
            "gain_interval": None if iv is None else {"lo": iv[0], "hi": iv[1], "estimate": sum(iv) / 2},
            "gpu_hours": {"remeasure": 1.0, "total": 5.0}}


def test_a_kept_baseline_is_covered_by_an_interval_across_zero_and_a_winner_only_by_its_true_gain():
    assert covered(_run(3, 0, 20.0, (10.0, 30.0)))
    assert not covered(_run(3, 0, 20.0, (21.0, 30.0)))
    assert not covered(_run(3, 0, 20.0, None))  # a winner reported without an interval claims too much
    assert covered(_run(3, 0, 0.0, (-2.0, 5.0), kept=True, rejected=1.0))
    assert covered(_run(3, 0, 0.0, None, kept=True))  # no candidate measured faster: it claims nothing
    assert not covered(_run(3, 0, 0.0, (2.0, 5.0), kept=True, rejected=8.0))


def test_the_share_is_per_pair_against_the_noise_free_session():
    runs = [_run(0, 0, 40.0, (39, 41)), _run(0, 1, 20.0, (19, 21)),
            _run(3, 0, 38.0, (30, 45)), _run(3, 1, 15.0, (16, 25)),  # its interval misses its true gain
            _run(3, 2, 10.0, (5, 15))]  # no reference for seed 2: no share, still a session for the coverage
    f = figures(runs, [3.0])["3x"]
    assert f["true_gain_share"]["per_pair"] == {"s/0": 0.95, "s/1": 0.75}
    assert f["true_gain_share"]["pairs_at_least_0.95"] == 0.5
    assert f["true_gain_share"]["median"] == pytest.approx(0.85)
    assert f["ci_coverage"] == pytest.approx(2 / 3, abs=1e-4) and f["sessions"] == 3
    assert f["meets_targets"] == {"true_gain_share": False, "ci_coverage": False}
