"""The trial state machine (``mart.state.trial_state``): the moves a trial in flight may make, and the ones it may not."""

import pytest

from mart.state.models import TrialRecord
from mart.state.trial_state import (
    ALIVE,
    TRANSITIONS,
    IllegalTransition,
    TrialState,
    allowed,
    check_transition,
)
from mart.state.trials import RunningTrial, TrialHandle

S = TrialState
RECORD = TrialRecord(trial_id="sys-01-baseline", stage="system", kind="baseline")
HANDLE = TrialHandle(trial_id="sys-01-baseline", backend="toy", trial_dir="/tmp/t", pid=1)


def launching() -> RunningTrial:
    return RunningTrial(record=RECORD, slot=0)


def test_a_trial_lives_launch_run_look_stop_finish():
    rt = launching()
    assert rt.state is S.LAUNCHING
    rt = rt.move(S.RUNNING, handle=HANDLE)
    assert rt.state is S.RUNNING and rt.handle == HANDLE
    rt = rt.move(S.LOOKED)
    assert rt.state is S.LOOKED and rt.looked
    rt = rt.move(S.STOP_REQUESTED, reason="health: entropy collapse")
    assert rt.state is S.STOP_REQUESTED and rt.stop_reason == "health: entropy collapse"
    rt = rt.move(S.FINISHED)
    assert rt.state is S.FINISHED and rt.finished and rt.stop_reason == "health: entropy collapse"
    check_transition(rt.state, S.COLLECTED)


def test_a_failed_launch_finishes_without_running():
    rt = launching().move(S.FINISHED)
    assert rt.state is S.FINISHED and rt.handle is None


@pytest.mark.parametrize("frm,to", [
    (S.FINISHED, S.STOP_REQUESTED),   # a stop requested for a trial that already ended
    (S.STOP_REQUESTED, S.LOOKED),     # a look at a trial being stopped
    (S.RUNNING, S.COLLECTED),         # collected while it runs
    (S.LOOKED, S.LOOKED),             # looked at twice
    (S.QUEUED, S.RUNNING),            # running without a launch
    (S.COLLECTED, S.RUNNING),         # collected is final
])
def test_an_illegal_transition_raises(frm, to):
    assert not allowed(frm, to)
    with pytest.raises(IllegalTransition, match=f"from {frm.value} to {to.value}"):
        check_transition(frm, to, "t1")


def test_running_trial_refuses_illegal_moves():
    finished = launching().move(S.RUNNING, handle=HANDLE).move(S.FINISHED)
    with pytest.raises(IllegalTransition):
        finished.move(S.STOP_REQUESTED, reason="health: too late")
    stopping = launching().move(S.RUNNING, handle=HANDLE).move(S.STOP_REQUESTED, reason="watchdog: no step")
    with pytest.raises(IllegalTransition):
        stopping.move(S.LOOKED)
    with pytest.raises(IllegalTransition, match="reason"):
        launching().move(S.RUNNING, handle=HANDLE).move(S.STOP_REQUESTED)
    with pytest.raises(IllegalTransition, match="handle"):
        launching().move(S.RUNNING)


def test_the_table_reaches_every_state_and_collected_is_final():
    reached = {S.QUEUED} | {to for tos in TRANSITIONS.values() for to in tos}
    assert reached == set(S)
    assert S.COLLECTED not in TRANSITIONS
    assert ALIVE == {S.WAITING, S.RUNNING, S.LOOKED}
