"""Stop tool node: ends the active trial (SIGTERM, grace, SIGKILL or the backend's equivalent)."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.progress import TrialStopped, emit
from mart.nodes.runtime import Services, services_for
from mart.state.graph_state import TuningState, active_handle


def stop_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["collect_trial"]]:
    services = services_for(state, runtime)
    handle = active_handle(state)
    assert handle is not None, "stop_trial runs only while a trial is active"
    reason = state.get("stop_reason") or "stopped by mart"
    poll = services.runner.stop(handle, reason=reason)
    emit(services, TrialStopped(trial_id=handle.trial_id, reason=reason, status=poll.status.value))
    return Command(goto="collect_trial", update={"trial_finished": True})
