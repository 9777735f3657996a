"""Human review node: one ``interrupt`` per decision point; each candidate approved, edited or rejected with
feedback, or a question asked of the agents first.

A review covers the candidates picked for the free trial slots (one when trials run one at a time). The request
shows each candidate, its diff against the stage's current best, the proposer's rationale, the critic's
assessment and the job model's forecast, in mart's own fields and as LangChain's human-in-the-loop request
(``action_requests`` / ``review_configs``). The answer is a ``ReviewDecision`` (the interrupt's
``response_schema``: Studio renders it as a form, and LangGraph validates it before the node sees it): one
decision per candidate, or one for all. Edits are validated against the search space; an invalid answer, and a
question (``respond``), are answered by asking again (the node stays paused) rather than by failing the run.
Code before ``interrupt`` only reads (an answer to a question is computed once and kept in the ledger).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt
from pydantic import ValidationError

from mart.nodes import stages
from mart.nodes.agent_context import build_agent_context
from mart.nodes.agents.feedback import parse_feedback
from mart.nodes.runtime import Services, services_for
from mart.nodes.stages import StageView
from mart.state.graph_state import Batch, TuningState, running_trials
from mart.state.models import Candidate, CandidateDecision, ReviewDecision, TrialRecord, config_hash
from mart.state.search_space import ConfigError
from mart.state.units import fmt_gb

#: the decisions a reviewer may take on each candidate (LangChain HITL's decision types)
ALLOWED = ["approve", "edit", "reject", "respond"]
#: the action a candidate stands for in the HITL-shaped part of the request
ACTION = "run_trial"


def _rounded(value: Any, digits: int = 4) -> Any:
    """Floats in a payload meant for people, to ``digits`` significant digits (dicts and lists walked)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value


def prediction_text(cand: Candidate, record: list[dict[str, Any]]) -> str | None:
    """The job model's forecast for the reviewer, with its latest error: "predicted +18% tok/s, 70.1 GB;
    last error -3% tok/s, +0.4 GB" (None when the candidate carries no model prediction)."""
    if cand.predicted_throughput is None:
        return None
    parts = [f"predicted {cand.expected_gain or 0.0:+.0%} tok/s ({cand.predicted_throughput:.0f} tok/s/GPU)"]
    if cand.predicted_memory_gb is not None:
        parts[0] += f", {fmt_gb(cand.predicted_memory_gb)}"
    last = next((r for r in reversed(record) if r.get("throughput_error_pct") is not None
                 or r.get("peak_error_gb") is not None), None)
    if last is not None:
        errs = []
        if last.get("throughput_error_pct") is not None:
            errs.append(f"{last['throughput_error_pct']:+.0f}% tok/s")
        if last.get("peak_error_gb") is not None:
            errs.append(f"{last['peak_error_gb']:+.1f} GB")
        parts.append("last error " + ", ".join(errs) + f" ({last['trial_id']})")
    return "; ".join(parts)


def candidate_view(state: Mapping[str, Any], services: Any, cand: Candidate, critiques: list[Any],
                   prediction_record: list[dict[str, Any]]) -> dict[str, Any]:
    """One candidate as a reviewer sees it (JSON-friendly)."""
    stage = state["stage"]
    best = dict((state.get("best_overrides") or {}).get(stage, {}))
    base = stages.get(stage).base_config(StageView(state, services))
    current = {**base, **best}
    # the diff is for reading (0.7000000000000001 -> 0.7); "overrides" keeps the exact values that will run
    diff = [
        {"key": k, "current": _rounded(current.get(k), 6), "proposed": _rounded(v, 6)}
        for k, v in cand.overrides.items() if current.get(k) != v
    ] + [
        {"key": k, "current": _rounded(v, 6), "proposed": _rounded(base.get(k), 6)}
        for k, v in best.items() if k not in cand.overrides
    ]
    crit = next((c for c in critiques if c.candidate_id == cand.candidate_id), None)
    return {
        "candidate_id": cand.candidate_id,
        "overrides": cand.overrides,
        "diff": diff,
        "rationale": cand.rationale,
        "source": cand.source,
        "critique": _rounded(crit.model_dump(mode="json")) if crit else None,
        "predicted_memory_gb": _rounded(cand.predicted_memory_gb),
        "prediction": prediction_text(cand, prediction_record),
    }


def build_review_request(state: Mapping[str, Any], services: Any) -> dict[str, Any]:
    """The interrupt payload (JSON-friendly): what any reviewer channel shows."""
    batch: Batch = state["batch"]
    stage = state["stage"]
    profile = (state.get("profiles") or {}).get(stage)
    space = services.backend.search_space()
    record = services.ledger.prediction_record(services.run_id, stage)
    cands = [candidate_view(state, services, c, batch.critiques, record) for c in batch.picks]
    # how the rules read the reviewer's words, shown back so a misreading can be corrected at once
    feedback_read = parse_feedback(list(state.get("feedback") or []), space).describe(space)
    return {
        "kind": "mart_review",
        "run_id": services.run_id,
        "review_no": state.get("reviews", 0) + 1,
        "stage": stage,
        "candidates": cands,
        "running": [r.record.trial_id for r in running_trials(state)],
        "memory_limit_gb": _rounded(services.memory_limit_gb()),
        "bottleneck": profile.bottleneck if profile else None,
        "trials_done": (state.get("trials_done") or {}).get(stage, 0),
        "feedback_read": feedback_read,
        "allowed": list(ALLOWED),
        # the same request in LangChain's human-in-the-loop shape (Agent Chat UI, inbox-style clients)
        "action_requests": [{"name": ACTION, "args": {"candidate_id": c["candidate_id"], "overrides": c["overrides"]},
                             "description": c["rationale"]} for c in cands],
        "review_configs": [{"action_name": ACTION, "allowed_decisions": list(ALLOWED)}],
        **stages.get(stage).review_context(StageView(state, services)),
    }


def _short(e: Exception) -> str:
    """One line per problem, without pydantic's documentation links."""
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, err['loc'])) or 'answer'}: {err['msg']}" for err in e.errors())
    return str(e)


def apply_decision(decision: CandidateDecision, cand: Candidate, space, stage: str, base: dict[str, Any]) -> dict[str, Any]:
    """The overrides to run after one candidate's ``decision`` (raises ConfigError for an invalid edit)."""
    overrides = dict(cand.overrides)
    if decision.type == "edit":
        if not decision.edits:
            raise ConfigError(f"{cand.candidate_id}: an edit needs at least one KEY=VALUE")
        overrides.update(space.validate_overrides(space.resolve_keys(decision.edits), stage=stage))
        errors = space.check_constraints({**base, **overrides})
        if errors:
            raise ConfigError(f"{cand.candidate_id}: " + "; ".join(errors))
    return overrides


def check_decision(decision: ReviewDecision, picks: list[Candidate], space, stage: str, base: dict[str, Any]
                   ) -> dict[str, tuple[CandidateDecision, dict[str, Any]]]:
    """Each candidate's decision and the overrides it would run (``ValueError``/``ConfigError`` naming the
    problem: a candidate not in the review, one decided twice or not at all, an invalid edit)."""
    per = decision.for_candidates([c.candidate_id for c in picks])
    by_id = {c.candidate_id: c for c in picks}
    return {cid: (d, apply_decision(d, by_id[cid], space, stage, base)) for cid, d in per.items()}


def review_base(state: Mapping[str, Any], services: Any) -> dict[str, Any]:
    """The config a review's candidates and edits apply to: the stage policy's base config (the driver checks a
    decision against it before it reaches the graph, ``mart.graph.session.validate_decision``)."""
    return stages.get(state["stage"]).base_config(StageView(state, services))


def _answer(services: Any, state: Mapping[str, Any], review_id: str, n: int, cand: Candidate | None, question: str) -> str:
    """The agents' answer to a reviewer's question, computed once per question and kept in the ledger (the node
    runs again from its first line on every resume)."""
    key = f"{review_id}:q{n}"
    stored = services.ledger.review_answer(key)
    if stored is not None:
        return stored

    ctx = build_agent_context(state, services)
    text = services.proposer.answer(ctx, cand, question)
    services.ledger.set_review_answer(services.run_id, key, question, text)
    return text


def human_review(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["launch_trial", "proposer"]]:
    services = services_for(state, runtime)
    batch = state["batch"]
    assert batch is not None, "human_review runs only after the critic filled a batch"
    picks = list(batch.picks)
    stage = state["stage"]
    space = services.backend.search_space()
    base = review_base(state, services)
    request = build_review_request(state, services)
    reviews = state.get("reviews", 0) + 1
    review_id = f"review-{reviews:03d}"
    error = None
    answers: list[dict[str, Any]] = []
    while True:
        # the resume value is validated inside ``interrupt`` (Studio's form gets the schema): a bad answer
        # ("approve" as a bare string, an unknown action) is asked again in band instead of failing the run
        try:
            answer = interrupt({**request, "error": error, "answers": answers}, response_schema=ReviewDecision)
            decision = answer if isinstance(answer, ReviewDecision) else ReviewDecision.model_validate(answer)
            questions = [d for d in decision.decisions if d.type == "respond"]
            if questions:  # answer the questions, then ask again (nothing of this answer is applied)
                by_id = {c.candidate_id: c for c in picks}
                for d in questions:
                    cand = by_id.get(d.candidate_id) if d.candidate_id else (picks[0] if len(picks) == 1 else None)
                    text = _answer(services, state, review_id, len(answers) + 1, cand, d.message)
                    answers.append({"candidate_id": d.candidate_id, "question": d.message, "answer": text})
                error = None
                continue
            chosen = check_decision(decision, picks, space, stage, base)
            break
        except (ValidationError, ConfigError, ValueError) as e:
            error = f"invalid decision: {_short(e)}"  # ask again; the run stays paused at this review
    feedback = list(state.get("feedback") or [])
    queue = list(StageView(state, services).queued())
    seq = StageView(state, services).next_seq()
    for i, (cid, (d, overrides)) in enumerate(chosen.items()):
        rid = review_id if len(chosen) == 1 else f"{review_id}/{i + 1}"
        services.ledger.add_review(services.run_id, rid, cid, decision.model_copy(update={"decisions": [d]}),
                                   review_no=reviews)
        if d.type == "reject":
            note = d.message.strip() or "the reviewer rejected the candidate without a comment"
            # the reviewer's words only: rejected overrides are known from the ledger (AgentContext.rejected)
            feedback.append(f"reviewer on {cid}: {note}")
            continue
        config = {**base, **overrides}
        queue.append(TrialRecord(trial_id=f"{stage[:3]}-{seq:02d}-{config_hash(overrides)[:6]}", stage=stage,
                                 kind="candidate", candidate_id=cid, config=config))
        seq += 1
    if len(queue) == len(StageView(state, services).queued()):  # every candidate rejected: propose again
        return Command(goto="proposer", update={"reviews": reviews, "feedback": feedback,
                                                "batch": batch.model_copy(update={"picks": []})})
    return Command(goto="launch_trial", update={"reviews": reviews, "feedback": feedback, "queue": queue,
                                                "batch": None})
