"""Stage 1 on the simulator from a baseline over the memory margin: the stage goes on, proposes
memory-reducing bundles first and ends with a feasible config at least as fast as the best feasible
baseline-like config (the baseline with one memory knob turned)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.trial_runner.sim import model as sim

SCENARIO = "qwen3-8b-1x8"
A, R, M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
#: one memory knob at a time, as a user fixing an over-margin job by hand would try
BASELINE_LIKE = [
    {A + "ppo_micro_batch_size_per_gpu": 8}, {A + "ppo_micro_batch_size_per_gpu": 4},
    {R + "log_prob_micro_batch_size_per_gpu": 16}, {R + "log_prob_micro_batch_size_per_gpu": 8},
    {R + "gpu_memory_utilization": 0.4}, {R + "gpu_memory_utilization": 0.3},
    {A + "fsdp_config.optimizer_offload": True}, {A + "fsdp_config.param_offload": True},
    {A + "entropy_from_logits_with_chunking": True}, {A + "strategy": "fsdp2"},
]


@pytest.mark.slow
def test_over_margin_baseline_ends_feasible_and_at_least_as_fast(tmp_path: Path):
    base = sim.base_config(SCENARIO)
    _, base_peak = sim.expected_throughput(base, SCENARIO, 6)
    capacity = round(base_peak / 0.9 - 3.0)  # the defaults peak ~3 GB over the 10% margin
    limit = 0.9 * capacity
    assert base_peak > limit
    options = TuneOptions(backend="sim", backend_options={"scenario": SCENARIO, "seed": 3, "clock": "poll",
                                                          "memory_capacity_gb": capacity},
                          approve="auto", agents="rules", runs_dir=str(tmp_path), seed=3, system_trials=6,
                          learning_trials=0, system_horizon=6, memory_margin=0.1, quiet=True, watch_interval_s=0.01,
                          report=False)
    summary = tune(options)
    assert not any("ended early" in n for n in summary["notes"]), summary["notes"]
    best = summary["system"]["best_config"]
    assert best, "no feasible config found"
    thr, peak = sim.expected_throughput({**base, **best}, SCENARIO, 6, capacity)
    assert peak <= limit
    reference = 0.0
    for ov in BASELINE_LIKE:
        t, p = sim.expected_throughput({**base, **ov}, SCENARIO, 6, capacity)
        if p <= limit:
            reference = max(reference, t)
    assert thr >= reference, (thr, reference)
    ledger = Ledger.open(Path(summary.get("run_dir") or tmp_path / summary["run_id"]))
    try:
        rows = ledger.prediction_record(summary["run_id"])
        first = next(r for r in rows if r["source"] not in ("baseline",))
        # the first proposal after the infeasible baseline is predicted (and measured) under the limit
        assert first["predicted_peak_gb"] < limit
        over = [r for r in rows[1:] if r["status"] == "oom" or (r["peak_memory_gb"] or 0) > limit]
        assert len(over) <= 1
    finally:
        ledger.close()
