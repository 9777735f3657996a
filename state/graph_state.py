"""The tuning graph's state: small on purpose (ids, stage, counters, the trials in flight, summaries).

Metric streams, logs and full histories live in the ledger; SqliteSaver stores every channel in every
checkpoint, so a field that grows here costs its size at every step. All fields are replaced wholesale
by the nodes (no accumulating reducers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic (Studio's schema endpoint) needs it on Python < 3.12

from mart.state.models import Candidate, Critique, Profile, TrialRecord
from mart.state.stages import StageName
from mart.state.trials import RunningTrial

#: the shape of this state; a checkpoint of another shape (an older mart) is refused on resume, not misread
GRAPH_VERSION = 2


class Batch(BaseModel):
    """One decision point: the candidates proposed for the free trial slots, the critic's verdicts and picks."""

    want: int = Field(1, ge=1, description="how many trials the batch may start (the free slots)")
    candidates: list[Candidate] = Field(default_factory=list)
    critiques: list[Critique] = Field(default_factory=list)
    picks: list[Candidate] = Field(default_factory=list, description="the candidates the critic picked, to review")


class InputState(TypedDict, total=False):
    """What a caller provides to start a session (the CLI, the Python API, or LangGraph Studio)."""

    options: dict[str, Any]
    """``TuneOptions`` as a dict: backend, budgets, horizons, margin, approval, agents, seed, parallel."""
    run_id: str
    """Id of the run (the run directory's name). Studio runs get one on their first step."""
    run_dir: str
    """Absolute path of the run directory (ledger, trial dirs)."""


class TuningState(InputState, total=False):
    """Full state of a tuning session."""

    graph_version: int
    """``GRAPH_VERSION`` of the mart that started the session."""
    stage: StageName
    """The stage being tuned (``mart.nodes.stages``): ``system`` (throughput), ``learning`` (validation score),
    ``schedule`` (per-segment learning knobs)."""
    status: Literal["running", "completed", "failed"]
    started_at: float
    """Wall-clock start of the session (for the optional wall-clock budget)."""
    trial_seq: int
    """Number of trials queued so far in the run (gives each trial its sequence number)."""
    trials_done: dict[str, int]
    """Finished trials per stage, the baseline included."""
    running: dict[str, RunningTrial]
    """The trials in flight (at most ``TuneOptions.parallel``), by trial id: record, handle, slot."""
    queue: list[TrialRecord]
    """Trials decided (approved, or started by the stage without review) and not launched yet."""
    batch: Batch | None
    """The current decision point: candidates, critiques and the picks awaiting review."""
    waiting: dict[str, str]
    """Per stage, why no proposal is made until a running trial finishes (nothing new to try right now)."""
    profiles: dict[str, Profile]
    """Phase-wise profile of each stage's baseline."""
    baseline: dict[str, TrialRecord]
    """The baseline trial of each stage."""
    best: dict[str, TrialRecord]
    """The best feasible trial of each stage so far (starts as the baseline)."""
    best_overrides: dict[str, dict[str, Any]]
    """Overrides of each stage's best trial relative to that stage's base config."""
    feedback: list[str]
    """Reviewer feedback and critic reasons for the proposer's next round (cleared when a trial finishes)."""
    round: int
    """Proposal rounds at this decision point (bounded by ``max_revision_rounds`` for critic send-backs)."""
    reviews: int
    """Review decisions taken so far (gives each review a stable id)."""
    exhausted: dict[str, str]
    """Stages that ended before their budget, with the reason (nothing new to try, critic gave up)."""
    selection: dict[str, Any]
    """Per stage, how the winner was chosen under noise: mean, spread and runs of each contender, the noise."""
    schedule: dict[str, Any]
    """Schedule stage: ``expanding`` (the node whose branches run now), ``expanded`` (ids), ``notes``, and at the
    end ``result`` (segments, scores, the tree as compact rows). The tree itself is in the ledger."""
    summary: dict[str, Any] | None
    """The session's final summary (``mart.nodes.stages.summary.build_summary``)."""


def running_trials(state: Mapping[str, Any], stage: str | None = None) -> list[RunningTrial]:
    """The trials in flight, in launch order (sequence), of one stage or all."""
    out = [RunningTrial.model_validate(r) if isinstance(r, dict) else r for r in (state.get("running") or {}).values()]
    return [r for r in out if stage is None or r.record.stage == stage]
