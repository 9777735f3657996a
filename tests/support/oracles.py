"""Independent oracles for session summaries: the README's documented shape, and the best trial recomputed
from the ledger's rows (not from the code that chose it)."""

from __future__ import annotations

import math
from typing import Any

# The summary shape as the README documents it (`mart tune --json`), written out here on purpose: the code's
# own SUMMARY_KEYS would agree with the code whatever it printed.
README_SUMMARY = {
    "run_id": None,
    "status": None,
    "system": {"baseline_throughput", "baseline_steps", "baseline_cut", "best_throughput", "best_steps",
               "throughput_gain_pct", "comparison", "best_config", "memory_limit_gb", "best_peak_memory_gb",
               "gain_interval", "decision", "remeasure", "spread_pct", "disturbed", "gpu_hours"},
    "learning": {"baseline_score", "best_score", "score_gain", "best_config", "verdict", "gain_interval"},
    "trials": {"total", "early_stopped", "failed"},
}


def assert_readme_shape(summary: dict[str, Any]) -> None:
    assert set(README_SUMMARY) <= set(summary), set(README_SUMMARY) - set(summary)
    for key, nested in README_SUMMARY.items():
        if nested is not None:
            assert isinstance(summary[key], dict), key
            assert nested <= set(summary[key]), (key, nested - set(summary[key]))


def best_from_ledger(trials: list[dict[str, Any]], stage: str, limit_gb: float | None) -> dict[str, Any] | None:
    """The stage's best eligible trial by the documented rules: completed, not stopped early, objective known,
    and (stage 1) peak memory within the limit; the baseline when no candidate beats it."""
    key = "throughput" if stage == "system" else "score"
    rows = [t for t in trials if t["stage"] == stage]
    base = next((t for t in rows if t["kind"] == "baseline"), None)
    best = base if base is not None and base.get(key) is not None else None
    for t in rows:
        # stage 1: a disturbed measurement is not believed; its clean repeat (``<id>-repeat``) stands for it
        repeat = stage == "system" and t["kind"] == "confirm" and str(t.get("trial_id")).endswith("-repeat")
        if t["kind"] != "candidate" and not repeat or t["status"] != "completed" or t["early_stopped"] \
                or t.get(key) is None or (t.get("reason") or "").startswith("disturbed"):
            continue
        peak = t.get("peak_memory_gb")
        if stage == "system" and limit_gb is not None and peak is not None and not math.isnan(peak) \
                and peak > limit_gb:
            continue
        if best is None or t[key] > best[key]:
            best = t
    return best
