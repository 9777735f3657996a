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
    grid, rnd, eq = rep["methods"]["grid"], rep["methods"]["random"], rep["methods"]["grid-eq"]
    assert grid["gain_vs_grid_pct"]["median"] == 0 and grid["segment_trials"]["median"] == 12
    assert rnd["segment_trials"]["max"] == 5  # the shared first segment + 4 branches: the budget, no more
    assert rnd["noise_free"] is not None and rnd["gain_vs_grid_pct"]["n"] == 2
    # the grid at the schedules' budget: budget // segments = 2 full-length trials, the lr axis first; the target's
    # reference (its own gain over itself is 0, the full grid never loses to it by construction of the measure)
    assert sched["reference"] == "grid-eq" and sched["grid_eq_trials"] == 2 and eq["segment_trials"]["max"] == 2
    assert eq["gain_vs_grid_eq_pct"]["median"] == 0 and rnd["gain_vs_grid_eq_pct"]["n"] == 2
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
        assert [s[:2] for s in segs] == ([(0, 10)] if run["method"] in ("grid", "grid-eq") else [(0, 5), (5, 10)])
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


def test_grid_eq_runs_the_lr_axis_first() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench.schedules import GRID, grid_eq_points, grid_points
    finally:
        sys.path.remove(str(ROOT))
    lr = "actor_rollout_ref.actor.optim.lr"
    pts = grid_eq_points(3)
    assert [p[lr] for p in pts] == GRID[lr] and all(len({p[k] for p in pts}) == 1 for k in GRID if k != lr)
    assert len(grid_eq_points(100)) == len(grid_points()) and grid_eq_points(0) == pts[:1]


def test_a_population_point_maps_to_a_config_and_back() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from bench.schedules import PBT_BOUNDS, pbt_config, pbt_point
    finally:
        sys.path.remove(str(ROOT))
    from mart.trial_runner.sim import base_config

    start = base_config(SCENARIO)
    assert pbt_config(pbt_point(start, start), start) == {**start, "actor_rollout_ref.actor.use_kl_loss": False}
    top = pbt_config({k: hi for k, (lo, hi) in PBT_BOUNDS.items()}, start)
    assert top["data.max_response_length"] == 3 * start["data.max_response_length"]
    assert top["actor_rollout_ref.rollout.n"] == 2 * start["actor_rollout_ref.rollout.n"]
    assert top["actor_rollout_ref.actor.use_kl_loss"] and top["actor_rollout_ref.actor.optim.lr"] == 1e-5


@pytest.mark.slow
def test_pb2_spends_the_schedules_budget_from_checkpoints(tmp_path) -> None:
    """Ray Tune's PB2 over the same knobs, a population of budget // segments members, one segment per Tune
    iteration from the checkpoint it was handed: exactly the budget in segment-trials, a complete pick."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench import schedules

        schedules.main(["--scenarios", SCENARIO, "--seeds", "1", "--methods", "pb2", "--steps", "8",
                        "--segments", "2", "--budget", "4", "--out", str(tmp_path)])
    finally:
        sys.path.remove(str(ROOT))
    raw = json.loads(next(tmp_path.glob("schedules-*/raw.json")).read_text())
    pb2 = next(r for r in raw["runs"] if r["method"] == "pb2")
    assert not pb2["error"], pb2["error"]
    assert pb2["extra"]["population"] == 2 and pb2["segment_trials"] == 4
    assert [(s["from_step"], s["to_step"]) for s in pb2["segments"]] == [(0, 4), (4, 8)]
    assert pb2["noise_free"] is not None and pb2["gpu_hours"] > pb2["schedule_gpu_hours"] > 0


def test_the_oracle_counts_only_schedules_that_run() -> None:
    """Issue 44: the oracle priced no memory, so on the 0.6B its best schedule (lr up at step 15) ran out of
    memory in old_log_prob when played. A prefix that would not run is kept only with its micro batches
    halved (what mart's stage 3 may do, the score unchanged), else dropped."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.schedules import ScheduleBudget, _runs
    finally:
        sys.path.remove(str(ROOT))
    from mart.trial_runner.sim import load_scenario, model

    sc = load_scenario("qwen3-0.6b-1x8")
    base, bud = model.base_config(sc), ScheduleBudget()
    safe = [p for p in model.search_space(sc).params if p.memory_safe and p.kind == "int"]
    assert _runs([(0, 15, base)], sc, bud, safe) == [(0, 15, base)]  # the start runs as it is
    fast = {**base, "actor_rollout_ref.actor.optim.lr": 2e-6}
    assert model.schedule_oom([(0, 15, base), (15, 60, fast)], sc, 60) is not None
    kept = _runs([(0, 15, base), (15, 30, fast)], sc, bud, safe)
    assert kept is not None and kept[-1][:2] == (15, 30)
    micro = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    assert kept[-1][2][micro] < base[micro] and model.schedule_oom([*kept[:-1], (15, 60, kept[-1][2])], sc, 60) is None
    assert _runs([(0, 15, base), (15, 30, fast)], sc, bud, []) is None  # no memory-safe knob: dropped
