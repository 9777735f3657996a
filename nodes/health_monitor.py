"""The health monitor: applies the health rules to a running trial's metrics and decides whether it must stop.

The watch tool (``mart.tools.watch``) calls ``assess`` for every trial in flight whenever new steps arrived, so a
sick trial is stopped while the others run on. Stage 2: NaN, entropy collapse, KL blow-up, grad-norm explosion,
reward collapse (stop when persistent), stagnation and response clipping (warnings unless persistent). Stage 1:
NaN and the memory margin. A multi-agent job's agents each go through the same rules, and the event and the stop
reason name the agent ("agent 1: entropy ..."); its pathologies (copying, reward concentration, stale debate
rounds) are warnings unless persistent and harmful. Baselines are never stopped (they define the reference), but
their events are recorded. The rules themselves are in ``mart.nodes.health_rules``.
"""

from __future__ import annotations

from typing import Any

from mart.nodes.health_rules import HealthConfig, evaluate
from mart.nodes.progress import HealthNotice, emit
from mart.state.agents import NUM_ROUNDS
from mart.state.models import HealthEvent, TrialRecord
from mart.state.stages import memory_bound


def health_config(services: Any, record: TrialRecord) -> HealthConfig:
    return HealthConfig(memory_limit_gb=services.memory_limit_gb() if memory_bound(record.stage) else None,
                        num_rounds=_int_or_none(record.config.get(NUM_ROUNDS)))


#: how the reason of a trial the health monitor stopped begins (the ledger's ``reason``)
STOP_PREFIX = "health:"


def assess(services: Any, record: TrialRecord, *, final: bool = False) -> str | None:
    """Evaluate the rules on the trial's stream so far (from the ledger), record its events, announce the new
    ones, and return why it must stop (None: it runs on; a baseline, or a trial that has ``final``-ly ended,
    is never stopped)."""
    records = services.ledger.metric_records(record.trial_id)
    events = evaluate(record.stage, record.trial_id, records, health_config(services, record))
    before = services.ledger.health_events(record.trial_id)
    known = {(e.scoped_rule, e.step, e.severity) for e in before}
    # a rule that holds at every step (stagnation) is announced once per trial and severity, not once per step; the
    # ledger keeps each step's event
    announced = {(e.scoped_rule, e.severity) for e in before}
    services.ledger.add_health_events(events)
    for ev in events:
        if (ev.scoped_rule, ev.step, ev.severity) not in known and (ev.scoped_rule, ev.severity) not in announced:
            announced.add((ev.scoped_rule, ev.severity))
            emit(services, HealthNotice(trial_id=ev.trial_id, rule=ev.rule, severity=ev.severity, message=ev.message))
    stops: list[HealthEvent] = [e for e in events if e.severity == "stop"]
    if final or not stops or record.kind == "baseline":
        return None
    return f"{STOP_PREFIX} {stops[0].rule}: {stops[0].message}"


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
