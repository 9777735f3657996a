"""Launch tool node: starts the queued trials in the free slots, each recorded in the ledger *before* it starts.

Idempotent: a graph resumed after a crash re-runs this node. A trial whose handle the ledger holds is
re-attached (running) or collected (finished), never launched a second time; one whose launch was recorded
(``launch_token``) but whose handle never was (a kill inside the launch window) is adopted from the backend when
it did start (``TrialRunner.adopt``), and launched only when it did not.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes import stages
from mart.nodes.progress import TrialFailed, TrialLaunched, TrialReattached, emit
from mart.nodes.runtime import Services, services_for
from mart.nodes.stages import StageView
from mart.state.graph_state import TuningState, running_trials
from mart.state.models import TrialRecord, TrialStatus
from mart.state.stages import branches
from mart.state.trial_state import TrialState, check_transition
from mart.state.trials import HANDLE_REFUSED, CheckpointRef, RunningTrial, TrialHandle, TrialSpec


def _changes(view: StageView, record: TrialRecord) -> list[str]:
    """The trial's config against what it starts from (the stage's current best; a schedule branch: its parent's
    config), in the names a reviewer edits."""
    current = stages.get(record.stage).current_config(view, record)
    space = view.services.backend.search_space()
    name = space.edit_name
    return [f"{name(k) if k in space else k} {current.get(k)!r}→{v!r}"
            for k, v in sorted(record.config.items()) if k in current and current[k] != v]


def _rerun_of(view: StageView, record: TrialRecord) -> str | None:
    """The trial whose config ``record`` runs again: a confirmation's original, or the stage's earlier baseline (its
    re-run after a kill or a cut); None for a trial that runs a config of its own. A re-run is announced as such,
    not as changes against the stage's current best."""
    if record.kind == "confirm":
        return record.confirms
    if record.kind == "baseline" and not branches(record.stage):
        return next((r["trial_id"] for r in view.ledger.trials(record.stage)
                     if r["kind"] == "baseline" and r["trial_id"] != record.trial_id), None)
    return None


def _spec(services: Services, record: TrialRecord, horizon: int, trial_dir: str, token: str | None,
          slot: int = 0) -> TrialSpec:
    return TrialSpec(
        trial_id=record.trial_id, config=record.config, steps=horizon, trial_dir=trial_dir,
        memory_capacity_gb=services.memory_capacity_gb(), stage=record.stage,
        seed=services.options.seed if record.seed is None else record.seed,
        save_steps=record.save_steps, launch_token=token, devices=services.trial_devices(slot),
        init_from=(CheckpointRef(path=record.parent_checkpoint, step=record.parent_step, trial_id=record.parent_trial)
                   if record.parent_checkpoint and record.parent_step else None),
    )


def launch_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["stage_control"]]:
    services = services_for(state, runtime)
    view = StageView(state, services)
    running = {r.record.trial_id: r for r in running_trials(state)}
    free_slots = sorted(set(range(services.trial_slots())) - {r.slot for r in running.values()})
    queue = view.queued()
    seq = int(state.get("trial_seq", 0))
    left: list[TrialRecord] = []
    for record in queue:
        if not free_slots:
            left.append(record)  # waits for a free slot (stage control asks for no more than there are)
            continue
        slot = free_slots.pop(0)
        seq += 1
        policy = stages.get(record.stage)
        # what the stage fills in at launch (a schedule branch: its parent checkpoint, the step it ends at)
        record, horizon = policy.prepare(view, record)
        running[record.trial_id] = _start(state, services, view, record, horizon, seq, slot)
    update: dict[str, Any] = {"trial_seq": seq, "queue": left, "running": running}
    return Command(goto="stage_control", update=update)


def _start(state: TuningState, services: Services, view: StageView, record: TrialRecord, horizon: int, seq: int,
           slot: int) -> RunningTrial:
    ledger = services.ledger
    look_at = stages.get(record.stage).look_at(view, record)
    check_transition(TrialState.QUEUED, TrialState.LAUNCHING, record.trial_id)
    launching = RunningTrial(record=record, slot=slot, look_at=look_at)
    existing = ledger.trial(record.trial_id)
    if existing and existing.get("handle"):
        handle = TrialHandle.model_validate(existing["handle"])
        # the row is untrusted input: re-attached unproven, the watchdog would signal whatever group it names
        why = services.runner.unproven(handle, existing.get("launch_token"), existing.get("started_at"))
        if why is not None:
            reason = f"{HANDLE_REFUSED}: {why}"
            ledger.set_trial_fields(record.trial_id, status=TrialStatus.FAILED.value, reason=reason)
            emit(services, TrialFailed(trial_id=record.trial_id, reason=reason))
            return launching.move(TrialState.FINISHED)
        emit(services, TrialReattached(trial_id=record.trial_id))
        return launching.move(TrialState.RUNNING, handle=handle)
    trial_dir = str(services.store.trial_dir(record.trial_id))
    token = (existing or {}).get("launch_token")
    if existing and token and existing.get("status") == TrialStatus.RUNNING.value:
        # recorded, never handed back: it may have started just before a kill (the launch window)
        adopted = services.runner.adopt(_spec(services, record, horizon, trial_dir, token, slot))
        if adopted is not None:
            ledger.set_trial_fields(record.trial_id, handle=adopted.model_dump(mode="json"))
            emit(services, TrialReattached(trial_id=record.trial_id))
            return launching.move(TrialState.RUNNING, handle=adopted)
    token = secrets.token_hex(8)
    ledger.upsert_trial(
        record.model_copy(update={"status": TrialStatus.RUNNING}), run_id=services.run_id, seq=seq,
        horizon=horizon, trial_dir=trial_dir, started_at=time.time(),
        overrides=stages.get(record.stage).overrides_of(view, record), slot=slot, launch_token=token,
    )
    spec = _spec(services, record, horizon, trial_dir, token, slot)
    try:
        handle: TrialHandle = services.runner.launch(spec)
    except Exception as e:  # a launch that fails is a failed trial, not a failed session
        ledger.set_trial_fields(record.trial_id, status=TrialStatus.FAILED.value, reason=f"launch failed: {e}")
        emit(services, TrialFailed(trial_id=record.trial_id, reason=str(e)))
        return launching.move(TrialState.FINISHED)
    ledger.set_trial_fields(record.trial_id, handle=handle.model_dump(mode="json"))
    rerun_of = _rerun_of(view, record)
    emit(services, TrialLaunched(trial_id=record.trial_id, stage=record.stage, kind=record.kind, horizon=horizon,
                                 changes=[] if rerun_of else _changes(view, record), slot=slot,
                                 slots=services.trial_slots(), candidate_id=record.candidate_id, rerun_of=rerun_of,
                                 seed=record.seed if rerun_of else None))
    return launching.move(TrialState.RUNNING, handle=handle)
