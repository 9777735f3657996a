"""The trial-runner interface every backend implements, and the on-disk trial contract.

Ownership of a running trial: the process (or Ray job) belongs to the trial, not to the tuner. A runner
only *launches* it and afterwards talks to it through a serialisable ``TrialHandle`` (pid + start time,
or job id). A tuner that crashed and resumed builds a new runner and re-attaches with the same handle:
``poll`` and ``stop`` must work on a handle made by another process. ``launch`` is not idempotent by
itself; the caller (``mart.tools.trials``) records the handle in the ledger before waiting on it.

Trial directory contract (all backends write or mirror it):
    <trial_dir>/metrics.jsonl   verl's file-logger format: one ``{"step": N, "data": {...}}`` per line,
                                NaN/inf as null, lines written whole.
    <trial_dir>/status.json     written once at the end: {"status": completed|oom|failed|stopped,
                                "reason": str|null, "last_step": int}
    <trial_dir>/trial.log       stdout/stderr of the job.
"""

from __future__ import annotations

import abc
import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

from mart.state.files import disk_full, open_in, write_atomic
from mart.state.job import JobDescription
from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.search_space import SearchSpace
from mart.state.stages import measures_throughput
from mart.state.text import one_line
from mart.state.trials import (
    DISK_FULL_MARK,
    HANDLE_REFUSED,
    METRICS_FILE,
    STATUS_FILE,
    TrialHandle,
    TrialPoll,
    TrialSpec,
)
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.process import ProcessGroup, unproven_launch

log = logging.getLogger(__name__)

class TrialRunner(abc.ABC):
    """Launches trials and follows them through handles. Implementations: local, verl, ray, sim."""

    name: str = "base"
    #: True when ``poll`` itself stops a trial that makes no progress (``mart.trial_runner.watchdog``); otherwise
    #: the tuner's watch loop applies the same rule
    watches_progress: bool = False

    @abc.abstractmethod
    def launch(self, spec: TrialSpec) -> TrialHandle:
        """Start the trial and return at once (do not wait for it to finish)."""

    @abc.abstractmethod
    def poll(self, handle: TrialHandle) -> TrialPoll:
        """Non-blocking: RUNNING, or the final status once the trial has ended."""

    @abc.abstractmethod
    def stop(self, handle: TrialHandle, reason: str = "stopped by mart", grace_s: float = 5.0) -> TrialPoll:
        """Stop the trial (SIGTERM, grace, SIGKILL or the backend's equivalent) and return its final status."""

    def adopt(self, spec: TrialSpec) -> TrialHandle | None:
        """The trial ``spec`` describes, if an earlier tuner launched it (``spec.launch_token``) but died before it
        saved the handle; None when it never started (the caller launches it then). Default: None, for runners
        whose ``launch`` finds an existing trial itself (Ray jobs) or starts no process (the simulator)."""
        return None

    #: the modules a trial's group leader runs (``python -m MODULE``): mart's supervisor or worker. A stored handle
    #: is re-attached only when its live leader runs one of them (empty: a plugin's runner, whose command is its
    #: own; the launch token in the leader's environment is then the proof)
    leader_modules: tuple[str, ...] = ()

    def unproven(self, handle: TrialHandle, launch_token: str | None, launched_at: float | None) -> str | None:
        """Why this runner cannot prove it launched the process ``handle`` names (None: it can, or nothing of it
        runs any more). A handle read back from a ledger is untrusted input: re-attached unproven, the watchdog
        would signal whatever process group it names. Handles without a pid (a Ray job) have nothing to prove."""
        if handle.pid is None:
            return None
        return unproven_launch(handle.pid, handle.pid_create_time, launch_token, launched_at, self.leader_modules)

    def attach(self, handle: TrialHandle) -> ProcessGroup | None:
        """The process group ``handle`` names, for a trial this runner did not launch itself (a resumed tuner's), or
        None when its processes do not prove that a mart launch started them (``unproven``, any launch token): a
        handle read back from a run folder (a ledger row, a checkpoint) could name any process, and this runner
        signals what it attaches. Checked at every call: a pid is re-checked once its process has ended."""
        if handle.pid is None:
            return None
        why = unproven_launch(handle.pid, handle.pid_create_time, None, None, self.leader_modules)
        if why is not None:
            refused = self.__dict__.setdefault("_refused", set())
            if handle.pid not in refused:  # once per pid, not at every poll
                refused.add(handle.pid)
                log.warning("trial %s: %s: %s", one_line(handle.trial_id), HANDLE_REFUSED, one_line(why))
            return None
        return ProcessGroup(handle.pid, handle.pid_create_time)

    def metrics(self, handle: TrialHandle) -> MetricsTail:
        """A tail reader over the trial's metric stream (complete lines only)."""
        return MetricsTail(Path(handle.trial_dir) / METRICS_FILE)

    def read_all_metrics(self, handle: TrialHandle) -> list[StepRecord]:
        return self.metrics(handle).read_new()

    def close(self) -> None:
        """Release client resources (connections); running trials are left alone."""


class Backend(abc.ABC):
    """A backend plugin: a trial runner plus the search-space catalogue and config rules of its jobs.

    ``--backend package.module:factory`` loads any callable returning a ``Backend``.
    """

    name: str = "base"
    #: the metric a stage-2 objective reads (a validation score key or prefix)
    score_metric_prefix: str = "val-core/"

    @abc.abstractmethod
    def search_space(self) -> SearchSpace: ...

    @abc.abstractmethod
    def base_config(self) -> dict[str, Any]:
        """The full flat baseline config (the backend's/user's defaults) candidates are applied to."""

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """Errors of a full config (empty = valid). Default: the search space's constraints."""
        return self.search_space().check_constraints(config)

    @abc.abstractmethod
    def make_runner(self) -> TrialRunner: ...

    def memory_capacity_gb(self) -> float | None:
        """Memory per device the margin rule is computed against (GPU memory, or the emulated capacity)."""
        return None

    def max_parallel_trials(self) -> int | None:
        """How many trials this backend runs at once without them slowing each other down (None = no known
        limit). ``mart tune --parallel N`` uses at most this many slots and says so; the rest of the budget
        waits for a free slot. A cluster backend counts its nodes against one trial's own resources (the Ray
        backends: ``mart.trial_runner.ray.cluster``). A trial launched into a slot may still wait for its resources
        (another user holds them): its runner then polls it ``RUNNING`` with ``TrialPoll.queued`` set."""
        return None

    def trial_devices(self, slot: int) -> str | None:
        """The accelerators a trial in ``slot`` (0 .. slots-1) may use when trials share this machine's devices, as
        ``CUDA_VISIBLE_DEVICES`` (the runner puts it in the trial's environment); None: every device, or not
        applicable (a cluster places its jobs itself)."""
        return None

    def parallel_limit_reason(self) -> str:
        """Why ``max_parallel_trials`` is what it is, for the user (e.g. "16 GPUs on 2 node(s), 8 per trial")."""
        return "the backend's limit"

    def missing_requirement(self) -> str | None:
        """What must be installed before a trial can start (e.g. the trainer's package), or None. Checked before a
        run or a trial directory exists, so a missing package is said at once instead of as a crashed trial."""
        return None

    def describe_job(self) -> JobDescription | None:
        """The job's model shape, hardware, cluster shape and workload, for the agents' performance model.

        Default: unknown (``None``); the agents then work from the measured profile alone.
        """
        return None


def write_status(trial_dir: str | os.PathLike, status: TrialStatus | str, reason: str | None, last_step: int,
                 launch: dict | None = None) -> None:
    """Write status.json atomically (a new file renamed into place: a reader never sees half of it, and a
    link planted there is replaced, not followed). ``launch``: the trial process's own launch token, pid and
    create time, written by the trial itself (see :func:`finished_launch`)."""
    value = status.value if isinstance(status, TrialStatus) else str(status)
    write_atomic(trial_dir, STATUS_FILE, json.dumps({"status": value, "reason": reason, "last_step": last_step,
                                                     **({"launch": launch} if launch else {})}))


def write_final_status(trial_dir: str | os.PathLike, status: TrialStatus | str, reason: str | None, last_step: int,
                       launch: dict | None = None) -> None:
    """``write_status`` at a trial's end; on a full disk (no room for the status), an empty ``DISK_FULL_MARK``
    instead, so that the cause outlives the freed space (``ended_on_full_disk``)."""
    try:
        write_status(trial_dir, status, reason, last_step, launch=launch)
    except OSError as e:
        if e.errno != errno.ENOSPC and not disk_full(trial_dir):
            raise
        with open_in(trial_dir, DISK_FULL_MARK, "wb"):
            pass


def ended_on_full_disk(trial_dir: str | os.PathLike) -> bool:
    """Did the trial end unable to write its status on a full disk (it left ``DISK_FULL_MARK``)?"""
    return (Path(trial_dir) / DISK_FULL_MARK).is_file()


def finished_launch(trial_dir: str | os.PathLike, token: str, record: str = STATUS_FILE
                    ) -> tuple[int, float | None] | None:
    """(pid, create time) of the trial process that the launch with ``token`` started, if it has already ended
    and written its status: a tuner killed inside the launch window, resumed after the trial finished, adopts
    that ending instead of running the trial a second time. A status from another launch (its token differs)
    is not this launch's. ``record``: the file (in ``trial_dir``) the trial's process wrote when it ended, with
    ``process.launch_record()`` under ``"launch"``: a local trial's status.json, a verl attempt's exit.json."""
    try:
        launch = json.loads((Path(trial_dir) / record).read_text()).get("launch") or {}
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(launch, dict) or launch.get("token") != token or not isinstance(launch.get("pid"), int):
        return None
    created = launch.get("created")
    return launch["pid"], float(created) if isinstance(created, (int, float)) else None


def read_status(trial_dir: str | os.PathLike) -> TrialPoll | None:
    path = Path(trial_dir) / STATUS_FILE
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return TrialPoll(status=TrialStatus(data["status"]), reason=data.get("reason"), last_step=data.get("last_step"))


#: verl's keys that turn a trial's validations off. A throughput trial (a stage whose objective is throughput) runs
#: training steps only on every backend: verl's runner writes these into its command line, and the simulator and
#: the embedded trainer, which read verl's keys, get them through ``stage_config``
NO_VALIDATION: dict[str, Any] = {"trainer.test_freq": -1, "trainer.val_before_train": False}


def stage_config(spec: TrialSpec) -> dict[str, Any]:
    """``spec.config`` as the trial runs it: a stage-1 trial without validation (a learning or standalone trial
    keeps its config's schedule: the trainers validate at every ``test_freq`` step and at the last one)."""
    return {**spec.config, **NO_VALIDATION} if measures_throughput(spec.stage) else dict(spec.config)


# mart's own secrets, which no trial needs: the LLM agents' key, the Slack app's tokens, the Ray
# cluster's token (mart submits the jobs; the job itself never talks to the dashboard). Secrets a
# training job does need (HF_TOKEN to download a model, WANDB_API_KEY to log) are left alone.
TRIAL_ENV_DROP = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
TRIAL_ENV_DROP_PREFIXES = ("SLACK_", "MART_SLACK_", "MART_LLM_")


def trial_env(additions: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial process: this process's (or ``base``), without mart's secrets, plus ``additions``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in TRIAL_ENV_DROP and not k.startswith(TRIAL_ENV_DROP_PREFIXES)}
    env.update(additions or {})
    return env
