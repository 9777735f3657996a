"""VerlRunner driven for real against the stand-in entry point (tests/support/fake_verl/main_ppo.py).

Each test launches the real launcher (supervisor, process group, env, argv) and follows the run through
``poll`` like the tuner does: normal run, OOM at step 4, crash, hang (watchdog), NaN metrics, a truncated
last line, a run that ignores SIGTERM, and re-attaching from a second runner instance.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from mart.state.models import TrialStatus
from mart.state.objectives import peak_memory_gb, system_throughput
from mart.state.trials import TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.verl import VerlBackend, VerlRunner, WatchdogConfig
from tests.support.paths import FAKE_VERL
from tests.support.trials import wait_finished

FAKE = FAKE_VERL
FAST_WATCHDOG = WatchdogConfig(first_step_timeout_s=30, k=3.0, min_step_timeout_s=1.0, expected_step_s=0.1)


def make(mode: str = "normal", watchdog: WatchdogConfig = FAST_WATCHDOG, **base) -> tuple[VerlBackend, VerlRunner]:
    backend = VerlBackend(
        entrypoint=f"{sys.executable} {FAKE}",
        base_config={"fake.mode": mode, "fake.step_s": 0.02, **base},
        prevalidate=False,
        watchdog=watchdog,
        runner_options={"kill_grace_s": 1.0, "oom_exit_grace_s": 0.5, "gpu_free_threshold_gb": None},
    )
    runner = backend.make_runner()
    assert isinstance(runner, VerlRunner)
    return backend, runner



def run_to_end(runner, handle, timeout_s: float = 30.0):
    return wait_finished(runner, handle, timeout_s)


def spec_for(backend: VerlBackend, tmp_path: Path, steps: int = 5, trial_id: str = "t1", **over) -> TrialSpec:
    cfg = backend.base_config()
    cfg.update(over)
    return TrialSpec(trial_id=trial_id, config=cfg, steps=steps, trial_dir=str(tmp_path / trial_id))


def test_normal_run_writes_metrics_status_and_passes_overrides(tmp_path):
    backend, runner = make()
    spec = spec_for(backend, tmp_path, steps=5, **{"actor_rollout_ref.actor.optim.lr": 3e-6})
    handle = runner.launch(spec)
    final = run_to_end(runner, handle)
    assert final.status is TrialStatus.COMPLETED, final
    assert final.last_step == 5
    # status.json written by the runner, metrics through the generic trial-dir path and the attempt file
    assert read_status(spec.trial_dir).status is TrialStatus.COMPLETED
    recs = MetricsTail(Path(spec.trial_dir) / "metrics.jsonl").read_new()
    # mart owns the validation keys: no step-0 validation unless asked for, one at the horizon (the score)
    assert [r.step for r in recs] == [1, 2, 3, 4, 5]
    assert [r.step for r in recs if "val-core/openai/gsm8k/reward/mean@1" in r.data] == [5]
    assert system_throughput(recs, 5) > 0
    assert peak_memory_gb(recs) > 0  # read from actor/perf/max_memory_allocated_gb (0.9 name)
    assert handle.extra["metrics_path"].endswith("attempt-1/metrics.jsonl")
    # what the entry point received: typed overrides, mart's run keys, + for keys absent from verl's yaml
    argv = json.loads((Path(spec.trial_dir) / "attempt-1" / "hydra" / ".hydra" / "overrides.json").read_text())
    assert "actor_rollout_ref.actor.optim.lr=3e-06" in argv
    assert "trainer.logger=[console,file]" in argv
    assert "trainer.total_training_steps=5" in argv
    assert "trainer.test_freq=5" in argv and "trainer.val_before_train=false" in argv
    assert "trainer.resume_mode=disable" in argv
    assert "trainer.experiment_name=t1-a1" in argv
    assert "+fake.mode=normal" in argv
    assert "actor_rollout_ref.model.enable_gradient_checkpointing=true" in argv
    log = (Path(spec.trial_dir) / "trial.log").read_text()
    assert "step:5 - " in log and "np.float64(" in log
    # a fresh runner (another process after a tuner restart) classifies the ended run from exit.json
    (Path(spec.trial_dir) / "status.json").unlink()
    again = backend.make_runner().poll(type(handle).model_validate(handle.model_dump()))
    assert again.status is TrialStatus.COMPLETED and again.last_step == 5


def test_relaunch_uses_a_new_attempt_and_keeps_the_old_metrics(tmp_path):
    backend, runner = make()
    spec = spec_for(backend, tmp_path, steps=2)
    h1 = runner.launch(spec)
    assert run_to_end(runner, h1).status is TrialStatus.COMPLETED
    h2 = runner.launch(spec)
    assert run_to_end(runner, h2).status is TrialStatus.COMPLETED
    assert h2.extra["attempt"] == 2
    first = MetricsTail(Path(spec.trial_dir) / "attempt-1" / "metrics.jsonl").read_new()
    assert [r.step for r in first] == [1, 2]  # not truncated by the second attempt
    assert os.readlink(Path(spec.trial_dir) / "metrics.jsonl") == "attempt-2/metrics.jsonl"
    argv2 = json.loads((Path(spec.trial_dir) / "attempt-2" / "hydra" / ".hydra" / "overrides.json").read_text())
    assert "trainer.experiment_name=t1-a2" in argv2


def test_oom_at_step_4(tmp_path):
    backend, runner = make("oom_at_4")
    spec = spec_for(backend, tmp_path, steps=6)
    final = run_to_end(runner, runner.launch(spec))
    assert final.status is TrialStatus.OOM
    assert "OutOfMemoryError" in final.reason
    assert final.last_step == 3
    assert read_status(spec.trial_dir).status is TrialStatus.OOM


def test_modelled_memory_above_capacity_is_an_oom(tmp_path):
    backend, runner = make()
    spec = spec_for(backend, tmp_path, steps=3, **{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 128,
                                                   "actor_rollout_ref.model.enable_gradient_checkpointing": False})
    final = run_to_end(runner, runner.launch(spec))
    assert final.status is TrialStatus.OOM and final.last_step == 0


def test_oom_text_while_the_run_hangs_is_killed_as_oom(tmp_path):
    backend, runner = make("oom_hang", watchdog=WatchdogConfig(first_step_timeout_s=60, min_step_timeout_s=60))
    spec = spec_for(backend, tmp_path, steps=6)
    handle = runner.launch(spec)
    final = run_to_end(runner, handle, timeout_s=20)
    assert final.status is TrialStatus.OOM and "did not exit" in final.reason
    assert not psutil.pid_exists(handle.pid) or psutil.Process(handle.pid).status() == psutil.STATUS_ZOMBIE


def test_crash_is_failed_with_the_error_line(tmp_path):
    backend, runner = make("crash")
    spec = spec_for(backend, tmp_path, steps=5)
    handle = runner.launch(spec)
    final = run_to_end(runner, handle)
    assert final.status is TrialStatus.FAILED
    assert "exit code 1" in final.reason and "RuntimeError: fake verl: worker died" in final.reason
    assert final.last_step == 2
    (Path(spec.trial_dir) / "status.json").unlink()
    again = backend.make_runner().poll(handle)
    assert again.status is TrialStatus.FAILED and "exit code 1" in again.reason


def test_bad_batch_arithmetic_fails_like_verl(tmp_path):
    backend, runner = make()
    spec = spec_for(backend, tmp_path, steps=3, **{"trainer.n_gpus_per_node": 3})
    final = run_to_end(runner, runner.launch(spec))
    assert final.status is TrialStatus.FAILED and "must be divisible by minimal possible batch size" in final.reason


def test_hang_is_killed_by_the_watchdog(tmp_path):
    backend, runner = make("hang")
    spec = spec_for(backend, tmp_path, steps=6)
    handle = runner.launch(spec)
    t0 = time.monotonic()
    final = run_to_end(runner, handle, timeout_s=20)
    assert final.status is TrialStatus.STOPPED and final.reason.startswith("watchdog:")
    assert final.last_step == 2
    assert time.monotonic() - t0 < 10
    assert not _group_alive(handle.pid)


def test_hang_ignoring_sigterm_gets_sigkill(tmp_path):
    backend, runner = make("hang", **{"fake.ignore_sigterm": True})
    spec = spec_for(backend, tmp_path, steps=6)
    handle = runner.launch(spec)
    final = run_to_end(runner, handle, timeout_s=20)
    assert final.status is TrialStatus.STOPPED and final.reason.startswith("watchdog:")
    assert not _group_alive(handle.pid)


def test_no_first_step_trips_the_first_step_allowance(tmp_path):
    backend, runner = make("normal", watchdog=WatchdogConfig(first_step_timeout_s=1.0, min_step_timeout_s=0.1),
                           **{"fake.step_s": 30.0})
    spec = spec_for(backend, tmp_path, steps=3)
    final = run_to_end(runner, runner.launch(spec), timeout_s=15)
    assert final.status is TrialStatus.STOPPED and "no training step within" in final.reason


def test_nan_metrics_are_read_as_nan(tmp_path):
    backend, runner = make("nan")
    spec = spec_for(backend, tmp_path, steps=5)
    handle = runner.launch(spec)
    assert run_to_end(runner, handle).status is TrialStatus.COMPLETED
    recs = runner.read_all_metrics(handle)
    by_step = {r.step: r for r in recs}
    assert math.isnan(by_step[3].get("actor/pg_loss")) and math.isnan(by_step[5].get("actor/grad_norm"))
    assert not math.isnan(by_step[2].get("actor/pg_loss"))
    raw = (Path(spec.trial_dir) / "attempt-1" / "metrics.jsonl").read_text().splitlines()[3]
    assert '"actor/pg_loss": null' in raw  # verl's file format: NaN as null


def test_truncated_last_line_is_not_read(tmp_path):
    backend, runner = make("truncate")
    spec = spec_for(backend, tmp_path, steps=4)
    handle = runner.launch(spec)
    final = run_to_end(runner, handle)
    assert final.status is TrialStatus.FAILED and final.last_step == 3
    recs = runner.read_all_metrics(handle)
    assert [r.step for r in recs] == [1, 2, 3]  # the half-written step 4 is not a record, even at the end
    assert not (Path(spec.trial_dir) / "attempt-1" / "metrics.jsonl").read_bytes().endswith(b"\n")


def test_stop_and_reattach_from_another_runner(tmp_path):
    backend, runner = make("normal", **{"fake.step_s": 0.5})
    spec = spec_for(backend, tmp_path, steps=50)
    handle = runner.launch(spec)
    # a second runner (as after a tuner restart) follows the same handle
    other = backend.make_runner()
    # launching the same trial again while it runs re-attaches instead of starting a second process
    again = other.launch(spec)
    assert again.pid == handle.pid and again.extra["attempt"] == 1 and again.extra.get("reattached")
    handle2 = type(handle).model_validate_json(handle.model_dump_json())
    deadline = time.monotonic() + 15
    while other.poll(handle2).last_step in (None, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert other.poll(handle2).status is TrialStatus.RUNNING
    final = other.stop(handle2, reason="test stop", grace_s=2.0)
    assert final.status is TrialStatus.STOPPED and final.reason == "test stop" and final.last_step >= 1
    assert not _group_alive(handle.pid)
    # the original runner sees the final status too
    assert runner.poll(handle).status is TrialStatus.STOPPED


def test_console_fallback_when_no_jsonl(tmp_path):
    backend, runner = make()
    spec = spec_for(backend, tmp_path, steps=3)
    handle = runner.launch(spec)
    # point metrics at a path the run never writes (a wrapper that drops VERL_FILE_LOGGER_PATH): the
    # reader falls back to verl's console lines in trial.log
    handle.extra["metrics_path"] = str(tmp_path / "nowhere.jsonl")
    assert run_to_end(runner, handle).status is TrialStatus.COMPLETED
    tail = runner.metrics(handle)
    recs = tail.read_new()
    assert tail.source == "console"
    assert [r.step for r in recs] == [1, 2, 3]
    assert recs[1].get("perf/throughput") > 0


def _group_alive(pgid: int) -> bool:
    """A live (non-zombie) process is left in the group (zombies of the test's own children do not count)."""
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


@pytest.mark.parametrize("user_freq, expect", [(3, 5), (5, 5), (1, 1), (0, 5), (-1, 5)])
def test_the_horizon_s_step_is_always_validated_inside_a_longer_schedule(tmp_path, user_freq, expect):
    # issue 28: a stage-2 trial of a 100-step schedule stops at its horizon (5), which is not verl's last step, so
    # verl validates there only when step % test_freq == 0: a user's test_freq that misses the horizon is replaced
    backend, runner = make(**{"trainer.total_training_steps": 100, "trainer.test_freq": user_freq})
    spec = spec_for(backend, tmp_path, steps=5).model_copy(update={"stage": "learning"})
    argv = runner.run_overrides(spec, 1)
    [freq] = [int(a.split("=", 1)[1]) for a in argv if a.startswith("trainer.test_freq=")]
    assert freq == expect and 5 % freq == 0
    assert "trainer.total_training_steps=100" in argv  # the user's schedule (the lr's decay) is kept


@pytest.mark.parametrize("resumed", ["while it runs", "after it ended"])
def test_a_launch_the_tuner_died_in_is_adopted_not_run_again(tmp_path, resumed):
    """The tuner died after spawning the supervisor but before it wrote the pid into launch.json (and before the
    ledger held the handle): a fresh runner finds that attempt by its launch token, in the live supervisor's
    environment or, once the run has ended, in the exit.json the supervisor wrote, and follows it to the same
    end instead of launching the trial again."""
    backend, runner = make("normal", **{"fake.step_s": 0.3 if resumed == "while it runs" else 0.02})
    spec = spec_for(backend, tmp_path, steps=4).model_copy(update={"launch_token": "tok-window-1"})
    handle = runner.launch(spec)
    adir = Path(spec.trial_dir) / "attempt-1"
    info = json.loads((adir / "launch.json").read_text())
    for key in ("pid", "pid_create_time", "log_offset"):  # as the first write left it: before the spawn
        info.pop(key)
    (adir / "launch.json").write_text(json.dumps(info))
    if resumed == "after it ended":
        deadline = time.monotonic() + 30
        while not (adir / "exit.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads((adir / "exit.json").read_text())["launch"]["pid"] == handle.pid
    other = backend.make_runner()
    adopted = other.adopt(spec)
    assert adopted is not None, "the started attempt was not found: a resume would launch the trial again"
    assert adopted.pid == handle.pid and adopted.extra["attempt"] == 1
    final = run_to_end(other, adopted)
    assert final.status is TrialStatus.COMPLETED and final.last_step == 4, final
    assert sorted(p.name for p in Path(spec.trial_dir).glob("attempt-*")) == ["attempt-1"]
    # another launch's ending is not this one's
    assert other.adopt(spec.model_copy(update={"launch_token": "tok-other"})) is None
