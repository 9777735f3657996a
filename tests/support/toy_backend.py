"""A tiny backend for graph tests: trials are analytic functions of the config.

Used through the plugin path (``tests.support.toy_backend:make_backend``). By default each trial writes its
whole metric stream at launch, so graph tests exercise the tuning logic in milliseconds. With ``stream=True``
the trial runs on a poll clock instead: each ``poll`` reveals one more step, the status stays ``running``
until the last one, which comes with the final status (a real job writes its last line and exits at once),
and ``stop`` ends it where it stands -- so the health monitor sees a trial mid-run and early stopping can be
tested end to end without a real trainer. Streaming trials also show two pathologies
(learning rate > 0.02: entropy collapses after step 2; entropy bonus > 0.03: KL blows up from step
``kl_onset_step`` (default 3) while the validation score keeps rising) and log a validation score every step.
A ``stop`` that comes while the last step is in flight finds the trial finished (as a real job that completes
while the signal is on its way).

With ``queued_s`` (streaming trials), a trial first waits that many seconds of wall clock for its resources: its
polls say RUNNING with ``queued`` set and reveal nothing (as a Ray job held PENDING until a node is free).

Every launch appends one ``toy: start`` line to the trial's ``trial.log``: tests count them to prove a trial
process started exactly once (launch idempotency).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from mart.state.models import TrialStatus
from mart.state.search_space import Constraint, ParamSpec, SearchSpace
from mart.state.trials import TrialHandle, TrialPoll, TrialSpec
from mart.trial_runner.base import Backend, TrialRunner, read_status, write_status
from mart.trial_runner.metrics import write_record

MB = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
SEQS = "actor_rollout_ref.rollout.max_num_seqs"
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing"
LR = "actor_rollout_ref.actor.optim.lr"
ENT = "actor_rollout_ref.actor.entropy_coeff"

SPACE = SearchSpace(
    backend="toy",
    params=[
        ParamSpec(MB, "system", "int", 2, "actor micro batch", low=1, high=64),
        ParamSpec(SEQS, "system", "int", 8, "rollout concurrency", low=1, high=256),
        ParamSpec(CKPT, "system", "bool", True, "gradient checkpointing"),
        ParamSpec(LR, "learning", "log", 1e-3, "learning rate", low=1e-5, high=1e-1),
        ParamSpec(ENT, "learning", "float", 0.0, "entropy bonus", low=0.0, high=0.05),
    ],
    constraints=[Constraint("mb_le_seqs", "micro batch <= max_num_seqs",
                            lambda c: None if c[MB] <= c[SEQS] else f"{MB}={c[MB]} > {SEQS}={c[SEQS]}")],
)


#: two knobs whose last segments read the same (as verl's rollout and reference log-prob micro batches): summaries
#: must tell them apart. The toy's trials ignore them (``ToyBackend(log_prob_knobs=True)`` adds them).
ROLLOUT_LP = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
REF_LP = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
LOG_PROB_SPACE = SearchSpace(
    backend="toy", constraints=SPACE.constraints,
    params=[*SPACE.params, ParamSpec(ROLLOUT_LP, "system", "int", 2, "rollout log-prob micro batch", low=1, high=64),
            ParamSpec(REF_LP, "system", "int", 2, "reference log-prob micro batch", low=1, high=64)])


def simulate(config: dict, steps: int, stream: bool = False, memory_spike_gb: float = 0.0,
             kl_onset_step: int = 3) -> tuple[list[dict], str]:
    """The trial's metric rows (step 0 first) and final status; ``memory_spike_gb`` is added to step 1's
    memory reading only (a transient peak that falls back, as at the first rollout)."""
    mb, seqs, ckpt = config[MB], config[SEQS], config[CKPT]
    lr = config[LR]
    gen = 1.0 / math.log2(2 + seqs)
    upd = (0.6 if ckpt else 0.4) / math.log2(2 + mb)
    mem = 1.0 + 0.1 * mb * (0.5 if ckpt else 1.0) + 0.01 * seqs
    rows = [{"val-core/toy/reward/mean@1": 0.2}]
    status = "completed"
    for step in range(1, steps + 1):
        t = gen + upd
        quality = 0.2 + 0.6 * (1 - math.exp(-step * lr * 100)) - (0.5 if lr > 0.02 else 0.0) * step / steps
        row = {"timing_s/gen": gen, "timing_s/update_actor": upd, "timing_s/step": t,
               "perf/throughput": 1000 / t, "perf/max_memory_allocated_gb": mem + (memory_spike_gb if step == 1 else 0.0),
               "actor/entropy": 1.0 if lr <= 0.02 else 1.0 / (1 + step), "critic/score/mean": quality,
               "actor/grad_norm": 1.0, "actor/ppo_kl": 0.01}
        if stream and lr > 0.02:
            row["actor/entropy"] = 1.0 if step <= 2 else 0.02
        if stream and config[ENT] > 0.03 and step >= kl_onset_step:
            row["actor/ppo_kl"] = 3.0
        if step == steps or stream:
            row["val-core/toy/reward/mean@1"] = quality
        rows.append(row)
        if mem > 4.0:
            status = "oom"
            break
    return rows, status


PLAN_FILE = "toy_plan.json"
TOKEN_FILE = "launch_token"
START_LINE = "toy: start"
QUEUED = "waiting for toy resources"


class ToyRunner(TrialRunner):
    name = "toy"
    simulate = staticmethod(simulate)  # a variant backend (tests/support/multi_agent_toy.py) brings its own

    def __init__(self, stream: bool = False, memory_spike_gb: float = 0.0, kl_onset_step: int = 3,
                 queued_s: float = 0.0) -> None:
        self.stream = stream
        self.memory_spike_gb = memory_spike_gb
        self.kl_onset_step = kl_onset_step
        self.queued_s = queued_s

    def launch(self, spec: TrialSpec) -> TrialHandle:
        rows, status = self.simulate(spec.config, spec.steps, stream=self.stream, memory_spike_gb=self.memory_spike_gb,
                                kl_onset_step=self.kl_onset_step)
        path = Path(spec.trial_dir)
        with open(path / "trial.log", "a") as log:
            log.write(f"{START_LINE} {spec.trial_id} steps={spec.steps}\n")
        (path / "config.json").write_text(json.dumps(spec.config))
        if spec.launch_token:  # what ``adopt`` finds the trial by, as the local runner's environment marker
            (path / TOKEN_FILE).write_text(spec.launch_token)
        if self.stream:  # step 0 now (once out of its queue), the rest one per poll
            shown = 0 if self.queued_s else 1
            (path / PLAN_FILE).write_text(json.dumps({"rows": rows, "status": status, "shown": shown,
                                                      "queued_until": time.time() + self.queued_s}))
            rows = rows[:shown]
        with open(path / "metrics.jsonl", "w") as f:
            for step, data in enumerate(rows):
                write_record(f, step, data)
        if not self.stream:
            write_status(path, status, None if status == "completed" else "toy OOM", len(rows) - 1)
        return TrialHandle(trial_id=spec.trial_id, backend="toy", trial_dir=spec.trial_dir)

    def adopt(self, spec: TrialSpec) -> TrialHandle | None:
        """The trial an earlier tuner launched with ``spec.launch_token`` (its token file), if it did."""
        token = Path(spec.trial_dir) / TOKEN_FILE
        if not spec.launch_token or not token.exists() or token.read_text() != spec.launch_token:
            return None
        return TrialHandle(trial_id=spec.trial_id, backend="toy", trial_dir=spec.trial_dir, extra={"adopted": True})

    def poll(self, handle: TrialHandle) -> TrialPoll:
        done = read_status(handle.trial_dir)
        if done is not None:
            return done
        plan = self._plan(handle)
        if plan is None:
            return TrialPoll(status=TrialStatus.FAILED, reason="no status")
        if time.time() < plan.get("queued_until", 0):
            return TrialPoll(status=TrialStatus.RUNNING, queued=QUEUED)
        if plan["shown"] < len(plan["rows"]) - 1:
            self._reveal(handle, plan, 1)
            return TrialPoll(status=TrialStatus.RUNNING, last_step=plan["shown"] - 1)
        return self._finish(handle, plan)

    def stop(self, handle: TrialHandle, reason: str = "stopped", grace_s: float = 5.0) -> TrialPoll:
        plan = self._plan(handle)
        if read_status(handle.trial_dir) is None and plan is not None:
            if plan["shown"] >= len(plan["rows"]) - 1:
                return self._finish(handle, plan)  # the last step was in flight: it ends before the signal lands
            write_status(handle.trial_dir, TrialStatus.STOPPED, reason, plan["shown"] - 1)
        return self.poll(handle)

    @staticmethod
    def _plan(handle: TrialHandle) -> dict | None:
        path = Path(handle.trial_dir) / PLAN_FILE
        return json.loads(path.read_text()) if path.exists() else None

    @staticmethod
    def _reveal(handle: TrialHandle, plan: dict, n: int) -> None:
        with open(Path(handle.trial_dir) / "metrics.jsonl", "a") as f:
            for step in range(plan["shown"], min(plan["shown"] + n, len(plan["rows"]))):
                write_record(f, step, plan["rows"][step])
        plan["shown"] = min(plan["shown"] + n, len(plan["rows"]))
        (Path(handle.trial_dir) / PLAN_FILE).write_text(json.dumps(plan))

    def _finish(self, handle: TrialHandle, plan: dict) -> TrialPoll:
        """The last line and the final status in one go (a job writes its last step, then exits at once)."""
        self._reveal(handle, plan, len(plan["rows"]))
        status = plan["status"]
        write_status(handle.trial_dir, status, None if status == "completed" else "toy OOM", plan["shown"] - 1)
        return read_status(handle.trial_dir)


class ToyBackend(Backend):
    name = "toy"

    def __init__(self, memory_capacity_gb: float | None = None, stream: bool = False,
                 base_overrides: dict | None = None, memory_spike_gb: float = 0.0, kl_onset_step: int = 3,
                 max_parallel: int | None = None, log_prob_knobs: bool = False, queued_s: float = 0.0,
                 **unused) -> None:
        self.capacity = memory_capacity_gb or 4.0
        self.queued_s = float(queued_s)
        self.max_parallel = max_parallel
        self.stream = stream
        self.memory_spike_gb = memory_spike_gb
        self.kl_onset_step = kl_onset_step
        self.base_overrides = dict(base_overrides or {})
        self.space = LOG_PROB_SPACE if log_prob_knobs in (True, "true", "1") else SPACE

    def search_space(self) -> SearchSpace:
        return self.space

    def base_config(self) -> dict:
        return {**self.space.defaults(), **self.base_overrides}

    def make_runner(self) -> TrialRunner:
        return ToyRunner(stream=self.stream, memory_spike_gb=self.memory_spike_gb, kl_onset_step=self.kl_onset_step,
                         queued_s=self.queued_s)

    def memory_capacity_gb(self) -> float:
        return self.capacity

    def max_parallel_trials(self) -> int | None:
        return self.max_parallel

    def parallel_limit_reason(self) -> str:
        return f"the toy holds {self.max_parallel}"


def make_backend(**options) -> ToyBackend:
    return ToyBackend(**options)
