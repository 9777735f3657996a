"""Collect tool node: final status and objective of a finished trial; updates the stage's best."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.progress import HealthNotice, TrialDone, emit
from mart.nodes.runtime import Services, services_for
from mart.nodes.stage_control import overrides_of, stage_horizon
from mart.state.graph_state import TuningState, active_handle
from mart.state.models import TrialRecord, TrialStatus
from mart.state.objectives import learning_score, system_outcome, unscored_reason


def _finite(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


def _best_before(state: TuningState, stage: str, record: TrialRecord | None = None, ledger=None) -> float | None:
    if stage == "schedule":  # a branch against the unchanged continuation from the same checkpoint
        if record is None or ledger is None or not record.parent_trial:
            return None
        same = [r for r in ledger.trials(stage) if r.get("parent_trial") == record.parent_trial and not r.get("overrides")
                and not r.get("confirms") and r["trial_id"] != record.trial_id]
        return same[0].get("score") if same else None
    best = (state.get("best") or {}).get(stage)
    if best is None:
        return None
    return best.throughput if stage == "system" else best.score


def collect_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["profiler", "stage_control"]]:
    services = services_for(state, runtime)
    ledger = services.ledger
    record: TrialRecord = state["pending_trial"]
    row = ledger.trial(record.trial_id) or {}
    status, reason = TrialStatus(row.get("status", "failed")), row.get("reason")
    handle = active_handle(state)
    if handle is not None:
        ledger.add_metrics(record.trial_id, services.runner.read_all_metrics(handle))
        poll = services.runner.poll(handle)
        status, reason = poll.status, poll.reason
        if status is TrialStatus.RUNNING:  # should not happen after watch/stop; never leave it behind
            poll = services.runner.stop(handle, reason="collected while running")
            status, reason = poll.status, poll.reason
    records = ledger.metric_records(record.trial_id)
    horizon = stage_horizon(services.options, record.stage)
    early = bool(state.get("stop_reason"))
    update: dict[str, Any] = {
        "status": status, "reason": state.get("stop_reason") or reason, "early_stopped": early,
        "steps_done": max((r.step for r in records), default=0),
        "wall_s": time.time() - (row.get("started_at") or time.time()),
    }
    eligible = status is TrialStatus.COMPLETED and not early
    if record.stage == "system":
        outcome = system_outcome(records, horizon, services.memory_limit_gb())
        update["throughput"] = _finite(outcome.throughput)
        update["peak_memory_gb"] = _finite(outcome.peak_memory_gb)
        eligible = eligible and outcome.feasible
        if not outcome.feasible and status is TrialStatus.COMPLETED and update["reason"] is None:
            update["reason"] = "peak memory above the margin"
    else:
        prefix = services.backend.score_metric_prefix
        update["score"] = _finite(learning_score(records, prefix))
        update["peak_memory_gb"] = _finite(system_outcome(records, horizon, None).peak_memory_gb)
        if update["score"] is None and status is TrialStatus.COMPLETED:
            # loud: a completed learning trial without a post-training validation cannot be ranked
            why = unscored_reason(records, prefix)
            update["reason"] = f"{update['reason']}; {why}" if update["reason"] else why
            emit(services, HealthNotice(trial_id=record.trial_id, rule="unscored", severity="warn", message=why))
    if status is not TrialStatus.COMPLETED or early:
        # a failed, OOM'd or stopped trial has no result: its partial figures are never reported as one
        update["throughput"] = update["score"] = None
    done = record.model_copy(update=update)
    ledger.upsert_trial(done, run_id=services.run_id, ended_at=time.time())
    emit(services, TrialDone(trial_id=done.trial_id, status=done.status.value, reason=done.reason,
                             throughput=done.throughput, score=done.score, peak_memory_gb=done.peak_memory_gb,
                             eligible=eligible, best_before=_best_before(state, record.stage, done, ledger),
                             compared_to="unchanged" if record.stage == "schedule" else "best"))

    stage = record.stage
    trials_done = dict(state.get("trials_done") or {})
    trials_done[stage] = trials_done.get(stage, 0) + 1
    out: dict[str, Any] = {
        "trials_done": trials_done, "last_trial": done, "pending_trial": None, "active": None,
        "stop_reason": None, "trial_finished": False, "selected": None, "feedback": [], "round": 0,
    }
    best = dict(state.get("best") or {})
    best_overrides = dict(state.get("best_overrides") or {})
    if record.kind == "baseline":
        out["baseline"] = {**(state.get("baseline") or {}), stage: done}
        if eligible and done.objective(stage) is not None:
            best[stage], best_overrides[stage] = done, {}
    elif record.kind == "confirm" or stage == "schedule":
        # a re-evaluation: stage_control weighs it with the trial it repeats (selection under noise); a schedule
        # branch is a node of the tree, whose winner is a complete path (nodes.schedule_stage)
        pass
    elif eligible and done.objective(stage) is not None:
        incumbent = best.get(stage)
        if incumbent is None or incumbent.objective(stage) is None or done.objective(stage) > incumbent.objective(stage):
            best[stage], best_overrides[stage] = done, overrides_of(state, services, done)
    out["best"], out["best_overrides"] = best, best_overrides
    return Command(goto="profiler" if record.kind == "baseline" else "stage_control", update=out)
