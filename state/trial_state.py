"""A trial's life in a session as one state machine: its states and the moves allowed between them, in one place
(in the spirit of Optuna's ``TrialState``).

::

    QUEUED ──> LAUNCHING ──> RUNNING <──> WAITING          (WAITING: launched, held for its resources)
                   │            │  └──> LOOKED              (the stage's early look was taken; it runs on)
                   │            └─────────┴──> STOP_REQUESTED ──> FINISHED ──> COLLECTED
                   └──────────────────────────────────────────────> FINISHED   (a launch that failed)

    RUNNING, WAITING and LOOKED may also go straight to FINISHED (the trial ended by itself).

Where each state lives: a ``QUEUED`` trial is a ``TrialRecord`` in the graph's queue; from ``LAUNCHING`` to
``FINISHED`` it is a ``RunningTrial`` in the graph's ``running`` map, whose fields say which (``RunningTrial.state``;
``WAITING`` is the watch's, kept in the ledger row as ``waiting_since``/``running_at``); ``COLLECTED`` is its
final ledger row. Every change of a ``RunningTrial``'s state goes through ``RunningTrial.move``, which refuses a
move the table does not allow (``IllegalTransition``): a stop requested for a trial that already finished, a
look at a trial being stopped, a collect of one still running.
"""

from __future__ import annotations

import enum


class TrialState(str, enum.Enum):
    QUEUED = "queued"
    """Decided (approved, or started by the stage without review), waiting for a free slot."""
    LAUNCHING = "launching"
    """Recorded in the ledger, its handle not yet known (the launch window; a launch that failed ends here)."""
    WAITING = "waiting"
    """Launched and held for its resources (``TrialPoll.queued``: a Ray job PENDING): no step, no clock."""
    RUNNING = "running"
    """Launched with a handle; training."""
    LOOKED = "looked"
    """Running, and the stage has taken its early look (``RunningTrial.look_at``)."""
    STOP_REQUESTED = "stop_requested"
    """Must be stopped (the health monitor, the watchdog, the stage's cut): the stop node ends it."""
    FINISHED = "finished"
    """Ended (by itself, stopped, or its launch failed): the collect node reads its result next."""
    COLLECTED = "collected"
    """Its result is in the ledger; it left the graph's running trials."""


_S = TrialState

#: the moves allowed from each state (a state absent as a key is final)
TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    _S.QUEUED: frozenset({_S.LAUNCHING}),
    _S.LAUNCHING: frozenset({_S.RUNNING, _S.FINISHED}),
    _S.WAITING: frozenset({_S.RUNNING, _S.STOP_REQUESTED, _S.FINISHED}),
    _S.RUNNING: frozenset({_S.WAITING, _S.LOOKED, _S.STOP_REQUESTED, _S.FINISHED}),
    _S.LOOKED: frozenset({_S.STOP_REQUESTED, _S.FINISHED}),
    _S.STOP_REQUESTED: frozenset({_S.FINISHED}),
    _S.FINISHED: frozenset({_S.COLLECTED}),
}

#: the states of a trial in the graph's running map (launched or being launched, not collected)
IN_FLIGHT = frozenset({_S.LAUNCHING, _S.WAITING, _S.RUNNING, _S.LOOKED, _S.STOP_REQUESTED, _S.FINISHED})
#: the states of a trial that trains on its own (a watch follows it)
ALIVE = frozenset({_S.WAITING, _S.RUNNING, _S.LOOKED})


class IllegalTransition(ValueError):
    """A move the trial state machine does not allow."""


def allowed(frm: TrialState, to: TrialState) -> bool:
    return to in TRANSITIONS.get(frm, frozenset())


def check_transition(frm: TrialState, to: TrialState, trial_id: str = "") -> TrialState:
    """``to`` if a trial in ``frm`` may move there, else ``IllegalTransition`` naming both."""
    if not allowed(frm, to):
        who = f"trial {trial_id}: " if trial_id else ""
        raise IllegalTransition(f"{who}no move from {frm.value} to {to.value}; from {frm.value}: "
                                + (", ".join(sorted(s.value for s in TRANSITIONS.get(frm, ()))) or "none (final)"))
    return to
