"""Stage 2's final choice under noise: the defaults are a contender like any other, a change needs two seeds and
a lead beyond the noise of the difference, a config near a collapse or with a collapse signal never replaces
healthy defaults, the smaller move wins when the evidence is weak, and every re-run (the defaults' included)
counts in the confirm budget (that part through stage_control: tests/nodes/test_stage2_budget.py)."""

from __future__ import annotations

import random

from mart.state.objectives import (
    RISK_AT_CLIFF,
    RISK_BELOW_COLLAPSE,
    Contender,
    learning_choice,
    move_size,
    next_reevaluation,
    pooled_noise,
    student_z,
)

NOISE = 0.01


def base(*scores: float) -> Contender:
    return Contender("base", list(scores), [], is_baseline=True)


def test_a_lucky_single_high_run_never_replaces_the_defaults():
    # one run 5 noise above the defaults, never re-run: one seed is no evidence
    lucky = Contender("lucky", [0.45], [], move=1)
    assert learning_choice([base(0.40), lucky], NOISE)[0].is_baseline


def test_a_lucky_config_at_the_cliff_edge_loses_even_when_its_seeds_were_spared():
    # lr x6 where lr x8 collapsed: two seeds that happened not to collapse, each 2.5 noise above the defaults
    edge = Contender("edge", [0.425, 0.425], [], move=2, risk=RISK_AT_CLIFF)
    assert learning_choice([base(0.40, 0.40), edge], NOISE)[0].is_baseline
    # a config whose own run showed a collapse signal never replaces healthy defaults either
    fell = Contender("fell", [0.46, 0.46], ["validation fell 0.05 from its best 0.51"], move=1)
    assert learning_choice([base(0.40, 0.40), fell], NOISE)[0].is_baseline
    # nor one whose re-run did not finish
    broke = Contender("broke", [0.46], ["run broke-s2 ended stopped early"], move=1)
    assert learning_choice([base(0.40, 0.40), broke], NOISE)[0].is_baseline


def test_a_real_improvement_on_two_seeds_still_wins():
    good = Contender("good", [0.44, 0.435], [], move=1)
    winner, why = learning_choice([base(0.40, 0.402), good], NOISE)
    assert winner is good and "good beats the defaults" in why
    # ... and a clear one below a collapse further up (RISK_BELOW_COLLAPSE) wins too, with a larger lead
    below = Contender("below", [0.45, 0.445], [], move=1, risk=RISK_BELOW_COLLAPSE)
    assert learning_choice([base(0.40, 0.402), below], NOISE)[0] is below
    near = Contender("near", [0.43, 0.425], [], move=1, risk=RISK_BELOW_COLLAPSE)  # 2.7 standard errors only
    assert learning_choice([base(0.40, 0.402), near], NOISE)[0].is_baseline
    assert learning_choice([base(0.40, 0.402), Contender("n", [0.43, 0.425], [], move=1)], NOISE)[0].key == "n"


def test_the_lead_must_clear_the_noise_and_the_unbiased_rerun_must_agree():
    # within 2 standard errors of the difference (noise x sqrt(1/2 + 1/2) = 0.01): the defaults stay
    close = Contender("close", [0.42, 0.415], [], move=1)
    assert learning_choice([base(0.40, 0.40), close], NOISE)[0].is_baseline
    # the first run was picked for being high; a mean carried by it alone (its re-run below the defaults) loses
    carried = Contender("carried", [0.47, 0.395], [], move=1)
    assert learning_choice([base(0.40), carried], NOISE / 2)[0].is_baseline
    # a noise estimated from few points asks for a larger lead (Student t at the same level: 2.87 with 4 dof,
    # 2.32 with 10)
    assert 2.75 < student_z(2.0, 4) < 2.95 and 2.28 < student_z(2.0, 10) < 2.36 and student_z(2.0, None) == 2.0
    mid = Contender("mid", [0.424, 0.424], [], move=1)
    assert learning_choice([base(0.40, 0.40), mid], NOISE, dof=100)[0] is mid
    assert learning_choice([base(0.40, 0.40), mid], NOISE, dof=3)[0].is_baseline


def test_with_weak_evidence_the_smaller_move_wins():
    small = Contender("small", [0.43, 0.43], [], move=1)
    big = Contender("big", [0.435, 0.435], [], move=3)  # half a standard error better than the small move
    assert learning_choice([base(0.40, 0.40), big, small], NOISE)[0] is small
    much = Contender("much", [0.445, 0.445], [], move=3)  # 1.5 standard errors better: the evidence carries it
    assert learning_choice([base(0.40, 0.40), much, small], NOISE)[0] is much
    # ... unless it is riskier (below a collapse): then it needs 3 standard errors over the safer move
    risky = Contender("risky", [0.445, 0.445], [], move=3, risk=RISK_BELOW_COLLAPSE)
    assert learning_choice([base(0.40, 0.40), risky, small], NOISE)[0] is small
    # a larger move never wins without beating the defaults on its own, whatever the smaller one did
    assert learning_choice([base(0.40, 0.40), Contender("x", [0.415, 0.415], [], move=3)], NOISE)[0].is_baseline
    assert move_size({"lr": 4e-6}, {"lr": 1e-6}) == 2 and move_size({"lr": 1.5e-6}, {"lr": 1e-6}) == 1
    assert move_size({"lr": 2e-6, "use_kl": True, "n": 16}, {"lr": 1e-6, "use_kl": False, "n": 8}) == 3
    assert move_size({}, {"lr": 1e-6}) == 0


def test_pooled_noise_is_unbiased_where_a_median_of_few_point_stds_sits_low():
    rng = random.Random(1)
    sigma, pooled, naive = 0.01, [], []
    for _ in range(300):
        ests = []
        for _ in range(6):  # six trials, 4 tail points each: residual stds with 2 dof
            xs = [rng.gauss(0, sigma) for _ in range(3)]
            m = sum(xs) / 3
            ests.append(((sum((x - m) ** 2 for x in xs) / 2) ** 0.5, 2))
        pooled.append(pooled_noise(ests)[0])
        naive.append(sorted(s for s, _ in ests)[2:4][0] / 2 + sorted(s for s, _ in ests)[2:4][1] / 2)
    med = sorted(pooled)[150]
    assert 0.0093 < med < 0.0107, med
    assert sorted(naive)[150] < 0.0092  # what the old median of stds gave
    assert pooled_noise([(0.01, 2), (0.5, 2), (0.011, 2)])[0] < 0.02  # one wild estimate does not inflate it
    assert pooled_noise([]) is None


def test_reevaluation_order_the_best_hopeful_then_the_defaults_then_nothing_that_cannot_change_the_choice():
    a = Contender("a", [0.45], [], move=1)
    b = Contender("b", [0.43], [], move=1)
    edge = Contender("edge", [0.50], [], move=2, risk=RISK_AT_CLIFF)
    low = Contender("low", [0.39], [], move=1)
    cs = [base(0.40), a, b, edge, low]
    assert next_reevaluation(cs, NOISE, set()) is a  # the cliff-edge config is not worth a re-run
    a.scores.append(0.44)
    assert next_reevaluation(cs, NOISE, {"a"}).is_baseline  # a re-run change leads the defaults: re-measure them
    cs[0].scores.append(0.40)
    # a now wins; b (1 run, below a) cannot change that, low neither
    assert next_reevaluation(cs, NOISE, {"a", "base"}) is None
    # had a's re-run dropped, b is the next hopeful
    a.scores[1] = 0.38
    assert next_reevaluation(cs, NOISE, {"a", "base"}) is b


def test_a_rerun_goes_to_the_config_nearest_to_winning_not_to_a_high_but_risky_score():
    # 0.03 above the defaults below a collapse (needs 3 standard errors) vs 0.025 with no risk (needs 2)
    risky = Contender("risky", [0.43], [], move=3, risk=RISK_BELOW_COLLAPSE)
    safe = Contender("safe", [0.425], [], move=1)
    assert next_reevaluation([base(0.40), risky, safe], NOISE, set()) is safe
    # ... but a risky score far enough ahead is worth its re-run first
    far = Contender("far", [0.45], [], move=3, risk=RISK_BELOW_COLLAPSE)
    assert next_reevaluation([base(0.40), far, safe], NOISE, set()) is far


def test_without_measured_defaults_the_best_single_run_is_confirmed_before_it_wins():
    # the defaults' run collapsed (no score): the best single runs are re-run while one could top the best
    top = Contender("top", [0.45], [], move=1)
    second = Contender("second", [0.44], [], move=1)
    edge = Contender("edge", [0.50], [], move=2, risk=RISK_AT_CLIFF)
    cs = [top, second, edge]
    assert next_reevaluation(cs, NOISE, set()) is top
    top.scores.append(0.42)  # its re-run fell below the second's single run: confirm that one too
    assert next_reevaluation(cs, NOISE, {"top"}) is second
    second.scores.append(0.445)
    assert next_reevaluation(cs, NOISE, {"top", "second"}) is None
    winner, why = learning_choice(cs, NOISE)
    assert winner is second and "no measured defaults" in why  # never the cliff-edge config
