"""Stage 2's re-runs through the learning stage's policy on a real ledger: one at a time (one free slot), the best
hopeful first, then the defaults (their re-run counts in ``learning_confirm_trials``), reported in the selection."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from mart.nodes.stages import StageView
from mart.nodes.stages.learning import LR_KEY, LearningStage
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord

VAL = "val-core/task/reward/mean@1"


def learning_selection(state, services, free: int = 1):
    """The next re-run for ``free`` slots, or None and the state update naming the winner (stage control's two
    calls of the policy once the candidate budget is spent)."""
    stage, view = LearningStage(), StageView(state, services)
    nxt = stage.reevaluations(view, free)
    return (nxt[0], {}) if nxt else (None, stage.choice(view))


class _Backend:
    score_metric_prefix = "val-core/"

    @staticmethod
    def base_config():
        return {LR_KEY: 1e-6, "x": 1}


def _trial(ledger: Ledger, seq: int, tid: str, kind: str, lr: float, score: float | None, rng: random.Random,
           confirms: str | None = None, status: str = "completed", early: bool = False) -> TrialRecord:
    rec = TrialRecord(trial_id=tid, stage="learning", kind=kind, config={LR_KEY: lr, "x": 1}, status=status,
                      score=score, early_stopped=early, confirms=confirms, seed=1 if confirms else 0, steps_done=30)
    overrides = {} if lr == 1e-6 else {LR_KEY: lr}
    ledger.upsert_trial(rec, run_id="r", seq=seq, overrides=overrides)
    if score is not None:  # a flat validation curve with noise 0.01 around the final score
        ledger.add_metrics(tid, [StepRecord(step=s, data={VAL: score + (rng.gauss(0, 0.01) if s < 30 else 0.0)})
                                 for s in range(0, 31, 5)])
    return rec


def test_learning_selection_spends_the_budget_on_the_best_hopeful_and_the_defaults_and_reports_it(tmp_path):
    rng = random.Random(3)
    ledger = Ledger(tmp_path / "ledger.db")
    baseline = _trial(ledger, 1, "lea-base", "baseline", 1e-6, 0.40, rng)
    _trial(ledger, 2, "lea-a", "candidate", 2e-6, 0.45, rng)
    _trial(ledger, 3, "lea-b", "candidate", 1.5e-6, 0.43, rng)
    _trial(ledger, 4, "lea-edge", "candidate", 6e-6, 0.48, rng)  # lr 8e-6 collapsed: at the cliff edge
    _trial(ledger, 6, "lea-half", "candidate", 4e-6, 0.44, rng)  # one doubling below it: below a collapse
    _trial(ledger, 5, "lea-crash", "candidate", 8e-6, None, rng, status="stopped", early=True)
    services = SimpleNamespace(ledger=ledger, backend=_Backend(),
                               options=SimpleNamespace(seed=0, learning_confirm_trials=2))
    state = {"baseline": {"learning": baseline}, "best": {}, "best_overrides": {}}
    reruns = {"lea-a": 0.445, "lea-base": 0.402, "lea-b": 0.43}
    launched = []
    for seq in range(7, 13):
        nxt, update = learning_selection(state, services)
        if nxt is None:
            break
        assert nxt.kind == "confirm" and nxt.seed == 1 and nxt.trial_id == f"{nxt.confirms}-s2"
        launched.append(nxt.confirms)
        _trial(ledger, seq, nxt.trial_id, "confirm", nxt.config[LR_KEY], reruns[nxt.confirms], rng,
               confirms=nxt.confirms)
    # the best hopeful first, then the defaults (their re-run counts), then the budget of 2 is spent
    assert launched == ["lea-a", "lea-base"]
    sel = update["selection"]["learning"]
    assert sel["reevaluated"] == launched and sel["confirm_budget"] == 2
    assert sel["winner"] == "lea-a" and sel["runs"] == 2
    assert update["best_overrides"]["learning"] == {LR_KEY: 2e-6}
    by_id = {c["trial_id"]: c for c in sel["contenders"]}
    for tid in ("lea-edge", "lea-half"):
        assert any("collapsed (lea-crash)" in s for s in by_id[tid]["signals"]) and by_id[tid]["runs"] == 1
    assert not any("collapsed" in s for s in by_id["lea-a"]["signals"])  # two doublings below: no risk
    assert by_id["lea-a"]["move"] == 1 and by_id["lea-base"]["move"] == 0
    # the same ledger gives the same answer (a resumed session decides alike)
    assert learning_selection(state, services)[1]["selection"]["learning"]["winner"] == "lea-a"
    ledger.close()


def test_the_collapse_risk_is_read_per_agent_learning_rate(tmp_path):
    # a multi-agent job sets one lr per agent (agents.<i>.<key>): only a collapse that raised the same agent's
    # lr at least as far puts a config near the cliff
    rng = random.Random(4)
    ledger = Ledger(tmp_path / "ledger.db")
    k0, k1 = f"agents.0.{LR_KEY}", f"agents.1.{LR_KEY}"

    def trial(seq, tid, kind, lrs, score, status="completed", early=False):
        rec = TrialRecord(trial_id=tid, stage="learning", kind=kind, config={k0: 1e-6, k1: 1e-6, **lrs},
                          status=status, score=score, early_stopped=early, seed=0, steps_done=30)
        ledger.upsert_trial(rec, run_id="r", seq=seq, overrides=lrs)
        if score is not None:
            ledger.add_metrics(tid, [StepRecord(step=s, data={VAL: score + rng.gauss(0, 0.01)}) for s in range(0, 31, 5)])
        return rec

    baseline = trial(1, "base", "baseline", {}, 0.40)
    trial(2, "a0", "candidate", {k0: 4e-6}, 0.46)
    trial(3, "a1", "candidate", {k1: 4e-6}, 0.45)
    trial(4, "crash1", "candidate", {k1: 6e-6}, None, status="stopped", early=True)  # agent 1 collapsed
    services = SimpleNamespace(ledger=ledger, backend=SimpleNamespace(score_metric_prefix="val-core/",
                                                                     base_config=lambda: {k0: 1e-6, k1: 1e-6}),
                               options=SimpleNamespace(seed=0, learning_confirm_trials=0))
    state = {"baseline": {"learning": baseline}, "best": {}, "best_overrides": {}}
    sel = learning_selection(state, services)[1]["selection"]["learning"]
    by_id = {c["trial_id"]: c for c in sel["contenders"]}
    assert any(f"{k1} 4e-06 raised" in s and "(crash1)" in s for s in by_id["a1"]["signals"])
    assert not any("collapsed" in s for s in by_id["a0"]["signals"])  # agent 0's lr never collapsed
    # with no re-run allowed, nothing replaces the defaults on one seed
    assert sel["winner"] == "base" and sel["reevaluated"] == [] and sel["confirm_budget"] == 0
    ledger.close()


def _two_seed_lead(ledger, rng, *, crash_status: str, crash_early: bool):
    """A config one doubling below a trial that crashed (or OOM'd), leading the defaults clearly on two seeds."""
    base = _trial(ledger, 1, "lea-base", "baseline", 1e-6, 0.40, rng)
    _trial(ledger, 2, "lea-edge", "candidate", 6e-6, 0.47, rng)
    _trial(ledger, 3, "lea-crash", "candidate", 8e-6, None, rng, status=crash_status, early=crash_early)
    _trial(ledger, 4, "lea-edge-s2", "confirm", 6e-6, 0.47, rng, confirms="lea-edge")
    _trial(ledger, 5, "lea-base-s2", "confirm", 1e-6, 0.40, rng, confirms="lea-base")
    return base


@pytest.mark.parametrize("status, early", [("failed", False), ("oom", False), ("stopped", True)])
def test_a_crash_at_a_higher_lr_marks_the_cliff_like_a_stop(tmp_path, status, early):
    # issue 28: a crashed trial (status failed, not stopped by the health monitor) must mark the lr cliff too: a
    # config just below it never replaces the defaults, however well its two seeds did
    rng = random.Random(5)
    ledger = Ledger(tmp_path / "ledger.db")
    base = _two_seed_lead(ledger, rng, crash_status=status, crash_early=early)
    services = SimpleNamespace(ledger=ledger, backend=_Backend(), options=SimpleNamespace(seed=0, learning_confirm_trials=0))
    sel = learning_selection({"baseline": {"learning": base}, "best": {}, "best_overrides": {}}, services)[1]
    sel = sel["selection"]["learning"]
    edge = next(c for c in sel["contenders"] if c["trial_id"] == "lea-edge")
    assert any("collapsed (lea-crash)" in s for s in edge["signals"]), edge
    assert sel["winner"] == "lea-base"
    ledger.close()


def test_a_failed_re_run_counts_against_its_config(tmp_path):
    # issue 28: the re-run that did not finish is evidence against the config, not a missing point
    rng = random.Random(6)
    ledger = Ledger(tmp_path / "ledger.db")
    base = _trial(ledger, 1, "lea-base", "baseline", 1e-6, 0.40, rng)
    _trial(ledger, 2, "lea-a", "candidate", 2e-6, 0.47, rng)
    _trial(ledger, 3, "lea-a-s2", "confirm", 2e-6, None, rng, confirms="lea-a", status="failed")
    _trial(ledger, 4, "lea-base-s2", "confirm", 1e-6, 0.40, rng, confirms="lea-base")
    services = SimpleNamespace(ledger=ledger, backend=_Backend(), options=SimpleNamespace(seed=0, learning_confirm_trials=0))
    sel = learning_selection({"baseline": {"learning": base}, "best": {}, "best_overrides": {}}, services)[1]
    sel = sel["selection"]["learning"]
    a = next(c for c in sel["contenders"] if c["trial_id"] == "lea-a")
    assert any("lea-a-s2 ended failed" in s for s in a["signals"]) and a["runs"] == 1
    assert sel["winner"] == "lea-base"
    ledger.close()


def test_the_lead_bar_uses_the_pooled_noise_s_effective_degrees_of_freedom(tmp_path):
    # issue 28: the pooled noise has 2/pi of the summed degrees of freedom (a median's efficiency); claiming them
    # all lowers the Student-t bar, and a lead between the two bars would replace the defaults
    from mart.state.objectives import Contender, learning_choice, pooled_noise, student_z

    estimates = [(0.01, 2), (0.01, 2), (0.01, 2)]
    noise, dof = pooled_noise(estimates)
    assert dof == pytest.approx(2 / 3.141592653589793 * 6)
    se = noise * (1 / 2 + 1 / 2) ** 0.5
    lead = 0.5 * (student_z(2.0, dof) + student_z(2.0, 6.0)) * se  # between the honest bar and the inflated one
    base = Contender("base", [0.40, 0.40], [], is_baseline=True)
    change = Contender("c", [0.40 + lead, 0.40 + lead], [], move=1)
    assert learning_choice([base, change], noise, dof=dof)[0].is_baseline
    assert learning_choice([base, change], noise, dof=6.0)[0].key == "c"  # what the inflated dof would do
