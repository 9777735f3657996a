"""bench/compare.py: a tiny end-to-end comparison, and its metrics on a hand-made run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO as REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def compare():
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(ROOT))


def trial(stage: str, seq: int, **kw) -> dict:
    base = {"stage": stage, "seq": seq, "overrides": {}, "status": "completed", "throughput": None, "peak_memory_gb": None,
            "feasible": True, "score": None, "early_stopped": False, "gpu_hours": 1.0, "planned_gpu_hours": 1.0,
            "steps_done": 6, "reason": None}
    return {**base, **kw}


def test_summarize_counts_what_the_table_reports(compare) -> None:
    run = {"trials": [
        trial("system", 1, throughput=80.0),
        trial("system", 2, status="oom", feasible=False),
        trial("system", 3, throughput=99.0, feasible=False),  # over the margin: does not count
        trial("system", 4, throughput=96.0),
        trial("learning", 5, score=0.4),
        trial("learning", 6, score=0.1, status="stopped", early_stopped=True, feasible=False, gpu_hours=0.25),
    ]}
    s = compare.summarize(run, 100.0, compare.Budget())
    assert s["best_throughput"] == 96.0 and s["pct_of_optimum"] == pytest.approx(96.0)
    assert s["trials_to_95"] == 4 and s["oom_failed"] == 1 and s["over_margin"] == 1
    assert s["learning_score"] == 0.4 and s["early_stopped"] == 1
    assert s["gpu_hours"] == pytest.approx(5.25) and s["gpu_hours_saved"] == pytest.approx(0.75)
    assert s["curve"] == [80.0, 80.0, 80.0, 96.0]


def test_tiny_comparison_writes_table_plot_and_raw(compare, tmp_path: Path) -> None:
    methods = ["default", "random", "grid", "optuna"]
    if compare.mart_available() is None:
        methods.insert(0, "mart")
    report = compare.main([
        "--scenarios", "qwen3-0.6b-1x8", "--seeds", "1", "--methods", ",".join(methods), "--system-trials", "3",
        "--learning-trials", "2", "--learning-horizon", "6", "--jobs", "1", "--out", str(tmp_path),
    ])
    out = Path(report["out_dir"])
    table = (out / "table.md").read_text()
    assert (out / "best_so_far.png").stat().st_size > 1000
    raw = json.loads((out / "raw.json").read_text())
    rows = raw["scenarios"]["qwen3-0.6b-1x8"]["methods"]
    assert set(rows) == set(methods)
    for m in methods:
        assert f"| {m} |" in table, table
        (r,) = rows[m]
        assert r["error"] is None, r["error"]
        assert r["system_trials"] <= 3 and r["learning_trials"] <= 2
        assert r["gpu_hours"] > 0
        assert r["pct_of_optimum"] is None or r["pct_of_optimum"] < 105  # nobody beats the exhaustive optimum
    assert rows["default"][0]["system_trials"] == 1
    assert "Simulator optimum" in table
