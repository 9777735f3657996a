"""The local trainer's compared throughput (what stage 1 ranks configs by) is timed on the trainer thread's CPU time, so
a busy machine that stretches the wall clock does not move it; the wall-clock figures stay in verl's keys."""

from __future__ import annotations

import time

import pytest
import torch

from mart.state.metrics import StepRecord, compared_phase_times, phase_seconds, step_throughput
from mart.state.objectives import system_throughput
from mart.trial_runner.local import grpo
from mart.trial_runner.local.config import load_config
from mart.trial_runner.local.grpo import GRPOTrainer, model_config
from mart.trial_runner.local.model import GPT
from mart.trial_runner.local.timing import CPU, WALL, Timer, compared_clock
from tests.conftest import LOCAL_TINY_CONFIG

DEV = torch.device("cpu")


class FakeClocks:
    """A CPU clock that advances by the work done, and a wall clock that advances ``stretch`` times as much: a machine
    whose other processes take (stretch - 1) / stretch of the core."""

    def __init__(self, stretch: float) -> None:
        self.stretch, self.cpu, self.wall = stretch, 0.0, 0.0

    def work(self, cpu_s: float) -> None:
        self.cpu += cpu_s
        self.wall += cpu_s * self.stretch


def _fake_step(stretch: float) -> dict[str, float]:
    clocks = FakeClocks(stretch)
    timer = Timer(DEV, clock=CPU, wall=lambda: clocks.wall, cpu=lambda: clocks.cpu)
    with timer.step():
        with timer.phase("gen"):
            clocks.work(0.3)
        clocks.work(0.01)  # between phases
        with timer.phase("update_actor"):
            clocks.work(0.6)
    return timer.metrics(tokens=1820)


def test_compared_throughput_does_not_move_when_the_machine_stretches_wall_time():
    idle, busy = _fake_step(1.0), _fake_step(3.0)
    assert busy["mart/compared_throughput"] == pytest.approx(idle["mart/compared_throughput"])
    assert idle["mart/compared_throughput"] == pytest.approx(1820 / 0.91)
    for phase in ("gen", "update_actor", "step"):
        assert busy[f"mart/compared_s/{phase}"] == pytest.approx(idle[f"mart/compared_s/{phase}"])
    # the wall-clock figures (verl's keys) do show the busy machine, and the CPU share says how busy it was
    assert busy["perf/throughput"] == pytest.approx(idle["perf/throughput"] / 3)
    assert busy["timing_s/gen"] == pytest.approx(0.9) and busy["timing_s/step"] == pytest.approx(2.73)
    assert idle["mart/cpu_share"] == pytest.approx(1.0) and busy["mart/cpu_share"] == pytest.approx(1 / 3)
    # stage 1 reads the compared figure, so its objective agrees on both machines
    recs = {s: [StepRecord(step, dict(m)) for step in range(1, 7)] for s, m in (("idle", idle), ("busy", busy))}
    assert system_throughput(recs["busy"], 6) == pytest.approx(system_throughput(recs["idle"], 6))
    assert system_throughput(recs["busy"], 6) == pytest.approx(busy["mart/compared_throughput"])


def test_time_a_phase_spends_waiting_is_not_compared_time():
    timer = Timer(DEV, clock=CPU)
    with timer.step():
        with timer.phase("gen"):
            time.sleep(0.2)  # off the CPU, as when another process holds the core
    m = timer.metrics(tokens=100)
    assert m["timing_s/gen"] >= 0.2 and m["timing_s/step"] >= 0.2
    assert m["mart/compared_s/gen"] < 0.05 and m["mart/compared_s/step"] < 0.05
    assert m["mart/compared_throughput"] > 4 * m["perf/throughput"]


def test_trainer_step_slowed_off_cpu_in_generation_keeps_its_compared_times(monkeypatch):
    """A real GRPO step whose generation is held up off the CPU: the wall figures grow by the delay, the compared
    (CPU) figures of the phase and of the step do not contain it, and update_actor, which nothing touched, is the same
    on both clocks' terms."""
    cfg = load_config(dict(LOCAL_TINY_CONFIG))
    base = GPT(model_config(cfg)).state_dict()
    real_generate = grpo.generate

    def delayed(*a, **kw):
        time.sleep(0.3)
        return real_generate(*a, **kw)

    monkeypatch.setattr(grpo, "generate", delayed)
    timer = Timer(DEV, clock=CPU)
    trainer = GRPOTrainer(cfg, base, DEV, total_steps=2)
    with timer.step():
        m = trainer.step(timer)
    m.update(timer.metrics(m["perf/total_num_tokens"]))
    assert m["timing_s/gen"] - m["mart/compared_s/gen"] >= 0.29
    assert m["timing_s/step"] - m["mart/compared_s/step"] >= 0.29
    assert m["mart/compared_s/step"] <= m["timing_s/step"] - 0.29
    assert m["mart/compared_s/update_actor"] <= m["timing_s/update_actor"] + 0.01
    assert m["mart/compared_throughput"] == pytest.approx(m["perf/total_num_tokens"] / m["mart/compared_s/step"])
    assert m["perf/throughput"] == pytest.approx(m["perf/total_num_tokens"] / m["timing_s/step"])


def test_compared_clock_is_the_wall_clock_where_thread_cpu_time_is_not_the_work():
    assert compared_clock("auto", "cpu", 1) == CPU
    assert compared_clock("auto", "cpu", 2) == WALL  # intra-op workers do the work on other threads
    assert compared_clock("auto", "cuda", 1) == WALL  # kernels run asynchronously
    assert compared_clock("wall", "cpu", 1) == WALL
    clocks = FakeClocks(3.0)
    timer = Timer(DEV, clock=WALL, wall=lambda: clocks.wall, cpu=lambda: clocks.cpu)
    with timer.step(), timer.phase("gen"):
        clocks.work(0.5)
    m = timer.metrics(tokens=150)
    assert m["mart/compared_throughput"] == pytest.approx(m["perf/throughput"]) == pytest.approx(100)
    assert m["mart/compared_s/gen"] == m["timing_s/gen"] and "mart/cpu_share" not in m


def test_records_without_a_compared_figure_compare_verls_wall_clock_throughput():
    verl = StepRecord(3, {"perf/throughput": 500.0, "timing_s/gen": 2.0})
    local = StepRecord(3, {"perf/throughput": 500.0, "mart/compared_throughput": 900.0, "timing_s/gen": 2.0,
                           "mart/compared_s/gen": 1.1})
    assert step_throughput(verl) == 500.0 and step_throughput(local) == 900.0
    assert phase_seconds(verl, "gen") == 2.0 and phase_seconds(local, "gen") == 1.1
    assert compared_phase_times(verl) == {"gen": 2.0} and compared_phase_times(local) == {"gen": 1.1}
    assert system_throughput([verl], 3) == 500.0 and system_throughput([local], 3) == 900.0


def test_the_job_model_and_the_progress_lines_read_the_compared_clock():
    from mart.nodes.agents.job_model import observation_from_records
    from mart.state.models import TrialRecord
    from mart.tools.watch import _progress_event

    rec = StepRecord(3, {"perf/throughput": 500.0, "mart/compared_throughput": 900.0, "timing_s/gen": 2.0,
                         "mart/compared_s/gen": 1.1, "timing_s/update_actor": 3.0, "mart/compared_s/update_actor": 1.5,
                         "timing_s/step": 5.5, "mart/compared_s/step": 2.8})
    obs = observation_from_records({}, [rec], peak_gb=None, oom=False, throughput=900.0, window=(3, 5))
    assert obs.phases["gen"] == 1.1 and obs.phases["update_actor"] == 1.5
    assert obs.phases["other"] == pytest.approx(2.8 - 1.1 - 1.5)
    trial = TrialRecord(trial_id="sys-01", stage="system", config={})
    assert _progress_event(trial, rec).throughput == 900.0
