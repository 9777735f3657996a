"""What one simulated trial produces, and the few facts every trial model shares.

``SimResult`` (a timed verl metric stream of ``SimEvent`` lines and how the trial ends) is the contract of
``model.simulate`` and ``multi_agent.simulate`` alike; the noise levels, the warm-up slowdown, the start-up
time and the seed hashing are the same for a single-agent and a multi-agent job, so they live here, below both.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mart.trial_runner.sim.job import Scenario

VAL_KEY = "val-core/math/reward/mean@1"
TIMING_NOISE = 0.02  # lognormal sigma of every phase time (run-to-run jitter)
MEMORY_NOISE_GB = 0.15
LENGTH_NOISE = 0.03  # lognormal sigma of a step's mean response length around the trajectory's
WARMUP_SLOWDOWN = {1: 1.25, 2: 1.05}  # allocator/graph warm-up of the first steps (why MART skips 1-2)


def seed_hash(*parts: Any) -> int:
    """A stable 64-bit seed from JSON-able parts (same parts, same seed, on every machine)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little")


@dataclass
class SimEvent:
    """One metric line, visible once the simulated clock reaches ``t``."""

    t: float
    step: int
    data: dict[str, float]


@dataclass
class SimResult:
    """A whole simulated trial: its metric lines and how it ends."""

    events: list[SimEvent]
    status: str  # completed | oom | failed
    reason: str | None
    end_t: float  # simulated seconds from launch to the end
    last_step: int
    n_gpus: int
    init_s: float
    planned_steps: int
    info: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> learning state (see simulate)

    @property
    def gpu_hours(self) -> float:
        return self.end_t * self.n_gpus / 3600.0


def scalar(v: Any) -> float:
    return float(np.asarray(v))


def init_seconds(sc: Scenario, k: dict[str, float]) -> float:
    """Start-up: Ray + model load + vLLM init (+ CUDA-graph capture) + FSDP wrap."""
    t = 40.0 + 8.0 * sc.model.params / 1e9 + (sc.nnodes - 1) * 20.0
    return t + (0.0 if k["eager"] else 15.0)
