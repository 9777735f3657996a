"""Stop tool node: ends the trials the watcher marked (SIGTERM, grace, SIGKILL or the backend's equivalent)."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.progress import TrialStopped, emit
from mart.nodes.runtime import Services, services_for
from mart.state.graph_state import TuningState, running_trials
from mart.state.trial_state import TrialState


def stop_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["collect_trial"]]:
    services = services_for(state, runtime)
    running = {}
    for rt in running_trials(state):
        if rt.state is TrialState.STOP_REQUESTED and rt.handle is not None:
            poll = services.runner.stop(rt.handle, reason=rt.stop_reason)
            emit(services, TrialStopped(trial_id=rt.record.trial_id, reason=rt.stop_reason, status=poll.status.value))
            rt = rt.move(TrialState.FINISHED)
        running[rt.record.trial_id] = rt
    return Command(goto="collect_trial", update={"running": running})
