"""The reviewer-channel interface and the built-in channels ``auto``, ``tty`` and ``none``.

A channel gets the review request (the interrupt's payload, see ``mart.nodes.human_review``) and returns a
``ReviewDecision``, or None to leave the run paused (the tuner exits; any channel can answer later).
"""

from __future__ import annotations

import abc
import getpass
import sys
from typing import TYPE_CHECKING, Any

from mart.state.config_values import parse_assignments, split_assignments
from mart.state.models import CandidateDecision, ReviewDecision
from mart.state.text import plain  # noqa: F401 - the terminal's escaping, with every other output's; re-exported
from mart.state.units import fmt_gb

if TYPE_CHECKING:
    from mart.state.run_store import RunStore


class Reviewer(abc.ABC):
    name: str = "base"
    store: RunStore | None = None
    """The run under review, set by the session driver (``bind``) before the first request."""

    def bind(self, store: RunStore) -> None:
        """Called by the driver with the run it drives (channels that record messages use its ledger)."""
        self.store = store

    failed: str | None = None
    """Set when the channel could not deliver a review (the run is paused; the CLI exits non-zero)."""

    waits: bool = False
    """``review`` waits in this process for a person's answer (the terminal): the trials in flight are watched
    meanwhile (``mart.tools.watch.WatchDuringReview``). Channels that detach, or answer at once, leave it False."""

    @abc.abstractmethod
    def review(self, request: dict[str, Any]) -> ReviewDecision | None:
        """Answer one review request, or None to detach (the run stays paused at this review)."""

    def on_progress(self, event: Any, line: str) -> None:
        """A progress event while the driver runs (``line``: its plain console text). Default: nothing."""

    def on_finish(self, summary: dict[str, Any]) -> None:
        """The session completed (``summary`` as ``mart tune --json`` prints it, plus ``report``)."""


class AutoReviewer(Reviewer):
    """Unattended runs: approve everything, or only candidates predicted within the memory margin."""

    name = "auto"

    def __init__(self, policy: str = "all") -> None:
        if policy not in ("all", "margin"):
            raise ValueError(f"auto policy must be 'all' or 'margin', got {policy!r}")
        self.policy = policy

    def review(self, request: dict[str, Any]) -> ReviewDecision:
        limit = request.get("memory_limit_gb")
        decisions = []
        for cand in request.get("candidates") or []:
            pred = cand.get("predicted_memory_gb")
            if self.policy == "margin" and pred is not None and limit is not None and pred > limit:
                decisions.append(CandidateDecision(
                    type="reject", candidate_id=cand["candidate_id"],
                    message=f"predicted memory {fmt_gb(pred)} is above the margin limit {fmt_gb(limit)}; "
                            "propose something that uses less memory"))
        if len(decisions) < len(request.get("candidates") or []) or not decisions:
            decisions.append(CandidateDecision(type="approve"))  # the rest
        return ReviewDecision(decisions=decisions, reviewer="auto", channel="auto")


class DetachReviewer(Reviewer):
    """``--approve none``: never answers; the tuner saves the pause and exits."""

    name = "none"

    def review(self, request: dict[str, Any]) -> None:
        return None


def format_request(request: dict[str, Any]) -> str:
    """Plain-text rendering of a review request (tty, logs, Slack fallback text), without control characters."""
    return plain(_format_request(request))


def _format_request(request: dict[str, Any]) -> str:
    cands = request.get("candidates") or []
    running = request.get("running") or []
    lines = [f"Review #{request.get('review_no')} - run {request.get('run_id')} - {request.get('stage')} stage "
             f"(trials so far: {request.get('trials_done')}"
             + (f"; running: {', '.join(map(str, running))}" if running else "") + ")"]
    if request.get("segment"):  # schedule stage: a transition for the next segment, from a checkpoint
        a, b = request["segment"]
        lines.append(f"Branch from {request.get('parent_trial')}'s checkpoint at step {a}: knobs for steps {a}-{b}")
    if len(cands) > 1:
        lines.append(f"{len(cands)} candidates for {len(cands)} free trial slots; decide each, or all at once:")
    limit = request.get("memory_limit_gb")
    for i, cand in enumerate(cands, 1):
        head = f"Candidate {cand.get('candidate_id')} from {cand.get('source')}:"
        lines.append(f"[{i}] {head}" if len(cands) > 1 else head)
        for d in cand.get("diff") or []:
            lines.append(f"  {d['key']}: {d['current']!r} -> {d['proposed']!r}")
        if cand.get("rationale"):
            lines.append(f"  Rationale: {cand['rationale']}")
        crit = cand.get("critique") or {}
        if crit:
            lines.append(f"  Critic: risk {crit.get('risk')}; " + "; ".join(crit.get("reasons") or []))
        pred = cand.get("predicted_memory_gb")
        if pred is not None or limit is not None:
            p = fmt_gb(pred, "unknown")
            lim = fmt_gb(limit, "none")
            lines.append(f"  Predicted peak memory: {p} (limit {lim})")
        if cand.get("prediction"):
            lines.append(f"  Job model: {cand['prediction']}")
    if request.get("feedback_read"):
        lines.append("Read your feedback as: " + ", ".join(request["feedback_read"]))
    for a in request.get("answers") or []:
        lines.append(f"Q{' on ' + a['candidate_id'] if a.get('candidate_id') else ''}: {a.get('question')}")
        lines.append(f"A: {a.get('answer')}")
    if request.get("error"):
        lines.append(f"Previous answer refused: {request['error']}")
    return "\n".join(lines)


class TTYReviewer(Reviewer):
    """Interactive prompt on the terminal."""

    name = "tty"
    waits = True

    def __init__(self, stdin=None, stdout=None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout

    def _ask(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise EOFError("no reviewer input (stdin closed)")
        return line.strip()

    def review(self, request: dict[str, Any]) -> ReviewDecision | None:
        self.stdout.write("\n" + format_request(request) + "\n")
        who = getpass.getuser()
        ids = [c.get("candidate_id") for c in request.get("candidates") or []]
        if len(ids) <= 1:
            d = self._decide(ids[0] if ids else None, "")
            return None if d is None else ReviewDecision(decisions=[d.model_copy(update={"candidate_id": None})],
                                                         reviewer=who, channel="tty")
        while True:  # several candidates: one answer for all, or one per candidate
            try:
                mode = self._ask("[A]pprove all, [R]eject all, decide [e]ach, [q]uestion, [d]etach: ").strip()
            except EOFError:
                return None
            if mode in ("A", "a", "approve"):
                return ReviewDecision.approve_all(reviewer=who, channel="tty")
            if mode in ("d", "detach"):
                return None
            if mode in ("R", "r", "reject"):
                fb = self._read("Feedback for the proposer: ")
                return None if fb is None else ReviewDecision(
                    decisions=[CandidateDecision(type="reject", message=fb)], reviewer=who, channel="tty")
            if mode in ("q", "question"):
                q = self._read("Your question for the agents: ")
                return None if q is None else ReviewDecision(
                    decisions=[CandidateDecision(type="respond", message=q)], reviewer=who, channel="tty")
            if mode in ("e", "each"):
                decisions = []
                for cid in ids:
                    d = self._decide(cid, f"{cid}: ")
                    if d is None:
                        return None
                    decisions.append(d)
                return ReviewDecision(decisions=decisions, reviewer=who, channel="tty")
            self.stdout.write("Please answer A, R, e, q or d.\n")

    def _read(self, prompt: str) -> str | None:
        try:
            return self._ask(prompt)
        except EOFError:
            return None

    def _decide(self, candidate_id: str | None, prefix: str) -> CandidateDecision | None:
        """One candidate's decision from the terminal (None: detach)."""
        while True:
            choice = self._read(prefix + "[a]pprove, [e]dit, [r]eject with feedback, [q]uestion, [d]etach (decide "
                                "later): ")
            if choice is None:
                return None
            choice = choice.lower()
            if choice in ("a", "approve"):
                return CandidateDecision(type="approve", candidate_id=candidate_id)
            if choice in ("d", "detach"):
                return None
            if choice in ("r", "reject"):
                fb = self._read("Feedback for the proposer: ")
                return None if fb is None else CandidateDecision(type="reject", candidate_id=candidate_id, message=fb)
            if choice in ("q", "question"):
                q = self._read("Your question for the agents: ")
                return None if q is None else CandidateDecision(type="respond", candidate_id=candidate_id, message=q)
            if choice in ("e", "edit"):
                raw = self._read("KEY=VALUE pairs, space separated: ")
                if raw is None:
                    return None
                try:
                    edits = parse_assignments(split_assignments(raw))
                except ValueError as e:
                    self.stdout.write(f"{e}\n")
                    continue
                return CandidateDecision(type="edit", candidate_id=candidate_id, edits=edits)
            self.stdout.write("Please answer a, e, r, q or d.\n")
