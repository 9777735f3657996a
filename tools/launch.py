"""Launch tool node: starts the pending trial once, recording it in the ledger *before* it starts.

Idempotent: a graph resumed after a crash re-runs this node; a trial that already has a handle in the
ledger is re-attached (running) or collected (finished), never launched a second time.
"""

from __future__ import annotations

import time
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.progress import TrialFailed, TrialLaunched, TrialReattached, emit
from mart.nodes.runtime import Services, services_for
from mart.nodes.schedule_stage import prepare_trial, start_config
from mart.nodes.stage_control import overrides_of, stage_base_config, stage_horizon
from mart.state.graph_state import TuningState
from mart.state.models import TrialStatus
from mart.state.trials import CheckpointRef, TrialHandle, TrialSpec


def _changes(state: TuningState, services: Services, record) -> list[str]:
    """The trial's config against the stage's current best, in the names a reviewer edits."""
    if record.stage == "schedule":  # a branch: against its parent's config (the root: the start config)
        parent = services.ledger.trial(record.parent_trial) if record.parent_trial else None
        current = dict((parent or {}).get("config") or {}) or start_config(state, services)
    else:
        current = {**stage_base_config(state, services, record.stage),
                   **(state.get("best_overrides") or {}).get(record.stage, {})}
    space = services.backend.search_space()
    name = space.edit_name
    return [f"{name(k) if k in space else k} {current.get(k)!r}→{v!r}"
            for k, v in sorted(record.config.items()) if k in current and current[k] != v]


def launch_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["watch_trial", "collect_trial"]]:
    services = services_for(state, runtime)
    record = state["pending_trial"]
    ledger = services.ledger
    seq = state.get("trial_seq", 0) + 1
    fresh = {"trial_seq": seq, "trial_finished": False, "stop_reason": None}
    horizon = stage_horizon(services.options, record.stage)
    if record.stage == "schedule":
        # a segment-trial: its parent checkpoint, the step it ends at (a global step), where it saves
        record, horizon = prepare_trial(state, services, record)
        fresh["pending_trial"] = record
    existing = ledger.trial(record.trial_id)
    if existing and existing.get("handle"):
        emit(services, TrialReattached(trial_id=record.trial_id))
        return Command(goto="watch_trial", update={**fresh, "active": TrialHandle.model_validate(existing["handle"])})

    trial_dir = services.store.trial_dir(record.trial_id)
    ledger.upsert_trial(
        record.model_copy(update={"status": TrialStatus.RUNNING}), run_id=services.run_id, seq=seq,
        horizon=horizon, trial_dir=str(trial_dir), started_at=time.time(),
        overrides=overrides_of(state, services, record),
    )
    spec = TrialSpec(
        trial_id=record.trial_id, config=record.config, steps=horizon, trial_dir=str(trial_dir),
        memory_capacity_gb=services.memory_capacity_gb(), stage=record.stage,
        seed=services.options.seed if record.seed is None else record.seed,
        save_steps=record.save_steps,
        init_from=(CheckpointRef(path=record.parent_checkpoint, step=record.parent_step, trial_id=record.parent_trial)
                   if record.parent_checkpoint and record.parent_step else None),
    )
    try:
        handle: TrialHandle = services.runner.launch(spec)
    except Exception as e:  # a launch that fails is a failed trial, not a failed session
        ledger.set_trial_fields(record.trial_id, status=TrialStatus.FAILED.value, reason=f"launch failed: {e}")
        emit(services, TrialFailed(trial_id=record.trial_id, reason=str(e)))
        return Command(goto="collect_trial", update={**fresh, "active": None, "trial_finished": True})
    ledger.set_trial_fields(record.trial_id, handle=handle.model_dump(mode="json"))
    emit(services, TrialLaunched(trial_id=record.trial_id, stage=record.stage, kind=record.kind, horizon=horizon,
                                 changes=_changes(state, services, record)))
    return Command(goto="watch_trial", update={**fresh, "active": handle})

