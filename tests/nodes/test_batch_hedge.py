"""A batch of stage-1 picks spends one slot on a hedge across the job model's memory gap (``nodes/agents/rules.py``,
``model_search.search(hedges=True)``); a decision for one slot never does."""

from __future__ import annotations

import dataclasses

from mart.nodes.agents.job_model import JobModel
from mart.nodes.agents.model_search import search
from mart.nodes.agents.rules import RulesCritic, RulesProposer
from mart.trial_runner.verl.space import SEARCH_SPACE
from tests.nodes.test_job_model import _check, _ctx
from tests.support.jobs import base_config, job


def _priors(memory_gb: float) -> tuple[JobModel, float]:
    """The job model before any trial (its gap is widest there) and the stage's limit."""
    return JobModel(job(memory_gb), base_config()).fit([]), 0.9 * memory_gb


def _decide(model: JobModel, limit: float, slots: int):
    ctx = dataclasses.replace(_ctx(model, "system", limit), slots=slots, num_candidates=3 * slots)
    cands = [c.model_copy(update={"candidate_id": f"c{i}"}) for i, c in enumerate(RulesProposer().propose(ctx))]
    verdict = RulesCritic().critique(ctx, cands)
    by_id = {c.candidate_id: c for c in cands}
    return cands, [by_id[p] for p in verdict.picks or [verdict.pick]]


def _is_hedge(model: JobModel, limit: float, overrides: dict) -> bool:
    p = model.predict({**base_config(), **overrides})
    return limit - p.gap_gb < p.peak_gb <= limit


def test_the_hedge_search_returns_only_configs_the_safety_gap_alone_rules_out():
    model, limit = _priors(40.0)
    safe = search(model, SEARCH_SPACE, base_config(), limit, check=_check)
    hedges = search(model, SEARCH_SPACE, base_config(), limit, check=_check, hedges=True)
    assert safe and hedges
    assert all(s.peak_gb <= limit - s.gap_gb for s in safe)
    assert all(limit - h.gap_gb < h.peak_gb <= limit and 0.02 < h.p_over <= 0.5 for h in hedges)
    # the gap rules them out, and they are what the safe search would take without it: faster on the model's word
    assert max(h.throughput for h in hedges) > max(s.throughput for s in safe)


def test_a_batch_takes_one_hedge_beside_its_safe_picks_and_a_single_slot_takes_none():
    model, limit = _priors(40.0)
    cands, picks = _decide(model, limit, slots=3)
    offered = [c for c in cands if "A hedge" in c.rationale]
    assert offered and all(_is_hedge(model, limit, c.overrides) for c in offered)
    hedged = [c for c in picks if _is_hedge(model, limit, c.overrides)]
    assert len(picks) == 3 and len(hedged) == 1  # one hedge, the other slots safe
    safe_best = max(model.predict({**base_config(), **c.overrides}).throughput for c in picks if c not in hedged)
    assert model.predict({**base_config(), **hedged[0].overrides}).throughput > safe_best
    assert "P(over the limit)" in hedged[0].rationale  # the reviewer sees the risk it takes

    cands, picks = _decide(model, limit, slots=1)
    assert not any("A hedge" in c.rationale for c in cands)
    assert len(picks) == 1 and not _is_hedge(model, limit, picks[0].overrides)


def test_no_hedge_is_run_when_none_is_predicted_faster_than_the_safe_picks():
    model, limit = _priors(80.0)  # room enough: what the gap rules out is no faster than what fits with it
    cands, picks = _decide(model, limit, slots=3)
    assert any("A hedge" in c.rationale for c in cands)
    assert picks and not any(_is_hedge(model, limit, c.overrides) for c in picks)


def test_the_llm_proposer_s_batch_is_offered_the_model_s_hedges_too():
    from mart.nodes.agents.llm import LLMProposer

    model, limit = _priors(40.0)
    # what an LLM answered: one safe config (the rules proposer's best, as any valid answer would be)
    for slots, hedged_batch in ((3, True), (1, False)):
        ctx = dataclasses.replace(_ctx(model, "system", limit), slots=slots, num_candidates=slots)
        llm = [c for c in RulesProposer().propose(ctx) if "A hedge" not in c.rationale][:1]
        llm = [llm[0].model_copy(update={"candidate_id": "llm-1", "source": "llm"})]
        cands = LLMProposer._with_model_pick(ctx, llm)
        offered = [c for c in cands if "A hedge" in c.rationale]
        assert bool(offered) == hedged_batch and all(c.source == "model" for c in offered)
        assert cands[0].candidate_id == "llm-1"  # the LLM's own answer stands first
        if hedged_batch:
            verdict = RulesCritic().critique(ctx, cands)
            by_id = {c.candidate_id: c for c in cands}
            picks = [by_id[p] for p in verdict.picks]
            assert sum(_is_hedge(model, limit, c.overrides) for c in picks) == 1
