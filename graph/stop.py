"""What runs on after a tuner stops, and ``mart stop``: a run's trials in flight, found, proven and stopped.

A trial's processes belong to the trial (``mart.trial_runner.process``): a Ctrl-C or a SIGTERM stops the tuner and
leaves them running, and ``mart resume`` re-attaches them. This module says which ones run on (pid, folder) when a
tuner stops, and stops them on a second Ctrl-C or ``mart stop RUN``.

A run folder is untrusted input, so its ledger's handle proves nothing: a process group is signalled only when one of
its live processes carries the trial's launch token (``MART_LAUNCH_TOKEN``, put in the trial's environment by the
runner that started it, recorded in the ledger row before the launch). A pid that names any other process is left
alone and the refusal says so.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mart.state.run_store import RunStore

#: how long a tuner stopped by Ctrl-C waits for a second Ctrl-C (which stops its trials too) before it exits
SECOND_INTERRUPT_S = 10.0


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached a tuner: it stops as on Ctrl-C (the run is saved), and says so."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class InFlight:
    """A trial the ledger has running, with what its row names (foreign data until proven)."""

    trial_id: str
    folder: str
    pid: int | None
    created: float | None
    token: str | None
    job_id: str | None


def in_flight(store: RunStore) -> list[InFlight]:
    """The run's trials the ledger has running and launched (a handle recorded)."""
    out = []
    for row in store.ledger.trials():
        handle = row.get("handle")
        if row.get("status") != "running" or not isinstance(handle, dict):
            continue
        pid = handle.get("pid")
        created = handle.get("pid_create_time")
        out.append(InFlight(trial_id=str(row["trial_id"]), folder=str(row.get("trial_dir") or handle.get("trial_dir")),
                            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
                            created=float(created) if isinstance(created, (int, float)) else None,
                            token=row.get("launch_token") if isinstance(row.get("launch_token"), str) else None,
                            job_id=handle.get("job_id") if isinstance(handle.get("job_id"), str) else None))
    return out


def proven_group(trial: InFlight) -> tuple[Any, str]:
    """(the trial's ``ProcessGroup``, "") when mart can prove it started it, else (None, why not).

    Proof (``unproven_launch``): the group is alive and its leader carries the trial's launch token in its
    environment (readable only for processes of this user), or every process left in it does. The pid and create
    time alone come from a file anyone who can write the run folder could have edited."""
    from mart.trial_runner.process import ProcessGroup, unproven_launch

    if trial.pid is None:
        return None, ("a Ray job: stop it with `ray job stop " + trial.job_id + "`" if trial.job_id
                      else "no process recorded (a simulated trial runs only while the tuner does)")
    group = ProcessGroup(trial.pid, trial.created)
    if not group.alive():
        return None, "ended"
    if not trial.token:
        return None, f"pid {trial.pid}: no launch token recorded, so mart cannot prove it started it; left alone"
    # one proof for every path that signals a stored handle (the launch step's re-attach, verl's launch.json,
    # this): the token in the leader's environment, or in every process left when the leader is gone
    why = unproven_launch(trial.pid, trial.created, trial.token)
    if why:
        return None, f"{why}; left alone"
    return group, ""


def running_on(store: RunStore) -> list[tuple[InFlight, bool]]:
    """Each trial in flight and whether a process of it still runs (no proof needed to say so)."""
    from mart.trial_runner.process import ProcessGroup

    return [(t, t.pid is not None and ProcessGroup(t.pid, t.created).alive()) for t in in_flight(store)]


def stop_trials(store: RunStore, grace_s: float = 5.0) -> list[tuple[str, str]]:
    """Stop every trial of the run that mart can prove it started (SIGTERM to its group, ``grace_s``, SIGKILL); each
    trial in flight with what happened to it. The ledger is not written: the next ``mart resume`` reads each trial's
    end from its folder, as after any trial that ended while no tuner watched."""
    done = []
    for trial in in_flight(store):
        group, why = proven_group(trial)
        if group is None:
            done.append((trial.trial_id, why))
            continue
        gone = group.terminate(grace_s)
        done.append((trial.trial_id, f"stopped (pid {trial.pid})" if gone else f"pid {trial.pid} still runs after "
                     "SIGKILL"))
    return done


def stop_run(run: str, runs_dir: str | Path, grace_s: float = 5.0) -> tuple[RunStore, list[tuple[str, str]]]:
    """``mart stop``: under the run's writer lock (a tuner driving it refuses: ``RunLocked``), stop its trials."""
    store = RunStore.open(run, runs_dir, readonly=True)  # nothing in the ledger is written
    try:
        with store.lock():
            return store, stop_trials(store, grace_s)
    finally:
        store.close()


def describe(trials: list[tuple[InFlight, bool]]) -> str:
    """``ID (pid P, FOLDER)`` of each trial whose process runs on."""
    return ", ".join(f"{t.trial_id} (pid {t.pid}, {t.folder})" for t, alive in trials if alive)


class Interrupts:
    """The signals that end a CLI command which drives a run: SIGINT raises ``KeyboardInterrupt`` (the tuner stops,
    the run is saved), SIGTERM/SIGHUP raise ``Terminated``; once the command is saying what runs on
    (``stopping``), a later one is only counted, so it can tell a second Ctrl-C (stop the trials too) from none."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None
        self.stopping = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.stopping:
            return
        self.first = self.first or signum
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """The handlers while the block runs (the previous ones after it); none off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def wait_second(self, seconds: float) -> bool:
        """True once a second signal arrived (within ``seconds``)."""
        import time

        deadline = time.monotonic() + seconds
        while self.count < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.count >= 2


def after_interrupt(run: str, runs_dir: str | Path, interrupts: Interrupts, echo: Callable[[str], None],
                    signum: int | None = None, window_s: float = SECOND_INTERRUPT_S) -> int:
    """What a command that drove ``run`` says once a signal stopped it (one line; two when a second Ctrl-C stops
    the trials too), and its exit code (128 + the signal)."""
    from mart.state.run_store import RunError
    from mart.state.text import one_line

    interrupts.stopping = True
    signum = signum or interrupts.first or signal.SIGINT
    code = 128 + signum
    what = "interrupted" if signum == signal.SIGINT else f"{signal.Signals(signum).name} received"
    try:
        store = RunStore.open(run, runs_dir, readonly=True)
    except RunError:
        echo(f"{what}: the tuner stopped before the run was saved")
        return code
    try:
        ref, flying = store.ref, running_on(store)
    finally:
        store.close()
    live = describe(flying)
    if not live:
        echo(one_line(f"{what}: the tuner stopped and run {store.run_id} is saved; no trial runs on: continue with "
                      f"`mart resume {ref}`"))
        return code
    n = sum(alive for _, alive in flying)
    if signum != signal.SIGINT:  # a service manager's stop: no second signal to wait for
        echo(one_line(f"{what}: the tuner stopped; {n} trial(s) run on: {live}; `mart resume {ref}` re-attaches "
                      f"them, `mart stop {ref}` stops them"))
        return code
    echo(one_line(f"{what}: the tuner stopped; {n} trial(s) run on: {live}; `mart resume {ref}` re-attaches them. "
                  f"Ctrl-C again within {window_s:.0f} s stops them too (later: `mart stop {ref}`)"))
    if not interrupts.wait_second(window_s):
        return code
    try:
        _, results = stop_run(run, runs_dir)
    except RunError as e:
        echo(one_line(f"error: the trials were not stopped: {e}"))
        return code
    echo(one_line(f"second Ctrl-C: {'; '.join(f'{t}: {r}' for t, r in results)}; `mart resume {ref}` continues the "
                  "run"))
    return code
