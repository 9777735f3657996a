"""A tuning session on the verl backend with the stand-in (issue 15): every learning trial is scored by its
validation after training - never by the step-0 validation of the untrained model, which the user asked for here."""

from __future__ import annotations

import sys

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from tests.support.paths import FAKE_VERL

SCORE = "val-core/openai/gsm8k/reward/mean@1"


@pytest.mark.slow
def test_learning_trials_are_scored_after_training(tmp_path):
    opts = TuneOptions(
        backend="verl", approve="auto", runs_dir=str(tmp_path), system_trials=1, learning_trials=3,
        learning_confirm_trials=0,  # this test is about scoring; re-runs of close contenders have their own
        system_horizon=3, learning_horizon=4, watch_interval_s=0.05, quiet=True, memory_capacity_gb=80.0,
        backend_options={"entrypoint": f"{sys.executable} {FAKE_VERL}", "prevalidate": False,
                         "base_config": {"fake.step_s": 0.02, "trainer.val_before_train": True}},
    )
    summary = tune(opts)
    ledger = Ledger.open(tmp_path / summary["run_id"])
    learning = [t for t in ledger.trials() if t["stage"] == "learning"]
    assert len(learning) == 3
    for t in learning:
        recs = ledger.metric_records(t["trial_id"])
        step0 = next(r.data[SCORE] for r in recs if r.step == 0)
        final = next(r.data[SCORE] for r in recs if r.step == 4)
        assert t["status"] == "completed" and t["score"] == pytest.approx(final)
        assert t["score"] != pytest.approx(step0)
    assert len({round(t["score"], 6) for t in learning}) > 1  # candidates are told apart, not all the untrained score
    system = [t for t in ledger.trials() if t["stage"] == "system"]
    assert all(not any(SCORE in r.data for r in ledger.metric_records(t["trial_id"])) for t in system)
