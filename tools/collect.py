"""Collect tool node: final status and objective of every finished trial; the stage updates its best."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes import stages
from mart.nodes.progress import HealthNotice, TrialDone, emit
from mart.nodes.runtime import Services, services_for
from mart.nodes.stages import StageView
from mart.state.graph_state import TuningState, running_trials
from mart.state.models import TrialRecord, TrialStatus
from mart.state.trial_state import TrialState, check_transition
from mart.state.trials import RunningTrial


def collect_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["stage_control"]]:
    services = services_for(state, runtime)
    running = {rt.record.trial_id: rt for rt in running_trials(state)}
    update: dict[str, Any] = {}
    trials_done = dict(state.get("trials_done") or {})
    view_state: Mapping[str, Any] = dict(state)
    for tid, rt in list(running.items()):
        if rt.state is not TrialState.FINISHED:
            continue
        done, eligible = _result(services, rt)
        view = StageView(view_state, services)
        policy = stages.get(done.stage)
        best_before, compared_to = policy.compared_to(view, done)
        emit(services, TrialDone(trial_id=done.trial_id, status=done.status.value, reason=done.reason,
                                 throughput=done.throughput, score=done.score, peak_memory_gb=done.peak_memory_gb,
                                 eligible=eligible, best_before=best_before, compared_to=compared_to))
        changed = policy.collected(view, done, eligible)
        view_state.update(changed)
        update.update(changed)
        trials_done[done.stage] = trials_done.get(done.stage, 0) + 1
        check_transition(rt.state, TrialState.COLLECTED, tid)
        del running[tid]
    # something finished: the agents may find new things to try (``waiting`` ends), feedback was used
    return Command(goto="stage_control", update={**update, "trials_done": trials_done, "running": running,
                                                 "waiting": {}, "feedback": [], "round": 0})


def _result(services: Services, rt: RunningTrial) -> tuple[TrialRecord, bool]:
    """The finished trial's record (status, objective) as written to the ledger, and whether it may become the
    stage's best. A failed, OOM'd or stopped trial has no result: its partial figures are never reported as one."""
    ledger = services.ledger
    record, handle = rt.record, rt.handle
    row = ledger.trial(record.trial_id) or {}
    status, reason = TrialStatus(row.get("status", "failed")), row.get("reason")
    if handle is not None:
        ledger.add_metrics(record.trial_id, services.runner.read_all_metrics(handle))
        poll = services.runner.poll(handle)
        status, reason = poll.status, poll.reason
        if status is TrialStatus.RUNNING:  # should not happen after watch/stop; never leave it behind
            poll = services.runner.stop(handle, reason="collected while running")
            status, reason = poll.status, poll.reason
    records = ledger.metric_records(record.trial_id)
    horizon = stages.get(record.stage).horizon(services.options)
    early = bool(rt.stop_reason)
    fields: dict[str, Any] = {
        "status": status, "reason": rt.stop_reason or reason, "early_stopped": early,
        "steps_done": max((r.step for r in records), default=0),
        "wall_s": time.time() - (row.get("started_at") or time.time()),
    }
    eligible = status is TrialStatus.COMPLETED and not early
    # the stage's objective and what disqualifies a completed trial (stage 1: over the memory margin)
    outcome = stages.get(record.stage).outcome(services, records, horizon, completed=status is TrialStatus.COMPLETED)
    fields.update(outcome.fields)
    eligible = eligible and outcome.feasible
    if not outcome.feasible and status is TrialStatus.COMPLETED and fields["reason"] is None:
        fields["reason"] = outcome.infeasible_reason
    if outcome.unscored:  # loud: a completed trial without its objective (no post-training validation) cannot be ranked
        why = outcome.unscored
        fields["reason"] = f"{fields['reason']}; {why}" if fields["reason"] else why
        emit(services, HealthNotice(trial_id=record.trial_id, rule="unscored", severity="warn", message=why))
    if status is not TrialStatus.COMPLETED or early:
        fields["throughput"] = fields["score"] = None
    done = record.model_copy(update=fields)
    ledger.upsert_trial(done, run_id=services.run_id, ended_at=time.time())
    return done, eligible
