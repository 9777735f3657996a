"""The trial-runner conformance suite, shipped so a plugin author can run it on their own backend.

Every builtin backend passes it (mart's tests run it over local, sim and a verl stand-in). It checks what
the tuner relies on: a base config that validates, ``launch`` returning at once with a serialisable
handle, metric lines read incrementally (each step once, in order, up to the horizon, with the metrics
the objectives read), a final ``status.json``, ``poll``/``stop`` working from a *fresh* runner - as
after a tuner restart - with a prompt, final ``stopped``, and two trials side by side (``--parallel``), one stopped
while the other completes, unless ``max_parallel_trials`` says the backend holds one.

No test framework is needed: each check raises ``ConformanceError`` (an ``AssertionError``, so pytest
reports it as a failed test) naming what broke. In a pytest suite::

    from mart.trial_runner.testing import RunnerConformance

    def test_my_backend_conforms(tmp_path):
        RunnerConformance(lambda: make_backend(step_s=0.01)).run_all(tmp_path)

or from a shell, for a factory that needs no options::

    python -m mart.trial_runner.testing my_package.backend:make_backend
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.search_space import SearchSpace
from mart.state.trials import TrialHandle, TrialPoll, TrialSpec
from mart.trial_runner.base import Backend, TrialRunner, read_status

__all__ = ["ConformanceError", "RunnerConformance"]


class ConformanceError(AssertionError):
    """A backend broke the trial-runner contract (the message says which rule)."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConformanceError(message)


@dataclass
class RunnerConformance:
    """The checks, bound to one backend.

    Args:
        make_backend: builds a fresh backend (called again to get a "restarted tuner's" runner).
        overrides: config keys applied over ``base_config()`` for every trial (e.g. a smaller model).
        short_steps: horizon of the trial that must complete.
        long_steps: horizon of the trial that is stopped: long enough to still run after its first step.
        expected_metrics: keys every training step (step >= 1) must report.
        timeout_s: how long a trial may take to complete (and to report its first step).
        stop_within_s: how long ``stop(grace_s=2)`` may take.
    """

    make_backend: Callable[[], Backend]
    overrides: dict[str, Any] = field(default_factory=dict)
    short_steps: int = 3
    long_steps: int = 400
    expected_metrics: tuple[str, ...] = ("perf/throughput",)
    timeout_s: float = 120.0
    stop_within_s: float = 5.0

    # --- the checks ------------------------------------------------------------------------------------
    def check_backend(self) -> Backend:
        """The backend's own members: types, a base config that validates, a runner."""
        backend = self.make_backend()
        _check(isinstance(backend, Backend), f"the factory returned {type(backend).__name__}, not a Backend")
        _check(isinstance(backend.name, str) and backend.name not in ("", "base"),
               "Backend.name must be set to the backend's own name")
        space = backend.search_space()
        _check(isinstance(space, SearchSpace), "search_space() must return a SearchSpace")
        config = self._config(backend)
        missing = [p.key for p in space.params if p.key not in config]
        _check(not missing, f"base_config() lacks the search space's keys {missing}")
        errors = backend.validate_config(config)
        _check(errors == [], f"the base config (with the suite's overrides) does not validate: {errors}")
        _check(isinstance(backend.make_runner(), TrialRunner), "make_runner() must return a TrialRunner")
        return backend

    def check_completes(self, workdir: str | Path) -> TrialHandle:
        """A short trial completes; its metrics arrive incrementally, each step once; a fresh runner agrees."""
        backend = self.make_backend()
        runner = backend.make_runner()
        t0 = time.monotonic()
        handle = runner.launch(self._spec(backend, self.short_steps, workdir, "conformance-complete"))
        _check(time.monotonic() - t0 < min(self.timeout_s, 60.0), "launch() must return at once, not wait for the trial")
        _check(isinstance(handle, TrialHandle), "launch() must return a TrialHandle")
        _check(TrialHandle.model_validate_json(handle.model_dump_json()) == handle,
               "the handle does not survive a JSON round trip (it is stored in the ledger and the checkpoint)")
        tail = runner.metrics(handle)
        seen: list[StepRecord] = []
        deadline = time.monotonic() + self.timeout_s
        while not (poll := self._poll(runner, handle)).status.is_finished():
            _check(time.monotonic() < deadline, f"the {self.short_steps}-step trial did not finish in {self.timeout_s:g} s")
            seen += tail.read_new()
            time.sleep(0.05)
        seen += tail.read_new()
        _check(poll.status is TrialStatus.COMPLETED, f"the trial ended {poll.status.value}: {poll.reason}")
        steps = [r.step for r in seen]
        _check(steps == sorted(set(steps)), f"metric steps must arrive once each and in order, got {steps}")
        _check(bool(steps) and steps[-1] == self.short_steps,
               f"the last metric step must be the horizon {self.short_steps}, got {steps[-1:] or 'none'}")
        for rec in seen:
            if rec.step >= 1:
                absent = [k for k in self.expected_metrics if k not in rec.data]
                _check(not absent, f"step {rec.step} lacks the metrics {absent}")
        prefix = backend.score_metric_prefix
        _check(any(k.startswith(prefix) for k in seen[-1].data),
               f"the last step reports no validation score under score_metric_prefix {prefix!r}")
        status = read_status(handle.trial_dir)
        _check(status is not None and status.status is TrialStatus.COMPLETED,
               f"status.json must say completed, got {status}")
        fresh = self.make_backend().make_runner()
        _check(self._poll(fresh, handle).status is TrialStatus.COMPLETED,
               "a fresh runner (a resumed tuner) must see the same final status through the handle")
        return handle

    def check_stop(self, workdir: str | Path) -> TrialHandle:
        """A running trial is stopped from a fresh runner, promptly and for good."""
        backend = self.make_backend()
        runner = backend.make_runner()
        handle = runner.launch(self._spec(backend, self.long_steps, workdir, "conformance-stop"))
        tail = runner.metrics(handle)
        deadline = time.monotonic() + self.timeout_s
        while not [r for r in tail.read_new() if r.step >= 1]:
            poll = self._poll(runner, handle)
            _check(poll.status is TrialStatus.RUNNING,
                   f"the {self.long_steps}-step trial ended ({poll.status.value}: {poll.reason}) before its first "
                   "step: raise long_steps")
            _check(time.monotonic() < deadline, f"no training step reported within {self.timeout_s:g} s")
            time.sleep(0.05)
        other = self.make_backend().make_runner()  # as after a tuner restart
        _check(self._poll(other, handle).status is TrialStatus.RUNNING,
               "a fresh runner must see the running trial through the handle")
        t0 = time.monotonic()
        poll = other.stop(handle, reason="conformance stop", grace_s=2.0)
        took = time.monotonic() - t0
        _check(took < self.stop_within_s, f"stop(grace_s=2) took {took:.1f} s (limit {self.stop_within_s:g} s)")
        _check(isinstance(poll, TrialPoll) and poll.status is TrialStatus.STOPPED,
               f"stop() must return status stopped, got {poll}")
        deadline = time.monotonic() + 10.0
        while not (final := self._poll(runner, handle)).status.is_finished():
            _check(time.monotonic() < deadline, "the launching runner still sees the stopped trial running")
            time.sleep(0.05)
        _check(final.status is TrialStatus.STOPPED, f"after stop() the trial must stay stopped, got {final.status.value}")
        status = read_status(handle.trial_dir)
        _check(status is not None and status.status is TrialStatus.STOPPED,
               f"status.json must say stopped, got {status}")
        return handle

    def check_two_at_once(self, workdir: str | Path) -> tuple[TrialHandle, TrialHandle]:
        """Two trials launched side by side (``mart tune --parallel 2``) both run, each reports its own steps in its
        own directory, one can be stopped while the other completes, and ``max_parallel_trials`` is an int >= 1 or
        None. Skipped (returns early) when the backend holds one trial at a time."""
        backend = self.make_backend()
        cap = backend.max_parallel_trials()
        _check(cap is None or (isinstance(cap, int) and cap >= 1),
               f"max_parallel_trials() must be None or an int >= 1, got {cap!r}")
        _check(isinstance(backend.parallel_limit_reason(), str), "parallel_limit_reason() must return a str")
        if cap == 1:
            return ()  # type: ignore[return-value]
        runner = backend.make_runner()
        keep = runner.launch(self._spec(backend, self.short_steps, workdir, "conformance-pair-a"))
        drop = runner.launch(self._spec(backend, self.long_steps, workdir, "conformance-pair-b"))
        _check(keep.trial_dir != drop.trial_dir, "two trials must have directories of their own")
        tails = {keep.trial_id: runner.metrics(keep), drop.trial_id: runner.metrics(drop)}
        seen: dict[str, list[int]] = {keep.trial_id: [], drop.trial_id: []}
        deadline = time.monotonic() + self.timeout_s
        stopped = False
        while True:
            for tid, tail in tails.items():
                seen[tid] += [r.step for r in tail.read_new()]
            if not stopped:
                self._poll(runner, drop)  # a poll may be what advances a trial (the simulator's clocks)
            if not stopped and any(s >= 1 for s in seen[drop.trial_id]):
                poll = runner.stop(drop, reason="conformance stop of one of two", grace_s=2.0)
                _check(poll.status is TrialStatus.STOPPED, f"stopping one of two trials must stop it, got {poll}")
                stopped = True
            done = self._poll(runner, keep)
            if done.status.is_finished() and stopped:
                break
            _check(time.monotonic() < deadline, f"two trials side by side did not finish/stop in {self.timeout_s:g} s")
            time.sleep(0.05)
        seen[keep.trial_id] += [r.step for r in tails[keep.trial_id].read_new()]
        _check(done.status is TrialStatus.COMPLETED,
               f"the trial beside a stopped one must complete, it ended {done.status.value}: {done.reason}")
        _check(seen[keep.trial_id][-1:] == [self.short_steps] and
               seen[keep.trial_id] == sorted(set(seen[keep.trial_id])),
               f"the completed trial's steps must arrive once each up to its horizon, got {seen[keep.trial_id]}")
        _check(self._poll(runner, drop).status is TrialStatus.STOPPED, "the stopped trial must stay stopped")
        return keep, drop

    def run_all(self, workdir: str | Path) -> list[str]:
        """Every check, in order; returns the names of those that passed (all, or it raises)."""
        workdir = Path(workdir)
        done = []
        for name, check in self.checks(workdir):
            check()
            done.append(name)
        return done

    def checks(self, workdir: str | Path) -> Iterable[tuple[str, Callable[[], object]]]:
        """(name, zero-argument check) pairs, e.g. to report each one separately."""
        workdir = Path(workdir)
        yield "backend", self.check_backend
        yield "completes", lambda: self.check_completes(workdir)
        yield "stop", lambda: self.check_stop(workdir)
        yield "two at once", lambda: self.check_two_at_once(workdir)

    # --- helpers ---------------------------------------------------------------------------------------
    def _config(self, backend: Backend) -> dict[str, Any]:
        return {**backend.base_config(), **self.overrides}

    def _spec(self, backend: Backend, steps: int, workdir: str | Path, name: str) -> TrialSpec:
        trial_dir = Path(workdir) / name
        trial_dir.mkdir(parents=True, exist_ok=False)  # a trial directory of its own, never a reused one
        return TrialSpec(trial_id=name, config=self._config(backend), steps=steps, trial_dir=str(trial_dir),
                         memory_capacity_gb=backend.memory_capacity_gb(), seed=0)

    @staticmethod
    def _poll(runner: TrialRunner, handle: TrialHandle) -> TrialPoll:
        poll = runner.poll(handle)
        _check(isinstance(poll, TrialPoll), f"poll() must return a TrialPoll, got {type(poll).__name__}")
        return poll


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mart.trial_runner.testing",
        description="Run the trial-runner conformance suite on a backend (`package.module:factory` or a builtin "
                    "name; the factory is called without options).")
    parser.add_argument("backend")
    parser.add_argument("--short-steps", type=int, default=3, help="horizon of the trial that must complete")
    parser.add_argument("--long-steps", type=int, default=400, help="horizon of the trial that is stopped")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="how long a trial may take")
    parser.add_argument("--workdir", default=None, help="where the trial directories go (default: a temp dir)")
    args = parser.parse_args(argv)
    from mart.trial_runner.registry import load_backend

    suite = RunnerConformance(lambda: load_backend(args.backend), short_steps=args.short_steps,
                              long_steps=args.long_steps, timeout_s=args.timeout_s)
    with tempfile.TemporaryDirectory(prefix="mart-conformance-") as tmp:
        workdir = Path(tempfile.mkdtemp(prefix="conformance-", dir=args.workdir) if args.workdir else tmp)
        for name, check in suite.checks(workdir):
            try:
                check()
            except (ConformanceError, ValueError) as e:
                print(f"FAIL {name}: {e}", file=sys.stderr)
                return 1
            print(f"ok   {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
