"""Launch MARTI's multi-agent trainer as a trial process (or a Ray job) and follow it.

The process side is the verl runner's, reused as is (``VerlRunner``): one supervised process group per attempt
(``mart.trial_runner.process.ProcessGroup``), the exit code in ``attempt-k/exit.json``, NVML peaks, the GPU-free
wait, leftover Ray workers ended by their ``MART_TRIAL_ID`` marker, OOM text in the log (kill after a grace when
the run does not exit by itself), the progress watchdog, ``poll``/``stop`` from any process holding the handle.
What differs for MARTI:

* the command: ``python -m marti.cli.multi_agent_train_ppo_ray`` + typed flags (``argv.build_argv``), and
  ``OPENRLHF_ASYNC_NUM_TASKS`` from ``async_num_tasks``;
* metrics: MARTI writes no metrics file, so they are parsed from its console lines in ``trial.log``
  (``logs.MartiLogTail``); once the attempt ends they are mirrored to ``attempt-k/metrics.jsonl`` (the trial
  directory's ``metrics.jsonl`` points there, the trial-dir contract);
* the horizon: MARTI has no step-limit flag (its step count comes from the dataset size x ``num_episodes``, and
  sets its LR schedule), so the runner ends the run once the horizon's step is logged, like a verl run on a
  longer schedule;
* mart's run flags: checkpoints under the trial directory for every agent, ``load_checkpoint`` never on (MARTI
  would resume silently from an existing ``ckpt_path``), evaluation only at the horizon of learning trials
  (``eval_steps``), none in system trials.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mart.state.files import write_atomic
from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.search_space import ConfigError
from mart.state.stages import measures_throughput
from mart.state.trials import LOG_FILE, METRICS_FILE, TrialHandle, TrialPoll, TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.marti.argv import build_argv, build_env
from mart.trial_runner.marti.logs import LogContext, MartiLogTail, MartiTextTail
from mart.trial_runner.marti.space import agent_ids, agent_value, job_gpus, samples_per_agent_step
from mart.trial_runner.metrics import write_record
from mart.trial_runner.ray.runner import RayJobRunner
from mart.trial_runner.verl.runner import DevicePeakTail, VerlRunner

DEFAULT_ENTRYPOINT = ("python", "-m", "marti.cli.multi_agent_train_ppo_ray")
CONTEXT_FILE = "marti_context.json"

#: global flags mart sets on every launch (the user's values of the paths are replaced: see run_config)
RUN_FLAGS = frozenset({"save_path", "ckpt_path", "load_checkpoint", "eval_steps", "eval_before_training",
                       "save_steps", "logging_steps", "wandb_run_name", "eval_only"})
# ``seed`` is the config's unless the trial carries a seed of its own (run_config)
#: per-agent keys mart sets on every launch
RUN_AGENT_KEYS = ("save_path", "ckpt_path")


def _is_run_key(key: str) -> bool:
    if key in RUN_FLAGS:
        return True
    parts = key.split(".")
    return len(parts) == 3 and parts[0] == "agents" and parts[2] in RUN_AGENT_KEYS


class MartiRunner(VerlRunner):
    """Runs ``ENTRYPOINT --flag=value ...`` (MARTI's multi-agent trainer) in the trial directory and follows it.

    Args:
        entrypoint: launch command (str, shlex-split, or argv); default ``python -m marti.cli.multi_agent_train_ppo_ray``.
        allowed_keys: config keys that may become flags (the backend passes catalogue + base keys).
        python: interpreter replacing ``python``/``python3`` at the head of the entrypoint.
        **options: the verl runner's process options (``watchdog``, ``env``, ``oom_exit_grace_s``,
            ``gpu_free_threshold_gb``, ``gpu_free_timeout_s``, ``sample_gpu``, ``kill_grace_s``).
    """

    name = "marti"

    def __init__(self, entrypoint: str | Sequence[str] | None = None, *,
                 allowed_keys: Iterable[str] | None = None, python: str | None = None, **options: Any) -> None:
        for verl_only in ("implicit", "schedule_steps"):
            if verl_only in options:
                raise TypeError(f"MartiRunner takes no option {verl_only!r} (a verl runner option)")
        super().__init__(DEFAULT_ENTRYPOINT if entrypoint is None else entrypoint, python=python, **options)
        self.allowed_keys = None if allowed_keys is None else frozenset(allowed_keys)

    # ------------------------------------------------------------------------------------ the command

    def config_overrides(self, config: dict[str, Any]) -> list[str]:
        """The candidate's own flags (whitelisted keys of the flat config), without mart's run flags."""
        keep = {k: v for k, v in config.items() if not _is_run_key(k)}
        return build_argv(keep, allowed=self.allowed_keys)

    def total_steps(self, horizon: int) -> int:
        return horizon  # MARTI has no step limit: the runner ends the run at the horizon (poll)

    def run_config(self, spec: TrialSpec, attempt: int) -> dict[str, Any]:
        """The flags mart sets for every run: paths in the trial directory, no silent resume, evaluation."""
        if spec.init_from is not None:
            raise ConfigError("the MARTI backend cannot start a trial from a checkpoint yet (MARTI resumes from each "
                              "agent's ckpt_path with --load_checkpoint; mart does not lay those out)")
        cfg = spec.config
        ckpt = Path(spec.trial_dir).resolve() / "checkpoints"
        horizon = spec.steps
        if measures_throughput(spec.stage):
            eval_steps, eval_before = -1, False  # throughput trials: training steps only
        else:
            user = cfg.get("eval_steps")
            ok = isinstance(user, int) and not isinstance(user, bool) and user > 0 and horizon % user == 0
            eval_steps, eval_before = (user if ok else horizon), cfg.get("eval_before_training") is True
        out: dict[str, Any] = {
            "save_path": str(ckpt / "final"),
            "ckpt_path": str(ckpt / "ckpt"),
            "load_checkpoint": False,
            "eval_steps": eval_steps,
            "eval_before_training": eval_before,
            "eval_only": False,
            "save_steps": math.gcd(*spec.save_steps) if spec.save_steps else -1,
            "logging_steps": 1,
            "wandb_run_name": f"{spec.trial_id}-a{attempt}",
        }
        if spec.seed:  # the session's (or a re-run's) seed, as the local runner does; 0 keeps the config's
            out["seed"] = int(spec.seed)
        for i in agent_ids(cfg):
            out[f"agents.{i}.save_path"] = str(ckpt / f"agent{i}" / "final")
            out[f"agents.{i}.ckpt_path"] = str(ckpt / f"agent{i}" / "ckpt")
        return out

    def build_command(self, spec: TrialSpec) -> list[str]:
        """argv of the run: entrypoint + every flag of the config and mart's run flags (no shell involved)."""
        k = self.attempt(spec)
        self.config_overrides(spec.config)  # the whitelist, on the candidate's own keys
        config = {k_: v for k_, v in spec.config.items() if not _is_run_key(k_)}
        config.update(self.run_config(spec, k))
        self._write_context(spec, k)
        return self.entrypoint + build_argv(config)

    def _write_context(self, spec: TrialSpec, attempt: int) -> None:
        cfg = spec.config
        order = [i for i in agent_ids(cfg) if agent_value(cfg, i, "is_tuning")]
        ctx = LogContext(gpus=job_gpus(cfg), samples_per_agent_step=samples_per_agent_step(cfg), agent_order=order)
        ctx.write(Path(spec.trial_dir).resolve() / f"attempt-{attempt}" / CONTEXT_FILE)

    def build_env(self, spec: TrialSpec) -> dict[str, str]:
        """Environment additions of the run (the caller merges them into its own environment)."""
        k = self.attempt(spec)
        return {
            **self.env,
            **build_env(spec.config),
            "RAY_COLOR_PREFIX": "0",
            "RAY_DEDUP_LOGS": "0",  # one line per agent and step: never folded into "[repeated Nx]"
            "PYTHONUNBUFFERED": "1",
            "MART_TRIAL_ID": spec.trial_id,
            "MART_ATTEMPT": str(k),
            "MART_TRIAL_DIR": str(Path(spec.trial_dir).resolve()),
            **({"CUDA_VISIBLE_DEVICES": spec.devices} if spec.devices else {}),  # its slot's GPUs (parallel trials)
        }

    # ------------------------------------------------------------------------------------ following

    def metrics(self, handle: TrialHandle) -> DevicePeakTail:
        """MARTI's console lines of this attempt in trial.log, with the device-wide GPU peak so far."""
        adir = Path(handle.extra.get("attempt_dir", handle.trial_dir))
        ctx = LogContext.read(adir / CONTEXT_FILE)
        tail = MartiLogTail(Path(handle.trial_dir) / LOG_FILE, int(handle.extra.get("log_offset", 0)), ctx,
                            _horizon(handle))
        return DevicePeakTail(tail, adir / "gpu_peaks.json")

    def _ended_here(self, handle: TrialHandle, st: Any) -> TrialPoll | None:
        horizon = int(handle.extra.get("steps") or 0)
        if horizon and (st.progress.last_step or 0) >= horizon and self._leader(handle) is not None:
            self._kill(handle, self.kill_grace_s)
            return self._finish(handle, st, TrialStatus.COMPLETED,
                                f"ended at the horizon (step {horizon}; MARTI has no step-limit flag)")
        return None

    def _finish(self, handle: TrialHandle, st: Any, status: TrialStatus, reason: str | None) -> TrialPoll:
        # the run is over: its last step's record has no next boundary to wait for (a hang, a kill, a stop)
        self._update(handle, st, final=True)
        poll = super()._finish(handle, st, status, reason)
        _mirror_metrics(handle, self.metrics(handle).read_new(final=True))
        return poll


def _horizon(handle: TrialHandle) -> int | None:
    steps = handle.extra.get("steps")
    return int(steps) if steps else None


def _mirror_metrics(handle: TrialHandle, records: list[StepRecord]) -> None:
    """Write the parsed records to the attempt's metrics.jsonl once (atomically), for the trial-dir contract."""
    adir = Path(handle.extra.get("attempt_dir") or Path(handle.trial_dir) / f"attempt-{handle.extra.get('attempt', 1)}")
    buf = io.StringIO()
    for rec in records:
        write_record(buf, rec.step, rec.data)
    try:
        adir.mkdir(parents=True, exist_ok=True)
        write_atomic(adir, METRICS_FILE, buf.getvalue())
    except OSError:
        pass


class MartiRayJobRunner(RayJobRunner):
    """MARTI trials as Ray jobs (``RayJobRunner``), its metrics parsed from the job's log, ended at the horizon.

    MARTI's driver calls ``ray.init()`` itself; inside a Ray job that joins the job's cluster.
    """

    def metrics(self, handle: TrialHandle) -> MartiTextTail:
        attempt = handle.extra.get("attempt", 1)
        ctx = LogContext.read(Path(handle.trial_dir) / f"attempt-{attempt}" / CONTEXT_FILE)
        return MartiTextTail(lambda: self._logs(handle), ctx, _horizon(handle))

    def poll(self, handle: TrialHandle) -> TrialPoll:
        if read_status(handle.trial_dir) is None and not self._status(handle).is_terminal():
            horizon = int(handle.extra.get("steps") or 0)
            progress = self._progress(handle)
            if horizon and (progress.last_step or 0) >= horizon:
                self.client.stop_job(handle.job_id)
                self._mirror_logs(handle, force=True)
                return self._finish(handle, TrialStatus.COMPLETED,
                                    f"ended at the horizon (step {horizon}; MARTI has no step-limit flag)",
                                    progress.last_step)
        return super().poll(handle)

    def _finish(self, handle: TrialHandle, status: TrialStatus, reason: str | None, last: int | None) -> TrialPoll:
        poll = super()._finish(handle, status, reason, last)
        _mirror_metrics(handle, self.metrics(handle).read_new(final=True))
        return poll


__all__ = ["DEFAULT_ENTRYPOINT", "MartiRayJobRunner", "MartiRunner", "RUN_FLAGS"]
