"""Stage 3 on the agents' side: the diagnosis of a trajectory and the transitions that answer it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.rules import RulesCritic, RulesProposer
from mart.nodes.agents.schedule import Diagnosis, diagnose, transition_candidates
from mart.state.metrics import StepRecord
from mart.state.models import Candidate, TrialRecord, TrialStatus
from mart.trial_runner.local.space import SEARCH_SPACE as LOCAL
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
CLIP_HIGH, ENT_COEF, TEMP, KL_ON, KL_COEF, LR = (A + "clip_ratio_high", A + "entropy_coeff", R + "temperature",
                                                 A + "use_kl_loss", A + "kl_loss_coef", A + "optim.lr")
N, MAX_LEN = R + "n", "data.max_response_length"


def trajectory(steps: int = 30, *, entropy=lambda s: 1.0, kl=lambda s: 0.001, clipfrac=lambda s: 0.02,
               grad=lambda s: 0.5, length=lambda s: 200.0, clip=lambda s: 0.0, reward=lambda s: 0.3 + 0.01 * s,
               val=lambda s: 0.3 + 0.01 * s, test_freq: int = 5) -> list[StepRecord]:
    out = []
    for s in range(1, steps + 1):
        data = {"actor/entropy": entropy(s), "actor/kl_loss": kl(s), "actor/pg_clipfrac": clipfrac(s),
                "actor/grad_norm": grad(s), "response_length/mean": length(s), "response_length/clip_ratio": clip(s),
                "critic/score/mean": reward(s)}
        if s % test_freq == 0:
            data["val-core/math/reward/mean@1"] = val(s)
        out.append(StepRecord(step=s, data=data))
    return out


COLLAPSE = dict(entropy=lambda s: 1.2 * math.exp(-s / 8))
CLIPPING = dict(length=lambda s: 300 + 8 * s, clip=lambda s: 0.004 * s)
DRIFT = dict(kl=lambda s: 0.001 * 1.15 ** s, grad=lambda s: 0.3 * 1.08 ** s, clipfrac=lambda s: 0.05 + 0.01 * s)


def test_entropy_collapse_is_found_with_its_size_and_trend():
    d = diagnose(trajectory(**COLLAPSE))
    assert d.step == 30 and d.entropy_start == pytest.approx(1.2 * math.exp(-1 / 8), rel=1e-3)
    assert d.entropy_ratio is not None and d.entropy_ratio < 0.1
    assert d.entropy_slope is not None and d.entropy_slope < 0
    assert d.worst() == "entropy_collapse"
    assert d.findings[0].startswith("entropy fell 9") and "still falling" in d.findings[0]


def test_length_clipping_kl_drift_and_a_healthy_run():
    d = diagnose(trajectory(**CLIPPING))
    assert d.response_clip_ratio == pytest.approx(0.116, abs=0.01)
    assert "length_clipping" in d.severity and any("hit the length limit" in f for f in d.findings)
    assert d.response_length_slope is not None and d.response_length_slope > 0
    d = diagnose(trajectory(**DRIFT))
    assert d.worst() == "policy_drift" and "KL to the reference rising" in d.findings[0]
    d = diagnose(trajectory())
    assert d.severity == {} and d.findings[0].startswith("no pathology")
    assert d.val_score == pytest.approx(0.6) and d.val_slope is not None and d.val_slope > 0


def test_diagnosis_reads_health_events_and_missing_metrics():
    d = diagnose([StepRecord(step=3, data={"critic/score/mean": 0.1})], health_events=["kl_blowup@3"])
    assert d.entropy is None and d.kl is None and d.val_score is None
    assert d.worst() == "instability"
    assert diagnose([]) == Diagnosis()


def ctx(space=VERL, diag: Diagnosis | None = None, history=(), feedback=(), k: int = 3, base: dict | None = None,
        **kw: Any) -> AgentContext:
    config = {**space.defaults(), **(base or {})}
    return AgentContext(stage="schedule", objective="validation score", search_space=space, base_config=config,
                        best_overrides={}, profile=None, history=list(history), feedback=list(feedback),
                        num_candidates=k, diagnosis=diag, segment=(10, 20), **kw)


VERL_BASE = {N: 8, A + "ppo_mini_batch_size": 64, "data.train_batch_size": 256}


def test_each_pathology_is_answered_by_its_cited_moves():
    c = transition_candidates(ctx(diag=diagnose(trajectory(**COLLAPSE)), base=VERL_BASE))
    assert c[0].overrides == {CLIP_HIGH: 0.28} and "DAPO" in c[0].rationale and "entropy fell" in c[0].rationale.lower()
    assert any(o.overrides.get(ENT_COEF, 0) > 0 or o.overrides.get(TEMP, 1.0) > 1.0 for o in c[1:])
    c = transition_candidates(ctx(diag=diagnose(trajectory(**CLIPPING)), base=VERL_BASE))
    assert c[0].overrides == {MAX_LEN: 1024} and "Skywork-OR1" in c[0].rationale
    c = transition_candidates(ctx(diag=diagnose(trajectory(**DRIFT)), base=VERL_BASE))
    assert c[0].overrides[KL_ON] is True and c[0].overrides[LR] == pytest.approx(5e-7)
    c = transition_candidates(ctx(diag=diagnose(trajectory()), base=VERL_BASE))
    assert len(c) == 3 and any(o.overrides.get(N) == 16 for o in c)  # capacity accumulates on a healthy run
    assert len({o.key() for o in c}) == 3


def test_transitions_follow_feedback_and_never_repeat_a_sibling():
    diag = diagnose(trajectory(**COLLAPSE))
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, feedback=["keep temperature"]))
    assert all(TEMP not in o.overrides for o in c)
    sibling = TrialRecord(trial_id="s1", stage="schedule", config={**VERL.defaults(), **VERL_BASE, CLIP_HIGH: 0.28},
                          status=TrialStatus.COMPLETED, score=0.5, parent_step=10)
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, history=[sibling]))
    assert all(o.overrides != {CLIP_HIGH: 0.28} for o in c)
    # the same config from another checkpoint is no duplicate
    other = sibling.model_copy(update={"parent_step": 5})
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, history=[other]))
    assert c[0].overrides == {CLIP_HIGH: 0.28}


def test_local_backend_moves_its_own_knobs_only_and_the_critic_ranks_by_severity():
    cx = ctx(space=LOCAL, diag=diagnose(trajectory(**COLLAPSE)))
    c = RulesProposer().propose(cx)
    assert c and all(set(o.overrides) <= {p.key for p in LOCAL.stage_params("learning")} for o in c)
    cands = [Candidate(candidate_id="lr", stage="schedule", overrides={LR: 5e-5})]
    cands += [o.model_copy(update={"candidate_id": f"c{i}"}) for i, o in enumerate(reversed(c))]
    verdict = RulesCritic().critique(cx, cands)
    by_id = {cr.candidate_id: cr for cr in verdict.critiques}
    assert all(cr.accepted for cr in verdict.critiques)
    # the pick answers the entropy collapse; a move that answers no finding ranks last
    assert CLIP_HIGH in next(o for o in cands if o.candidate_id == verdict.pick).overrides
    assert any("entropy fell" in r.lower() for r in by_id[verdict.pick].reasons)
    assert by_id["lr"].score == min(cr.score for cr in verdict.critiques)
