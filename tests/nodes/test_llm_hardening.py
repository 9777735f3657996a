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


# -- issue 26 item 1d: an answer too large is refused unread, in bounded memory ---------------------------------
_RSS_SCRIPT = r"""
import json, resource, sys
from mart.nodes.agents.llm import LLMProposer
from tests.support.llm_helpers import SECRET, FallbackProposer, make_ctx, options

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

# a generous timeout: on a loaded machine the first request (imports, connection) can take seconds; the huge
# answer is refused by its size, not by time
agent = LLMProposer(options(sys.argv[1], llm_timeout_s=60.0), api_key=SECRET, fallback=FallbackProposer(), max_retries=0,
                    repair_rounds=0, streaming=sys.argv[2] == "sse")
agent.propose(make_ctx())  # warm-up: imports, first request
before = peak_mb()
cands = agent.propose(make_ctx())  # the huge answer
print(json.dumps({"before_mb": before, "after_mb": peak_mb(), "sources": [c.source for c in cands],
                  "errors": [c.error for c in agent.last_calls()]}))
"""


@pytest.mark.parametrize("mode", ["json", "sse"])
def test_a_20_mb_answer_is_refused_unread_in_bounded_memory(stub, mode):
    import subprocess
    import sys

    from tests.support.paths import REPO

    huge = '{"analysis": "' + "x" * (20 * 1024 * 1024) + '"}'
    stub.push(PlausibleAgent(seed=1), Reply.text(huge))
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, stub.base_url, mode], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{mode}: peak RSS {res['before_mb']:.0f} MB before, {res['after_mb']:.0f} MB after the 20 MB answer")
    assert res["after_mb"] - res["before_mb"] < 40, res  # the answer itself is 20 MB: it was never held whole
    assert res["sources"] == ["rules"]  # the round fell back
    assert any(e and "refused unread" in e for e in res["errors"]), res["errors"]


def test_an_echoed_key_is_never_stored(tmp_path, stub):
    from mart.state.ledger import Ledger

    stub.push(Reply.text(f'not json, but here is your key: {SECRET} and again "{SECRET}"'),
              Reply.json({"analysis": f"the key is {SECRET}", "candidates": "not a list"}))
    agent = proposer(stub, repair_rounds=1)
    agent.propose(make_ctx())
    ledger = Ledger(tmp_path / "mart.sqlite")
    ledger.add_agent_calls("r", "system-1-1-proposer", agent.last_calls())
    ledger.close()
    assert SECRET.encode() not in (tmp_path / "mart.sqlite").read_bytes()
    rows = Ledger(tmp_path / "mart.sqlite").table_rows("agent_calls")
    assert rows[0]["raw_answer"] and "here is your key" in rows[0]["raw_answer"]  # the rest of the answer is kept
