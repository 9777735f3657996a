"""How a local step is timed, and the one place its compared throughput is computed.

Every phase, and the whole step, is timed on two clocks:

- the wall clock: verl's ``timing_s/<phase>``, ``timing_s/step`` and ``perf/throughput`` (tokens / step wall time),
  what a user waits for;
- the *compared* clock: ``mart/compared_s/<phase>``, ``mart/compared_s/step`` and ``mart/compared_throughput``
  (tokens / compared step seconds), what stage 1 ranks configs by (``mart.state.metrics.step_throughput``).

On the CPU with one torch thread (the default) the compared clock is the trainer thread's own CPU time
(``time.thread_time``: CLOCK_THREAD_CPUTIME_ID, user + system). A shared 2-core laptop's wall clock measures the
machine as much as the config: when other processes want the cores the scheduler time-slices the trainer and its
phases stretch, all of them alike, by however much CPU the others took at that moment (three default sessions read
the same baseline at 3,095, 457 and 344 tok/s). The thread's CPU time counts only the slices it ran, so the config's
cost stays put while the machine is busy. ``mart/cpu_share`` (CPU / wall over the step: ~1 idle, ~0.3 when three
runnable threads share a core) says how contended the step was.

What CPU time does not remove, and how it is handled:

- work that runs slower per CPU-second under load: caches and TLBs refilled after the other process ran, memory
  bandwidth and (on a machine with SMT) a busy sibling hyperthread, a lower clock frequency when every core is busy.
  These inflate CPU time too (measured in docs/backends.md); pairing or repeating measurements (stage 1's
  re-measurement) is what handles them.
- several threads: with ``local.num_threads`` > 1 the intra-op workers do the work on other threads (this thread's
  CPU time misses it) and spin-wait for each other (process CPU time would count the waiting, more of it the busier the
  machine), and a config that runs more threads than another is faster by wall clock, never by CPU time. So with more
  than one torch thread the compared clock is the wall clock.
- CUDA: kernels run asynchronously and the host thread spins in ``synchronize``; on CUDA the compared clock is the wall
  clock.
- ``local.throughput_clock=wall`` compares wall time in any case (an idle, dedicated machine; or a tuning of the thread
  count itself).

The memory watchdog samples on a thread of its own: its CPU time is not the workload's, and the trainer thread's clock
leaves it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

CPU, WALL = "cpu", "wall"


def compared_clock(setting: str, device_type: str, threads: int) -> str:
    """The clock stage 1 compares a trial's steps on: the trainer thread's CPU time when that thread does all the work
    (one torch thread on the CPU), else the wall clock (see the module's docstring)."""
    if setting == WALL or device_type != "cpu" or threads != 1:
        return WALL
    return CPU


class Timer:
    """Collects each phase's wall and CPU seconds; synchronises CUDA so a phase owns its kernels.

    ``on_enter(name)`` / ``on_exit(name)`` run around each phase (the worker names the phase for the memory watchdog
    and checks the peak after it). ``wall`` and ``cpu`` are the clocks (``time.perf_counter``, ``time.thread_time``;
    tests pass fakes).
    """

    def __init__(self, device: torch.device, on_enter: Callable[[str], None] | None = None,
                 on_exit: Callable[[str], None] | None = None, *, clock: str = CPU,
                 wall: Callable[[], float] = time.perf_counter, cpu: Callable[[], float] = time.thread_time) -> None:
        self.device = device
        self.on_enter, self.on_exit = on_enter, on_exit
        self.clock = clock
        self._wall, self._cpu = wall, cpu
        self.times: dict[str, float] = {}  # wall seconds per phase
        self.cpu_times: dict[str, float] = {}  # this thread's CPU seconds per phase
        self.step_wall = self.step_cpu = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.on_enter is not None:
            self.on_enter(name)
        self._sync()
        w0, c0 = self._wall(), self._cpu()
        yield
        self._sync()
        self.times[name] = self.times.get(name, 0.0) + self._wall() - w0
        self.cpu_times[name] = self.cpu_times.get(name, 0.0) + self._cpu() - c0
        if self.on_exit is not None:
            self.on_exit(name)

    @contextmanager
    def step(self) -> Iterator[None]:
        """The whole step (its phases and what runs between them)."""
        self._sync()
        w0, c0 = self._wall(), self._cpu()
        yield
        self._sync()
        self.step_wall, self.step_cpu = self._wall() - w0, self._cpu() - c0

    def metrics(self, tokens: float) -> dict[str, float]:
        """The step's timing metrics (wall and compared), ``tokens`` being the step's ``perf/total_num_tokens``."""
        compared = self.cpu_times if self.clock == CPU else self.times
        compared_step = self.step_cpu if self.clock == CPU else self.step_wall
        out = {f"timing_s/{k}": v for k, v in self.times.items()}
        out.update({f"mart/compared_s/{k}": v for k, v in compared.items()})
        out.update({
            "timing_s/step": self.step_wall,
            "perf/time_per_step": self.step_wall,
            "perf/throughput": tokens / self.step_wall,
            "mart/compared_s/step": compared_step,
            "mart/compared_throughput": tokens / max(compared_step, 1e-9),
        })
        if self.clock == CPU:
            out["mart/cpu_share"] = self.step_cpu / self.step_wall
        return out
