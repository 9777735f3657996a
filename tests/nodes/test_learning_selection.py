"""Stage 2 under noise: the noise estimate, collapse signals, the winner rule, and a sim session where close
configs are re-run on a second seed once each and the summary reports the winner's mean and spread."""

from __future__ import annotations

import math
import random
from pathlib import Path

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.objectives import (
    Contender,
    collapse_signals,
    fall_tolerance,
    pick_learning_winner,
    pooled_validation_noise,
    validation_noise,
)
from tests.support.cli import sim_stage2_options

VAL = "val-core/task/reward/mean@1"


def _records(vals: dict[int, float], entropy: list[float]) -> list[StepRecord]:
    return [StepRecord(step=s, data={**({VAL: vals[s]} if s in vals else {}),
                                     **({"actor/entropy": entropy[s - 1]} if 1 <= s <= len(entropy) else {})})
            for s in range(0, len(entropy) + 1)]


def test_validation_noise_recovers_the_scatter_around_a_trend():
    rng = random.Random(0)
    estimates = []
    for _ in range(200):
        series = [(s, 0.3 + 0.004 * s + rng.gauss(0, 0.01)) for s in range(0, 61, 5)]
        estimates.append(validation_noise(series))
    assert 0.008 < sorted(estimates)[100] < 0.012  # the median estimate is near the true 0.01
    assert validation_noise([(0, 0.1), (5, 0.2)]) is None


def test_pooled_noise_is_unbiased_where_the_median_of_short_curves_runs_low():
    rng = random.Random(1)
    curves = [[(s, 0.3 + 0.004 * s + rng.gauss(0, 0.01)) for s in range(0, 31, 5)] for _ in range(12)]
    median = sorted(v for c in curves if (v := validation_noise(c)) is not None)[6]
    pooled = pooled_validation_noise(curves)
    assert pooled is not None and abs(pooled - 0.01) < abs(median - 0.01) and 0.008 < pooled < 0.012
    assert pooled_validation_noise([[(0, 0.1), (5, 0.2)]]) is None


def test_a_fall_is_a_signal_only_beyond_what_the_best_of_its_noisy_points_explains():
    assert fall_tolerance(None, 13) == 0.0 and fall_tolerance(0.01, 3) < fall_tolerance(0.01, 13)
    rng = random.Random(2)
    flagged = 0
    for _ in range(400):  # a plateau validated 13 times: the last point below the best by noise alone
        recs = _records({s: 0.4 + rng.gauss(0, 0.01) for s in range(0, 61, 5)}, [1.0] * 60)
        flagged += bool(collapse_signals(recs, [], noise=0.01, prefix="val-core/"))
    assert flagged / 400 <= 0.06  # FALL_ALPHA; a flat 3 x the noise flagged about one in five
    fell = _records({**{s: 0.4 for s in range(0, 56, 5)}, 60: 0.34}, [1.0] * 60)
    assert collapse_signals(fell, [], noise=0.01, prefix="val-core/")


def test_collapse_signals_see_a_falling_score_and_a_collapsed_entropy_but_not_a_healthy_run():
    healthy = _records({0: 0.30, 10: 0.40, 20: 0.45, 30: 0.47}, [1.0] * 5 + [0.6] * 25)
    assert collapse_signals(healthy, [], noise=0.01, prefix="val-core/") == []
    falling = _records({0: 0.30, 10: 0.50, 20: 0.42, 30: 0.35}, [1.0] * 30)
    assert any("validation fell" in s for s in collapse_signals(falling, [], noise=0.01, prefix="val-core/"))
    # a drop within the noise is not a signal
    noisy = _records({0: 0.30, 10: 0.46, 20: 0.45, 30: 0.44}, [1.0] * 30)
    assert collapse_signals(noisy, [], noise=0.01, prefix="val-core/") == []
    flat_entropy = _records({0: 0.30, 10: 0.40, 20: 0.45, 30: 0.46}, [1.0, 1.0] + [0.05] * 28)
    assert any("entropy" in s for s in collapse_signals(flat_entropy, [], noise=0.01, prefix="val-core/"))
    assert collapse_signals(healthy, ["grad_norm_explosion", "reward_stagnation"], 0.01) == ["health: grad_norm_explosion"]


def test_a_collapsing_config_never_beats_a_healthy_one_with_a_close_score():
    base = Contender("base", [0.40], [], is_baseline=True)
    lucky = Contender("lucky", [0.425], ["validation fell 0.05 from its best 0.47"])
    healthy = Contender("ok", [0.42], [])
    winner, close = pick_learning_winner([base, lucky, healthy], noise=0.01)
    assert winner is healthy and lucky in close
    # ... but a collapse signal does not hide a config that is far ahead
    far = Contender("far", [0.60], ["health: entropy_collapse"])
    assert pick_learning_winner([base, far, healthy], noise=0.01)[0] is far
    # a config whose re-evaluation did not finish (collapse, oom) loses to any config that finished its runs
    broke = Contender("broke", [0.60], ["run broke-s2 ended oom"])
    assert pick_learning_winner([base, broke, healthy], noise=0.01, guard_baseline=True)[0] is not broke
    # a clear winner needs no re-evaluation; a close one does, and more seeds narrow "close"
    assert pick_learning_winner([base, Contender("c", [0.50], [])], noise=0.01)[1] == []
    two = Contender("c", [0.415, 0.415], [])
    assert pick_learning_winner([base, two], noise=0.01)[1] == [base]
    assert math.isclose(two.spread, 0.0) and Contender("x", [0.1], []).spread is None
    # the final call keeps the defaults unless a change beats them by more than the noise of the difference
    assert pick_learning_winner([base, two], noise=0.01, guard_baseline=True)[0] is base
    clear = Contender("c", [0.45, 0.44], [])
    assert pick_learning_winner([base, clear], noise=0.01, guard_baseline=True)[0] is clear


def test_sim_session_re_evaluates_close_configs_once_and_reports_the_mean_and_spread(tmp_path: Path):
    summary = tune(sim_stage2_options(tmp_path, seed=0))
    learn = summary["learning"]
    ledger = Ledger.open(Path(summary.get("run_dir") or tmp_path / summary["run_id"]))
    try:
        rows = ledger.trials("learning")
    finally:
        ledger.close()
    confirms = [r for r in rows if r["kind"] == "confirm"]
    assert 1 <= len(confirms) <= 3
    assert len({r["confirms"] for r in confirms}) == len(confirms), "each config re-evaluated once"
    assert all(r["seed"] == 1 and r["trial_id"] == f"{r['confirms']}-s2" for r in confirms)
    assert sorted(learn["reevaluated"]) == sorted(r["confirms"] for r in confirms)
    by_id = {r["trial_id"]: r for r in rows}
    winner = next(c for c in learn["contenders"] if math.isclose(c["mean"], learn["best_score"], abs_tol=1e-6))
    runs = [by_id[winner["trial_id"]]["score"]] + [r["score"] for r in confirms if r["confirms"] == winner["trial_id"]]
    assert learn["best_score_runs"] == len(runs)
    assert math.isclose(learn["best_score"], sum(runs) / len(runs), abs_tol=1e-6)
    assert (learn["best_score_spread"] is None) == (len(runs) == 1)
    assert learn["score_noise"] > 0
