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
message) or the end. While nobody clicks, the server sleeps in ``select``: no CPU.

Secrets come from the environment only and are never logged: ``SLACK_SIGNING_SECRET`` (verifies HTTP
requests), ``SLACK_APP_TOKEN`` (opens the Socket Mode connection), ``SLACK_BOT_TOKEN`` (posts and
updates messages). Reviewers: ``MART_SLACK_REVIEWERS``
(comma-separated Slack user ids) and ``--reviewer`` flags.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from mart.graph.reviewers.slack import (
    ACTION_APPROVE,
    ACTION_EDIT,
    ACTION_REJECT,
    EDITS_BLOCK,
    EDITS_INPUT,
    FEEDBACK_BLOCK,
    FEEDBACK_INPUT,
    MODAL_CALLBACK,
    SlackConfigError,
    SlackReviewer,
    decided_blocks,
    decision_modal,
    describe_decision,
    esc,
    mark_decided,
    parse_button_value,
    partial_decisions,
    record_partial,
    slack_client,
)
from mart.state.config_values import parse_assignments, split_assignments
from mart.state.models import CandidateDecision, ReviewDecision
from mart.state.options import WATCH_INTERVAL_S
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
RECORDED = "Recorded:"  # the start of the note a partial (one-candidate) decision gets
#: how often the server looks for Slack runs paused with trials in flight that nobody watches
WATCH_SCAN_S = 30.0

log = logging.getLogger("mart.slack")


class SlackReviewService:
    """The bolt app and the decision logic (transport-free: ``dispatch`` takes a ``BoltRequest``).

    Args:
        runs_dir: where the runs live (a button names its run by id).
        signing_secret: Slack's signing secret for this app.
        reviewers: Slack user ids allowed to decide.
        client: ``WebClient`` with the bot token (and the API base URL).
        token_verification: call ``auth.test`` at start (fails early on a bad token).
        allowed_backends: plugin backend specs and launch commands the runs may name (builtins need none):
            a run folder is untrusted input, and a click must not run code that the server's owner did not allow.
    """

    def __init__(self, runs_dir: str | Path, *, signing_secret: str | None, reviewers: set[str], client: Any,
                 token_verification: bool = True, allowed_backends: Collection[str] = ()) -> None:
        from slack_bolt import App

        self.signing_secret = signing_secret or None  # only the HTTP transport needs it (Socket Mode: the app token)
        self.runs_dir = Path(runs_dir).resolve()
        self.reviewers = set(reviewers)
        self.allowed_backends = frozenset(allowed_backends)
        self.client = client
        self._guard = threading.Lock()
        self._busy: dict[str, str] = {}  # run id -> who is deciding it now
        self._workers: set[threading.Thread] = set()
        self._watches: dict[str, threading.Thread] = {}  # run id -> its `mart watch` while its review waits
        self._watched: dict[str, str | None] = {}  # run id -> its checkpoint when a watch found nothing left
        self.quit = threading.Event()  # set at shutdown: the watches end
        self.watch_interval_s = WATCH_INTERVAL_S  # between two reads of a paused run's trials (`mart watch`)
        bolt_log = logging.getLogger("mart.slack.bolt")
        bolt_log.setLevel(logging.WARNING)  # bolt logs request bodies at debug level
        bolt_log.addFilter(_drop_token_skipped)
        self.app = App(client=client, signing_secret=signing_secret or None,
                       request_verification_enabled=bool(signing_secret),
                       token_verification_enabled=token_verification, process_before_response=True, logger=bolt_log)
        self.malformed = _RefusalLog("malformed Slack payload")
        self.app.middleware(self._allow_list)
        self.app.error(self._on_error)
        for action_id in (ACTION_APPROVE, ACTION_EDIT, ACTION_REJECT):
            self.app.action(action_id)(self._on_button)
        self.app.view(MODAL_CALLBACK)(self._on_submit)

    def dispatch(self, request):
        """bolt's answer to a signed request; a payload bolt itself cannot read (a view without its type, ...)
        gets 400 and one log line per window, not a traceback per request."""
        from slack_bolt import BoltResponse

        try:
            return self.app.dispatch(request)
        except Exception as e:  # noqa: BLE001 - signed, but not what Slack sends
            self.malformed.note("?", f"{type(e).__name__}: {str(e)[:200]}")
            return BoltResponse(status=400, body="malformed payload")

    def warm_up(self) -> None:
        """Load what a first click needs (the session module, the graph, the SQLite checkpointer) now.

        Slack wants an answer within 3 s; done lazily, these imports made the first click after a start
        take 2-2.6 s on a loaded 2-core box (~0.5 s idle) against ~0.01 s for the next ones.
        """
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401  (RunStore.checkpointer)

        from mart.graph.session import compile_graph, graph_config
        from mart.state.run_store import RunStore  # noqa: F401

        compile_graph(InMemorySaver()).get_state(graph_config("warm-up"))

    # -- gatekeeping -------------------------------------------------------------------------------
    def _allow_list(self, req: Any, body: dict[str, Any], next: Callable[[], Any]):
        from slack_bolt import BoltResponse

        if not isinstance(body, dict) or not body.get("type"):
            return next()  # ssl_check and the like: bolt answers them
        u = body.get("user")
        user = u.get("id") if isinstance(u, dict) else None
        if not isinstance(user, str):  # signed, but not what Slack sends: refused, not crashed on
            self.malformed.note((req.context.get("client_ip") if hasattr(req, "context") else None) or "?", "no user id")
            return BoltResponse(status=200 if req.mode == "socket_mode" else 400, body="malformed payload")
        if user not in self.reviewers:
            log.warning("refused a %s from user %s: not on the reviewer allow-list", body.get("type"), user)
            channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id")
            if channel and user:
                self._ephemeral(channel, user, "You are not on this mart server's reviewer allow-list; nothing changed.")
            # Socket Mode acknowledges only a 200 (else Slack redelivers the click); the note above says no
            socket_mode = req.mode == "socket_mode"
            return BoltResponse(status=200 if socket_mode else 403, body="" if socket_mode else "not a mart reviewer")
        return next()

    def _on_error(self, error: Exception) -> Any:
        """A listener failed on a signed request (a payload that is not what Slack sends): 400 and one log
        line per window, never a traceback per request."""
        from slack_bolt import BoltResponse

        self.malformed.note("?", f"{type(error).__name__}: {str(error)[:200]}")
        return BoltResponse(status=400, body="malformed payload")

    def _ephemeral(self, channel: str, user: str, text: str) -> None:
        try:
            self.client.chat_postEphemeral(channel=channel, user=user, text=text)
        except Exception as e:  # a note that cannot be shown must not break the request
            log.warning("could not post an ephemeral note: %s", type(e).__name__)

    def _open_store(self, run: str):
        from mart.state.run_store import RunStore

        return RunStore.open(self.runs_dir / run, self.runs_dir)

    def check(self, meta: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """The pending request if the button's review is still the run's pending one, else a note why not."""
        from mart.graph.session import load_options, pending_review
        from mart.state.run_store import RunError

        run = meta["run"]
        try:
            store = self._open_store(run)
        except RunError:
            return None, f"Run `{run}` is not known to this mart server; nothing changed."
        try:
            holder = store.lock_holder()
            if holder == os.getpid():
                return None, f"Run `{run}` is already being decided; nothing changed."
            if holder:
                return None, f"Run `{run}` is being driven right now (pid {holder}); nothing changed."
            request = pending_review(store)
            load_options(store, allowed=self.allowed_backends)  # before anything is shown as decided
        except RunError as e:
            return None, f"Run `{run}` cannot be continued by this server: {e}"
        finally:
            store.close()
        if request is None or request["interrupt_id"] != meta.get("interrupt"):
            return None, (f"Review #{meta.get('review')} of run `{run}` was already decided (or asked again in a "
                          "newer message); nothing changed.")
        return request, None

    def validate(self, meta: dict[str, Any], decision: ReviewDecision) -> str | None:
        """Why an edit cannot run (the knob and the rule), or None."""
        from mart.graph.session import load_options, state_snapshot, validate_decision
        from mart.state.run_store import RunError
        from mart.state.search_space import ConfigError

        store = self._open_store(meta["run"])
        try:
            validate_decision(store, load_options(store, allowed=self.allowed_backends), state_snapshot(store), decision)
        except (ConfigError, RunError) as e:
            return str(e)
        finally:
            store.close()
        return None

    # -- handlers ----------------------------------------------------------------------------------
    def _on_button(self, ack: Callable[..., None], body: dict[str, Any], action: dict[str, Any]) -> None:
        ack()  # process_before_response: Slack gets the answer when this returns (well within 3 s)
        user = body["user"]["id"]
        channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id")
        ts = (body.get("message") or {}).get("ts") or (body.get("container") or {}).get("message_ts")
        try:
            meta = {**parse_button_value(action.get("value") or ""), "channel": channel, "ts": ts}
        except ValueError:
            self._ephemeral(channel, user, "This button does not belong to a mart review; nothing changed.")
            return
        request, note = self.check(meta)
        if note:
            self._ephemeral(channel, user, note)
            return
        if action["action_id"] == ACTION_APPROVE:
            note = self.take(meta, CandidateDecision(type="approve", candidate_id=meta.get("candidate")), user,
                             request, _who(body))
            if note:
                self._ephemeral(channel, user, note)
            return
        kind = "edit" if action["action_id"] == ACTION_EDIT else "reject"
        self.client.views_open(trigger_id=body["trigger_id"], view=decision_modal(kind, meta, request))

    def _on_submit(self, ack: Callable[..., None], body: dict[str, Any], view: dict[str, Any]) -> None:
        user = body["user"]["id"]
        try:
            meta = json.loads(view.get("private_metadata") or "{}")
            if not isinstance(meta, dict):
                raise ValueError("private_metadata is not an object")
            parse_button_value(json.dumps(meta))
        except ValueError:
            ack(response_action="errors", errors={FEEDBACK_BLOCK: "This form does not belong to a mart review."})
            return
        values = (view.get("state") or {}).get("values") or {}
        feedback = ((values.get(FEEDBACK_BLOCK) or {}).get(FEEDBACK_INPUT) or {}).get("value") or ""
        if meta.get("action") == "edit":
            block = EDITS_BLOCK
            raw = ((values.get(EDITS_BLOCK) or {}).get(EDITS_INPUT) or {}).get("value") or ""
            try:
                one = CandidateDecision(type="edit", candidate_id=meta.get("candidate"),
                                        edits=parse_assignments(split_assignments(raw)), message=feedback)
            except ValueError as e:
                ack(response_action="errors", errors={block: str(e)})
                return
        else:
            block = FEEDBACK_BLOCK
            if not feedback.strip():
                ack(response_action="errors", errors={block: "Say what the proposer should do differently."})
                return
            one = CandidateDecision(type="reject", candidate_id=meta.get("candidate"), message=feedback.strip())
        request, note = self.check(meta)
        if note is None:
            note = self.take(meta, one, user, request, _who(body), validate=one.type == "edit")
        if note and not note.startswith(RECORDED):
            ack(response_action="errors", errors={block: note[:2000]})
            return
        ack()
        if note:
            self._ephemeral(meta.get("channel"), user, note)

    def take(self, meta: dict[str, Any], one: CandidateDecision, user: str, request: dict[str, Any], who: str,
             *, validate: bool = False) -> str | None:
        """One click's decision: on a review of one candidate, or on all of them (``candidate_id`` None), it is the
        answer; on one candidate of several it is kept (the ledger) until every candidate has one, then they go
        together. A note to show the clicker, or None."""
        ids = [c.get("candidate_id") for c in request.get("candidates") or []]
        if one.candidate_id is not None and one.candidate_id not in ids:
            # a signed click can still carry any value (a stale or hand-made button): answer it, run nothing
            return (f"Candidate `{esc(one.candidate_id)}` is not in review #{request.get('review_no')} of run "
                    f"`{esc(meta['run'])}`; nothing changed.")
        store = self._open_store(meta["run"])
        try:
            kept = partial_decisions(store.ledger, meta["interrupt"]) if len(ids) > 1 else []
            named = [d for d in kept if d.candidate_id != one.candidate_id]
            decision = ReviewDecision(decisions=[*named, one], reviewer=who, channel="slack")
            if one.candidate_id is not None and len(ids) > 1:
                missing = [c for c in ids if c not in {d.candidate_id for d in decision.decisions}]
                if missing:
                    if validate:
                        bad = self.validate(meta, ReviewDecision(decisions=[one, CandidateDecision(type="reject")],
                                                                 reviewer=who, channel="slack"))
                        if bad:
                            return bad
                    record_partial(store.ledger, meta["interrupt"], one, user)
                    return f"{RECORDED} {describe_decision(ReviewDecision(decisions=[one]))}; still to decide: " \
                           f"{', '.join(missing)} (or use the buttons for all of them)"
        finally:
            store.close()
        if validate or any(d.type == "edit" for d in decision.decisions):
            bad = self.validate(meta, decision)
            if bad:
                return bad
        return self.decide(meta, decision, user, request)

    # -- deciding ----------------------------------------------------------------------------------
    def decide(self, meta: dict[str, Any], decision: ReviewDecision, user: str, request: dict[str, Any]) -> str | None:
        """Accept the decision (one at a time per run), update the message, continue the run in a worker."""
        run = meta["run"]
        with self._guard:
            if run in self._busy:
                return f"Run `{run}` is already being decided by <@{self._busy[run]}>; nothing changed."
            request, note = self.check(meta)  # again, now that no other click of this server can interfere
            if note:
                return note
            self._busy[run] = user
        log.info("run %s review #%s: %s by %s", run, request.get("review_no"), decision.describe(), user)
        try:
            self.client.chat_update(channel=meta["channel"], ts=meta["ts"], blocks=decided_blocks(request, decision, user),
                                    text=f"mart review #{request.get('review_no')}: {describe_decision(decision)} by {user}")
        except Exception as e:
            log.warning("could not update the review message: %s", type(e).__name__)
        worker = threading.Thread(target=self._continue, args=(meta, decision, user), daemon=True,
                                  name=f"mart-run-{run}")
        self._workers.add(worker)
        worker.start()
        return None

    def _continue(self, meta: dict[str, Any], decision: ReviewDecision, user: str) -> None:
        from mart.graph.session import StaleReview, resume
        from mart.state.run_store import RunError

        run, channel = meta["run"], meta["channel"]
        applied = False
        try:
            reviewer = SlackReviewer(channel=channel, client=self.client)
            out = resume(run, self.runs_dir, decision=decision, interrupt_id=meta["interrupt"],
                         reviewer=reviewer, quiet=True, allowed=self.allowed_backends)
            applied = True  # a completed run's summary and report went into the thread (SlackReviewer.on_finish)
            if out.get("status") == "paused":
                self.watch_paused_runs(only=run)  # its trials in flight, while the next review waits
        except (StaleReview, RunError) as e:  # raised before the decision reached the graph
            log.warning("run %s: decision of %s not applied: %s", run, user, e)
            self._ephemeral(channel, user, f"Your decision was not applied: {esc(e)}")
            self._post(channel, f":warning: <@{user}>'s decision on run `{run}` was not applied: {esc(e)}", meta.get("ts"))
        except Exception as e:
            applied = True
            log.exception("run %s failed after a Slack decision", run)
            self._post(channel, f":boom: run `{run}` failed: {type(e).__name__}: {esc(e)}", meta.get("ts"))
        finally:
            if applied:
                self._record(run, meta["interrupt"], user, decision.describe())
            with self._guard:
                self._busy.pop(run, None)
                self._workers.discard(threading.current_thread())

    # -- trials in flight while a review waits ----------------------------------------------------------
    def watch_paused_runs(self, only: str | None = None) -> list[str]:
        """Keep the health monitor on the trials in flight of this folder's Slack runs that wait for a review
        (``mart watch`` in a thread per run): a trial that turns sick while nobody clicks is stopped, and the
        review's thread says so. Runs another process drives or watches are left alone; a click's driver ends
        the watch (it never waits for it). Returns the runs it started watching."""
        from mart.graph.run_status import checkpoint_fingerprint
        from mart.state.run_store import WATCH_LOCK, RunError, RunStore

        started = []
        dirs = [self.runs_dir / only] if only else sorted(self.runs_dir.iterdir()) if self.runs_dir.is_dir() else []
        for d in (d for d in dirs if d.is_dir()):
            if d.name in self._watches and self._watches[d.name].is_alive():
                continue
            try:
                store = RunStore.open(d.name, self.runs_dir, readonly=True)
            except RunError:
                continue  # not a run, or one mart cannot read: `mart status` says why
            try:
                row = store.ledger.run(store.run_id) or {}
                wanted = (row.get("status") == "paused" and (row.get("options") or {}).get("approve") == "slack"
                          and store.lock_holder() is None and store.lock_holder(WATCH_LOCK) is None
                          and any(t["status"] == "running" for t in store.ledger.trials())
                          and self._watched.get(d.name, "") != checkpoint_fingerprint(store))
                where = _review_thread(store) if wanted else None
            except (RunError, ValueError, OSError) as e:
                log.info("run %s: not watched (%s)", d.name, type(e).__name__)
                continue
            finally:
                store.close()
            with self._guard:  # the keeper and a worker continuing a run may both look
                if not wanted or (d.name in self._watches and self._watches[d.name].is_alive()):
                    continue
                watch = threading.Thread(target=self._watch, args=(d.name, where), daemon=True,
                                         name=f"mart-watch-{d.name}")
                self._watches[d.name] = watch
            watch.start()
            started.append(d.name)
        return started

    def _watch(self, run: str, where: tuple[str, str] | None) -> None:
        from mart.graph.paused_watch import watch_paused
        from mart.state.run_store import RunError

        def told(trial_id: str, what: str) -> None:
            if what != "ended" and where is not None:
                self._post(where[0], f":stethoscope: trial `{esc(trial_id)}` was stopped while this review waits: "
                                     f"{esc(what)}", where[1])

        try:
            out = watch_paused(run, self.runs_dir, interval_s=self.watch_interval_s, allowed=self.allowed_backends,
                               told=told, quit=self.quit)
            log.info("run %s: watch over (%s)", run, out["why"])
            if out["why"] in ("every trial ended", "no trial in flight"):  # nothing to watch until the run moves
                self._watched[run] = out.get("checkpoint")
        except RunError as e:  # a driver or another watch got there first, or code this server does not allow
            log.info("run %s: not watched: %s", run, e)
        except Exception:  # noqa: BLE001 - the server goes on; the run's tuner watches the trials when it continues
            log.exception("run %s: watching its trials failed", run)

    def wait_watches(self, timeout: float | None = None) -> bool:
        """Wait for the watches of paused runs to end (tests, shutdown); True when none runs."""
        with self._guard:
            watches = list(self._watches.values())
        for w in watches:
            w.join(timeout)
        return not any(w.is_alive() for w in watches)

    def _record(self, run: str, interrupt_id: str, user: str, action: str) -> None:
        try:
            store = self._open_store(run)
            try:
                mark_decided(store.ledger, interrupt_id, user, action)
            finally:
                store.close()
        except Exception as e:
            log.warning("could not record the decision on run %s: %s", run, type(e).__name__)

    def _post(self, channel: str, text: str, thread_ts: str | None) -> None:
        try:
            self.client.chat_postMessage(channel=channel, text=text, thread_ts=thread_ts)
        except Exception as e:
            log.warning("could not post to Slack: %s", type(e).__name__)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the runs being continued to pause or finish (tests, shutdown); True when idle."""
        with self._guard:
            workers = list(self._workers)
        for w in workers:
            w.join(timeout)
        return not any(w.is_alive() for w in workers)

def _review_thread(store: Any) -> tuple[str, str] | None:
    """(channel, ts) of the run's newest review message, where news of its trials goes."""
    from mart.graph.reviewers.slack import MESSAGES_TABLE

    table = store.ledger.db[MESSAGES_TABLE]
    if not table.exists():
        return None
    rows = list(table.rows_where("run_id = ?", [store.run_id], order_by="posted_at desc", limit=1))
    return (str(rows[0]["channel"]), str(rows[0]["ts"])) if rows else None


def _who(body: dict[str, Any]) -> str:
    u = body.get("user") or {}
    name = u.get("username") or u.get("name")
    return f"{name} (slack:{u['id']})" if name else f"slack:{u['id']}"


# -- HTTP transport ----------------------------------------------------------------------------------
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


def _drop_token_skipped(record: logging.LogRecord) -> bool:
    # bolt falls back to $SLACK_BOT_TOKEN when no token is passed and then warns that the client's token
    # wins; the client *is* built from that token, so the warning only misleads
    return "`token` will be unused" not in record.getMessage()


class _RefusalLog:
    """Logs refused requests at warning level, at most one line per ``every_s`` (with the count since the
    last line), so a flood cannot fill the log."""

    def __init__(self, what: str = "invalid or stale Slack signature", every_s: float = 10.0) -> None:
        self.what = what
        self.every_s = every_s
        self._last = -math.inf
        self._since = 0

    def note(self, peer: str, detail: str | None = None) -> None:
        self._since += 1
        now = time.monotonic()
        if now - self._last >= self.every_s:
            more = f" ({self._since} since the last report)" if self._since > 1 else ""
            log.warning("refused a request from %s: %s%s%s", peer, self.what,
                        f" ({' '.join(str(detail).split())})" if detail else "", more)
            self._last, self._since = now, 0


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
    refusals = _RefusalLog()

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
