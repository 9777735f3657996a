"""SimRunner/SimBackend: the trial contract, a progressive stream, stop, re-attach from another process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mart.state.models import TrialStatus
from mart.state.objectives import system_outcome
from mart.state.trials import TrialHandle, TrialSpec
from mart.trial_runner.base import Backend, read_status
from mart.trial_runner.registry import load_backend
from mart.trial_runner.sim import SimBackend, SimRunner, sim_usage

SC = "qwen3-0.6b-1x8"
A = "actor_rollout_ref.actor."


def spec(backend: Backend, tmp_path: Path, name: str = "t1", steps: int = 6, **over) -> TrialSpec:
    return TrialSpec(trial_id=name, config={**backend.base_config(), **over}, steps=steps, trial_dir=str(tmp_path / name),
                     memory_capacity_gb=backend.memory_capacity_gb(), seed=0)


def wait(runner, handle, timeout: float = 10.0, sleep: float = 0.01):
    deadline = time.monotonic() + timeout
    polls = []
    while time.monotonic() < deadline:
        p = runner.poll(handle)
        polls.append(p)
        if p.status.is_finished():
            return polls
        time.sleep(sleep)
    raise AssertionError("trial did not finish")


def test_backend_through_the_registry() -> None:
    backend = load_backend("sim", scenario=SC, seed=2, ray_address=None)
    with pytest.raises(ValueError, match=r"takes no option 'unknown_option'; valid options: scenario, seed"):
        load_backend("sim", scenario=SC, unknown_option=1)
    assert isinstance(backend, SimBackend) and backend.name == "sim"
    assert backend.memory_capacity_gb() == 80.0
    assert load_backend("sim", scenario=SC, memory_capacity_gb=40).memory_capacity_gb() == 40.0
    assert backend.search_space().backend == "verl"
    cfg = backend.base_config()
    assert cfg["trainer.n_gpus_per_node"] == 8 and cfg["data.max_response_length"] == 4096
    assert backend.validate_config(cfg) == []
    with pytest.raises(ValueError, match="unknown sim scenario"):
        load_backend("sim", scenario="nope")
    with pytest.raises(ValueError, match="clock"):
        SimBackend(scenario=SC, clock="sundial")


def test_conformance_wall_clock_progressive_stream(tmp_path: Path) -> None:
    """launch -> RUNNING polls with a growing stream -> final status; metrics via read_new()."""
    backend = SimBackend(scenario=SC, time_scale=None)
    runner = backend.make_runner()
    handle = runner.launch(spec(backend, tmp_path))
    tail = runner.metrics(handle)
    assert runner.poll(handle).status is TrialStatus.RUNNING
    seen, counts = [], []
    t0 = time.monotonic()
    while True:
        p = runner.poll(handle)
        seen.extend(tail.read_new())
        counts.append(len(seen))
        if p.status.is_finished():
            seen.extend(tail.read_new())
            break
        time.sleep(0.01)
    wall = time.monotonic() - t0
    assert p.status is TrialStatus.COMPLETED and p.last_step == 6
    # the wall clock paces the stream (a lower bound holds on any box); the upper bound only catches a hang
    assert 0.05 < wall < 60.0
    assert len(set(counts)) > 3  # lines arrived over several polls, not all at once
    assert [r.step for r in seen] == list(range(7))
    assert system_outcome(seen, 6, 72.0).feasible
    assert read_status(handle.trial_dir).status is TrialStatus.COMPLETED
    assert "completed" in (Path(handle.trial_dir) / "trial.log").read_text()
    u = runner.usage(handle)
    assert u["gpu_hours"] == pytest.approx(u["planned_gpu_hours"]) and u["gpu_hours"] > 0


def test_poll_clock_stop_truncates_and_saves_gpu_hours(tmp_path: Path) -> None:
    backend = SimBackend(scenario=SC, clock="poll")
    runner = backend.make_runner()
    handle = runner.launch(spec(backend, tmp_path, steps=20))
    tail = runner.metrics(handle)
    got = []
    for i in range(4):
        assert runner.poll(handle).status is TrialStatus.RUNNING
        new = tail.read_new()
        assert len(new) == 1  # one line per poll
        got.extend(new)
    final = runner.stop(handle, reason="health: entropy collapse")
    assert final.status is TrialStatus.STOPPED and final.reason == "health: entropy collapse"
    assert final.last_step == 3  # steps 0..3 were written
    assert tail.read_new() == []
    assert runner.poll(handle).status is TrialStatus.STOPPED  # final statuses stick
    assert runner.stop(handle).status is TrialStatus.STOPPED
    u = sim_usage(handle.trial_dir)
    assert 0 < u["gpu_hours"] < 0.3 * u["planned_gpu_hours"]


def test_reattach_from_another_process(tmp_path: Path) -> None:
    backend = SimBackend(scenario=SC, clock="poll")
    runner = backend.make_runner()
    handle = runner.launch(spec(backend, tmp_path, steps=5))
    runner.poll(handle)
    runner.poll(handle)
    blob = json.dumps(handle.model_dump(mode="json"))
    code = (
        "import json, sys\n"
        "from mart.trial_runner.base import TrialHandle\n"
        "from mart.trial_runner.sim import SimBackend\n"
        "h = TrialHandle(**json.loads(sys.argv[1]))\n"
        f"r = SimBackend(scenario={SC!r}, clock='poll').make_runner()\n"
        "while not r.poll(h).status.is_finished(): pass\n"
        "print(r.poll(h).status.value, len(r.read_all_metrics(h)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, blob], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["completed", "6"]
    fresh = SimRunner(SC, clock="poll")  # and a new runner in this process sees the same end
    assert fresh.poll(TrialHandle(**json.loads(blob))).status is TrialStatus.COMPLETED
    lines = (Path(handle.trial_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(6))  # nothing written twice


def test_oom_and_failed_trials(tmp_path: Path) -> None:
    backend = SimBackend(scenario="qwen3-8b-1x8", clock="poll")
    runner = backend.make_runner()
    oom = runner.launch(spec(backend, tmp_path, "oom", **{A + "ppo_micro_batch_size_per_gpu": 64}))
    polls = wait(runner, oom)
    assert polls[-1].status is TrialStatus.OOM and "out of memory" in polls[-1].reason
    assert [r.step for r in runner.read_all_metrics(oom)] == [0]
    bad = runner.launch(spec(backend, tmp_path, "bad", **{A + "ppo_micro_batch_size_per_gpu": 48}))
    p = wait(runner, bad)[-1]
    assert p.status is TrialStatus.FAILED and "micro" in p.reason
    assert runner.read_all_metrics(bad) == []


def test_steps_per_poll_caps_a_slow_poller(tmp_path: Path) -> None:
    backend = SimBackend(scenario=SC, time_scale=1e9, steps_per_poll=2)  # the wall clock alone would end it
    runner = backend.make_runner()
    handle = runner.launch(spec(backend, tmp_path, steps=10))
    time.sleep(0.05)
    runner.poll(handle)
    assert len(runner.read_all_metrics(handle)) == 2
    assert runner.stop(handle).last_step == 3  # stop never reveals more than one poll would


def test_virtual_clock_holds_a_revealed_line_until_the_trial_is_polled_again(tmp_path: Path) -> None:
    # a tuner reads a trial's new lines before its next poll and may launch at once: the shared clock must not
    # move past the instant of a line it revealed until then, or a trial started on that line starts late
    from mart.trial_runner.sim.runner import virtual_clock

    backend = SimBackend(scenario=SC, clock="virtual")
    runner = backend.make_runner()
    trials = tmp_path / "trials"
    a = runner.launch(spec(backend, trials, name="a", steps=6))
    b = runner.launch(spec(backend, trials, name="b", steps=6, **{A + "ppo_micro_batch_size_per_gpu": 2}))
    tail = runner.metrics(a)
    seen_at = None
    for _ in range(200):  # round robin, as the watch goes: read a's lines, poll a, poll b
        if any(r.step == 2 for r in tail.read_new()):
            seen_at = virtual_clock(trials)["now"]
            break
        runner.poll(a)
        runner.poll(b)
    assert seen_at is not None
    events = json.loads((trials / "a" / "sim_plan.json").read_text())["events"]
    start = json.loads((trials / "a" / "sim_trial.json").read_text())["sim_start"]
    step2 = start + next(t for t, step, _ in events if step == 2)
    assert seen_at == pytest.approx(step2, abs=1e-6)  # not the next event of a or b
    c = runner.launch(spec(backend, trials, name="c", steps=6))
    assert json.loads((trials / "c" / "sim_trial.json").read_text())["sim_start"] == pytest.approx(step2, abs=1e-6)
    # and a consumer that goes round without reading does not stall it
    before = virtual_clock(trials)["now"]
    for _ in range(6):
        runner.poll(b)
        runner.poll(c)
    assert virtual_clock(trials)["now"] > before


def test_a_stage1_trial_runs_training_steps_only_and_a_learning_trial_validates(tmp_path):
    # TrialSpec.stage == "system": a throughput trial has no validation (as verl's runner writes its command line),
    # so its GPU-hours hold training steps only; a learning trial keeps its config's validation schedule
    from mart.trial_runner.sim.trial import VAL_KEY

    backend = SimBackend(scenario=SC, clock="poll")
    runner = backend.make_runner()
    usage = {}
    for stage in ("system", "learning"):
        s = spec(backend, tmp_path, name=stage).model_copy(update={"stage": stage})
        h = runner.launch(s)
        assert wait(runner, h)[-1].status is TrialStatus.COMPLETED
        lines = [json.loads(x) for x in Path(h.trial_dir, "metrics.jsonl").read_text().splitlines()]
        validated = [x["step"] for x in lines if VAL_KEY in x["data"]]
        assert validated == ([] if stage == "system" else [0, 5, 6]), (stage, validated)
        assert [x["step"] for x in lines if "perf/throughput" in x["data"]] == list(range(1, 7))
        usage[stage] = sim_usage(h.trial_dir)["gpu_hours"]
    assert usage["system"] < usage["learning"]
