"""Slack approvals end to end: `mart tune --approve slack` posts to a local Slack API stub and exits;
the real `mart slack serve` (127.0.0.1) gets signed clicks and form submissions and continues the run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("slack_bolt")
psutil = pytest.importorskip("psutil")

from slack_sdk.signature import SignatureVerifier

from mart.graph.reviewers.slack import posted_messages
from mart.graph.reviewers.slack_blocks import (
    ACTION_APPROVE,
    ACTION_EDIT,
    ACTION_REJECT,
    EDITS_BLOCK,
    EDITS_INPUT,
    FEEDBACK_BLOCK,
    FEEDBACK_INPUT,
    MODAL_CALLBACK,
)
from mart.state.ledger import Ledger
from tests.support.paths import REPO as REPO_ROOT
from tests.support.reviews import only
from tests.support.slack_stub import SlackStub
from tests.support.toy_backend import CKPT, MB, SEQS

REPO = REPO_ROOT
TOKEN = "xoxb-test-" + secrets.token_hex(12)
SECRET = "signing-" + secrets.token_hex(16)
ALICE, MALLORY, CHANNEL = "U0ALICE", "U0MALLORY", "C0REVIEWS"
FEEDBACK = "don't touch max_num_seqs; increase the ppo_micro_batch_size_per_gpu instead"



def TOP(call) -> bool:
    """A review message (trial results go into its thread, with thread_ts)."""
    return not call["params"].get("thread_ts")


def DECIDED(call) -> bool:
    """An update of a review message (the decision, as blocks), not of the thread's live progress message."""
    return bool(call["params"].get("blocks"))

def mart(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mart.graph.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def signed_post(url: str, payload: dict, *, secret: str = SECRET, stamp: int | None = None) -> tuple[int, str]:
    body = urlencode({"payload": json.dumps(payload)})
    ts = str(stamp if stamp is not None else int(time.time()))
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
               "X-Slack-Signature": SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)}
    req = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def click(message: dict, action_id: str, user: str = ALICE) -> dict:
    """A ``block_actions`` payload as Slack sends it for a click on the posted review message."""
    actions = next(b for b in message["params"]["blocks"] if b["type"] == "actions")
    button = next(e for e in actions["elements"] if e["action_id"] == action_id)
    ts, channel = message["reply"]["ts"], message["reply"]["channel"]
    return {
        "type": "block_actions", "user": {"id": user, "username": user.lower(), "team_id": "T0MART"},
        "api_app_id": "A0MART", "token": "legacy-unused", "trigger_id": f"trig-{secrets.token_hex(4)}",
        "team": {"id": "T0MART", "domain": "mart-test"}, "channel": {"id": channel, "name": "reviews"},
        "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
        "message": {"type": "message", "ts": ts, "text": message["params"].get("text"),
                    "blocks": message["params"]["blocks"]},
        "response_url": "http://127.0.0.1:9/unused",
        "actions": [{"type": "button", "action_id": action_id, "block_id": actions["block_id"],
                     "value": button["value"], "action_ts": str(time.time())}],
    }


def submit(view: dict, values: dict[str, tuple[str, str]], user: str = ALICE) -> dict:
    """A ``view_submission`` payload for the opened modal with the given input values."""
    return {
        "type": "view_submission", "team": {"id": "T0MART", "domain": "mart-test"},
        "user": {"id": user, "username": user.lower(), "team_id": "T0MART"}, "api_app_id": "A0MART",
        "trigger_id": f"trig-{secrets.token_hex(4)}",
        "view": {"id": "V0MODAL", "type": "modal", "callback_id": view["callback_id"],
                 "private_metadata": view["private_metadata"], "hash": "h",
                 "state": {"values": {block: {action: {"type": "plain_text_input", "value": value}}
                                      for block, (action, value) in values.items()}}},
        "response_urls": [],
    }


@pytest.fixture
def stub():
    with SlackStub(TOKEN) as s:
        yield s


@pytest.fixture
def env(stub):
    return {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SECRET, "MART_SLACK_API_URL": stub.api_url,
            "MART_SLACK_REVIEWERS": f"{ALICE},U0BOB", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def server(tmp_path, env):
    proc = subprocess.Popen([sys.executable, "-m", "mart.graph.cli", "slack", "serve", "--mode", "http", "--port", "0", "--runs-dir",
                             str(tmp_path), "--verbose"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        pytest.fail(f"mart slack serve did not start: {line}{proc.stderr.read()}")
    url = line.split("listening on ", 1)[1].split()[0]
    yield proc, url
    if proc.poll() is None:
        proc.terminate()  # by its pid: SIGTERM, a clean shutdown
        proc.communicate(timeout=20)


def trials(run_dir: Path) -> list[dict]:
    return Ledger.open(run_dir).trials()


def wait_paused(run_dir: Path, timeout: float = 20) -> None:
    """Until no process drives the run (the server's worker released its writer lock)."""
    from mart.state.run_store import RunStore

    store = RunStore(run_dir, run_dir.name)
    deadline = time.monotonic() + timeout
    while store.lock_holder() is not None:
        assert time.monotonic() < deadline, "the run is still being driven"
        time.sleep(0.05)


def test_slack_review_round_trip(tmp_path, stub, env, server):
    proc, url = server
    # 1. the tuner posts review #1 and exits: the pause costs nothing
    out = mart("tune", "--backend", "tests.support.toy_backend:make_backend", "--approve", "slack", "--slack-channel", CHANNEL,
               "--runs-dir", str(tmp_path), "--system-trials", "4", "--learning-trials", "0", "--system-horizon", "3",
               "--system-remeasure-share", "0.25",
               "--json", "-q", env=env)
    assert out.returncode == 0, out.stderr
    paused = json.loads(out.stdout)
    run, run_dir = paused["run_id"], tmp_path / paused["run_id"]
    assert paused["status"] == "paused"
    [msg1] = stub.wait_for("chat.postMessage", TOP)
    assert msg1["authorized"] and msg1["params"]["channel"] == CHANNEL
    value = json.loads(next(b for b in msg1["params"]["blocks"] if b["type"] == "actions")["elements"][0]["value"])
    assert value["run"] == run and value["interrupt"] == paused["pending_review"]["interrupt_id"]
    assert only(paused["pending_review"])["candidate_id"] in json.dumps(msg1["params"]["blocks"])
    assert [m["ts"] for m in posted_messages(Ledger.open(run_dir))] == [msg1["reply"]["ts"]]
    assert len(trials(run_dir)) == 1  # the baseline
    assert stub.of("auth.test"), "bolt checks the token at start"

    # 2. idle: the server sleeps in select, no CPU
    p = psutil.Process(proc.pid)
    before = sum(p.cpu_times()[:2])
    time.sleep(2.0)
    # a busy loop burns the whole 2 s; select() burns ~none. 10% leaves room for a loaded box's accounting
    assert sum(p.cpu_times()[:2]) - before < 0.2

    # 3. forged or unknown: nothing changes
    status, _ = signed_post(url, click(msg1, ACTION_APPROVE), secret="not-the-secret")
    assert status == 401
    status, _ = signed_post(url, click(msg1, ACTION_APPROVE), stamp=int(time.time()) - 3600)  # replayed
    assert status == 401
    status, _ = signed_post(url, click(msg1, ACTION_APPROVE, user=MALLORY))
    assert status == 403
    [note] = stub.wait_for("chat.postEphemeral")
    assert note["params"]["user"] == MALLORY and "allow-list" in note["params"]["text"]
    assert len(trials(run_dir)) == 1 and not stub.of("chat.update") and not Ledger.open(run_dir).table_rows("reviews")

    # 4. Alice approves: the message says who decided what, a trial runs, review #2 is posted
    status, _ = signed_post(url, click(msg1, ACTION_APPROVE))
    assert status == 200
    [upd] = stub.wait_for("chat.update", DECIDED)
    assert upd["params"]["ts"] == msg1["reply"]["ts"] and upd["params"]["channel"] == CHANNEL
    assert f"<@{ALICE}> approved" in json.dumps(upd["params"]["blocks"])
    assert not any(b["type"] == "actions" for b in upd["params"]["blocks"])
    msg2 = stub.wait_for("chat.postMessage", TOP, count=2)[1]
    rows = trials(run_dir)
    assert len(rows) == 2 and rows[1]["candidate_id"] == only(paused["pending_review"])["candidate_id"]
    [rev] = Ledger.open(run_dir).table_rows("reviews")
    assert rev["action"] == "approve" and rev["channel"] == "slack" and ALICE in rev["reviewer"]
    # the decision went back with review #1's interrupt id; review #2 carries its own
    value2 = json.loads(next(b for b in msg2["params"]["blocks"] if b["type"] == "actions")["elements"][0]["value"])
    assert value2["interrupt"] != value["interrupt"] and value2["review"] == 2
    # review #1's thread showed the trial live: a progress message naming it, edited once it had ended
    wait_paused(run_dir)
    thread1 = msg1["reply"]["ts"]
    [live] = [c for c in stub.of("chat.postMessage")
              if c["params"].get("thread_ts") == thread1 and "running now" in c["params"]["text"]]
    assert rows[1]["trial_id"] in live["params"]["text"] and "step" in live["params"]["text"]
    edits = [c for c in stub.of("chat.update") if c["params"]["ts"] == live["reply"]["ts"]]
    assert edits and "no trial running" in edits[-1]["params"]["text"]
    assert any(rows[1]["trial_id"] in c["params"]["text"] and "✓" in c["params"]["text"]
               for c in stub.of("chat.postMessage") if c["params"].get("thread_ts") == thread1)

    # 5. a second click on the decided message: an ephemeral note, nothing else
    wait_paused(run_dir)
    status, _ = signed_post(url, click(msg1, ACTION_APPROVE))
    assert status == 200
    note = stub.wait_for("chat.postEphemeral", count=2)[1]
    assert note["params"]["user"] == ALICE and "already decided" in note["params"]["text"]
    assert len(trials(run_dir)) == 2 and len([u for u in stub.of("chat.update") if DECIDED(u)]) == 1 and len([c for c in stub.of("chat.postMessage") if TOP(c)]) == 2

    # 6. reject with feedback through the form: a revised candidate comes back as review #3
    status, _ = signed_post(url, click(msg2, ACTION_REJECT))
    assert status == 200
    [opened] = stub.wait_for("views.open")
    view = opened["params"]["view"]
    assert view["callback_id"] == MODAL_CALLBACK and opened["params"]["trigger_id"].startswith("trig-")
    status, body = signed_post(url, submit(view, {FEEDBACK_BLOCK: (FEEDBACK_INPUT, "  ")}))
    assert status == 200 and json.loads(body)["response_action"] == "errors"  # empty feedback is refused
    status, body = signed_post(url, submit(view, {FEEDBACK_BLOCK: (FEEDBACK_INPUT, FEEDBACK)}))
    assert status == 200 and "errors" not in body
    msg3 = stub.wait_for("chat.postMessage", TOP, count=3)[2]
    wait_paused(run_dir)
    upd2 = stub.wait_for("chat.update", DECIDED, count=2)[1]
    assert upd2["params"]["ts"] == msg2["reply"]["ts"] and "rejected" in json.dumps(upd2["params"]["blocks"])
    reviews = Ledger.open(run_dir).table_rows("reviews")
    assert reviews[-1]["action"] == "reject" and reviews[-1]["feedback"] == FEEDBACK
    info = json.loads(mart("status", run, "--runs-dir", str(tmp_path), "--json", env=env).stdout)
    req3 = info["pending_review"]
    assert req3["review_no"] == 3 and req3["interrupt_id"] in json.dumps(msg3["params"]["blocks"])
    changed = {d["key"] for d in only(req3)["diff"]}
    assert MB in changed and SEQS not in changed  # the feedback reached the proposer
    assert len(trials(run_dir)) == 2  # a rejection runs nothing

    # 7. an invalid edit is refused inside the form; the run stays at review #3
    status, _ = signed_post(url, click(msg3, ACTION_EDIT))
    edit_view = stub.wait_for("views.open", count=2)[1]["params"]["view"]
    status, body = signed_post(url, submit(edit_view, {EDITS_BLOCK: (EDITS_INPUT, f"{MB}=10000")}))
    assert status == 200
    answer = json.loads(body)
    assert answer["response_action"] == "errors" and "must lie in" in answer["errors"][EDITS_BLOCK]

    # 8. two clicks at once on review #3: exactly one decision is applied
    results = []
    threads = [threading.Thread(target=lambda: results.append(signed_post(url, click(msg3, ACTION_APPROVE))))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [200, 200]
    stub.wait_for("chat.postMessage", TOP, count=4)  # review #4
    wait_paused(run_dir)
    refused = stub.wait_for("chat.postEphemeral", count=3)[2]
    assert refused["params"]["user"] == ALICE
    assert "already" in refused["params"]["text"]
    time.sleep(0.3)
    assert len([u for u in stub.of("chat.update") if u["params"]["ts"] == msg3["reply"]["ts"]]) == 1
    assert len(trials(run_dir)) == 3
    assert len(Ledger.open(run_dir).table_rows("reviews")) == 3
    cids = [t["candidate_id"] for t in trials(run_dir) if t["candidate_id"]]
    assert len(cids) == len(set(cids))

    # 9. a valid edit through the form runs the edited config; the last trial ends the run
    msg4 = [c for c in stub.of("chat.postMessage") if TOP(c)][3]
    status, _ = signed_post(url, click(msg4, ACTION_EDIT))
    edit_view = stub.wait_for("views.open", count=3)[2]["params"]["view"]
    prefilled = edit_view["blocks"][1]["element"]["initial_value"].splitlines()  # the candidate's own knobs
    assert prefilled and all("=" in line for line in prefilled)
    status, body = signed_post(url, submit(edit_view, {EDITS_BLOCK: (EDITS_INPUT, f"{CKPT}=false"),
                                                       FEEDBACK_BLOCK: (FEEDBACK_INPUT, "try without checkpointing")}))
    assert status == 200 and "errors" not in body
    done = stub.wait_for("chat.postMessage", lambda c: "mart run" in c["params"]["text"]
                         and "completed" in c["params"]["text"])[0]
    assert done["params"]["channel"] == CHANNEL and "report:" in done["params"]["text"]
    # each trial's result went into the thread of its review, with units
    thread = [c["params"] for c in stub.of("chat.postMessage") if not TOP(c)]
    assert any("tok/s" in t["text"] and t["thread_ts"] == msg1["reply"]["ts"] for t in thread)
    upd4 = [u for u in stub.of("chat.update") if u["params"]["ts"] == msg4["reply"]["ts"]]
    assert len(upd4) == 1 and "edited" in json.dumps(upd4[0]["params"]["blocks"])
    wait_paused(run_dir)
    rows = trials(run_dir)
    assert len(rows) == 4 and rows[-1]["config"][CKPT] is False
    assert Ledger.open(run_dir).run(run)["status"] == "completed"

    # 10. secrets reach neither the run's files nor the server's output
    proc.terminate()
    out_, err_ = proc.communicate(timeout=20)
    assert proc.returncode == 0, err_
    for f in run_dir.glob("mart.sqlite*"):
        data = f.read_bytes()
        assert TOKEN.encode() not in data and SECRET.encode() not in data
    for text in (out_, err_, out.stdout, out.stderr):
        assert TOKEN not in text and SECRET not in text
    assert re.search(rf"review #\d+: approve \S+ by {ALICE}", err_)  # the verbose log names decisions, not secrets


def test_tune_with_slack_needs_a_token_and_a_channel(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    for key in ("SLACK_BOT_TOKEN", "MART_SLACK_CHANNEL", "SLACK_SIGNING_SECRET", "MART_SLACK_REVIEWERS"):
        monkeypatch.delenv(key, raising=False)
    tune = ["tune", "--backend", "tests.support.toy_backend:make_backend", "--approve", "slack", "--runs-dir", str(tmp_path)]
    out = CliRunner().invoke(app, tune)
    assert out.exit_code == 2 and "SLACK_BOT_TOKEN" in out.output
    out = CliRunner().invoke(app, tune, env={"SLACK_BOT_TOKEN": TOKEN})
    assert out.exit_code == 2 and "--slack-channel" in out.output
    assert not list(tmp_path.iterdir())  # refused before a run was created
    serve = ["slack", "serve", "--mode", "http", "--port", "0", "--runs-dir", str(tmp_path)]
    out = CliRunner().invoke(app, serve, env={"SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SECRET})
    assert out.exit_code == 2 and "no reviewers" in out.output
    out = CliRunner().invoke(app, [*serve, "--reviewer", ALICE], env={"SLACK_BOT_TOKEN": TOKEN})
    assert out.exit_code == 2 and "SLACK_SIGNING_SECRET" in out.output


def test_live_progress_stays_within_slacks_rate_limits():
    from mart.graph.reviewers.slack import LiveProgress
    from mart.nodes.progress import TrialDone, TrialLaunched, TrialStep

    now = [0.0]
    posts, edits = [], []
    live = LiveProgress(post=lambda text: posts.append((now[0], text)) or "ts1",
                        update=lambda ts, text: edits.append((now[0], text)), interval_s=5.0, floor_s=1.0,
                        clock=lambda: now[0])
    for i in range(4):  # four trials in flight, each logging a step every 0.1 s for a minute
        live.event(TrialLaunched(trial_id=f"t{i}", stage="learning", kind="candidate", horizon=600, changes=["lr=1"]))
    for k in range(600):
        now[0] = k * 0.1
        for i in range(4):
            live.event(TrialStep(trial_id=f"t{i}", stage="learning", step=k + 1, val_score=0.5))
    now[0] = 60.0
    live.event(TrialDone(trial_id="t0", status="completed", eligible=True))
    live.push(force=True)
    assert len(posts) == 1 and "t0" in posts[0][1] and any("t3" in text for _, text in edits)
    times = [t for t, _ in edits]
    assert len(edits) <= 60 / 5.0 + 2  # at most one edit per interval, plus the end and the flush
    assert all(b - a >= 1.0 for a, b in zip(times, times[1:]))  # never two within Slack's 1 s
    assert "t0" not in edits[-1][1] and "t1" in edits[-1][1] and "step 600/600" in edits[-1][1]
