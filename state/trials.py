"""What a launched trial is called everywhere: its spec, its serialisable handle, a poll, and its files.

The on-disk contract of a trial directory is documented in ``mart.trial_runner.base``.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from mart.state.models import TrialStatus

STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "trial.log"


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
