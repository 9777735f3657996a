"""Stage 1 with several slots cuts the baseline at its early look like any other trial once something within the
margin measured far more over the same steps: its throughput and the stage's gain are then reported over those
steps, and if in the end no trial stayed feasible the defaults run once more, to their end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from mart.graph.figures import stage_figures
from mart.graph.session import tune
from mart.nodes.stages import StageView
from mart.nodes.stages.system import CUT_REASON, CUT_SHARE, EARLY_LOOK_STEP, SystemStage
from mart.state.ledger import Ledger
from mart.state.metrics import THROUGHPUT_KEY, mean_over_steps
from mart.state.models import TrialRecord
from mart.state.options import TuneOptions


def _session(tmp_path: Path, parallel: int) -> tuple[dict, list[dict], Ledger]:
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", agents="rules", stages=["system"], system_trials=6, system_horizon=6,
                       watch_interval_s=0.001, quiet=True, report=False, runs_dir=str(tmp_path), parallel=parallel,
                       # the selecting measurements' comparison; a re-measured gain is the re-measurement's
                       # (tests/nodes/test_decisions_under_noise.py)
                       system_remeasure_share=0.0)
    summary = tune(opts)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    return summary, ledger.trials("system"), ledger


def test_with_four_slots_the_baseline_is_cut_at_its_look_and_the_gain_is_measured_over_its_steps(tmp_path):
    summary, rows, ledger = _session(tmp_path, 4)
    [base] = [r for r in rows if r["kind"] == "baseline"]  # cut, not re-run: a feasible config was found
    assert base["status"] == "stopped" and base["early_stopped"] and base["reason"].startswith(CUT_REASON), base
    last = base["steps_done"]
    assert EARLY_LOOK_STEP <= last < 6 and base["throughput"] is None
    own = mean_over_steps(ledger.metric_records(base["trial_id"]), THROUGHPUT_KEY, EARLY_LOOK_STEP, last)
    # the rule: over the same steps another trial measured more than 1 / CUT_SHARE as much
    others = [mean_over_steps(ledger.metric_records(r["trial_id"]), THROUGHPUT_KEY, EARLY_LOOK_STEP, last)
              for r in rows if r["trial_id"] != base["trial_id"]]
    assert own < CUT_SHARE * max(x for x in others if x == x)
    part = summary["system"]
    assert part["baseline_steps"] == [EARLY_LOOK_STEP, last] and part["baseline_cut"]
    assert part["baseline_throughput"] == pytest.approx(own, rel=1e-5)
    best = next(r for r in rows if r["throughput"] is not None and r["throughput"] == pytest.approx(
        part["best_throughput"], rel=1e-6))
    same = mean_over_steps(ledger.metric_records(best["trial_id"]), THROUGHPUT_KEY, EARLY_LOOK_STEP, last)
    assert part["throughput_gain_pct"] == pytest.approx((same / own - 1) * 100, rel=1e-4)
    # the gain is not the best's whole-window figure over the baseline's early one (that mixes warm-ups)
    assert part["throughput_gain_pct"] != pytest.approx((best["throughput"] / own - 1) * 100, rel=1e-3)
    # the terminal's, the report's and Slack's figures say which steps the baseline's figure is over
    [fig] = [f for f in stage_figures(summary) if f.stage == "system"]
    where = f"step {last}" if last == EARLY_LOOK_STEP else f"steps {EARLY_LOOK_STEP}-{last}"
    assert fig.baseline == f"{own:,.0f} ({where})"
    assert any(n.startswith("system stage: the baseline was cut at its early look") and "measured over" in n
               for n in summary["notes"]), summary["notes"]
    ledger.close()


def test_with_one_slot_the_baseline_runs_to_its_end_and_is_measured_over_the_usual_window(tmp_path):
    summary, rows, ledger = _session(tmp_path, 1)
    [base] = [r for r in rows if r["kind"] == "baseline"]
    assert base["status"] == "completed" and base["steps_done"] == 6 and not base["early_stopped"]
    assert summary["system"]["baseline_steps"] == [3, 5] and not summary["system"]["baseline_cut"]
    assert summary["system"]["baseline_throughput"] == pytest.approx(base["throughput"], rel=1e-5)
    ledger.close()


def test_a_cut_baseline_runs_again_when_no_trial_stayed_feasible(tmp_path):
    # the ledger after the session's budget: the baseline cut for a faster bet, which then went over the margin
    ledger = Ledger(tmp_path / "ledger.db")
    cut = TrialRecord(trial_id="sys-01-baseline", stage="system", kind="baseline", config={"x": 1}, status="stopped",
                      reason=f"{CUT_REASON}: 500 tokens/s over step 2, below 85% of sys-02-a's 900", early_stopped=True,
                      steps_done=2)
    over = TrialRecord(trial_id="sys-02-a", stage="system", kind="candidate", config={"x": 2}, status="completed",
                       throughput=900.0, peak_memory_gb=90.0, steps_done=6, reason="peak memory above the margin")
    for seq, rec in enumerate((cut, over), 1):
        ledger.upsert_trial(rec, run_id="r", seq=seq, overrides={})
    options = SimpleNamespace(system_trials=2, system_horizon=6, wall_clock_s=None, start_overrides=None)
    services = SimpleNamespace(ledger=ledger, options=options, backend=SimpleNamespace(base_config=lambda: {"x": 1}),
                               trial_slots=lambda: 4, job_description=lambda: object(), memory_limit_gb=lambda: 72.0)
    state = {"baseline": {"system": cut}, "best": {}, "best_overrides": {}, "profiles": {"system": {}},
             "trial_seq": 2}
    plan = SystemStage().plan(StageView(state, services), 4)
    [again] = plan.launch
    assert again.kind == "baseline" and again.config == {"x": 1} and again.trial_id == "sys-03-baseline-retry"
    # once the defaults ran twice, no third time
    retry = TrialRecord.model_validate({**again.model_dump(), "status": "completed", "throughput": 500.0,
                                        "peak_memory_gb": 50.0, "steps_done": 6})
    ledger.upsert_trial(retry, run_id="r", seq=3, overrides={})
    assert SystemStage().plan(StageView({**state, "trial_seq": 3}, services), 4).done
    ledger.close()


def test_the_profile_of_a_baseline_cut_at_its_look_leaves_out_the_warm_up_step():
    from mart.nodes.profiler import build_profile
    from mart.state.metrics import StepRecord

    # step 1 is slow (warm-up); a cut at step 2 leaves none of the usual window (steps 3-5 of 6)
    def rec(step, thr, t):
        return StepRecord(step=step, data={"perf/throughput": thr, "timing_s/step": t, "timing_s/gen": t / 2})

    base = TrialRecord(trial_id="sys-01-baseline", stage="system", kind="baseline", config={}, status="stopped",
                       reason=f"{CUT_REASON}: ...", steps_done=2, early_stopped=True)
    prof = build_profile(base, [rec(1, 100.0, 30.0), rec(2, 400.0, 10.0)], 6, 72.0)
    assert prof.throughput == pytest.approx(400.0) and prof.step_time_s == pytest.approx(10.0)
    one = build_profile(base, [rec(1, 100.0, 30.0)], 6, 72.0)  # one step only: it is all there is
    assert one.throughput == pytest.approx(100.0)
