"""bench/schedules.py: a tiny schedule comparison end to end (grid and random schedules), its verdict, and the
noise-free score of each pick recomputed from the reported schedule."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.paths import REPO as ROOT

SCENARIO = "qwen3-0.6b-1x8"


@pytest.fixture(scope="module")
def verdict(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    try:
        from bench import compare

        out = tmp_path_factory.mktemp("sched")
        v = compare.main(["--schedule", "--scenarios", SCENARIO, "--seeds", "2", "--methods", "grid,random",
                          "--steps", "10", "--segments", "2", "--budget", "5", "--out", str(out)])
        raw = json.loads(next(out.glob("schedules-*/raw.json")).read_text())
    finally:
        sys.path.remove(str(ROOT))
    return v, raw


def test_the_verdict_has_a_schedule_block_per_method(verdict) -> None:
    v, _ = verdict
    sched = v["schedule"]
    assert sched["total_steps"] == 10 and sched["segments"] == 2 and sched["grid_full_trials"] == 12
    rep = sched["scenarios"][SCENARIO]
    assert rep["static_optimum"] >= rep["default"]
    grid, rnd = rep["methods"]["grid"], rep["methods"]["random"]
    assert grid["gain_vs_grid_pct"]["median"] == 0 and grid["segment_trials"]["median"] == 12
    assert rnd["segment_trials"]["max"] == 5  # the shared first segment + 4 branches: the budget, no more
    assert rnd["noise_free"] is not None and rnd["gain_vs_grid_pct"]["n"] == 2
    assert sched["target_met"] is None  # no mart in this run


def test_each_pick_is_scored_noise_free_from_the_schedule_it_reports(verdict) -> None:
    from mart.trial_runner.sim import base_config, load_scenario
    from mart.trial_runner.sim.learning import schedule_score_noise_free

    _, raw = verdict
    sc = load_scenario(SCENARIO)
    base = base_config(sc)
    for run in raw["runs"]:
        assert not run["error"], run["error"]
        segs = [(s["from_step"], s["to_step"], {**base, **s["overrides"]}) for s in run["segments"]]
        assert [s[:2] for s in segs] == ([(0, 10)] if run["method"] == "grid" else [(0, 5), (5, 10)])
        if run["method"] == "random":
            assert segs[0][2] == base  # the same start as every method: verl's defaults
        assert run["noise_free"] == pytest.approx(schedule_score_noise_free(segs, sc, 10), abs=1e-12)
        assert run["gpu_hours"] > 0 and run["schedule_gpu_hours"] > 0


def test_start_grid_starts_the_schedules_from_the_grids_pick(tmp_path) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench import schedules

        schedules.main(["--scenarios", SCENARIO, "--seeds", "1", "--methods", "grid,random", "--steps", "6",
                        "--segments", "2", "--budget", "3", "--start", "grid", "--out", str(tmp_path)])
    finally:
        sys.path.remove(str(ROOT))
    raw = json.loads(next(tmp_path.glob("schedules-*/raw.json")).read_text())
    grid = next(r for r in raw["runs"] if r["method"] == "grid")
    rnd = next(r for r in raw["runs"] if r["method"] == "random")
    assert grid["segments"][0]["overrides"] and rnd["extra"]["start"] == grid["segments"][0]["overrides"]
    if rnd["segments"]:  # a random schedule reached the horizon (its random segments may all OOM)
        assert rnd["segments"][0]["overrides"] == grid["segments"][0]["overrides"]
    assert "grid's pick" in raw["report"]["start"]


def test_the_oracle_schedule_is_at_least_the_static_optimum() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench.schedules import ScheduleBudget, references
    finally:
        sys.path.remove(str(ROOT))
    refs = references(SCENARIO, None, None, ScheduleBudget(total_steps=8, segments=2), oracle=True)
    assert refs["oracle_schedule"] >= refs["static_optimum"] - 1e-9
    assert refs["oracle_schedule_from_defaults"] >= refs["default"] - 1e-9
    assert refs["oracle_schedule_from_defaults_segments"][0]["overrides"] == {}


def test_mart_from_the_grids_pick_is_scored_with_that_start(tmp_path) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench import schedules

        if schedules.mart_schedule_available():
            pytest.skip("stage 3 is not in this build")
        schedules.main(["--scenarios", SCENARIO, "--seeds", "1", "--methods", "grid,mart", "--steps", "6",
                        "--segments", "2", "--branches", "2", "--start", "grid", "--out", str(tmp_path)])
    finally:
        sys.path.remove(str(ROOT))
    raw = json.loads(next(tmp_path.glob("schedules-*/raw.json")).read_text())
    grid = next(r for r in raw["runs"] if r["method"] == "grid")
    mart = next(r for r in raw["runs"] if r["method"] == "mart")
    assert not mart["error"], mart["error"]
    pick = grid["segments"][0]["overrides"]
    assert pick and mart["segments"] and all(mart["segments"][0]["overrides"].get(k) == v for k, v in pick.items())
    assert 0 < mart["segment_trials"] <= 4 and mart["noise_free"] is not None
