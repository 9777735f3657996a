"""Issue 26 item 0: a crafted run folder never gets a child process to import code from it.

verl, MARTI and mart's own trial supervisor were started with ``python -m ...`` and the trial directory as the
working directory, so a module planted there (``trials/<id>/verl/trainer/main_ppo.py``,
``trials/<id>/mart/trial_runner/verl/supervise.py``, ``marti/cli/multi_agent_train_ppo_ray.py``) was imported
instead of the real one, on builtin backends that need no consent. Ray adds a driver's working directory to
its workers' ``sys.path`` too, so the working directory itself must hold nothing a run folder put there.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from mart.graph.session import pending_review, tune
from mart.state.models import config_hash
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore
from mart.state.trials import TrialSpec
from tests.support.paths import FAKE_VERL

pytestmark = pytest.mark.timeout(180)


def plant(root: Path, dotted: str, marker: Path) -> None:
    """A package tree ``dotted`` under ``root`` whose leaf module writes ``marker`` when imported or run."""
    parts = dotted.split(".")
    d = root
    for p in parts[:-1]:
        d = d / p
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('{dotted} package\\n')\n")
    (d / f"{parts[-1]}.py").write_text(f"open({str(marker)!r}, 'a').write('{dotted}\\n')\n")


PLANTED = ("verl.trainer.main_ppo", "mart.trial_runner.verl.supervise", "marti.cli.multi_agent_train_ppo_ray")


def cli(*args: str):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args))


def test_resume_of_a_crafted_verl_run_imports_nothing_from_it(tmp_path):
    # a real paused run on the builtin verl backend (the stand-in as its launch command, allowed at start)
    opts = TuneOptions(backend="verl", approve="none", runs_dir=str(tmp_path), system_trials=2, learning_trials=0,
                       system_horizon=2, watch_interval_s=0.05, quiet=True, memory_capacity_gb=80.0,
                       backend_options={"entrypoint": f"{sys.executable} {FAKE_VERL}", "prevalidate": False,
                                        "base_config": {"fake.step_s": 0.02}})
    run = tune(opts)["run_id"]
    store = RunStore.open(run, tmp_path)
    request = pending_review(store)
    store.close()
    # crafted: the stored options now use verl's default command (a builtin backend: no consent asked), and
    # the next trial's folder holds modules named like verl's trainer, MARTI's and mart's own supervisor
    overrides = (request.get("candidates") or [request])[0]["overrides"]
    next_id = f"sys-02-{config_hash(overrides)[:6]}"
    db = sqlite3.connect(tmp_path / run / "mart.sqlite")
    stored = json.loads(db.execute("SELECT options FROM runs").fetchone()[0])
    stored["backend_options"].pop("entrypoint")
    db.execute("UPDATE runs SET options = ?", (json.dumps(stored),))
    # the crafted ledger knows the trial (a folder with files but no row is refused as a ledger that lost writes)
    db.execute("INSERT INTO trials (trial_id, run_id, stage, kind, status) VALUES (?, ?, 'system', 'candidate', "
               "'pending')", (next_id, run))
    db.commit()
    db.close()
    marker = tmp_path / "planted-code-ran"
    next_dir = tmp_path / run / "trials" / next_id
    for dotted in PLANTED:
        plant(next_dir, dotted, marker)
        plant(next_dir / "attempt-1", dotted, marker)
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "-q")
    assert out.exit_code == 0, out.stderr
    assert not marker.exists(), marker.read_text()
    # the trial really ran its launch (and failed: verl is not installed here), through mart's own supervisor
    log = (next_dir / "trial.log").read_text()
    assert "No module named 'verl'" in log or "No module named verl" in log


def _run_marti(spec: TrialSpec, runner) -> None:
    handle = runner.launch(spec)
    deadline = time.monotonic() + 60
    while not runner.poll(handle).status.is_finished():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_marti_and_local_workers_never_import_from_the_trial_folder(tmp_path, local_tiny_config):
    from mart.trial_runner.local.runner import LocalRunner
    from mart.trial_runner.marti.runner import MartiRunner

    marker = tmp_path / "planted-code-ran"
    # MARTI's default command (python -m marti.cli...), as a stored builtin `marti` run would launch it
    d = tmp_path / "m1"
    d.mkdir()
    for dotted in PLANTED:
        plant(d, dotted, marker)
        plant(d / "attempt-1", dotted, marker)
    runner = MartiRunner(sample_gpu=False, gpu_free_threshold_gb=None, kill_grace_s=1.0)
    _run_marti(TrialSpec(trial_id="m1", config={}, steps=2, trial_dir=str(d)), runner)
    assert not marker.exists(), marker.read_text()
    assert "No module named 'marti'" in (d / "trial.log").read_text()
    # the local worker: mart's own module, whatever directory the tuner runs from
    d = tmp_path / "l1"
    d.mkdir()
    plant(d, "mart.trial_runner.local.__main__", marker)
    plant(d, "numpy", marker)
    import os

    here = os.getcwd()
    os.chdir(d)
    try:
        runner = LocalRunner()
        _run_marti(TrialSpec(trial_id="l1", config=local_tiny_config, steps=1, trial_dir=str(d)), runner)
    finally:
        os.chdir(here)
    assert not marker.exists(), marker.read_text()
    assert json.loads((d / "status.json").read_text())["status"] == "completed"
