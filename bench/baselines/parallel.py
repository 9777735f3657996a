"""Stage 1 with N trial slots at once, for every method, on the simulator's clock.

Each method runs asynchronously, as its users run it on a cluster: N trials start at once (the defaults among
them), and whenever one ends, the method is told its result and asked for the next config, which starts in the
freed slot at that moment. A trial's simulated duration (the sim's own accounting: its GPU-hours over its GPUs)
decides when it ends, so a fast config frees its slot first. TPE is Optuna's with ``constant_liar=True`` (running
trials count as bad results while they run, so N asks in a row spread out) on the restricted space mart's agents
search; random and grid draw as in the sequential benchmark. mart runs through its own session with
``--parallel N`` on the sim's ``virtual`` clock, the same simulated time.

Every outcome carries ``started_s``/``ended_s`` (simulated seconds from the session's start), so the benchmark
reads best-so-far against wall clock and GPU-hours spent for every method alike.
"""

from __future__ import annotations

import heapq
import json
import time
from pathlib import Path
from typing import Any

from bench.baselines.common import Budget, MethodResult, TrialOutcome, run_trial
from bench.baselines.methods import METHODS as SEQUENTIAL
from bench.baselines.methods import TPERestricted, _n_devices
from bench.baselines.space import REDRAWS, config_key, repair, valid
from mart.trial_runner.base import Backend


class TPEConstantLiar(TPERestricted):
    """Multivariate TPE with Optuna's constant liar, for asks made while earlier trials still run."""

    def make_sampler(self, seed: int, n_trials: int):
        return self.optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, n_trials // 3), multivariate=True,
                                               constant_liar=True)


#: the methods of the parallel benchmark (mart runs through its session, ``bench/compare.py``)
PARALLEL_METHODS = {"random": SEQUENTIAL["random"], "grid": SEQUENTIAL["grid"], "tpe-cl": TPEConstantLiar}


def run_parallel_method(method: str, backend: Backend, *, scenario: str, seed: int, budget: Budget, workdir: Path,
                        slots: int) -> MethodResult:
    """One method's stage 1 with ``slots`` trials at once (``budget.system_trials`` in all, the defaults first)."""
    strategy = PARALLEL_METHODS[method]()
    t0 = time.monotonic()
    base = dict(backend.base_config())
    capacity = backend.memory_capacity_gb()
    limit = None if capacity is None else (1 - budget.memory_margin) * capacity
    strategy.bind(backend, base, budget, seed, limit)
    runner = backend.make_runner()
    n_dev = _n_devices(base)
    result = MethodResult(method=f"{method}", scenario=scenario, seed=seed)
    result.extra["slots"] = slots
    workdir.mkdir(parents=True, exist_ok=True)
    ran: dict[str, TrialOutcome] = {}
    running: list[tuple[float, int, TrialOutcome, dict[str, Any], Any]] = []  # (end, seq, outcome, overrides, ask)
    now, seq = 0.0, 0

    def propose(i: int) -> tuple[dict[str, Any], Any] | None:
        if i == 0:
            over = strategy.first("system")
            return over, getattr(strategy, "current", None)
        for _ in range(REDRAWS):
            raw = strategy.draw("system", i)
            if raw is None:
                return None
            over = repair(strategy.space, base, raw)
            key = config_key(base, over)
            if key in ran or not valid(strategy.space, base, over):
                strategy.discard("system", raw, ran.get(key))
                continue
            strategy.commit("system", raw, over)
            return over, getattr(strategy, "current", None)
        return None

    def start(i: int) -> bool:
        nonlocal seq
        drawn = propose(i)
        if drawn is None:
            return False
        over, ask = drawn
        seq += 1
        out = run_trial(backend, runner, trial_id=f"{method}-p{slots}-{seq:02d}", stage="system", seq=seq, base=base,
                        overrides=over, steps=budget.system_horizon, workdir=workdir, seed=seed, limit_gb=limit,
                        on_records=None, n_devices=n_dev)
        duration = out.gpu_hours * 3600.0 / max(1, n_dev)
        ran[config_key(base, over)] = out
        out.started_s, out.ended_s = now, now + duration
        heapq.heappush(running, (now + duration, seq, out, over, ask))
        if hasattr(strategy, "current"):
            strategy.current = None  # the ask is held with the running trial, told when it ends
        return True

    try:
        started = 0
        while started < min(slots, budget.system_trials) and start(started):
            started += 1
        while running:
            end, _, out, over, ask = heapq.heappop(running)
            now = end
            result.trials.append(out)
            if hasattr(strategy, "current"):
                strategy.current = ask
            strategy.tell("system", over, out)
            if started < budget.system_trials and start(started):
                started += 1
    except Exception as e:  # noqa: BLE001 - keep the partial result; the table marks the method
        result.error = f"{type(e).__name__}: {e}"
    finally:
        runner.close()
    feasible = [t for t in result.trials if t.feasible and t.throughput is not None]
    if feasible:
        best = max(feasible, key=lambda t: t.throughput)
        result.best_system, result.best_throughput = best.overrides, best.throughput
    result.wall_s = time.monotonic() - t0
    return result


def mart_timeline(run_dir: Path) -> dict[str, tuple[float, float]]:
    """trial_id -> (simulated start, simulated end) of a mart session on the sim's virtual clock."""
    out = {}
    for meta in run_dir.rglob("sim_trial.json"):
        try:
            m = json.loads(meta.read_text())
            state = json.loads((meta.parent / "sim_state.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        start = float(m.get("sim_start") or 0.0)
        out[m["spec"]["trial_id"]] = (start, start + float(state.get("sim_elapsed_s") or 0.0))
    return out


def best_so_far(trials: list[dict[str, Any]]) -> list[tuple[float, float | None, float]]:
    """(time a trial ended, the best feasible throughput by then, GPU-hours spent by then), by end time. A trial
    still running at that time has spent its GPU-hours up to then (counted in full: a cluster pays for it)."""
    out, best = [], None
    rows = sorted((t for t in trials if t.get("ended_s") is not None), key=lambda t: t["ended_s"])
    for t in rows:
        if t["feasible"] and t["throughput"] is not None:
            best = t["throughput"] if best is None else max(best, t["throughput"])
        spent = sum(u["gpu_hours"] * min(1.0, max(0.0, (t["ended_s"] - u["started_s"]) /
                                                     max(1e-9, u["ended_s"] - u["started_s"])))
                    for u in rows if u["started_s"] < t["ended_s"])
        out.append((t["ended_s"], best, spent))
    return out


def time_to(curve: list[tuple[float, float | None, float]], target: float) -> tuple[float | None, float | None]:
    """(wall time, GPU-hours) when best-so-far first reached ``target`` (None, None if never)."""
    for when, best, spent in curve:
        if best is not None and best >= target:
            return when, spent
    return None, None


def best_at(curve: list[tuple[float, float | None, float]], when: float) -> float | None:
    """Best-so-far at wall time ``when``."""
    best = None
    for t, b, _ in curve:
        if t <= when + 1e-9:
            best = b
    return best
