"""Where the job model's training-phase memory comes from: torch's own accounting of the architecture (the memory
probe, ``mart.trial_runner.memory_probe``) when the job's model has a ``config.json`` model_type the probe builds
and torch and transformers are installed, else the textbook count (``JobModel._act_per_token``).

``MART_MEMORY_PROBE``: ``1`` (default) measures what is not cached (seconds to a minute of CPU, once per
architecture and FSDP world size), ``cached`` uses only cached or shipped measurements, ``0`` always the formula.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

from mart.state.job import JobDescription
from mart.trial_runner import memory_probe


@dataclass(frozen=True)
class MemorySource:
    """``coef``: the probe's full-depth peaks (None with the formula); ``why``: the reason for the formula."""

    source: str  # "probe" | "formula"
    coef: memory_probe.Coefficients | None = None
    why: str = ""


@lru_cache(maxsize=64)
def _coefficients(arch_json: str, world: int, mode: str) -> memory_probe.Coefficients | str:
    arch = json.loads(arch_json)
    if mode == "cached" and not memory_probe.is_cached(arch, world):
        return "not in the probe's cache (MART_MEMORY_PROBE=cached)"
    try:
        return memory_probe.coefficients(arch, world)
    except (RuntimeError, OSError, ValueError) as e:  # a failed child process: the formula still answers
        return str(e)


def resolve(job: JobDescription) -> MemorySource:
    mode = os.environ.get("MART_MEMORY_PROBE", "1").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return MemorySource("formula", why="MART_MEMORY_PROBE=0")
    if job.hardware.cpu or job.engine != "vllm":
        return MemorySource("formula", why="an emulated CPU device")
    arch = job.model.arch()
    why = memory_probe.available(arch)
    if why:
        return MemorySource("formula", why=why)
    got = _coefficients(json.dumps(arch, sort_keys=True), job.n_gpus, "cached" if mode == "cached" else "run")
    if isinstance(got, str):
        return MemorySource("formula", why=got)
    return MemorySource("probe", coef=got)


__all__ = ["MemorySource", "resolve"]
