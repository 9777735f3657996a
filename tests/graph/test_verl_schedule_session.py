"""A schedule session (stage 3) on the verl backend, against the stand-in (``tests/support/fake_verl``), which keeps
verl 0.9.1's checkpoint layout and its ``trainer.resume_mode`` / ``resume_from_path`` behaviour: every branch
resumes from its parent's ``global_step_N`` checkpoint, and a kill -9 of mart (while a branch runs, or right after
a branch's launch) never runs a branch twice. Public surface only: ``mart tune`` / ``mart resume`` and the ledger.

The oracle for a branch's command line is verl's own reading of it (``trainer/ppo/v1/trainer_base.py``
``_load_checkpoint``): the last value of a key wins, ``resume_path`` needs a path containing ``global_step_`` and
takes the global step from it, and a key outside verl's schema needs Hydra's ``+``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mart.state.options import TuneOptions
from mart.trial_runner.verl._yaml_keys import YAML_KEYS
from tests.graph.test_crash_resume import _query, _run_dir, _wait_for
from tests.graph.test_schedule_crash_resume import KILL_AT_LAUNCH
from tests.graph.test_schedule_stage import check_tree
from tests.support.paths import FAKE_VERL, REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENTRY = f"{sys.executable} {FAKE_VERL}"
GPUS = 8
OPTIONS = TuneOptions(stages=["schedule"], learning_horizon=12, schedule_segments=3, schedule_branches=3)


def _args(runs: Path, gate: Path | None = None) -> list[str]:
    base = runs.parent / "base.yaml"
    base.write_text(f"fake.step_s: 0.25\ntrainer.n_gpus_per_node: {GPUS}\n" + (f"fake.gate: {gate}\n" if gate else ""))
    return ["tune", "--backend", "verl", "--verl-entrypoint", ENTRY, "--base-config", str(base),
            "--backend-option", "prevalidate=false", "--memory-capacity-gb", "80", "--approve", "auto",
            "--stages", "schedule", "--learning-horizon", "12", "--schedule-segments", "3", "--schedule-branches", "3",
            "--watch-interval-s", "0.2", "--quiet", "--json", "--no-report", "--runs-dir", str(runs)]


def _resume(run_dir: Path, runs: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "resume", run_dir.name, "--runs-dir", str(runs),
                          "--verl-entrypoint", ENTRY, "--quiet", "--json"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _rows(db: Path) -> list[dict]:
    cols = ("trial_id", "kind", "candidate_id", "status", "handle", "trial_dir", "parent_trial", "parent_step",
            "parent_checkpoint", "horizon", "confirms", "overrides", "config")
    rows = [dict(zip(cols, r)) for r in _query(db, f"select {', '.join(cols)} from trials order by seq")]
    for r in rows:
        r["overrides"], r["config"] = json.loads(r["overrides"] or "{}"), json.loads(r["config"])
    return rows


def _verl_reads(argv: list[str]) -> dict[str, str]:
    """The config verl builds from an argv: Hydra's ``+`` only for keys outside the schema, the last value wins."""
    out: dict[str, str] = {}
    for arg in argv:
        if "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        plus = key.startswith("+")
        key = key.lstrip("+")
        if not key.startswith("hydra."):
            assert (key in YAML_KEYS) != plus, f"{arg}: verl's schema {'has' if plus else 'lacks'} {key}"
        out[key] = value
    return out


def _check_verl_tree(rows: list[dict], summary: dict) -> None:
    assert summary["status"] == "completed" and summary["schedule"]["winner"], summary.get("notes")
    check_tree(rows, OPTIONS)
    by_id = {r["trial_id"]: r for r in rows}
    cands = [r["candidate_id"] for r in rows if r["candidate_id"]]
    assert len(cands) == len(set(cands)), "an approved transition ran twice"
    for r in rows:
        trial_dir = Path(r["trial_dir"])
        assert sorted(p.name for p in trial_dir.glob("attempt-*")) == ["attempt-1"], f"{r['trial_id']} relaunched"
        log = (trial_dir / "trial.log").read_text()
        assert log.count(f"=== mart: {r['trial_id']} attempt") == 1, f"{r['trial_id']} started twice"
        argv = json.loads((trial_dir / "attempt-1" / "launch.json").read_text())["argv"]
        verl = _verl_reads(argv)
        assert int(verl["trainer.total_training_steps"]) == r["horizon"]
        steps = [json.loads(line)["step"] for line in (trial_dir / "attempt-1" / "metrics.jsonl").read_text().splitlines()]
        if r["parent_trial"] is None:  # the root starts from the base model, never from a stale checkpoint
            assert verl["trainer.resume_mode"] == "disable" and "trainer.resume_from_path" not in verl
            assert "Training from scratch" in log
            assert steps[0] == 1
            continue
        parent = by_id[r["parent_trial"]]
        folder = Path(parent["trial_dir"]).resolve() / "checkpoints" / f"global_step_{r['parent_step']}"
        assert verl["trainer.resume_mode"] == "resume_path"
        assert verl["trainer.resume_from_path"] == r["parent_checkpoint"] == str(folder)
        assert int(verl["trainer.resume_from_path"].split("global_step_")[-1]) == r["parent_step"]
        assert verl["actor_rollout_ref.actor.checkpoint.load_contents"] == "[model,optimizer]"
        # the parent saved there in verl's layout, and verl resumed from it at that global step
        assert (folder / "actor" / f"model_world_size_{GPUS}_rank_0.pt").is_file() and (folder / "data.pt").is_file()
        assert log.count(f"Resuming from {folder}, setting global step to {r['parent_step']}") == 1
        assert steps[0] == r["parent_step"] + 1 and steps[-1] == r["horizon"]
    parents = {r["parent_trial"] for r in rows if r["parent_trial"]}
    for pid in parents:  # a node that was expanded saved its segment's end, where its branches start
        p = by_id[pid]
        assert (Path(p["trial_dir"]) / "checkpoints" / f"global_step_{p['horizon']}" / "actor").is_dir()


def test_kill_minus_9_while_a_verl_branch_runs_then_resume(tmp_path):
    """The branch outlives the tuner (its own process group) and the resumed tuner follows that same process to
    its end: the stand-in holds before its next step while the gate file exists, released once mart resumed."""
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    tuner = subprocess.Popen([sys.executable, "-m", "mart.graph.cli", *_args(runs, gate)], cwd=REPO,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        run_dir = _wait_for(lambda: _run_dir(runs), 60, "the run directory")
        db = run_dir / "mart.sqlite"
        # a branch past its first step with two steps to go: the gate holds it before it can end
        row = _wait_for(lambda: _query(db, "select t.trial_id, t.handle from trials t where t.parent_trial is not null "
                                           "and t.status='running' and t.handle is not null and exists (select 1 from "
                                           "metrics m where m.trial_id=t.trial_id and m.step>t.parent_step) and not "
                                           "exists (select 1 from metrics m where m.trial_id=t.trial_id and "
                                           "m.step>=t.horizon-1)"),
                        300, "a running branch")
        gate.touch()
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(10)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    trial_id, handle = row[0][0], json.loads(row[0][1])
    attempt = Path(handle["trial_dir"]) / "attempt-1"
    assert not (attempt / "exit.json").exists(), "the branch ended before mart resumed: nothing to re-attach to"
    threading.Timer(10.0, lambda: gate.unlink(missing_ok=True)).start()  # mart has re-attached by then
    summary = _resume(run_dir, runs)
    rows = _rows(db)
    _check_verl_tree(rows, summary)
    killed = next(r for r in rows if r["trial_id"] == trial_id)
    assert killed["status"] == "completed"
    assert json.loads(killed["handle"]) == handle, "the running branch was relaunched instead of re-attached"
    assert json.loads((attempt / "exit.json").read_text())["returncode"] == 0  # it ran to its end, unkilled


def test_kill_minus_9_at_a_verl_branch_launch_then_resume(tmp_path):
    runs = tmp_path / "runs"
    died = subprocess.run([sys.executable, "-c", KILL_AT_LAUNCH, *_args(runs)], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=300)
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    trial_id = died.stdout.split("KILLED", 1)[1].split()[0]
    run_dir = _run_dir(runs)
    db = run_dir / "mart.sqlite"
    [(handle_at_kill, parent)] = _query(db, "select handle, parent_trial from trials where trial_id=?", (trial_id,))
    assert handle_at_kill and parent, "the branch reached the ledger with its handle and its parent"
    summary = _resume(run_dir, runs)
    rows = _rows(db)
    _check_verl_tree(rows, summary)
    killed = next(r for r in rows if r["trial_id"] == trial_id)
    assert json.loads(killed["handle"]) == json.loads(handle_at_kill), "the launched branch was launched again"
    assert killed["parent_trial"] == parent
