"""Health of multi-agent jobs on synthetic streams: every rule runs per agent and names the agent; the
multi-agent pathologies (copying, reward concentration, debate rounds that change nothing) are findings."""

from __future__ import annotations

import math

from mart.nodes.health_rules import HealthConfig, evaluate
from mart.state.agents import agent_stream, agents_in_records, group_by_agent, split_knob, split_metric
from mart.state.metrics import StepRecord

HEALTHY_AGENT = {"actor/entropy": lambda s: 1.0 - 0.01 * s, "actor/grad_norm": lambda s: 1.0,
                 "actor/ppo_kl": lambda s: 0.01, "actor/pg_loss": lambda s: 0.1,
                 "critic/score/mean": lambda s: 0.3 + 0.02 * s, "response_length/mean": lambda s: 50.0}


def team_stream(n, agents=3, sick=None, team=None, extra=None):
    """Records 1..n of an ``agents``-agent job: every agent healthy unless ``sick`` = {agent: {name: f}};
    ``team`` / ``extra`` add team-level / any keys (name -> step -> value)."""
    sick = sick or {}
    out = []
    for s in range(1, n + 1):
        data = {"critic/score/mean": 0.3 + 0.02 * s}
        for a in range(agents):
            series = {**HEALTHY_AGENT, **sick.get(a, {})}
            data.update({f"agent{a}/{k}": f(s) for k, f in series.items()})
        for k, f in {**(team or {}), **(extra or {})}.items():
            data[k] = f(s)
        out.append(StepRecord(step=s, data=data))
    return out


def by_agent(events, severity=None):
    return {(e.agent, e.rule) for e in events if severity is None or e.severity == severity}


def test_names_and_streams():
    assert split_metric("agent12/actor/entropy") == (12, "actor/entropy")
    assert split_metric("actor/entropy") == (None, "actor/entropy")
    assert split_metric("agentx/actor/entropy") == (None, "agentx/actor/entropy")
    assert split_knob("agents.1.actor.optim.lr") == (1, "actor.optim.lr")
    assert split_knob("reward.shaping_alpha") == (None, "reward.shaping_alpha")
    shared, per = group_by_agent({"agents.1.actor.optim.lr": 1e-3, "workflow.num_rounds": 2,
                                  "agents.0.actor.optim.lr": 2e-3, "agents.1.kl_loss_coef": 0.01})
    assert shared == {"workflow.num_rounds": 2}
    assert list(per) == [0, 1] and per[1] == {"actor.optim.lr": 1e-3, "kl_loss_coef": 0.01}
    recs = team_stream(3, agents=2)
    assert agents_in_records(recs) == [0, 1]
    one = agent_stream(recs, 1)
    assert [r.step for r in one] == [1, 2, 3]
    assert set(one[0].data) == set(HEALTHY_AGENT)  # prefix stripped, no team or other-agent keys


def test_healthy_team_raises_nothing():
    extra = {f"agent{a}/copy_rate": (lambda s: 0.3) for a in range(3)}
    extra |= {f"agent{a}/reward_share": (lambda s: 1 / 3) for a in range(3)}
    extra |= {"workflow/answer_change_rate": lambda s: 0.2, "workflow/agreement": lambda s: 0.7}
    assert evaluate("learning", "t", team_stream(20, extra=extra), HealthConfig()) == []


def test_one_agent_collapsing_is_named_and_stopped_when_persistent():
    cfg = HealthConfig(window=3)
    sick = {1: {"actor/entropy": lambda s: 1.0 if s <= 4 else 0.05}}
    early = evaluate("learning", "t", team_stream(5, sick=sick), cfg)
    assert by_agent(early) == {(1, "entropy_collapse")}
    assert by_agent(early, "stop") == set()  # one step of collapse: a warning
    late = evaluate("learning", "t", team_stream(7, sick=sick), cfg)
    assert by_agent(late, "stop") == {(1, "entropy_collapse")}
    ev = next(e for e in late if e.rule == "entropy_collapse")
    assert ev.message.startswith("agent 1: entropy")
    assert "agents 0, 2 are healthy" in ev.message
    assert ev.scoped_rule == "agent1/entropy_collapse"


def test_every_single_agent_rule_runs_per_agent():
    cfg = HealthConfig(window=2)
    cases = {
        "grad_norm_explosion": {"actor/grad_norm": lambda s: 1.0 if s < 4 else 50.0},
        "kl_blowup": {"actor/ppo_kl": lambda s: 0.01 if s < 5 else 3.0},
        "reward_collapse": {"critic/score/mean": lambda s: 0.6 if s < 6 else 0.05},
        "response_clipping": {"response_length/clip_ratio": lambda s: 0.05 * s},
    }
    for rule, series in cases.items():
        events = evaluate("learning", "t", team_stream(9, agents=2, sick={0: series}), cfg)
        assert by_agent(events, "stop") == {(0, rule)}, rule


def test_nan_in_one_agent_stops_at_once_and_names_it():
    recs = team_stream(3, agents=2)
    recs[-1].data["agent1/actor/pg_loss"] = math.nan
    events = evaluate("learning", "t", recs, HealthConfig())
    assert by_agent(events, "stop") == {(1, "nan")}
    assert events[0].message.startswith("agent 1: non-finite actor/pg_loss")
    # stage 1 reads per-agent NaNs and memory too
    sys_recs = team_stream(3, agents=2, extra={"agent0/perf/max_memory_allocated_gb": lambda s: 9.0})
    sys_events = evaluate("system", "t", sys_recs, HealthConfig(memory_limit_gb=8.0))
    assert by_agent(sys_events, "stop") == {(0, "memory_margin")}


def test_the_same_anomaly_in_every_agent_names_no_healthy_agent():
    sick = {a: {"actor/ppo_kl": lambda s: 3.0 if s > 2 else 0.01} for a in range(2)}
    events = evaluate("learning", "t", team_stream(6, agents=2, sick=sick), HealthConfig(window=2))
    assert by_agent(events, "stop") == {(0, "kl_blowup"), (1, "kl_blowup")}
    assert all("healthy" not in e.message for e in events)


def test_copying_is_a_finding_and_stops_only_when_persistent_and_harmful():
    cfg = HealthConfig(window=3, pathology_stop_steps=8)
    copy = {"agent1/copy_rate": lambda s: min(0.99, 0.5 + 0.05 * s), "agent0/copy_rate": lambda s: 0.2}
    events = evaluate("learning", "t", team_stream(16, agents=2, extra=copy), cfg)
    assert by_agent(events) == {(1, "agent_copying")}
    assert "for 10 steps" in events[0].message  # longer than pathology_stop_steps ...
    assert by_agent(events, "stop") == set()  # ... but the team's reward still improves: a warning
    assert "agent 1: copies" in events[0].message
    falling = {"agent1/copy_rate": lambda s: 0.99 - 0.01 * s}
    assert evaluate("learning", "t", team_stream(12, agents=2, extra=falling), cfg) == []
    stalled = {**copy, "critic/score/mean": lambda s: 0.6 if s < 6 else 0.55}
    events = evaluate("learning", "t", team_stream(16, agents=2, extra=stalled), cfg)
    assert by_agent(events, "stop") == {(1, "agent_copying")}
    assert "has not improved" in next(e for e in events if e.rule == "agent_copying").message


def test_reward_concentrating_on_one_agent():
    cfg = HealthConfig(window=3)
    share = {"agent0/reward_share": lambda s: 0.95 if s > 3 else 0.5,
             "agent1/reward_share": lambda s: 0.05 if s > 3 else 0.5}
    events = evaluate("learning", "t", team_stream(6, agents=2, extra=share), cfg)
    assert by_agent(events) == {(0, "reward_concentration")} and events[0].severity == "warn"
    assert "agent 0: takes 95%" in events[0].message
    assert evaluate("learning", "t", team_stream(5, agents=2, extra=share), cfg) == []  # 2 steps: not yet


def test_debate_rounds_that_change_nothing_warn_after_many_steps():
    cfg = HealthConfig(stale_rounds_steps=10)
    stale = {"workflow/answer_change_rate": lambda s: 0.3 if s <= 5 else 0.0, "workflow/agreement": lambda s: 1.0}
    assert evaluate("learning", "t", team_stream(14, agents=2, extra=stale), cfg) == []
    events = evaluate("learning", "t", team_stream(15, agents=2, extra=stale), cfg)
    assert [(e.rule, e.severity, e.agent) for e in events] == [("stale_debate_rounds", "warn", None)]
    assert "agreement 1.00" in events[0].message
    # not in stage 1, and not with a single round (no later round could change an answer)
    assert evaluate("system", "t", team_stream(30, agents=2, extra=stale), cfg) == []
    one_round = HealthConfig(stale_rounds_steps=10, num_rounds=1)
    assert evaluate("learning", "t", team_stream(15, agents=2, extra=stale), one_round) == []
