"""The Slack channel in-process: Block Kit message, ledger record, no double post, channel fallback,
and a Slack outage that leaves the run paused instead of failed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("slack_sdk")

from slack_sdk import WebClient

from mart.graph.reviewers import make_reviewer
from mart.graph.reviewers.slack import SlackReviewer, posted_messages
from mart.graph.reviewers.slack_blocks import ACTION_APPROVE, parse_button_value, review_blocks
from mart.graph.session import resume, run_status, tune
from mart.state.models import ReviewDecision
from mart.state.run_store import RunStore
from tests.graph.test_graph_session import options
from tests.support.reviews import only
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
    for d in only(req)["diff"]:  # the diff against the current best, rationale, critique, memory
        assert d["key"] in text
    assert "Rationale" in text and "Critic" in text and "Predicted peak memory" in text
    button = next(b for b in blocks if b["type"] == "actions")["elements"][0]
    assert button["action_id"] == ACTION_APPROVE
    assert parse_button_value(button["value"]) == {"run": req["run_id"], "interrupt": req["interrupt_id"],
                                                  "candidate": only(req)["candidate_id"], "review": 1}
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
    msgs = [m for m in stub.of("chat.postMessage") if not m["params"].get("thread_ts")]  # reviews, not thread lines
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


def test_checks_at_start_name_every_problem(stub, monkeypatch):
    from mart.graph.reviewers.slack import SlackConfigError

    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    monkeypatch.delenv("MART_SLACK_CHANNEL", raising=False)
    with pytest.raises(SlackConfigError) as e:
        SlackReviewer(api_url=stub.api_url).check()
    assert "SLACK_BOT_TOKEN" in str(e.value) and "channel" in str(e.value)  # both at once, not one per try
    with pytest.raises(SlackConfigError, match="token was refused.*invalid_auth"):
        SlackReviewer(channel="C0X", client=WebClient(token="xoxb-wrong", base_url=stub.api_url)).check()
    stub.missing_channels.add("C0GONE")
    with pytest.raises(SlackConfigError, match="C0GONE cannot be used.*channel_not_found"):
        SlackReviewer(channel="C0GONE", client=WebClient(token=TOKEN, base_url=stub.api_url)).check()
    SlackReviewer(channel="C0OK", client=WebClient(token=TOKEN, base_url=stub.api_url)).check()
    assert [c["method"] for c in stub.calls][-2:] == ["auth.test", "conversations.info"]


def test_trial_results_and_the_summary_go_into_the_review_thread(tmp_path, stub, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    client = WebClient(token=TOKEN, base_url=stub.api_url)
    first = tune(options(tmp_path, approve="slack", system_trials=2, learning_trials=0),
                 reviewer=SlackReviewer(channel="C0RUN", client=client))
    [review] = stub.of("chat.postMessage")
    done = resume(first["run_id"], tmp_path, quiet=True, reviewer=SlackReviewer(channel="C0RUN", client=client),
                  decision=ReviewDecision(action="approve", reviewer="bob", channel="cli"))
    assert done["status"] == "completed"
    thread = [c["params"] for c in stub.of("chat.postMessage") if c["params"].get("thread_ts")]
    assert thread and all(t["thread_ts"] == review["reply"]["ts"] and t["channel"] == "C0RUN" for t in thread)
    texts = [t["text"] for t in thread]
    assert any("✓ sys-02" in t and "tok/s" in t for t in texts)  # the candidate's result, with units
    assert "completed" in texts[-1] and "system stage" in texts[-1]  # the stage summary at the end


def test_a_review_that_could_not_be_posted_exits_non_zero(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("MART_SLACK_CHANNEL", "C0X")
    monkeypatch.setattr(SlackReviewer, "check", lambda self: None)  # the endpoint dies after the start checks
    monkeypatch.setenv("MART_SLACK_API_URL", "http://127.0.0.1:9/api/")
    res = CliRunner().invoke(app, ["tune", "--backend", "tests.support.toy_backend:make_backend", "--approve",
                                   "slack", "--runs-dir", str(tmp_path), "--system-trials", "2",
                                   "--learning-trials", "0", "-q"])
    assert res.exit_code == 1 and "could not post review #1" in res.output
