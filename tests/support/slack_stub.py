"""A loopback stand-in for the Slack Web API that records the calls it gets (for tests).

``SlackStub`` listens on 127.0.0.1 (a free port), answers ``auth.test``, ``chat.postMessage``,
``conversations.info``, ``chat.update``, ``chat.postEphemeral``, ``views.open`` and (with an app token) ``apps.connections.open``
like Slack does (just enough for slack_sdk and
slack_bolt), and keeps the calls with its replies in ``calls`` (bounded). Point a client at it with
``WebClient(token=..., base_url=stub.api_url)`` or ``MART_SLACK_API_URL=stub.api_url``. It checks the
bearer token (a wrong one gets ``invalid_auth``) but records only whether it matched, never the token.
Run it as ``python -m tests.support.slack_stub TOKEN`` to print its URL and serve until killed.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

MAX_CALLS = 1000
MAX_BODY = 1 << 20


class SlackStub:
    def __init__(self, token: str, *, team_id: str = "T0MART", bot_user_id: str = "U0BOT",
                 app_token: str | None = None, socket_url: str | None = None) -> None:
        self.token = token
        self.missing_channels: set[str] = set()  # conversations.info answers channel_not_found for these
        self.app_token = app_token  # Socket Mode: apps.connections.open answers socket_url to this token
        self.socket_url = socket_url
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.calls: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count(1)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stub._handle(self)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.api_url = f"http://127.0.0.1:{self.port}/api/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> SlackStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> SlackStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries -----------------------------------------------------------------------------------
    def of(self, method: str) -> list[dict[str, Any]]:
        with self._cond:
            return [c for c in self.calls if c["method"] == method]

    def wait_for(self, method: str, pred: Callable[[dict[str, Any]], bool] = lambda c: True, *,
                 count: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Block until ``count`` calls of ``method`` match ``pred``; returns them (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hits = [c for c in self.calls if c["method"] == method and pred(c)]
                if len(hits) >= count:
                    return hits
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"stub saw {len(hits)} matching {method} call(s), wanted {count}; "
                                         f"all calls: {[c['method'] for c in self.calls]}")
                self._cond.wait(left)

    # -- the API -----------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            h.send_error(413)
            return
        raw = h.rfile.read(length).decode() if length else ""
        if "json" in (h.headers.get("Content-Type") or ""):
            params = json.loads(raw or "{}")
        else:
            params = dict(parse_qsl(raw))
        for key in ("blocks", "view"):
            if isinstance(params.get(key), str):
                params[key] = json.loads(params[key])
        method = h.path.split("/api/", 1)[-1].split("?")[0]
        if method == "apps.connections.open":
            authorized = self.app_token is not None and h.headers.get("Authorization") == f"Bearer {self.app_token}"
        else:
            authorized = h.headers.get("Authorization") == f"Bearer {self.token}"
        reply = self._reply(method, params) if authorized else {"ok": False, "error": "invalid_auth"}
        call = {"method": method, "params": params, "authorized": authorized, "reply": reply, "at": time.time()}
        with self._cond:
            if len(self.calls) < MAX_CALLS:
                self.calls.append(call)
            self._cond.notify_all()
        body = json.dumps(reply).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _reply(self, method: str, p: dict[str, Any]) -> dict[str, Any]:
        ts = f"{int(time.time())}.{next(self._seq):06d}"
        if method == "auth.test":
            return {"ok": True, "url": "https://mart-test.slack.com/", "team": "mart-test", "user": "mart",
                    "team_id": self.team_id, "user_id": self.bot_user_id, "bot_id": "B0MART", "is_enterprise_install": False}
        if method == "chat.postMessage":
            return {"ok": True, "channel": p.get("channel"), "ts": ts,
                    "message": {"type": "message", "text": p.get("text"), "ts": ts, "bot_id": "B0MART"}}
        if method == "conversations.info":
            if p.get("channel") in self.missing_channels:
                return {"ok": False, "error": "channel_not_found"}
            return {"ok": True, "channel": {"id": p.get("channel"), "is_member": True}}
        if method == "chat.update":
            return {"ok": True, "channel": p.get("channel"), "ts": p.get("ts"), "text": p.get("text")}
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": ts}
        if method == "apps.connections.open" and self.socket_url:
            return {"ok": True, "url": self.socket_url}
        if method == "views.open":
            return {"ok": True, "view": {"id": f"V{next(self._seq):06d}", **(p.get("view") or {})}}
        return {"ok": False, "error": "unknown_method"}


if __name__ == "__main__":  # pragma: no cover
    with SlackStub(sys.argv[1]) as s:
        print(s.api_url, flush=True)
        threading.Event().wait()
