"""The local workload's multi-agent mode (issue 14): workflows, MARTI's shaping, per-agent knobs, team
checkpoints, per-agent and team metrics, and the backend's catalogue and options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mart.state.search_space import ConfigError
from mart.trial_runner.local import task as T
from mart.trial_runner.local import workflow as W
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.base_model import load_base_model
from mart.trial_runner.local.grpo import Timer
from mart.trial_runner.local.multi_agent import TeamTrainer, load_team_checkpoint, save_team_checkpoint
from mart.trial_runner.local.team_config import load_team_config, team_config_errors
from tests.conftest import LOCAL_TINY_CONFIG

CPU = torch.device("cpu")
TEAM_TINY = {**LOCAL_TINY_CONFIG, "local.model.block_size": 40, "trainer.test_freq": 3}
VAL = "val-core/digit_sort/reward/mean@1"
PER_AGENT_METRICS = ("actor/entropy", "actor/pg_loss", "actor/ppo_kl", "actor/grad_norm", "actor/lr",
                     "critic/score/mean", "response_length/mean", "copy_rate", "reward_share")
TEAM_METRICS = ("critic/score/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/throughput",
                "perf/max_memory_allocated_gb", "workflow/answer_change_rate", "workflow/agreement")


# --- pure functions ------------------------------------------------------------------------------------------
def test_shaping_matches_martis_formulas_by_hand():
    r, q, alpha = 0.75, 0.2, 0.5
    # margin: Delta = R - Q = 0.55 -> 0.75 + 0.5 * 0.55
    assert W.shaped_reward(r, q, "margin", alpha) == pytest.approx(1.025)
    # quality: Delta = Q*R - (1-Q)*(1-R) = 0.15 - 0.8 * 0.25 = -0.05 -> 0.75 - 0.025
    assert W.shaped_reward(r, q, "quality", alpha) == pytest.approx(0.725)
    assert W.shaped_reward(r, q, "none", alpha) == r
    assert W.shaped_reward(r, None, "margin", alpha) == r, "the first turn has no history: unshaped"
    assert W.shaped_reward(0.0, 1.0, "margin", 0.0) == 0.0, "alpha 0 is the verifier reward"
    with pytest.raises(ValueError):
        W.shaping_delta(r, q, "bogus")


def test_history_q_averages_the_turns_in_scope():
    turns = [[1.0, 0.0], [0.25, 0.25], [0.5, 0.5]]
    assert W.history_q(turns, 0, 1) is None
    assert W.history_q(turns, 2, 1) == pytest.approx(0.25)
    assert W.history_q(turns, 2, 2) == pytest.approx((1.0 + 0.0 + 0.25 + 0.25) / 4)
    assert W.history_q(turns, 1, 3) == pytest.approx(0.5)


def test_majority_vote_and_ties_go_to_the_last_agent():
    a, b, c = [1, 2, T.EOS], [1, 3, T.EOS], [2, 2, T.EOS]
    assert W.majority([a, b, a]) == 2
    assert W.majority([a, a, b]) == 1
    assert W.majority([a, b]) == 1, "two agents disagree: the last agent's answer"
    assert W.majority([a, b, c]) == 2


def test_peer_prompt_appends_the_others_answers_as_tokens():
    p = W.peer_prompt([3, 1, 2], [[1, 2, 3, T.EOS], [1, 1, 1, 1, 1, 1]], cap=4)
    assert p == [T.BOS, 3, 1, 2, T.SEP, 1, 2, 3, T.SEP, 1, 1, 1, 1, T.SEP]
    assert W.reward_shares([3.0, 1.0]) == [0.75, 0.25] and W.reward_shares([0.0, 0.0]) == [0.0, 0.0]


# --- config and catalogue ------------------------------------------------------------------------------------
def test_team_config_checks_keys_agents_and_lengths():
    team = load_team_config({**TEAM_TINY, "workflow.name": "debate", "workflow.num_agents": 3,
                             "agents.2.actor.optim.lr": 1e-3, "agents.0.rollout.temperature": 0.7})
    assert [a.lr for a in team.agents] == [3e-4, 3e-4, 1e-3]
    assert [a.temperature for a in team.agents] == [0.7, 1.0, 1.0]
    assert len({a.seed for a in team.agents}) == 3, "per-agent seeds"
    _, errors = team_config_errors({**TEAM_TINY, "workflow.name": "debate", "agents.2.actor.optim.lr": 1e-3,
                                    "agents.0.actor.optim.lrr": 1e-3, "reward.shaping_mode": "bogus"})
    text = " ".join(errors)
    assert "names agent 2" in text and "agents.0.actor.optim.lr" in text and "reward.shaping_mode" in text
    _, errors = team_config_errors({**LOCAL_TINY_CONFIG, "workflow.name": "debate", "workflow.num_agents": 3})
    assert any("team_lengths_fit" in e for e in errors), errors  # block_size 24 cannot hold the peers' answers


def test_backend_catalogue_has_per_agent_knobs_and_shared_system_knobs():
    b = LocalBackend(workflow="debate", agents=3)
    space = b.search_space()
    assert space.resolve_key("agent2.lr") == "agents.2.actor.optim.lr"
    assert space.resolve_key("agent1.temperature") == "agents.1.rollout.temperature"
    for i in range(3):
        for rel in ("actor.optim.lr", "actor.kl_loss_coef", "actor.entropy_coeff", "rollout.temperature"):
            assert space[f"agents.{i}.{rel}"].stage == "learning"
    for key in ("workflow.num_rounds", "reward.shaping_mode", "reward.shaping_alpha", "reward.history_scope"):
        assert space[key].stage == "learning"
    assert "actor_rollout_ref.actor.optim.lr" not in space, "the shared lr is replaced by the agents' own"
    assert space["actor_rollout_ref.rollout.max_num_seqs"].stage == "system"
    assert space.check_constraints(b.base_config()) == [] and b.validate_config(b.base_config()) == []
    assert "workflow.num_rounds" not in LocalBackend(workflow="chain").search_space()
    assert b.memory_capacity_gb() > LocalBackend().memory_capacity_gb(), "three agents hold three models"
    assert LocalBackend().team is None and "agents.0.actor.optim.lr" not in LocalBackend().search_space()
    with pytest.raises(ValueError, match="workflow"):
        LocalBackend(workflow="vote")
    with pytest.raises(ValueError, match="agents"):
        LocalBackend(workflow="debate", agents=5)


# --- training, in-process ------------------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trial processes run (tiny matrices: more threads only contend)
    yield
    torch.set_num_threads(threads)


def _trainer(local_cache, steps: int = 4, **team) -> TeamTrainer:
    cfg = load_team_config({**TEAM_TINY, "workflow.name": "debate", **team})
    return TeamTrainer(cfg, load_base_model(cfg.base, CPU, log=lambda s: None), CPU, steps)


def test_per_agent_lr_reaches_its_agent_only(local_cache, one_thread):
    trainer = _trainer(local_cache, **{"agents.1.actor.optim.lr": 1e-9, "agents.0.actor.optim.lr": 1e-3})
    before = [{k: v.clone() for k, v in a.actor.state_dict().items()} for a in trainer.agents]
    m = trainer.step(Timer(CPU))
    moved = [max(float((a.actor.state_dict()[k] - b[k]).abs().max()) for k in b) for a, b in zip(trainer.agents, before)]
    assert moved[0] > 1e-4, "agent 0 trains"
    assert moved[1] < 1e-6, "agent 1's lr (1e-9) leaves its weights as they were"
    assert m["agent0/actor/lr"] == pytest.approx(1e-3) and m["agent1/actor/lr"] == pytest.approx(1e-9)


def test_team_checkpoint_restores_every_agent_and_replays(local_cache, tmp_path, one_thread):
    flat = {"workflow.name": "debate", "workflow.num_agents": 2}
    a = _trainer(local_cache, **{"agents.1.actor.optim.lr": 1e-3})
    a.step(Timer(CPU))
    save_team_checkpoint(a, 1, tmp_path, flat)
    b = _trainer(local_cache, **{"agents.1.actor.optim.lr": 1e-3})
    assert load_team_checkpoint(b, tmp_path, flat) == 1
    for x, y in zip(a.agents, b.agents):
        for k, v in x.actor.state_dict().items():
            assert torch.equal(v, y.actor.state_dict()[k])
        assert x.opt_step == y.opt_step > 0
    ma, mb = a.step(Timer(CPU)), b.step(Timer(CPU))
    for key in ("critic/score/mean", "agent0/actor/pg_loss", "agent1/actor/grad_norm", "workflow/agreement"):
        assert ma[key] == pytest.approx(mb[key], abs=1e-9), key
    with pytest.raises(ConfigError, match="num_agents"):
        load_team_checkpoint(_trainer(local_cache, **{"workflow.num_agents": 3}), tmp_path,
                             {**flat, "workflow.num_agents": 3})


# --- trials, as processes ------------------------------------------------------------------------------------
def _run_worker(tmp_path: Path, config: dict, steps: int, *extra: str) -> dict[int, dict]:
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "mart.trial_runner.local", "--out", str(tmp_path), "--steps", str(steps),
                           "--config", str(tmp_path / "config.json"), *extra], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r["step"]: r["data"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.parametrize(("workflow", "agents"), [("debate", 2), ("chain", 3)])
def test_trial_emits_per_agent_and_team_metrics(local_cache, tmp_path, workflow, agents):
    config = {**TEAM_TINY, "workflow.name": workflow, "workflow.num_agents": agents,
              "reward.shaping_mode": "margin"}
    recs = _run_worker(tmp_path, config, 3, "--save-steps", "2")
    assert sorted(recs) == [0, 1, 2, 3] and VAL in recs[0] and VAL in recs[3]
    for step in (1, 2, 3):
        m = recs[step]
        for i in range(agents):
            for name in PER_AGENT_METRICS:
                assert f"agent{i}/{name}" in m, (step, f"agent{i}/{name}")
        for name in TEAM_METRICS:
            assert name in m, name
        assert 0.0 <= m["workflow/agreement"] <= 1.0
        assert sum(m[f"agent{i}/reward_share"] for i in range(agents)) == pytest.approx(1.0)
    assert f"val-aux/digit_sort/agent{agents - 1}/reward/mean@1" in recs[3]
    saved = torch.load(tmp_path / "checkpoints" / "global_step_2" / "checkpoint.pt", weights_only=True)
    assert saved["team"] and len(saved["agents"]) == agents
    # a branch from the saved step starts from every agent's saved state
    branch = tmp_path / "branch"
    branch.mkdir()
    recs_b = _run_worker(branch, config, 3, "--init-from", str(tmp_path / "checkpoints" / "global_step_2"))
    assert sorted(recs_b) == [2, 3]
    assert recs_b[3]["critic/score/mean"] == pytest.approx(recs[3]["critic/score/mean"], abs=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mart_tune_runs_a_debate_job_with_per_agent_knobs(local_cache, tmp_path):
    base = tmp_path / "tiny.json"
    base.write_text(json.dumps({**TEAM_TINY, "trainer.test_freq": 5}))
    proc = subprocess.run(
        [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", "local", "--backend-option", "workflow=debate",
         "--approve", "auto", "--base-config", str(base), "--stages", "learning", "--learning-trials", "2",
         "--learning-horizon", "6", "--learning-confirm-trials", "0",
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "learning (val score)" in out and "completed" in out
    assert any(f"agent{i}." in out for i in range(2)), "stage 2 proposes per-agent knobs by their short names"
    run = next((tmp_path / "runs").iterdir())
    configs = [json.loads(p.read_text()) for p in run.glob("trials/*/config.json")]
    assert configs and all(c["workflow.name"] == "debate" and "agents.1.actor.optim.lr" in c for c in configs)


def test_format_aware_base_model_is_its_own_cached_model(local_cache):
    from mart.trial_runner.local.base_model import base_key, warmup
    from mart.trial_runner.local.config import load_config

    plain = load_config({**TEAM_TINY, "local.base_model.warmup_steps": 3})
    aware = load_config({**TEAM_TINY, "local.base_model.warmup_steps": 3, "local.base_model.peer_prob": 0.5})
    assert base_key(plain) != base_key(aware), "a format-aware base model never replaces the single-agent one"
    a, b = warmup(plain, CPU, log=lambda s: None), warmup(aware, CPU, log=lambda s: None)
    assert any(not torch.equal(a[k], b[k]) for k in a), "it trains on other prompts"
    with pytest.raises(ConfigError, match="peer_prob"):
        load_config({**LOCAL_TINY_CONFIG, "local.base_model.peer_prob": 0.5})  # block_size 24 cannot hold them
