"""Stage 3 on the agents' side: the diagnosis of a trajectory and the transitions that answer it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.rules import RulesCritic, RulesProposer
from mart.nodes.agents.schedule import Diagnosis, diagnose
from mart.nodes.agents.schedule import transition_candidates as all_transitions
from mart.state.metrics import StepRecord
from mart.state.models import Candidate, TrialRecord, TrialStatus
from mart.trial_runner.local.space import SEARCH_SPACE as LOCAL
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL
from mart.trial_runner.verl.space import VERL_DEFAULTS

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
CLIP_HIGH, ENT_COEF, TEMP, KL_ON, KL_COEF, LR = (A + "clip_ratio_high", A + "entropy_coeff", R + "temperature",
                                                 A + "use_kl_loss", A + "kl_loss_coef", A + "optim.lr")
N, MAX_LEN = R + "n", "data.max_response_length"


def trajectory(steps: int = 30, *, entropy=lambda s: 1.0, kl=lambda s: 0.001, clipfrac=lambda s: 0.02,
               grad=lambda s: 0.5, length=lambda s: 200.0, clip=lambda s: 0.0, reward=lambda s: 0.3 + 0.01 * s,
               val=lambda s: 0.3 + 0.01 * s, test_freq: int = 5, kl_key: str = "actor/kl_loss",
               memory=None) -> list[StepRecord]:
    out = []
    for s in range(1, steps + 1):
        data = {"actor/entropy": entropy(s), kl_key: kl(s), "actor/pg_clipfrac": clipfrac(s),
                "actor/grad_norm": grad(s), "response_length/mean": length(s), "response_length/clip_ratio": clip(s),
                "critic/score/mean": reward(s)}
        if s % test_freq == 0:
            data["val-core/math/reward/mean@1"] = val(s)
        if memory is not None:
            data["perf/max_memory_allocated_gb"] = memory(s)
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


def coordinated(c: Candidate) -> bool:
    return c.rationale.startswith("Coordinated transition")


def transition_candidates(cx: AgentContext) -> list[Candidate]:
    """The single-rule transitions (each finding's answer), as the proposer ranks them after its coordinated ones
    (``test_a_coordinated_transition_comes_first...`` covers those)."""
    m = sum(1 for o in all_transitions(replace(cx, num_candidates=cx.num_candidates + 2)) if coordinated(o))
    return [o for o in all_transitions(replace(cx, num_candidates=cx.num_candidates + m)) if not coordinated(o)]


def ctx(space=VERL, diag: Diagnosis | None = None, history=(), feedback=(), k: int = 3, base: dict | None = None,
        **kw: Any) -> AgentContext:
    config = {**space.defaults(), **(base or {})}
    kw.setdefault("best_overrides", {})
    return AgentContext(stage="schedule", objective="validation score", search_space=space, base_config=config,
                        profile=None, history=list(history), feedback=list(feedback),
                        num_candidates=k, diagnosis=diag, segment=(10, 20), **kw)


VERL_BASE = {N: 8, A + "ppo_mini_batch_size": 64, "data.train_batch_size": 256}


def test_each_pathology_is_answered_by_its_cited_moves():
    c = transition_candidates(ctx(diag=diagnose(trajectory(**COLLAPSE)), base=VERL_BASE, k=4))
    assert c[0].overrides == {CLIP_HIGH: 0.28} and "DAPO" in c[0].rationale
    assert "entropy fell 9" in c[0].rationale.lower() and "steps 10-20" in c[0].rationale
    # Skywork-OR1's controller: +1e-4 per step over the 10-step segment; POLARIS: +0.1 after a large entropy fall
    assert {ENT_COEF: 0.001} in [o.overrides for o in c]
    assert any(o.overrides.get(TEMP) == pytest.approx(1.1) for o in c)
    c = transition_candidates(ctx(diag=diagnose(trajectory(**CLIPPING)), base=VERL_BASE))
    assert c[0].overrides == {MAX_LEN: 1024} and "Skywork-OR1" in c[0].rationale
    c = transition_candidates(ctx(diag=diagnose(trajectory(**DRIFT)), base=VERL_BASE))
    assert c[0].overrides == {KL_ON: True} and "drifts" in c[0].rationale
    assert {LR: pytest.approx(5e-7)} in [o.overrides for o in c]
    # with the KL loss already on, the anchor doubles its coefficient (PPO's adaptive KL)
    c = transition_candidates(ctx(diag=diagnose(trajectory(**DRIFT)), base={**VERL_BASE, KL_ON: True}))
    assert c[0].overrides == {KL_COEF: 0.002}


def test_a_healthy_run_still_gets_distinct_sensible_transitions():
    c = transition_candidates(ctx(diag=diagnose(trajectory()), base=VERL_BASE, k=4))
    assert len(c) == 4 and len({o.key() for o in c}) == 4
    assert c[0].overrides == {N: 16} and "LLMZero" in c[0].rationale  # capacity accumulates
    assert {"data.train_batch_size": 512, A + "ppo_mini_batch_size": 128} in [o.overrides for o in c]
    # no diagnosis at all (a stage that has none yet): the same capacity moves
    assert transition_candidates(ctx(diag=None, base=VERL_BASE, k=1))[0].overrides == {N: 16}


def test_regularisation_oscillates_back_once_the_dynamics_allow():
    raised = {**VERL_BASE, ENT_COEF: 0.004, KL_ON: True, KL_COEF: 0.01}
    healthy = transition_candidates(ctx(diag=diagnose(trajectory()), base=raised, k=6))
    assert {ENT_COEF: 0.003, KL_COEF: 0.005} in [o.overrides for o in healthy]
    collapsing = transition_candidates(ctx(diag=diagnose(trajectory(**COLLAPSE)), base=raised, k=6))
    assert all(o.overrides.get(ENT_COEF, 1) > 0.004 for o in collapsing if ENT_COEF in o.overrides)
    exploding = diagnose(trajectory(entropy=lambda s: 0.5 * 1.05 ** s))
    assert exploding.worst() == "entropy_explosion"
    c = transition_candidates(ctx(diag=exploding, base={**raised, CLIP_HIGH: 0.4}))
    assert c[0].overrides == {ENT_COEF: 0.003, CLIP_HIGH: 0.28}


def test_transitions_follow_feedback_and_never_repeat_a_sibling():
    diag = diagnose(trajectory(**COLLAPSE))
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, feedback=["keep temperature"], k=6))
    assert c and all(TEMP not in o.overrides for o in c)
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, feedback=["no clip higher"], k=6))
    assert c and all(CLIP_HIGH not in o.overrides for o in c)
    # "try clip higher" with clip-higher already at DAPO's value: the reviewer's knob still moves, first
    c = transition_candidates(ctx(diag=diagnose(trajectory()), base={**VERL_BASE, CLIP_HIGH: 0.28},
                                  feedback=["try clip higher"]))
    assert c[0].overrides[CLIP_HIGH] > 0.28 and "reviewer" in c[0].rationale
    sibling = TrialRecord(trial_id="s1", stage="schedule", config={**VERL.defaults(), **VERL_BASE, CLIP_HIGH: 0.28},
                          status=TrialStatus.COMPLETED, score=0.5, parent_step=10)
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, history=[sibling]))
    assert c and all(o.overrides != {CLIP_HIGH: 0.28} for o in c)
    rejected = transition_candidates(ctx(diag=diag, base=VERL_BASE, rejected=[{CLIP_HIGH: 0.28}]))
    assert all(o.overrides != {CLIP_HIGH: 0.28} for o in rejected)
    # the same config from another checkpoint is no duplicate
    other = sibling.model_copy(update={"parent_step": 5})
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, history=[other]))
    assert c[0].overrides == {CLIP_HIGH: 0.28}


def test_transitions_respect_constraints_and_the_memory_limit():
    diag = diagnose(trajectory(**CLIPPING))
    # dynamic batching with a token cap that holds today's sequences but not a doubled budget: the longer budget
    # brings the cap it implies (verl: the cap must hold prompt + response), and the critic accepts the pair
    tight = {**VERL_BASE, A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": 1100}
    cx = ctx(diag=diag, base=tight)
    c = transition_candidates(cx)
    longer = next(o for o in c if MAX_LEN in o.overrides)
    cap = longer.overrides[A + "ppo_max_token_len_per_gpu"]
    assert cap >= VERL_DEFAULTS["data.max_prompt_length"] + longer.overrides[MAX_LEN] and cap == 2200
    assert not VERL.check_constraints({**VERL.defaults(), **tight, **longer.overrides})
    assert "token caps it implies follow: ppo_max_token_len_per_gpu 1100->2200" in longer.rationale
    verdict = RulesCritic().critique(cx, [longer.model_copy(update={"candidate_id": "c0"}),
                                          Candidate(candidate_id="cap", stage="schedule",
                                                    overrides={A + "ppo_max_token_len_per_gpu": 4096})])
    by_id = {cr.candidate_id: cr for cr in verdict.critiques}
    assert by_id["c0"].accepted and verdict.pick == "c0"
    assert "may only raise it with data.max_response_length" in by_id["cap"].reasons[0]
    # a memory model that puts a longer budget or more rollouts over the limit
    def mem(cfg: dict) -> float:
        return 40.0 * cfg[MAX_LEN] / 512 * cfg[N] / 8
    c = transition_candidates(ctx(diag=diag, base=VERL_BASE, predict_memory=mem, memory_limit_gb=60.0))
    assert c and all(mem({**VERL.defaults(), **VERL_BASE, **o.overrides}) <= 60.0 for o in c)
    assert all(o.predicted_memory_gb == 40.0 for o in c)


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


def test_critic_rejects_siblings_system_knobs_and_memory_it_adds():
    diag = diagnose(trajectory(**CLIPPING))
    sibling = TrialRecord(trial_id="s1", stage="schedule", config={**VERL.defaults(), **VERL_BASE, MAX_LEN: 1024},
                          status=TrialStatus.COMPLETED, score=0.5, parent_step=10)
    def mem(cfg: dict) -> float:
        return 40.0 * cfg[MAX_LEN] / 512 * cfg[N] / 8
    cx = ctx(diag=diag, base=VERL_BASE, history=[sibling], predict_memory=mem, memory_limit_gb=100.0)
    cands = [Candidate(candidate_id="dup", stage="schedule", overrides={MAX_LEN: 1024}),
             Candidate(candidate_id="big", stage="schedule", overrides={MAX_LEN: 4096}),
             Candidate(candidate_id="sys", stage="schedule", overrides={A + "use_dynamic_bsz": True}),
             Candidate(candidate_id="n", stage="schedule", overrides={N: 16}),
             Candidate(candidate_id="n2", stage="schedule", overrides={N: 16})]
    verdict = RulesCritic().critique(cx, cands)
    by_id = {cr.candidate_id: cr for cr in verdict.critiques}
    assert "already tried from this checkpoint" in by_id["dup"].reasons[0]
    assert "exceeds the limit" in by_id["big"].reasons[0]
    assert "system-stage knob" in by_id["sys"].reasons[0]
    assert by_id["n"].accepted and not by_id["n2"].accepted and verdict.pick == "n"


def test_a_collapsing_run_is_stabilised_before_anything_else():
    # reward and validation fall, KL and lengths run away: a too-large step (as lr 50x collapses GRPO runs)
    crash = dict(reward=lambda s: 0.45 if s < 15 else 0.45 - 0.03 * (s - 15),
                 val=lambda s: 0.42 if s < 15 else 0.42 - 0.025 * (s - 15), kl=lambda s: 0.002 * 1.2 ** s,
                 length=lambda s: 300 + 20 * s, clip=lambda s: 0.01 * s, entropy=lambda s: 1.0 + 0.04 * s)
    d = diagnose(trajectory(**crash))
    assert d.worst() == "collapse" and d.findings[0].startswith("training collapses: the reward fell")
    c = transition_candidates(ctx(diag=d, base={**VERL_BASE, LR: 4e-6}, k=4))
    assert c[0].overrides == {LR: 2e-6, KL_ON: True} and "Training collapses" in c[0].rationale
    # no capacity, no longer budget, no exploration push while it collapses
    moved = {k for o in c for k in o.overrides}
    assert not moved & {N, MAX_LEN, "data.train_batch_size", ENT_COEF} and all(
        o.overrides.get(TEMP, 1.0) <= 1.0 and o.overrides.get(CLIP_HIGH, 0.2) <= 0.2 for o in c)


def test_every_finding_gets_an_answer_before_a_second_idea_for_one():
    both = {**COLLAPSE, **CLIPPING}
    c = transition_candidates(ctx(diag=diagnose(trajectory(**both)), base=VERL_BASE, k=3))
    assert c[0].overrides == {CLIP_HIGH: 0.28}
    assert {MAX_LEN: 1024} in [o.overrides for o in c]
    assert any(o.overrides.get(N) == 16 for o in c)  # capacity accumulates alongside


def test_only_the_branch_path_events_and_the_parent_config_count():
    from mart.state.models import HealthEvent

    other = HealthEvent(trial_id="elsewhere", step=3, rule="kl_blowup", severity="stop", message="x")
    healthy = diagnose(trajectory())
    c = transition_candidates(ctx(diag=healthy, base=VERL_BASE, health_events=[other]))
    assert c[0].overrides == {N: 16}  # another branch's blow-up is not this trajectory's
    clipped = diagnose(trajectory(), health_events=["response_clipping"])
    c = transition_candidates(ctx(diag=clipped, base=VERL_BASE))
    assert c[0].overrides == {MAX_LEN: 1024}
    # a best-so-far of the stage is not the parent: transitions change ctx.base_config only
    c = transition_candidates(ctx(diag=healthy, base=VERL_BASE, best_overrides={TEMP: 0.7}))
    assert all(TEMP not in o.overrides for o in c)


def test_kl_growing_with_the_reward_is_learning_not_drift():
    learning = diagnose(trajectory(kl=lambda s: 0.01 * s, grad=lambda s: 1.0 + 0.05 * s))
    assert "policy_drift" not in learning.severity
    stalled = diagnose(trajectory(kl=lambda s: 0.01 * s, reward=lambda s: 0.4, val=lambda s: 0.4,
                                  kl_key="actor/ppo_kl"))
    assert stalled.worst() == "policy_drift" and "without a reward gain" in stalled.findings[0]
    # two validation points are no trend
    assert diagnose(trajectory(steps=10)).val_slope is None


def test_kl_growth_a_kl_loss_explains_is_no_drift_and_accelerating_kl_is():
    flat = dict(reward=lambda s: 0.4, val=lambda s: 0.4)
    # under a KL loss, KL grows in proportion to the steps as the anchored policy learns: the anchor holds
    steady = diagnose(trajectory(kl=lambda s: 0.0005 * s, **flat))
    assert steady.kl_anchored and steady.kl_slope is not None and steady.kl_slope > 0.02
    assert "policy_drift" not in steady.severity
    # the same growth without a KL loss (ppo_kl) is drift: nothing bounds it
    assert "policy_drift" in diagnose(trajectory(kl=lambda s: 0.0005 * s, kl_key="actor/ppo_kl", **flat)).severity
    # under a KL loss, KL growing ever faster is drift: the anchor no longer holds it
    runaway = diagnose(trajectory(kl=lambda s: 0.001 * 1.15 ** s, **flat))
    assert runaway.kl_anchored and "policy_drift" in runaway.severity
    assert "steady growth" in next(f for f in runaway.findings if "drifts" in f)


def test_a_noisy_slope_is_no_trend():
    import random

    rng = random.Random(3)
    noise = [math.exp(rng.gauss(0, 0.15)) for _ in range(30)]
    flat = dict(reward=lambda s: 0.4, val=lambda s: 0.4)
    # grad norm drawn +-15% a step around a flat level: whatever its fitted slope, its interval holds zero
    d = diagnose(trajectory(grad=lambda s: 0.5 * noise[s - 1], **flat))
    assert d.grad_norm_slope_low is not None and d.grad_norm_slope_low < 0.02
    assert "policy_drift" not in d.severity
    # a clear rise stays a rise
    assert "policy_drift" in diagnose(trajectory(grad=lambda s: 0.3 * 1.08 ** s * noise[s - 1], **flat)).severity


def test_a_transition_projected_past_the_memory_limit_carries_smaller_micro_batches():
    micro = {R + "log_prob_micro_batch_size_per_gpu": 16, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
             A + "ppo_micro_batch_size_per_gpu": 8}
    # peak 47.4 GB at the checkpoint, +0.6 GB a step: 77.4 GB by step 60 at the same step size, over the 70 GB limit
    growing = diagnose(trajectory(memory=lambda s: 30 + 0.6 * s))
    assert growing.peak_memory_gb == pytest.approx(47.4) and growing.peak_memory_slope_gb == pytest.approx(0.6)
    c = all_transitions(ctx(diag=growing, base=VERL_BASE, k=4, memory_limit_gb=70.0, horizon=60))
    same_step = [o for o in c if LR not in o.overrides]
    assert same_step and all(micro.items() <= o.overrides.items() for o in same_step)
    assert all("Smaller micro batches" in o.rationale and "projected 77.4 GB" in o.rationale for o in same_step)
    # a halved step halves the lengthening: 62.4 GB, no change of micro batch
    half = [o for o in c if o.overrides.get(LR) == pytest.approx(5e-7)]
    assert half and not any(k in half[0].overrides for k in micro)
    # a slower growth, or no horizon to project to: nothing
    for d, kw in ((diagnose(trajectory(memory=lambda s: 30 + 0.1 * s)), {"horizon": 60}), (growing, {})):
        c = all_transitions(ctx(diag=d, base=VERL_BASE, k=4, memory_limit_gb=70.0, **kw))
        assert c and not any(k in o.overrides for o in c for k in micro)
    # a coordinated transition still merges its parts (their micro batches are no conflict) and halves once
    c = all_transitions(ctx(diag=diagnose(trajectory(memory=lambda s: 30 + 0.6 * s, **COLLAPSE)), base=VERL_BASE,
                            k=4, memory_limit_gb=70.0, horizon=60))
    bundle = next(o for o in c if o.rationale.startswith("Coordinated transition"))
    assert micro.items() <= bundle.overrides.items() and len(set(bundle.overrides) - set(micro)) >= 2
    # the stage admits a smaller micro batch, never a larger one (capacity_errors)
    from mart.nodes.stages.capacity import capacity_errors

    assert capacity_errors(ctx(base=VERL_BASE), {A + "ppo_micro_batch_size_per_gpu": 8}) == []
    assert capacity_errors(ctx(base=VERL_BASE), {A + "ppo_micro_batch_size_per_gpu": 32})


def test_a_named_categorical_knob_moves_to_another_choice():
    c = transition_candidates(ctx(diag=diagnose(trajectory()), base=VERL_BASE, feedback=["try kl_loss_type"]))
    assert c[0].overrides == {A + "kl_loss_type": "kl"} and "reviewer asked" in c[0].rationale


def test_every_rule_moves_catalogue_knobs_and_is_documented():
    from pathlib import Path

    from mart.nodes.agents.schedule import RULES

    learning = [p.key for p in VERL.stage_params("schedule")]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    for rule in RULES:
        for mv in rule.moves:  # a renamed verl key must not silently switch a rule off
            assert any(k == mv.suffix or k.endswith("." + mv.suffix) for k in learning), (rule.name, mv.suffix)
        assert f"| {rule.name} |" in docs, rule.name


def test_critic_marks_a_transition_that_shrinks_capacity():
    cx = ctx(diag=diagnose(trajectory(**COLLAPSE)), base=VERL_BASE)
    grow = Candidate(candidate_id="grow", stage="schedule", overrides={CLIP_HIGH: 0.28, N: 16})
    shrink = Candidate(candidate_id="shrink", stage="schedule", overrides={CLIP_HIGH: 0.28, N: 4})
    same = Candidate(candidate_id="same", stage="schedule", overrides={CLIP_HIGH: 0.28})
    verdict = RulesCritic().critique(cx, [shrink, grow, same])
    by_id = {cr.candidate_id: cr for cr in verdict.critiques}
    assert verdict.pick == "grow" and by_id["shrink"].score == pytest.approx(by_id["same"].score / 2)
    assert "shrinks capacity (n)" in by_id["shrink"].reasons[-1]


# --------------------------------------------------------------------------- capacity (issue 24)
def test_staged_limits_follow_deepscaler_and_a_rising_clip_ratio_triggers_them():
    """DeepScaleR raised its limit 8k -> 16k -> 24k (the start limit added per stage) once responses grew into it:
    from a root at 512 the first stage doubles, the next adds 512; a small clip ratio that keeps rising already
    asks for it, a flat one does not."""
    root = TrialRecord(trial_id="sch-root", stage="schedule", config={**VERL.defaults(), **VERL_BASE, MAX_LEN: 512},
                       status=TrialStatus.COMPLETED, score=0.4)
    rising = diagnose(trajectory(clip=lambda s: 0.001 * s, length=lambda s: 300 + 3 * s))
    assert rising.response_clip_ratio < 0.05 and "length_clipping" not in rising.severity  # no finding yet
    first = transition_candidates(ctx(diag=rising, base=VERL_BASE, history=[root]))
    assert first[0].overrides == {MAX_LEN: 1024} and "DeepScaleR" in first[0].rationale
    assert "rising" in first[0].rationale
    second = transition_candidates(ctx(diag=rising, base={**VERL_BASE, MAX_LEN: 1024}, history=[root]))
    assert second[0].overrides == {MAX_LEN: 1536}
    flat = diagnose(trajectory(clip=lambda s: 0.03, length=lambda s: 300.0))
    assert all(MAX_LEN not in o.overrides for o in transition_candidates(ctx(diag=flat, base=VERL_BASE, k=2)))


def test_a_longer_limit_is_priced_by_the_job_model_and_refused_over_the_margin():
    """Responses measured cut at the limit say nothing of a longer limit's tail: the job model lets the longest
    response reach the new limit (memory and step time grow), so a limit raise that crosses the margin is not
    accepted, and proposed only with smaller micro batches that bring it under the margin, while one that fits is
    proposed as it is."""
    from mart.nodes.agents.job_model import JobModel, Observation
    from tests.nodes.test_job_model import base_config, job

    cfg = {**base_config(), A + "ppo_micro_batch_size_per_gpu": 8}
    model = JobModel(job(), cfg)
    model.fit([Observation(config=cfg, phases={"gen": 60.0, "old_log_prob": 10.0, "update_actor": 30.0, "other": 5.0},
                           peak_gb=None, resp_mean=950, resp_max=2048, prompt_mean=250, clip_ratio=0.08)])
    now, longer = model.predict(cfg), model.predict({**cfg, MAX_LEN: 4096})
    assert longer.peak_gb > now.peak_gb + 5 and longer.step_s > 1.2 * now.step_s
    limit = (now.peak_gb + longer.peak_gb) / 2
    diag = diagnose(trajectory(**CLIPPING))

    def cx(memory_limit: float) -> AgentContext:
        return ctx(diag=diag, base=cfg, job_model=model, memory_limit_gb=memory_limit,
                   predict_memory=lambda c: model.predict(c).peak_gb)

    # over the margin, the longer limit comes only with its micro batches halved, predicted under the limit (a
    # micro batch changes no learning); the plain raise is refused
    longer_ones = [o for o in transition_candidates(cx(limit)) if MAX_LEN in o.overrides]
    assert longer_ones and all(o.overrides.get(A + "ppo_micro_batch_size_per_gpu") == 4
                               and o.predicted_memory_gb < limit for o in longer_ones)
    assert "likely over it" in longer_ones[0].rationale
    verdict = RulesCritic().critique(cx(limit), [Candidate(candidate_id="long", stage="schedule",
                                                           overrides={MAX_LEN: 4096})])
    assert not verdict.critiques[0].accepted and "exceeds the limit" in verdict.critiques[0].reasons[0]
    assert transition_candidates(cx(longer.peak_gb + longer.gap_gb))[0].overrides == {MAX_LEN: 4096}


def test_the_critic_prefers_a_finding_no_sibling_has_answered_yet():
    """A checkpoint's branches test distinct hypotheses first: with clip-higher already run from it against the
    entropy collapse, the responses hitting the limit get their answer before a second entropy idea."""
    both = diagnose(trajectory(**COLLAPSE, length=lambda s: 300 + 8 * s, clip=lambda s: 0.004 * s))
    assert {"entropy_collapse", "length_clipping"} <= set(both.severity)
    cands = [Candidate(candidate_id="hot", stage="schedule", overrides={TEMP: 1.1, CLIP_HIGH: 0.28}),
             Candidate(candidate_id="long", stage="schedule", overrides={MAX_LEN: 1024})]
    alone = RulesCritic().critique(ctx(diag=both, base=VERL_BASE), cands)
    assert alone.pick == "hot"  # the more severe finding first
    sibling = TrialRecord(trial_id="s1", stage="schedule", config={**VERL.defaults(), **VERL_BASE, CLIP_HIGH: 0.28},
                          status=TrialStatus.COMPLETED, score=0.5, parent_step=10)
    after = RulesCritic().critique(ctx(diag=both, base=VERL_BASE, history=[sibling]), cands)
    assert after.pick == "long"
    hot = next(c for c in after.critiques if c.candidate_id == "hot")
    assert any("a sibling already answers this finding" in r for r in hot.reasons)


# --------------------------------------------------------------------------- issue 44: coordinated transitions
def _root(lr: float = 1e-6) -> TrialRecord:
    return TrialRecord(trial_id="root", stage="schedule", kind="baseline", status=TrialStatus.COMPLETED, score=0.4,
                       config={**VERL.defaults(), **VERL_BASE, LR: lr})


def test_a_coordinated_transition_comes_first_and_answers_every_finding_at_once():
    """Single knobs move the score by about one measurement's noise; the diagnosis's answers together by several
    (docs/runtime.md): the first transition merges each finding's best answer and the larger step, the second is
    the same without the larger step, and the critic ranks the merged one above any single answer."""
    both = diagnose(trajectory(**COLLAPSE, **CLIPPING))
    cx = ctx(diag=both, base={**VERL_BASE, LR: 1e-6}, history=[_root()], k=4)
    c = all_transitions(cx)
    assert coordinated(c[0]) and coordinated(c[1]) and coordinated(c[2]) and not coordinated(c[3])
    first, second = c[0].overrides, c[1].overrides
    # the third: the same without the capacity move (one predicted near the memory limit must not sink the rest)
    assert MAX_LEN not in c[2].overrides and c[2].overrides[LR] == pytest.approx(2e-6)
    assert first[CLIP_HIGH] == 0.28 and first[MAX_LEN] == 1024  # the entropy fall's and the clipping's answers
    assert first[LR] == pytest.approx(2e-6) and first[KL_ON] is True  # the larger step, anchored
    assert LR not in second and KL_ON not in second and {k: v for k, v in first.items() if k not in (LR, KL_ON)} == second
    assert N not in first  # capacity because the run is healthy stays a single branch
    verdict = RulesCritic().critique(cx, [o.model_copy(update={"candidate_id": f"c{i}"}) for i, o in enumerate(c)])
    assert verdict.pick == "c0"


def test_the_larger_step_is_taken_once_per_schedule_and_only_with_its_kl_anchor():
    healthy = diagnose(trajectory())
    c = all_transitions(ctx(diag=healthy, base={**VERL_BASE, LR: 1e-6}, history=[_root()], k=6))
    assert {LR: pytest.approx(2e-6), KL_ON: True} in [o.overrides for o in c]
    # a path already at twice the start keeps its step: no larger-step (and so no lone KL anchor either)
    c = all_transitions(ctx(diag=healthy, base={**VERL_BASE, LR: 2e-6}, history=[_root()], k=6))
    assert all(o.overrides.get(LR, 0) <= 2e-6 for o in c) and {KL_ON: True} not in [o.overrides for o in c]
    # without a root to read the start from, or while the policy drifts, it is not offered
    assert all(LR not in o.overrides or o.overrides[LR] < 1e-6
               for o in all_transitions(ctx(diag=healthy, base={**VERL_BASE, LR: 1e-6}, k=6)))
    drifting = all_transitions(ctx(diag=diagnose(trajectory(**DRIFT)), base={**VERL_BASE, LR: 1e-6},
                                   history=[_root()], k=6))
    assert all(o.overrides.get(LR, 0) <= 1e-6 for o in drifting)


def test_on_a_cpu_device_no_transition_needs_the_reference_model_and_the_larger_step_goes_alone():
    # verl's reference model cannot start with trainer.device=cpu (verl/space.py), so no KL move is offered there
    cpu = {**VERL_BASE, LR: 1e-6, "trainer.device": "cpu"}
    c = all_transitions(ctx(diag=diagnose(trajectory()), base=cpu, history=[_root()], k=6))
    assert {LR: pytest.approx(2e-6)} in [o.overrides for o in c]
    drift = all_transitions(ctx(diag=diagnose(trajectory(**DRIFT)), base=cpu, history=[_root()], k=6))
    assert drift and not any(o.overrides.get(KL_ON) for o in c + drift)


def test_a_larger_step_whose_kl_anchor_does_not_fit_in_memory_goes_alone():
    def mem(cfg):  # the reference model of a KL loss is what does not fit
        return 50.0 if cfg.get(KL_ON) else 40.0

    c = all_transitions(ctx(diag=diagnose(trajectory()), base={**VERL_BASE, LR: 1e-6}, history=[_root()], k=6,
                            predict_memory=mem, memory_limit_gb=45.0))
    assert {LR: pytest.approx(2e-6)} in [o.overrides for o in c]
    assert all(not o.overrides.get(KL_ON) for o in c)


def test_a_grad_norm_rise_the_entropy_collapse_explains_is_no_drift():
    """A sharper policy has larger gradients: beside an entropy collapse the grad norm rises with it. Read as drift
    (with a flat reward), that rise halved the step in both transitions (Qwen3-0.6B, issue 44) while the collapse
    wanted the entropy controls; it is the collapse's symptom while the grad norm has risen by no more than the
    entropy fell, and still drift beyond that."""
    falling = dict(entropy=lambda s: 1.0 - 0.017 * s, reward=lambda s: 0.4, val=lambda s: 0.4)  # 49% left at 30
    # grad norm up ~1.8x while entropy fell to 0.49 (at most 1 / 0.49 = 2.0x): 3% a step over the window
    with_collapse = diagnose(trajectory(grad=lambda s: 0.3 / (1.0 - 0.017 * s) ** 0.9, **falling))
    assert "entropy_collapse" in with_collapse.severity
    assert with_collapse.grad_norm_slope_low > 0.02 and with_collapse.grad_norm_ratio < 1 / with_collapse.entropy_ratio
    assert "policy_drift" not in with_collapse.severity
    c = all_transitions(ctx(diag=with_collapse, base={**VERL_BASE, LR: 1e-6}, history=[_root()], k=4))
    assert c and not any(o.overrides.get(LR, 1e-6) < 1e-6 for o in c)  # no transition halves the step
    # a rise beyond the entropy's fall (4x against 2x) is drift, with or without the collapse beside it
    beyond = diagnose(trajectory(grad=lambda s: 0.3 / (1.0 - 0.017 * s) ** 2, **falling))
    assert "entropy_collapse" in beyond.severity and "policy_drift" in beyond.severity
    # the same rise without an entropy fall is drift as before
    flat = diagnose(trajectory(grad=lambda s: 0.3 / (1.0 - 0.017 * s) ** 0.9, reward=lambda s: 0.4, val=lambda s: 0.4))
    assert "policy_drift" in flat.severity
