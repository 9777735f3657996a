"""Issue 46's promises on reviews, each held by a fast test that fails when the promise is broken (MQ*).

- LangGraph's strict resume stays on for the runs mart drives: the CLI's and the Slack server's (both through
  ``session.resume``/``tune`` and its driver) and the Python API's (``open_run``). An answer naming a review that
  is no longer pending is then refused by the library itself, whatever mart's own check (``StaleReview``) does;
- a decision naming a candidate that is not in the batch is refused as a whole: nothing of it is applied.
"""

from __future__ import annotations

import sqlite3

import pytest
from langgraph.errors import UnknownInterruptError
from langgraph.types import Command

import mart.graph.builder as builder
from mart.graph.api import open_run
from mart.graph.builder import compile_graph
from mart.graph.session import pending_review, resume
from mart.state.models import CandidateDecision, ReviewDecision
from mart.state.run_store import RunStore
from tests.graph.test_hardening import APPROVE, TOY, paused_run

pytestmark = pytest.mark.timeout(120)


def _trials(tmp_path, run: str) -> list[str]:
    conn = sqlite3.connect(tmp_path / run / "mart.sqlite")
    try:
        return [r[0] for r in conn.execute("SELECT trial_id FROM trials")]
    finally:
        conn.close()


def _pending(tmp_path, run: str) -> dict:
    store = RunStore.open(run, tmp_path)
    try:
        return pending_review(store)
    finally:
        store.close()


def test_langgraph_strict_resume_stays_on_for_cli_api_and_slack_runs(tmp_path, monkeypatch):
    run = paused_run(tmp_path, system_trials=3)
    first = _pending(tmp_path, run)["interrupt_id"]
    # the driver of `mart tune`/`mart review` and of the Slack server (session._drive): the config it hands LangGraph
    seen: list[dict] = []
    real_compile = builder.compile_graph  # the driver imports it when it runs a graph (light commands)

    class Spy:
        def __init__(self, graph):
            self._graph = graph

        def __getattr__(self, name):
            return getattr(self._graph, name)

        def stream(self, inp, config, **kw):
            seen.append(config)
            return self._graph.stream(inp, config, **kw)

    monkeypatch.setattr(builder, "compile_graph", lambda saver: Spy(real_compile(saver)))
    out = resume(run, tmp_path, decision=APPROVE, interrupt_id=first, quiet=True)
    monkeypatch.undo()
    assert out["status"] == "paused" and seen  # the next review is pending: `first` is no longer
    second = out["pending_review"]["interrupt_id"]
    assert second != first
    trials = _trials(tmp_path, run)
    stale = Command(resume={first: APPROVE.model_dump(mode="json")})
    with open_run(run, tmp_path, allowed=[TOY]) as handle:  # the Python API's handle: its own config
        for who, config in (("the CLI/Slack driver", seen[-1]), ("open_run", handle.config)):
            # straight to LangGraph (no mart check in between): the library refuses the stale answer itself
            graph = handle.graph if who == "open_run" else compile_graph(handle._saver)
            with pytest.raises(UnknownInterruptError):
                graph.invoke(stale, config, context=handle.context, durability="sync")
            assert handle.pending_review()["interrupt_id"] == second, who  # still asked, not answered
    assert _trials(tmp_path, run) == trials  # nothing launched


def test_a_decision_naming_a_candidate_not_in_the_batch_is_refused(tmp_path):
    run = paused_run(tmp_path, system_trials=3)
    request = _pending(tmp_path, run)
    ids = [c["candidate_id"] for c in request["candidates"]]
    trials = _trials(tmp_path, run)
    # a named decision for no candidate of this review, beside one covering the rest (as a stale or forged
    # Slack click, or a typo at the terminal, would be)
    for decisions in ([CandidateDecision(type="approve", candidate_id="sys-99-r0-c9")],
                      [CandidateDecision(type="approve", candidate_id="sys-99-r0-c9"), CandidateDecision(type="reject")],
                      [CandidateDecision(type="reject", candidate_id="sys-99-r0-c9"), CandidateDecision(type="approve")]):
        # `mart review`, the Slack server (session.resume): refused before it reaches the graph
        with pytest.raises(ValueError, match="no candidate sys-99-r0-c9 in this review"):
            resume(run, tmp_path, decision=ReviewDecision(decisions=decisions, reviewer="t", channel="t"), quiet=True)
        assert _pending(tmp_path, run)["candidates"] == request["candidates"]  # the same review, still asked
        assert _trials(tmp_path, run) == trials, "a decision for a candidate not in the batch was applied"
    conn = sqlite3.connect(tmp_path / run / "mart.sqlite")
    assert conn.execute("SELECT count(*) FROM reviews").fetchone()[0] == 0  # no decision was recorded
    conn.close()
    # the API's `decide` reaches the review node itself, which asks again, saying why
    with open_run(run, tmp_path, allowed=[TOY]) as handle:
        asked = handle.decide({"decisions": [{"type": "approve", "candidate_id": "sys-99-r0-c9"},
                                             {"type": "approve"}], "reviewer": "me"})
        assert "sys-99-r0-c9" in (asked.get("error") or "") and [c["candidate_id"] for c in asked["candidates"]] == ids
    assert _trials(tmp_path, run) == trials
