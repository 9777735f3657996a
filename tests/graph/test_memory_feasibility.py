"""The memory margin at collect: a trial that peaked above (1 - margin) x capacity is never the best.

The toy's capacity is 4.0 GB and it OOMs only above 4.0 GB, so a trial can finish *between* the margin limit
(3.6 GB) and the capacity. Its throughput is the highest of the session: only the margin keeps it out.
Reviewer edits force the configs, so the proposer's choices do not matter, and the memory predictor is made
to say nothing, so the critic cannot screen the candidate first: the check at collect is the one that counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mart.graph.reviewers.base import Reviewer
from mart.graph.session import tune
from mart.nodes.agents import memory_model
from mart.state.ledger import Ledger
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions
from tests.support.toy_backend import CKPT, MB, SEQS

TOY = "tests.support.toy_backend:make_backend"
LIMIT = 0.9 * 4.0


class Edits(Reviewer):
    name = "edits"

    def __init__(self, *edits):
        self.edits = list(edits)

    def review(self, request):
        return ReviewDecision(action="edit", edits=self.edits.pop(0), reviewer="test", channel="test")


@pytest.fixture
def no_prediction(monkeypatch):
    monkeypatch.setattr(memory_model.MemoryModel, "predict", lambda self, config: None)


def _run(tmp_path, *edits, **backend_options):
    opts = TuneOptions(backend=TOY, approve="auto", runs_dir=str(tmp_path), quiet=True, watch_interval_s=0.01,
                       system_trials=1 + len(edits), learning_trials=0, system_horizon=5, memory_capacity_gb=4.0,
                       system_remeasure_share=0.25,
                       backend_options=backend_options)
    summary = tune(opts, reviewer=Edits(*edits))
    assert summary["status"] == "completed"
    return summary, Ledger.open(Path(tmp_path) / summary["run_id"])


def test_trial_between_limit_and_capacity_is_infeasible_and_never_best(tmp_path, no_prediction):
    over = {MB: 26, SEQS: 32, CKPT: False}  # peak 1 + 2.6 + 0.32 = 3.92 GB: above 3.6, below the 4.0 OOM
    modest = {SEQS: 16}  # peak 1.26 GB, a little faster than the baseline
    summary, ledger = _run(tmp_path, over, modest)
    base, big, ok = ledger.trials("system")
    assert summary["system"]["memory_limit_gb"] == pytest.approx(LIMIT)
    crit = {c["candidate_id"]: c for c in ledger.table_rows("critiques")}
    assert crit[big["candidate_id"]]["predicted_memory_gb"] is None  # nothing screened it before the run
    assert big["status"] == "completed"  # it ran to the end: no OOM ...
    assert LIMIT < big["peak_memory_gb"] <= 4.0
    assert big["reason"] == "peak memory above the margin"  # ... but it is not feasible
    assert big["throughput"] > ok["throughput"] > base["throughput"]
    assert summary["system"]["best_config"] == modest
    assert summary["system"]["best_throughput"] == pytest.approx(ok["throughput"])
    assert summary["system"]["best_throughput"] > summary["system"]["baseline_throughput"]
    assert summary["system"]["best_peak_memory_gb"] <= LIMIT


def test_a_spike_that_falls_back_still_counts(tmp_path, no_prediction):
    # micro batch 22 without checkpointing: 3.44 GB, under the limit -- but step 1 spikes 0.5 GB higher
    spiky = {MB: 22, SEQS: 24, CKPT: False}
    summary, ledger = _run(tmp_path, spiky, memory_spike_gb=0.5)
    base, cand = ledger.trials("system")
    readings = [r.get("perf/max_memory_allocated_gb") for r in ledger.metric_records(cand["trial_id"])[1:]]
    assert readings[0] > LIMIT > readings[-1]  # spikes, then falls back under the limit
    assert cand["peak_memory_gb"] == pytest.approx(max(readings))
    assert cand["reason"] == "peak memory above the margin"
    assert cand["throughput"] > base["throughput"]
    assert summary["system"]["best_config"] == {}
