"""Issue 17 item 5: the Slack endpoint survives the internet (HTTP on uvicorn), and Socket Mode works.

HTTP: malformed unsigned requests get 401 (nothing is parsed before the signature check), a bad
Content-Length gets 400, a connection that never sends a request is closed. Socket Mode: slack_bolt's
built-in client against a local WebSocket stub (the ``apps.connections.open`` answer points at it).
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("slack_bolt")
pytest.importorskip("uvicorn")

from slack_sdk.signature import SignatureVerifier

from mart.graph import slack_server
from mart.graph.reviewers.slack import slack_client
from mart.graph.reviewers.slack_blocks import ACTION_APPROVE, button_value
from mart.graph.session import pending_review, tune
from mart.graph.slack_service import SlackReviewService
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore
from tests.support.slack_stub import SlackStub

TOKEN = "xoxb-test-" + secrets.token_hex(8)
APP_TOKEN = "xapp-test-" + secrets.token_hex(8)
SECRET = "signing-" + secrets.token_hex(8)
ALICE, MALLORY = "U0ALICE", "U0MALLORY"
TOY = "tests.support.toy_backend:make_backend"


def paused_run(tmp_path) -> str:
    out = tune(TuneOptions(backend=TOY, approve="none", runs_dir=str(tmp_path), system_trials=2, learning_trials=0,
                           system_horizon=2, watch_interval_s=0.01, quiet=True, system_remeasure_share=0.25))
    return out["run_id"]


@pytest.fixture
def http(tmp_path, monkeypatch):
    monkeypatch.setattr(slack_server, "IDLE_TIMEOUT_S", 1)
    with SlackStub(TOKEN) as stub:
        service = SlackReviewService(tmp_path, signing_secret=SECRET, reviewers={ALICE},
                                     client=slack_client(stub.api_url, TOKEN), token_verification=False)
        server, sock = slack_server.http_server(service, "127.0.0.1", 0)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        server.install_signal_handlers = lambda: None  # not the main thread
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield sock.getsockname()[1]
        server.should_exit = True
        thread.join(10)


def raw(port: int, data: bytes, wait: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    break
        except TimeoutError:
            pass
        return b"".join(chunks)


def post(port: int, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/slack/events", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return resp.status == 200


def test_malformed_unsigned_requests_get_401(http):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for body in (b"payload=%7Bnot-json", b"payload=" + b"%5B" * 1000, b"\xff\xfe\x00", b""):
        assert post(http, body, form) == 401
    assert post(http, b"{", {"Content-Type": "application/json"}) == 401
    assert healthy(http)


def test_bad_signatures_are_logged_at_warning_once_per_window(http, caplog):
    caplog.set_level(logging.WARNING, logger="mart.slack")
    form = {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": str(int(time.time())),
            "X-Slack-Signature": "v0=" + "0" * 64}
    for _ in range(3):
        assert post(http, b"payload=%7B%7D", form) == 401
    refused = [r for r in caplog.records if "invalid or stale Slack signature" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING  # a flood is one line per window
    assert "127.0.0.1" in refused[0].getMessage()


def test_no_misleading_token_warning_and_warm_up_loads_the_decision_path(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)  # bolt's own fallback: it would warn that `token` is unused
    caplog.set_level(logging.WARNING)
    # unload the session module for this test only: the package attribute too, else the fresh import made by
    # warm_up() stays bound as mart.graph.session after teardown while sys.modules holds the old one (a later
    # monkeypatch of the module would then patch the wrong object)
    import mart.graph

    monkeypatch.delitem(sys.modules, "mart.graph.session", raising=False)
    monkeypatch.delattr(mart.graph, "session", raising=False)
    service = SlackReviewService(tmp_path, signing_secret=SECRET, reviewers={ALICE},
                                 client=slack_client("http://127.0.0.1:9/api/", TOKEN), token_verification=False)
    assert not [r for r in caplog.records if "unused" in r.getMessage()]
    assert "mart.graph.session" not in sys.modules
    service.warm_up()
    assert "mart.graph.session" in sys.modules and "langgraph.checkpoint.sqlite" in sys.modules


def test_signed_but_malformed_body_is_refused_not_crashed(http):
    body = "payload=%7Bnot-json"
    ts = str(int(time.time()))
    sig = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)
    status = post(http, body.encode(), {"Content-Type": "application/x-www-form-urlencoded",
                                         "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig})
    assert status in (400, 404) and healthy(http)


def test_bad_content_length_and_oversized_bodies(http):
    reply = raw(http, b"POST /slack/events HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    reply = raw(http, b"POST /slack/events HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413")
    assert healthy(http)


def test_idle_and_slow_connections_are_closed(http):
    idle = socket.create_connection(("127.0.0.1", http), timeout=10)
    slow = socket.create_connection(("127.0.0.1", http), timeout=10)
    slow.sendall(b"POST /slack/events HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    start = time.monotonic()
    assert idle.recv(1) == b"" and slow.recv(1) == b""  # closed by the server
    assert time.monotonic() - start < 5
    idle.close()
    slow.close()
    assert healthy(http)


# -- Socket Mode ------------------------------------------------------------------------------------
def test_socket_mode_click_is_acked_and_continues_the_run(tmp_path):
    from websockets.sync.server import serve as ws_serve

    run = paused_run(tmp_path)
    store = RunStore.open(run, tmp_path)
    request = pending_review(store)
    store.close()
    acks: queue.Queue = queue.Queue()
    to_send: queue.Queue = queue.Queue()

    def session(ws):
        ws.send(json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0MART"}}))
        while True:
            try:
                envelope = to_send.get(timeout=0.1)
                ws.send(json.dumps(envelope))
            except queue.Empty:
                pass
            try:
                msg = ws.recv(timeout=0.1)
            except TimeoutError:
                continue
            except Exception:
                return
            acks.put(json.loads(msg))

    def click(user: str, env_id: str) -> dict:
        value = button_value(request)
        return {"envelope_id": env_id, "type": "interactive", "accepts_response_payload": False, "payload": {
            "type": "block_actions", "user": {"id": user, "username": user.lower()}, "api_app_id": "A0MART",
            "team": {"id": "T0MART"}, "trigger_id": "trig-1", "channel": {"id": "C0R"},
            "container": {"type": "message", "message_ts": "1.000001", "channel_id": "C0R"},
            "message": {"ts": "1.000001", "text": "review"},
            "actions": [{"type": "button", "action_id": ACTION_APPROVE, "block_id": "b", "value": value,
                         "action_ts": str(time.time())}]}}

    with ws_serve(session, "127.0.0.1", 0) as ws_server:
        threading.Thread(target=ws_server.serve_forever, daemon=True).start()
        port = ws_server.socket.getsockname()[1]
        with SlackStub(TOKEN, app_token=APP_TOKEN, socket_url=f"ws://127.0.0.1:{port}/") as stub:
            service = SlackReviewService(tmp_path, signing_secret=None, reviewers={ALICE},
                                         client=slack_client(stub.api_url, TOKEN), token_verification=False)
            handler = slack_server.socket_mode_handler(service, app_token=APP_TOKEN)
            handler.connect()
            try:
                to_send.put(click(MALLORY, "env-mallory"))
                ack = acks.get(timeout=20)
                assert ack["envelope_id"] == "env-mallory"
                stub.wait_for("chat.postEphemeral")
                to_send.put(click(ALICE, "env-alice"))
                deadline = time.monotonic() + 20
                while True:
                    ack = acks.get(timeout=max(0.1, deadline - time.monotonic()))
                    if ack["envelope_id"] == "env-alice":
                        break
                [upd] = stub.wait_for("chat.update", lambda c: bool(c["params"].get("blocks")))
                assert f"<@{ALICE}> approved" in json.dumps(upd["params"]["blocks"])
                assert service.wait_idle(timeout=30)
            finally:
                handler.close()
    assert stub.of("apps.connections.open")[0]["authorized"]
    ledger = Ledger.open(tmp_path / run)
    assert ledger.run(run)["status"] == "completed" and len(ledger.trials()) == 2
    reviews = ledger.table_rows("reviews")
    assert [r["action"] for r in reviews] == ["approve"] and ALICE in reviews[0]["reviewer"]
    ledger.close()


def test_socket_mode_needs_an_app_token(tmp_path, monkeypatch):
    from mart.graph.reviewers.slack import SlackConfigError

    monkeypatch.delenv("SLACK_APP_TOKEN", raising=False)
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    with pytest.raises(SlackConfigError, match="SLACK_APP_TOKEN"):
        slack_server.serve(tmp_path, reviewers=[ALICE], mode="socket")


# -- issue 26 item 6: bad timestamps, malformed signed payloads, slow headers ---------------------------------
def _signed(body: str, ts: str | None = None) -> dict[str, str]:
    ts = ts or str(int(time.time()))
    return {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}


def _tracebacks(caplog) -> list:
    return [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_bad_timestamps_get_401_without_a_traceback(http, caplog):
    caplog.set_level(logging.INFO)
    for ts in ("abc", "1.5e9", "", "-1", "99999999999999999999999"):
        headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
                   "X-Slack-Signature": "v0=" + "0" * 64}
        assert post(http, b"payload=%7B%7D", headers) == 401, ts
    assert _tracebacks(caplog) == [] and healthy(http)
    assert len([r for r in caplog.records if r.name == "mart.slack"]) <= 1  # one line per window, not per request


def test_signed_but_malformed_payloads_get_4xx_and_one_log_line(http, caplog):
    caplog.set_level(logging.INFO)
    bad_user = {"type": "block_actions", "user": ["U0ALICE"], "actions": [{"action_id": ACTION_APPROVE, "value": "{}"}]}
    bad_meta = {"type": "view_submission", "user": {"id": ALICE}, "view": {"callback_id": "mart_decision",
                "private_metadata": "[1, 2]", "state": {"values": {}}}}
    bad_value = {"type": "block_actions", "user": {"id": ALICE}, "trigger_id": "t", "channel": {"id": "C1"},
                 "actions": [{"action_id": ACTION_APPROVE, "value": "[1]"}], "container": {"message_ts": "1"}}
    import urllib.parse

    for payload in (bad_user, bad_meta, bad_value, {"type": "block_actions", "user": {"id": 5}}) * 3:
        body = "payload=" + urllib.parse.quote(json.dumps(payload))
        status = post(http, body.encode(), _signed(body))
        assert 200 <= status < 500, (payload, status)
    assert _tracebacks(caplog) == [], [r.getMessage() for r in _tracebacks(caplog)]
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 3
    assert healthy(http)


def test_slow_header_clients_are_capped_and_healthz_stays_up(tmp_path, monkeypatch):
    monkeypatch.setattr(slack_server, "IDLE_TIMEOUT_S", 2)
    monkeypatch.setattr(slack_server, "MAX_CONNECTIONS_PER_CLIENT", 10)
    with SlackStub(TOKEN) as stub:
        service = SlackReviewService(tmp_path, signing_secret=SECRET, reviewers={ALICE},
                                     client=slack_client(stub.api_url, TOKEN), token_verification=False)
        server, sock = slack_server.http_server(service, "127.0.0.1", 0)
        server.install_signal_handlers = lambda: None
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        port = sock.getsockname()[1]
        slow = []
        try:
            for _ in range(110):  # one client (127.0.0.2) dribbling one header byte at a time
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.settimeout(5)
                s.connect(("127.0.0.1", port))
                slow.append(s)
            start = time.monotonic()
            header = b"POST /slack/events HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
            closed_at: dict[int, float] = {}
            for i in range(14):  # 7 s of dribbling, one byte every 0.5 s (each byte re-armed the old timer)
                for k, s in enumerate(slow):
                    if k in closed_at:
                        continue
                    try:
                        s.send(header[i:i + 1])
                    except OSError:
                        closed_at[k] = time.monotonic() - start
                if i == 4:
                    assert healthy(port)  # another client is served while the slow ones hold their slots
                time.sleep(0.5)
            assert len(closed_at) == len(slow), f"{len(slow) - len(closed_at)} slow connections still open"
            assert max(closed_at.values()) < 2 + 3.5  # the header time is capped, whatever the dribble
            assert healthy(port)
        finally:
            for s in slow:
                s.close()
            server.should_exit = True
            thread.join(10)
