"""Stage 1 on the user scenario files (examples/scenarios/): jobs the shipped scenarios do not cover (small
models on 48 GB PCIe cards, a 32B job across four nodes, 16k-token responses, a memory-tight 8B). Behaviour,
not figures: a rules session of 8 trials stays within one OOM/over-margin trial and gets close to the
simulator's exhaustive optimum (the oracle, computed by the simulator, independently of the tuner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.trial_runner.sim import load_scenario
from mart.trial_runner.sim import model as sim
from tests.support.paths import REPO

FILES = ["qwen2.5-1.5b-1x8-l40s.yaml", "qwen3-1.7b-2x8-l40s.yaml", "qwen2.5-32b-4x8-h100.yaml",
         "r1-distill-qwen-7b-16k-2x8-h100.yaml", "llama-3.1-8b-1x8-l40s.yaml"]
TRIALS = 8
#: the best measured feasible throughput after 8 trials, as a share of the optimum (the issue's target is
#: 97% in most sessions; a single seed is held to less so that one unlucky draw of noise does not fail it)
REACH = {"llama-3.1-8b-1x8-l40s.yaml": 0.90}
DEFAULT_REACH = 0.95


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_user_job_reaches_the_optimum_with_at_most_one_bad_trial(tmp_path: Path, name: str) -> None:
    path = REPO / "examples" / "scenarios" / name
    sc = load_scenario(str(path))
    gt = sim.ground_truth(sc, 0.1, 6)
    options = TuneOptions(backend="sim", backend_options={"scenario_file": str(path), "seed": 1, "clock": "poll"},
                          approve="auto", agents="rules", runs_dir=str(tmp_path), seed=1, system_trials=TRIALS,
                          learning_trials=0, system_horizon=6, memory_margin=0.1, quiet=True, watch_interval_s=0.01,
                          report=False)
    summary = tune(options)
    ledger = Ledger.open(Path(summary.get("run_dir") or tmp_path / summary["run_id"]))
    try:
        rows = [r for r in ledger.trials() if r["stage"] == "system"]
    finally:
        ledger.close()
    # the search's trials; stage 1's re-measurement of the baseline and the best (kind `confirm`) comes on top
    assert len([r for r in rows if r["kind"] != "confirm"]) == TRIALS
    limit = gt["limit_gb"]
    bad = [r for r in rows if r["status"] == "oom" or (r.get("peak_memory_gb") or 0) > limit]
    assert len(bad) <= 1, [(r["status"], r.get("peak_memory_gb")) for r in bad]
    best = summary["system"]["best_config"]
    thr, peak = sim.expected_throughput({**sim.base_config(sc), **best}, sc, 6)
    assert peak <= limit
    assert thr >= REACH.get(name, DEFAULT_REACH) * gt["throughput"], (thr / gt["throughput"], best)
