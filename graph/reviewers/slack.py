"""The ``slack`` reviewer channel: post each review to a Slack channel as a Block Kit message and detach.

``SlackReviewer.review`` posts the candidate (diff against the current best, rationale, critique,
predicted memory) with Approve / Edit / Reject controls, records the message in the run's ledger
(``slack_messages``: channel and ts, never a token) and returns None: the tuner exits and the paused run
costs nothing. ``mart slack serve`` (``mart.graph.slack_server``) receives the clicks and continues
the run. Configuration (flags win over the environment)::

    SLACK_BOT_TOKEN      bot token (xoxb-...): environment only, never stored or logged
    MART_SLACK_CHANNEL   channel id to post reviews to (``--slack-channel``)
    MART_SLACK_API_URL   Slack Web API base URL (tests, Slack-compatible servers); default Slack's
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from mart.graph.reviewers.base import Reviewer, format_request
from mart.graph.reviewers.slack_blocks import candidates, clip, esc, review_blocks
from mart.state.ledger import Ledger
from mart.state.units import fmt_gb

TOKEN_ENV = "SLACK_BOT_TOKEN"
CHANNEL_ENV = "MART_SLACK_CHANNEL"
API_URL_ENV = "MART_SLACK_API_URL"
MESSAGES_TABLE = "slack_messages"


class SlackConfigError(ValueError):
    """Slack is not configured (no token, no channel); the message names the variable or flag."""


def slack_client(api_url: str | None = None, token: str | None = None):
    """A ``slack_sdk.WebClient`` from the environment (token) and an optional API base URL."""
    from slack_sdk import WebClient

    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        raise SlackConfigError(f"set {TOKEN_ENV} (the Slack bot token) in the environment")
    base = api_url or os.environ.get(API_URL_ENV) or WebClient.BASE_URL
    return WebClient(token=token, base_url=base.rstrip("/") + "/", timeout=15)


# -- the ledger's record of posted messages --------------------------------------------------------
def _table(ledger: Ledger):
    table = ledger.db[MESSAGES_TABLE]
    if not table.exists():
        table.create({"interrupt_id": str, "run_id": str, "review_no": int, "candidate_id": str, "channel": str,
                      "ts": str, "posted_at": float, "decided_by": str, "action": str, "decided_at": float},
                     pk="interrupt_id")
    return table


def record_message(ledger: Ledger, request: dict[str, Any], channel: str, ts: str) -> None:
    ids = [c.get("candidate_id") for c in candidates(request)]
    _table(ledger).upsert({"interrupt_id": request["interrupt_id"], "run_id": request["run_id"],
                           "review_no": request.get("review_no"), "candidate_id": ",".join(map(str, ids)),
                           "channel": channel, "ts": ts, "posted_at": time.time()}, pk="interrupt_id")


PARTIAL_TABLE = "slack_partial_decisions"


def record_partial(ledger: Ledger, interrupt_id: str, decision: Any, user_id: str) -> None:
    """One candidate's decision of a review that covers several, kept until each candidate has one."""
    table = ledger.db[PARTIAL_TABLE]
    table.upsert({"key": f"{interrupt_id}:{decision.candidate_id}", "interrupt_id": interrupt_id,
                  "candidate_id": decision.candidate_id, "decision": decision.model_dump_json(), "user": user_id,
                  "at": time.time()}, pk="key")


def partial_decisions(ledger: Ledger, interrupt_id: str) -> list[Any]:
    from mart.state.models import CandidateDecision

    table = ledger.db[PARTIAL_TABLE]
    if not table.exists():
        return []
    return [CandidateDecision.model_validate_json(r["decision"])
            for r in table.rows_where("interrupt_id = ?", [interrupt_id], order_by="at")]


def mark_decided(ledger: Ledger, interrupt_id: str, user_id: str, action: str) -> None:
    _table(ledger).upsert({"interrupt_id": interrupt_id, "decided_by": user_id, "action": action,
                           "decided_at": time.time()}, pk="interrupt_id")


def posted_messages(ledger: Ledger) -> list[dict[str, Any]]:
    return list(_table(ledger).rows_where(order_by="posted_at"))


def _api_error(e: BaseException) -> str:
    from slack_sdk.errors import SlackApiError

    return e.response.get("error", "error") if isinstance(e, SlackApiError) else f"{type(e).__name__}: {e}"


#: Slack's limits (https://api.slack.com/apis/rate-limits): about one message per second per channel, and
#: chat.update is a Tier 3 method (~50 a minute). The live message is edited at most once per LIVE_INTERVAL_S
#: (a trial's end at most once per LIVE_FLOOR_S), so a run with many trials in flight stays far below both.
LIVE_INTERVAL_S = 5.0
LIVE_FLOOR_S = 1.0


class LiveProgress:
    """One message in a review's thread listing the trials in flight, edited as they progress (``chat.update``):
    the thread shows the running trials live, rate-limited to Slack's limits. ``post(text) -> ts`` starts the message
    and ``update(ts, text)`` edits it; both are best-effort (a failure is reported by the reviewer, not raised)."""

    def __init__(self, post: Any, update: Any, interval_s: float = LIVE_INTERVAL_S, floor_s: float = LIVE_FLOOR_S,
                 clock: Any = time.monotonic) -> None:
        self.post, self.update = post, update
        self.interval_s, self.floor_s, self.clock = interval_s, floor_s, clock
        self.ts: str | None = None
        self.running: dict[str, dict[str, Any]] = {}
        self.finished: list[str] = []
        self._sent: str | None = None
        self._last = -math.inf

    def event(self, event: Any) -> None:
        from mart.nodes.progress import (
            TrialDone,
            TrialFailed,
            TrialLaunched,
            TrialReattached,
            TrialStep,
            TrialStopped,
        )

        urgent = False
        if isinstance(event, TrialLaunched):
            self.running[event.trial_id] = {"stage": event.stage, "changes": [event.what()],
                                            "horizon": event.horizon, "step": 0, "figures": ""}
            urgent = True
        elif isinstance(event, TrialReattached):
            self.running.setdefault(event.trial_id, {"stage": "", "changes": ["re-attached"], "horizon": None,
                                                     "step": 0, "figures": ""})
            urgent = True
        elif isinstance(event, TrialStep) and event.trial_id in self.running:
            t = self.running[event.trial_id]
            t["step"] = event.step
            t["figures"] = ", ".join(x for x in (
                None if event.throughput is None else f"{event.throughput:,.0f} tok/s",
                None if event.memory_gb is None else fmt_gb(event.memory_gb),
                None if event.val_score is None else f"val {event.val_score:.3f}") if x)
        elif isinstance(event, (TrialDone, TrialStopped, TrialFailed)) and event.trial_id in self.running:
            self.running.pop(event.trial_id)
            self.finished.append(event.trial_id)
            urgent = True
        else:
            return
        self.push(urgent=urgent)

    def text(self) -> str:
        lines = [f":hourglass_flowing_sand: running now ({len(self.running)}), updated "
                 f"{time.strftime('%H:%M:%S UTC', time.gmtime())}:" if self.running else
                 f":white_check_mark: no trial running ({len(self.finished)} finished in this thread)"]
        for tid, t in self.running.items():
            steps = f"step {t['step']}/{t['horizon']}" if t["horizon"] else f"step {t['step']}"
            lines.append(f"• {tid} ({t['stage']}; {', '.join(t['changes'])}): {steps}"
                         + (f", {t['figures']}" if t["figures"] else ""))
        return "\n".join(lines)

    def push(self, *, urgent: bool = False, force: bool = False) -> None:
        """Show the current state when the rate limit allows (``force``: now, e.g. before the run pauses)."""
        text = self.text()
        if text == self._sent:
            return
        now = self.clock()
        if self.ts is None:
            if not self.running:
                return  # nothing ran in this thread yet
            self.ts = self.post(text)
        else:
            wait = self.floor_s if urgent else self.interval_s
            if not force and now - self._last < wait:
                return  # the next event or the flush at a pause/the end shows it
            self.update(self.ts, text)
        self._sent, self._last = text, now


class SlackReviewer(Reviewer):
    """Posts the review to Slack and detaches; ``mart slack serve`` answers it when someone clicks.

    Args:
        channel: channel id (default ``$MART_SLACK_CHANNEL``, else the channel of this run's last review).
        api_url: Slack Web API base URL (default ``$MART_SLACK_API_URL``, else Slack's).
        client: a ready ``WebClient`` (the Slack server passes its own); else one from ``$SLACK_BOT_TOKEN``.
    """

    name = "slack"

    def __init__(self, channel: str | None = None, api_url: str | None = None, client: Any = None,
                 live_interval_s: float = LIVE_INTERVAL_S) -> None:
        self.channel = channel
        self.api_url = api_url
        self._client = client
        self.live_interval_s = live_interval_s
        self._live_where: tuple[str, str] | None = None
        self._live_progress: LiveProgress | None = None

    def check(self) -> None:
        """Fail at start, not after the baseline trial: every missing setting at once, then the token
        (``auth.test``) and the channel (``conversations.info``) against Slack itself."""
        from slack_sdk.errors import SlackApiError, SlackClientError

        problems = []
        for attempt in (lambda: self.client, self._channel):
            try:
                attempt()
            except SlackConfigError as e:
                problems.append(str(e))
        if problems:
            raise SlackConfigError("; ".join(problems))
        try:
            self.client.auth_test()
        except (SlackApiError, SlackClientError, OSError) as e:
            raise SlackConfigError(f"the Slack token was refused ({_api_error(e)})") from None
        try:
            self.client.conversations_info(channel=self._channel())
        except (SlackApiError, SlackClientError, OSError) as e:
            raise SlackConfigError(f"channel {self._channel()} cannot be used by the bot ({_api_error(e)}); "
                                   "invite the bot to it or pick another") from None

    def _thread(self) -> tuple[str, str] | None:
        """(channel, ts) of this run's latest review message: trial results go into its thread."""
        msgs = posted_messages(self.store.ledger) if self.store else []
        return (msgs[-1]["channel"], msgs[-1]["ts"]) if msgs else None

    def _post_in_thread(self, text: str) -> None:
        from slack_sdk.errors import SlackApiError, SlackClientError

        where = self._thread()
        if where is None:
            return
        try:
            self.client.chat_postMessage(channel=where[0], thread_ts=where[1], text=clip(esc(text), 3000),
                                         unfurl_links=False)
        except (SlackApiError, SlackClientError, OSError) as e:  # progress is best-effort
            print(f"mart: could not post to the Slack thread ({_api_error(e)})", file=sys.stderr)

    def _live(self) -> LiveProgress | None:
        """The live message of the current review thread (a new one when a new review was posted)."""
        where = self._thread()
        if where is None:
            return None
        if self._live_where != where:
            if self._live_progress is not None:
                self._live_progress.push(force=True)  # the old thread's message shows where it stopped
            self._live_where = where
            self._live_progress = LiveProgress(post=lambda text: self._send(where, text),
                                               update=lambda ts, text: self._edit(where, ts, text),
                                               interval_s=self.live_interval_s)
        return self._live_progress

    def _send(self, where: tuple[str, str], text: str) -> str | None:
        from slack_sdk.errors import SlackApiError, SlackClientError

        try:
            resp = self.client.chat_postMessage(channel=where[0], thread_ts=where[1], text=clip(esc(text), 3000),
                                                unfurl_links=False)
            return resp["ts"]
        except (SlackApiError, SlackClientError, OSError) as e:  # progress is best-effort
            print(f"mart: could not post to the Slack thread ({_api_error(e)})", file=sys.stderr)
            return None

    def _edit(self, where: tuple[str, str], ts: str | None, text: str) -> None:
        from slack_sdk.errors import SlackApiError, SlackClientError

        if ts is None:
            return
        try:
            self.client.chat_update(channel=where[0], ts=ts, text=clip(esc(text), 3000))
        except (SlackApiError, SlackClientError, OSError) as e:
            print(f"mart: could not update the live progress in Slack ({_api_error(e)})", file=sys.stderr)

    def on_progress(self, event: Any, line: str) -> None:
        from mart.nodes.progress import HealthNotice, TrialDone, TrialStopped

        live = self._live()
        if live is not None:
            live.event(event)
        if isinstance(event, (TrialDone, TrialStopped)) or (isinstance(event, HealthNotice)
                                                             and event.severity == "stop"):
            self._post_in_thread(line.strip())

    def on_finish(self, summary: dict[str, Any]) -> None:
        from mart.graph.figures import stage_figures

        if self._live_progress is not None:
            self._live_progress.push(force=True)

        lines = [f":checkered_flag: mart run {summary.get('run_id')} completed"]
        for f in stage_figures(summary):  # the terminal's and the report's figures and knob names
            lines.append(f.sentence() + (f"; best config: {', '.join(f.config)}" if f.config else ""))
        lines += [f"note: {n}" for n in summary.get("notes") or []]
        if summary.get("report"):
            lines.append(f"report: {summary['report']}")
        self._post_in_thread("\n".join(lines))
        where = self._thread()
        if where and summary.get("report"):
            try:  # the page itself, where the workspace allows uploads
                self.client.files_upload_v2(channel=where[0], thread_ts=where[1], file=summary["report"],
                                            title=f"mart report {summary.get('run_id')}")
            except Exception as e:  # noqa: BLE001 - the path was posted above; an upload is a bonus
                print(f"mart: report not uploaded to Slack ({type(e).__name__})", file=sys.stderr)

    @property
    def client(self):
        if self._client is None:
            self._client = slack_client(self.api_url)
        return self._client

    def _channel(self) -> str:
        if self.channel or os.environ.get(CHANNEL_ENV):
            return self.channel or os.environ[CHANNEL_ENV]
        previous = posted_messages(self.store.ledger) if self.store else []
        if previous:
            return previous[-1]["channel"]
        raise SlackConfigError(f"no Slack channel: pass --slack-channel or set {CHANNEL_ENV}")

    def review(self, request: dict[str, Any]) -> None:
        from slack_sdk.errors import SlackApiError, SlackClientError

        if self._live_progress is not None:  # the thread shows where the trials stand at the pause
            self._live_progress.push(force=True)

        ledger = self.store.ledger if self.store else None
        posted = {m["interrupt_id"] for m in posted_messages(ledger)} if ledger is not None else set()
        if request.get("interrupt_id") in posted:
            return  # already posted (a resumed driver reached the same pause): don't post twice
        try:
            resp = self.client.chat_postMessage(channel=self._channel(), text=clip(esc(format_request(request)), 3000),
                                                blocks=review_blocks(request), unfurl_links=False)
        except (SlackConfigError, SlackApiError, SlackClientError, OSError) as e:
            # the run is paused either way: say so instead of failing the session
            detail = _api_error(e)
            self.failed = f"could not post review #{request.get('review_no')} to Slack ({detail})"
            print(f"mart: could not post review #{request.get('review_no')} to Slack ({type(e).__name__}: {detail}); "
                  f"the run is paused: answer with `mart review {_ref(self, request)}`", file=sys.stderr)
            return
        if ledger is not None and request.get("interrupt_id"):
            record_message(ledger, request, resp["channel"], resp["ts"])
        return


def _ref(reviewer, request: dict) -> str:
    """The run as a command line names it again (with its --runs-dir): the bound store's, else the request's id."""
    store = getattr(reviewer, "store", None)
    return store.ref if store is not None else str(request.get("run_id"))
