"""Adding a stage is one module plus its registration (docs/architecture.md, "The stage protocol"): a toy fourth
stage (``tests/support/toy_stage.py``) runs through a whole session after ``system`` on the toy backend."""

from __future__ import annotations

import pytest

from mart.graph.session import tune
from mart.nodes import stages
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.state.stages import STAGE_ORDER
from tests.support.toy_stage import TOY_BUDGET, TOY_HORIZON, ToyStage

TOY = "tests.support.toy_backend:make_backend"


@pytest.fixture
def toy_stage():
    stages.register(ToyStage())  # the registration: after the shipped stages
    try:
        yield
    finally:
        stages.unregister("toy")


def test_a_fourth_stage_is_one_module_and_its_registration(tmp_path, toy_stage):
    assert STAGE_ORDER[-1] == "toy"
    options = TuneOptions(backend=TOY, approve="auto", runs_dir=str(tmp_path), stages=["system", "toy"],
                          system_trials=3, system_horizon=5, watch_interval_s=0.01, quiet=True, report=False)
    summary = tune(options)
    assert summary["status"] == "completed", summary
    toy = summary["toy"]
    assert toy["baseline_score"] is not None and toy["best_score"] >= toy["baseline_score"]
    ledger = Ledger.open(tmp_path / summary["run_id"])
    try:
        rows = ledger.trials("toy")
        # its budget spent: the baseline and candidates the agents proposed (learning knobs, the system best fixed)
        assert [r["kind"] for r in rows][0] == "baseline" and len(rows) == TOY_BUDGET
        assert all(r["horizon"] == TOY_HORIZON and r["status"] == "completed" for r in rows)
        sys_best = summary["system"]["best_config"]
        assert all(all(r["config"].get(k) == v for k, v in sys_best.items()) for r in rows)
        assert {r["stage"] for r in ledger.trials()} == {"system", "toy"}
    finally:
        ledger.close()


def test_an_unregistered_stage_is_refused():
    with pytest.raises(ValueError, match="Input should be"):
        TuneOptions(stages=["system", "toy"])
