"""Issue 17 item 6: the LLM endpoint is untrusted too (huge answers, answers that are never valid)."""

from __future__ import annotations

import json

import pytest

from mart.nodes.agents.llm import MAX_INVALID_ROUNDS, MAX_QUOTED_ANSWER, LLMProposer
from mart.nodes.agents.llm_client import DEFAULT_MAX_TOKENS, MAX_ANSWER_CHARS
from tests.support.llm_helpers import SECRET, FallbackProposer, make_ctx, options
from tests.support.openai_stub import OpenAIStub, PlausibleAgent, Reply

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_llm_env")]



@pytest.fixture
def stub():
    with OpenAIStub(default=PlausibleAgent(seed=1), max_lifetime_s=60) as s:
        yield s


def proposer(stub, **kw) -> LLMProposer:
    kw.setdefault("max_retries", 0)
    return LLMProposer(options(stub.base_url), api_key=SECRET, fallback=FallbackProposer(), **kw)


def test_requests_bound_the_answer_with_max_tokens(stub):
    proposer(stub).propose(make_ctx())
    body = stub.completions()[-1].body
    assert (body.get("max_tokens") or body.get("max_completion_tokens")) == DEFAULT_MAX_TOKENS


def test_huge_answer_is_refused_and_never_sent_back(stub):
    huge = '{"analysis": "' + "x" * (3 * MAX_ANSWER_CHARS) + '"}'
    stub.push(Reply.text(huge))
    agent = proposer(stub)
    cands = agent.propose(make_ctx())
    assert cands and cands[0].source == "llm"  # the repair turn got a good answer
    first = agent.last_calls()[0]
    assert not first.ok and "over the limit" in first.error and first.attempt == 1
    assert len(first.raw_answer) <= 4000
    repair = stub.completions()[1]
    assert len(json.dumps(repair.body)) < len(huge) // 4
    assert len(repair.messages[-2]["content"]) <= MAX_QUOTED_ANSWER + 100
    assert [c.attempt for c in agent.last_calls()] == list(range(1, len(agent.last_calls()) + 1))


def test_a_model_that_never_answers_validly_is_dropped(stub):
    stub.default = lambda req: Reply.text("not json at all")
    agent = proposer(stub, repair_rounds=0)
    for _ in range(MAX_INVALID_ROUNDS):
        assert [c.source for c in agent.propose(make_ctx())] == ["rules"]
    assert len(stub.completions()) == MAX_INVALID_ROUNDS
    agent.propose(make_ctx())
    assert len(stub.completions()) == MAX_INVALID_ROUNDS  # no more calls
    assert "no usable answer" in agent.last_calls()[-1].fallback_reason
    bad = [c for c in agent.last_calls() if c.strategy == "llm"]
    assert bad == []  # the disabled round made no call


def test_ledger_records_attempts_and_raw_answers(tmp_path, stub):
    from mart.state.ledger import Ledger

    stub.push(Reply.text("garbage <answer>"))
    agent = proposer(stub)
    agent.propose(make_ctx())
    ledger = Ledger(tmp_path / "mart.sqlite")
    ledger.add_agent_calls("r", "system-1-1-proposer", agent.last_calls())
    rows = ledger.table_rows("agent_calls")
    assert rows[0]["attempt"] == 1 and rows[0]["raw_answer"] == "garbage <answer>"
    assert [r["attempt"] for r in rows] == list(range(1, len(rows) + 1))
    assert all((r["raw_answer"] is None) == bool(r["ok"]) for r in rows)
    usage = ledger.agent_usage("r")
    assert usage["repairs"] == len(rows) - 1 and usage["invalid_answers"] == sum(not r["ok"] for r in rows)
    ledger.close()
