"""A Slack review of several candidates (``--parallel``): one message, a button row per candidate and one for all;
a click on one candidate is kept until every candidate has a decision, then they go to the run together."""

from __future__ import annotations

import json
import secrets
import time

import pytest

pytest.importorskip("slack_bolt")

from slack_bolt.request import BoltRequest
from slack_sdk.signature import SignatureVerifier

from mart.graph.reviewers.slack import slack_client
from mart.graph.reviewers.slack_blocks import ACTION_APPROVE, ACTION_REJECT, review_blocks
from mart.graph.session import pending_review, tune
from mart.graph.slack_service import SlackReviewService
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore
from tests.support.slack_stub import SlackStub

TOKEN = "xoxb-test-" + secrets.token_hex(8)
SECRET = "signing-" + secrets.token_hex(8)
ALICE = "U0ALICE"
TOY = "tests.support.toy_backend:make_backend"


def _dispatch(service: SlackReviewService, payload: dict) -> int:
    body = "payload=" + json.dumps(payload)
    ts = str(int(time.time()))
    headers = {"content-type": ["application/x-www-form-urlencoded"], "x-slack-request-timestamp": [ts],
               "x-slack-signature": [SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)]}
    return service.dispatch(BoltRequest(body=body, headers=headers)).status


def _click(row: dict, action_id: str) -> dict:
    button = next(e for e in row["elements"] if e["action_id"] == action_id)
    return {"type": "block_actions", "user": {"id": ALICE, "username": "alice"}, "api_app_id": "A0MART",
            "team": {"id": "T0MART"}, "trigger_id": "trig-1", "channel": {"id": "C0R"},
            "container": {"type": "message", "message_ts": "1.000001", "channel_id": "C0R"},
            "message": {"ts": "1.000001", "text": "review"},
            "actions": [{"type": "button", "action_id": action_id, "block_id": row["block_id"],
                         "value": button["value"], "action_ts": str(time.time())}]}


def test_a_batch_is_decided_candidate_by_candidate_then_applied_together(tmp_path):
    out = tune(TuneOptions(backend=TOY, approve="none", runs_dir=str(tmp_path), system_trials=5, learning_trials=0,
                           system_horizon=2, watch_interval_s=0.01, quiet=True, parallel=3, report=False))
    run = out["run_id"]
    store = RunStore.open(run, tmp_path)
    request = pending_review(store)
    store.close()
    ids = [c["candidate_id"] for c in request["candidates"]]
    assert len(ids) >= 2, request  # the batch beside the baseline
    blocks = review_blocks(request)
    rows = [b for b in blocks if b["type"] == "actions"]
    assert len(rows) == len(ids) + 1  # one row per candidate, one for all of them
    assert all(json.loads(r["elements"][0]["value"])["candidate"] == cid for r, cid in zip(rows, ids))
    assert json.loads(rows[-1]["elements"][0]["value"])["candidate"] is None
    with SlackStub(TOKEN) as stub:
        service = SlackReviewService(tmp_path, signing_secret=SECRET, reviewers={ALICE},
                                     client=slack_client(stub.api_url, TOKEN), token_verification=False)
        # approve the first candidate alone: kept, nothing runs yet, the clicker is told what is left
        assert _dispatch(service, _click(rows[0], ACTION_APPROVE)) == 200
        [note] = stub.wait_for("chat.postEphemeral")
        assert "Recorded" in note["params"]["text"] and ids[1] in note["params"]["text"]
        assert len(Ledger.open(tmp_path / run).trials()) == 1 and not stub.of("chat.update")
        # then approve all the rest: every candidate has a decision, they go together
        assert _dispatch(service, _click(rows[-1], ACTION_APPROVE)) == 200
        assert service.wait_idle(timeout=60)
    ledger = Ledger.open(tmp_path / run)
    reviews = [r for r in ledger.table_rows("reviews") if r["review_no"] == request["review_no"]]
    assert sorted(r["candidate_id"] for r in reviews) == sorted(ids)
    assert all(r["action"] == "approve" and r["channel"] == "slack" for r in reviews)
    ran = {t["candidate_id"] for t in ledger.trials()}
    assert set(ids) <= ran
    ledger.close()


def test_a_reject_button_on_one_candidate_opens_its_form(tmp_path):
    out = tune(TuneOptions(backend=TOY, approve="none", runs_dir=str(tmp_path), system_trials=5, learning_trials=0,
                           system_horizon=2, watch_interval_s=0.01, quiet=True, parallel=3, report=False))
    store = RunStore.open(out["run_id"], tmp_path)
    request = pending_review(store)
    store.close()
    rows = [b for b in review_blocks(request) if b["type"] == "actions"]
    with SlackStub(TOKEN) as stub:
        service = SlackReviewService(tmp_path, signing_secret=SECRET, reviewers={ALICE},
                                     client=slack_client(stub.api_url, TOKEN), token_verification=False)
        assert _dispatch(service, _click(rows[1], ACTION_REJECT)) == 200
        [opened] = stub.wait_for("views.open")
    view = opened["params"]["view"]
    view = json.loads(view) if isinstance(view, str) else view
    assert json.loads(view["private_metadata"])["candidate"] == request["candidates"][1]["candidate_id"]
    assert request["candidates"][1]["candidate_id"] in json.dumps(view["blocks"])
