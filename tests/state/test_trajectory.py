"""The one trajectory reader: key fallbacks per step and for a whole stream, per-agent streams, windows, slopes."""

from __future__ import annotations

import math

import pytest

from mart.state.metrics import StepRecord
from mart.state.trajectory import Trajectory, persisting, rel_slope, residual_std, tail, trailing

RECORDS = [
    StepRecord(0, {"val-core/a/acc": 0.1}),
    StepRecord(1, {"actor/kl_loss": 0.1, "actor/ppo_kl": 9.0, "agent1/actor/entropy": 2.0}),
    StepRecord(2, {"actor/kl_loss": math.nan, "actor/ppo_kl": 8.0}),
    StepRecord(3, {"actor/ppo_kl": 7.0, "agent1/actor/entropy": 1.0, "val-core/a/acc": 0.4}),
]


def test_a_fallback_per_step_and_a_fallback_for_the_whole_stream():
    t = Trajectory(RECORDS)
    # per step: the first key each step holds (NaN included unless ``keep`` says otherwise)
    got = t.series("actor/kl_loss", "actor/ppo_kl")
    assert got[0] == (1, 0.1) and math.isnan(got[1][1]) and got[2] == (3, 7.0)
    assert t.series("actor/kl_loss", "actor/ppo_kl", keep=math.isfinite) == [(1, 0.1), (2, 8.0), (3, 7.0)]
    # for the whole stream: the first key with a finite point, its points only (never a mix of two metrics)
    assert t.first_series(("actor/kl_loss", "actor/ppo_kl")) == [(1, 0.1)]
    assert t.first_series(("actor/missing", "actor/ppo_kl")) == [(1, 9.0), (2, 8.0), (3, 7.0)]
    assert t.series("val-core/a/acc", since=1) == [(3, 0.4)]
    assert t.prefixed("val-core/") == [(0, 0.1), (3, 0.4)] and t.first_key("val-core/") == "val-core/a/acc"


def test_an_agents_stream_reads_under_verls_names():
    t = Trajectory(RECORDS)
    assert t.agents() == [1]
    assert t.agent(1).series("actor/entropy") == [(1, 2.0), (3, 1.0)]
    assert Trajectory(RECORDS[::-1]).sorted_by_step().records == RECORDS


def test_windows_and_slopes():
    line = [(s, 2.0 + 0.5 * s) for s in range(1, 11)]
    assert tail(line, 3) == line[-3:] and tail([], 3) == []
    mean_abs = sum(v for _, v in line) / len(line)
    assert rel_slope(line) == pytest.approx(0.5 / mean_abs)
    assert rel_slope(line[:1]) is None and rel_slope([(4, 1.0), (4, 2.0)]) is None
    wobble = [(s, v + (0.1 if s % 2 else -0.1)) for s, v in line]
    assert residual_std(line) == pytest.approx(0.0, abs=1e-12) and residual_std(wobble) > 0.09
    pts = [(s, v) for s, v in enumerate([0, 5, 5, 5, 0, 5, 5], 1)]
    assert persisting(pts, lambda v: v > 1, 3) == 3  # a run of 3 anywhere reached the window
    assert persisting(pts, lambda v: v > 1, 4) == 2  # else the trailing run
    assert trailing(pts, lambda v: v > 1) == [(6, 5), (7, 5)]
