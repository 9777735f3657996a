"""Human review node: one ``interrupt`` per decision; approve, edit or reject with feedback.

The reviewer sees the candidate, its diff against the stage's current best, the proposer's rationale and
the critic's assessment. Edits are validated against the search space; an invalid edit is answered by
asking again (the node stays paused) rather than by failing the run. Code before ``interrupt`` only reads.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt
from pydantic import ValidationError

from mart.nodes.agents.feedback import parse_feedback
from mart.nodes.runtime import Services, services_for
from mart.nodes.stage_control import knob_stage, stage_base_config
from mart.state.graph_state import TuningState
from mart.state.models import Candidate, ReviewDecision, TrialRecord, config_hash
from mart.state.search_space import ConfigError


def build_review_request(state: dict[str, Any], services) -> dict[str, Any]:
    """The interrupt payload (JSON-friendly): what any reviewer channel shows."""
    cand: Candidate = state["selected"]
    stage = state["stage"]
    best = dict((state.get("best_overrides") or {}).get(stage, {}))
    base = stage_base_config(state, services, stage)
    current = {**base, **best}
    # the diff is for reading (0.7000000000000001 -> 0.7); "overrides" keeps the exact values that will run
    diff = [
        {"key": k, "current": _rounded(current.get(k), 6), "proposed": _rounded(v, 6)}
        for k, v in cand.overrides.items() if current.get(k) != v
    ] + [
        {"key": k, "current": _rounded(v, 6), "proposed": _rounded(base.get(k), 6)}
        for k, v in best.items() if k not in cand.overrides
    ]
    crit = next((c for c in state.get("critiques") or [] if c.candidate_id == cand.candidate_id), None)
    profile = (state.get("profiles") or {}).get(stage)
    space = services.backend.search_space()
    # how the rules read the reviewer's words, shown back so a misreading can be corrected at once
    feedback_read = parse_feedback(list(state.get("feedback") or []), space).describe(space)
    return {
        "kind": "mart_review",
        "run_id": services.run_id,
        "review_no": state.get("reviews", 0) + 1,
        "stage": stage,
        "candidate_id": cand.candidate_id,
        "overrides": cand.overrides,
        "diff": diff,
        "rationale": cand.rationale,
        "source": cand.source,
        "critique": _rounded(crit.model_dump(mode="json")) if crit else None,
        "predicted_memory_gb": _rounded(cand.predicted_memory_gb),
        "prediction": prediction_text(cand, services.ledger.prediction_record(services.run_id, stage)),
        "memory_limit_gb": _rounded(services.memory_limit_gb()),
        "bottleneck": profile.bottleneck if profile else None,
        "trials_done": (state.get("trials_done") or {}).get(stage, 0),
        "feedback_read": feedback_read,
        "allowed": ["approve", "edit", "reject"],
        **_segment(state, services),
    }


def _rounded(value: Any, digits: int = 4) -> Any:
    """Floats in a payload meant for people, to ``digits`` significant digits (dicts and lists walked)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value


def _segment(state: dict[str, Any], services) -> dict[str, Any]:
    """Schedule stage: the checkpoint the branch starts from and the segment it trains (for the reviewer)."""
    if state["stage"] != "schedule":
        return {}
    from mart.nodes.schedule_stage import schedule_state

    parent = schedule_state(state)["expanding"]
    row = services.ledger.trial(parent) if parent else None
    if row is None:
        return {}
    step = int(row.get("horizon") or 0)
    nxt = next((b for b in services.options.schedule_boundaries() if b > step), step)
    return {"parent_trial": parent, "segment": [step, nxt]}


def _short(e: Exception) -> str:
    """One line per problem, without pydantic's documentation links."""
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, err['loc'])) or 'answer'}: {err['msg']}" for err in e.errors())
    return str(e)


def prediction_text(cand: Candidate, record: list[dict[str, Any]]) -> str | None:
    """The job model's forecast for the reviewer, with its latest error: "predicted +18% tok/s, 70.1 GB;
    last error -3% tok/s, +0.4 GB" (None when the candidate carries no model prediction)."""
    if cand.predicted_throughput is None:
        return None
    parts = [f"predicted {cand.expected_gain or 0.0:+.0%} tok/s ({cand.predicted_throughput:.0f} tok/s/GPU)"]
    if cand.predicted_memory_gb is not None:
        parts[0] += f", {cand.predicted_memory_gb:.1f} GB"
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


def apply_decision(decision: ReviewDecision, cand: Candidate, space, stage: str, base: dict[str, Any]) -> dict[str, Any]:
    """The overrides to run after ``decision`` (raises ConfigError for an invalid edit)."""
    overrides = dict(cand.overrides)
    if decision.action == "edit":
        if not decision.edits:
            raise ConfigError("an edit needs at least one KEY=VALUE")
        overrides.update(space.validate_overrides(space.resolve_keys(decision.edits), stage=stage))
        errors = space.check_constraints({**base, **overrides})
        if errors:
            raise ConfigError("; ".join(errors))
    return overrides


def human_review(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["launch_trial", "proposer"]]:
    services = services_for(state, runtime)
    cand: Candidate = state["selected"]
    stage = state["stage"]
    space = services.backend.search_space()
    base = stage_base_config(state, services, stage)
    request = build_review_request(state, services)
    error = None
    while True:
        try:
            # the resume value is validated inside ``interrupt`` (Studio's form gets the schema): a bad answer
            # ("approve" as a bare string, an unknown action) is asked again in band instead of failing the run
            answer = interrupt({**request, "error": error}, response_schema=ReviewDecision)
            decision = answer if isinstance(answer, ReviewDecision) else ReviewDecision.model_validate(answer)
            overrides = apply_decision(decision, cand, space, knob_stage(stage), base)
            break
        except (ValidationError, ConfigError) as e:
            error = f"invalid decision: {_short(e)}"  # ask again; the run stays paused at this review
    reviews = state.get("reviews", 0) + 1
    services.ledger.add_review(services.run_id, f"review-{reviews:03d}", cand.candidate_id, decision)
    if decision.action == "reject":
        note = decision.feedback.strip() or "the reviewer rejected the candidate without a comment"
        # the reviewer's words only: rejected overrides are known from the ledger (AgentContext.rejected)
        feedback = [*(state.get("feedback") or []), f"reviewer on {cand.candidate_id}: {note}"]
        return Command(goto="proposer", update={"reviews": reviews, "feedback": feedback, "selected": None})
    seq = state.get("trial_seq", 0) + 1
    config = {**base, **overrides}
    record = TrialRecord(
        trial_id=f"{stage[:3]}-{seq:02d}-{config_hash(overrides)[:6]}", stage=stage, kind="candidate",
        candidate_id=cand.candidate_id, config=config,
    )
    selected = cand.model_copy(update={"overrides": overrides, "source": "reviewer-edit"}) if decision.action == "edit" else cand
    return Command(goto="launch_trial", update={"reviews": reviews, "pending_trial": record, "selected": selected})
