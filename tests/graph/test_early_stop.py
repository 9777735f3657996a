"""Health-based early stopping end to end, on the toy backend's poll clock (one step revealed per poll).

The monitor must see trials mid-run: a collapsing candidate is stopped before its horizon and never becomes
the best; a healthy one runs to the end; a baseline is never stopped, however sick it looks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mart.graph.reviewers.base import Reviewer
from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions
from tests.support.toy_backend import ENT, LR, MB, SEQS

TOY = "tests.support.toy_backend:make_backend"
HORIZON = 8


class EditsByStage(Reviewer):
    """Answers each review with the next edit planned for its stage (the proposer's choice does not matter);
    approves where no edit is planned."""

    name = "edits"

    def __init__(self, **plans):
        self.plans = {stage: list(edits) for stage, edits in plans.items()}

    def review(self, request):
        plan = self.plans.get(request["stage"])
        if not plan:
            return ReviewDecision(action="approve", reviewer="test", channel="test")
        edits = plan.pop(0)
        return ReviewDecision(action="edit", edits=edits, reviewer="test", channel="test")


def _last_val(ledger, trial) -> float:
    """The last validation score the trial logged (from its metric stream, not the ledger's result)."""
    vals = [r.data[k] for r in ledger.metric_records(trial["trial_id"]) for k in r.data if k.startswith("val-core/")]
    return vals[-1]


def _options(tmp_path, **kw) -> TuneOptions:
    # a tiny watch interval: each watch pass returns after one new step, so the monitor sees every step
    base = dict(backend=TOY, approve="auto", runs_dir=str(tmp_path), quiet=True, watch_interval_s=1e-6,
                system_horizon=5, learning_horizon=HORIZON)
    base.update(kw)
    return TuneOptions(**base)


def test_collapsing_candidates_stop_mid_run_healthy_ones_and_the_baseline_do_not(tmp_path):
    # The baseline itself collapses (lr 0.05); the candidates: entropy collapse, KL blow-up with a validation
    # score that beats everything else before it is stopped, and a healthy run that beats the baseline.
    collapse = {LR: 0.05, ENT: 0.0}
    kl_but_scores_well = {LR: 2e-3, ENT: 0.04}
    healthy = {LR: 1.2e-3, ENT: 0.0}
    reviewer = EditsByStage(learning=[collapse, kl_but_scores_well, healthy])
    opts = _options(tmp_path, system_trials=2, learning_trials=4,
                    backend_options={"stream": True, "base_overrides": {LR: 0.05}})
    summary = tune(opts, reviewer=reviewer)
    assert summary["status"] == "completed"
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    # "confirm" trials (re-runs that settle the pick under noise) are not part of this scenario
    learning = [t for t in ledger.trials("learning") if t["kind"] in ("baseline", "candidate")]
    assert [t["kind"] for t in learning] == ["baseline", "candidate", "candidate", "candidate"]
    base, col, kl, ok = learning
    assert [t["config"][LR] for t in learning] == [0.05, 0.05, 2e-3, 1.2e-3]

    # the baseline is as sick as the first candidate, and the monitor saw it (a stop-severity event) ...
    base_events = ledger.health_events(base["trial_id"])
    assert any(e.rule == "entropy_collapse" and e.severity == "stop" for e in base_events)
    # ... yet it ran to its horizon; the monitor saw every step, the last one too (written as the job ended)
    assert base["status"] == "completed" and not base["early_stopped"] and base["steps_done"] == HORIZON
    assert max(e.step for e in base_events) == HORIZON

    for t, rule in ((col, "entropy_collapse"), (kl, "kl_blowup")):
        assert t["status"] == "stopped", t
        assert t["early_stopped"]
        assert t["reason"].startswith(f"health: {rule}:")
        persisted = re.search(r"\((\d+)/3 steps\)$", t["reason"])
        assert persisted and int(persisted.group(1)) >= 3  # a warning does not stop: the anomaly persisted
        assert 3 <= t["steps_done"] < HORIZON  # stopped mid-run, once the anomaly persisted
        assert any(e.rule == rule and e.severity == "stop" for e in ledger.health_events(t["trial_id"]))

    assert ok["status"] == "completed" and not ok["early_stopped"] and ok["steps_done"] == HORIZON
    assert not [e for e in ledger.health_events(ok["trial_id"]) if e.severity == "stop"]

    # the KL run's last validation score is the highest of all: only the early stop keeps it from being best,
    # and a stopped trial reports no result at all
    assert _last_val(ledger, kl) > ok["score"] > base["score"]
    assert kl["score"] is None and col["score"] is None
    assert summary["learning"]["best_config"][LR] == 1.2e-3
    assert summary["learning"]["best_score"] == pytest.approx(ok["score"])
    assert summary["learning"]["best_score"] > summary["learning"]["baseline_score"]
    # the two sick candidates; a re-run of the (collapsing) defaults that settles the pick is stopped too
    assert sum(t["early_stopped"] for t in learning) == 2
    assert summary["trials"]["early_stopped"] == sum(t["early_stopped"] for t in ledger.trials())
    assert all(t["kind"] == "confirm" and t["config"][LR] == 0.05
               for t in ledger.trials("learning") if t["early_stopped"] and t not in learning)


def test_over_margin_system_candidate_is_stopped_at_its_first_step(tmp_path):
    # capacity 4.0 GB, margin 0.1 -> limit 3.6 GB; micro batch 26 without checkpointing peaks at 3.92 GB
    big = {MB: 26, SEQS: 32, "actor_rollout_ref.model.enable_gradient_checkpointing": False}
    reviewer = EditsByStage(system=[big])
    summary = tune(_options(tmp_path, system_trials=2, learning_trials=0, memory_capacity_gb=4.0,
                            backend_options={"stream": True}), reviewer=reviewer)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    base, cand = ledger.trials("system")
    assert cand["config"][MB] == 26
    assert cand["status"] == "stopped" and cand["early_stopped"]
    assert cand["reason"].startswith("health: memory_margin:")
    assert cand["steps_done"] < 5
    assert base["status"] == "completed" and base["steps_done"] == 5
    assert summary["system"]["best_config"] == {}  # the baseline stays the best


def test_a_trial_that_completes_as_the_stop_arrives_is_still_not_eligible(tmp_path):
    # The KL blow-up starts at step 4 of 8 and has persisted 3 steps when the monitor reads step 6; by then the
    # trial is on its last step, so it completes before the stop lands. Its score is the session's best; the health verdict must still
    # keep it from being chosen.
    kl_late = {LR: 2e-3, ENT: 0.04}
    reviewer = EditsByStage(learning=[kl_late])
    summary = tune(_options(tmp_path, system_trials=2, learning_trials=2,
                            backend_options={"stream": True, "kl_onset_step": HORIZON - 4}), reviewer=reviewer)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    base, cand = ledger.trials("learning")
    assert cand["config"][ENT] == 0.04
    assert cand["status"] == "completed" and cand["steps_done"] == HORIZON
    assert cand["early_stopped"] and cand["reason"].startswith("health: kl_blowup:")
    assert _last_val(ledger, cand) > base["score"]  # its final validation beats the baseline ...
    assert cand["score"] is None  # ... but an early-stopped trial reports no result
    assert summary["learning"]["best_config"] == {}  # the baseline stays the best
