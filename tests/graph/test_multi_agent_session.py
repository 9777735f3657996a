"""Multi-agent jobs end to end on the two-agent toy (``tests/support/multi_agent_toy.py``, poll clock):
one agent's learning rate far too high is stopped with a message naming that agent, the next proposal moves
that agent's knobs, and the summary and ``mart knobs`` group per-agent knobs by agent."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from mart.graph.cli import app
from mart.graph.cli.output import print_summary
from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from tests.graph.test_early_stop import EditsByStage
from tests.support.multi_agent_toy import ent, lr

MULTI = "tests.support.multi_agent_toy:make_backend"
HORIZON = 8


def test_one_agents_lr_far_too_high_is_stopped_naming_that_agent(tmp_path):
    reviewer = EditsByStage(learning=[{lr(1): 0.05}])  # agent 1's lr 50x its default
    opts = TuneOptions(backend=MULTI, approve="auto", runs_dir=str(tmp_path), quiet=True, watch_interval_s=1e-6,
                       system_trials=1, learning_trials=3, system_horizon=5, learning_horizon=HORIZON,
                       learning_confirm_trials=0, backend_options={"stream": True})
    summary = tune(opts, reviewer=reviewer)
    assert summary["status"] == "completed"
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    base, sick, follow_up = [t for t in ledger.trials("learning")]
    # the edit goes over the proposer's candidate: agent 0 keeps a sane lr (the toy collapses above 0.02)
    assert sick["config"][lr(1)] == 0.05 and sick["config"][lr(0)] <= 0.02
    assert sick["status"] == "stopped" and sick["early_stopped"] and sick["steps_done"] < HORIZON
    assert sick["reason"].startswith("health: entropy_collapse: agent 1: entropy")
    assert "agent 0 is healthy" in sick["reason"]
    stops = [e for e in ledger.health_events(sick["trial_id"]) if e.severity == "stop"]
    assert stops and {e.agent for e in stops} == {1}
    # the healthy baseline and the healthy agent raised nothing
    assert not ledger.health_events(base["trial_id"])
    # the rules proposer answers the finding with agent 1's own knobs
    moved = {k for k, v in follow_up["config"].items() if v != base["config"].get(k)}
    assert moved and moved <= {lr(1), ent(1)}, moved
    assert follow_up["status"] == "completed" and not follow_up["early_stopped"]


def test_summary_and_knobs_group_per_agent_knobs_by_agent(capsys):
    best = {lr(1): 5e-4, lr(0): 2e-3, "reward.shaping_alpha": 0.5}
    print_summary({"run_id": "r", "status": "completed", "notes": [],
                    "system": {"baseline_throughput": 1.0, "best_throughput": 2.0, "throughput_gain_pct": 100.0,
                               "best_config": {}, "memory_limit_gb": 1.0, "best_peak_memory_gb": 0.5},
                    "learning": {"baseline_score": 0.4, "best_score": 0.5, "score_gain": 0.1, "best_config": best},
                    "trials": {"total": 3, "early_stopped": 1, "failed": 0}})
    out = capsys.readouterr().out
    assert "agent 0: lr=0.002" in out and "agent 1: lr=0.0005" in out and "shaping_alpha=0.5" in out

    res = CliRunner().invoke(app, ["knobs", "--backend", MULTI, "--stage", "learning", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["agent"] for r in rows] == [None, None, 0, 0, 1, 1]  # shared first, then agent by agent
    assert {r["key"] for r in rows if r["agent"] == 1} == {lr(1), ent(1)}
    table = CliRunner().invoke(app, ["knobs", "--backend", MULTI, "--stage", "learning"])
    assert table.exit_code == 0 and "agent" in table.output and "shared" in table.output
    # a backend's own multi-agent job, picked with --backend-option: the simulator's MARTI debate
    sim = CliRunner().invoke(app, ["knobs", "--backend", "sim", "--backend-option", "scenario=qwen2.5-3b-debate-2x2",
                                   "--json"])
    assert sim.exit_code == 0, sim.output
    agents = [r["agent"] for r in json.loads(sim.output)]
    assert agents == sorted(agents, key=lambda a: -1 if a is None else a) and {0, 1} <= set(agents)


def test_build_summary_splits_the_best_config_by_agent():
    from mart.nodes.stages.system import config_by_agent

    assert config_by_agent({"a.b": 1}) is None
    assert config_by_agent({lr(1): 5e-4, "reward.shaping_alpha": 0.5}) == {
        "shared": {"reward.shaping_alpha": 0.5}, "per_agent": {"1": {"actor.optim.lr": 5e-4}}}


SIM_LR1 = "agents.1.actor_rollout_ref.actor.optim.lr"


def test_sim_debate_one_agents_lr_far_too_high_is_stopped_naming_that_agent(tmp_path):
    # the simulator's MARTI-style debate (2 x Qwen2.5-3B, 2 rounds): agent 1's lr 30x the script's 1e-6
    reviewer = EditsByStage(learning=[{SIM_LR1: 3e-5}])
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen2.5-3b-debate-2x2", "seed": 0,
                                                       "clock": "poll", "steps_per_poll": 1},
                       approve="auto", runs_dir=str(tmp_path), quiet=True, report=False, watch_interval_s=1e-6,
                       system_trials=1, learning_trials=2, system_horizon=6, learning_horizon=20,
                       learning_confirm_trials=0)
    summary = tune(opts, reviewer=reviewer)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    base, sick = ledger.trials("learning")
    assert sick["config"][SIM_LR1] == 3e-5
    assert sick["status"] == "stopped" and sick["early_stopped"] and sick["steps_done"] < 20
    assert sick["reason"].startswith("health: ") and ": agent 1: " in sick["reason"]
    assert "agent 0 is healthy" in sick["reason"]
    assert {e.agent for e in ledger.health_events(sick["trial_id"]) if e.severity == "stop"} == {1}
    assert base["status"] == "completed" and not base["early_stopped"]
