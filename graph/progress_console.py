"""A session's progress on the console: one line per event (trial launched, step, health notice, result,
proposal, critique), with each running trial's ETA and the session's, and the same lines to the reviewer's channel.

Every text in an event is foreign (trial logs, LLM output, feedback, paths): printed on one line, escaped."""

from __future__ import annotations

import time
from typing import Any, Callable

from rich.markup import escape

from mart.graph.eta import SessionEta
from mart.graph.reviewers import Reviewer
from mart.nodes.progress import (
    CritiqueDone,
    HealthNotice,
    ProgressEvent,
    Proposed,
    SessionNote,
    TrialDone,
    TrialFailed,
    TrialLaunched,
    TrialQueued,
    TrialReattached,
    TrialStarted,
    TrialStep,
    TrialStopped,
    parse_event,
)
from mart.state.units import fmt_gb


def _fmt_launched(e: TrialLaunched) -> tuple[str, str | None]:
    slot = f", slot {e.slot + 1}/{e.slots}" if e.slots > 1 else ""
    return f"[bold]▶ {e.trial_id}[/]: {e.what()} ({e.stage} stage, {e.horizon} steps{slot})", None


def _fmt_reattached(e: TrialReattached) -> tuple[str, str | None]:
    return f"[bold]↺ {e.trial_id}[/] re-attached (still known to the ledger)", None


def _fmt_queued(e: TrialQueued) -> tuple[str, str | None]:
    return f"  ⏸ {e.trial_id}: queued ({e.reason})", "yellow"


def _fmt_started(e: TrialStarted) -> tuple[str, str | None]:
    return f"  ▶ {e.trial_id}: started after {e.waited_s:.0f} s in the queue", None


def _fmt_failed(e: TrialFailed) -> tuple[str, str | None]:
    return f"  ✗ {e.trial_id}: {e.reason}", "red"


def _fmt_step(e: TrialStep) -> tuple[str, str | None]:
    parts = [f"  {e.trial_id} step {e.step:>3}"]
    for value, fmt in ((e.throughput, "{:.0f} tok/s"), (None if e.memory_gb is None else fmt_gb(e.memory_gb), "{}"), (e.reward, "reward {:.3f}"),
                       (e.entropy, "entropy {:.3f}"), (e.val_score, "val {:.3f}")):
        if value is not None:
            parts.append(fmt.format(value))
    return "  ".join(parts), "dim"


def _fmt_health(e: HealthNotice) -> tuple[str, str | None]:
    return f"  health {e.severity}: {e.rule}: {e.message}", "red" if e.severity == "stop" else "yellow"


def _fmt_stopped(e: TrialStopped) -> tuple[str, str | None]:
    return f"  ■ stopped: {e.reason}", "red"


def _fmt_done(e: TrialDone) -> tuple[str, str | None]:
    if e.score is not None:
        # a difference is printed with the figure it is taken from
        result = f", val score {e.score:.4f}" + (f" ({e.score - e.best_before:+.4f} vs {e.compared_to} "
                                                 f"{e.best_before:.4f})" if e.best_before is not None else "")
    elif e.throughput is not None:
        result = f", {e.throughput:,.0f} tok/s" + (f" ({(e.throughput / e.best_before - 1) * 100:+.1f}% vs "
                                                    f"{e.compared_to} {e.best_before:,.0f})" if e.best_before else "")
    else:
        result = ""
    return (f"  ✓ {e.trial_id}: {e.status}{result}"
            + (f", peak {fmt_gb(e.peak_memory_gb)}" if e.peak_memory_gb else "")
            + ("" if e.eligible else f" (not eligible: {e.reason or 'see ledger'})")), None


def _fmt_proposed(e: Proposed) -> tuple[str, str | None]:
    slots = f" for {e.slots} free slots" if e.slots > 1 else ""
    return f"[cyan]proposer[/] round {e.round}: {len(e.candidates)} candidates{slots}", None


def _fmt_note(e: SessionNote) -> tuple[str, str | None]:
    return f"[yellow]note[/]: {e.message}", None


def _fmt_critique(e: CritiqueDone) -> tuple[str, str | None]:
    picks = e.picks or ([e.pick] if e.pick else [])
    return (f"[cyan]critic[/] picked {', '.join(picks)}" if picks else f"[cyan]critic[/] {e.feedback}"), None


#: one formatter per kind of progress event: (rich markup, style)
FORMATTERS: dict[type, Callable[[Any], tuple[str, str | None]]] = {
    TrialLaunched: _fmt_launched, TrialReattached: _fmt_reattached, TrialQueued: _fmt_queued,
    TrialStarted: _fmt_started, TrialFailed: _fmt_failed,
    TrialStep: _fmt_step, HealthNotice: _fmt_health, TrialStopped: _fmt_stopped, TrialDone: _fmt_done,
    Proposed: _fmt_proposed, CritiqueDone: _fmt_critique, SessionNote: _fmt_note,
}


def format_event(event: ProgressEvent | dict[str, Any]) -> tuple[str, str | None]:
    """The console line of a progress event (typed, or its JSON form from the custom stream)."""
    if isinstance(event, dict):
        event = parse_event(event)
    # every text in an event is foreign (trial logs, LLM output, feedback, paths): one line without terminal
    # controls (mart.state.text.one_line), and escaped, so that "[/data/x]" prints as itself instead of being
    # read as rich markup (or crashing its parser)
    from mart.state.text import one_line

    foreign = {k: escape(one_line(v)) for k, v in event if isinstance(v, str)}
    foreign.update({k: [escape(one_line(x)) if isinstance(x, str) else x for x in v]
                    for k, v in event if isinstance(v, list)})
    return FORMATTERS[type(event)](event.model_copy(update=foreign))


class ConsoleProgress:
    """Human-readable progress lines (rich) with each running trial's ETA; silent when quiet."""

    def __init__(self, quiet: bool = False, eta: SessionEta | None = None) -> None:
        self.quiet = quiet
        self._running: dict[str, tuple[float, int]] = {}  # trial -> (launch time, horizon)
        self.eta = eta  # the session's overall ETA, printed after each trial's launch and end
        if not quiet:
            import sys

            from rich.console import Console

            # piped stderr (CI, log files) keeps whole lines instead of rich's 80-column wrapping
            self.console = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())

    def __call__(self, event: ProgressEvent) -> None:
        if self.quiet:
            return
        text, style = format_event(event)
        if isinstance(event, TrialLaunched):
            self._running[event.trial_id] = (time.monotonic(), event.horizon)
        elif isinstance(event, TrialStep) and event.trial_id in self._running:
            text += self._eta(event.trial_id, event.step)
        self.console.print(text, style=style)
        self._follow(event)

    def _follow(self, event: ProgressEvent) -> None:
        """The session's overall ETA: updated by every trial event, printed after a launch and an end."""
        if self.eta is None:
            return
        if isinstance(event, TrialLaunched):
            self.eta.launched_trial(event.trial_id, event.stage, event.kind, event.horizon, event.slots)
        elif isinstance(event, TrialStep):
            self.eta.step(event.trial_id, event.step)
        elif isinstance(event, (TrialDone, TrialFailed)):
            self.eta.ended(event.trial_id)
        if isinstance(event, (TrialLaunched, TrialDone)):
            text = self.eta.text()
            if text:
                self.console.print(f"  {text}", style="cyan", markup=False)

    def _eta(self, trial_id: str, step: int) -> str:
        started, horizon = self._running[trial_id]
        if step <= 0 or step >= horizon:
            return f"  [{step}/{horizon}]"
        left = (time.monotonic() - started) / step * (horizon - step)
        return f"  [{step}/{horizon}, ETA {int(left // 60)}:{int(left % 60):02d}]"


def tee_progress(progress: ConsoleProgress, reviewer: Reviewer) -> Callable[[ProgressEvent], None]:
    """Progress to the console and to the reviewer's channel (a Slack thread gets each trial's result)."""
    from rich.text import Text

    def sink(event: ProgressEvent) -> None:
        progress(event)
        reviewer.on_progress(event, Text.from_markup(format_event(event)[0]).plain)

    return sink
