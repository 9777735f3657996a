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

import json
import math
import os
import sys
import time
from typing import Any

from mart.graph.reviewers.base import Reviewer, format_request
from mart.state.config_values import format_value
from mart.state.ledger import Ledger
from mart.state.models import ReviewDecision
from mart.state.text import slack_text
from mart.state.units import fmt_gb

TOKEN_ENV = "SLACK_BOT_TOKEN"
CHANNEL_ENV = "MART_SLACK_CHANNEL"
API_URL_ENV = "MART_SLACK_API_URL"

ACTION_APPROVE = "mart_approve"
ACTION_EDIT = "mart_edit"
ACTION_REJECT = "mart_reject"
ACTIONS_BLOCK = "mart_review_actions"
MODAL_CALLBACK = "mart_decision"
FEEDBACK_BLOCK, FEEDBACK_INPUT = "mart_feedback", "feedback_input"
EDITS_BLOCK, EDITS_INPUT = "mart_edits", "edits_input"

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


# -- what a button carries --------------------------------------------------------------------------
def button_value(request: dict[str, Any], candidate_id: str | None = None) -> str:
    """Run id, interrupt id and candidate id (None: every candidate of the review): enough to find and check the
    review, nothing secret."""
    return json.dumps({"run": request["run_id"], "interrupt": request.get("interrupt_id"),
                       "candidate": candidate_id, "review": request.get("review_no")},
                      separators=(",", ":"))


def parse_button_value(value: str) -> dict[str, Any]:
    data = json.loads(value)
    run = str(data.get("run") or "")
    if not run or not all(c.isalnum() or c in "-_." for c in run) or run.startswith("."):
        raise ValueError(f"bad run id in button value: {run!r}")
    if not data.get("interrupt"):
        raise ValueError("button value has no interrupt id")
    if data.get("candidate") is not None and not isinstance(data["candidate"], str):
        raise ValueError("bad candidate id in button value")
    return data


# -- Block Kit --------------------------------------------------------------------------------------
def _clip(text: str, n: int = 2900) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def esc(text: Any) -> str:
    """Foreign text for a Slack mrkdwn field: ``&<>`` escaped as Slack asks, so ``<!channel>``, ``<@U1>`` and
    ``<https://evil|docs>`` show as the text they are (no mention, no disguised link), and no control characters.
    See https://api.slack.com/reference/surfaces/formatting#escaping."""
    return slack_text(text)


def _code(text: Any) -> str:
    # a backtick inside would end the code span early
    return "`" + esc(text).replace("`", "'") + "`"


def _fmt(v: Any) -> str:
    return _code(repr(v) if not isinstance(v, str) else v)


def _candidates(request: dict[str, Any]) -> list[dict[str, Any]]:
    return list(request.get("candidates") or [])


def candidate_blocks(request: dict[str, Any], cand: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """One candidate as Block Kit sections: facts, diff, rationale, critique."""
    pred, limit = cand.get("predicted_memory_gb"), request.get("memory_limit_gb")
    mem = fmt_gb(pred, "unknown") + ("" if limit is None else f" (limit {fmt_gb(limit)})")
    diff = "\n".join(f"• {_fmt(d['key'])}: {_fmt(d['current'])} → {_fmt(d['proposed'])}"
                     for d in cand.get("diff") or []) or "_no change against the current best_"
    title = f"*Candidate {n}*" if len(_candidates(request)) > 1 else "*Candidate*"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"{title}\n{_code(cand.get('candidate_id'))} ({esc(cand.get('source'))})"},
            {"type": "mrkdwn", "text": f"*Predicted peak memory*\n{mem}"},
        ]},
        {"type": "section", "text": {"type": "mrkdwn", "text": _clip("*Changes against the current best*\n" + diff)}},
    ]
    if cand.get("rationale"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": _clip(f"*Rationale*\n{esc(cand['rationale'])}")}})
    crit = cand.get("critique") or {}
    if crit:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(
            f"*Critic* (risk {esc(crit.get('risk'))})\n" + "\n".join(f"• {esc(r)}" for r in crit.get("reasons") or []))}})
    return blocks


def summary_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The review as Block Kit sections (no controls): header, facts, then each candidate."""
    cands = _candidates(request)
    running = request.get("running") or []
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(
            f"mart review #{request.get('review_no')}: {request.get('stage')} stage", 150)}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*Run*\n{_code(request.get('run_id'))}"},
            {"type": "mrkdwn", "text": f"*Trials so far*\n{esc(request.get('trials_done'))}"
                                       + (f", bottleneck {esc(request['bottleneck'])}" if request.get("bottleneck") else "")},
        ] + ([{"type": "mrkdwn", "text": f"*Running*\n{esc(', '.join(map(str, running)))}"}] if running else [])},
    ]
    if request.get("segment"):  # schedule stage: a transition for the next segment, from a checkpoint
        a, b = request["segment"]
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(
            f"*Branch* from {_code(request.get('parent_trial'))}'s checkpoint at step {a}: knobs for steps {a}-{b}")}})
    if len(cands) > 1:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": (
            f"*{len(cands)} candidates* for {len(cands)} free trial slots: decide each, or approve them all.")}})
    for n, cand in enumerate(cands, 1):
        if n > 1:
            blocks.append({"type": "divider"})
        blocks += candidate_blocks(request, cand, n)
    if request.get("feedback_read"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(
            "*Read your feedback as*\n" + ", ".join(request["feedback_read"]))}})
    for a in request.get("answers") or []:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(
            f"*Q*: {esc(a.get('question'))}\n*A*: {esc(a.get('answer'))}")}})
    if request.get("error"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": _clip(f":warning: *Previous answer refused*: {esc(request['error'])}")}})
    return blocks


def _buttons(request: dict[str, Any], candidate_id: str | None, suffix: str = "") -> dict[str, Any]:
    value = button_value(request, candidate_id)
    block_id = ACTIONS_BLOCK + (f":{candidate_id}" if candidate_id else "")
    return {"type": "actions", "block_id": block_id[:255], "elements": [
        {"type": "button", "action_id": ACTION_APPROVE, "style": "primary", "value": value,
         "text": {"type": "plain_text", "text": f"Approve{suffix}"}},
        *([] if candidate_id is None and len(_candidates(request)) > 1 else [
            {"type": "button", "action_id": ACTION_EDIT, "value": value,
             "text": {"type": "plain_text", "text": f"Edit{suffix}…"}}]),
        {"type": "button", "action_id": ACTION_REJECT, "style": "danger", "value": value,
         "text": {"type": "plain_text", "text": f"Reject{suffix} with feedback…"}},
    ]}


def review_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The review message: the summary plus Approve / Edit… / Reject… buttons (edit and reject open a form), one
    row per candidate when the review covers several, and a row for all of them."""
    cands = _candidates(request)
    if len(cands) <= 1:
        rows = [_buttons(request, cands[0]["candidate_id"] if cands else None)]
    else:
        rows = [_buttons(request, c["candidate_id"], f" {n}") for n, c in enumerate(cands, 1)]
        rows.append(_buttons(request, None, " all (the rest)"))
    return [*summary_blocks(request), *rows, {
        "type": "context", "elements": [{"type": "mrkdwn", "text": "or from a terminal: " + _code(f"mart review {request['run_id']}")}],
    }]


def describe_decision(decision: ReviewDecision) -> str:
    parts = []
    for d in decision.decisions:
        who = f" {esc(d.candidate_id)}" if d.candidate_id else (" the rest" if len(decision.decisions) > 1 else "")
        if d.type == "approve":
            parts.append(f"approved{who}")
        elif d.type == "edit":
            edits = ", ".join(f"{esc(k)}={esc(repr(v))}" for k, v in d.edits.items())
            parts.append(f"edited{who} ({edits})" + (f" - “{esc(d.message)}”" if d.message else ""))
        elif d.type == "respond":
            parts.append(f"asked{who}: “{esc(d.message)}”")
        else:
            parts.append(f"rejected{who}" + (f": “{esc(d.message)}”" if d.message else ""))
    return "; ".join(parts)


_ICONS = {"approve": ":white_check_mark:", "edit": ":pencil2:", "reject": ":x:", "respond": ":speech_balloon:"}


def decided_blocks(request: dict[str, Any], decision: ReviewDecision, user_id: str) -> list[dict[str, Any]]:
    """The message after a decision: the summary, no controls, and who decided what."""
    icon = _ICONS[decision.decisions[0].type]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [*summary_blocks(request), {"type": "context", "elements": [{"type": "mrkdwn", "text": _clip(
        f"{icon} <@{user_id}> {describe_decision(decision)} at {when}; the run continues")}]}]


def decision_modal(action: str, meta: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The form for Edit (KEY=VALUE lines + optional note) or Reject (feedback for the proposer)."""
    cands = _candidates(request)
    cand = next((c for c in cands if c.get("candidate_id") == meta.get("candidate")), cands[0] if len(cands) == 1 else {})
    keys = ", ".join(_code(k) for k in (cand.get("overrides") or {})) or "the stage's knobs"
    if action == "edit":
        inputs = [
            {"type": "input", "block_id": EDITS_BLOCK, "label": {"type": "plain_text", "text": "Edits (KEY=VALUE, one per line)"},
             "element": {"type": "plain_text_input", "action_id": EDITS_INPUT, "multiline": True,
                         "initial_value": "\n".join(f"{k}={format_value(v)}" for k, v in (cand.get("overrides") or {}).items())}},
            {"type": "input", "block_id": FEEDBACK_BLOCK, "optional": True, "label": {"type": "plain_text", "text": "Note"},
             "element": {"type": "plain_text_input", "action_id": FEEDBACK_INPUT}},
        ]
    else:
        inputs = [{"type": "input", "block_id": FEEDBACK_BLOCK,
                   "label": {"type": "plain_text", "text": "Feedback for the proposer"},
                   "element": {"type": "plain_text_input", "action_id": FEEDBACK_INPUT, "multiline": True}}]
    which = _code(cand.get("candidate_id")) if cand else "every candidate not decided yet"
    return {
        "type": "modal", "callback_id": MODAL_CALLBACK, "private_metadata": json.dumps({**meta, "action": action}),
        "title": {"type": "plain_text", "text": "Edit candidate" if action == "edit" else "Reject candidate"},
        "submit": {"type": "plain_text", "text": "Run edited" if action == "edit" else "Reject"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": _clip(
            f"Review #{request.get('review_no')} of run {_code(request.get('run_id'))}, candidate "
            f"{which} (changes {keys})")}}, *inputs],
    }


# -- the ledger's record of posted messages --------------------------------------------------------
def _table(ledger: Ledger):
    table = ledger.db[MESSAGES_TABLE]
    if not table.exists():
        table.create({"interrupt_id": str, "run_id": str, "review_no": int, "candidate_id": str, "channel": str,
                      "ts": str, "posted_at": float, "decided_by": str, "action": str, "decided_at": float},
                     pk="interrupt_id")
    return table


def record_message(ledger: Ledger, request: dict[str, Any], channel: str, ts: str) -> None:
    ids = [c.get("candidate_id") for c in _candidates(request)]
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
            self.client.chat_postMessage(channel=where[0], thread_ts=where[1], text=_clip(esc(text), 3000),
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
            resp = self.client.chat_postMessage(channel=where[0], thread_ts=where[1], text=_clip(esc(text), 3000),
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
            self.client.chat_update(channel=where[0], ts=ts, text=_clip(esc(text), 3000))
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
            resp = self.client.chat_postMessage(channel=self._channel(), text=_clip(esc(format_request(request)), 3000),
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
