"""Pydantic schemas exchanged between nodes, stored in graph state (small ones) and in the ledger.

Every class here is registered with the checkpoint serializer (see ``mart.state.serde``): add new ones to
``STATE_TYPES`` at the bottom, or they silently degrade to dicts under ``LANGGRAPH_STRICT_MSGPACK``.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field

Stage = Literal["system", "learning", "schedule"]
#: the stages in the order a session runs them (`TuneOptions.stages` keeps this order)
STAGE_ORDER: tuple[str, ...] = ("system", "learning", "schedule")


class TrialStatus(str, enum.Enum):
    """Lifecycle of a trial. Only ``RUNNING`` is not final."""

    RUNNING = "running"
    COMPLETED = "completed"
    OOM = "oom"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped by mart (health monitor, watchdog, user) or SIGTERM

    def is_finished(self) -> bool:
        return self is not TrialStatus.RUNNING


def config_hash(config: dict[str, Any]) -> str:
    """Stable short hash of a flat config, used for duplicate detection and idempotency keys."""
    blob = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class PhaseProfile(BaseModel):
    """One phase of an RL step (verl's ``timing_s/<name>``)."""

    name: str
    mean_s: float
    share: float = Field(description="fraction of the step time")


class Profile(BaseModel):
    """Phase-wise resource profile of one (baseline) trial, built by the profiler node."""

    trial_id: str
    stage: Stage
    throughput: float = Field(description="mean perf/throughput (tokens/s) over the measured updates")
    step_time_s: float
    phases: list[PhaseProfile] = Field(default_factory=list)
    bottleneck: str = Field(description="the phase with the largest share of step time")
    peak_memory_gb: float
    memory_limit_gb: float | None = Field(None, description="(1 - margin) x capacity")
    memory_headroom_gb: float | None = None
    response_length_mean: float = 0.0
    response_length_max: float = 0.0
    response_clip_ratio: float = 0.0
    score: float | None = Field(None, description="final validation score (learning stage)")
    entropy: float | None = None


class Candidate(BaseModel):
    """A proposed configuration: the overrides it changes relative to the stage's base config."""

    candidate_id: str
    stage: Stage
    overrides: dict[str, Any] = Field(description="verl key -> value, only the changed knobs")
    rationale: str = ""
    source: str = Field("rules", description="which strategy proposed it (rules, llm, reviewer-edit)")
    predicted_memory_gb: float | None = None
    expected_gain: float | None = Field(None, description="strategy's estimate of the relative improvement")
    predicted_throughput: float | None = Field(None, description="the job model's throughput (tokens/s/GPU)")

    def key(self) -> str:
        return config_hash(self.overrides)


class Critique(BaseModel):
    """The critic's verdict on one candidate."""

    candidate_id: str
    accepted: bool
    reasons: list[str] = Field(default_factory=list)
    predicted_memory_gb: float | None = None
    risk: Literal["low", "medium", "high"] = "low"
    score: float = Field(0.0, description="ranking score; higher is better")


class ReviewDecision(BaseModel):
    """The human reviewer's answer to a review interrupt (validated as the interrupt's response schema)."""

    action: Literal["approve", "edit", "reject"]
    edits: dict[str, Any] = Field(default_factory=dict, description="for edit: verl key -> new value")
    feedback: str = Field("", description="for reject (or edit): free text that reaches the proposer")
    reviewer: str = Field("unknown", description="who decided: a user name, slack id, 'auto'")
    channel: str = Field("studio", description="where the answer came from: tty, cli, auto, slack, api; an "
                         "answer without one can only come through LangGraph Studio or its SDK")


class HealthEvent(BaseModel):
    """An anomaly found by the health monitor in a trial's metric stream."""

    trial_id: str
    step: int
    rule: str
    severity: Literal["warn", "stop"]
    message: str
    value: float | None = None
    agent: int | None = Field(None, description="the agent of a multi-agent job whose stream raised it (None: the team "
                                                "or a single-agent job)")

    @property
    def scoped_rule(self) -> str:
        """``agent1/entropy_collapse`` for an agent's event, the rule name otherwise (unique per trial and step)."""
        return self.rule if self.agent is None else f"agent{self.agent}/{self.rule}"


class TrialRecord(BaseModel):
    """Summary of one trial, as kept in graph state and the ledger (never its metric stream)."""

    trial_id: str
    stage: Stage
    kind: Literal["baseline", "candidate", "confirm"] = "candidate"  # confirm: a re-evaluation on another seed
    candidate_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="full flat config of the trial")
    status: TrialStatus = TrialStatus.RUNNING
    reason: str | None = None
    steps_done: int = 0
    throughput: float | None = Field(None, description="stage-1 objective: mean perf/throughput, updates 3-5")
    peak_memory_gb: float | None = None
    score: float | None = Field(None, description="stage-2 objective: final validation score")
    early_stopped: bool = False
    wall_s: float = 0.0
    # the trial tree: a trial started from another trial's checkpoint (None = from the base model)
    parent_trial: str | None = None
    parent_checkpoint: str | None = Field(None, description="checkpoint directory the trial started from")
    parent_step: int | None = Field(None, description="global step of that checkpoint")
    save_steps: list[int] = Field(default_factory=list, description="global steps after which it saves a checkpoint")
    seed: int | None = Field(None, description="the trial's seed (None: the session's)")
    confirms: str | None = Field(None, description="kind confirm: the trial whose config it re-evaluates")

    def objective(self, stage: Stage) -> float | None:
        return self.throughput if stage == "system" else self.score  # learning, schedule: validation score


STATE_TYPES = [TrialStatus, PhaseProfile, Profile, Candidate, Critique, ReviewDecision, HealthEvent, TrialRecord]
