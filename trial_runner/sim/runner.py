"""SimRunner: plays a simulated verl trial into its trial directory as (simulated) time passes.

No subprocess. ``launch`` computes the whole trial once (``model.simulate``, deterministic per seed) and
stores it in the trial directory with the start time; every ``poll`` appends the metric lines whose
simulated time has come, and writes ``status.json`` at the end. ``stop`` truncates the stream where the
clock stands, so early termination saves simulated GPU-hours for real. Everything lives in the trial
directory: a handle re-attached from another process (a resumed tuner) continues the same trial.

Clocks:
    ``wall``: simulated seconds = wall seconds since launch x ``time_scale``.
    ``poll``: every poll advances to the next ``steps_per_poll`` metric lines (deterministic, no sleeping;
              the benchmark uses it so results do not depend on machine load).
    ``virtual``: one simulated clock shared by the trials of a run (``<trials dir>/.sim_clock.json``), as a
              discrete-event simulation: a poll reveals what is due at the clock's time, and once no running
              trial has anything due, the clock jumps to the earliest next event of any of them. Trials run in
              parallel finish in the order their simulated durations say (a fast config frees its slot first),
              a new trial starts at the clock's time, and the clock's end is the session's simulated wall time.
              A trial's end holds the clock until the tuner has seen it (polled it once more, as a collect
              does, or launched a trial): a tuner decides in no simulated time, so a freed slot is refilled at
              the instant it frees, not at the next event of a trial still running. A consumer that goes
              round its other trials twice without either lets the clock go on (it cannot stall). Deterministic
              and load-independent, like ``poll``.
    In ``wall`` mode ``steps_per_poll`` (if set) caps how far one poll may advance.

Files besides the trial contract (``metrics.jsonl``, ``status.json``, ``trial.log``):
    ``sim_trial.json``  the spec, scenario, clock settings and start time (written once);
    ``sim_plan.json``   the precomputed trial (metric lines with their simulated times, the ending);
    ``sim_state.json``  progress: lines written, simulated seconds used, GPU-hours used and planned.
    ``checkpoints/global_step_N/learning_state.json``  the learning state after step N (``spec.save_steps``),
                        written once the simulated clock has passed step N; a trial launched with
                        ``spec.init_from`` pointing at it continues the trajectory from there (a branch).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mart.state.files import ensure_dir, open_in, write_atomic
from mart.state.models import TrialStatus
from mart.state.trials import LOG_FILE, METRICS_FILE, TrialHandle, TrialPoll, TrialSpec, checkpoint_dir
from mart.trial_runner.base import TrialRunner, read_status, stage_config, write_status
from mart.trial_runner.metrics import write_record
from mart.trial_runner.sim import model
from mart.trial_runner.sim.scenarios import Scenario, load_scenario

META_FILE = "sim_trial.json"
PLAN_FILE = "sim_plan.json"
STATE_FILE = "sim_state.json"
CHECKPOINT_FILE = "learning_state.json"
LOCK_FILE = ".sim.lock"
CLOCK_FILE = ".sim_clock.json"
CLOCKS = ("wall", "poll", "virtual")


def _write_json(path: Path, obj: Any) -> None:
    write_atomic(path.parent, path.name, json.dumps(obj))


@contextlib.contextmanager
def _locked(trial_dir: Path) -> Iterator[None]:
    """Serialise pollers of one trial (threads or processes)."""
    with open_in(trial_dir, LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class SimRunner(TrialRunner):
    """Trial runner of the simulated verl cluster (see the module docstring)."""

    name = "sim"

    def __init__(self, scenario: str | Scenario, seed: int = 0, time_scale: float = 2000.0, memory_capacity_gb: float | None = None,
                 clock: str = "wall", steps_per_poll: int | None = None) -> None:
        if clock not in CLOCKS:
            raise ValueError(f"`clock` must be one of {', '.join(CLOCKS)}, but got {clock!r}.")
        if not time_scale > 0:
            raise ValueError(f"`time_scale` must be > 0 (simulated seconds per wall second), but got {time_scale!r}.")
        if steps_per_poll is not None and steps_per_poll < 1:
            raise ValueError(f"`steps_per_poll` must be >= 1 or None, but got {steps_per_poll!r}.")
        self.sc = load_scenario(scenario)  # a name, a YAML file or a Scenario; fails early when unknown
        self.scenario = self.sc.name
        self.seed = seed
        self.time_scale = float(time_scale)
        self.memory_capacity_gb = memory_capacity_gb
        self.clock = clock
        self.steps_per_poll = steps_per_poll if steps_per_poll is not None else (1 if clock == "poll" else None)

    # ------------------------------------------------------------------ lifecycle
    def launch(self, spec: TrialSpec) -> TrialHandle:
        trial_dir = Path(spec.trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        for stale in (METRICS_FILE, "status.json", STATE_FILE):
            (trial_dir / stale).unlink(missing_ok=True)
        capacity = spec.memory_capacity_gb or self.memory_capacity_gb
        seed = self.seed * 1_000_003 + spec.seed
        start = None
        if spec.init_from is not None:
            start = read_checkpoint(spec.init_from.path)
            if int(start["step"]) != spec.init_from.step:
                raise ValueError(f"`init_from.step` ({spec.init_from.step}) does not match the checkpoint at "
                                 f"{spec.init_from.path} (step {start['step']}).")
        result = model.simulate(stage_config(spec), self.sc, spec.steps, seed=seed, memory_capacity_gb=capacity,
                                start=start, save_steps=spec.save_steps)
        started = time.time()
        sim_start = register_virtual(trial_dir, spec.trial_id, result) if self.clock == "virtual" else 0.0
        meta = {
            "spec": spec.model_dump(),
            "scenario": self.scenario,
            "perturb": self.sc.perturb_seed,
            "seed": seed,
            "time_scale": self.time_scale,
            "clock": self.clock,
            "steps_per_poll": self.steps_per_poll,
            "memory_capacity_gb": capacity,
            "started_at": started,
            "sim_start": sim_start,
        }
        plan = {
            "events": [[e.t, e.step, e.data] for e in result.events],
            "status": result.status,
            "reason": result.reason,
            "end_t": result.end_t,
            "last_step": result.last_step,
            "n_gpus": result.n_gpus,
            "init_s": result.init_s,
            "info": result.info,
            "checkpoints": {str(k): v for k, v in result.checkpoints.items()},
        }
        _write_json(trial_dir / PLAN_FILE, plan)
        _write_json(trial_dir / META_FILE, meta)
        _write_json(trial_dir / STATE_FILE, self._usage(plan, written=0, sim_t=0.0, polls=0, final=None))
        open_in(trial_dir, METRICS_FILE, "a").close()
        with open_in(trial_dir, LOG_FILE, "w") as log:
            log.write(f"[sim] {spec.trial_id} on {self.scenario}: {spec.steps} steps, seed {seed}, "
                      f"{result.n_gpus} GPUs, clock={self.clock}\n")
        return TrialHandle(trial_id=spec.trial_id, backend=self.name, trial_dir=str(trial_dir), started_at=started,
                           extra={"scenario": self.scenario, "clock": self.clock})

    def poll(self, handle: TrialHandle) -> TrialPoll:
        trial_dir = Path(handle.trial_dir)
        done = read_status(trial_dir)
        if done is not None:
            if (handle.extra or {}).get("clock") == "virtual":
                release_virtual(trial_dir, handle.trial_id)  # the tuner has seen its end
            return done
        with _locked(trial_dir):
            return self._advance(trial_dir, stop_reason=None)

    def stop(self, handle: TrialHandle, reason: str = "stopped by mart", grace_s: float = 5.0) -> TrialPoll:
        trial_dir = Path(handle.trial_dir)
        with _locked(trial_dir):
            done = read_status(trial_dir)
            if done is not None:
                return done
            return self._advance(trial_dir, stop_reason=reason or "stopped")

    def usage(self, handle: TrialHandle) -> dict[str, Any]:
        """Simulated seconds and GPU-hours used so far, and what the whole trial would have used."""
        return sim_usage(handle.trial_dir)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _usage(plan: dict, written: int, sim_t: float, polls: int, final: str | None) -> dict[str, Any]:
        n = plan["n_gpus"]
        return {
            "written": written,
            "polls": polls,
            "sim_elapsed_s": sim_t,
            "gpu_hours": sim_t * n / 3600.0,
            "planned_s": plan["end_t"],
            "planned_gpu_hours": plan["end_t"] * n / 3600.0,
            "status": final,
        }

    def _advance(self, trial_dir: Path, stop_reason: str | None) -> TrialPoll:
        meta = json.loads((trial_dir / META_FILE).read_text())
        plan = json.loads((trial_dir / PLAN_FILE).read_text())
        state = json.loads((trial_dir / STATE_FILE).read_text())
        events = plan["events"]
        written, polls = int(state["written"]), int(state["polls"]) + 1
        per_poll = meta.get("steps_per_poll")
        if meta["clock"] == "virtual":
            # (start + t) - start can land a hair below t in floating point: an event due now is due
            target = virtual_now(trial_dir) - float(meta.get("sim_start") or 0.0) + 1e-6
        elif stop_reason is not None:
            target = state["sim_elapsed_s"] if meta["clock"] == "poll" else self._wall_target(meta, state)
            if per_poll and written < len(events):  # stopping never reveals more than the clock allows
                target = min(target, events[min(written + per_poll, len(events)) - 1][0])
        elif meta["clock"] == "poll":
            target = events[written + per_poll - 1][0] if written + per_poll <= len(events) else plan["end_t"]
        else:
            target = self._wall_target(meta, state)
            if per_poll and written < len(events):
                target = min(target, events[min(written + per_poll, len(events)) - 1][0])
        target = max(target, float(state["sim_elapsed_s"]))

        new = [e for e in events[written:] if e[0] <= target]
        if new:
            with open_in(trial_dir, METRICS_FILE, "a") as f:
                for _, step, data in new:
                    write_record(f, step, data)
            with open_in(trial_dir, LOG_FILE, "a") as log:
                for _, step, data in new:
                    shown = {k: data[k] for k in ("perf/throughput", "timing_s/step", "perf/max_memory_allocated_gb",
                                                  "critic/score/mean", model.VAL_KEY) if k in data}
                    log.write(f"step:{step} - " + " - ".join(f"{k}:{v:.4g}" for k, v in shown.items()) + "\n")
        checkpoints = plan.get("checkpoints") or {}
        for _, step, _ in new:
            if str(step) in checkpoints:
                ckpt = ensure_dir(trial_dir, Path(checkpoint_dir(str(trial_dir), step)))
                _write_json(ckpt / CHECKPOINT_FILE, checkpoints[str(step)])
        written += len(new)
        last_step = events[written - 1][1] if written else 0

        final: TrialPoll | None = None
        if stop_reason is not None:
            sim_t = min(target, plan["end_t"])
            final = TrialPoll(status=TrialStatus.STOPPED, reason=stop_reason, last_step=last_step)
        elif written == len(events) and target >= plan["end_t"]:
            sim_t = plan["end_t"]
            final = TrialPoll(status=TrialStatus(plan["status"]), reason=plan["reason"], last_step=plan["last_step"])
        else:
            sim_t = min(target, plan["end_t"])
        _write_json(trial_dir / STATE_FILE,
                    self._usage(plan, written, sim_t, polls, final.status.value if final else None))
        if meta["clock"] == "virtual":
            due = None if final is not None else (events[written][0] if written < len(events) else plan["end_t"])
            advance_virtual(trial_dir, meta["spec"]["trial_id"], None if due is None else float(meta["sim_start"]) + due,
                            revealed=bool(new))
        if final is None:
            return TrialPoll(status=TrialStatus.RUNNING, last_step=last_step)
        with open_in(trial_dir, LOG_FILE, "a") as log:
            log.write(f"[sim] {final.status.value}: {final.reason or 'ok'} (step {final.last_step}, "
                      f"{sim_t:.0f} simulated s, {sim_t * plan['n_gpus'] / 3600:.2f} GPU-h)\n")
        write_status(trial_dir, final.status, final.reason, final.last_step or 0)
        return final

    @staticmethod
    def _wall_target(meta: dict, state: dict) -> float:
        return (time.time() - float(meta["started_at"])) * float(meta["time_scale"])


# -- the virtual clock shared by a run's trials ----------------------------------------------------------------
@contextlib.contextmanager
def _clock(trial_dir: Path) -> Iterator[dict[str, Any]]:
    """The run's virtual clock, locked while it is read and written back."""
    path = trial_dir.parent / CLOCK_FILE
    with open_in(trial_dir.parent, CLOCK_FILE + ".lock", "a") as lock:  # no planted link followed
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                clock = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                clock = {"now": 0.0, "due": {}}
            if "ended" in (clock.get("hold") or {}):  # written by a mart before the one hold: read it as one
                clock["hold"]["ids"] = clock["hold"].pop("ended")
            yield clock
            _write_json(path, clock)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def register_virtual(trial_dir: Path, trial_id: str, result: Any) -> float:
    """Start a trial at the clock's time; returns that time (its simulated start). A launch is the tuner's
    answer to what it was shown (ends, new lines): their hold ends."""
    with _clock(trial_dir) as clock:
        clock.pop("hold", None)
        start = float(clock["now"])
        first = result.events[0].t if result.events else result.end_t
        clock["due"][trial_id] = start + float(first)
    return start


def release_virtual(trial_dir: Path, trial_id: str) -> None:
    """A finished trial polled again (the tuner collects it): its end no longer holds the clock. The clock moves
    on at the next poll of a running trial, after whatever the tuner launches now."""
    with _clock(trial_dir) as clock:
        hold = clock.get("hold")
        if hold and trial_id in hold["ids"]:
            hold["ids"].remove(trial_id)
            if not hold["ids"]:
                clock.pop("hold")


def virtual_now(trial_dir: Path) -> float:
    with _clock(trial_dir) as clock:
        return float(clock["now"])


def advance_virtual(trial_dir: Path, trial_id: str, due: float | None, revealed: bool = False) -> None:
    """Record when the trial next has something to show (None: it ended), then move the clock to the earliest
    such time once nothing is due now and nothing holds it.

    A trial that showed something at this poll (its end, or new metric lines: ``revealed``) holds the clock until
    the tuner has seen it: a finished trial until it is polled again (collected, ``release_virtual``), a running
    one until its next poll (the tuner reads a trial's lines before polling it again). The tuner answers in no
    simulated time, so what it launches on them starts at their instant, not at the next event. A consumer that
    goes round its other trials twice without either lets the clock go on (it cannot stall)."""
    with _clock(trial_dir) as clock:
        if due is None:
            clock["due"].pop(trial_id, None)
        else:
            clock["due"][trial_id] = due
        hold = clock.setdefault("hold", {"ids": [], "seen": []})
        if trial_id in hold["ids"]:
            hold["ids"].remove(trial_id)  # polled again: what it showed was read
        if due is None or revealed:
            hold["ids"].append(trial_id)
            return
        if hold["ids"]:
            if trial_id not in hold["seen"]:
                hold["seen"].append(trial_id)
                return  # a trial polled once after something the tuner has not answered yet
            hold["ids"] = []  # polled twice with no answer: the consumer does not collect; the clock goes on
        clock.pop("hold")
        pending = list(clock["due"].values())
        if pending and min(pending) > clock["now"]:
            clock["now"] = min(pending)


def virtual_clock(trials_dir: str | os.PathLike) -> dict[str, Any]:
    """The virtual clock of a run's trials directory (``{}`` when the run used another clock)."""
    try:
        return json.loads((Path(trials_dir) / CLOCK_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The learning state saved in a simulated checkpoint directory.

    Raises:
        ValueError: no readable checkpoint there.
    """
    try:
        state = json.loads((Path(path) / CHECKPOINT_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise ValueError(f"`init_from`: no simulated checkpoint at {path} ({type(e).__name__}).") from None
    if not isinstance(state, dict) or "step" not in state or "progress" not in state:
        raise ValueError(f"`init_from`: {path} does not hold a simulated learning state.")
    return state


def sim_usage(trial_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``sim_state.json`` of a simulated trial (``{}`` when the directory holds none)."""
    try:
        return json.loads((Path(trial_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


__all__ = ["SimRunner", "read_checkpoint", "sim_usage", "virtual_clock"]
