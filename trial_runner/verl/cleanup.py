"""End what is left of a trial after it stopped: processes outside its process group (Ray workers, vLLM).

verl's driver starts Ray, and Ray puts its workers (the actors that run FSDP and vLLM) in process groups of
their own, so stopping the driver's group can leave them holding GPU memory; the next trial's "GPUs free
before launch" wait then fails on them. Every process of a trial inherits the environment mart launched it
with (``MART_TRIAL_ID``, ``MART_ATTEMPT``; Ray passes a job's ``runtime_env`` variables to its workers too),
so the trial's processes are found by that marker - among all processes of this user and, by name, among
the processes NVML lists on the GPUs - and ended: SIGTERM, a grace period, SIGKILL.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil

TRIAL_ENV = "MART_TRIAL_ID"
ATTEMPT_ENV = "MART_ATTEMPT"
#: the trial's folder (absolute): trial ids repeat across runs (the same job tuned twice on one machine names its
#: baseline alike), so a process is the trial's only when its folder matches too
TRIAL_DIR_ENV = "MART_TRIAL_DIR"


def _marked(p: psutil.Process, trial_id: str, attempt: int | None, trial_dir: str | None = None) -> bool:
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        return False  # another user's process, or gone
    if env.get(TRIAL_ENV) != trial_id:
        return False
    if trial_dir is not None and env.get(TRIAL_DIR_ENV) not in (None, trial_dir):
        return False  # the same trial id in another run
    return attempt is None or env.get(ATTEMPT_ENV) in (None, str(attempt))


def trial_processes(trial_id: str, attempt: int | None = None, trial_dir: str | None = None) -> list[psutil.Process]:
    """Live processes that carry the trial's marker (this process and its ancestors excluded)."""
    me = {os.getpid()}
    try:
        me |= {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        pass
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid in me or p.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if _marked(p, trial_id, attempt, trial_dir):
            out.append(p)
    return out


def _describe(p: psutil.Process, gpu_gb: dict[int, float]) -> dict[str, Any]:
    try:
        name = p.name()
        cmd = " ".join(p.cmdline())[:200]
    except psutil.Error:
        name, cmd = "?", ""
    d: dict[str, Any] = {"pid": p.pid, "name": name, "cmdline": cmd}
    if p.pid in gpu_gb:
        d["gpu_gb"] = round(gpu_gb[p.pid], 3)
    return d


def end_trial_processes(trial_id: str, attempt: int | None = None, grace_s: float = 5.0,
                        trial_dir: str | None = None) -> list[dict[str, Any]]:
    """End the trial's leftover processes; returns what was found, each with the signal that ended it.

    Safe to call when nothing is left (returns []). GPU memory per process comes from NVML when available.
    """
    procs = trial_processes(trial_id, attempt, trial_dir)
    if not procs:
        return []
    from mart.trial_runner.gpu import gpu_processes

    gpu_gb: dict[int, float] = {}
    for g in gpu_processes():
        gpu_gb[g["pid"]] = gpu_gb.get(g["pid"], 0.0) + float(g.get("used_gb") or 0.0)
    found = [_describe(p, gpu_gb) for p in procs]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    if alive:
        psutil.wait_procs(alive, timeout=5.0)
    killed = {p.pid for p in alive}
    for d in found:
        d["signal"] = "SIGKILL" if d["pid"] in killed else "SIGTERM"
    return found


def summary(found: list[dict[str, Any]]) -> str:
    """One line for the log and the trial's reason."""
    parts = [f"{d['name']}[{d['pid']}]" + (f" {d['gpu_gb']:.1f} GiB on GPU" if "gpu_gb" in d else "") for d in found]
    return f"ended {len(found)} leftover process(es) of the trial: {', '.join(parts)}"


__all__ = ["end_trial_processes", "summary", "trial_processes"]
