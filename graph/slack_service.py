"""The Slack review service: the slack_bolt app that takes a reviewer's click or form, checks it, records the
decision and continues the run in a worker thread; and the `mart watch` it keeps on each paused run's trials.

It is transport-free (``dispatch`` takes a ``BoltRequest``): ``mart.graph.slack_server`` carries Slack's requests
to it over Socket Mode or HTTP. Every request reaches it signed (HTTP) or over the app's own connection (Socket
Mode); it still checks the reviewer allow-list and that the clicked review is the run's pending one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from mart.graph.reviewers.slack import SlackReviewer, mark_decided, partial_decisions, record_partial
from mart.graph.reviewers.slack_blocks import (
    ACTION_APPROVE,
    ACTION_EDIT,
    ACTION_REJECT,
    EDITS_BLOCK,
    EDITS_INPUT,
    FEEDBACK_BLOCK,
    FEEDBACK_INPUT,
    MODAL_CALLBACK,
    decided_blocks,
    decision_modal,
    describe_decision,
    esc,
    parse_button_value,
)
from mart.state.config_values import parse_assignments, split_assignments
from mart.state.models import CandidateDecision, ReviewDecision
from mart.state.options import WATCH_INTERVAL_S

RECORDED = "Recorded:"  # the start of the note a partial (one-candidate) decision gets

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
        self.malformed = RefusalLog("malformed Slack payload")
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


def _drop_token_skipped(record: logging.LogRecord) -> bool:
    # bolt falls back to $SLACK_BOT_TOKEN when no token is passed and then warns that the client's token
    # wins; the client *is* built from that token, so the warning only misleads
    return "`token` will be unused" not in record.getMessage()


class RefusalLog:
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
