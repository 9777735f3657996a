"""The plugin: a ``Backend`` (search space + base config + runner) for the toy job in ``job.py``.

``make_backend(**options)`` is the factory mart calls for ``--backend examples.plugin_backend.backend:make_backend``;
it receives the session's backend options (unknown ones must be accepted and may be ignored).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from mart.trial_runner import (
    LAUNCH_TOKEN_ENV,
    LOG_FILE,
    Backend,
    Constraint,
    ParamSpec,
    ProcessGroup,
    SearchSpace,
    TrialHandle,
    TrialPoll,
    TrialRunner,
    TrialSpec,
    TrialStatus,
    read_status,
    write_status,
)

JOB = Path(__file__).with_name("job.py")
WORKERS, BATCH, LR = "job.workers", "job.batch_size", "job.lr"

SPACE = SearchSpace(
    backend="toy-job",
    params=[
        ParamSpec(WORKERS, "system", "int", 2, "Data-loader workers of the toy job.", low=1, high=16),
        ParamSpec(BATCH, "system", "int", 8, "Batch size: faster, more memory.", low=1, high=256),
        ParamSpec(LR, "learning", "log", 1e-3, "Learning rate of the toy job.", low=1e-4, high=1e-1),
    ],
    constraints=[
        Constraint("batch_multiple_of_workers", "job.batch_size must be a multiple of job.workers.",
                   lambda c: None if int(c[BATCH]) % int(c[WORKERS]) == 0
                   else f"job.batch_size ({c[BATCH]}) is not a multiple of job.workers ({c[WORKERS]})."),
    ],
)


class ToyJobRunner(TrialRunner):
    """Launches ``job.py`` as its own process group; the trial directory is the only shared state."""

    name = "toy-job"

    def __init__(self, capacity_gb: float, step_s: float) -> None:
        self.capacity_gb, self.step_s = capacity_gb, step_s
        self._groups: dict[int, ProcessGroup] = {}

    def launch(self, spec: TrialSpec) -> TrialHandle:
        trial_dir = Path(spec.trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "config.json").write_text(json.dumps(spec.config))
        with open(trial_dir / LOG_FILE, "ab") as log:
            # its own process group: a Ctrl-C of the tuner does not reach it, stop() reaches all of it
            group = ProcessGroup.spawn(
                [sys.executable, str(JOB), "--config", str(trial_dir / "config.json"), "--steps", str(spec.steps),
                 "--out", str(trial_dir), "--capacity-gb", str(spec.memory_capacity_gb or self.capacity_gb),
                 "--step-s", str(self.step_s)],
                # the launch token: what lets a resumed tuner prove it started this process before it signals it
                env={**os.environ, "PYTHONUNBUFFERED": "1", LAUNCH_TOKEN_ENV: spec.launch_token or secrets.token_hex(8)},
                output=log)
        self._groups[group.pid] = group  # reaped here; other runners attach through the handle
        return TrialHandle(trial_id=spec.trial_id, backend=self.name, trial_dir=str(trial_dir), pid=group.pid,
                           pid_create_time=group.created)

    def _group(self, handle: TrialHandle) -> ProcessGroup | None:
        if handle.pid is None:
            return None
        # a handle from another process (a resumed tuner): attached only if its process proves mart launched it
        return self._groups.get(handle.pid) or self.attach(handle)

    def poll(self, handle: TrialHandle) -> TrialPoll:
        done = read_status(handle.trial_dir)
        if done is not None:
            return done
        group = self._group(handle)
        if group is not None and not group.leader_alive():
            done = read_status(handle.trial_dir)  # it may have written its status just before exiting
            if done is not None:
                return done
            write_status(handle.trial_dir, TrialStatus.FAILED, "job exited without a status", 0)
            return read_status(handle.trial_dir)  # type: ignore[return-value]
        return TrialPoll(status=TrialStatus.RUNNING)

    def stop(self, handle: TrialHandle, reason: str = "stopped by mart", grace_s: float = 5.0) -> TrialPoll:
        group = self._group(handle)
        if group is not None:
            group.terminate(grace_s)  # SIGTERM (the job writes status "stopped"), grace, SIGKILL
        done = read_status(handle.trial_dir)
        if done is None or done.status is not TrialStatus.STOPPED:
            last = done.last_step if done else 0
            write_status(handle.trial_dir, TrialStatus.STOPPED, reason, last or 0)
        return read_status(handle.trial_dir)  # type: ignore[return-value]


class ToyJobBackend(Backend):
    name = "toy-job"
    score_metric_prefix = "val-core/"

    def __init__(self, capacity_gb: float = 8.0, step_s: float = 0.02) -> None:
        self.capacity_gb, self.step_s = capacity_gb, step_s

    def search_space(self) -> SearchSpace:
        return SPACE

    def base_config(self) -> dict[str, Any]:
        return SPACE.defaults()

    def memory_capacity_gb(self) -> float | None:
        return self.capacity_gb

    def make_runner(self) -> ToyJobRunner:
        return ToyJobRunner(self.capacity_gb, self.step_s)


def make_backend(capacity_gb: float = 8.0, step_s: float = 0.02,
                 memory_capacity_gb: float | None = None) -> ToyJobBackend:
    """Factory mart calls with the session's backend options; its parameters are the options it accepts."""
    return ToyJobBackend(capacity_gb=memory_capacity_gb or capacity_gb, step_s=float(step_s))
