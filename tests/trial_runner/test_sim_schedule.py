"""The simulator's learning model under schedules (issue 13): path-consistent, static trajectories unchanged.

(a) a static config plays exactly as before schedules (the frozen copy in ``sim_learning_v1``);
(b) a branch with unchanged knobs equals the unbranched continuation;
(c) no term rewards "being a schedule": a switch changes only what happens from the branch point on;
then the mid-run dynamics a schedule may exploit (docs/sim.md, "Schedules").
"""

from __future__ import annotations

import math
import random

import pytest

from bench.baselines.space import random_overrides, repair, valid
from mart.trial_runner.sim import SimBackend, load_scenario
from mart.trial_runner.sim import learning as L
from tests.trial_runner import sim_learning_v1 as V1

SCENARIOS = ["qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"]
A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
SERIES = ("score", "reward", "entropy", "ppo_kl", "kl_loss", "grad_norm", "pg_clipfrac", "lr", "resp_mean_untruncated",
          "hazard")


def random_configs(scenario: str, n: int, seed: int = 0) -> list[dict]:
    """The defaults and ``n - 1`` random valid learning configs (every stage-2 knob, whole catalogue ranges)."""
    backend = SimBackend(scenario=scenario)
    space, base = backend.search_space(), backend.base_config()
    rng = random.Random(seed)
    out = [dict(base)]
    while len(out) < n:
        over = repair(space, base, random_overrides(space, "learning", base, rng))
        if valid(space, base, over):
            out.append({**base, **over})
    return out


def assert_same(a, b, tol: float = 1e-9) -> None:
    for name in SERIES:
        xs, ys = getattr(a, name), getattr(b, name)
        assert len(xs) == len(ys), name
        for i, (x, y) in enumerate(zip(xs, ys)):
            assert abs(x - y) <= tol * max(1.0, abs(y)), f"{name}[{i}]: {x} != {y}"
    assert (a.collapse_step, a.collapse_kind) == (b.collapse_step, b.collapse_kind)


# ------------------------------------------------------------------------------------------ (a)
@pytest.fixture
def pre_issue24(monkeypatch):
    """The learning model without issue 24's non-stationary terms (the temperature optimum following the
    policy's entropy, the hazard growing with the response length): what the frozen copy recorded. Issue 24
    changes static trajectories on purpose through these two terms (and the 0.6B-Base's length growth, a
    scenario value both models read); everything else must play as before."""
    monkeypatch.setattr(L, "TEMP_SHARPEN", 0.0)
    monkeypatch.setattr(L, "LATE_HAZARD", 0.0)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_static_configs_play_exactly_as_before_schedules(scenario: str, pre_issue24) -> None:
    sc = load_scenario(scenario)
    for cfg in random_configs(scenario, 40, seed=SCENARIOS.index(scenario)):
        for steps, draw in ((30, math.inf), (60, 1.0), (150, 0.2)):
            assert_same(L.learning_trajectory(cfg, sc, steps, draw), V1.learning_trajectory(cfg, sc, steps, draw))
        assert L.final_score_noise_free(cfg, sc, 30) == pytest.approx(V1.final_score_noise_free(cfg, sc, 30), abs=1e-9)


def test_the_stage2_grid_scores_are_unchanged(pre_issue24) -> None:
    """The learning grid the benchmark's ground truth ranks (extreme lr, KL, temperature included)."""
    from mart.trial_runner.sim.model import LEARNING_GRID, base_config

    sc = load_scenario("qwen3-0.6b-1x8")
    cfg0 = base_config(sc)
    rng = random.Random(3)
    for _ in range(60):
        over = {k: rng.choice(v) for k, v in LEARNING_GRID.items()}
        cfg = {**cfg0, **over}
        assert L.final_score_noise_free(cfg, sc, 30) == pytest.approx(V1.final_score_noise_free(cfg, sc, 30), abs=1e-9)


# ------------------------------------------------------------------------------------------ (b)
@pytest.mark.parametrize("scenario", ["qwen3-8b-1x8", "qwen3-0.6b-1x8"])
def test_a_branch_with_unchanged_knobs_equals_the_unbranched_continuation(scenario: str) -> None:
    sc = load_scenario(scenario)
    cfgs = random_configs(scenario, 12, seed=7)
    cfgs.append({**cfgs[0], A + "optim.lr_warmup_steps_ratio": 0.2, A + "optim.lr": 8e-6})  # warm-up, likely collapse
    for cfg in cfgs:
        for draw in (math.inf, 1.0, 0.05):
            whole = L.learning_trajectory(cfg, sc, 40, draw)
            for at in (1, 13, 27):
                head = L.learning_trajectory(cfg, sc, 40, draw)  # the parent checkpoints every step
                tail = L.learning_trajectory(cfg, sc, 40, draw, start=head.state_at(at))
                assert tail.first_step == at + 1
                for name in SERIES:
                    assert getattr(tail, name) == pytest.approx(getattr(whole, name)[at:], rel=1e-9, abs=1e-12), name
                assert (tail.collapse_step, tail.collapse_kind) == (whole.collapse_step, whole.collapse_kind)
        # a schedule cut into segments of the same config scores as the config itself
        split = [(0, 10, cfg), (10, 25, cfg), (25, 40, cfg)]
        assert L.schedule_score_noise_free(split, sc, 40) == pytest.approx(L.final_score_noise_free(cfg, sc, 40), abs=1e-9)


def test_a_segment_played_to_its_own_end_keeps_the_schedules_warmup() -> None:
    """The warm-up is a share of the whole training (verl's total steps), not of a segment's trial."""
    sc = load_scenario("qwen3-8b-1x8")
    cfg = {**random_configs("qwen3-8b-1x8", 1)[0], A + "optim.lr_warmup_steps_ratio": 0.25}
    whole = L.learning_trajectory(cfg, sc, 40, math.inf)
    seg = L.schedule_trajectory([(0, 8, cfg), (8, 40, cfg)], sc, 40, math.inf)
    assert seg[0].lr == pytest.approx(whole.lr[:8]) and seg[1].lr == pytest.approx(whole.lr[8:])
    assert seg[1].score == pytest.approx(whole.score[8:])


def test_schedules_are_validated() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    for bad, total in (([(0, 10, cfg), (12, 20, cfg)], 20), ([(0, 10, cfg)], 20), ([], 10), ([(1, 10, cfg)], 10)):
        with pytest.raises(ValueError):
            L.schedule_score_noise_free(bad, sc, total)


# ------------------------------------------------------------------------------------------ (c)
def _one_step_bound(cfg: dict, sc, state: dict) -> float:
    """The most a single learning step under ``cfg`` can add to the score from ``state``."""
    kt = L.knob_terms(L.LearningKnobs.from_config(cfg, sc), sc)
    dp = L._speed(kt.x) * kt.data_rate
    p = state["progress"]
    return sc.learning.headroom * kt.quality * (math.exp(-p / sc.learning.tau_steps) - math.exp(-(p + dp) / sc.learning.tau_steps))


@pytest.mark.parametrize("scenario", ["qwen3-8b-1x8", "qwen3-0.6b-2x8"])
def test_a_switch_cannot_rewrite_the_past(scenario: str) -> None:
    """At a branch point the score moves by at most one step's learning plus the instantaneous
    truncation change: no knob re-prices the progress already made (before path-consistency, lowering
    the lr erased the high-lr past's overshoot penalty, changing the temperature re-scaled all the gain)."""
    sc = load_scenario(scenario)
    cfgs = random_configs(scenario, 24, seed=11)
    rng = random.Random(5)
    lp = sc.learning
    for _ in range(60):
        a, b = rng.sample(cfgs, 2)
        at = rng.choice((5, 15, 30))
        head = L.learning_trajectory(a, sc, at, math.inf)
        st = head.state_at(at)
        if st["exhausted_steps"]:
            continue
        tail = L.learning_trajectory(b, sc, at + 1, math.inf, start=st)
        clip_a = L.clip_ratio(head.resp_mean_untruncated[-1], sc.resp_cv, L.LearningKnobs.from_config(a, sc).max_response_length)
        clip_b = L.clip_ratio(tail.resp_mean_untruncated[-1], sc.resp_cv, L.LearningKnobs.from_config(b, sc).max_response_length)
        jump = tail.score[0] - head.score[-1]
        bound = _one_step_bound(b, sc, st) + 0.6 * lp.headroom * (clip_a - clip_b) + 0.02 * lp.headroom + 1e-12
        assert jump <= bound, (a, b, at, jump, bound)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_mixing_a_config_with_a_worse_copy_never_beats_the_config(scenario: str) -> None:
    """A copy that only learns worse per step (higher weight decay: lower quality, same step size,
    entropy and hazard) mixed in any order into a schedule scores between the two static configs."""
    sc = load_scenario(scenario)
    rng = random.Random(2)
    for cfg in random_configs(scenario, 8, seed=3):
        worse = {**cfg, A + "optim.weight_decay": 0.2}
        if L.knob_terms(L.LearningKnobs.from_config(worse, sc), sc).quality >= L.knob_terms(
                L.LearningKnobs.from_config(cfg, sc), sc).quality:
            continue
        hi, lo = L.final_score_noise_free(cfg, sc, 40), L.final_score_noise_free(worse, sc, 40)
        for _ in range(5):
            cuts = sorted(rng.sample(range(1, 40), 3))
            bounds = [0, *cuts, 40]
            segs = [(bounds[i], bounds[i + 1], rng.choice((cfg, worse))) for i in range(4)]
            s = L.schedule_score_noise_free(segs, sc, 40)
            assert lo - 1e-12 <= s <= hi + 1e-12


def test_lowering_the_lr_late_keeps_the_overshoot_of_the_high_lr_past() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    hot = {**cfg, A + "optim.lr": 8e-6}  # x > 1: the overshoot penalty applies
    past = L.learning_trajectory(hot, sc, 30, math.inf)
    calm = L.learning_trajectory(cfg, sc, 31, math.inf, start=past.state_at(30))
    kt = L.knob_terms(L.LearningKnobs.from_config(hot, sc), sc)
    assert kt.penalty > 0.05
    erased = sc.learning.score0 + sc.learning.headroom * past.state_at(30)["gain_acc"] / (1 - kt.penalty)
    assert calm.score[0] < erased - 0.5 * sc.learning.headroom * kt.penalty * past.state_at(30)["gain_acc"]


# ------------------------------------------------------------------------------------------ what a schedule may exploit
def _fallen(sc, cfg, steps: int = 40):
    return L.learning_trajectory(cfg, sc, steps, math.inf)


def test_clip_higher_switched_on_after_the_fall_restores_entropy_slowly() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    past = _fallen(sc, cfg)
    wide = {**cfg, A + "clip_ratio_high": 0.28}
    on = L.learning_trajectory(wide, sc, 80, math.inf, start=past.state_at(40))
    off = L.learning_trajectory(cfg, sc, 80, math.inf, start=past.state_at(40))
    static = L.learning_trajectory(wide, sc, 80, math.inf)
    assert on.entropy[-1] > 1.3 * off.entropy[-1]  # some exploration back
    assert on.entropy[-1] < static.entropy[-1]  # not all of it: below a run that held it from the start
    assert on.entropy[0] == pytest.approx(past.entropy[-1], rel=0.05)  # no jump at the switch


def test_temperature_raised_after_the_fall_restores_sampling_entropy_at_once() -> None:
    sc = load_scenario("qwen3-0.6b-1x8")
    cfg = random_configs("qwen3-0.6b-1x8", 1)[0]
    past = _fallen(sc, cfg)
    hot = L.learning_trajectory({**cfg, R + "temperature": 1.2}, sc, 41, math.inf, start=past.state_at(40))
    same = L.learning_trajectory(cfg, sc, 41, math.inf, start=past.state_at(40))
    assert hot.entropy[0] == pytest.approx(1.2 * same.entropy[0], rel=1e-9)
    # exploration (measured against the run's start) grows, so does the step's progress
    assert hot.states[0]["progress"] - past.state_at(40)["progress"] > same.states[0]["progress"] - past.state_at(40)["progress"]


def test_an_entropy_bonus_switched_on_late_raises_entropy() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    past = _fallen(sc, cfg)
    bonus = L.learning_trajectory({**cfg, A + "entropy_coeff": 0.005}, sc, 70, math.inf, start=past.state_at(40))
    assert bonus.entropy[-1] > 1.3 * past.entropy[-1]


def test_raising_the_response_limit_when_clipping_grows_pays_at_once() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    past = _fallen(sc, cfg, 60)
    clip = [L.clip_ratio(m, sc.resp_cv, sc.max_response_length) for m in past.resp_mean_untruncated]
    assert clip[-1] > 1.5 * clip[0]  # responses lengthen, more are truncated
    longer = L.learning_trajectory({**cfg, "data.max_response_length": 2 * sc.max_response_length}, sc, 61, math.inf,
                                   start=past.state_at(60))
    stay = L.learning_trajectory(cfg, sc, 61, math.inf, start=past.state_at(60))
    assert longer.score[0] > stay.score[0] + 0.3 * sc.learning.headroom * 0.6 * clip[-1]
    assert longer.resp_mean_untruncated[0] == pytest.approx(stay.resp_mean_untruncated[0])  # same policy, less cut


def test_collapse_hazard_and_exhaustion_carry_over_a_branch() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    hot = {**cfg, A + "optim.lr": 1.2e-5}
    hot_past, calm_past = L.learning_trajectory(hot, sc, 20, math.inf), L.learning_trajectory(cfg, sc, 20, math.inf)
    assert hot_past.state_at(20)["cum_hazard"] > 100 * calm_past.state_at(20)["cum_hazard"]
    # the same high lr from step 20 on: after a hot past it meets a threshold already partly used
    draw = 1.5 * hot_past.state_at(20)["cum_hazard"]
    after_hot = L.learning_trajectory(hot, sc, 60, draw, start=hot_past.state_at(20))
    after_calm = L.learning_trajectory(hot, sc, 60, draw, start=calm_past.state_at(20))
    assert after_hot.collapse_step is not None and after_calm.collapse_step is not None
    assert after_hot.collapse_step < after_calm.collapse_step
    # a calmer branch keeps the hazard accumulated so far (it never decreases)
    calm = L.learning_trajectory(cfg, sc, 30, math.inf, start=hot_past.state_at(20))
    assert calm.states[0]["cum_hazard"] >= hot_past.state_at(20)["cum_hazard"]
    # an exhausted policy (low temperature) keeps its loss when the entropy is restored, and stops losing
    cold = {**cfg, R + "temperature": 0.4, A + "optim.lr": 4e-6}
    ex = L.learning_trajectory(cold, sc, 40, math.inf)
    st = ex.state_at(40)
    assert st["exhausted_steps"] > 3
    back = L.learning_trajectory({**cfg, R + "temperature": 1.2, A + "entropy_coeff": 0.006}, sc, 70, math.inf, start=st)
    assert back.states[-1]["exhausted_steps"] < st["exhausted_steps"] + 30
    assert min(back.score) <= ex.score[-1] + sc.learning.headroom * 0.2


def test_a_checkpoint_from_before_path_consistency_still_branches(pre_issue24) -> None:
    sc = load_scenario("qwen3-0.6b-1x8")
    cfg = random_configs("qwen3-0.6b-1x8", 1)[0]
    old = V1.learning_trajectory(cfg, sc, 30, 1.0)
    tail = L.learning_trajectory(cfg, sc, 30, 1.0, start=old.states[11])
    assert tail.score == pytest.approx(old.score[12:], rel=1e-9) and tail.entropy == pytest.approx(old.entropy[12:], rel=1e-9)


# ------------------------------------------------------------------------------------------ issue 24: non-stationary
def _gain_per_progress(traj, a: int, b: int) -> float:
    """Quality-weighted learning per unit of progress between steps a and b (1-based, inclusive of b)."""
    sa, sb = traj.states[a - 1], traj.states[b - 1]
    return (sb["gain_acc"] - sa["gain_acc"]) / max(sb["progress"] - sa["progress"], 1e-12)


def test_a_fixed_temperature_is_right_early_and_too_cold_once_entropy_has_fallen() -> None:
    """POLARIS: the temperature worth training at rises as the policy sharpens. Static configs see it too: per
    unit of progress (the same learning clock), 1.0 learns better than 1.1 before entropy falls, worse after."""
    sc = load_scenario("qwen3-8b-1x8")
    cfg = random_configs("qwen3-8b-1x8", 1)[0]
    t10 = L.learning_trajectory(cfg, sc, 80, math.inf)
    t11 = L.learning_trajectory({**cfg, R + "temperature": 1.1}, sc, 80, math.inf)
    assert _gain_per_progress(t10, 1, 2) > _gain_per_progress(t11, 1, 2)
    assert t10.entropy[59] < 0.4 * t10.entropy[0]  # the fall has happened by step 60
    assert _gain_per_progress(t10, 60, 80) < _gain_per_progress(t11, 60, 80)
    # a branch that raises the temperature late learns like the hotter policy would at that state
    hot = L.learning_trajectory({**cfg, R + "temperature": 1.1}, sc, 80, math.inf, start=t10.state_at(60))
    assert _gain_per_progress(hot, 1, 20) > _gain_per_progress(t10, 61, 80)


def test_the_collapse_hazard_grows_with_the_response_length() -> None:
    """arXiv 2602.01826: the same lr grows riskier as responses lengthen; the hazard of a step follows the mean
    response length relative to the start (no warm-up, no entropy runaway: the step size is constant)."""
    sc = load_scenario("qwen3-0.6b-1x8")
    cfg = {**random_configs("qwen3-0.6b-1x8", 1)[0], A + "optim.lr": 4e-6}
    traj = L.learning_trajectory(cfg, sc, 150, math.inf)
    grown = [m / sc.learning.resp_len0 for m in traj.resp_mean_untruncated]
    assert grown[-1] > 1.8
    for t in (10, 60, 149):
        assert traj.hazard[t] / traj.hazard[0] == pytest.approx(grown[t], rel=1e-9)
    # a calmer segment late stops the growth of the accumulated hazard (it never undoes it)
    calm = L.learning_trajectory({**cfg, A + "optim.lr": 2e-6}, sc, 151, math.inf, start=traj.state_at(150))
    assert calm.hazard[0] < traj.hazard[-1] / 50 and calm.states[0]["cum_hazard"] >= traj.states[-1]["cum_hazard"]


def test_a_schedule_that_would_run_out_of_memory_is_named_with_its_step_and_phase() -> None:
    """``model.schedule_oom`` (what the benchmark's oracle prices): the simulator's own memory model along the
    schedule's trajectory. On the 0.6B 1x8 a doubled lr lengthens responses until old_log_prob's logits pass
    the 80 GB, which the played run confirms; halving the log-prob micro batch lets it run to the end."""
    from mart.trial_runner.sim import model

    sc = load_scenario("qwen3-0.6b-1x8")
    base = model.base_config(sc)
    fast = {**base, A + "optim.lr": 2e-6}
    assert model.schedule_oom([(0, 60, base)], sc, 60) is None
    why = model.schedule_oom([(0, 15, base), (15, 60, fast)], sc, 60)
    assert why is not None and "old_log_prob" in why
    played = [model.simulate(fast, sc, 60, seed=s) for s in range(3)]
    assert all(r.status == "oom" and "old_log_prob" in (r.reason or "") for r in played)
    safe = {**fast, R + "log_prob_micro_batch_size_per_gpu": 16}
    assert model.schedule_oom([(0, 15, base), (15, 60, safe)], sc, 60) is None
    assert all(model.simulate(safe, sc, 60, seed=s).status == "completed" for s in range(3))
    # the micro batch changes no learning: the same expected score
    assert L.schedule_score_noise_free([(0, 60, safe)], sc, 60) == L.schedule_score_noise_free([(0, 60, fast)], sc, 60)
