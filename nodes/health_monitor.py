"""Health monitor node: applies the health rules to the active trial's metrics and decides its fate.

Stage 2: NaN, entropy collapse, KL blow-up, grad-norm explosion, reward collapse (stop when persistent),
stagnation and response clipping (warnings unless persistent). Stage 1: NaN and the memory margin.
A multi-agent job's agents each go through the same rules, and the event and the stop reason name the agent
("agent 1: entropy ..."); its pathologies (copying, reward concentration, stale debate rounds) are warnings
unless persistent and harmful. Baselines are never stopped (they define the reference), but their events are
recorded.
"""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.health_rules import HealthConfig, evaluate
from mart.nodes.progress import HealthNotice, emit
from mart.nodes.runtime import Services, services_for
from mart.state.agents import NUM_ROUNDS
from mart.state.graph_state import TuningState


def health_monitor(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["watch_trial", "stop_trial", "collect_trial"]]:
    services = services_for(state, runtime)
    record = state["pending_trial"]
    records = services.ledger.metric_records(record.trial_id)
    cfg = HealthConfig(memory_limit_gb=services.memory_limit_gb() if record.stage == "system" else None,
                       num_rounds=_int_or_none(record.config.get(NUM_ROUNDS)))
    events = evaluate(record.stage, record.trial_id, records, cfg)
    services.ledger.add_health_events(events)
    for ev in events:
        emit(services, HealthNotice(trial_id=ev.trial_id, rule=ev.rule, severity=ev.severity, message=ev.message))
    if state.get("trial_finished"):
        return Command(goto="collect_trial")
    stops = [e for e in events if e.severity == "stop"]
    if stops and record.kind != "baseline":
        return Command(goto="stop_trial", update={"stop_reason": f"health: {stops[0].rule}: {stops[0].message}"})
    return Command(goto="watch_trial")


def _int_or_none(value) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
