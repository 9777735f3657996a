"""Runs each local trial as its own OS process (own process group), watched through a serialisable handle.

Ownership: the process belongs to the trial. ``launch`` starts it and returns; ``poll`` and ``stop``
work on any ``TrialHandle`` (also one made by another, perhaps crashed, tuner process). Launching,
liveness (pid + create time) and stopping are ``mart.trial_runner.process.ProcessGroup``'s. Children
this runner started are reaped here, so they never linger as zombies.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
from pathlib import Path

from mart.state.files import disk_full, open_in, write_atomic
from mart.state.models import TrialStatus
from mart.state.trials import (
    DISK_FULL_MARK,
    LOG_FILE,
    METRICS_FILE,
    STATUS_FILE,
    TrialHandle,
    TrialPoll,
    TrialSpec,
)
from mart.trial_runner.base import (
    TrialRunner,
    ended_on_full_disk,
    finished_launch,
    read_status,
    stage_config,
    trial_env,
    write_status,
)
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.process import (
    LAUNCH_TOKEN_ENV,
    SAFE_PATH_ENV,
    ProcessGroup,
    find_launched,
    python_command,
)
from mart.trial_runner.verl import logs as _verl_logs

CONFIG_FILE = "config.json"


class LocalRunner(TrialRunner):
    """Launches ``python -m mart.trial_runner.local`` per trial.

    Args:
        memory_capacity_gb: emulated device memory for trials whose spec sets none (None = no limit).
        python: the interpreter to run the worker with.
    """

    leader_modules = ("mart.trial_runner.local",)

    # the worker prints verl's console format, so a Ray job of it reads like a verl job
    parse_log_line = staticmethod(_verl_logs.parse_console_line)
    classify_exit = staticmethod(_verl_logs.classify_exit)

    name = "local"

    def __init__(self, memory_capacity_gb: float | None = None, python: str = sys.executable) -> None:
        self.memory_capacity_gb = memory_capacity_gb
        self.python = python
        self._groups: dict[int, ProcessGroup] = {}  # trials launched here, not yet reaped
        self._exit_codes: dict[int, int] = {}  # pid -> exit code of children reaped here
        self._tails: dict[str, tuple[MetricsTail, int | None]] = {}  # trial dir -> (tail, last step)

    # --- launching -------------------------------------------------------------------------------------
    def write_config(self, spec: TrialSpec) -> Path:
        """Create the trial dir and write ``config.json`` (the full flat config, steps and seed included)."""
        trial_dir = Path(spec.trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        config = stage_config(spec)
        config["trainer.total_training_steps"] = spec.steps
        config["seed"] = spec.seed
        return write_atomic(trial_dir, CONFIG_FILE, json.dumps(config, indent=1, sort_keys=True))

    def build_command(self, spec: TrialSpec) -> list[str]:
        """The worker's argv (the Ray runner reuses it); ``config.json`` is expected in the trial dir."""
        argv = [*python_command(self.python), "-m", "mart.trial_runner.local", "--out", str(spec.trial_dir), "--steps", str(spec.steps),
                "--config", str(Path(spec.trial_dir) / CONFIG_FILE), "--seed", str(spec.seed)]
        capacity = spec.memory_capacity_gb if spec.memory_capacity_gb is not None else self.memory_capacity_gb
        if capacity is not None:
            argv += ["--memory-capacity-gb", repr(float(capacity))]
        if spec.save_steps:
            argv += ["--save-steps", ",".join(str(s) for s in sorted(set(spec.save_steps)))]
        if spec.init_from is not None:
            argv += ["--init-from", spec.init_from.path]
        return argv

    def build_env(self, spec: TrialSpec) -> dict[str, str]:
        """Environment additions of the worker (the Ray runner reuses them).

        ``PYTHONSAFEPATH``: ``python -m`` would put the current directory first on the path, so a stray
        ``numpy.py`` there would run inside the trial (Python 3.11+; older versions ignore it)."""
        return {"PYTHONUNBUFFERED": "1", **SAFE_PATH_ENV}

    def launch(self, spec: TrialSpec) -> TrialHandle:
        self._reap()
        self.write_config(spec)
        trial_dir = Path(spec.trial_dir)
        for stale in (STATUS_FILE, METRICS_FILE, DISK_FULL_MARK):  # a fresh trial: nothing left from an earlier one
            (trial_dir / stale).unlink(missing_ok=True)
        self._tails.pop(str(trial_dir), None)
        env = trial_env({**self.build_env(spec), LAUNCH_TOKEN_ENV: spec.launch_token or secrets.token_hex(8)})
        with open_in(trial_dir, LOG_FILE, "wb") as log:
            group = ProcessGroup.spawn(self.build_command(spec), env=env, output=log)
        self._groups[group.pid] = group
        return TrialHandle(trial_id=spec.trial_id, backend=self.name, trial_dir=str(trial_dir), pid=group.pid,
                           pid_create_time=group.created)

    def adopt(self, spec: TrialSpec) -> TrialHandle | None:
        """The trainer an earlier tuner started for ``spec`` (found by its launch token), if it runs."""
        if not spec.launch_token or not (Path(spec.trial_dir) / LOG_FILE).exists():
            return None  # the launch never got as far as opening the trial's log: nothing was started
        group = find_launched(spec.launch_token)
        if group is not None:
            pid, created = group.pid, group.created
        elif (ended := finished_launch(spec.trial_dir, spec.launch_token)) is not None:
            pid, created = ended  # it ran to its end while no tuner watched: adopt the ending, do not run it again
        else:
            return None
        return TrialHandle(trial_id=spec.trial_id, backend=self.name, trial_dir=str(spec.trial_dir), pid=pid,
                           pid_create_time=created, extra={"adopted": True})

    # --- watching --------------------------------------------------------------------------------------
    def _reap(self) -> None:
        for pid, group in list(self._groups.items()):
            if group.returncode is not None:
                del self._groups[pid]
                self._exit_codes[pid] = group.returncode

    def _group(self, handle: TrialHandle) -> ProcessGroup | None:
        """The trial's process group: the one launched here (reaps it), else attached through the handle."""
        if handle.pid is None:
            return None
        return self._groups.get(handle.pid) or self.attach(handle)

    def _alive(self, handle: TrialHandle) -> bool:
        group = self._group(handle)
        alive = group is not None and group.leader_alive()
        self._reap()
        return alive

    def _ended_without_status(self, handle: TrialHandle) -> TrialPoll:
        code = self._exit_codes.get(handle.pid) if handle.pid is not None else None
        full = disk_full(handle.trial_dir)  # the worker could not even write its status: say why
        if full:
            reason = f"{full}: the trial could not write its results (free space, then `mart resume`)"
        elif ended_on_full_disk(handle.trial_dir):  # the disk was full when it ended; space was freed since
            reason = (f"the disk holding {handle.trial_dir} was full when the trial ended: it could not write its "
                      "results")
        elif code is None:
            reason = "the trial process ended without writing a status (killed?)"
        elif code < 0:
            reason = f"killed by {signal.Signals(-code).name} without writing a status"
        else:
            reason = f"exited with code {code} without a status"
        return TrialPoll(status=TrialStatus.FAILED, reason=reason, last_step=_last_step(handle.trial_dir))

    def _running_step(self, handle: TrialHandle) -> int | None:
        tail, last = self._tails.get(handle.trial_dir) or (MetricsTail(Path(handle.trial_dir) / METRICS_FILE), None)
        for rec in tail.read_new():
            last = rec.step if last is None else max(last, rec.step)
        self._tails[handle.trial_dir] = (tail, last)
        return last

    def poll(self, handle: TrialHandle) -> TrialPoll:
        if self._alive(handle):
            return TrialPoll(status=TrialStatus.RUNNING, last_step=self._running_step(handle))
        status = read_status(handle.trial_dir)
        return status if status is not None else self._ended_without_status(handle)

    def stop(self, handle: TrialHandle, reason: str = "stopped by mart", grace_s: float = 5.0) -> TrialPoll:
        group = self._group(handle)
        if group is not None:
            group.terminate(grace_s)
        self._reap()
        status = read_status(handle.trial_dir)
        if status is None or status.status is TrialStatus.STOPPED:
            last = status.last_step if status is not None and status.last_step is not None else _last_step(handle.trial_dir)
            write_status(handle.trial_dir, TrialStatus.STOPPED, reason, last or 0)
        return read_status(handle.trial_dir) or TrialPoll(status=TrialStatus.STOPPED, reason=reason)


def _last_step(trial_dir: str) -> int | None:
    records = MetricsTail(Path(trial_dir) / METRICS_FILE).read_new()
    return max((r.step for r in records), default=None)
