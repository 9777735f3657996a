"""The session's overall ETA: the stages' budgets left x their measured seconds per step, over the slots; stage 2's
re-runs on a second seed are the upper end of a range (issue 47: the progress said nothing of the session as a
whole)."""

from __future__ import annotations

import pytest

from mart.graph.eta import SessionEta
from mart.state.options import TuneOptions


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _options(**kw) -> TuneOptions:
    base = dict(backend="sim", system_trials=3, system_horizon=4, learning_trials=2, learning_horizon=10,
                learning_confirm_trials=1, approve="auto", system_remeasure_share=0.25)
    return TuneOptions(**{**base, **kw})


def _run(eta: SessionEta, clock: Clock, trial: str, stage: str, horizon: int, per_step: float, kind="candidate"):
    eta.launched_trial(trial, stage, kind, horizon, eta.slots)
    for step in range(1, horizon + 1):
        clock.t += per_step
        eta.step(trial, step)
    eta.ended(trial)


def test_the_estimate_is_the_budget_left_times_the_measured_step_time():
    clock = Clock()
    eta = SessionEta.for_session(_options())
    eta.clock = clock
    assert eta.remaining_s() is None and eta.text() == ""  # nothing timed yet: no guess
    _run(eta, clock, "sys-01-baseline", "system", 4, 10.0, kind="baseline")
    low, high, to_launch, reruns = eta.remaining_s()
    # 2 system trials x 4 steps + 2 learning trials x 10 steps, at 10 s a step; 1 re-run of 10 steps at most
    assert (low, high, to_launch, reruns) == (pytest.approx(280.0), pytest.approx(380.0), 4, 1)
    assert eta.text() == "session: about 5-6 min left (4 trial(s) to launch and up to 1 re-run(s) on a second seed)"
    # half-way through a running trial: its steps left count, at the stage's own pace once it has one
    eta.launched_trial("sys-02-a", "system", "candidate", 4, 1)
    clock.t += 40.0  # 20 s a step
    eta.step("sys-02-a", 2)
    low, _, _, _ = eta.remaining_s()
    # system: the median of 10 and 20 s/step = 15, (1 trial x 4 + 2 steps left) x 15; learning, not begun: 20 steps
    # at the pace of the last finished trial's stage (10 s)
    assert low == pytest.approx((4 + 2) * 15.0 + 20 * 10.0)


def test_a_finished_stage_and_the_slots_count():
    clock = Clock()
    eta = SessionEta.for_session(_options(parallel=2))
    eta.clock = clock
    _run(eta, clock, "sys-01-baseline", "system", 4, 10.0, kind="baseline")
    # stage 2 began though stage 1 left budget unspent: stage 1 adds nothing more
    eta.launched_trial("lea-02-baseline", "learning", "baseline", 10, 2)
    clock.t += 50.0
    eta.step("lea-02-baseline", 5)
    low, high, to_launch, _ = eta.remaining_s()
    # learning: 1 trial x 10 steps + 5 left, at 10 s a step, over 2 slots; re-run: 10 steps more
    assert (low, high, to_launch) == (pytest.approx(75.0), pytest.approx(125.0), 1)


def test_a_resumed_session_counts_the_trials_its_ledger_holds():
    rows = [{"trial_id": "sys-01", "stage": "system", "kind": "baseline", "status": "completed", "steps_done": 4,
             "wall_s": 48.0},
            {"trial_id": "sys-02", "stage": "system", "kind": "candidate", "status": "completed", "steps_done": 4,
             "wall_s": 48.0}]
    low, _, to_launch, _ = SessionEta.for_session(_options(), rows).remaining_s()
    assert to_launch == 3 and low == pytest.approx((1 * 4 + 2 * 10) * 12.0)


def test_a_session_prints_its_overall_eta(tmp_path, capsys):
    from mart.graph.session import tune

    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", agents="rules", stages=["system"], system_trials=3, system_horizon=4,
                       watch_interval_s=0.001, quiet=False, report=False, runs_dir=str(tmp_path),
                       system_remeasure_share=0.25)
    tune(opts)
    err = capsys.readouterr().err
    lines = [x.strip() for x in err.splitlines() if "session: about" in x]
    assert lines, err[-2000:]
    assert "(2 trial(s) to launch)" in lines[0] and "(the trials running)" in lines[-1], lines
