"""The built-in reviewer channels: auto (policies), tty (what it shows, how it asks), none, the factory."""

from __future__ import annotations

import io

import pytest

from mart.graph.reviewers import make_reviewer
from mart.graph.reviewers.base import AutoReviewer, DetachReviewer, TTYReviewer
from tests.support.toy_backend import MB

CANDIDATE = {"candidate_id": "sys-02-r0-c1", "source": "rules", "diff": [{"key": MB, "current": 2, "proposed": 8}],
             "rationale": "update_actor dominates the step", "overrides": {MB: 8},
             "critique": {"risk": "medium", "reasons": ["predicted peak 3.5 GB"]}, "predicted_memory_gb": 3.5}
REQUEST = {"run_id": "r1", "review_no": 2, "stage": "system", "candidates": [CANDIDATE], "memory_limit_gb": 3.6,
           "trials_done": 1, "error": None}


def _with(**cand):
    return {**REQUEST, "candidates": [{**CANDIDATE, **cand}]}


def test_auto_policies():
    assert AutoReviewer("all").review(_with(predicted_memory_gb=99.0)).action == "approve"
    assert AutoReviewer("margin").review(REQUEST).action == "approve"
    over = AutoReviewer("margin").review(_with(predicted_memory_gb=3.7))
    assert over.action == "reject" and "3.70 GB" in over.feedback and over.channel == "auto"
    # a batch: only the candidate over the margin is rejected, the rest approved
    batch = {**REQUEST, "candidates": [CANDIDATE, {**CANDIDATE, "candidate_id": "c2", "predicted_memory_gb": 4.0}]}
    per = AutoReviewer("margin").review(batch).for_candidates(["sys-02-r0-c1", "c2"])
    assert (per["sys-02-r0-c1"].type, per["c2"].type) == ("approve", "reject")
    with pytest.raises(ValueError, match="auto policy"):
        AutoReviewer("some")


def tty(answers: str) -> tuple[TTYReviewer, io.StringIO]:
    out = io.StringIO()
    return TTYReviewer(stdin=io.StringIO(answers), stdout=out), out


def test_tty_shows_the_candidate_and_asks_until_it_understands():
    reviewer, out = tty("x\ne\nnot-an-assignment\ne\n" + f"{MB}=4 +trainer.x=true\n")
    decision = reviewer.review(REQUEST)
    shown = out.getvalue()
    for needle in (f"{MB}: 2 -> 8", "update_actor dominates", "risk medium", "3.50 GB (limit 3.60 GB)",
                   "sys-02-r0-c1"):
        assert needle in shown
    assert "Please answer" in shown and "expected KEY=VALUE" in shown
    assert decision.action == "edit" and decision.edits == {MB: 4, "trainer.x": True} and decision.channel == "tty"


def test_tty_reject_detach_and_eof():
    reviewer, _ = tty("r\nsmaller micro batch\n")
    d = reviewer.review(REQUEST)
    assert (d.action, d.feedback) == ("reject", "smaller micro batch")
    assert tty("d\n")[0].review(REQUEST) is None
    assert tty("")[0].review(REQUEST) is None  # stdin closed: leave the run paused
    assert tty("a\n")[0].review(REQUEST).action == "approve"


def test_tty_decides_a_batch_all_at_once_or_each():
    batch = {**REQUEST, "candidates": [CANDIDATE, {**CANDIDATE, "candidate_id": "c2"}]}
    assert tty("A\n")[0].review(batch).for_candidates(["sys-02-r0-c1", "c2"])["c2"].type == "approve"
    reviewer, out = tty("e\na\nr\nnot this one\n")
    d = reviewer.review(batch)
    per = d.for_candidates(["sys-02-r0-c1", "c2"])
    assert (per["sys-02-r0-c1"].type, per["c2"].type, per["c2"].message) == ("approve", "reject", "not this one")
    assert "2 candidates for 2 free trial slots" in out.getvalue() and "[2] Candidate c2" in out.getvalue()
    q = tty("q\nwhy this one?\n")[0].review(batch)
    assert q.action == "respond" and q.feedback == "why this one?"


def test_factory():
    assert isinstance(make_reviewer("none"), DetachReviewer) and DetachReviewer().review(REQUEST) is None
    assert make_reviewer("auto", auto_policy="margin").policy == "margin"
    with pytest.raises(ValueError, match="unknown reviewer channel"):
        make_reviewer("email")
