"""A newcomer's smaller stumbles (issue 47): a mistyped run id names the nearest run; `mart knobs` keeps its keys
whole; a warning that holds at every step is printed once; an imported verl config runs on the simulator."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from mart.nodes.health_monitor import assess
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord, TrialStatus
from mart.trial_runner.registry import load_backend
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL
from tests.support.cli import cli, paused_toy_run


def test_a_mistyped_run_id_names_the_nearest_run(tmp_path):
    runs = str(tmp_path / "runs")
    first = paused_toy_run(runs)["run_id"]
    second = paused_toy_run(runs)["run_id"]
    typo = second[:-1] + ("x" if second[-1] != "x" else "y")
    out = cli("status", typo, "--runs-dir", runs)
    assert out.exit_code == 2 and f"Did you mean {second}?" in out.output and first not in out.output
    far = cli("status", "nothing-like-it", "--runs-dir", runs)
    assert far.exit_code == 2 and "Did you mean" not in far.output and second in far.output  # the newest, then


@pytest.mark.parametrize("width", [200, 90])
def test_knobs_keys_are_never_wrapped(monkeypatch, width):
    import mart.graph.cli.configs as knobs_module

    monkeypatch.setattr(knobs_module, "new_console", lambda: Console(width=width, markup=False, highlight=False))
    out = cli("knobs", "--backend", "verl")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    for p in VERL.params:  # each key and short name whole on one line, as `--edit` takes it
        assert any(p.key in line for line in lines), p.key
        short = VERL.edit_name(p.key)
        assert any(short in line for line in lines), short


def test_a_warning_that_holds_at_every_step_is_announced_once(tmp_path):
    ledger = Ledger(Path(tmp_path) / "mart.sqlite")
    said: list = []
    services = SimpleNamespace(ledger=ledger, memory_limit_gb=lambda: None, progress=said.append)
    rec = TrialRecord(trial_id="t1", stage="learning", kind="candidate", config={}, status=TrialStatus.RUNNING)
    for step in range(1, 31):  # a flat reward: stagnation holds from step 13 on, at every step
        ledger.add_metrics("t1", [StepRecord(step=step, data={"critic/score/mean": 0.3, "actor/entropy": 0.7})])
        assess(services, rec)
    stagnation = [e for e in said if e.rule == "reward_stagnation"]
    assert len(stagnation) == 1 and stagnation[0].severity == "warn"
    # the ledger still keeps each step's event
    assert len([e for e in ledger.health_events("t1") if e.rule == "reward_stagnation"]) > 10


def test_an_imported_verl_config_runs_on_the_simulator(tmp_path):
    good = tmp_path / "my_verl.yaml"
    good.write_text("data.train_batch_size: 512\nactor_rollout_ref.actor.optim.lr: 2.0e-6\n"
                    "trainer.project_name: mine\n")
    backend = load_backend("sim", base_config=str(good))
    base = backend.base_config()
    assert base["data.train_batch_size"] == 512 and base["actor_rollout_ref.actor.optim.lr"] == 2e-6
    assert base["trainer.project_name"] == "mine"  # a key the simulator does not model is kept as the user's
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor_rollout_ref.rollout.gpu_memory_utilization: 3\n")
    with pytest.raises(ValueError, match="bad.yaml.*gpu_memory_utilization"):
        load_backend("sim", base_config=str(bad))
    runs = tmp_path / "runs"
    out = cli("tune", "--backend", "sim", "--base-config", str(good), "--approve", "none", "--runs-dir", str(runs),
              "--system-trials", "2", "--learning-trials", "0", "--no-report", "-q", "--json")
    assert out.exit_code == 0, out.output
    trials = cli("trials", next(runs.iterdir()).name, "--runs-dir", str(runs), "--json")
    import json

    assert json.loads(trials.stdout)[0]["config"]["data.train_batch_size"] == 512
