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
from mart.state.models import ReviewDecision

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
        pred, limit = request.get("predicted_memory_gb"), request.get("memory_limit_gb")
        if self.policy == "margin" and pred is not None and limit is not None and pred > limit:
            return ReviewDecision(action="reject", reviewer="auto", channel="auto",
                                  feedback=f"predicted memory {pred:.2f} GB is above the margin limit {limit:.2f} GB; "
                                           "propose something that uses less memory")
        return ReviewDecision(action="approve", reviewer="auto", channel="auto")


class DetachReviewer(Reviewer):
    """``--approve none``: never answers; the tuner saves the pause and exits."""

    name = "none"

    def review(self, request: dict[str, Any]) -> None:
        return None


# Terminal controls a foreign string must not carry to a reviewer's screen: C0/C1 controls (ESC starts
# sequences that clear the screen, set the window title, move the cursor) and the bidirectional
# overrides that make text read differently from what it is (CVE-2021-42574, "Trojan Source").
_BIDI = dict.fromkeys(map(ord, "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"))
_CONTROLS = {c: None for c in [*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0)]}
_STRIP = {**_CONTROLS, **_BIDI, 0x0d: None}


def plain(text: Any) -> str:
    """``text`` without control characters and bidi overrides (newlines and tabs kept)."""
    return str(text).translate(_STRIP)


def format_request(request: dict[str, Any]) -> str:
    """Plain-text rendering of a review request (tty, logs, Slack fallback text), without control characters."""
    return plain(_format_request(request))


def _format_request(request: dict[str, Any]) -> str:
    lines = [f"Review #{request.get('review_no')} - run {request.get('run_id')} - {request.get('stage')} stage "
             f"(trials so far: {request.get('trials_done')})",
             f"Candidate {request.get('candidate_id')} from {request.get('source')}:"]
    if request.get("segment"):  # schedule stage: a transition for the next segment, from a checkpoint
        a, b = request["segment"]
        lines.insert(1, f"Branch from {request.get('parent_trial')}'s checkpoint at step {a}: knobs for steps {a}-{b}")
    for d in request.get("diff") or []:
        lines.append(f"  {d['key']}: {d['current']!r} -> {d['proposed']!r}")
    if request.get("feedback_read"):
        lines.append("Read your feedback as: " + ", ".join(request["feedback_read"]))
    if request.get("rationale"):
        lines.append(f"Rationale: {request['rationale']}")
    crit = request.get("critique") or {}
    if crit:
        lines.append(f"Critic: risk {crit.get('risk')}; " + "; ".join(crit.get("reasons") or []))
    pred, limit = request.get("predicted_memory_gb"), request.get("memory_limit_gb")
    if pred is not None or limit is not None:
        p = "unknown" if pred is None else f"{pred:.2f} GB"
        lim = "none" if limit is None else f"{limit:.2f} GB"
        lines.append(f"Predicted peak memory: {p} (limit {lim})")
    if request.get("prediction"):
        lines.append(f"Job model: {request['prediction']}")
    if request.get("error"):
        lines.append(f"Previous answer refused: {request['error']}")
    return "\n".join(lines)


class TTYReviewer(Reviewer):
    """Interactive prompt on the terminal."""

    name = "tty"

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
        while True:
            try:
                choice = self._ask("[a]pprove, [e]dit, [r]eject with feedback, [d]etach (decide later): ").lower()
            except EOFError:
                return None
            if choice in ("a", "approve"):
                return ReviewDecision(action="approve", reviewer=who, channel="tty")
            if choice in ("d", "detach"):
                return None
            if choice in ("r", "reject"):
                fb = self._ask("Feedback for the proposer: ")
                return ReviewDecision(action="reject", feedback=fb, reviewer=who, channel="tty")
            if choice in ("e", "edit"):
                raw = self._ask("KEY=VALUE pairs, space separated: ")
                try:
                    edits = parse_assignments(split_assignments(raw))
                except ValueError as e:
                    self.stdout.write(f"{e}\n")
                    continue
                return ReviewDecision(action="edit", edits=edits, reviewer=who, channel="tty")
            self.stdout.write("Please answer a, e, r or d.\n")
