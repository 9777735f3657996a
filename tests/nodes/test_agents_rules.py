"""The rules strategy: proposals follow the profile and feedback; the critic enforces the margin."""

from __future__ import annotations

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.feedback import parse_feedback
from mart.nodes.agents.memory_model import MemoryModel
from mart.nodes.agents.rules import RulesCritic, RulesProposer
from mart.state.models import Candidate, PhaseProfile, Profile, TrialRecord, TrialStatus, config_hash
from tests.support.toy_backend import CKPT, LR, MB, SEQS, SPACE


def profile(bottleneck: str, headroom: float = 2.0) -> Profile:
    shares = {"gen": 0.1, "update_actor": 0.1, bottleneck: 0.8}
    return Profile(trial_id="b", stage="system", throughput=100, step_time_s=1,
                   phases=[PhaseProfile(name=k, mean_s=v, share=v) for k, v in shares.items()],
                   bottleneck=bottleneck, peak_memory_gb=1.0, memory_limit_gb=1.0 + headroom,
                   memory_headroom_gb=headroom)


def ctx(stage="system", prof=None, history=(), feedback=(), limit=3.0, predict=None) -> AgentContext:
    return AgentContext(stage=stage, objective="x", search_space=SPACE, base_config=SPACE.defaults(),
                        best_overrides={}, profile=prof, history=list(history), feedback=list(feedback),
                        memory_limit_gb=limit, predict_memory=predict or (lambda c: None), num_candidates=3)


def test_generation_bound_profile_leads_with_rollout_concurrency():
    cands = RulesProposer().propose(ctx(prof=profile("gen")))
    assert cands[0].overrides == {SEQS: 16}
    assert "gen takes 80%" in cands[0].rationale
    cands = RulesProposer().propose(ctx(prof=profile("update_actor")))
    assert set(cands[0].overrides) <= {MB, CKPT}


def test_proposals_skip_tried_configs_and_are_deterministic():
    base = SPACE.defaults()
    tried = TrialRecord(trial_id="t1", stage="system", config={**base, SEQS: 16}, status=TrialStatus.COMPLETED,
                        throughput=1.0)
    a = RulesProposer().propose(ctx(prof=profile("gen"), history=[tried]))
    b = RulesProposer().propose(ctx(prof=profile("gen"), history=[tried]))
    assert [c.overrides for c in a] == [c.overrides for c in b]
    assert {SEQS: 16} not in [c.overrides for c in a]


def test_feedback_is_followed():
    c = ctx(prof=profile("gen"), feedback=["keep max_num_seqs as it is, and lower the micro batch"])
    for cand in RulesProposer().propose(c):
        assert SEQS not in cand.overrides
        if MB in cand.overrides:
            assert cand.overrides[MB] < SPACE[MB].default
    fb = parse_feedback(["too risky for memory"], SPACE)
    assert fb.prefer_low_memory


def test_critic_rejects_over_margin_duplicates_and_constraint_breaks():
    base = SPACE.defaults()
    hist = [TrialRecord(trial_id="t", stage="system", config={**base, SEQS: 16}, status=TrialStatus.COMPLETED)]
    predict = lambda c: 1.0 + 0.1 * c[MB]  # noqa: E731
    cands = [
        Candidate(candidate_id="big", stage="system", overrides={MB: 64, SEQS: 64}, expected_gain=1.0),
        Candidate(candidate_id="dup", stage="system", overrides={SEQS: 16}, expected_gain=1.0),
        Candidate(candidate_id="bad", stage="system", overrides={MB: 16, SEQS: 4}, expected_gain=1.0),
        Candidate(candidate_id="ok", stage="system", overrides={MB: 4}, expected_gain=0.2),
    ]
    verdict = RulesCritic().critique(ctx(history=hist, predict=predict, limit=3.0), cands)
    by = {c.candidate_id: c for c in verdict.critiques}
    assert verdict.pick == "ok"
    assert "exceeds the limit" in by["big"].reasons[0]
    assert "duplicate" in by["dup"].reasons[0]
    assert "mb_le_seqs" in " ".join(by["bad"].reasons)
    none = RulesCritic().critique(ctx(history=hist, predict=predict), cands[:2])
    assert none.pick is None and "big" in none.feedback


def test_learning_stage_reacts_to_instability():
    hist = [TrialRecord(trial_id="l1", stage="learning", kind="baseline", config=SPACE.defaults(),
                        status=TrialStatus.COMPLETED, score=0.5)]
    from mart.state.models import HealthEvent

    c = ctx(stage="learning", history=hist)
    c.health_events = [HealthEvent(trial_id="l1", step=5, rule="grad_norm_explosion", severity="stop", message="x")]
    first = RulesProposer().propose(c)[0]
    assert first.overrides[LR] < SPACE[LR].default
    calm = RulesProposer().propose(ctx(stage="learning", history=hist))[0]
    assert calm.overrides.get(LR, 0) > SPACE[LR].default


def test_memory_model_learns_from_single_knob_pairs():
    base = SPACE.defaults()
    hist = [
        TrialRecord(trial_id="a", stage="system", config={**base, MB: 2}, peak_memory_gb=1.0),
        TrialRecord(trial_id="b", stage="system", config={**base, MB: 8}, peak_memory_gb=4.0),
    ]
    m = MemoryModel.fit(hist, [p.key for p in SPACE.params])
    assert abs(m.learned[MB] - 1.0) < 1e-9  # peak proportional to MB in these two trials
    assert abs(m.predict({**base, MB: 16}) - 8.0) < 1e-6
    oom = TrialRecord(trial_id="c", stage="system", config={**base, SEQS: 256}, status=TrialStatus.OOM)
    m2 = MemoryModel.fit([oom], [p.key for p in SPACE.params], capacity_gb=5.0)
    assert m2.predict({**base, SEQS: 256}) >= 5.0


def test_config_hash_ignores_key_order_and_sees_every_value():
    a = {MB: 4, SEQS: 16, CKPT: True}
    reordered = {CKPT: True, SEQS: 16, MB: 4}
    assert config_hash(a) == config_hash(reordered)  # built independently, in another order
    assert config_hash(a) != config_hash({**a, MB: 8})
    assert config_hash(a) != config_hash({**a, CKPT: False})
    assert config_hash({"x": 1}) != config_hash({"x": "1"})  # a string is not the number


def test_critic_uses_the_backends_own_validation():
    c = ctx()
    c.validate_config = lambda full: ["verl: real_train_batch_size must be divisible"] if full[MB] == 4 else []
    cands = [Candidate(candidate_id="a", stage="system", overrides={MB: 4}, expected_gain=1.0),
             Candidate(candidate_id="b", stage="system", overrides={MB: 8}, expected_gain=0.5)]
    verdict = RulesCritic().critique(c, cands)
    assert verdict.pick == "b"
    assert "divisible" in verdict.critiques[0].reasons[0]


def test_critic_refuses_a_candidate_predicted_just_above_the_limit():
    limit = 3.0
    cands = [Candidate(candidate_id="over", stage="system", overrides={MB: 8}, expected_gain=1.0),
             Candidate(candidate_id="under", stage="system", overrides={MB: 4}, expected_gain=0.1)]
    predict = {8: 1.05 * limit, 4: 0.5 * limit}  # 5% over the limit: no tolerance for "close enough"
    verdict = RulesCritic().critique(ctx(limit=limit, predict=lambda c: predict[c[MB]]), cands)
    by = {c.candidate_id: c for c in verdict.critiques}
    assert not by["over"].accepted
    assert by["under"].accepted
    assert verdict.pick == "under"
    alone = RulesCritic().critique(ctx(limit=limit, predict=lambda c: predict[c[MB]]), cands[:1])
    assert alone.pick is None


def test_rejection_summary_states_each_reason_once_with_its_candidates():
    from mart.nodes.agents.rules import rejection_summary
    from mart.state.models import Critique

    over = "predicted peak memory 75.00 GB exceeds the limit 72.00 GB"
    crits = [Critique(candidate_id="c0", accepted=False, reasons=[over]),
             Critique(candidate_id="c1", accepted=False, reasons=["tried before"]),
             Critique(candidate_id="c2", accepted=False, reasons=[over])]
    text = rejection_summary(crits)
    assert text.count(over) == 1 and f"{over} (c0, c2)" in text and "tried before (c1)" in text
    assert not text.startswith("critic")  # the node and the console add "critic" once


def test_a_rationale_says_what_its_own_direction_does():
    # issue 47: a smaller micro batch was explained as "fewer, larger backward passes" (the note of a larger one)
    from mart.nodes.agents.feedback import parse_feedback as fb
    from mart.nodes.agents.knob_effects import effect_of
    from mart.trial_runner.registry import load_backend

    space = load_backend("verl").search_space()
    c = AgentContext(stage="system", objective="x", search_space=space, base_config=space.defaults(),
                     best_overrides={}, profile=profile("update_actor"), history=[], feedback=[], memory_limit_gb=70.0,
                     predict_memory=lambda cfg: None, num_candidates=3)
    mb = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    _, down = RulesProposer()._system_score(c, space[mb], "down", 16, 8, fb([], space))
    _, up = RulesProposer()._system_score(c, space[mb], "up", 16, 32, fb([], space))
    assert "fewer, larger backward passes" in up and "larger" not in down, down
    assert "more, smaller backward passes" in down
    # every knob with a note: a move against its faster direction never prints the faster direction's note
    checked = 0
    for spec in space.stage_params("system"):
        eff = effect_of(spec)
        if not eff.note or spec.kind == "bool" or eff.faster not in ("up", "down"):
            continue
        against = "down" if eff.faster == "up" else "up"
        old = spec.default
        new = old // 2 if against == "down" else old * 2
        _, why = RulesProposer()._system_score(c, spec, against, old, new, fb([], space))
        assert eff.note not in why and (not eff.note_against or eff.note_against in why), (spec.key, why)
        checked += 1
    assert checked >= 5
