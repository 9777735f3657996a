"""What a Slack review message is made of: the Block Kit blocks of a review (each candidate's diff, rationale,
critique and predicted memory, and its Approve / Edit / Reject buttons), of a decided review, the decision form,
and what a button carries. Every text from a run (configs, feedback, LLM output) is escaped for Slack here."""

from __future__ import annotations

import json
import time
from typing import Any

from mart.state.config_values import format_value
from mart.state.models import ReviewDecision
from mart.state.text import slack_text
from mart.state.units import fmt_gb

ACTION_APPROVE = "mart_approve"
ACTION_EDIT = "mart_edit"
ACTION_REJECT = "mart_reject"
ACTIONS_BLOCK = "mart_review_actions"
MODAL_CALLBACK = "mart_decision"
FEEDBACK_BLOCK, FEEDBACK_INPUT = "mart_feedback", "feedback_input"
EDITS_BLOCK, EDITS_INPUT = "mart_edits", "edits_input"


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
def clip(text: str, n: int = 2900) -> str:
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


def candidates(request: dict[str, Any]) -> list[dict[str, Any]]:
    return list(request.get("candidates") or [])


def candidate_blocks(request: dict[str, Any], cand: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """One candidate as Block Kit sections: facts, diff, rationale, critique."""
    pred, limit = cand.get("predicted_memory_gb"), request.get("memory_limit_gb")
    mem = fmt_gb(pred, "unknown") + ("" if limit is None else f" (limit {fmt_gb(limit)})")
    diff = "\n".join(f"• {_fmt(d['key'])}: {_fmt(d['current'])} → {_fmt(d['proposed'])}"
                     for d in cand.get("diff") or []) or "_no change against the current best_"
    title = f"*Candidate {n}*" if len(candidates(request)) > 1 else "*Candidate*"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"{title}\n{_code(cand.get('candidate_id'))} ({esc(cand.get('source'))})"},
            {"type": "mrkdwn", "text": f"*Predicted peak memory*\n{mem}"},
        ]},
        {"type": "section", "text": {"type": "mrkdwn", "text": clip("*Changes against the current best*\n" + diff)}},
    ]
    if cand.get("rationale"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": clip(f"*Rationale*\n{esc(cand['rationale'])}")}})
    crit = cand.get("critique") or {}
    if crit:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(
            f"*Critic* (risk {esc(crit.get('risk'))})\n" + "\n".join(f"• {esc(r)}" for r in crit.get("reasons") or []))}})
    return blocks


def summary_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The review as Block Kit sections (no controls): header, facts, then each candidate."""
    cands = candidates(request)
    running = request.get("running") or []
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(
            f"mart review #{request.get('review_no')}: {request.get('stage')} stage", 150)}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*Run*\n{_code(request.get('run_id'))}"},
            {"type": "mrkdwn", "text": f"*Trials so far*\n{esc(request.get('trials_done'))}"
                                       + (f", bottleneck {esc(request['bottleneck'])}" if request.get("bottleneck") else "")},
        ] + ([{"type": "mrkdwn", "text": f"*Running*\n{esc(', '.join(map(str, running)))}"}] if running else [])},
    ]
    if request.get("segment"):  # schedule stage: a transition for the next segment, from a checkpoint
        a, b = request["segment"]
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(
            f"*Branch* from {_code(request.get('parent_trial'))}'s checkpoint at step {a}: knobs for steps {a}-{b}")}})
    if len(cands) > 1:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": (
            f"*{len(cands)} candidates* for {len(cands)} free trial slots: decide each, or approve them all.")}})
    for n, cand in enumerate(cands, 1):
        if n > 1:
            blocks.append({"type": "divider"})
        blocks += candidate_blocks(request, cand, n)
    if request.get("feedback_read"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(
            "*Read your feedback as*\n" + ", ".join(request["feedback_read"]))}})
    for a in request.get("answers") or []:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(
            f"*Q*: {esc(a.get('question'))}\n*A*: {esc(a.get('answer'))}")}})
    if request.get("error"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": clip(f":warning: *Previous answer refused*: {esc(request['error'])}")}})
    return blocks


def _buttons(request: dict[str, Any], candidate_id: str | None, suffix: str = "") -> dict[str, Any]:
    value = button_value(request, candidate_id)
    block_id = ACTIONS_BLOCK + (f":{candidate_id}" if candidate_id else "")
    return {"type": "actions", "block_id": block_id[:255], "elements": [
        {"type": "button", "action_id": ACTION_APPROVE, "style": "primary", "value": value,
         "text": {"type": "plain_text", "text": f"Approve{suffix}"}},
        *([] if candidate_id is None and len(candidates(request)) > 1 else [
            {"type": "button", "action_id": ACTION_EDIT, "value": value,
             "text": {"type": "plain_text", "text": f"Edit{suffix}…"}}]),
        {"type": "button", "action_id": ACTION_REJECT, "style": "danger", "value": value,
         "text": {"type": "plain_text", "text": f"Reject{suffix} with feedback…"}},
    ]}


def review_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The review message: the summary plus Approve / Edit… / Reject… buttons (edit and reject open a form), one
    row per candidate when the review covers several, and a row for all of them."""
    cands = candidates(request)
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
    return [*summary_blocks(request), {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(
        f"{icon} <@{user_id}> {describe_decision(decision)} at {when}; the run continues")}]}]


def decision_modal(action: str, meta: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The form for Edit (KEY=VALUE lines + optional note) or Reject (feedback for the proposer)."""
    cands = candidates(request)
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
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": clip(
            f"Review #{request.get('review_no')} of run {_code(request.get('run_id'))}, candidate "
            f"{which} (changes {keys})")}}, *inputs],
    }
