"""`--base-config` for the local backend: the user's workload is the baseline the tuner starts from."""

from __future__ import annotations

import json

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.trial_runner.registry import load_backend
from tests.support.oracles import best_from_ledger


def test_base_config_is_merged_and_validated(tmp_path, local_tiny_config):
    good = tmp_path / "base.json"
    good.write_text(json.dumps(local_tiny_config))
    backend = load_backend("local", base_config=str(good))
    assert backend.base_config()["local.model.n_layer"] == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("data.train_batch_size: 8\nactor_rollout_ref.actor.ppo_mini_batch_size: 16\n")
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        load_backend("local", base_config=str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        load_backend("local", base_config=str(tmp_path / "missing.yaml"))


def test_tune_on_a_tiny_local_workload(tmp_path, local_tiny_config):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(local_tiny_config))
    summary = tune(TuneOptions(backend="local", backend_options={"base_config": str(base)}, approve="auto",
                               runs_dir=str(tmp_path / "runs"), system_trials=3, learning_trials=2,
                               system_horizon=4, learning_horizon=6, quiet=True, watch_interval_s=0.2,
                               report=False, system_remeasure_share=0.25))
    assert summary["status"] == "completed"
    trials = Ledger.open(tmp_path / "runs" / summary["run_id"]).trials()
    # the budget, plus stage 2's re-runs of close contenders on another seed (at most the default 3)
    assert len([t for t in trials if not t.get("confirms")]) == 5 and len(trials) - 5 <= 3
    assert all(t["config"]["local.model.n_layer"] == 2 for t in trials)  # the user's workload, not ours
    # a real trainer on a loaded CPU: no gain is guaranteed, but the best must be the ledger's best eligible trial
    best_sys = best_from_ledger(trials, "system", summary["system"]["memory_limit_gb"])
    assert summary["system"]["best_throughput"] == pytest.approx(best_sys["throughput"])
    # stage 2 picks under noise: the winner's score is the mean of its runs (its trial and its re-runs)
    ledger = Ledger.open(tmp_path / "runs" / summary["run_id"])
    winner = next(r["best_trial"] for r in ledger.table_rows("stage_results") if r["stage"] == "learning")
    runs = [t["score"] for t in trials if winner in (t["trial_id"], t.get("confirms"))]
    assert summary["learning"]["best_score"] == pytest.approx(sum(runs) / len(runs))
    assert summary["learning"]["best_score_runs"] == len(runs)
    assert summary["system"]["baseline_throughput"] == pytest.approx(trials[0]["throughput"])
