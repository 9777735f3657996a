"""A tiny, instant backend for graph tests: trials are analytic functions of the config.

Used through the plugin path (``tests.support.toy_backend:make_backend``). Each trial writes its whole metric
stream at launch, so graph tests exercise the tuning logic in milliseconds.
"""

from __future__ import annotations

import json
import math
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


def simulate(config: dict, steps: int) -> tuple[list[dict], str]:
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
               "perf/throughput": 1000 / t, "perf/max_memory_allocated_gb": mem,
               "actor/entropy": 1.0 if lr <= 0.02 else 1.0 / (1 + step), "critic/score/mean": quality,
               "actor/grad_norm": 1.0, "actor/ppo_kl": 0.01}
        if step == steps:
            row["val-core/toy/reward/mean@1"] = quality
        rows.append(row)
        if mem > 4.0:
            status = "oom"
            break
    return rows, status


class ToyRunner(TrialRunner):
    name = "toy"

    def launch(self, spec: TrialSpec) -> TrialHandle:
        rows, status = simulate(spec.config, spec.steps)
        path = Path(spec.trial_dir)
        with open(path / "metrics.jsonl", "w") as f:
            for step, data in enumerate(rows):
                write_record(f, step, data)
        (path / "config.json").write_text(json.dumps(spec.config))
        write_status(path, status, None if status == "completed" else "toy OOM", len(rows) - 1)
        return TrialHandle(trial_id=spec.trial_id, backend="toy", trial_dir=spec.trial_dir)

    def poll(self, handle: TrialHandle) -> TrialPoll:
        return read_status(handle.trial_dir) or TrialPoll(status=TrialStatus.FAILED, reason="no status")

    def stop(self, handle: TrialHandle, reason: str = "stopped", grace_s: float = 5.0) -> TrialPoll:
        return self.poll(handle)


class ToyBackend(Backend):
    name = "toy"

    def __init__(self, memory_capacity_gb: float | None = None, **unused) -> None:
        self.capacity = memory_capacity_gb or 4.0

    def search_space(self) -> SearchSpace:
        return SPACE

    def base_config(self) -> dict:
        return SPACE.defaults()

    def make_runner(self) -> TrialRunner:
        return ToyRunner()

    def memory_capacity_gb(self) -> float:
        return self.capacity


def make_backend(**options) -> ToyBackend:
    return ToyBackend(**options)
