"""Critic node: checks the candidates (constraints, memory model, duplicates) and picks one per free slot, or
sends the proposer back."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.agent_context import build_agent_context
from mart.nodes.agents.base import verdict_picks
from mart.nodes.agents.batch import select_batch
from mart.nodes.progress import CritiqueDone, emit
from mart.nodes.proposer import decision_slot
from mart.nodes.runtime import Services, services_for
from mart.nodes.stages import StageView
from mart.nodes.stages._base import give_up
from mart.state.graph_state import Batch, TuningState


def critic(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["human_review", "proposer", "stage_control"]]:
    services = services_for(state, runtime)
    batch = state.get("batch") or Batch()
    ctx = build_agent_context(state, services, slots=batch.want)
    candidates = batch.candidates
    verdict = services.critic.critique(ctx, candidates)
    by_id = {c.candidate_id: c for c in candidates}
    accepted = {c.candidate_id: c for c in verdict.critiques if c.accepted and c.candidate_id in by_id}
    unknown = [p for p in verdict_picks(verdict) if p not in by_id]
    picks = [p for p in verdict_picks(verdict) if p in by_id][: batch.want]
    if unknown and not picks:
        verdict = verdict.model_copy(update={"pick": None, "feedback": f"critic picked unknown id {unknown[0]}"})
    if picks and len(picks) < batch.want:
        # a critic that picks one (the LLM's) leaves the other slots to the ranking of what it accepted
        rest = [(cid, c.score, ctx.full_config(by_id[cid].overrides)) for cid, c in accepted.items() if cid not in picks]
        anchors = [t.config for t in ctx.pending] + [ctx.full_config(by_id[p].overrides) for p in picks]
        picks += select_batch(sorted(rest, key=lambda r: -r[1]), batch.want - len(picks), anchors)
    stage, rnd = state["stage"], state.get("round", 0)
    slot = decision_slot(state, services)
    services.ledger.add_critiques(services.run_id, verdict.critiques, picks)
    services.ledger.add_agent_calls(services.run_id, f"{stage}-{slot}-{rnd}-critic", services.critic.last_calls())
    emit(services, CritiqueDone(pick=picks[0] if picks else None, picks=picks, feedback=verdict.feedback or "",
                                accepted=[c.candidate_id for c in verdict.critiques if c.accepted]))
    update = {"batch": batch.model_copy(update={"critiques": verdict.critiques})}
    if picks:
        crits = {c.candidate_id: c for c in verdict.critiques}
        chosen = [by_id[p].model_copy(update={"predicted_memory_gb": crits[p].predicted_memory_gb if p in crits
                                              else by_id[p].predicted_memory_gb}) for p in picks]
        return Command(goto="human_review", update={"batch": update["batch"].model_copy(update={"picks": chosen})})
    if rnd <= services.options.max_revision_rounds:
        return Command(goto="proposer", update={**update, "feedback": [*(state.get("feedback") or []), f"critic: {verdict.feedback}"]})
    last = (verdict.feedback or "").removeprefix("rejected every candidate").lstrip(": ")
    reason = f"the critic rejected every candidate for {rnd} rounds" + (f" (last round: {last})" if last else "")
    return Command(goto="stage_control", update=give_up(StageView(state, services), stage, reason))
