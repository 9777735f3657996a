"""The tuning graph's state: small on purpose (ids, stage, budgets, current candidate, summaries).

Metric streams, logs and full histories live in the ledger; SqliteSaver stores every channel in every
checkpoint, so a field that grows here costs its size at every step. All fields are replaced wholesale
by the nodes (no accumulating reducers).
"""

from __future__ import annotations

from typing import Any, Literal

from typing_extensions import TypedDict  # pydantic (Studio's schema endpoint) needs it on Python < 3.12

from mart.state.models import Candidate, Critique, Profile, Stage, TrialRecord
from mart.state.trials import TrialHandle


class InputState(TypedDict, total=False):
    """What a caller provides to start a session (the CLI, the Python API, or LangGraph Studio)."""

    options: dict[str, Any]
    """``graph.context.TuneOptions`` as a dict: backend, budgets, horizons, margin, approval, agents, seed."""
    run_id: str
    """Id of the run (the run directory's name). Studio runs get one on their first step."""
    run_dir: str
    """Absolute path of the run directory (ledger, trial dirs)."""


class TuningState(InputState, total=False):
    """Full state of a tuning session."""

    stage: Stage
    """The stage being tuned: ``system`` (throughput), ``learning`` (validation score), ``schedule`` (per-segment
    learning knobs; see ``mart.nodes.schedule_stage``)."""
    status: Literal["running", "completed", "failed"]
    started_at: float
    """Wall-clock start of the session (for the optional wall-clock budget)."""
    trial_seq: int
    """Number of trials launched so far in the run (gives each trial its sequence number)."""
    trials_done: dict[str, int]
    """Finished trials per stage, the baseline included (budgets count these)."""
    profiles: dict[str, Profile]
    """Phase-wise profile of each stage's baseline."""
    baseline: dict[str, TrialRecord]
    """The baseline trial of each stage."""
    best: dict[str, TrialRecord]
    """The best feasible trial of each stage so far (starts as the baseline)."""
    best_overrides: dict[str, dict[str, Any]]
    """Overrides of each stage's best trial relative to that stage's base config."""
    candidates: list[Candidate]
    """The current proposal round's candidates."""
    critiques: list[Critique]
    """The critic's verdicts on ``candidates``."""
    selected: Candidate | None
    """The candidate the critic picked, awaiting review."""
    feedback: list[str]
    """Reviewer feedback and critic reasons for the proposer's next round (cleared when a trial runs)."""
    round: int
    """Proposal rounds since the last trial (bounded by ``max_revision_rounds`` for critic send-backs)."""
    reviews: int
    """Review decisions taken so far (gives each review a stable id)."""
    pending_trial: TrialRecord | None
    """The trial to launch or being run (baseline or approved candidate)."""
    active: TrialHandle | None
    """The running trial's handle (re-attached after a restart); read it with ``active_handle``."""
    trial_finished: bool
    stop_reason: str | None
    """Set by the health monitor when the active trial must be stopped."""
    exhausted: dict[str, str]
    selection: dict[str, Any]
    """Per stage, how the winner was chosen under noise: mean, spread and runs of each contender, the noise."""
    """Stages that ended before their budget, with the reason (nothing new to try, critic gave up)."""
    schedule: dict[str, Any]
    """Schedule stage: ``expanding`` (the node whose branches run now), ``expanded`` (ids), ``notes``, and at the
    end ``result`` (segments, scores, the tree as compact rows). The tree itself is in the ledger."""
    last_trial: TrialRecord | None
    summary: dict[str, Any] | None
    """The session's final summary (see ``mart.nodes.stage_control.build_summary``)."""


def active_handle(state: TuningState) -> TrialHandle | None:
    """The running trial's handle. Checkpoints written before handles were kept as models hold a dict."""
    value = state.get("active")
    if value is None or isinstance(value, TrialHandle):
        return value
    return TrialHandle.model_validate(value)
