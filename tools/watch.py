"""Watch tool node: follows every trial in flight until one of them ends or must be stopped.

One loop inside one node: each pass reads every running trial's new metric lines into the ledger, reports
them as progress, polls the trial, and, per trial, runs the health monitor on each ``watch_interval_s`` pass
that brought new steps (``mart.nodes.health_monitor.assess``) and the progress watchdog (no new step for too
long: hung, or frozen by SIGSTOP). A trial whose poll says it is queued (``TrialPoll.queued``: a Ray job waiting
for a free node) is neither failed nor timed: the ledger says what it waits for (``mart status`` shows it), and
its first-step clock starts when it leaves the queue (``running_at``). It returns to the graph only when a trial
finished or must be stopped, or logged the step its stage asked to look at (``RunningTrial.look_at``: stage 1's
job model counts a running trial's early steps from then on), so the checkpoints a session writes grow with its
decisions, not with its polls (a day-long trial adds none). The state it keeps is the trials' handles; the
ledger's upserts make a resumed watch (a new node run) read again safely.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.health_monitor import STOP_PREFIX, assess
from mart.nodes.progress import TrialQueued, TrialStarted, TrialStep, emit
from mart.nodes.runtime import Services, services_for
from mart.state.graph_state import TuningState, running_trials
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord, step_throughput
from mart.state.models import TrialRecord
from mart.state.trial_state import ALIVE, TrialState
from mart.state.trials import RunningTrial
from mart.trial_runner.watchdog import Progress

#: Longest sleep between two passes over the running trials.
MAX_SLEEP_S = 0.25
#: A trial queued this long is announced (a Ray job is PENDING for a second or two while Ray starts its driver)
QUEUED_NOTICE_S = 5.0


@dataclass
class _Follow:
    """One running trial as the loop follows it."""

    trial: RunningTrial
    tail: Any
    known: set[int]
    new_steps: int = 0
    pass_started: float = field(default_factory=time.monotonic)
    progress: Progress = field(default_factory=Progress)
    clock_from: float = 0.0
    """Where the watchdog's first-step clock starts: the launch, or when the trial left its queue."""
    queued_since: float | None = None
    announced: bool = False


def watch_trial(state: TuningState, runtime: Runtime[Services]
                ) -> Command[Literal["stop_trial", "collect_trial", "stage_control"]]:
    services = services_for(state, runtime)
    trials = running_trials(state)
    assert trials, "watch_trial runs only while a trial is in flight"
    ledger = services.ledger
    rows = {rt.record.trial_id: ledger.trial(rt.record.trial_id) or {} for rt in trials}
    # stopped by the health monitor while the graph waited at a review (``WatchDuringReview``): stop and collect
    # them with that reason
    marked = {tid: row["reason"] for tid, row in rows.items() if row.get("status") == "running"
              and str(row.get("reason") or "").startswith(STOP_PREFIX)}
    if marked:
        return _leave([rt.move(TrialState.STOP_REQUESTED, reason=marked[rt.record.trial_id])
                       if rt.record.trial_id in marked and rt.state in ALIVE else rt for rt in trials])
    if any(rt.state not in ALIVE for rt in trials):  # to stop or to collect first
        return _leave(trials)
    follows = {rt.record.trial_id: _follow(services, rt, rows[rt.record.trial_id]) for rt in trials}
    interval = services.options.watch_interval_s
    watchdog = services.watchdog()
    while True:
        changed = passed = False
        for tid, f in follows.items():
            what = _watch_once(services, f, tid, interval, watchdog)
            changed = changed or what in (_LOOK, _CHANGED)
            passed = passed or what == _PASSED
            if what == _LOOK:
                break  # decide now: polling the others first would let the simulator's virtual clock run past the line
        if changed:
            return _leave([f.trial for f in follows.values()])
        if not passed:  # a trial whose pass just ended starts its next one at once (it reads what its poll revealed)
            time.sleep(min(MAX_SLEEP_S, interval))


def _follow(services: Services, rt: RunningTrial, row: dict[str, Any]) -> _Follow:
    """Start following a launched trial: its metric tail, the steps the ledger has, where its clocks stand."""
    assert rt.handle is not None
    ledger = services.ledger
    f = _Follow(trial=rt, tail=services.runner.metrics(rt.handle),
                known={r.step for r in ledger.metric_records(rt.record.trial_id)},
                clock_from=row.get("running_at") or rt.handle.started_at)
    if row.get("waiting_since") and not row.get("running_at"):  # queued when an earlier watch last saw it
        f.queued_since, f.announced = float(row["waiting_since"]), bool(row.get("waiting"))
    f.progress.observe(ledger.metric_records(rt.record.trial_id))
    return f


#: what one look at a trial found (``_watch_once``)
_LOOK, _CHANGED, _PASSED = "look", "changed", "passed"


def _watch_once(services: Services, f: _Follow, tid: str, interval: float, watchdog: Any) -> str | None:
    """One look at a followed trial: its new steps into the ledger, then its early look, its end, its health
    pass, its watchdog. ``_LOOK``/``_CHANGED``: its state moved (``f.trial``); ``_PASSED``: a health pass ended
    with nothing found; None: nothing new."""
    ledger = services.ledger
    rt, record = f.trial, f.trial.record
    assert rt.handle is not None
    records = f.tail.read_new()
    fresh = [r for r in records if r.step not in f.known]
    if records:
        ledger.add_metrics(tid, records)
    f.progress.observe(fresh)
    for rec in fresh:
        f.known.add(rec.step)
        f.new_steps += 1
        emit(services, _progress_event(record, rec))
    if rt.look_at is not None and not rt.looked and max(f.known, default=0) >= rt.look_at:
        # the stage asked to decide again once this step is logged (an early look), at once: before the
        # next poll, as a tuner acts on a line it read; the trial runs on meanwhile
        f.trial = rt.move(TrialState.LOOKED)
        return _LOOK
    poll = services.runner.poll(rt.handle)
    if not poll.status.is_finished() and _queued(services, f, tid, poll.queued):
        return None  # waiting for its resources: nothing to assess, no clock running
    if poll.status.is_finished():
        ledger.add_metrics(tid, f.tail.read_new())  # lines written just before the end
        assess(services, record, final=True)
        f.trial = rt.move(TrialState.FINISHED)
        return _CHANGED
    passed = False
    if f.new_steps and time.monotonic() - f.pass_started >= interval:
        # the end of one watch pass for this trial: the health monitor looks at what it brought
        reason = assess(services, record)
        f.new_steps, f.pass_started, passed = 0, time.monotonic(), True
        if reason:
            f.trial = rt.move(TrialState.STOP_REQUESTED, reason=reason)
            return _CHANGED
    hung = f.progress.expired(watchdog, f.clock_from)
    if hung:
        f.trial = rt.move(TrialState.STOP_REQUESTED, reason=hung)
        return _CHANGED
    return _PASSED if passed else None


def _queued(services: Services, f: _Follow, trial_id: str, queued: str | None) -> bool:
    """Keep the ledger and the progress output up to date with whether the trial waits in a queue; True while it does.

    The ledger keeps since when it waits (``waiting_since``) and, once announced, what for (``waiting``: what
    ``mart status`` shows), so a later watch (this node runs again after every collect) neither announces it twice
    nor restarts its wait."""
    now = time.time()
    if queued:
        if f.queued_since is None:
            # a trial never seen running has waited since its launch
            f.queued_since = f.trial.handle.started_at if f.clock_from == f.trial.handle.started_at else now
            services.ledger.set_trial_fields(trial_id, waiting_since=f.queued_since)
        if not f.announced and now - f.queued_since >= QUEUED_NOTICE_S:
            f.announced = True
            services.ledger.set_trial_fields(trial_id, waiting=queued)
            emit(services, TrialQueued(trial_id=trial_id, reason=queued))
        return True
    if f.queued_since is not None:  # it left the queue: its first-step clock starts now
        f.clock_from = now
        services.ledger.set_trial_fields(trial_id, waiting=None, running_at=now)
        if f.announced:
            emit(services, TrialStarted(trial_id=trial_id, waited_s=now - f.queued_since))
        f.queued_since, f.announced = None, False
    return False


def _leave(trials: list[RunningTrial]) -> Command:
    """Stop the trials that must stop, then collect every one that ended; with neither (an early look was taken),
    back to stage control, whose agents may find something new in what the trial logged (``waiting`` ends)."""
    running = {rt.record.trial_id: rt for rt in trials}
    if any(rt.state is TrialState.STOP_REQUESTED for rt in trials):
        return Command(goto="stop_trial", update={"running": running})
    if any(rt.state is TrialState.FINISHED for rt in trials):
        return Command(goto="collect_trial", update={"running": running})
    return Command(goto="stage_control", update={"running": running, "waiting": {}})


def _progress_event(record: TrialRecord, rec: StepRecord) -> TrialStep:
    def val(key: str) -> float | None:
        v = rec.get(key)
        return None if math.isnan(v) else v

    score = next((v for k, v in rec.data.items() if k.startswith("val-core/") and not math.isnan(v)), None)
    thr = step_throughput(rec)  # the figure the stage compares (the local trainer's is CPU-timed)
    return TrialStep(
        trial_id=record.trial_id, stage=record.stage, step=rec.step, throughput=None if math.isnan(thr) else thr,
        memory_gb=val("perf/max_memory_allocated_gb") or val("actor/perf/max_memory_allocated_gb"),
        reward=val("critic/score/mean"), entropy=val("actor/entropy"), val_score=score,
    )


class _Side:
    """The session's services as seen from the review watcher's thread: its own ledger connection, no progress
    output (the terminal is asking the reviewer), everything else shared (the main thread waits meanwhile)."""

    progress = None

    def __init__(self, services: Services, ledger: Any) -> None:
        self._services, self.ledger = services, ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._services, name)


class WatchDuringReview:
    """Follows the trials in flight while a person answers a review in this process (the terminal): their steps
    go into the ledger and the health monitor (the memory margin among its rules) judges them on each pass, so
    a sick trial is stopped then, not when the answer comes. It only stops and records: the graph, which waits
    at its interrupt meanwhile, routes a trial stopped so to its stop and collect nodes on its next watch (the
    reason in the trial's ledger row) and collects the ones that ended. Used as a context manager around the
    review; leaving it joins the thread before the graph moves on."""

    def __init__(self, services: Services, trials: list[RunningTrial]) -> None:
        self.services = services
        self.trials = watchable(trials)
        self.interval = max(0.05, services.options.watch_interval_s)
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mart-review-watch", daemon=True)

    def __enter__(self) -> "WatchDuringReview":
        if self.trials:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._quit.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            follow_in_flight(self.services, self.trials, interval=self.interval, quit=self._quit)
        except Exception as e:  # noqa: BLE001 - the review goes on; the graph's own watch follows the trials later
            logging.getLogger(__name__).warning("watching trials during the review failed (%s: %s)",
                                                type(e).__name__, e)


def watchable(trials: list[RunningTrial]) -> list[RunningTrial]:
    """The trials in flight a watch outside the graph follows: launched, not ended, not already being stopped."""
    return [rt for rt in trials if rt.state in ALIVE]


def follow_in_flight(services: Services, trials: list[RunningTrial], *, interval: float, quit: threading.Event,
                     keep_going: Callable[[], bool] = lambda: True,
                     told: Callable[[str, str], None] | None = None) -> dict[str, str]:
    """The watch while no graph node watches (a review waits, in this process or with none alive): each pass reads
    the trials' new steps into the ledger and runs the health monitor on them; a sick trial's ledger row gets its
    ``health:`` reason (before the stop: a crash leaves the why), then it is stopped. The graph's next
    ``watch_trial`` routes such a trial to its stop and collect nodes and collects the ones that ended.

    Runs until every trial ended or was stopped, ``quit`` is set, or ``keep_going()`` says the run moved on (a
    driver took it over). Returns what became of each trial it saw end: ``"ended"`` or the stop's reason;
    ``told(trial_id, that)`` hears each at once. Its own ledger connection, so it may run on a thread."""
    ledger = Ledger.open(services.store.run_dir)
    side, runner = _Side(services, ledger), services.runner
    outcome: dict[str, str] = {}
    try:
        tails = {rt.record.trial_id: runner.metrics(rt.handle) for rt in trials}
        known = {rt.record.trial_id: {r.step for r in ledger.metric_records(rt.record.trial_id)} for rt in trials}
        left = list(trials)
        while left and not quit.wait(interval) and keep_going():
            for rt in list(left):
                tid = rt.record.trial_id
                records = tails[tid].read_new()
                fresh = [r for r in records if r.step not in known[tid]]
                if records:
                    ledger.add_metrics(tid, records)
                known[tid].update(r.step for r in fresh)
                if runner.poll(rt.handle).status.is_finished():
                    left.remove(rt)  # ended by itself: the graph collects it
                    outcome[tid] = "ended"
                elif (reason := assess(side, rt.record) if fresh else None):
                    ledger.set_trial_fields(tid, reason=reason)  # before the stop: a crash leaves the why
                    runner.stop(rt.handle, reason=reason)
                    left.remove(rt)
                    outcome[tid] = reason
                else:
                    continue
                if told is not None:
                    told(tid, outcome[tid])
    finally:
        ledger.close()
    return outcome
