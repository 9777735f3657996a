"""verl for real jobs (issue 15), driven through the stand-in: scores after training, a user's run script kept
intact, the user's schedule with a stop at the horizon, a hang stopped at the configured timeout, leftover
workers ended after a trial, and the run-script importer on its own."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import psutil
import pytest

from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.objectives import learning_score, unscored_reason
from mart.state.search_space import ConfigError
from mart.state.trials import TrialSpec
from mart.trial_runner.verl import VerlBackend
from mart.trial_runner.verl.script import import_run_script
from tests.support.paths import FAKE_VERL
from tests.support.trials import wait_finished

SCORE = "val-core/openai/gsm8k/reward/mean@1"
FAST = {"kill_grace_s": 1.0, "oom_exit_grace_s": 0.5, "gpu_free_threshold_gb": None, "leftover_settle_s": 0.5}



def _run(runner, handle, timeout_s: float = 40.0):
    return wait_finished(runner, handle, timeout_s)


def _argv(trial_dir: str, attempt: int = 1) -> list[str]:
    return json.loads((Path(trial_dir) / f"attempt-{attempt}" / "hydra" / ".hydra" / "overrides.json").read_text())


def _last(argv: list[str], key: str) -> str | None:
    """The value verl keeps for ``key``: its last occurrence on the command line."""
    found = None
    for a in argv:
        k, _, v = a.lstrip("+").partition("=")
        if k == key:
            found = v
    return found


def test_learning_trial_is_scored_by_its_validation_after_training(tmp_path):
    backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False, runner_options=FAST,
                          base_config={"fake.step_s": 0.02, "trainer.val_before_train": True})
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="l1", config=backend.base_config(), steps=4, trial_dir=str(tmp_path / "l1"),
                     stage="learning")
    assert _run(runner, runner.launch(spec)).status is TrialStatus.COMPLETED
    recs = runner.read_all_metrics(runner._live_attempt(spec) or _handle(runner, spec))
    val_steps = [r.step for r in recs if SCORE in r.data]
    assert val_steps == [0, 4]  # the user asked for the step-0 validation; mart added the one at the horizon
    assert learning_score(recs) == recs[-1].data[SCORE] != recs[0].data[SCORE]
    # the same stream without the final validation is unscored, and says why - never the step-0 value
    only_before = [r for r in recs if r.step < 4]
    assert math.isnan(learning_score(only_before))
    assert "step-0" in unscored_reason(only_before)


def _handle(runner, spec):
    from mart.state.trials import TrialHandle

    adir = Path(spec.trial_dir) / "attempt-1"
    return TrialHandle(trial_id=spec.trial_id, backend="verl", trial_dir=spec.trial_dir,
                       extra={"attempt": 1, "metrics_path": str(adir / "metrics.jsonl"), "attempt_dir": str(adir)})


def test_system_trial_runs_without_validation_and_keeps_the_users_schedule(tmp_path):
    backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False, runner_options=FAST,
                          base_config={"fake.step_s": 0.02, "trainer.total_training_steps": 40,
                                       "trainer.test_freq": 2, "trainer.save_freq": 1})
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="s1", config=backend.base_config(), steps=3, trial_dir=str(tmp_path / "s1"),
                     stage="system")
    final = _run(runner, runner.launch(spec))
    assert final.status is TrialStatus.COMPLETED and "horizon" in final.reason
    argv = _argv(spec.trial_dir)
    assert _last(argv, "trainer.total_training_steps") == "40"  # the LR schedule keeps the full run's length
    assert _last(argv, "trainer.test_freq") == "-1" and _last(argv, "trainer.val_before_train") == "false"
    assert _last(argv, "trainer.save_freq") == "-1"
    recs = runner.read_all_metrics(_handle(runner, spec))
    assert recs and recs[0].step == 1 and not any(SCORE in r.data for r in recs)
    assert max(r.step for r in recs) < 40  # ended at the horizon, not at the schedule's end


RUN_SCRIPT = """#!/usr/bin/env bash
set -e
# the user's GRPO recipe
MODEL=${MODEL_PATH:-Qwen/Qwen3-0.6B}
BATCH=512
export VLLM_USE_V1=1
"$PY_BIN" "$FAKE" \\
    algorithm.adv_estimator=grpo \\
    data.train_batch_size=$BATCH \\
    data.max_response_length=1024 \\
    actor_rollout_ref.model.path="$MODEL" \\
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    actor_rollout_ref.rollout.n=8 \\
    trainer.logger='["console","wandb"]' \\
    trainer.project_name='my project' \\
    +fake.step_s=0.02 \\
    "$@"
"""


def test_run_script_values_survive_except_the_candidates_keys(tmp_path, monkeypatch):
    script = tmp_path / "run_grpo.sh"
    # one value mart cannot read (command substitution): bash still gives verl the script's 8
    script.write_text(RUN_SCRIPT.replace("ppo_micro_batch_size_per_gpu=8", "ppo_micro_batch_size_per_gpu=$(echo 8)"))
    monkeypatch.setenv("PY_BIN", sys.executable)
    monkeypatch.setenv("FAKE", str(FAKE_VERL))
    monkeypatch.delenv("MODEL_PATH", raising=False)
    with pytest.warns(UserWarning, match="ppo_micro_batch_size_per_gpu"):
        backend = VerlBackend(entrypoint=f"bash {script}", prevalidate=False, runner_options=FAST)
    base = backend.base_config()
    assert base["data.train_batch_size"] == 512 and base["actor_rollout_ref.rollout.n"] == 8  # the script's
    cfg = dict(base)
    cfg["actor_rollout_ref.rollout.gpu_memory_utilization"] = 0.7  # the candidate's one change
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="c1", config=cfg, steps=3, trial_dir=str(tmp_path / "c1"), stage="system")
    assert _run(runner, runner.launch(spec)).status is TrialStatus.COMPLETED
    argv = _argv(spec.trial_dir)
    expected = {
        "algorithm.adv_estimator": "grpo", "data.train_batch_size": "512", "data.max_response_length": "1024",
        "actor_rollout_ref.model.path": "Qwen/Qwen3-0.6B", "actor_rollout_ref.actor.ppo_mini_batch_size": "128",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.actor.use_kl_loss": ("True", "true"),
        "actor_rollout_ref.ref.fsdp_config.param_offload": ("True", "true"),
        "actor_rollout_ref.rollout.n": "8", "trainer.project_name": ("my project", "'my project'"),
    }
    for key, want in expected.items():
        assert _last(argv, key) in (want if isinstance(want, tuple) else (want,)), (key, _last(argv, key))
    assert _last(argv, "actor_rollout_ref.rollout.gpu_memory_utilization") == "0.7"
    # mart's catalogue fillers never follow the script's arguments
    for filler in ("actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.rollout.tensor_model_parallel_size",
                   "actor_rollout_ref.model.enable_gradient_checkpointing"):
        assert _last(argv, filler) is None, filler
    assert _last(argv, "trainer.logger") == "[console,file,wandb]"  # the user's wandb kept, mart's file added


def test_run_script_without_args_passthrough_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE", str(FAKE_VERL))
    script = tmp_path / "run.sh"
    script.write_text(RUN_SCRIPT.replace('    "$@"\n', "    trainer.nnodes=1\n"))
    with pytest.raises(ConfigError, match=r'"\$@"'):
        VerlBackend(entrypoint=f"bash {script}", prevalidate=False)


def test_import_resolves_variables_quotes_lists_and_reports_the_rest():
    imp = import_run_script(RUN_SCRIPT, env={"MODEL_PATH": "/models/q", "FAKE": "/opt/verl/main_ppo.py"})
    assert imp.passes_args and imp.line == 7
    # ${VAR:-x} takes the script's default: mart never copies a value of its environment (issue 26), and says so
    assert imp.overrides["actor_rollout_ref.model.path"] == "Qwen/Qwen3-0.6B"
    assert any("MODEL_PATH" in n for n in imp.notes) and not any("/models/q" in n for n in imp.notes)
    assert imp.overrides["data.train_batch_size"] == 512  # the script's own assignment
    assert imp.overrides["trainer.logger"] == ["console", "wandb"]
    assert imp.overrides["trainer.project_name"] == "my project"
    assert imp.overrides["actor_rollout_ref.actor.use_kl_loss"] is True
    assert imp.overrides["fake.step_s"] == 0.02
    assert len(imp.overrides) >= 14
    unresolved = import_run_script('X=1\npython3 -m verl.trainer.main_ppo a.b=$UNSET c.d="$(hostname)" e.f=$X\n', env={})
    assert unresolved.overrides == {"e.f": 1}
    assert any("$UNSET" in u for u in unresolved.unresolved)
    assert any("command substitution" in u for u in unresolved.unresolved)
    assert not unresolved.passes_args
    with pytest.raises(ConfigError, match="main_ppo"):
        import_run_script("echo hello\n", env={})


def test_hang_is_stopped_at_the_configured_stall_timeout(tmp_path):
    backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False, runner_options=FAST,
                          base_config={"fake.step_s": 0.02, "fake.mode": "hang"}, stall_timeout_s=1.5)
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="h1", config=backend.base_config(), steps=6, trial_dir=str(tmp_path / "h1"))
    t0 = time.monotonic()
    final = _run(runner, runner.launch(spec))
    assert final.status is TrialStatus.STOPPED and "stall_timeout_s 1.5" in final.reason
    assert time.monotonic() - t0 < 15


def test_leftover_worker_outside_the_group_is_ended_and_reported(tmp_path):
    backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False, runner_options=FAST,
                          base_config={"fake.step_s": 0.02, "fake.leak_worker": True})
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="w1", config=backend.base_config(), steps=2, trial_dir=str(tmp_path / "w1"))
    final = _run(runner, runner.launch(spec))
    assert final.status is TrialStatus.COMPLETED and "leftover" in final.reason
    killed = json.loads((Path(spec.trial_dir) / "attempt-1" / "cleanup.json").read_text())
    assert len(killed) == 1
    pid = killed[0]["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "leftover process" in (Path(spec.trial_dir) / "trial.log").read_text()


def test_workers_that_exit_by_themselves_after_the_run_are_waited_for_not_ended(tmp_path):
    """verl's Ray workers exit seconds after its driver (more on a loaded machine): the trial stays running until
    they are gone, up to the settle time, and nothing is reported as a leftover."""
    backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False,
                          runner_options={**FAST, "leftover_settle_s": 30.0},
                          base_config={"fake.step_s": 0.02, "fake.leak_worker": True, "fake.leak_worker_s": 4})
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="w3", config=backend.base_config(), steps=2, trial_dir=str(tmp_path / "w3"))
    handle = runner.launch(spec)
    t0 = time.monotonic()
    final = _run(runner, handle)
    assert final.status is TrialStatus.COMPLETED and not final.reason
    assert not (Path(spec.trial_dir) / "attempt-1" / "cleanup.json").exists()
    assert 3.0 < time.monotonic() - t0 < 20.0  # it waited for the worker, which ended by itself


def test_a_trial_mart_stops_ends_its_workers_outside_the_group_as_part_of_the_stop(tmp_path):
    """mart ends a run at its horizon: the Ray-worker-like process in a session of its own goes with the run's
    group (a driver ended by a signal never shuts its Ray cluster down), and it is no leftover."""
    backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False, runner_options=FAST,
                          base_config={"fake.step_s": 0.05, "fake.leak_worker": True,
                                       "trainer.total_training_steps": 200})
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="w2", config=backend.base_config(), steps=2, trial_dir=str(tmp_path / "w2"))
    final = _run(runner, runner.launch(spec))
    assert final.status is TrialStatus.COMPLETED and "horizon" in final.reason and "leftover" not in final.reason
    assert not (Path(spec.trial_dir) / "attempt-1" / "cleanup.json").exists()
    from mart.trial_runner.verl.cleanup import trial_processes

    assert trial_processes("w2", 1, str(Path(spec.trial_dir).resolve())) == []


def test_nan_in_the_middle_of_a_read_stops_and_a_lone_grad_norm_nan_does_not():
    from mart.nodes.health_rules import HealthConfig, nan_metrics

    ok = {"actor/entropy": 1.0, "actor/pg_loss": 0.1, "actor/grad_norm": 0.3, "critic/score/mean": 0.4}
    recs = [StepRecord(step=s, data=dict(ok)) for s in range(1, 6)]
    recs[3].data["actor/pg_loss"] = math.nan  # step 4, with step 5 arriving in the same read
    ev = nan_metrics("t", recs, HealthConfig())
    assert ev is not None and ev.severity == "stop" and ev.step == 4
    recs[3].data["actor/pg_loss"] = 0.1
    recs[2].data["actor/grad_norm"] = math.nan  # verl skips that update and goes on
    ev = nan_metrics("t", recs, HealthConfig())
    assert ev is not None and ev.severity == "warn"
    for r in recs[1:4]:
        r.data["actor/grad_norm"] = math.inf  # persistent: three steps in a row
    assert nan_metrics("t", recs, HealthConfig(window=3)).severity == "stop"


def test_console_fallback_keeps_a_final_line_and_drops_repeated_steps(tmp_path):
    from mart.trial_runner.verl.logs import FallbackMetricsTail

    log = tmp_path / "trial.log"
    log.write_text("(TaskRunnerV1 pid=1) step:1 - actor/pg_loss:np.float64(0.5)\n"
                   "(TaskRunnerV1 pid=1) step:1 - actor/pg_loss:np.float64(0.5)\n"  # echoed twice
                   "(TaskRunnerV1 pid=1) step:2 - actor/pg_loss:np.float64(0.4)\n"
                   "(TaskRunnerV1 pid=1) step:3 - actor/pg_loss:np.float64(0.3)")  # the process exited here
    tail = FallbackMetricsTail(tmp_path / "none.jsonl", log)
    assert [r.step for r in tail.read_new()] == [1, 2]  # while it may still be written: complete lines only
    assert [r.step for r in tail.read_new(final=True)] == [3]
    assert tail.read_new(final=True) == []


def test_watchdog_first_step_limit_is_derived_from_measured_startups():
    from mart.trial_runner.verl import WatchdogConfig
    from mart.trial_runner.verl.runner import Progress

    wd = WatchdogConfig()
    assert wd.first_step_limit() == 3600.0
    assert wd.first_step_limit([100.0]) == 600.0 and wd.first_step_limit([100.0, 400.0]) == 1200.0
    assert WatchdogConfig(first_step_timeout_s=50).first_step_limit([400.0]) == 50
    p = Progress()
    p.observe([StepRecord(step=1, data={"timing_s/step": 2.0})], now=100.0)
    assert p.expired(WatchdogConfig(stall_timeout_s=30), started_at=0.0, now=125.0) is None
    assert "stall_timeout_s 30" in p.expired(WatchdogConfig(stall_timeout_s=30), started_at=0.0, now=131.0)
    with pytest.raises(ValueError, match="stall_timeout_s"):
        WatchdogConfig(stall_timeout_s=0)


def test_device_wide_peak_feeds_the_metrics_and_the_margin_rule(tmp_path):
    from mart.nodes.health_rules import HealthConfig, memory_margin
    from mart.state.objectives import DEVICE_MEMORY_KEY, peak_memory_gb
    from mart.trial_runner.verl.runner import DevicePeakTail, FallbackMetricsTail

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "data": {"actor/perf/max_memory_allocated_gb": 20.0}}\n')
    peaks = tmp_path / "gpu_peaks.json"
    # GPU 0 had 5 GB of someone else's before launch; vLLM's KV cache makes the device peak far above torch's
    peaks.write_text(json.dumps({"peaks_gb": {"0": 75.0, "1": 60.0}, "before_gb": {"0": 5.0, "1": 0.5}}))
    tail = DevicePeakTail(FallbackMetricsTail(metrics, tmp_path / "trial.log"), peaks)
    recs = tail.read_new()
    assert recs[0].data[DEVICE_MEMORY_KEY] == pytest.approx(70.0)
    assert peak_memory_gb(recs) == pytest.approx(70.0)  # not the torch figure (20)
    ev = memory_margin("t", recs, HealthConfig(memory_limit_gb=0.9 * 72.0))
    assert ev is not None and ev.severity == "stop"
    # without NVML samples, torch's metric is the fallback
    peaks.unlink()
    with open(metrics, "a") as f:
        f.write('{"step": 2, "data": {"actor/perf/max_memory_allocated_gb": 21.0}}\n')
    more = tail.read_new()
    assert DEVICE_MEMORY_KEY not in more[0].data and peak_memory_gb(more) == 21.0


def test_mart_import_verl_writes_a_base_config_that_reads_back_the_same(tmp_path):
    import os
    import subprocess

    from mart.trial_runner.verl.overrides import load_base_config
    from tests.support.paths import REPO

    script = tmp_path / "run.sh"
    script.write_text(RUN_SCRIPT + "")
    out = tmp_path / "base.yaml"
    env = {**os.environ, "FAKE": "/opt/verl/main_ppo.py", "MODEL_PATH": "/models/q", "PY_BIN": "python3"}
    proc = subprocess.run([sys.executable, "-m", "mart.graph.cli", "import-verl", str(script), "-o", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "15 overrides" in proc.stderr and '"$@"' in proc.stderr
    assert load_base_config(out) == import_run_script(RUN_SCRIPT, env=env).overrides
    again = subprocess.run([sys.executable, "-m", "mart.graph.cli", "import-verl", str(script), "-o", str(out)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 2 and "exists" in again.stderr  # never overwritten
