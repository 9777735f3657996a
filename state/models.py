"""Pydantic schemas exchanged between nodes, stored in graph state (small ones) and in the ledger.

Every class here is registered with the checkpoint serializer (see ``mart.state.serde``): add new ones to
``STATE_TYPES`` at the bottom, or they silently degrade to dicts under ``LANGGRAPH_STRICT_MSGPACK``.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from mart.state.stages import StageName, traits


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
    stage: StageName
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
    stage: StageName
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


DecisionType = Literal["approve", "edit", "reject", "respond"]


class CandidateDecision(BaseModel):
    """The reviewer's decision on one candidate of a review (the decision types of LangChain's human-in-the-loop
    middleware: approve, edit, reject, respond)."""

    type: DecisionType
    candidate_id: str | None = Field(
        None, description="the candidate it decides; None: every candidate that no other decision names")
    edits: dict[str, Any] = Field(default_factory=dict, description="edit: knob (edit name or verl key) -> new "
                                  "value, applied to the candidate's overrides and checked against the catalogue")
    message: str = Field("", description="reject: feedback for the proposer; respond: a question for the agents "
                                         "(the review is asked again with their answer); edit: an optional note")

    @model_validator(mode="before")
    @classmethod
    def _langchain_edit(cls, data: Any) -> Any:
        # LangChain's HITL edit decision carries the edited call as {"edited_action": {"name", "args"}}
        if isinstance(data, dict) and "edited_action" in data and "edits" not in data:
            data = dict(data)
            edited = data.pop("edited_action") or {}
            data["edits"] = dict(edited.get("args") or {}) if isinstance(edited, dict) else edited
        return data


class ReviewDecision(BaseModel):
    """The human reviewer's answer to one review (validated as the interrupt's response schema).

    One review covers the candidates proposed at one decision point (one per free trial slot): ``decisions``
    names what happens to each. A decision without ``candidate_id`` covers every candidate no other decision
    names, so ``{"decisions": [{"type": "approve"}]}`` approves them all. The older one-candidate form
    ``{"action": "approve" | "edit" | "reject", "edits": {...}, "feedback": "..."}`` is read as one such
    decision.
    """

    decisions: list[CandidateDecision] = Field(min_length=1)
    reviewer: str = Field("unknown", description="who decided: a user name, slack id, 'auto'")
    channel: str = Field("studio", description="where the answer came from: tty, cli, auto, slack, api; an "
                         "answer without one can only come through LangGraph Studio or its SDK")

    @model_validator(mode="before")
    @classmethod
    def _one_candidate_form(cls, data: Any) -> Any:
        if isinstance(data, dict) and "action" in data and "decisions" not in data:
            data = dict(data)
            one = {"type": data.pop("action"), "edits": data.pop("edits", None) or {},
                   "message": data.pop("feedback", None) or ""}
            if data.get("candidate_id") is not None:
                one["candidate_id"] = data.pop("candidate_id")
            data.pop("candidate_id", None)
            data["decisions"] = [one]
        return data

    # the one-candidate view: what the decision does when it covers one candidate, or all of them alike
    @property
    def action(self) -> str:
        """The decision type when every decision has the same one, else ``"mixed"``."""
        types = {d.type for d in self.decisions}
        return types.pop() if len(types) == 1 else "mixed"

    @property
    def edits(self) -> dict[str, Any]:
        return next((dict(d.edits) for d in self.decisions if d.type == "edit"), {})

    @property
    def feedback(self) -> str:
        return next((d.message for d in self.decisions if d.message), "")

    @classmethod
    def approve_all(cls, reviewer: str = "unknown", channel: str = "studio") -> "ReviewDecision":
        return cls(decisions=[CandidateDecision(type="approve")], reviewer=reviewer, channel=channel)

    def for_candidates(self, candidate_ids: list[str]) -> dict[str, CandidateDecision]:
        """Each candidate's decision (``ValueError`` naming what is wrong: an unknown id, a candidate decided
        twice or not at all)."""
        named = [d for d in self.decisions if d.candidate_id is not None]
        unknown = sorted({d.candidate_id for d in named if d.candidate_id} - set(candidate_ids))
        if unknown:
            raise ValueError(f"no candidate {', '.join(map(str, unknown))} in this review (its candidates: "
                             f"{', '.join(candidate_ids)})")
        seen = [d.candidate_id for d in named if d.candidate_id]
        twice = sorted({c for c in seen if seen.count(c) > 1})
        if twice:
            raise ValueError(f"candidate {', '.join(map(str, twice))} decided twice")
        rest = [d for d in self.decisions if d.candidate_id is None]
        if len(rest) > 1:
            raise ValueError("at most one decision without candidate_id (it covers the candidates no other names)")
        out = {d.candidate_id: d for d in named}
        missing = [c for c in candidate_ids if c not in out]
        if missing and not rest:
            raise ValueError(f"no decision for candidate {', '.join(missing)}: decide each, or add one decision "
                             "without candidate_id for the rest")
        for c in missing:
            out[c] = rest[0].model_copy(update={"candidate_id": c})
        return {c: out[c] for c in candidate_ids}

    def describe(self) -> str:
        """``approve`` / ``reject sys-02-r0-c1, approve the rest`` (for logs and channel messages)."""
        parts = [f"{d.type}{' ' + d.candidate_id if d.candidate_id else (' the rest' if len(self.decisions) > 1 else '')}"
                 for d in self.decisions]
        return ", ".join(parts)


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
    stage: StageName
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

    def objective(self, stage: str) -> float | None:
        return self.throughput if traits(stage).objective == "throughput" else self.score

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "TrialRecord":
        """The record of a ledger row (``Ledger.trials``/``rows``)."""
        return cls(
            trial_id=row["trial_id"], stage=row["stage"], kind=row.get("kind") or "candidate",
            candidate_id=row.get("candidate_id"), config=row.get("config") or {},
            status=TrialStatus(row.get("status") or "failed"), reason=row.get("reason"),
            steps_done=row.get("steps_done") or 0, throughput=row.get("throughput"),
            peak_memory_gb=row.get("peak_memory_gb"), score=row.get("score"),
            early_stopped=bool(row.get("early_stopped")), wall_s=row.get("wall_s") or 0.0,
            parent_trial=row.get("parent_trial"), parent_checkpoint=row.get("parent_checkpoint"),
            parent_step=row.get("parent_step"), seed=row.get("seed"), confirms=row.get("confirms"),
        )

    def brief(self) -> "TrialRecord":
        """The record without its full config (in the ledger): what graph state keeps of a finished trial, since
        every channel is written into every checkpoint."""
        return self.model_copy(update={"config": {}})


STATE_TYPES = [TrialStatus, PhaseProfile, Profile, Candidate, Critique, CandidateDecision, ReviewDecision,
               HealthEvent, TrialRecord]
