"""The Slack channel in-process: Block Kit message, ledger record, no double post, channel fallback,
and a Slack outage that leaves the run paused instead of failed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("slack_sdk")

from slack_sdk import WebClient

from mart.graph.reviewers import make_reviewer
from mart.graph.reviewers.slack import (
    ACTION_APPROVE,
    SlackReviewer,
    parse_button_value,
    posted_messages,
    review_blocks,
)
from mart.graph.session import resume, run_status, tune
from mart.state.models import ReviewDecision
from mart.state.run_store import RunStore
from tests.graph.test_graph_session import options
from tests.support.slack_stub import SlackStub

TOKEN = "xoxb-unit-test-token"


@pytest.fixture
def stub():
    with SlackStub(TOKEN) as s:
        yield s


def test_review_is_posted_once_and_later_reviews_follow_the_run_channel(tmp_path, stub, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("MART_SLACK_API_URL", stub.api_url)
    monkeypatch.delenv("MART_SLACK_CHANNEL", raising=False)
    client = WebClient(token=TOKEN, base_url=stub.api_url)
    first = tune(options(tmp_path, approve="slack", learning_trials=0),
                 reviewer=SlackReviewer(channel="C0FIRST", client=client))
    assert first["status"] == "paused"
    [msg] = stub.of("chat.postMessage")
    blocks = msg["params"]["blocks"]
    text = json.dumps(blocks)
    req = first["pending_review"]
    for d in req["diff"]:  # the diff against the current best, rationale, critique, memory
        assert d["key"] in text
    assert "Rationale" in text and "Critic" in text and "Predicted peak memory" in text
    button = next(b for b in blocks if b["type"] == "actions")["elements"][0]
    assert button["action_id"] == ACTION_APPROVE
    assert parse_button_value(button["value"]) == {"run": req["run_id"], "interrupt": req["interrupt_id"],
                                                  "candidate": req["candidate_id"], "review": 1}
    store = RunStore.open(first["run_id"], tmp_path)
    [row] = posted_messages(store.ledger)
    assert (row["channel"], row["ts"]) == ("C0FIRST", msg["reply"]["ts"])

    # a resumed driver reaching the same pause does not post it again
    again = resume(first["run_id"], tmp_path, quiet=True)
    assert again["status"] == "paused" and len(stub.of("chat.postMessage")) == 1

    # answered from a terminal: the run's Slack channel (from the ledger) gets the next review
    second = resume(first["run_id"], tmp_path, quiet=True,
                    decision=ReviewDecision(action="approve", reviewer="bob", channel="cli"))
    assert second["pending_review"]["review_no"] == 2
    msgs = stub.of("chat.postMessage")
    assert len(msgs) == 2 and msgs[1]["params"]["channel"] == "C0FIRST"
    assert len(posted_messages(store.ledger)) == 2
    assert isinstance(make_reviewer("slack"), SlackReviewer)


def test_slack_outage_leaves_the_run_paused(tmp_path, capsys):
    dead = WebClient(token=TOKEN, base_url="http://127.0.0.1:9/api/", timeout=2)  # nothing listens on port 9
    out = tune(options(tmp_path, approve="slack"), reviewer=SlackReviewer(channel="C0X", client=dead))
    assert out["status"] == "paused"
    assert "could not post review #1 to Slack" in capsys.readouterr().err
    info = run_status(RunStore.open(out["run_id"], tmp_path))
    assert info["status"] == "paused" and info["waiting_for"] == "review"


def test_blocks_stay_within_slack_limits():
    req = {"run_id": "r1", "interrupt_id": "i" * 32, "candidate_id": "c1", "review_no": 1, "stage": "system",
           "rationale": "x" * 10_000, "diff": [{"key": f"k{i}", "current": i, "proposed": i + 1} for i in range(400)],
           "critique": {"risk": "low", "reasons": ["y" * 5000]}, "source": "rules"}
    for block in review_blocks(req):
        for text in [block.get("text", {}).get("text", "")] + [f["text"] for f in block.get("fields", [])]:
            assert len(text) <= 3000
