"""The health monitor's evaluation: the stage's registered rules on a trial's stream, and on each agent's own.

The rules themselves, their registry and their kinds are in ``mart.state.health`` (pure functions of a metric
stream, as the stage objectives are); they are re-exported here for the monitor and for the tests.
"""

from __future__ import annotations

from mart.state.health import (  # noqa: F401 - the rules' public names, re-exported
    EXPLORATION,
    HEALTH_RULES,
    INSTABILITY,
    MEMORY,
    STAGNATION,
    TEAM,
    TRUNCATION,
    UNHEALTHY,
    HealthConfig,
    HealthRule,
    Rule,
    agent_copying,
    agents_text,
    entropy_collapse,
    get_rule,
    grad_norm_explosion,
    kind_of,
    kl_blowup,
    memory_margin,
    nan_metrics,
    register_rule,
    response_clipping,
    reward_collapse,
    reward_concentration,
    reward_stagnation,
    rule_names,
    rules_for,
    stale_debate_rounds,
)
from mart.state.metrics import StepRecord
from mart.state.models import HealthEvent
from mart.state.trajectory import Trajectory


def per_agent_events(stage: str, trial_id: str, records: list[StepRecord], cfg: HealthConfig,
                     agents: list[int] | None = None) -> list[HealthEvent]:
    """The stage's per-agent rules on each agent's own stream; an event names its agent, and the agents
    that raised nothing (one agent collapsing while the others are healthy points at that agent's knobs)."""
    trajectory = Trajectory(records)
    agents = trajectory.agents() if agents is None else agents
    rules = rules_for(stage, agent=True)
    found: dict[int, list[HealthEvent]] = {}
    for agent in agents:
        stream = trajectory.agent(agent).records
        found[agent] = [ev for ev in (rule.check(trial_id, stream, cfg) for rule in rules) if ev is not None]
    events = []
    for agent, evs in found.items():
        healthy = [a for a in agents if a != agent and not found[a]]
        for ev in evs:
            tail = f"; {agents_text(healthy)} healthy" if healthy else ""
            events.append(ev.model_copy(update={"agent": agent, "message": f"agent {agent}: {ev.message}{tail}"}))
    return events


def evaluate(stage: str, trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> list[HealthEvent]:
    """All events the stage's rules raise on the stream so far (per agent too, for a multi-agent job)."""
    events = []
    for rule in rules_for(stage):
        ev = rule.check(trial_id, records, cfg)
        if ev is not None:
            events.append(ev)
    agents = Trajectory(records).agents()
    if agents:
        events += per_agent_events(stage, trial_id, records, cfg, agents)
        for pathology in rules_for(stage, team=True):
            events += pathology.check(trial_id, records, cfg)
    return events
