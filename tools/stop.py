"""Stop tool node: ends the active trial (SIGTERM, grace, SIGKILL or the backend's equivalent)."""

from __future__ import annotations

from typing import Literal

from langgraph.types import Command

from mart.nodes.progress import emit
from mart.nodes.runtime import services_for
from mart.state.trials import TrialHandle


def stop_trial(state, runtime) -> Command[Literal["collect_trial"]]:
    services = services_for(state, runtime)
    handle = TrialHandle(**state["active"])
    reason = state.get("stop_reason") or "stopped by mart"
    poll = services.runner.stop(handle, reason=reason)
    emit(services, {"event": "trial_stopped", "trial_id": handle.trial_id, "reason": reason,
                    "status": poll.status.value})
    return Command(goto="collect_trial", update={"trial_finished": True})
