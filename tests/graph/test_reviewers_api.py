"""The notebook API (mart.graph.api): a run's compiled graph and config, `graph.invoke(Command(resume=...))`,
the writer lock, and time travel (re-deciding a past review on a fork)."""

from __future__ import annotations

import getpass

import pytest
from langgraph.types import Command

from mart.graph.api import open_run
from mart.graph.session import resume, run_status, tune
from mart.state.ledger import Ledger
from mart.state.models import ReviewDecision
from mart.state.run_store import RunLocked, RunStore
from tests.graph.test_graph_session import options
from tests.support.reviews import only
from tests.support.toy_backend import SEQS


@pytest.fixture
def paused(tmp_path):
    return tune(options(tmp_path, approve="none", system_trials=4, learning_trials=0))


def test_invoke_resume_with_and_without_context(tmp_path, paused):
    run = paused["run_id"]
    with open_run(run, tmp_path) as h:
        req = h.pending_review()
        assert req["interrupt_id"] == paused["pending_review"]["interrupt_id"]
        # one writer: the handle holds the run
        with pytest.raises(RunLocked):
            resume(run, tmp_path, quiet=True)
        assert run_status(h.store)["driver_pid"] is not None
        # a malformed answer (an unknown action, a bare string) is refused by the interrupt's response schema
        # and asked again in band: the run neither fails nor moves, and the reviewer sees why
        for bad in ({"action": "maybe"}, "approve", 42):
            out = h.graph.invoke(Command(resume={h.pending_review()["interrupt_id"]: bad}), h.config,
                                 context=h.context)
            again = out["__interrupt__"][0].value
            assert again["review_no"] == 1 and again["error"].startswith("invalid decision:"), again["error"]
            assert h.pending_review()["review_no"] == 1  # asked again (LangGraph gives the new ask its own id)
        assert "action" in again["error"] or "dictionary" in again["error"]
        assert Ledger.open(h.store.run_dir).table_rows("reviews") == []
        out = h.graph.invoke(Command(resume={h.pending_review()["interrupt_id"]: ReviewDecision(
                                 action="approve", reviewer="nb", channel="notebook")}),
                             h.config, context=h.context)
        assert out["__interrupt__"][0].value["review_no"] == 2
        # context is optional: the nodes build their services from the state's options
        h.graph.invoke(Command(resume={h.pending_review()["interrupt_id"]: {"action": "approve", "reviewer": "nb"}}),
                       h.config)
        assert h.pending_review()["review_no"] == 3
        reviews = Ledger.open(h.store.run_dir).table_rows("reviews")
        # the channel that delivered them, whatever the caller wrote; the caller's name kept as a claim
        assert [r["reviewer"] for r in reviews] == [f"nb (claimed; api user {getpass.getuser()})"] * 2
        assert [r["channel"] for r in reviews] == ["api", "api"]
        assert len(Ledger.open(h.store.run_dir).trials()) == 3
    # closed: the run is free again, and any channel can answer it
    assert RunStore.open(run, tmp_path).lock_holder() is None
    assert resume(run, tmp_path, quiet=True)["status"] == "paused"


def test_time_travel_redecides_a_past_review_on_a_fork(tmp_path, paused):
    run = paused["run_id"]
    first = paused["pending_review"]
    with open_run(run, tmp_path) as h:
        h.decide({"action": "approve", "reviewer": "ann"})  # review 1 approved: a trial ran
        assert h.pending_review()["review_no"] == 2

        # the documented recipe, with plain LangGraph calls
        past = next(s for s in h.graph.get_state_history(h.config)
                    if s.next == ("human_review",) and s.values.get("reviews") == 0)
        assert only(past.interrupts[0].value)["candidate_id"] == only(first)["candidate_id"]
        h.graph.update_state(past.config, None, as_node="__copy__")  # fork: a new head, no stored answer
        again = h.graph.invoke(None, h.config, context=h.context)["__interrupt__"][0].value
        assert (again["review_no"], only(again)["candidate_id"]) == (1, only(first)["candidate_id"])
        feedback = "leave max_num_seqs alone"
        h.graph.invoke(Command(resume={h.pending_review()["interrupt_id"]: {"action": "reject", "feedback": feedback}}),
                       h.config, context=h.context)
        now = h.pending_review()
        assert now["review_no"] == 2 and only(now)["candidate_id"] != only(first)["candidate_id"]
        assert SEQS not in {d["key"] for d in only(now)["diff"]}
        assert h.state().values["trials_done"] == {"system": 1}  # this branch ran no candidate yet
        history = list(h.graph.get_state_history(h.config))
        assert any(s.metadata.get("source") == "fork" for s in history)

        # the helpers do the same
        assert [s.values["reviews"] for s in h.past_reviews()][-1] == 0
        oldest = list(h.past_reviews())[-1]
        assert only(h.fork(oldest))["candidate_id"] == only(first)["candidate_id"]
        assert h.decide(ReviewDecision(action="approve", reviewer="ann"))["review_no"] == 2


def test_a_new_answer_to_an_already_answered_review_is_refused_not_replayed(tmp_path, paused):
    from mart.graph.api import StaleResume

    with open_run(paused["run_id"], tmp_path) as h:
        h.decide({"action": "approve", "reviewer": "ann"})
        answered = list(h.past_reviews())[-1]  # review 1, answered "approve"
        head_before = h.state().config["configurable"]["checkpoint_id"]
        with pytest.raises(StaleResume, match="already answered \\(approve\\).*fork"):
            h.graph.invoke(Command(resume={"action": "reject", "feedback": "no", "reviewer": "bob"}),
                           answered.config, context=h.context)
        assert h.state().config["configurable"]["checkpoint_id"] == head_before  # nothing ran
        # the head's pending review is still answered normally, and a fork re-opens the old one
        assert h.fork(answered)["review_no"] == 1


def test_a_batch_review_is_answered_per_candidate_from_a_notebook(tmp_path):
    """`graph.invoke(Command(resume=ReviewDecision(decisions=[...])))`: one candidate of the batch edited, the other
    rejected with feedback; the edited config runs, the rejected one never does, both decisions are on record."""
    from mart.state.models import CandidateDecision

    paused = tune(options(tmp_path, backend="sim", parallel=3, approve="none", system_trials=5, learning_trials=0,
                          system_horizon=6))
    request = paused["pending_review"]
    ids = [c["candidate_id"] for c in request["candidates"]]
    assert len(ids) == 2
    seqs = "actor_rollout_ref.rollout.max_num_seqs"
    assert request["candidates"][0]["overrides"].get(seqs) != 128  # the edit changes what was proposed
    with open_run(paused["run_id"], tmp_path) as h:
        answer = ReviewDecision(decisions=[
            CandidateDecision(type="edit", candidate_id=ids[0], edits={seqs: 128}),
            CandidateDecision(type="reject", candidate_id=ids[1], message="no tensor parallel change yet")],
            reviewer="nb", channel="notebook")
        h.graph.invoke(Command(resume={request["interrupt_id"]: answer}), h.config, context=h.context)
        ledger = Ledger.open(h.store.run_dir)
        ran = {t["candidate_id"]: t for t in ledger.trials() if t["kind"] == "candidate"}
        assert ids[1] not in ran and ran[ids[0]]["config"][seqs] == 128
        first = {r["candidate_id"]: r for r in ledger.table_rows("reviews") if r["review_no"] == 1}
        assert (first[ids[0]]["action"], first[ids[1]]["action"]) == ("edit", "reject")
        assert first[ids[1]]["feedback"] == "no tensor parallel change yet"
        assert {r["channel"] for r in first.values()} == {"api"}
