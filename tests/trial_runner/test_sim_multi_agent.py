"""The simulator's multi-agent (MARTI-style) scenarios: per-agent knobs and streams, rounds, async rollout,
shaping, one agent's collapse, and a `mart tune` session on one (issue 14, item 5)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mart.trial_runner.registry import load_backend
from mart.trial_runner.sim import base_config, ground_truth_learning, load_scenario, simulate
from mart.trial_runner.sim import model as M
from mart.trial_runner.sim import multi_agent as MA
from mart.trial_runner.sim.scenarios import SCENARIOS, ScenarioError, parse_scenario

DEBATE = "qwen2.5-3b-debate-2x2"
LR = "actor_rollout_ref.actor.optim.lr"


def test_the_debate_scenario_loads_with_per_agent_knobs() -> None:
    sc = load_scenario(DEBATE)
    assert isinstance(sc, MA.MultiAgentScenario) and DEBATE not in SCENARIOS  # the four MART scenarios stay four
    assert (sc.num_agents, sc.workflow, sc.num_rounds, sc.placement, sc.total_gpus) == (2, "debate", 2, "own", 16)
    space = M.search_space(sc)
    assert {MA.agent_key(0, LR), MA.agent_key(1, LR), MA.ROUNDS_KEY, MA.SHAPING_MODE_KEY, MA.SHAPING_ALPHA_KEY,
            MA.HISTORY_SCOPE_KEY, MA.ASYNC_KEY} <= {p.key for p in space.params}
    assert LR not in space  # a per-agent knob exists only per agent
    cfg = base_config(sc)
    assert not space.check_constraints(cfg)
    assert cfg[MA.agent_key(1, "actor_rollout_ref.actor.use_kl_loss")] is True  # the job's own values, per agent
    assert load_backend("sim", scenario=DEBATE).search_space().backend == "verl-multi-agent"
    # verl's rules hold per agent and name it; the async rule refuses tasks that leave engines idle
    bad = {**cfg, MA.agent_key(1, "actor_rollout_ref.rollout.temperature"): 0.0}
    errs = space.check_constraints({**cfg, "actor_rollout_ref.actor.ppo_mini_batch_size": 4096}) + \
        space.check_constraints({**cfg, MA.ASYNC_KEY: 0}) + space.check_constraints(bad)
    assert any("mini" in e for e in errs)
    assert space.check_constraints({**cfg, MA.ASYNC_KEY: 0}) == []


def test_a_chain_needs_one_pass_and_a_shared_placement_loads() -> None:
    text = Path(M.__file__).with_name("scenarios").joinpath("multi-agent", DEBATE + ".yaml").read_text()
    with pytest.raises(ScenarioError, match="num_rounds must be 1"):
        parse_scenario(text.replace("workflow: debate", "workflow: chain"))
    shared = parse_scenario(text.replace("placement: own", "placement: shared").replace(DEBATE, "shared"))
    own = load_scenario(DEBATE)
    cfg = base_config(own)
    t_own, t_shared = (M.expected_throughput(cfg, sc) for sc in (own, shared))
    # sharing halves the GPUs and serialises the agents: per GPU the same work, plus moving the sleeping
    # agent's state out and back (a few percent) and its CUDA context in memory
    assert 0.9 * t_own[0] < t_shared[0] < t_own[0] and t_shared[1] > t_own[1]
    assert shared.total_gpus == 8


def test_per_agent_team_workflow_and_system_metrics_are_in_the_stream() -> None:
    sc = load_scenario(DEBATE)
    res = simulate(base_config(sc), sc, steps=5, seed=1)
    assert res.status == "completed" and res.n_gpus == 16
    step = res.events[-1].data
    for i in range(2):
        for key in ("actor/entropy", "actor/ppo_kl", "actor/grad_norm", "critic/score/mean", "response_length/mean",
                    "copy_rate", "reward_share"):
            assert f"agent{i}/{key}" in step, key
    for key in ("critic/score/mean", M.VAL_KEY, "workflow/answer_change_rate", "workflow/agreement", "timing_s/gen",
                "timing_s/update_actor", "timing_s/step", "perf/throughput", "perf/max_memory_allocated_gb"):
        assert key in step, key
    assert "actor/entropy" not in step  # no unnamed policy: every learning signal belongs to an agent
    assert step["agent0/reward_share"] == pytest.approx(0.5)  # no shaping: every agent gets the team reward
    # round 2's prompt shows both round-1 answers: the prompts grow with the rounds
    plan = MA.step_plan(sc, base_config(sc), [650.0, 650.0])
    assert plan.prompt_means[1] > plan.prompt_means[0] + 2 * 600
    three = MA.step_plan(sc, {**base_config(sc), MA.ROUNDS_KEY: 3}, [650.0, 650.0])
    assert three.stages == 3 and three.prompt_means[2] > three.prompt_means[1] and three.tokens > plan.tokens


def test_async_rollout_follows_marti_figures_and_starves_with_few_tasks() -> None:
    sc = load_scenario(DEBATE)
    chain = load_scenario("qwen2.5-3b-chain-3")
    # the documented curve at 512 tasks reproduces MARTI's two measurements
    assert float(MA.async_factor(chain, 512, 3)) == pytest.approx(498.4 / 612.6, rel=1e-9)
    assert float(MA.async_factor(sc, 512, 8)) == pytest.approx(2928 / 3308, rel=1e-9)
    assert float(MA.async_factor(sc, 0, 2)) == 1.0 and float(MA.async_factor(sc, 2048, 2)) < float(MA.async_factor(sc, 64, 2))
    cfg = base_config(sc)
    k = M.S.knobs_from_config(cfg)
    plan = MA.step_plan(sc, cfg, [650.0, 650.0])
    gen = {c: float(np.asarray(MA.system_step(sc, k, plan, c)["t_gen"])) for c in (0, 8, 512)}
    assert gen[512] / gen[0] == pytest.approx(float(MA.async_factor(sc, 512, 2)), rel=1e-6)  # engines fed: the curve
    assert gen[8] > gen[0]  # 8 tasks x 8 samples over 4 engines: vLLM starves


def test_shaping_off_lowers_the_expected_score_per_the_paper_ablation() -> None:
    sc = load_scenario(DEBATE)
    cfg = {**base_config(sc), **{MA.agent_key(i, LR): 5e-6 for i in range(2)}}
    untrained = sc.learning.score0 + sc.debate_gain0
    best = {MA.SHAPING_MODE_KEY: "margin", MA.SHAPING_ALPHA_KEY: 0.5, MA.HISTORY_SCOPE_KEY: "window"}
    on = M.expected_score({**cfg, **best}, sc, 30)
    off = M.expected_score({**cfg, MA.SHAPING_MODE_KEY: "none"}, sc, 30)
    assert MA.shaping_efficiency(sc, {**cfg, **best}) == pytest.approx(1.0)
    # without shaping the trained part of the gain shrinks to (36.6 - untrained) / (45.6 - untrained)
    assert (off - untrained) / (on - untrained) == pytest.approx((0.366 - untrained) / (0.456 - untrained), rel=1e-6)
    assert off < on
    # too much alpha is worse than the optimum, and a one-round "debate" has no workflow gain
    assert MA.shaping_efficiency(sc, {**cfg, **best, MA.SHAPING_ALPHA_KEY: 2.0}) < 1.0
    assert M.expected_score({**cfg, **best, MA.ROUNDS_KEY: 1}, sc, 30) < on


def test_one_agents_high_lr_collapses_only_that_agent() -> None:
    sc = load_scenario(DEBATE)
    cfg = {**base_config(sc), MA.agent_key(1, LR): 5e-5}
    res = simulate(cfg, sc, steps=20, seed=0)
    assert res.status == "completed"
    assert res.info["agents"][1]["collapse_kind"] == "explode" and res.info["agents"][0]["collapse_step"] is None
    steps = [e.data for e in res.events if "agent0/actor/entropy" in e.data]
    ent = {i: [d[f"agent{i}/actor/entropy"] for d in steps] for i in range(2)}
    gn = {i: [d[f"agent{i}/actor/grad_norm"] for d in steps] for i in range(2)}
    assert max(ent[1]) > 3 * ent[0][0] and max(gn[1]) > 10 * max(gn[0])
    assert max(ent[0]) <= 1.1 * ent[0][0] and max(gn[0]) < 1.0  # the other agent stays healthy
    healthy = simulate(base_config(sc), sc, steps=20, seed=0)
    assert res.events[-1].data[M.VAL_KEY] < healthy.events[-1].data[M.VAL_KEY]  # the team pays for it


def test_ground_truths_work_on_the_multi_agent_scenario() -> None:
    sc = load_scenario("qwen2.5-3b-chain-3")
    gtl = ground_truth_learning(sc, 10)
    assert gtl["score"] >= gtl["baseline_score"] and gtl["evaluated"] > 0
    chosen = {**base_config(sc), **gtl["overrides"]}
    assert M.expected_score(chosen, sc, 10) == pytest.approx(gtl["score"], rel=1e-9)
    assert not M.search_space(sc).check_constraints(chosen)


def test_checkpoint_branch_continues_every_agent(tmp_path: Path) -> None:
    sc = load_scenario(DEBATE)
    cfg = base_config(sc)
    whole = simulate(cfg, sc, steps=6, seed=2, save_steps=[3])
    state = json.loads(json.dumps(whole.checkpoints[3]))
    branch = simulate(cfg, sc, steps=6, seed=2, start=state)
    assert [e.step for e in branch.events][0] == 3 and branch.events[-1].step == 6
    assert math.isfinite(branch.events[-1].data["agent1/actor/entropy"])


def test_mart_tune_session_on_the_debate_completes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from mart.graph.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [
        "tune", "--backend", "sim", "--backend-option", f"scenario={DEBATE}", "--approve", "auto",
        "--system-trials", "2", "--learning-trials", "2", "--learning-horizon", "6", "--learning-confirm-trials", "0",
        "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.rindex("\n{"):])
    assert summary["status"] == "completed" and summary["trials"]["failed"] == 0
    assert summary["system"]["best_throughput"] > 0 and summary["learning"]["baseline_score"] is not None
