"""Proposer node: asks the proposer strategy (rules or llm) for candidates for the free trial slots."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.agent_context import build_agent_context
from mart.nodes.progress import Proposed, ProposedCandidate, emit
from mart.nodes.runtime import Services, services_for
from mart.nodes.stages import StageView
from mart.nodes.stages._base import give_up
from mart.state.graph_state import Batch, TuningState


def decision_slot(state: TuningState, services: Services) -> int:
    """The stage's decision point: trials of the stage started so far (ids stay stable across a crash)."""
    return StageView(state, services).launched(state["stage"])


def proposer(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["critic", "stage_control"]]:
    services = services_for(state, runtime)
    batch = state.get("batch") or Batch()
    ctx = build_agent_context(state, services, slots=batch.want)
    raw = services.proposer.propose(ctx)
    stage, rnd = state["stage"], state.get("round", 0)
    slot = decision_slot(state, services)
    # ids are deterministic (stage, slot, round, index), so a re-run after a crash overwrites its own rows
    candidates = [
        c.model_copy(update={"candidate_id": f"{stage[:3]}-{slot:02d}-r{rnd}-c{i}", "stage": stage})
        for i, c in enumerate(raw)
    ]
    services.ledger.add_proposals(services.run_id, rnd, candidates)
    services.ledger.add_agent_calls(services.run_id, f"{stage}-{slot}-{rnd}-proposer", services.proposer.last_calls())
    emit(services, Proposed(stage=stage, round=rnd, slots=batch.want, candidates=[
        ProposedCandidate(id=c.candidate_id, overrides=c.overrides) for c in candidates]))
    if not candidates:
        reason = "the proposer found no untried candidate" + (
            f" that follows the feedback ({'; '.join(state.get('feedback') or [])})" if state.get("feedback") else "")
        return Command(goto="stage_control", update=give_up(StageView(state, services), stage, reason))
    return Command(goto="critic", update={"batch": batch.model_copy(update={"candidates": candidates, "critiques": [],
                                                                            "picks": []}), "round": rnd + 1})
