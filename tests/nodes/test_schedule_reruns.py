"""Stage 3's re-evaluations through the schedule stage's policy on a real ledger: the leader's re-run first; when
its gain over the static schedule is then ambiguous (the interval straddles zero with the estimate above it) and
one more run could settle it, that run goes before a close rival's re-run - the static schedule's when it has
fewer runs, as the reference of every schedule's interval."""

from __future__ import annotations

from types import SimpleNamespace

from mart.nodes.stages import StageView
from mart.nodes.stages.schedule import STAGE, ScheduleStage, tree_nodes
from mart.state.ledger import Ledger
from mart.state.models import TrialRecord, TrialStatus
from mart.state.schedule import pick_schedule_winner

NOISE = 0.01  # one validation score's noise (stage 2's, as the tree has no validation curves here)


class _Backend:
    score_metric_prefix = "val-core/"


def _options(budget: int) -> SimpleNamespace:
    return SimpleNamespace(seed=0, wall_clock_s=None, schedule_branches=3, schedule_boundaries=lambda: [4, 8],
                           schedule_trial_budget=lambda: budget, schedule_total_steps=lambda: 8)


def _add(ledger: Ledger, seq: int, record: TrialRecord, score: float, to: int, changes: dict) -> None:
    done = record.model_copy(update={"status": TrialStatus.COMPLETED, "score": score, "steps_done": to})
    ledger.upsert_trial(done, run_id="r", seq=seq, horizon=to, overrides=changes, trial_dir=f"/runs/r/{record.trial_id}")


def _tree(tmp_path, budget: int, leaves: dict[str, float]):
    """Two segments (steps 4 and 8): the root, its unchanged continuation ``ss`` and changed children, all run."""
    ledger = Ledger(tmp_path / "ledger.db")
    root = TrialRecord(trial_id="root", stage=STAGE, kind="baseline", config={"lr": 1})
    _add(ledger, 1, root, 0.40, 4, {})
    for seq, (tid, score) in enumerate(leaves.items(), start=2):
        cfg = {"lr": 1} if tid == "ss" else {"lr": seq}
        rec = TrialRecord(trial_id=tid, stage=STAGE, kind="candidate", config=cfg, parent_trial="root", parent_step=4)
        _add(ledger, seq, rec, score, 8, {} if tid == "ss" else {"lr": seq})
    services = SimpleNamespace(ledger=ledger, backend=_Backend(), options=_options(budget))
    state = {"baseline": {STAGE: root}, "profiles": {STAGE: {}}, "trial_seq": 1 + len(leaves),
             "schedule": {"expanding": None, "expanded": ["root"], "notes": []},
             "selection": {"learning": {"noise": NOISE}}}
    return ledger, services, state


def _rerun_until_done(ledger, services, state, reruns: dict[str, list[float]]) -> list[str]:
    """Plans with one free slot until the stage is done, each re-run landing at its next scripted score."""
    launched = []
    for seq in range(20, 40):
        plan = ScheduleStage().plan(StageView(state, services), 1)
        if plan.done or not plan.launch:
            break
        (rec,) = plan.launch
        assert rec.kind == "confirm" and rec.parent_trial == "root"
        runs = [r for r in launched if r == rec.confirms]
        assert rec.trial_id == f"{rec.confirms}-s{2 + len(runs)}" and rec.seed == 1 + len(runs)
        launched.append(rec.confirms)
        _add(ledger, seq, rec, reruns[rec.confirms][len(runs)], 8, {})
    return launched


def test_an_ambiguous_lead_re_measures_the_static_schedule_before_a_close_rival(tmp_path):
    # the leader a beats the static ss by 3 noise units on one run (too far for ss to be re-run as close); b is
    # close to a. a's re-run comes in lower: +0.0175 over ss with 1 vs 2 runs, interval -0.003..+0.038
    ledger, services, state = _tree(tmp_path, 6, {"ss": 0.50, "a": 0.53, "b": 0.52})
    launched = _rerun_until_done(ledger, services, state, {"a": [0.505], "ss": [0.50], "b": [0.51]})
    # one more static run at its mean would settle it (half-width 0.016 < 0.0175): that run, not b's
    assert launched == ["a", "ss"]
    nodes, noise = tree_nodes(services, prior_noise=NOISE)
    winner, _ = pick_schedule_winner(nodes, 2, noise)
    assert winner.key == "a"
    ledger.close()


def test_a_lead_one_run_cannot_settle_leaves_the_budget_to_the_close_rival(tmp_path):
    # a's re-run comes in far lower: +0.0075, below what even 2 vs 2 runs could tell from zero
    ledger, services, state = _tree(tmp_path, 6, {"ss": 0.50, "a": 0.53, "b": 0.52})
    launched = _rerun_until_done(ledger, services, state, {"a": [0.485], "ss": [0.50], "b": [0.51]})
    assert launched == ["a", "b"]
    ledger.close()


def test_with_more_budget_the_side_with_fewer_runs_is_re_run_until_the_claim_is_settled(tmp_path):
    # each re-run leaves the claim ambiguous but one run from settled: the static schedule's (fewer runs, then
    # equal runs: the reference), then the leader's third; then it is settled and b's re-run is not needed
    ledger, services, state = _tree(tmp_path, 8, {"ss": 0.50, "a": 0.53, "b": 0.52})
    launched = _rerun_until_done(ledger, services, state, {"a": [0.508, 0.525], "ss": [0.506, 0.51], "b": [0.515]})
    assert launched == ["a", "ss", "ss", "a"]
    nodes, noise = tree_nodes(services, prior_noise=NOISE)
    winner, _ = pick_schedule_winner(nodes, 2, noise)
    assert winner.key == "a" and len(winner.scores) == 3
    ledger.close()
