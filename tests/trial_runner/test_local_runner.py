"""Trials as OS processes: metrics contract, status and exit codes, determinism, SIGTERM, oom, re-attach."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mart.state.metrics import parse_line
from mart.state.models import TrialStatus
from mart.state.trials import TrialHandle, TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.runner import LocalRunner
from mart.trial_runner.registry import load_backend
from tests.support.trials import wait_finished

pytestmark = pytest.mark.timeout(180)

NOT_DETERMINISTIC = ("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step", "perf/max_memory",
                     "perf/cpu_memory", "mart/compared_", "mart/cpu_share")


def _spec(tmp_path: Path, name: str, overrides: dict, steps: int, **kw) -> TrialSpec:
    config = {**LocalBackend().base_config(), **overrides}
    return TrialSpec(trial_id=name, config=config, steps=steps, trial_dir=str(tmp_path / name), **kw)



def _wait(runner, handle, timeout_s: float = 120):
    return wait_finished(runner, handle, timeout_s)


def _wait_step(runner, handle, step: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    tail = runner.metrics(handle)
    while time.monotonic() < deadline:
        if any(r.step >= step for r in tail.read_new()):
            return
        assert runner.poll(handle).status is TrialStatus.RUNNING, runner.poll(handle)
        time.sleep(0.05)
    raise AssertionError(f"no step {step} in {timeout_s} s")


def _records(trial_dir: str) -> list:
    lines = Path(trial_dir, "metrics.jsonl").read_text().splitlines()
    return [parse_line(line) for line in lines]


def test_backend_plugin_surface():
    backend = load_backend("local", memory_capacity_gb=1.5)
    with pytest.raises(ValueError, match="takes no option 'entrypoint', 'scenario'; valid options: memory_capacity_gb"):
        load_backend("local", memory_capacity_gb=1.5, entrypoint="x", scenario="x")
    assert isinstance(backend, LocalBackend) and backend.name == "local"
    assert backend.memory_capacity_gb() == 1.5
    assert LocalBackend().memory_capacity_gb() > 0
    assert backend.score_metric_prefix == "val-core/"
    runner = backend.make_runner()
    assert isinstance(runner, LocalRunner) and runner.memory_capacity_gb == 1.5
    spec = _spec(Path("/tmp/x"), "t", {}, 3, seed=5)
    argv = runner.build_command(spec)
    assert argv[0] == sys.executable and argv[argv.index("-m") + 1] == "mart.trial_runner.local"
    assert argv[argv.index("--steps") + 1] == "3" and argv[argv.index("--seed") + 1] == "5"
    assert argv[argv.index("--memory-capacity-gb") + 1] == "1.5"


def test_two_trials_complete_with_verl_metrics_and_equal_seeds_give_equal_metrics(tmp_path, local_tiny_config):
    runner = LocalRunner()
    steps = 6
    # a base model no other test uses: the three trials race to create it, exactly one trains it
    local_tiny_config = {**local_tiny_config, "local.base_model.warmup_steps": 101}
    handles = [runner.launch(_spec(tmp_path, name, local_tiny_config, steps, seed=3)) for name in ("a", "b")]
    other = runner.launch(_spec(tmp_path, "c", local_tiny_config, 2, seed=4))
    for h in handles + [other]:
        assert h.pid and h.pid_create_time
        poll = _wait(runner, h)
        assert poll.status is TrialStatus.COMPLETED, (poll, Path(h.trial_dir, "trial.log").read_text()[-2000:])
    logs = [Path(h.trial_dir, "trial.log").read_text() for h in handles + [other]]
    assert sum("training the base model" in log for log in logs) == 1
    recs = _records(handles[0].trial_dir)
    assert [r.step for r in recs] == list(range(steps + 1))
    assert set(recs[0].data) >= {"val-core/digit_sort/reward/mean@1", "timing_s/testing"}
    for r in recs[1:]:
        for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor",
                    "timing_s/step", "perf/total_num_tokens", "perf/throughput", "perf/time_per_step",
                    "perf/max_memory_allocated_gb", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac",
                    "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr", "critic/score/mean",
                    "critic/score/max", "critic/score/min", "response_length/mean", "response_length/max",
                    "response_length/min", "response_length/clip_ratio", "training/global_step",
                    "mart/compared_s/gen", "mart/compared_s/update_actor", "mart/compared_s/step",
                    "mart/compared_throughput", "mart/cpu_share"):
            assert key in r.data and math.isfinite(r.data[key]), (r.step, key)
        assert r.data["training/global_step"] == r.step
        assert r.data["perf/throughput"] == pytest.approx(r.data["perf/total_num_tokens"] / r.data["timing_s/step"])
        # stage 1's figure: tokens per CPU-second of the trainer thread (one torch thread), never above wall time
        assert r.data["mart/compared_throughput"] == pytest.approx(
            r.data["perf/total_num_tokens"] / r.data["mart/compared_s/step"])
        assert 0 < r.data["mart/compared_s/step"] <= r.data["timing_s/step"] + 0.02
        assert r.data["perf/max_memory_allocated_gb"] > 0
        phases = sum(r.data[f"timing_s/{k}"] for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor"))
        assert phases <= r.data["timing_s/step"] + 1e-6
    # validation at test_freq (5) and at the last step
    assert [r.step for r in recs if "val-core/digit_sort/reward/mean@1" in r.data] == [0, 5, 6]
    # the same seed gives the same metrics, timings and memory aside; another seed does not
    strip = lambda rs: [{k: v for k, v in r.data.items() if not k.startswith(NOT_DETERMINISTIC)} for r in rs]
    assert strip(recs) == strip(_records(handles[1].trial_dir))
    assert strip(recs)[1] != strip(_records(other.trial_dir))[1]
    status = json.loads(Path(handles[0].trial_dir, "status.json").read_text())
    launch = status.pop("launch")  # every launch carries a token, so that a resumed tuner can prove it started it
    assert status == {"status": "completed", "reason": None, "last_step": steps}
    assert launch["pid"] == handles[0].pid and len(launch["token"]) == 16
    cfg = json.loads(Path(handles[0].trial_dir, "config.json").read_text())
    assert cfg["trainer.total_training_steps"] == steps and cfg["seed"] == 3
    # no zombies left behind
    assert runner._groups == {}


def test_sigterm_stops_promptly(tmp_path, local_tiny_config):
    runner = LocalRunner()
    handle = runner.launch(_spec(tmp_path, "long", local_tiny_config, 10_000))
    _wait_step(runner, handle, 2)
    running = runner.poll(handle)
    assert running.status is TrialStatus.RUNNING and running.last_step >= 2
    t0 = time.monotonic()
    os.kill(handle.pid, signal.SIGTERM)
    poll = _wait(runner, handle, 30)
    # the trainer checks for SIGTERM between steps (~0.1 s each); a generous bound so a loaded box passes,
    # still far below what ignoring the signal costs (the run would go on for 10,000 steps)
    assert time.monotonic() - t0 < 10.0
    assert poll.status is TrialStatus.STOPPED and "SIGTERM" in poll.reason
    assert runner._exit_codes[handle.pid] == 4
    assert poll.last_step >= 2
    last = _records(handle.trial_dir)[-1]  # every line is whole
    assert last.step == poll.last_step


def test_stop_through_a_handle_from_another_runner(tmp_path, local_tiny_config):
    owner = LocalRunner()
    handle = owner.launch(_spec(tmp_path, "long", local_tiny_config, 10_000))
    _wait_step(owner, handle, 1)
    stranger = LocalRunner()  # e.g. a resumed tuner: it only has the serialised handle
    again = TrialHandle.model_validate_json(handle.model_dump_json())
    assert stranger.poll(again).status is TrialStatus.RUNNING
    t0 = time.monotonic()
    poll = stranger.stop(again, reason="stopped by the test", grace_s=5)
    assert time.monotonic() - t0 < 2.5
    assert poll.status is TrialStatus.STOPPED and poll.reason == "stopped by the test"
    assert read_status(handle.trial_dir).reason == "stopped by the test"
    assert owner.poll(handle).status is TrialStatus.STOPPED  # the owner reaps its child
    assert owner._exit_codes[handle.pid] == 4
    # a recycled pid is not mistaken for the trial
    fake = handle.model_copy(update={"pid": os.getpid(), "pid_create_time": 1.0})
    assert stranger.poll(fake).status is TrialStatus.STOPPED


def test_a_killed_trial_is_failed_with_a_reason_and_stop_leaves_a_status(tmp_path, local_tiny_config):
    runner = LocalRunner()
    handle = runner.launch(_spec(tmp_path, "killed", local_tiny_config, 10_000))
    _wait_step(runner, handle, 1)
    os.killpg(handle.pid, signal.SIGKILL)
    poll = _wait(runner, handle, 10)
    assert poll.status is TrialStatus.FAILED and "SIGKILL" in poll.reason
    assert read_status(handle.trial_dir) is None
    # another runner (no exit code to read) still says why
    poll2 = LocalRunner().poll(handle)
    assert poll2.status is TrialStatus.FAILED and "without writing a status" in poll2.reason
    final = runner.stop(handle, reason="cleanup")
    assert final.status is TrialStatus.STOPPED and final.last_step >= 1


def test_memory_capacity_ends_the_trial_as_oom(tmp_path, local_tiny_config):
    """Setup fits (about 0.01 GB), the update's activations do not (about 0.05 GB): oom mid-step, at once."""
    hungry = {**local_tiny_config, "local.model.block_size": 64, "data.max_response_length": 56,
              "actor_rollout_ref.model.use_remove_padding": False, "trainer.val_before_train": False,
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64}
    runner = LocalRunner()
    handle = runner.launch(_spec(tmp_path, "oom", hungry, 10_000, memory_capacity_gb=0.03))
    poll = _wait(runner, handle, 60)
    assert poll.status is TrialStatus.OOM, (poll, Path(handle.trial_dir, "trial.log").read_text()[-2000:])
    assert "exceeded the capacity 0.03 GB during update_actor" in poll.reason
    assert runner._exit_codes[handle.pid] == 3
    # it ended at its first step of 10,000 (within _wait's bound): no wall-clock assert on a shared box
    assert poll.last_step == 0


def test_peak_memory_grows_with_micro_batch_and_response_length(tmp_path, local_tiny_config):
    """Measured, not modelled: larger micro-batches and longer padded responses hold more activations;
    gradient checkpointing holds fewer."""
    base = {**local_tiny_config, "local.model.block_size": 64, "data.max_response_length": 16,
            "actor_rollout_ref.model.use_remove_padding": False, "trainer.test_freq": -1,
            "trainer.val_before_train": False, "actor_rollout_ref.actor.ppo_mini_batch_size": 8}
    configs = {
        "micro4": {**base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4},
        "micro64": {**base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64},
        "micro64_long": {**base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64,
                         "data.max_response_length": 56},
        "micro64_ckpt": {**base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64,
                         "actor_rollout_ref.model.enable_gradient_checkpointing": True},
    }
    runner = LocalRunner()
    handles = {name: runner.launch(_spec(tmp_path, name, cfg, 3)) for name, cfg in configs.items()}
    peak = {}
    for name, h in handles.items():
        assert _wait(runner, h).status is TrialStatus.COMPLETED
        peak[name] = max(r.data["perf/max_memory_allocated_gb"] for r in _records(h.trial_dir))
    print(peak)
    assert peak["micro64"] > 1.3 * peak["micro4"], peak
    assert peak["micro64_long"] > 1.3 * peak["micro64"], peak
    assert peak["micro64_ckpt"] < 0.9 * peak["micro64"], peak


def test_bad_config_fails_before_any_step(tmp_path):
    runner = LocalRunner()
    handle = runner.launch(_spec(tmp_path, "bad", {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 48}, 3))
    poll = _wait(runner, handle, 60)
    assert poll.status is TrialStatus.FAILED and "ppo_micro_batch_size_per_gpu" in poll.reason
    assert runner._exit_codes[handle.pid] == 2
    assert not Path(handle.trial_dir, "metrics.jsonl").exists()


def test_worker_command_line(tmp_path, local_tiny_config):
    """``python -m mart.trial_runner.local`` runs without a runner, too (its defaults plus --config)."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**local_tiny_config, "trainer.val_before_train": False, "trainer.test_freq": -1}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "mart.trial_runner.local", "--out", str(out), "--steps", "2",
                           "--config", str(cfg), "--seed", "1"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step:2" in proc.stdout
    assert [r.step for r in _records(str(out))] == [1, 2]


def test_a_stop_never_lands_between_a_metric_line_and_the_step_count():
    # issue 28: SIGTERM between writing step N's line and counting it made status.json say N-1 (a step count that
    # went backwards); the worker holds the signal for that block and takes it right after
    import subprocess
    import sys

    code = ("import os, signal\n"
            "from mart.trial_runner.local.worker import _signals_held\n"
            "done = []\n"
            "def stop(*_): raise SystemExit('stopped after ' + ','.join(done))\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "with _signals_held():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    done.append('line')\n"
            "    done.append('count')\n"
            "print('not reached')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "stopped after line,count" in out.stderr and "not reached" not in out.stdout


def test_a_stage1_trial_of_the_embedded_trainer_writes_no_validation(tmp_path, local_tiny_config):
    # TrialSpec.stage == "system": the worker's config turns validation off (verl's keys), so stage 1 times
    # training steps only, as verl's runner runs them
    runner = LocalRunner()
    h = runner.launch(_spec(tmp_path, "sys", local_tiny_config, 2, seed=3, stage="system"))
    poll = _wait(runner, h)
    assert poll.status is TrialStatus.COMPLETED, Path(h.trial_dir, "trial.log").read_text()[-2000:]
    recs = _records(h.trial_dir)
    assert [r.step for r in recs] == [1, 2]
    assert not [r.step for r in recs if any(k.startswith("val-core/") for k in r.data)]
    cfg = json.loads(Path(h.trial_dir, "config.json").read_text())
    assert cfg["trainer.test_freq"] == -1 and cfg["trainer.val_before_train"] is False
