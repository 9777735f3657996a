"""What a launched trial is called everywhere: its spec, its serialisable handle, a poll, and its files.

The on-disk contract of a trial directory is documented in ``mart.trial_runner.base``.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field, model_validator

from mart.state.models import TrialRecord, TrialStatus
from mart.state.trial_state import IllegalTransition, TrialState, check_transition

STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "trial.log"
CHECKPOINTS_DIR = "checkpoints"
#: an empty file a trial leaves when it cannot write its status because the disk is full (a name needs no data
#: blocks): whoever polls it later, after space was freed, still names the disk as the cause
DISK_FULL_MARK = "ended-disk-full"
#: how a trial whose stored handle mart could not prove it launched is ended (its row's ``reason`` starts so)
HANDLE_REFUSED = "stored handle refused, nothing signalled"


def checkpoint_dir(trial_dir: str, step: int) -> str:
    """Where a trial keeps its checkpoint of global step ``step`` (verl's ``global_step_N`` naming)."""
    return f"{trial_dir.rstrip('/')}/{CHECKPOINTS_DIR}/global_step_{int(step)}"


class CheckpointRef(BaseModel):
    """A saved training state a new trial starts from: the parent trial's checkpoint at ``step``."""

    path: str = Field(description="the checkpoint directory (``<trial_dir>/checkpoints/global_step_N``)")
    step: int = Field(ge=1, description="the global step the checkpoint was saved after")
    trial_id: str | None = Field(None, description="the parent trial (for the ledger's tree)")


class TrialSpec(BaseModel):
    """What to run: a full flat config (verl keys), a horizon in steps, a directory of its own."""

    trial_id: str
    config: dict[str, Any]
    steps: int = Field(ge=1)
    trial_dir: str
    memory_capacity_gb: float | None = None
    seed: int = 0
    stage: str | None = Field(None, description="'system' (throughput: no validation) or 'learning'; None = a "
                                                "standalone trial, run like a learning trial")
    save_steps: list[int] = Field(default_factory=list, description="global steps after which to save a checkpoint")
    launch_token: str | None = Field(
        None, description="a random token recorded in the ledger before the launch; a runner gives it to the trial "
        "(``MART_LAUNCH_TOKEN`` in its environment) so a resumed tuner can find a trial whose handle it never saved")
    devices: str | None = Field(
        None, description="the GPUs of the trial's slot as ``CUDA_VISIBLE_DEVICES`` (UUIDs, or indices without them) "
        "when several trials share this machine's GPUs (``Backend.trial_devices``); None: every GPU this process sees")
    init_from: CheckpointRef | None = Field(
        None, description="start from this checkpoint (policy, optimizer, data position, global step) instead of the "
        "base model; ``steps`` stays the last global step, so the trial trains steps init_from.step+1..steps")

    @model_validator(mode="after")
    def _check_steps(self) -> "TrialSpec":
        if self.init_from is not None and self.init_from.step >= self.steps:
            raise ValueError(f"`steps` ({self.steps}) must be > `init_from.step` ({self.init_from.step}): "
                             "steps is the last global step of the trial, not a count after the checkpoint.")
        bad = [s for s in self.save_steps if not 1 <= s <= self.steps]
        if bad:
            raise ValueError(f"`save_steps` must lie in [1, steps={self.steps}], but got {bad}.")
        return self


class TrialHandle(BaseModel):
    """Serialisable reference to a launched trial (kept in the ledger; survives tuner restarts)."""

    trial_id: str
    backend: str
    trial_dir: str
    pid: int | None = None
    pid_create_time: float | None = Field(None, description="guards against pid reuse after a reboot")
    job_id: str | None = None
    started_at: float = Field(default_factory=time.time)
    extra: dict[str, Any] = Field(default_factory=dict)


class TrialPoll(BaseModel):
    """Where a trial stands now."""

    status: TrialStatus
    reason: str | None = None
    last_step: int | None = None
    queued: str | None = Field(
        None, description="set while a launched trial waits for its resources before it starts (status RUNNING: "
        "it is neither running yet nor failed), saying for what, e.g. a Ray job held PENDING until a node is free; "
        "the progress watchdog's first-step clock starts once it is no longer set")


class RunningTrial(BaseModel):
    """A trial in flight: its record, its handle once launched, the slot it holds, and what the watcher found."""

    record: TrialRecord
    handle: TrialHandle | None = None
    slot: int = Field(0, ge=0, description="which of the session's trial slots it holds (0 .. parallel-1)")
    stop_reason: str | None = Field(None, description="set when the trial must be stopped (health, watchdog)")
    finished: bool = Field(False, description="the trial has ended (or must be collected): collect it next")
    look_at: int | None = Field(None, ge=1, description="the step after which the stage decides again while the "
                                "trial runs (an early look; ``StagePolicy.look_at``), once")
    looked: bool = Field(False, description="the early look was taken: the stage has seen the trial's first steps")

    @property
    def state(self) -> TrialState:
        """Where the trial stands in its life (``mart.state.trial_state``), read from the fields above."""
        if self.finished:
            return TrialState.FINISHED
        if self.stop_reason:
            return TrialState.STOP_REQUESTED
        if self.handle is None:
            return TrialState.LAUNCHING
        return TrialState.LOOKED if self.looked else TrialState.RUNNING

    def move(self, to: TrialState, *, reason: str | None = None, handle: TrialHandle | None = None) -> "RunningTrial":
        """The trial moved to ``to`` (``IllegalTransition`` if its state machine does not allow it): ``reason`` why
        it must stop (``STOP_REQUESTED``), ``handle`` once launched (``RUNNING``)."""
        check_transition(self.state, to, self.record.trial_id)
        if to is TrialState.STOP_REQUESTED and not reason:
            raise IllegalTransition(f"trial {self.record.trial_id}: a stop needs its reason")
        if to is TrialState.RUNNING and handle is None:
            raise IllegalTransition(f"trial {self.record.trial_id}: running needs its handle")
        fields: dict[TrialState, dict[str, Any]] = {
            TrialState.FINISHED: {"finished": True}, TrialState.STOP_REQUESTED: {"stop_reason": reason},
            TrialState.LOOKED: {"looked": True}, TrialState.RUNNING: {"handle": handle}}
        return self.model_copy(update=fields.get(to, {}))
