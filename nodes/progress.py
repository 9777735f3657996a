"""Progress events of the tuning graph: one small model per kind, emitted by the nodes.

Each event goes to LangGraph's custom stream as plain JSON (``stream_mode="custom"``: Studio, SDK clients;
``parse_event`` reads it back) and, typed, to the session's own sink (``Services.progress``: the CLI's
console, whose formatter per kind lives in ``mart.graph.progress_console``). Progress is best-effort: it never
fails a node.
"""

from __future__ import annotations

import importlib
import logging
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from mart.state.stages import StageName

_log = logging.getLogger("mart.progress")


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TrialLaunched(_Event):
    event: Literal["trial_launched"] = "trial_launched"
    trial_id: str
    stage: StageName
    kind: str
    """``baseline``, ``candidate`` or ``confirm`` (a re-run on another seed)."""
    horizon: int
    changes: list[str] = []
    """What the trial changes against the stage's current best, e.g. ``micro_batch 16→32``."""
    slot: int = 0
    """The trial slot it runs in (0 .. slots-1)."""
    slots: int = 1
    """How many trials the session runs at once."""
    candidate_id: str | None = None
    """The reviewed candidate it runs (the id the proposer, the critic and the review named)."""
    rerun_of: str | None = None
    """A re-run: the trial whose config it runs again (a confirmation on another seed, the baseline once more)."""
    seed: int | None = None
    """A re-run's seed (None: the session's)."""

    def what(self) -> str:
        """What the trial runs, as every channel says it: the candidate the critic picked and the review approved
        with its changes, or the trial it runs again (a re-run is not a change against the current best)."""
        if self.rerun_of:
            return (f"re-run of {self.rerun_of}" + (f" on another seed ({self.seed})" if self.seed is not None else "")
                    + (", to confirm it" if self.kind == "confirm" else ""))
        what = ", ".join(self.changes) if self.changes else self.kind
        return f"candidate {self.candidate_id}: {what}" if self.candidate_id else what


class TrialReattached(_Event):
    """A trial the ledger already knows (a resumed session) is followed again, not relaunched."""

    event: Literal["trial_reattached"] = "trial_reattached"
    trial_id: str


class TrialQueued(_Event):
    """A launched trial waits for its resources (a Ray job held PENDING until a node is free): not failed."""

    event: Literal["trial_queued"] = "trial_queued"
    trial_id: str
    reason: str
    """What it waits for, as its runner says (``TrialPoll.queued``)."""


class TrialStarted(_Event):
    """A queued trial got its resources and runs."""

    event: Literal["trial_started"] = "trial_started"
    trial_id: str
    waited_s: float


class TrialFailed(_Event):
    """The trial could not be launched."""

    event: Literal["trial_failed"] = "trial_failed"
    trial_id: str
    reason: str


class TrialStep(_Event):
    """One new metric line of the running trial (None: the trial does not report that metric)."""

    event: Literal["trial_step"] = "trial_step"
    trial_id: str
    stage: StageName
    step: int
    throughput: float | None = None
    memory_gb: float | None = None
    reward: float | None = None
    entropy: float | None = None
    val_score: float | None = None


class HealthNotice(_Event):
    event: Literal["health"] = "health"
    trial_id: str
    rule: str
    severity: Literal["warn", "stop"]
    message: str


class TrialStopped(_Event):
    event: Literal["trial_stopped"] = "trial_stopped"
    trial_id: str
    reason: str
    status: str


class TrialDone(_Event):
    """A trial was collected: its final status and objective, and whether it may become the stage's best."""

    event: Literal["trial_done"] = "trial_done"
    trial_id: str
    status: str
    reason: str | None = None
    throughput: float | None = None
    score: float | None = None
    peak_memory_gb: float | None = None
    eligible: bool
    best_before: float | None = None
    """The stage's best objective before this trial (to say how it compares)."""
    compared_to: str = "best"
    """What ``best_before`` is: the stage's best, or (a schedule branch) the unchanged continuation."""


class ProposedCandidate(_Event):
    id: str
    overrides: dict[str, Any]


class Proposed(_Event):
    event: Literal["proposed"] = "proposed"
    stage: StageName
    round: int
    candidates: list[ProposedCandidate]
    slots: int = 1
    """How many trials this decision point may start (free slots)."""


class CritiqueDone(_Event):
    event: Literal["critique"] = "critique"
    pick: str | None = None
    picks: list[str] = Field(default_factory=list)
    """A batch's picks (``pick`` first)."""
    feedback: str = ""
    accepted: list[str] = Field(default_factory=list)


class SessionNote(_Event):
    """Something about the session as a whole (e.g. fewer trial slots than asked for, and why)."""

    event: Literal["note"] = "note"
    message: str


#: every kind of progress event, discriminated by its ``event`` field
ProgressEvent = Annotated[
    Union[TrialLaunched, TrialReattached, TrialQueued, TrialStarted, TrialFailed, TrialStep, HealthNotice, TrialStopped,
          TrialDone, Proposed, CritiqueDone, SessionNote],
    Field(discriminator="event"),
]
EVENT_TYPES: tuple[type[_Event], ...] = (TrialLaunched, TrialReattached, TrialQueued, TrialStarted, TrialFailed,
                                         TrialStep, HealthNotice, TrialStopped, TrialDone, Proposed, CritiqueDone,
                                         SessionNote)
_ADAPTER: TypeAdapter[ProgressEvent] = TypeAdapter(ProgressEvent)


def parse_event(data: dict[str, Any]) -> ProgressEvent:
    """An event from its JSON form (as written to the custom stream); ValidationError if it is none."""
    return _ADAPTER.validate_python(data)


def emit(services: Any, event: ProgressEvent) -> None:
    """Send ``event`` to LangGraph's custom stream (as JSON) and to the session's sink (typed)."""
    try:
        # imported here: langgraph.config pulls in LangChain (1.5 s), which the CLI's refusals and `mart status`,
        # which import these event types, need not pay; a node that emits runs in a graph, which loaded it already
        importlib.import_module("langgraph.config").get_stream_writer()(event.model_dump(mode="json"))
    except Exception:  # outside a streamed run there is no writer; progress is best-effort
        pass
    if services.progress is not None:
        try:
            services.progress(event)
        except Exception as e:  # noqa: BLE001 - a failing display (a Slack post, a closed pipe) must not fail the run
            _log.warning("progress output failed (%s: %s); the session goes on", type(e).__name__, e)


__all__ = ["EVENT_TYPES", "CritiqueDone", "HealthNotice", "ProgressEvent", "Proposed", "ProposedCandidate", "SessionNote",
           "TrialDone", "TrialFailed", "TrialLaunched", "TrialQueued", "TrialReattached", "TrialStarted", "TrialStep",
           "TrialStopped", "emit", "parse_event"]
