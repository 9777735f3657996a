"""LLMProposer / LLMCritic with the real ChatOpenAI against a loopback OpenAI-compatible server.

The stub answers; the assertions are about what mart did with the answers: validated candidates, repair
turns quoting mart's errors, fallbacks with their reasons, bounded retries and timeouts, token records.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from mart.nodes.agents.llm import MAX_CONSECUTIVE_FAILURES, LLMCritic, LLMProposer
from mart.nodes.agents.llm_client import LLMConfigError, LLMSettings
from mart.state.models import Candidate
from tests.support.llm_helpers import (
    GMU,
    SECRET,
    SEQS,
    SPACE,
    TP,
    FallbackCritic,
    FallbackProposer,
    make_ctx,
    options,
    predict_memory,
    proposal,
)
from tests.support.openai_stub import OpenAIStub, PlausibleAgent, Reply

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_llm_env")]

FAST_RETRY = {"retry-after-ms": "10"}



@pytest.fixture
def stub():
    with OpenAIStub(default=PlausibleAgent(seed=1), max_lifetime_s=60) as s:
        yield s


def proposer(stub, *, fallback=None, opts=None, **kw) -> LLMProposer:
    kw.setdefault("max_retries", 0)
    return LLMProposer(opts or options(stub.base_url), api_key=SECRET, fallback=fallback or FallbackProposer(), **kw)


def critic(stub, *, fallback=None, **kw) -> LLMCritic:
    kw.setdefault("max_retries", 0)
    return LLMCritic(options(stub.base_url), api_key=SECRET, fallback=fallback or FallbackCritic(), **kw)


def assert_valid(ctx, cand: Candidate) -> None:
    SPACE.validate_overrides(cand.overrides, stage=ctx.stage)
    assert SPACE.check_constraints(ctx.full_config(cand.overrides)) == []
    assert cand.overrides != ctx.best_overrides


# --------------------------------------------------------------------------- proposer


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "sse"])
@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_proposer_uses_valid_llm_candidates(stub, method, streaming):
    ctx = make_ctx()
    agent = proposer(stub, structured=method, streaming=streaming)
    cands = agent.propose(ctx)

    req = stub.completions()[-1]
    assert req.mode == {"json_schema": "json_schema", "function_calling": "tools", "json_mode": "json_object"}[method]
    assert req.stream is streaming
    if method == "json_schema":
        assert req.body["response_format"]["json_schema"]["strict"] is True
    assert 1 <= len(cands) <= ctx.num_candidates
    for c in cands:
        assert c.source == "llm" and c.rationale.startswith("stub: try")
        assert_valid(ctx, c)
        assert c.predicted_memory_gb == pytest.approx(predict_memory(ctx.full_config(c.overrides)))
    calls = agent.last_calls()
    assert [(c.role, c.strategy, c.ok) for c in calls][-1] == ("proposer", "llm", True)
    last = calls[-1]
    assert last.prompt_tokens > 500 and last.completion_tokens > 0
    assert last.cost_usd == pytest.approx((last.prompt_tokens * 1.0 + last.completion_tokens * 4.0) / 1e6)
    assert last.latency_s > 0
    assert not any(c.fallback_reason for c in calls)


def test_candidates_keep_the_current_best_overrides(stub):
    ctx = make_ctx()  # best: max_num_seqs=512
    stub.push(Reply.json(proposal({TP: 1}, {GMU: 0.6})))
    cands = proposer(stub).propose(ctx)
    assert [c.overrides for c in cands] == [{SEQS: 512, TP: 1}, {SEQS: 512, GMU: 0.6}]
    assert [c.expected_gain for c in cands] == [0.1, 0.1]


def test_malformed_json_is_repaired(stub):
    ctx = make_ctx()
    stub.push(Reply.text('{"analysis": "x", "candidates": [{"overrides": [{"key": '))
    agent = proposer(stub)
    cands = agent.propose(ctx)

    assert cands and all(c.source == "llm" for c in cands)
    calls = agent.last_calls()
    first, last = calls[0], calls[-1]
    assert not first.ok and "not valid JSON" in first.error and first.prompt_tokens > 0
    assert last.ok and last.error is None and last.strategy == "llm"
    assert not any(c.fallback_reason for c in agent.last_calls())
    repair = stub.completions()[1].messages
    assert repair[-2]["role"] == "assistant" and repair[-2]["content"].startswith('{"analysis"')
    assert "could not be used (attempt 1 of 3)" in repair[-1]["content"]
    assert "not valid JSON" in repair[-1]["content"]


def test_out_of_range_and_constraint_errors_are_quoted_in_the_repair(stub):
    ctx = make_ctx()
    stub.push(Reply.json(proposal({GMU: 1.7}, {SEQS: 1024})))
    agent = proposer(stub)
    cands = agent.propose(ctx)

    assert cands and all(c.source == "llm" for c in cands)
    for c in cands:
        assert_valid(ctx, c)
    repair = stub.completions()[1].messages[-1]["content"]
    assert "candidate 1: `rollout.gpu_memory_utilization` must lie in [0.2, 0.95], but got 1.7." in repair
    assert "candidate 2 (rollout.max_num_seqs=1024) breaks constraints: seqs_fit_memory" in repair
    assert "must lie in" in agent.last_calls()[0].error


def test_unknown_keys_fall_back_to_rules_with_the_reason(stub):
    ctx = make_ctx()
    bad = Reply.json(proposal({"rollout.warp_speed": 9}))
    stub.push(bad, bad, bad)
    fallback = FallbackProposer()
    agent = proposer(stub, fallback=fallback)
    cands = agent.propose(ctx)

    assert len(stub.completions()) == 3  # the answer + two repair rounds, then no more
    assert fallback.calls == 1
    assert [c.source for c in cands] == ["rules"]
    assert cands[0].overrides == {SEQS: 512, TP: 4}
    assert "[rules proposer: LLM answer still invalid after 2 repair rounds" in cands[0].rationale
    calls = agent.last_calls()
    assert [(c.strategy, c.ok) for c in calls] == [("llm", False)] * 3 + [("rules", True)]
    reason = calls[-1].fallback_reason
    assert "still invalid after 2 repair rounds" in reason and "`rollout.warp_speed` is not a tunable knob" in reason
    assert all(c.fallback_reason is None for c in calls[:3])


def test_shape_errors_are_repaired(stub):
    ctx = make_ctx()
    stub.push(Reply.json({"candidates": [{"overrides": {"rollout.max_num_seqs": 300}}]}))
    agent = proposer(stub)
    assert all(c.source == "llm" for c in agent.propose(ctx))
    repair = stub.completions()[1].messages[-1]["content"]
    assert "analysis: Field required" in repair and "candidates.0.overrides: Input should be a valid list" in repair


def test_partial_answer_keeps_the_valid_candidates(stub):
    ctx = make_ctx()
    stub.push(*[Reply.json(proposal({TP: 1}, {"nope": 1}))] * 3)
    agent = proposer(stub)
    cands = agent.propose(ctx)
    assert [c.overrides for c in cands] == [{SEQS: 512, TP: 1}]
    assert [c.ok for c in agent.last_calls()] == [False, False, False]
    assert not any(c.fallback_reason for c in agent.last_calls())


def test_repeats_of_tried_configs_are_refused(stub):
    ctx = make_ctx(best_overrides={})
    stub.push(Reply.json(proposal({GMU: 0.9}, {SEQS: 512}, {})))  # t002, t003, the baseline itself
    agent = proposer(stub, repair_rounds=0)
    cands = agent.propose(ctx)
    assert [c.source for c in cands] == ["rules"]
    reason = agent.last_calls()[-1].fallback_reason
    assert "after 0 repair rounds" in reason
    assert "candidate 1 (rollout.gpu_memory_utilization=0.9): this configuration was already tried" in reason
    assert "candidate 2 (rollout.max_num_seqs=512): this configuration was already tried" in reason
    assert "candidate 3: changes nothing" in reason


def test_429_then_200_succeeds(stub):
    stub.push(Reply.error(429, "rate limited", headers=FAST_RETRY), Reply.json(proposal({TP: 1}, {GMU: 0.6})))
    agent = proposer(stub, max_retries=2)
    cands = agent.propose(make_ctx())
    assert [c.overrides for c in cands] == [{SEQS: 512, TP: 1}, {SEQS: 512, GMU: 0.6}]
    assert all(c.source == "llm" for c in cands)
    assert len(stub.completions()) == 2
    assert [c.ok for c in agent.last_calls()] == [True]


def test_5xx_retries_are_bounded_then_rules_take_over(stub):
    stub.push(*[Reply.error(503, "overloaded", headers=FAST_RETRY)] * 5)
    agent = proposer(stub, max_retries=2)
    cands = agent.propose(make_ctx())
    assert len(stub.completions()) == 3  # 1 + max_retries
    assert [c.source for c in cands] == ["rules"]
    reason = agent.last_calls()[-1].fallback_reason
    assert reason.startswith("LLM endpoint failed: server:") and "overloaded" in reason


def test_hanging_server_times_out_and_falls_back(stub):
    stub.push(Reply.hang(30), Reply.hang(30))
    agent = proposer(stub, opts=options(stub.base_url, llm_timeout_s=0.5), max_retries=1)
    start = time.monotonic()
    cands = agent.propose(make_ctx())
    elapsed = time.monotonic() - start
    assert elapsed < 6
    assert len(stub.completions()) == 2
    assert [c.source for c in cands] == ["rules"]
    calls = agent.last_calls()
    assert calls[0].strategy == "llm" and not calls[0].ok and calls[0].error.startswith("timeout")
    assert 0.9 < calls[0].latency_s < 6  # two attempts of 0.5 s, plus the backoff
    assert calls[-1].fallback_reason.startswith("LLM endpoint failed: timeout")


def test_repeated_endpoint_failures_disable_the_llm_for_the_session(stub):
    stub.default = lambda req: Reply.error(500, "boom")
    agent = proposer(stub)
    for _ in range(MAX_CONSECUTIVE_FAILURES):
        agent.propose(make_ctx())
    assert len(stub.completions()) == MAX_CONSECUTIVE_FAILURES
    cands = agent.propose(make_ctx())
    assert len(stub.completions()) == MAX_CONSECUTIVE_FAILURES  # no more calls
    assert [c.source for c in cands] == ["rules"]
    assert "disabled for this session" in agent.last_calls()[-1].fallback_reason


def test_auth_error_disables_at_once_and_never_leaks_the_key(stub, caplog):
    caplog.set_level(logging.DEBUG)
    stub.push(Reply.error(401, f"Incorrect API key provided: {SECRET}"))
    agent = proposer(stub)
    agent.propose(make_ctx())
    assert stub.completions()[0].headers["authorization"] == f"Bearer {SECRET}"
    reason = agent.last_calls()[-1].fallback_reason
    assert "auth" in reason and "***" in reason
    agent.propose(make_ctx())
    assert len(stub.completions()) == 1
    records = json.dumps([c.model_dump() for c in agent.last_calls()])
    for text in (reason, records, repr(agent), repr(agent.chat), caplog.text):
        assert SECRET not in text and "0123456789abcdef" not in text


# --------------------------------------------------------------------------- configuration


def test_settings_resolution_flags_win_over_env(monkeypatch):
    monkeypatch.setenv("MART_LLM_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    s = LLMSettings.resolve(options(None, llm_model=None))
    assert (s.model, s.base_url, s.structured, s.max_retries, s.repair_rounds) == (
        "env-model", "http://127.0.0.1:9/v1", "json_schema", 2, 2)
    s = LLMSettings.resolve(options("http://127.0.0.1:8/v1", llm_model="flag-model"))
    assert (s.model, s.base_url) == ("flag-model", "http://127.0.0.1:8/v1")
    monkeypatch.setenv("MART_LLM_STRUCTURED", "function_calling")
    monkeypatch.setenv("MART_LLM_MAX_RETRIES", "99")
    s = LLMSettings.resolve(options(None))
    assert s.structured == "function_calling" and s.max_retries == 6  # bounded
    monkeypatch.setenv("MART_LLM_STRUCTURED", "xml")
    with pytest.raises(LLMConfigError, match="MART_LLM_STRUCTURED"):
        LLMSettings.resolve(options(None))


def test_missing_model_or_key_is_a_clear_error():
    with pytest.raises(LLMConfigError, match="--llm-model"):
        LLMProposer(options(None, llm_model=None), fallback=FallbackProposer())
    with pytest.raises(LLMConfigError, match="OPENAI_API_KEY"):
        LLMProposer(options(None), fallback=FallbackProposer())  # api.openai.com and no key


def test_api_key_sources(stub, monkeypatch):
    LLMProposer(options(stub.base_url), fallback=FallbackProposer(), max_retries=0).propose(make_ctx())
    assert stub.completions()[-1].headers["authorization"] == "Bearer EMPTY"  # a local server without auth
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-000000")
    LLMProposer(options(stub.base_url), fallback=FallbackProposer(), max_retries=0).propose(make_ctx())
    assert stub.completions()[-1].headers["authorization"] == "Bearer sk-from-env-000000"
    proposer(stub).propose(make_ctx())  # the flag's key wins
    assert stub.completions()[-1].headers["authorization"] == f"Bearer {SECRET}"


def test_env_selects_the_structured_output_method(stub, monkeypatch):
    monkeypatch.setenv("MART_LLM_STRUCTURED", "function_calling")
    monkeypatch.setenv("MART_LLM_STREAM", "1")
    cands = LLMProposer(options(stub.base_url), api_key=SECRET, fallback=FallbackProposer()).propose(make_ctx())
    req = stub.completions()[-1]
    assert req.mode == "tools" and req.body["tool_choice"]["function"]["name"] == "ProposalSet" and req.stream
    assert cands and all(c.source == "llm" for c in cands)


# --------------------------------------------------------------------------- critic


def _candidates() -> list[Candidate]:
    return [
        Candidate(candidate_id="c0", stage="system", overrides={SEQS: 1024}, rationale="more seqs", source="llm"),
        Candidate(candidate_id="c1", stage="system", overrides={SEQS: 512, TP: 1}, rationale="TP 1", source="llm"),
        Candidate(candidate_id="c2", stage="system", overrides={SEQS: 512, GMU: 0.6}, rationale="KV", source="llm"),
    ]


def verdicts(*rows: tuple[str, bool, str], pick: str | None, feedback: str = "") -> dict:
    return {"verdicts": [{"candidate_id": i, "accept": a, "reason": f"reason for {i}", "risk": r} for i, a, r in rows],
            "pick": pick, "feedback": feedback}


def test_critic_sees_the_checks_and_picks_a_valid_candidate(stub):
    ctx = make_ctx()
    agent = critic(stub)
    verdict = agent.critique(ctx, _candidates())

    prompt = stub.completions()[0].prompt
    assert "constraints: FAILED: seqs_fit_memory" in prompt and "predicted peak memory: 75.00 GB" in prompt
    assert verdict.pick == "c1"  # c0 breaks a constraint, the stub picks the first passing one
    by_id = {c.candidate_id: c for c in verdict.critiques}
    assert not by_id["c0"].accepted and by_id["c1"].accepted and by_id["c2"].accepted
    assert by_id["c1"].reasons == ["stub: checks pass"]
    assert by_id["c1"].predicted_memory_gb == pytest.approx(75.0)
    assert by_id["c1"].score > by_id["c2"].score > 0 == by_id["c0"].score
    assert [(c.role, c.strategy, c.ok) for c in agent.last_calls()] == [("critic", "llm", True)]


def test_critic_pick_of_an_invalid_candidate_is_overridden(stub):
    stub.push(Reply.json(verdicts(("c0", True, "low"), ("c1", True, "medium"), ("c2", False, "low"), pick="c0")))
    verdict = critic(stub).critique(make_ctx(), _candidates())
    by_id = {c.candidate_id: c for c in verdict.critiques}
    assert verdict.pick == "c1"
    assert not by_id["c0"].accepted and by_id["c0"].risk == "high"
    assert any("overridden by mart" in r and "seqs_fit_memory" in r for r in by_id["c0"].reasons)
    assert any("pick c0 overridden by mart" in r and "picked c1 instead" in r for r in by_id["c1"].reasons)


def test_critic_acceptance_over_the_memory_limit_is_high_risk(stub):
    cands = [Candidate(candidate_id="big", stage="system", overrides={SEQS: 512, GMU: 0.8}, source="llm")]
    stub.push(Reply.json(verdicts(("big", True, "low"), pick="big")))
    verdict = critic(stub).critique(make_ctx(), cands)
    assert verdict.pick == "big" and verdict.critiques[0].risk == "high"
    assert "exceeds the limit 81.00 GB" in verdict.critiques[0].reasons[-1]


def test_critic_unknown_ids_and_bad_picks_are_repaired(stub):
    stub.push(Reply.json(verdicts(("c9", True, "low"), ("c1", True, "low"), pick="c2")))
    agent = critic(stub)
    verdict = agent.critique(make_ctx(), _candidates())
    repair = stub.completions()[1].messages[-1]["content"]
    assert "unknown candidate_id(s) ['c9']" in repair and "no verdict for ['c0', 'c2']" in repair
    assert "pick 'c2' is not accepted" in repair
    assert verdict.pick == "c1" and [c.ok for c in agent.last_calls()] == [False, True]


def test_critic_falls_back_to_rules_with_the_reason(stub):
    stub.push(*[Reply.text("I think c1 is best.")] * 3)
    fallback = FallbackCritic()
    agent = critic(stub, fallback=fallback)
    verdict = agent.critique(make_ctx(), _candidates())
    assert fallback.calls == 1 and verdict.pick == "c0"
    assert "[rules critic: LLM answer still invalid" in verdict.critiques[0].reasons[-1]
    calls = agent.last_calls()
    assert [(c.strategy, c.ok) for c in calls] == [("llm", False)] * 3 + [("rules", True)]
    assert "not valid JSON" in calls[-1].fallback_reason


def test_critic_nothing_to_review_makes_no_call(stub):
    verdict = critic(stub).critique(make_ctx(), [])
    assert verdict.pick is None and stub.completions() == []


def test_real_rules_strategies_take_over_on_the_verl_space(stub):
    """With the real fallbacks (registry wiring), a dead endpoint still yields a usable round."""
    from mart.nodes.agents.registry import make_critic, make_proposer
    from mart.trial_runner.verl.space import SEARCH_SPACE, VERL_DEFAULTS

    stub.default = lambda req: Reply.error(500, "down", headers=FAST_RETRY)
    opts = options(stub.base_url)
    prop, crit = make_proposer(opts, api_key=SECRET), make_critic(opts, api_key=SECRET)
    assert isinstance(prop, LLMProposer) and isinstance(crit, LLMCritic)
    base = {**VERL_DEFAULTS, **SEARCH_SPACE.defaults(), "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.rollout.n": 4}
    ctx = make_ctx(search_space=SEARCH_SPACE, backend="verl", base_config=base, best_overrides={}, history=[],
                   health_events=[], predict_memory=lambda c: None, memory_limit_gb=None)
    cands = prop.propose(ctx)
    assert cands and all(c.source == "rules" for c in cands)
    cands = [c.model_copy(update={"candidate_id": f"c{i}"}) for i, c in enumerate(cands)]
    verdict = crit.critique(ctx, cands)
    assert verdict.pick in {c.candidate_id for c in cands}
    assert prop.last_calls()[-1].fallback_reason and crit.last_calls()[-1].fallback_reason
