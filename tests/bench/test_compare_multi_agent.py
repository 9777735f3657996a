"""bench/compare.py on the simulator's multi-agent scenario: selectable by name, the baselines draw per-agent
and workflow knobs through the shared repair, and the stage-2 noise-free score is the team's (issue 14)."""

from __future__ import annotations

import importlib.util
import random
import sys
from dataclasses import asdict

import pytest

from tests.support.paths import REPO

DEBATE = "qwen2.5-3b-debate-2x2"


@pytest.fixture(scope="module")
def compare():
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("bench_compare_ma", REPO / "bench" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(REPO))


def test_the_scenario_is_selectable_by_name(compare) -> None:
    _, scenarios, seeds, methods = compare.build_plan(compare.parse_args(
        ["--scenario", DEBATE, "--methods", "mart,random", "--seeds", "2"]))
    assert scenarios == [DEBATE] and seeds == [0, 1] and methods == ["mart", "random"]


def test_restricted_space_and_repaired_draws_cover_every_agent(compare) -> None:
    from bench.baselines.space import REDRAWS, focused, random_overrides, repair, valid
    from mart.trial_runner.sim import base_config, load_scenario
    from mart.trial_runner.sim import model as M
    from mart.trial_runner.sim import multi_agent as MA

    sc = load_scenario(DEBATE)
    full, base = M.search_space(sc), base_config(sc)
    space = focused(full)
    keys = {p.key for p in space.params}
    assert {MA.agent_key(i, "actor_rollout_ref.actor.optim.lr") for i in range(2)} <= keys
    assert {MA.ASYNC_KEY, MA.ROUNDS_KEY, MA.SHAPING_MODE_KEY, MA.SHAPING_ALPHA_KEY} <= keys
    for p in space.params:  # the job's baseline stays expressible in the focused space
        if p.low is not None and isinstance(base.get(p.key), (int, float)) and not isinstance(base.get(p.key), bool):
            assert p.low <= base[p.key] <= p.high, p.key
    rng = random.Random(0)
    for stage in ("system", "learning"):
        ok = sum(valid(full, base, repair(full, base, random_overrides(space, stage, base, rng))) for _ in range(REDRAWS))
        assert ok > REDRAWS // 10, stage


def test_a_baseline_runs_on_it_and_is_scored_on_the_team(compare, tmp_path) -> None:
    budget = compare.Budget(system_trials=2, learning_trials=2, system_horizon=4, learning_horizon=5)
    run = compare.run_task({"workload": "sim", "scenario": DEBATE, "seed": 0, "method": "tpe-restricted",
                            "budget": asdict(budget), "tmp": str(tmp_path)})
    assert run["error"] is None and len(run["trials"]) == 4
    nf = run["noise_free"]
    assert nf["throughput"] > 0 and 0 < nf["default_score"] < 1 and nf["score"] is not None
