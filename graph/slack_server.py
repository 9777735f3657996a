"""``mart slack serve``: receive Slack's button clicks and form submissions, and continue the runs.

Two transports for the same slack_bolt app:

- **Socket Mode** (default, ``--mode socket``): the server dials out to Slack over a WebSocket
  (slack_bolt's built-in Socket Mode client, https://api.slack.com/apis/socket-mode), so a team needs no
  public URL, TLS proxy or ingress; it needs an app-level token (``SLACK_APP_TOKEN``, ``xapp-...``).
- **HTTP** (``--mode http``): a Starlette app on uvicorn (https://www.uvicorn.org) at ``/slack/events``,
  behind the team's TLS proxy. The signature is checked on the raw body before anything parses it
  (anything unsigned, malformed or not, gets 401); bodies are capped at ``MAX_BODY`` and must arrive
  within ``BODY_TIMEOUT_S``; a connection gets ``IDLE_TIMEOUT_S`` in all for a request's headers (however
  it dribbles them) and is closed after; at most ``MAX_CONNECTIONS`` at once (uvicorn answers 503 beyond),
  at most ``MAX_CONNECTIONS_PER_CLIENT`` from one address (so one client cannot take every slot). A
  malformed timestamp is refused like a bad signature (401), a signed but malformed payload gets 400, and
  both are logged one line per window, never as a traceback.

Every HTTP request goes through the signature check (a bad or old signature gets 401), then the
reviewer allow-list (anyone else gets 403 and an ephemeral note), then a check that the clicked review is
still the run's pending interrupt (a second click or a stale message changes nothing and gets an
ephemeral note). An accepted decision updates the message (who decided what) and continues the run in a
worker thread of this server, holding the run's writer lock, until the next review (posted as a new
message) or the end (``mart.graph.slack_service``; this module is its transport). While nobody clicks, the
server sleeps in ``select``: no CPU.

Secrets come from the environment only and are never logged: ``SLACK_SIGNING_SECRET`` (verifies HTTP
requests), ``SLACK_APP_TOKEN`` (opens the Socket Mode connection), ``SLACK_BOT_TOKEN`` (posts and
updates messages). Reviewers: ``MART_SLACK_REVIEWERS``
(comma-separated Slack user ids) and ``--reviewer`` flags.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from mart.graph.reviewers.slack import SlackConfigError, slack_client
from mart.graph.slack_service import RefusalLog, SlackReviewService
from mart.trial_runner.registry import allowed_from_env

SECRET_ENV = "SLACK_SIGNING_SECRET"
APP_TOKEN_ENV = "SLACK_APP_TOKEN"
REVIEWERS_ENV = "MART_SLACK_REVIEWERS"
MAX_BODY = 1 << 20  # Slack's interaction payloads are a few KB
BODY_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 10
MAX_CONNECTIONS = 100
#: connections one client address may hold at once (Slack opens a few); the rest are closed at once
MAX_CONNECTIONS_PER_CLIENT = 20
EVENTS_PATH = "/slack/events"
#: how often the server looks for Slack runs paused with trials in flight that nobody watches
WATCH_SCAN_S = 30.0

log = logging.getLogger("mart.slack")


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Any, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def asgi_app(service: SlackReviewService, path: str = EVENTS_PATH, *, max_body: int = MAX_BODY,
             body_timeout_s: float = BODY_TIMEOUT_S):
    """The Starlette app of the HTTP transport: ``POST path`` (Slack's requests) and ``GET /healthz``.

    The signature is verified on the raw bytes first (slack_sdk's ``SignatureVerifier``: HMAC and a
    5-minute replay window); only a signed body is decoded and handed to bolt, in a worker thread.
    """
    from slack_bolt.request import BoltRequest
    from slack_sdk.signature import SignatureVerifier
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    if not service.signing_secret:
        raise SlackConfigError(f"set {SECRET_ENV} (the Slack app's signing secret) in the environment")
    verifier = SignatureVerifier(service.signing_secret)
    refusals = RefusalLog()

    async def events(request):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body):
            return PlainTextResponse("too large" if length.isdigit() else "bad content-length",
                                     status_code=413 if length.isdigit() else 400)
        try:
            body = await asyncio.wait_for(_read_body(request, max_body), body_timeout_s)
        except _BodyTooLarge:
            return PlainTextResponse("too large", status_code=413)
        except (asyncio.TimeoutError, TimeoutError):
            return PlainTextResponse("request body too slow", status_code=408)
        headers = {k.lower(): v for k, v in request.headers.items()}
        ts = headers.get("x-slack-request-timestamp", "")
        # slack_sdk's check reads the timestamp with int(): anything but a few digits would raise (500)
        if not (ts.isascii() and ts.isdigit() and len(ts) <= 12) or not verifier.is_valid_request(body, headers):
            refusals.note(request.client.host if request.client else "?")
            return PlainTextResponse("invalid signature", status_code=401)
        try:  # signed by Slack, but still parsed defensively
            bolt_request = BoltRequest(body=body.decode("utf-8"), query=request.url.query,
                                       headers={k: [v] for k, v in headers.items()})
        except Exception as e:  # noqa: BLE001 - a body bolt cannot parse
            log.warning("unparseable signed request: %s", type(e).__name__)
            return PlainTextResponse("bad request", status_code=400)
        resp = await run_in_threadpool(service.dispatch, bolt_request)
        out_headers = {k: v[0] for k, v in (resp.headers or {}).items() if v and k.lower() != "content-length"}
        return Response(content=(resp.body or "").encode(), status_code=resp.status, headers=out_headers)

    async def healthz(request):
        return PlainTextResponse("ok")

    return Starlette(routes=[Route(path, events, methods=["POST"]), Route("/healthz", healthz, methods=["GET"])])


def _idle_timeout_protocol():
    """uvicorn's h11 protocol, plus a deadline for each request's headers and a cap on connections per client.

    uvicorn's own keep-alive timeout starts only after a first response, so a client that connects and sends
    nothing (or dribbles its headers a byte at a time) would hold a connection for ever, and enough of them
    hold every slot (``/healthz`` then gets 503). Here a connection has ``IDLE_TIMEOUT_S`` from its first
    byte (or from its opening) to complete a request's headers, however it dribbles them, and one client
    address holds at most ``MAX_CONNECTIONS_PER_CLIENT`` connections."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    per_client: dict[str, int] = {}

    class Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _peer: str | None = None

        def connection_made(self, transport):  # type: ignore[override]
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._peer = str(peer[0]) if peer else "?"
            per_client[self._peer] = per_client.get(self._peer, 0) + 1
            if per_client[self._peer] > MAX_CONNECTIONS_PER_CLIENT:
                transport.close()  # one address may not take every slot
                return
            self._arm()

        def connection_lost(self, exc):  # type: ignore[override]
            if self._peer is not None:
                left = per_client.get(self._peer, 1) - 1
                if left > 0:
                    per_client[self._peer] = left
                else:
                    per_client.pop(self._peer, None)
                self._peer = None
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self.cycle is None or self.cycle.response_complete:
                self._arm()  # headers still incomplete: the deadline stands (it is not moved by a byte)
            else:
                self._disarm()  # a request is in: the body has its own timeout (BODY_TIMEOUT_S)

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(IDLE_TIMEOUT_S, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _headers_too_slow(self) -> None:
            self._deadline = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # the next request's deadline starts with its first byte (keep-alive covers the wait)

    return Protocol


def http_server(service: SlackReviewService, host: str = "127.0.0.1", port: int = 3000, path: str = EVENTS_PATH):
    """A uvicorn server for ``asgi_app`` and its bound socket (port 0: any free port)."""
    import uvicorn

    sock = socket.create_server((host, port), reuse_port=False)
    config = uvicorn.Config(asgi_app(service, path), http=_idle_timeout_protocol(), lifespan="off",
                            timeout_keep_alive=5, limit_concurrency=MAX_CONNECTIONS, log_level="warning",
                            access_log=False, server_header=False, h11_max_incomplete_event_size=16 * 1024,
                            timeout_graceful_shutdown=10)
    return uvicorn.Server(config), sock


# -- Socket Mode transport -----------------------------------------------------------------------------
def socket_mode_handler(service: SlackReviewService, app_token: str | None = None):
    """slack_bolt's built-in Socket Mode handler for the service's app (no extra dependency)."""
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    token = app_token or os.environ.get(APP_TOKEN_ENV)
    if not token:
        raise SlackConfigError(f"set {APP_TOKEN_ENV} (an app-level token, xapp-..., with connections:write) for "
                               "Socket Mode, or use --mode http with a public request URL")
    return SocketModeHandler(service.app, app_token=token, web_client=service.client)


def reviewers_from_env(extra: list[str] | None = None) -> set[str]:
    ids = {x.strip() for x in os.environ.get(REVIEWERS_ENV, "").split(",") if x.strip()}
    return ids | {x.strip() for x in extra or [] if x.strip()}


def serve(runs_dir: str | Path, *, host: str = "127.0.0.1", port: int = 3000, reviewers: list[str] | None = None,
          api_url: str | None = None, path: str = EVENTS_PATH, allowed_backends: Collection[str] = (),
          mode: str = "socket") -> None:
    """Run the Slack endpoint until SIGTERM/SIGINT (``mart slack serve``): Socket Mode or HTTP."""
    if mode not in ("socket", "http"):
        raise SlackConfigError(f"--mode must be socket or http, got {mode!r}")
    allowed = reviewers_from_env(reviewers)
    if not allowed:
        raise SlackConfigError(f"no reviewers allowed: set {REVIEWERS_ENV} or pass --reviewer (Slack user ids)")
    secret = os.environ.get(SECRET_ENV, "")
    if mode == "http" and not secret:
        raise SlackConfigError(f"set {SECRET_ENV} (the Slack app's signing secret) in the environment")
    if mode == "socket" and not os.environ.get(APP_TOKEN_ENV):
        raise SlackConfigError(f"set {APP_TOKEN_ENV} (an app-level token, xapp-..., with connections:write) for "
                               "Socket Mode, or use --mode http with a public request URL")
    service = SlackReviewService(runs_dir, signing_secret=secret if mode == "http" else None, reviewers=allowed,
                                 client=slack_client(api_url), allowed_backends=allowed_from_env(allowed_backends))
    service.warm_up()

    def keep_watching() -> None:  # runs paused by `mart tune --approve slack` (which exits), and new ones
        while not service.quit.is_set():
            try:
                service.watch_paused_runs()
            except Exception:  # noqa: BLE001 - a bad folder must not end the watches of the others
                log.exception("looking for paused runs to watch failed")
            service.quit.wait(WATCH_SCAN_S)

    threading.Thread(target=keep_watching, daemon=True, name="mart-watch-keeper").start()
    try:
        if mode == "http":
            server, sock = http_server(service, host, port, path)
            bound_host, bound_port = sock.getsockname()[:2]
            print(f"mart slack: listening on http://{bound_host}:{bound_port}{path} for {len(allowed)} reviewer(s), "
                  f"runs in {service.runs_dir}", flush=True)
            # uvicorn handles SIGTERM/SIGINT (stops accepting, finishes requests), then re-raises the signal
            # to the handler it found: a no-op one here, so that a requested stop exits with 0
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: None)
            server.run(sockets=[sock])
        else:
            handler = socket_mode_handler(service)
            handler.connect()
            print(f"mart slack: connected to Slack in Socket Mode for {len(allowed)} reviewer(s), "
                  f"runs in {service.runs_dir}", flush=True)
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.wait(1.0):
                pass
            handler.close()
    finally:
        service.quit.set()
        service.wait_watches(timeout=10)
        if not service.wait_idle(timeout=10):
            log.warning("a run was still being continued at shutdown; continue it with `mart resume RUN`")
