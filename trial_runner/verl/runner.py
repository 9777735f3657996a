"""Launch verl (or a site's wrapper of it) as a trial process, and follow it: metrics, failures, watchdog.

Per trial directory ``D`` and attempt ``k`` (1, 2, ... for relaunches of the same trial):

    D/attempt-k/metrics.jsonl   VERL_FILE_LOGGER_PATH (verl truncates it on open: one file per attempt)
    D/metrics.jsonl             symlink to the current attempt's file (the generic trial-dir contract)
    D/attempt-k/launch.json     argv and environment additions of the attempt
    D/attempt-k/exit.json       exit code, written by ``mart.trial_runner.verl.supervise``
    D/attempt-k/gpu_peaks.json  peak GPU memory sampled over the run (NVML; only with GPUs)
    D/attempt-k/hydra/          Hydra's run dir (``hydra.run.dir``)
    D/attempt-k/cwd-XXXXXXXX/   the attempt's working directory, new and empty at launch (``process.private_workdir``)
    D/checkpoints/              ``trainer.default_local_dir`` unless the config sets one
    D/trial.log                 stdout+stderr of every attempt, appended (``handle.extra["log_offset"]``)
    D/status.json               written by this runner once the attempt ends (verl does not write one)

Ownership: the process group belongs to the trial. ``poll``/``stop`` work from any process that holds the
handle (``mart.trial_runner.process.ProcessGroup``: pid + the leader's create time, SIGTERM -> grace ->
SIGKILL of the group); the exit code comes from exit.json.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mart.state.files import disk_full, open_in, write_atomic
from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.objectives import DEVICE_MEMORY_KEY
from mart.state.search_space import ConfigError
from mart.state.stages import measures_throughput
from mart.state.trials import LOG_FILE, METRICS_FILE, TrialHandle, TrialPoll, TrialSpec
from mart.trial_runner.base import (
    NO_VALIDATION,
    TrialRunner,
    finished_launch,
    read_status,
    trial_env,
    write_status,
)
from mart.trial_runner.process import (
    LAUNCH_TOKEN_ENV,
    ProcessGroup,
    find_launched,
    private_workdir,
    python_command,
    unproven_launch,
)
from mart.trial_runner.verl.logs import (
    FallbackMetricsTail,
    classify_exit,
    find_oom,
    parse_console_line,
    read_tail,
)
from mart.trial_runner.verl.overrides import build_overrides, check_key, override
from mart.trial_runner.watchdog import Progress, WatchdogConfig

DEFAULT_ENTRYPOINT = ("python", "-m", "verl.trainer.main_ppo")

#: keys mart sets on every launch (they may also appear in the user's base config). The objectives depend on
#: the validation keys: a stage-2 score must come from a validation *after* training (verl validates at the
#: last step only when ``test_freq > 0``, and at step 0 when ``val_before_train``), and stage-1 step times
#: must not include validation or checkpointing.
FIXED_KEYS = frozenset({
    "trainer.logger", "trainer.total_training_steps", "trainer.total_epochs", "trainer.project_name",
    "trainer.experiment_name", "trainer.resume_mode", "trainer.resume_from_path", "trainer.default_local_dir",
    "trainer.test_freq", "trainer.val_before_train", "trainer.save_freq", "hydra.run.dir",
})

#: verl loops over epochs and stops early, silently, when they run out: keep at least this many.
MIN_TOTAL_EPOCHS = 1000


def _same(a: Any, b: Any) -> bool:
    """Config values equal for the command line (1 == 1.0, but True != 1)."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def job_peak_gb(peaks: dict[str, Any] | None) -> float | None:
    """The job's device-wide peak from ``gpu_peaks.json``: max over its GPUs of (peak - used before launch)."""
    if not peaks or not peaks.get("peaks_gb"):
        return None
    before = peaks.get("before_gb") or {}
    vals = [float(v) - float(before.get(k, 0.0)) for k, v in peaks["peaks_gb"].items()]
    return max(0.0, max(vals)) if vals else None


def branch_resume_path(path: str, step: int) -> str:
    """``trainer.resume_from_path`` of a branch: absolute (verl resolves a relative one against its working
    directory, which is the branch's own trial dir) and ending in ``global_step_<step>`` (verl 0.9.1 takes the
    global step from ``path.split("global_step_")[-1]``, so a trailing ``/`` or another folder fails there)."""
    resolved = Path(path).expanduser().resolve()
    if resolved.name != f"global_step_{step}":
        raise ConfigError(f"`init_from.path` must be verl's `global_step_{step}` folder (verl reads the global step "
                          f"from its name), but got {path!r}.")
    return str(resolved)


def split_entrypoint(entrypoint: str | Sequence[str] | None, *, python: str | None = None) -> list[str]:
    """``--verl-entrypoint`` as argv: shlex-split, ``python`` -> this interpreter, relative script paths absolute.

    Relative paths are resolved against the current directory now, because trials run in a working
    directory of their own.
    """
    if entrypoint is None:
        argv = list(DEFAULT_ENTRYPOINT)
    elif isinstance(entrypoint, str):
        argv = shlex.split(entrypoint)
    else:
        argv = [str(a) for a in entrypoint]
    if not argv:
        raise ConfigError("the verl entrypoint is empty.")
    if argv[0] in ("python", "python3"):
        # this interpreter (absolute), or the one named (``python`` on Ray nodes is theirs: never resolved here)
        argv[0] = python or sys.executable
    for i, tok in enumerate(argv):
        if i and not tok.startswith("-") and not os.path.isabs(tok) and os.path.isfile(tok):
            argv[i] = os.path.abspath(tok)
    return argv


class DevicePeakTail:
    """A metrics tail (verl's JSONL/console fallback, MARTI's log) plus the supervisor's NVML peaks
    (``gpu_peaks.json``, rewritten during the run) on the newest record whenever the peak grew."""

    def __init__(self, tail: Any, peaks_path: Path) -> None:
        self.tail = tail
        self.peaks_path = peaks_path
        self._reported: float | None = None

    def __getattr__(self, name: str) -> Any:  # the wrapped tail's own state (e.g. which source it reads)
        return getattr(self.tail, name)

    def read_new(self, final: bool = False) -> list[StepRecord]:
        recs = self.tail.read_new(final=final)
        if recs:
            try:
                peak = job_peak_gb(json.loads(self.peaks_path.read_text()))
            except (OSError, ValueError):
                peak = None
            if peak is not None and (self._reported is None or peak > self._reported):
                self._reported = peak
                recs[-1] = StepRecord(step=recs[-1].step, data={**recs[-1].data, DEVICE_MEMORY_KEY: peak})
        return recs


@dataclass
class _Follow:
    """What this runner knows about one attempt it follows (rebuilt from disk after a restart)."""

    tail: DevicePeakTail
    progress: Progress = field(default_factory=Progress)
    log_scan_offset: int = 0
    oom_reason: str | None = None
    oom_seen_at: float | None = None
    ended_seen_at: float | None = None  # when the run's own process group was first seen gone


class VerlRunner(TrialRunner):
    """Runs ``ENTRYPOINT key=value ...`` in the trial directory and follows it (see the module docstring).

    Args:
        entrypoint: the launch command (str, shlex-split, or argv); default ``python -m verl.trainer.main_ppo``.
        allowed_keys: config keys that may become overrides (the backend passes catalogue + base keys);
            None allows any valid dotted key.
        watchdog: progress watchdog settings.
        env: extra environment variables for every trial.
        oom_exit_grace_s: after OOM text appears in the log, how long the run may take to exit by itself
            before it is killed and marked ``oom``.
        gpu_free_threshold_gb, gpu_free_timeout_s: before a launch, wait until every GPU uses at most this
            much memory (leftovers of a previous trial); None disables the check.
        sample_gpu: record peak GPU memory over the run (NVML, in the supervisor).
        kill_grace_s: SIGTERM-to-SIGKILL grace when the watchdog or the OOM rule kills a run.
        implicit: mart's own filler values (catalogue defaults, GRPO settings) that are left off the command
            line while a config keeps them: with a user's run script as the entrypoint, only the candidate's
            changes and mart's run keys may follow the script's own arguments (verl keeps the last value).
        schedule_steps: the length of the user's full run (``trainer.total_training_steps`` of the base config).
            When longer than a trial's horizon, verl gets it (warm-up and LR schedule keep their shape) and the
            runner ends the run once the horizon's step is logged.
        python: interpreter that replaces ``python``/``python3`` at the head of the entrypoint (``--verl-python``).
        leftover_settle_s: once the run's own process group is gone, how long its other processes (Ray workers,
            the vLLM server: they exit by themselves when their raylet goes) may take before they are ended as
            leftovers.
    """

    leader_modules = ("mart.trial_runner.verl.supervise",)

    # verl's log format, for a transport that reads the console (the Ray job runner)
    parse_log_line = staticmethod(parse_console_line)
    classify_exit = staticmethod(classify_exit)

    name = "verl"
    watches_progress = True

    def __init__(
        self,
        entrypoint: str | Sequence[str] | None = None,
        *,
        allowed_keys: Iterable[str] | None = None,
        watchdog: WatchdogConfig | None = None,
        env: dict[str, str] | None = None,
        oom_exit_grace_s: float = 60.0,
        gpu_free_threshold_gb: float | None = 2.0,
        gpu_free_timeout_s: float = 120.0,
        sample_gpu: bool = True,
        kill_grace_s: float = 10.0,
        implicit: dict[str, Any] | None = None,
        schedule_steps: int | None = None,
        python: str | None = None,
        leftover_settle_s: float = 60.0,
    ) -> None:
        self.entrypoint = split_entrypoint(entrypoint, python=python)
        self.leftover_settle_s = leftover_settle_s
        self.implicit = dict(implicit or {})
        self.schedule_steps = int(schedule_steps) if schedule_steps else None
        self._startups_s: list[float] = []
        self.allowed_keys = None if allowed_keys is None else frozenset(allowed_keys) | FIXED_KEYS
        self.watchdog = watchdog or WatchdogConfig()
        self.env = dict(env or {})
        self.oom_exit_grace_s = oom_exit_grace_s
        self.gpu_free_threshold_gb = gpu_free_threshold_gb
        self.gpu_free_timeout_s = gpu_free_timeout_s
        self.sample_gpu = sample_gpu
        self.kill_grace_s = kill_grace_s
        self._groups: dict[tuple[str, int], ProcessGroup] = {}  # attempts launched here (reaped here)
        self._follow: dict[tuple[str, int], _Follow] = {}

    # ------------------------------------------------------------------------------------ the command

    def config_overrides(self, config: dict[str, Any]) -> list[str]:
        """The candidate's own overrides (whitelisted keys of the flat config), without mart's run keys.

        Keys still at one of mart's ``implicit`` filler values are left out (the entrypoint's own value holds).
        """
        keep = {k: v for k, v in config.items()
                if k not in FIXED_KEYS and not (k in self.implicit and _same(self.implicit[k], v))}
        return build_overrides(keep, allowed=self.allowed_keys)

    def total_steps(self, horizon: int) -> int:
        """``trainer.total_training_steps`` of a trial: the user's schedule when longer, else the horizon."""
        return self.schedule_steps if self.schedule_steps and self.schedule_steps > horizon else horizon

    def run_overrides(self, spec: TrialSpec, attempt: int) -> list[str]:
        """The keys mart sets for every run: logging, horizon, unique names, no silent resume, directories."""
        cfg = spec.config
        trial_dir = Path(spec.trial_dir).resolve()
        loggers = ["console", "file"]
        user_loggers = cfg.get("trainer.logger")
        if isinstance(user_loggers, (list, tuple)):
            loggers += [str(x) for x in user_loggers if str(x) not in loggers]
        resume_path = cfg.get("trainer.resume_from_path")
        horizon = spec.steps
        if measures_throughput(spec.stage):
            # throughput trials: nothing but training steps in the step time
            test_freq, val_before = NO_VALIDATION["trainer.test_freq"], NO_VALIDATION["trainer.val_before_train"]
            save_freq = -1
        else:
            # a validation at the horizon's step is the trial's score (verl validates when step % test_freq
            # == 0, and at its last step when test_freq > 0); the user's interval is kept when it hits it
            user_tf = cfg.get("trainer.test_freq")
            ok = isinstance(user_tf, int) and not isinstance(user_tf, bool) and user_tf > 0 and horizon % user_tf == 0
            test_freq = user_tf if ok else horizon
            val_before = cfg.get("trainer.val_before_train") is True  # the untrained score only when asked for
            save_freq = cfg.get("trainer.save_freq", -1)
        if spec.init_from is not None:  # a branch: verl resumes model, optimizer, data position and global step
            resume_path = branch_resume_path(spec.init_from.path, spec.init_from.step)
        out = {
            "trainer.logger": loggers,
            "trainer.total_training_steps": self.total_steps(horizon),
            "trainer.test_freq": test_freq,
            "trainer.val_before_train": val_before,
            "trainer.save_freq": save_freq,
            "trainer.total_epochs": max(int(cfg.get("trainer.total_epochs") or 0), MIN_TOTAL_EPOCHS),
            "trainer.project_name": cfg.get("trainer.project_name") or "mart",
            "trainer.experiment_name": f"{spec.trial_id}-a{attempt}",
            # resume only when a checkpoint is named on purpose; verl's default (auto) would silently resume
            "trainer.resume_mode": "resume_path" if resume_path else "disable",
            "trainer.default_local_dir": cfg.get("trainer.default_local_dir") or str(trial_dir / "checkpoints"),
            "hydra.run.dir": str(trial_dir / f"attempt-{attempt}" / "hydra"),
        }
        if resume_path:
            out["trainer.resume_from_path"] = resume_path
        if spec.init_from is not None:
            # 'extra' (lr scheduler + RNG) would restore the parent's base lr over the branch's own
            out["actor_rollout_ref.actor.checkpoint.load_contents"] = ["model", "optimizer"]
        if spec.save_steps:  # verl saves every save_freq steps (and at the last): the gcd covers every asked step
            user = int(save_freq or -1) if not isinstance(save_freq, bool) else -1
            out["trainer.save_freq"] = math.gcd(*spec.save_steps, *([user] if user > 0 else []))
        return [override(k, v) for k, v in out.items()]

    def attempt(self, spec: TrialSpec) -> int:
        """The attempt a launch of ``spec`` would be: the latest unused ``attempt-k`` dir, or a new one.

        An attempt dir is used once ``launch.json`` or ``metrics.jsonl`` exists in it. Creating the dir and
        pointing ``D/metrics.jsonl`` at it happens here, so ``build_command`` and ``build_env`` (called by
        ``RayJobRunner`` in either order) agree.
        """
        trial_dir = Path(spec.trial_dir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        nums = sorted(int(p.name.split("-", 1)[1]) for p in trial_dir.glob("attempt-*") if p.name.split("-", 1)[1].isdigit())
        k = nums[-1] if nums else 0
        if k == 0 or any((trial_dir / f"attempt-{k}" / n).exists() for n in ("launch.json", METRICS_FILE)):
            k += 1
        adir = trial_dir / f"attempt-{k}"
        adir.mkdir(exist_ok=True)
        link = trial_dir / METRICS_FILE
        target = Path(f"attempt-{k}") / METRICS_FILE
        try:
            if link.is_symlink() or link.exists():
                if not link.is_symlink() or os.readlink(link) != str(target):
                    link.unlink()
            if not link.is_symlink():
                link.symlink_to(target)
        except OSError:
            pass  # no symlinks here: metrics() reads the attempt's file directly
        return k

    def build_command(self, spec: TrialSpec) -> list[str]:
        """argv of the run: entrypoint + candidate overrides + mart's run overrides (no shell involved)."""
        k = self.attempt(spec)
        return self.entrypoint + self.config_overrides(spec.config) + self.run_overrides(spec, k)

    def metrics_path(self, spec: TrialSpec, attempt: int) -> Path:
        return Path(spec.trial_dir).resolve() / f"attempt-{attempt}" / METRICS_FILE

    def build_env(self, spec: TrialSpec) -> dict[str, str]:
        """Environment additions of the run (the caller merges them into its own environment)."""
        k = self.attempt(spec)
        return {
            **self.env,
            "VERL_FILE_LOGGER_PATH": str(self.metrics_path(spec, k)),
            "RAY_COLOR_PREFIX": "0",
            "PYTHONUNBUFFERED": "1",
            "MART_TRIAL_ID": spec.trial_id,
            "MART_ATTEMPT": str(k),
            "MART_TRIAL_DIR": str(Path(spec.trial_dir).resolve()),  # with the id: the trial's processes, no other run's
            **({"CUDA_VISIBLE_DEVICES": spec.devices} if spec.devices else {}),  # its slot's GPUs (parallel trials)
        }

    def launch_cwd(self, spec: TrialSpec) -> str:
        """The attempt's working directory: a new empty one (``process.private_workdir``), never the trial
        directory, whose contents a run folder may have put there (``python -m`` and Ray import from it)."""
        k = self.attempt(spec)
        return str(private_workdir(Path(spec.trial_dir).resolve() / f"attempt-{k}"))

    # ------------------------------------------------------------------------------------ lifecycle

    def _check_gpus_free(self, spec: TrialSpec | None = None) -> None:
        if self.gpu_free_threshold_gb is None:
            return
        from mart.trial_runner.gpu import gpu_processes, wait_gpu_memory_free

        # a trial of a parallel session checks its own slot's GPUs: the others are busy with their trials
        env = {"CUDA_VISIBLE_DEVICES": spec.devices} if spec is not None and spec.devices else None
        if not wait_gpu_memory_free(self.gpu_free_threshold_gb, self.gpu_free_timeout_s, env=env):
            raise RuntimeError(
                f"GPU memory is still in use (> {self.gpu_free_threshold_gb} GiB on some GPU after "
                f"{self.gpu_free_timeout_s:.0f} s): {gpu_processes(env)}; a previous trial's workers may linger."
            )

    def _live_attempt(self, spec: TrialSpec) -> TrialHandle | None:
        """A handle on this trial's latest attempt if its process is still alive (a repeated launch)."""
        trial_dir = Path(spec.trial_dir).resolve()
        nums = sorted(int(p.name.split("-", 1)[1]) for p in trial_dir.glob("attempt-*") if p.name.split("-", 1)[1].isdigit())
        if not nums:
            return None
        adir = trial_dir / f"attempt-{nums[-1]}"
        try:
            info = json.loads((adir / "launch.json").read_text())
        except (OSError, ValueError):
            return None
        if (adir / "exit.json").exists() or not info.get("pid"):
            return None
        handle = TrialHandle(
            trial_id=spec.trial_id, backend=self.name, trial_dir=str(trial_dir), pid=info["pid"],
            pid_create_time=info.get("pid_create_time"), started_at=info.get("at", time.time()),
            extra={"attempt": nums[-1], "metrics_path": str(adir / METRICS_FILE), "attempt_dir": str(adir),
                   "steps": spec.steps, "log_offset": info.get("log_offset", 0), "reattached": True,
                   "stop_at_horizon": self.total_steps(spec.steps) > spec.steps},
        )
        if self._leader(handle) is None:
            return None
        # launch.json lies in the run folder (untrusted): its pid must be a supervisor some mart launch started
        # (an earlier launch's token, not necessarily this spec's)
        return handle if unproven_launch(handle.pid, handle.pid_create_time, None, info.get("at"),
                                         self.leader_modules) is None else None

    def adopt(self, spec: TrialSpec) -> TrialHandle | None:
        """The attempt an earlier tuner started for ``spec``: from its ``launch.json``, or, when the tuner died
        before writing the pid there, found by the launch token in the supervisor's environment, or in the
        ``exit.json`` it wrote if the attempt has already ended."""
        live = self._live_attempt(spec)
        if live is not None or not spec.launch_token:
            return live
        trial_dir = Path(spec.trial_dir).resolve()
        nums = sorted(int(p.name.split("-", 1)[1]) for p in trial_dir.glob("attempt-*") if p.name.split("-", 1)[1].isdigit())
        k = nums[-1] if nums else 1
        adir = trial_dir / f"attempt-{k}"
        group = find_launched(spec.launch_token)
        if group is not None:
            pid, created = group.pid, group.created
        elif (ended := finished_launch(adir, spec.launch_token, "exit.json")) is not None:
            # it ran to its end while no tuner watched (the supervisor wrote the token into exit.json): adopt
            # that ending, as poll reads it, rather than run the trial a second time
            pid, created = ended
        else:
            return None
        return TrialHandle(
            trial_id=spec.trial_id, backend=self.name, trial_dir=str(trial_dir), pid=pid,
            pid_create_time=created, started_at=created or time.time(),
            extra={"attempt": k, "metrics_path": str(adir / METRICS_FILE), "attempt_dir": str(adir),
                   "steps": spec.steps, "log_offset": 0, "reattached": True,
                   "stop_at_horizon": self.total_steps(spec.steps) > spec.steps})

    def launch(self, spec: TrialSpec) -> TrialHandle:
        """Start the trial (or re-attach to its latest attempt if that is still running)."""
        live = self._live_attempt(spec)
        if live is not None:
            return live
        self._check_gpus_free(spec)
        trial_dir = Path(spec.trial_dir).resolve()
        argv = self.build_command(spec)
        env_add = self.build_env(spec)
        k = int(env_add["MART_ATTEMPT"])
        adir = trial_dir / f"attempt-{k}"
        for stale in ("exit.json", "gpu_peaks.json"):
            (adir / stale).unlink(missing_ok=True)
        cwd = str(private_workdir(adir))  # see launch_cwd
        launch_info: dict[str, Any] = {"argv": argv, "env": env_add, "cwd": cwd, "at": time.time()}
        write_atomic(trial_dir, adir / "launch.json", json.dumps(launch_info, indent=1))
        (trial_dir / "status.json").unlink(missing_ok=True)
        sup = [*python_command(), "-m", "mart.trial_runner.verl.supervise", "--exit-file", str(adir / "exit.json")]
        if self.sample_gpu:
            sup += ["--gpu-peaks-file", str(adir / "gpu_peaks.json")]
        log_path = trial_dir / LOG_FILE
        with open_in(trial_dir, log_path, "ab") as log:
            log_offset = log.tell()
            log.write(f"=== mart: {spec.trial_id} attempt {k}: {shlex.join(argv)}\n".encode())
            log.flush()
            env = trial_env({**env_add, LAUNCH_TOKEN_ENV: spec.launch_token or secrets.token_hex(8)})
            group = ProcessGroup.spawn(sup + ["--"] + argv, cwd=cwd, env=env, output=log)
        launch_info.update(pid=group.pid, pid_create_time=group.created, log_offset=log_offset)
        write_atomic(trial_dir, adir / "launch.json", json.dumps(launch_info, indent=1))
        handle = TrialHandle(
            trial_id=spec.trial_id, backend=self.name, trial_dir=str(trial_dir), pid=group.pid,
            pid_create_time=group.created, started_at=launch_info["at"],
            extra={"attempt": k, "metrics_path": str(adir / METRICS_FILE), "attempt_dir": str(adir),
                   "steps": spec.steps, "log_offset": log_offset,
                   "stop_at_horizon": self.total_steps(spec.steps) > spec.steps},
        )
        self._groups[(spec.trial_id, k)] = group
        return handle

    def _key(self, handle: TrialHandle) -> tuple[str, int]:
        return handle.trial_id, int(handle.extra.get("attempt", 1))

    def _state(self, handle: TrialHandle) -> _Follow:
        key = self._key(handle)
        st = self._follow.get(key)
        if st is None:
            st = _Follow(tail=self.metrics(handle), log_scan_offset=int(handle.extra.get("log_offset", 0)))
            self._follow[key] = st
        return st

    def metrics(self, handle: TrialHandle) -> DevicePeakTail:
        """verl's JSONL of this attempt (the console lines of trial.log when no JSONL file appears), with the
        device-wide GPU peak so far added to the newest record whenever it grew (``DEVICE_MEMORY_KEY``)."""
        path = handle.extra.get("metrics_path") or str(Path(handle.trial_dir) / METRICS_FILE)
        peaks = Path(handle.extra.get("attempt_dir", handle.trial_dir)) / "gpu_peaks.json"
        return DevicePeakTail(FallbackMetricsTail(path, Path(handle.trial_dir) / LOG_FILE,
                                                  int(handle.extra.get("log_offset", 0))), peaks)

    def _group(self, handle: TrialHandle) -> ProcessGroup | None:
        """The attempt's process group: the one launched here, else attached through the handle."""
        if handle.pid is None:
            return None
        return self._groups.get(self._key(handle)) or self.attach(handle)

    def _leader(self, handle: TrialHandle) -> ProcessGroup | None:
        """The attempt's process group while its leader (the supervisor) still runs, else None."""
        group = self._group(handle)
        return group if group is not None and group.leader_alive() else None

    def _group_alive(self, handle: TrialHandle) -> bool:
        """Does any process of the attempt's group still run (workers may outlive the supervisor)?"""
        group = self._group(handle)
        return group is not None and group.alive()

    def _kill(self, handle: TrialHandle, grace_s: float, *, whole_trial: bool = True) -> None:
        """SIGTERM to the process group, up to ``grace_s`` to exit, then SIGKILL; returns once it is gone.

        ``whole_trial`` (mart stops the run: horizon, watchdog, OOM, ``stop``): the trial's processes outside the
        group go with it - verl's Ray workers and vLLM server live in sessions of their own, and a driver ended by
        a signal never shuts its Ray cluster down, so they would linger - as part of the stop, not as leftovers.
        """
        group = self._group(handle)
        if group is not None:
            group.terminate(grace_s, kill_wait_s=10.0)
        if whole_trial:
            from mart.trial_runner.verl.cleanup import end_trial_processes

            end_trial_processes(handle.trial_id, int(handle.extra.get("attempt", 1)), grace_s=grace_s,
                                trial_dir=str(Path(handle.trial_dir).resolve()))

    def _returncode(self, handle: TrialHandle) -> int | None:
        group = self._groups.get(self._key(handle))
        exit_file = Path(handle.extra.get("attempt_dir", handle.trial_dir)) / "exit.json"
        try:
            return int(json.loads(exit_file.read_text())["returncode"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if group is not None and group.returncode is not None:
            return group.returncode  # the supervisor itself was killed (SIGKILL) or failed
        return None

    def _update(self, handle: TrialHandle, st: _Follow, final: bool = False) -> list[StepRecord]:
        had_step = st.progress.first_train_seen_at is not None
        recs = st.tail.read_new(final=final)
        st.progress.observe(recs)
        if not had_step and st.progress.first_train_seen_at is not None:
            self._startups_s.append(st.progress.first_train_seen_at - handle.started_at)
        return recs

    def _scan_log_for_oom(self, handle: TrialHandle, st: _Follow) -> None:
        log_path = Path(handle.trial_dir) / LOG_FILE
        try:
            size = log_path.stat().st_size
        except FileNotFoundError:
            return
        if size <= st.log_scan_offset:
            return
        start = max(st.log_scan_offset - 4096, int(handle.extra.get("log_offset", 0)))  # overlap: split lines
        text = read_tail(log_path, start, max_bytes=size - start)
        st.log_scan_offset = size
        if st.oom_reason is None:
            reason = find_oom(text)
            if reason:
                st.oom_reason, st.oom_seen_at = reason, time.time()

    def _ended_here(self, handle: TrialHandle, st: _Follow) -> TrialPoll | None:
        """A runner that must end a run itself (a trainer without a step-limit flag) does it here."""
        return None

    def poll(self, handle: TrialHandle) -> TrialPoll:
        done = read_status(handle.trial_dir)
        if done is not None:
            return done
        st = self._state(handle)
        self._update(handle, st)
        ended = self._ended_here(handle, st)
        if ended is not None:
            return ended
        if self._leader(handle) is not None:
            self._scan_log_for_oom(handle, st)
            if st.oom_seen_at and st.progress.last_progress_at and st.progress.last_progress_at > st.oom_seen_at + 1.0:
                st.oom_reason = st.oom_seen_at = None  # it went on training: the OOM text was not fatal
            if st.oom_reason and st.oom_seen_at and time.time() - st.oom_seen_at > self.oom_exit_grace_s:
                self._kill(handle, self.kill_grace_s)
                return self._finish(handle, st, TrialStatus.OOM, st.oom_reason + " (killed: it did not exit)")
            horizon = handle.extra.get("steps")
            if handle.extra.get("stop_at_horizon") and horizon and (st.progress.last_step or 0) >= int(horizon):
                # the run follows the user's longer schedule; the trial ends at its horizon
                self._kill(handle, self.kill_grace_s)
                return self._finish(handle, st, TrialStatus.COMPLETED,
                                    f"ended at the horizon (step {horizon} of a {self.schedule_steps}-step schedule)")
            hung = st.progress.expired(self.watchdog, handle.started_at, startups_s=self._startups_s)
            if hung:
                self._kill(handle, self.kill_grace_s)
                return self._finish(handle, st, TrialStatus.STOPPED, hung)
            return TrialPoll(status=TrialStatus.RUNNING, last_step=st.progress.last_step)
        # the leader is gone: clean up what is left of its group, read the rest, classify
        if self._group_alive(handle):
            self._kill(handle, grace_s=2.0, whole_trial=False)
        if self._shutting_down(handle, st):
            return TrialPoll(status=TrialStatus.RUNNING, last_step=st.progress.last_step)
        self._update(handle, st, final=True)
        log_text = read_tail(Path(handle.trial_dir) / LOG_FILE, int(handle.extra.get("log_offset", 0)))
        outcome = classify_exit(self._returncode(handle), log_text, st.progress.last_step, handle.extra.get("steps"))
        full = disk_full(handle.trial_dir) if outcome.status is TrialStatus.FAILED else None
        if full:  # the run could not write (its log may not even say so): name the cause
            return self._finish(handle, st, outcome.status, f"{full}: {outcome.reason or 'the run failed'}")
        return self._finish(handle, st, outcome.status, outcome.reason)

    def _shutting_down(self, handle: TrialHandle, st: _Follow) -> bool:
        """Do the run's processes outside its group still exit by themselves (within ``leftover_settle_s`` of
        the group's end)? verl's Ray workers and vLLM server do once the driver's Ray cluster is gone, seconds
        later (more on a loaded machine): the trial stays running meanwhile, and whatever is still there after
        the settle time is a leftover."""
        if st.ended_seen_at is None:
            st.ended_seen_at = time.time()
        if time.time() - st.ended_seen_at >= self.leftover_settle_s:
            return False
        from mart.trial_runner.verl.cleanup import trial_processes

        return bool(trial_processes(handle.trial_id, int(handle.extra.get("attempt", 1)),
                                    str(Path(handle.trial_dir).resolve())))

    def _finish(self, handle: TrialHandle, st: _Follow, status: TrialStatus, reason: str | None) -> TrialPoll:
        self._update(handle, st)
        leftovers = self._end_leftovers(handle)
        if leftovers:
            reason = f"{reason}; {leftovers}" if reason else leftovers
        last = st.progress.last_step or 0
        write_status(handle.trial_dir, status, reason, last)
        return TrialPoll(status=status, reason=reason, last_step=last)

    def _end_leftovers(self, handle: TrialHandle) -> str | None:
        """End the attempt's processes outside its group (Ray workers, vLLM); log and return what was killed."""
        from mart.trial_runner.verl.cleanup import end_trial_processes, summary

        found = end_trial_processes(handle.trial_id, int(handle.extra.get("attempt", 1)), grace_s=self.kill_grace_s,
                                    trial_dir=str(Path(handle.trial_dir).resolve()))
        if not found:
            return None
        adir = Path(handle.extra.get("attempt_dir", handle.trial_dir))
        try:
            write_atomic(adir, "cleanup.json", json.dumps(found, indent=1))
            with open_in(handle.trial_dir, LOG_FILE, "a") as log:
                log.write(f"=== mart: {summary(found)}\n")
        except OSError:
            pass
        return summary(found)

    def stop(self, handle: TrialHandle, reason: str = "stopped by mart", grace_s: float = 5.0) -> TrialPoll:
        done = read_status(handle.trial_dir)
        if done is not None:
            return done
        st = self._state(handle)
        self._kill(handle, grace_s)
        return self._finish(handle, st, TrialStatus.STOPPED, reason)

    def read_all_metrics(self, handle: TrialHandle) -> list[StepRecord]:
        """Every record of the attempt; once it ended, also a last line without newline.

        The device-wide peak (``DEVICE_MEMORY_KEY``: the largest GPU's peak less what other processes held
        there before launch) is on the last record, so the memory margin judges the whole GPU (vLLM's KV
        cache, the other workers) and not one process's torch allocator.
        """
        ended = read_status(handle.trial_dir) is not None
        return self.metrics(handle).read_new(final=ended)

    def gpu_peaks(self, handle: TrialHandle) -> dict[str, Any] | None:
        """The sampled GPU memory peaks of an ended attempt (None without GPUs or before the end)."""
        path = Path(handle.extra.get("attempt_dir", handle.trial_dir)) / "gpu_peaks.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if data.get("peaks_gb") else None


__all__ = ["DEFAULT_ENTRYPOINT", "FIXED_KEYS", "Progress", "VerlRunner", "WatchdogConfig", "check_key", "split_entrypoint"]
