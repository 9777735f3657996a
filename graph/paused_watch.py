"""``mart watch RUN``: the health monitor on a run's trials in flight while no tuner drives it.

A run paused at a review with no process alive (``--approve none``, Slack, Studio; or a tuner that was killed)
leaves its trials in flight running on their own: a local trainer, a verl attempt, a Ray job. Nothing stops
one that turns sick until the run continues. This watch follows them as the terminal review does
(``mart.tools.watch.follow_in_flight``): their steps into the ledger, the health monitor (the memory margin among
its rules) on each pass, a sick trial stopped with a ``health:`` reason that the graph collects when the run
continues. It never drives the graph and takes no writer lock, so answering the review is never refused: it ends
by itself as soon as a driver holds the run or the graph has moved on, once every trial it follows has ended, or
on Ctrl-C (the trials run on). One watch per run (``watch.lock``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from mart.graph.run_status import checkpoint_fingerprint, review_request, state_snapshot
from mart.graph.services import build_services
from mart.state.graph_state import running_trials
from mart.state.options import WATCH_INTERVAL_S
from mart.state.run_store import WATCH_LOCK, RunError, RunStore
from mart.tools.watch import follow_in_flight, watchable


def watch_paused(run: str | Path, runs_dir: str | Path = "runs", *, interval_s: float = WATCH_INTERVAL_S,
                 allowed: Collection[str] = (), trust: bool = False,
                 told: Callable[[str, str], None] | None = None,
                 started: Callable[[dict[str, Any]], None] | None = None,
                 quit: threading.Event | None = None) -> dict[str, Any]:
    """Watch the run's trials in flight until they end, a driver takes the run over, or ``quit`` is set.

    Args:
        allowed, trust: which code named by the run's stored options may run (``session.load_options``): the
            watch polls and stops trials through the run's backend.
        told: hears each trial's end as it comes (``trial_id``, ``"ended"`` or the stop's reason).
        started: hears what is watched before the first pass (``run_id``, ``review_no``, ``trials``).

    Returns:
        ``{"run_id", "review_no", "watched": [ids], "outcome": {id: "ended" | reason}, "checkpoint", "why"}``
        (``checkpoint``: the graph's, which the watch saw unchanged throughout), ``why`` one of
        ``"no trial in flight"``, ``"every trial ended"``, ``"the run moved on"``, ``"stopped"``.

    Raises:
        RunError: no such run, a driver holds it (its tuner watches the trials), another watch runs, or its
            options name code that is not allowed.
    """
    from mart.graph.session import check_graph_version, load_options

    store = RunStore.open(run, runs_dir)
    try:
        with store.lock(WATCH_LOCK):
            holder = store.lock_holder()
            if holder:
                raise RunError(f"run {store.run_id} is being driven (pid {holder}): its tuner watches its trials")
            options = load_options(store, allowed=allowed, trust=trust)
            snap = state_snapshot(store)
            check_graph_version(store, snap)
            request = review_request(snap) if snap.interrupts else None
            services = build_services(options, store)
            try:
                # in flight: the ledger says running (no driver collected it) and the trial itself has not ended
                trials = [rt for rt in watchable(running_trials(snap.values or {}))
                          if (store.ledger.trial(rt.record.trial_id) or {}).get("status") == "running"
                          and not services.runner.poll(rt.handle).status.is_finished()]
                out: dict[str, Any] = {"run_id": store.run_id, "review_no": (request or {}).get("review_no"),
                                       "watched": [rt.record.trial_id for rt in trials], "outcome": {},
                                       "checkpoint": checkpoint_fingerprint(store)}
                if not trials:
                    return {**out, "why": "no trial in flight"}
                if started is not None:
                    started(out)
                mark = out["checkpoint"]
                moved = threading.Event()

                def still_paused() -> bool:  # a driver took the run, or the graph moved (answered elsewhere)
                    if store.lock_holder() is not None or checkpoint_fingerprint(store) != mark:
                        moved.set()
                    return not moved.is_set()

                quit = quit or threading.Event()
                out["outcome"] = follow_in_flight(services, trials, interval=interval_s, quit=quit,
                                                  keep_going=still_paused, told=told)
            finally:
                services.close()
            why = ("the run moved on" if moved.is_set()
                   else "every trial ended" if len(out["outcome"]) == len(trials) else "stopped")
            return {**out, "why": why}
    finally:
        store.close()
