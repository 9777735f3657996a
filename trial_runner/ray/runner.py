"""Run any trial (local workload or verl) as a Ray job on an existing cluster (Ray's Job Submission API).

``RayJobRunner(address, inner)`` wraps a runner that can describe its command: ``inner.build_command(spec)
-> argv`` and optionally ``inner.build_env(spec) -> env additions``, ``inner.launch_cwd(spec)`` and
``inner.prepare(spec)`` (or ``write_config(spec)``: files the command reads, written to the trial dir). It submits
``shlex.join(argv)`` as the job's entrypoint with the env additions in ``runtime_env.env_vars``, follows
the job with ``get_job_status``, and stops it with ``stop_job`` (Ray sends SIGTERM to the job's process
group, then SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``, 3 s by default).

How the metrics reach the tuner (both work; the first is preferred):

* **Shared path** - the trial directory is on a filesystem the job's node also sees (one node, or NFS/
  Lustre mounted at the same path everywhere). The job writes ``<trial_dir>/metrics.jsonl`` itself
  (verl through ``VERL_FILE_LOGGER_PATH``), and ``metrics()`` tails that file.
* **Job logs** - no shared filesystem: ``metrics()`` parses the job's stdout from ``get_job_logs``
  (verl's console lines ``step:N - key:value``, or JSONL records printed by the workload). The runner
  also mirrors the job's log into ``<trial_dir>/trial.log`` on the tuner's machine.

Resources: each trial is one job whose driver reserves ``entrypoint_num_cpus``, ``entrypoint_num_gpus`` and
``entrypoint_resources`` (``submit_job``'s own arguments; the backend sizes them, ``mart.trial_runner.ray.cluster``).
A job Ray holds PENDING until they are free is *queued*: ``poll`` says RUNNING with ``queued`` set, and the
progress watchdog's first-step clock starts only when the job leaves the queue.

A hung job (no new step, see ``trial_runner.verl.runner.WatchdogConfig``) is stopped when the inner runner
has a ``watchdog``. Ownership: the job belongs to the cluster. Handles carry the submission id, so a restarted tuner
re-attaches; ``launch`` itself re-attaches to a live job of the same trial instead of submitting twice
(submission ids are ``mart-<trial_id>-<hash of the trial dir>-<n>``). Authentication: Ray 2.60 clusters started with ``ray start
--head`` require a token; it is read from ``token=``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token`` and sent as a bearer header.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mart.state.files import write_atomic
from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.trials import LOG_FILE, METRICS_FILE, TrialHandle, TrialPoll, TrialSpec
from mart.trial_runner.base import TrialRunner, read_status, write_status
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.ray.address import find_token, normalize_address

_ID_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

#: what a PENDING job waits for (Ray's own message says: resources, or its runtime environment)
QUEUED_REASON = "waiting for cluster resources"


#: how long a submission is retried while the head has no job agent yet (Ray's own wait is 10 s)
SUBMIT_RETRY_S = 60.0
_NO_AGENT = "No available agent to submit job"


def submit_with_retry(client: Any, *, submission_id: str, retry_s: float = SUBMIT_RETRY_S, **kwargs: Any) -> str:
    """``client.submit_job`` that rides out a head whose job agent is not up yet (just started, or busy): Ray
    answers HTTP 500 "No available agent to submit job, please try again later" before it creates the job, so the
    submission is made again (after checking that the id is still unknown) until ``retry_s`` has passed."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return client.submit_job(submission_id=submission_id, **kwargs)
        except RuntimeError as e:
            if _NO_AGENT not in str(e) or time.monotonic() > deadline:
                raise
        time.sleep(2.0)
        try:
            client.get_job_status(submission_id)
            return submission_id  # the earlier request did create it after all
        except RuntimeError:
            pass


class LogMetricsTail:
    """Metric records parsed from a Ray job's logs (console or JSONL lines); each step returned once.

    The job API returns the whole log on every call, so fetches are rate-limited (``min_interval_s``) and
    only the part after what was already parsed is read.
    """

    def __init__(self, fetch_logs, min_interval_s: float = 0.0, *,
                 parse_line: Callable[[str], StepRecord | None]) -> None:
        self._fetch = fetch_logs
        self._parse = parse_line
        self.min_interval_s = min_interval_s
        self._fetched_at = -math.inf
        self._offset = 0
        self._last_step = -1

    def read_new(self, final: bool = False) -> list[StepRecord]:
        """New records; ``final`` (the job ended) also reads a last line without a newline."""
        now = time.monotonic()
        if now - self._fetched_at < self.min_interval_s:
            return []
        self._fetched_at = now
        try:
            text = self._fetch()
        except Exception:
            return []
        if len(text) < self._offset:  # not the same log any more: start over
            self._offset = 0
        if final and text and not text.endswith("\n"):
            text += "\n"
        end = text.rfind("\n")
        if end < self._offset:
            return []
        chunk, self._offset = text[self._offset: end + 1], end + 1
        out = []
        for line in chunk.split("\n"):
            rec = self._parse(line)
            if rec is not None and rec.step > self._last_step:
                out.append(rec)
                self._last_step = rec.step
        return out


class RayJobRunner(TrialRunner):
    """Trials as Ray jobs on the cluster at ``address`` (``http://HEAD:8265``), commands from ``inner``.

    Args:
        address: the dashboard address of the cluster.
        inner: a runner with ``build_command(spec)`` (and optionally ``build_env``, ``launch_cwd``).
        token: the cluster's auth token (default: see ``find_token``).
        metrics_source: ``auto`` (shared file when visible, else job logs), ``file`` or ``logs``.
        log_mirror_s: minimum seconds between copies of the job's log into ``trial.log``.
        log_fetch_s: minimum seconds between log fetches of one metrics reader (log-based metrics).
        entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources: what each trial's driver reserves
            (``submit_job``'s arguments of these names; None: Ray's default, nothing). Ray queues a job until they
            are free on one node.
    """

    name = "ray"

    @property
    def watches_progress(self) -> bool:  # type: ignore[override]
        """Ray jobs of a runner with a watchdog (verl, MARTI) are watched in ``poll``; others by the tuner."""
        return getattr(self.inner, "watchdog", None) is not None

    def __init__(
        self,
        address: str,
        inner: TrialRunner,
        *,
        token: str | None = None,
        metrics_source: str = "auto",
        log_mirror_s: float = 10.0,
        log_fetch_s: float = 2.0,
        client: Any | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        parse_line: Callable[[str], StepRecord | None] | None = None,
        classify_exit: Callable[..., Any] | None = None,
    ) -> None:
        from mart.trial_runner.ray.cluster import trial_resources

        if not hasattr(inner, "build_command"):
            raise TypeError(f"{type(inner).__name__} has no build_command(spec); it cannot run as a Ray job.")
        # the job's log format (its metric lines, what an exit means) is the backend's, e.g. verl's
        # (mart.trial_runner.verl.logs): given by the backend, so this transport imports no backend
        parse_line = parse_line or getattr(inner, "parse_log_line", None)
        classify_exit = classify_exit or getattr(inner, "classify_exit", None)
        if parse_line is None or classify_exit is None:
            raise TypeError(f"{type(inner).__name__} names no log format (parse_log_line, classify_exit): pass "
                            "parse_line= and classify_exit= to RayJobRunner.")
        self.parse_line, self.classify_exit = parse_line, classify_exit
        if metrics_source not in ("auto", "file", "logs"):
            raise ValueError(f"`metrics_source` must be auto, file or logs, but got {metrics_source!r}.")
        self.address = normalize_address(address)
        self.inner = inner
        self.token = token
        self.metrics_source = metrics_source
        self.log_mirror_s = log_mirror_s
        self.log_fetch_s = log_fetch_s
        self._client = client
        self._mirrored_at: dict[str, float] = {}
        self._followed: dict[str, tuple[Any, Any]] = {}  # job id -> (metrics tail, Progress)
        self._final_logs: set[str | None] = set()  # jobs whose final log was mirrored
        self._running_since: dict[str, float] = {}  # job id -> when it was first seen out of Ray's queue
        self.resources = trial_resources(entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources)

    # ------------------------------------------------------------------------------------ client

    @property
    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            token = find_token(self.token)
            headers = {"Authorization": f"Bearer {token}"} if token else None
            self._client = JobSubmissionClient(self.address, headers=headers)
        return self._client

    # ------------------------------------------------------------------------------------ launch

    def _id_prefix(self, spec: TrialSpec) -> str:
        """``mart-<trial id>-<hash of its trial dir>-``: trial ids repeat across runs (every run has a
        ``sys-01-baseline``), their directories do not, so a session never takes another run's job for its own."""
        where = hashlib.sha256(str(Path(spec.trial_dir).resolve()).encode()).hexdigest()[:8]
        return f"mart-{_ID_SAFE.sub('_', spec.trial_id)}-{where}-"

    def _existing_jobs(self, spec: TrialSpec) -> list[tuple[int, Any]]:
        prefix = self._id_prefix(spec)
        found = []
        for info in self.client.list_jobs():
            sid = getattr(info, "submission_id", None) or ""
            if sid.startswith(prefix) and sid[len(prefix):].isdigit():
                found.append((int(sid[len(prefix):]), info))
        return sorted(found, key=lambda x: x[0])

    def _handle(self, spec: TrialSpec, submission_id: str, n: int, extra: dict[str, Any]) -> TrialHandle:
        return TrialHandle(
            trial_id=spec.trial_id, backend=f"ray+{getattr(self.inner, 'name', 'job')}",
            trial_dir=str(Path(spec.trial_dir).resolve()), job_id=submission_id,
            extra={"address": self.address, "submission": n, "steps": spec.steps, **extra},
        )

    def launch(self, spec: TrialSpec) -> TrialHandle:
        """Submit the trial as a job, or re-attach to this trial's job if one is still pending/running."""
        trial_dir = Path(spec.trial_dir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        jobs = self._existing_jobs(spec)
        if jobs and not jobs[-1][1].status.is_terminal():
            n, info = jobs[-1]
            saved = self._read_job_file(trial_dir)
            extra = saved.get("extra", {}) if saved.get("submission_id") == info.submission_id else {}
            return self._handle(spec, info.submission_id, n, {**extra, "reattached": True})
        n = jobs[-1][0] + 1 if jobs else 1
        submission_id = f"{self._id_prefix(spec)}{n}"
        for stale in ("status.json", METRICS_FILE):  # a fresh run: nothing left from an earlier one
            path = trial_dir / stale
            if path.is_file() and not path.is_symlink():
                path.unlink()
        # files the command expects next to it (the local runner's config.json), on the shared path
        for hook in ("prepare", "write_config"):
            if hasattr(self.inner, hook):
                getattr(self.inner, hook)(spec)
                break
        argv = list(self.inner.build_command(spec))
        env = dict(self.inner.build_env(spec)) if hasattr(self.inner, "build_env") else {}
        entrypoint = shlex.join(argv)
        cwd = self.inner.launch_cwd(spec) if hasattr(self.inner, "launch_cwd") else None
        if cwd:
            entrypoint = f"mkdir -p {shlex.quote(cwd)} && cd {shlex.quote(cwd)} && {entrypoint}"
        extra: dict[str, Any] = {}
        if "MART_ATTEMPT" in env:  # a verl inner: which attempt file the job writes
            extra["attempt"] = int(env["MART_ATTEMPT"])
        if env.get("VERL_FILE_LOGGER_PATH"):
            extra["metrics_path"] = env["VERL_FILE_LOGGER_PATH"]
            write_atomic(Path(env["VERL_FILE_LOGGER_PATH"]).parent, "launch.json",
                         json.dumps({"argv": argv, "env": env, "submission_id": submission_id, "at": time.time()}, indent=1))
        submit_with_retry(self.client, entrypoint=entrypoint, submission_id=submission_id,
                          runtime_env={"env_vars": {k: str(v) for k, v in env.items()}} if env else None,
                          metadata={"mart_trial_id": spec.trial_id, "mart_trial_dir": str(trial_dir)},
                          **self.resources.submit_options())
        self._write_job_file(trial_dir, {"submission_id": submission_id, "address": self.address,
                                         "entrypoint": entrypoint, "extra": extra,
                                         "resources": self.resources.submit_options()})
        return self._handle(spec, submission_id, n, extra)

    def running_since(self, handle: TrialHandle) -> float:
        """When the job was first seen running (out of Ray's queue): the start of its first-step clock.

        Kept in ``ray_job.json`` so a resumed tuner keeps the same clock; a job first seen running by a resumed
        tuner starts it then (at most the tuner's downtime late, never early).
        """
        key = handle.job_id or handle.trial_id
        if key not in self._running_since:
            trial_dir = Path(handle.trial_dir)
            saved = self._read_job_file(trial_dir)
            since = saved.get("running_since") if saved.get("submission_id") == handle.job_id else None
            if not isinstance(since, (int, float)):
                since = time.time()
                if saved.get("submission_id") == handle.job_id:
                    try:
                        self._write_job_file(trial_dir, {**saved, "running_since": since})
                    except OSError:
                        pass
            self._running_since[key] = float(since)
        return self._running_since[key]

    def _write_job_file(self, trial_dir: Path, data: dict[str, Any]) -> None:
        write_atomic(trial_dir, "ray_job.json", json.dumps(data, indent=1))

    def _read_job_file(self, trial_dir: Path) -> dict[str, Any]:
        try:
            return json.loads((trial_dir / "ray_job.json").read_text())
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------------------------------ follow

    def _logs(self, handle: TrialHandle) -> str:
        return self.client.get_job_logs(handle.job_id)

    def _mirror_logs(self, handle: TrialHandle, force: bool = False) -> str | None:
        """Copy the job's log into trial.log (rate-limited); returns the text when fetched."""
        now = time.monotonic()
        if not force and now - self._mirrored_at.get(handle.job_id or "", 0.0) < self.log_mirror_s:
            return None
        self._mirrored_at[handle.job_id or ""] = now
        try:
            text = self._logs(handle)
        except Exception:
            return None
        try:
            write_atomic(handle.trial_dir, LOG_FILE, text)
        except OSError:
            pass
        return text

    def _metrics_file(self, handle: TrialHandle) -> Path:
        return Path(handle.extra.get("metrics_path") or Path(handle.trial_dir) / METRICS_FILE)

    def metrics(self, handle: TrialHandle):
        """The shared metrics file when visible (or ``metrics_source='file'``), else the job's logs."""
        path = self._metrics_file(handle)
        if self.metrics_source == "file" or (self.metrics_source == "auto" and path.exists()):
            return MetricsTail(path)
        if self.metrics_source == "auto" and not self._status(handle).is_terminal():
            # the file may simply not exist yet: prefer it once it appears
            return _AutoTail(path, LogMetricsTail(lambda: self._logs(handle), self.log_fetch_s, parse_line=self.parse_line))
        return LogMetricsTail(lambda: self._logs(handle), self.log_fetch_s, parse_line=self.parse_line)

    def _status(self, handle: TrialHandle):
        return self.client.get_job_status(handle.job_id)

    def _progress(self, handle: TrialHandle, *, force: bool = False):
        from mart.trial_runner.watchdog import Progress

        key = handle.job_id or handle.trial_id
        tail, progress = self._followed.get(key) or (self.metrics(handle), Progress())
        if force:  # final read: no rate limit
            for t in (tail, getattr(tail, "logs", None)):
                if isinstance(t, LogMetricsTail):
                    t._fetched_at = -math.inf
        progress.observe(tail.read_new(final=True) if force else tail.read_new())
        self._followed[key] = (tail, progress)
        return progress

    def _last_step(self, handle: TrialHandle, *, force: bool = False) -> int | None:
        return self._progress(handle, force=force).last_step

    def poll(self, handle: TrialHandle) -> TrialPoll:
        done = read_status(handle.trial_dir)
        if done is not None:  # written by us, or by the workload itself on the shared path
            if handle.job_id not in self._final_logs:
                self._final_logs.add(handle.job_id)
                self._mirror_logs(handle, force=True)
            return done
        from ray.job_submission import JobStatus

        status = self._status(handle)
        if status == JobStatus.PENDING:  # in Ray's queue: nothing runs yet, so no clock of the watchdog does either
            return TrialPoll(status=TrialStatus.RUNNING, queued=QUEUED_REASON)
        if status == JobStatus.RUNNING:
            self._mirror_logs(handle)
            progress = self._progress(handle)
            watchdog = getattr(self.inner, "watchdog", None)  # the verl runner's progress watchdog
            hung = progress.expired(watchdog, self.running_since(handle)) if watchdog is not None else None
            if hung:
                return self.stop(handle, reason=hung)
            horizon = int(handle.extra.get("steps") or 0)
            total_steps = getattr(self.inner, "total_steps", None)  # the verl runner: the user's longer schedule
            if horizon and total_steps is not None and total_steps(horizon) > horizon and \
                    (progress.last_step or 0) >= horizon:
                self.client.stop_job(handle.job_id)
                deadline = time.monotonic() + 60.0
                while time.monotonic() < deadline and not self._status(handle).is_terminal():
                    time.sleep(0.2)
                self._mirror_logs(handle, force=True)
                return self._finish(handle, TrialStatus.COMPLETED,
                                    f"ended at the horizon (step {horizon} of a {total_steps(horizon)}-step schedule)",
                                    self._last_step(handle, force=True))
            return TrialPoll(status=TrialStatus.RUNNING, last_step=progress.last_step)
        log_text = self._mirror_logs(handle, force=True) or ""
        last = self._last_step(handle, force=True)
        info = self.client.get_job_info(handle.job_id)
        if status == JobStatus.SUCCEEDED:
            outcome = self.classify_exit(0, "", last, handle.extra.get("steps") if last is not None else None)
            final, reason = outcome.status, outcome.reason
        elif status == JobStatus.STOPPED:
            final, reason = TrialStatus.STOPPED, handle.extra.get("stop_reason") or (info.message or "job stopped")
        else:  # FAILED
            rc = getattr(info, "driver_exit_code", None)
            outcome = self.classify_exit(rc if rc is not None else 1, log_text, last, handle.extra.get("steps"))
            final = outcome.status
            reason = outcome.reason if final is TrialStatus.OOM or rc is not None else (info.message or outcome.reason)
        return self._finish(handle, final, reason, last)

    def _finish(self, handle: TrialHandle, status: TrialStatus, reason: str | None, last: int | None) -> TrialPoll:
        last = last or 0
        self._final_logs.add(handle.job_id)
        try:
            write_status(handle.trial_dir, status, reason, last)
        except OSError:
            pass
        return TrialPoll(status=status, reason=reason, last_step=last)

    def stop(self, handle: TrialHandle, reason: str = "stopped by mart", grace_s: float = 5.0) -> TrialPoll:
        """``stop_job`` (SIGTERM, then SIGKILL after Ray's own wait), wait for a terminal state, STOPPED."""
        done = read_status(handle.trial_dir)
        if done is not None:
            return done
        status = self._status(handle)
        if not status.is_terminal():
            self.client.stop_job(handle.job_id)
            deadline = time.monotonic() + grace_s + 30.0
            while time.monotonic() < deadline and not self._status(handle).is_terminal():
                time.sleep(0.2)
        self._mirror_logs(handle, force=True)
        final_status = self._status(handle)
        if final_status.is_terminal() and final_status.value != "STOPPED":
            handle = handle.model_copy(update={"extra": {**handle.extra}})
            return self.poll(handle)  # it ended by itself before the stop took effect
        return self._finish(handle, TrialStatus.STOPPED, reason, self._last_step(handle, force=True))

    def close(self) -> None:
        self._client = None


class _AutoTail:
    """Job logs until the shared metrics file appears, then the file (steps already read are skipped)."""

    def __init__(self, path: Path, logs: LogMetricsTail) -> None:
        self.file = MetricsTail(path)
        self.logs = logs
        self._last = -1

    def read_new(self, final: bool = False) -> list[StepRecord]:
        recs = self.file.read_new(final=final) if self.file.path.exists() else self.logs.read_new(final=final)
        recs = [r for r in recs if r.step > self._last]
        if recs:
            self._last = max(r.step for r in recs)
        return recs


__all__ = ["LogMetricsTail", "RayJobRunner", "find_token", "normalize_address"]
