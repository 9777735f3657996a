"""Critic node: checks the candidates (constraints, memory model, duplicates), picks one or sends back."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.agent_context import build_agent_context
from mart.nodes.progress import CritiqueDone, emit
from mart.nodes.runtime import Services, services_for
from mart.state.graph_state import TuningState


def critic(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["human_review", "proposer", "stage_control"]]:
    services = services_for(state, runtime)
    ctx = build_agent_context(state, services)
    candidates = state.get("candidates") or []
    verdict = services.critic.critique(ctx, candidates)
    by_id = {c.candidate_id: c for c in candidates}
    if verdict.pick is not None and verdict.pick not in by_id:
        verdict = verdict.model_copy(update={"pick": None, "feedback": f"critic picked unknown id {verdict.pick}"})
    stage, rnd = state["stage"], state.get("round", 0)
    slot = (state.get("trials_done") or {}).get(stage, 0)
    services.ledger.add_critiques(services.run_id, verdict.critiques, verdict.pick)
    services.ledger.add_agent_calls(services.run_id, f"{stage}-{slot}-{rnd}-critic", services.critic.last_calls())
    emit(services, CritiqueDone(pick=verdict.pick, feedback=verdict.feedback or "",
                                accepted=[c.candidate_id for c in verdict.critiques if c.accepted]))
    update = {"critiques": verdict.critiques}
    if verdict.pick is not None:
        crit = next(c for c in verdict.critiques if c.candidate_id == verdict.pick)
        chosen = by_id[verdict.pick].model_copy(update={"predicted_memory_gb": crit.predicted_memory_gb})
        return Command(goto="human_review", update={**update, "selected": chosen})
    if rnd <= services.options.max_revision_rounds:
        return Command(goto="proposer", update={**update, "feedback": [*(state.get("feedback") or []), f"critic: {verdict.feedback}"]})
    last = (verdict.feedback or "").removeprefix("rejected every candidate").lstrip(": ")
    reason = f"the critic rejected every candidate for {rnd} rounds" + (f" (last round: {last})" if last else "")
    return Command(goto="stage_control", update={**update, "exhausted": {**(state.get("exhausted") or {}), stage: reason}})
