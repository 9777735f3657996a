"""Each public fact the simulator must reproduce: direction and rough size (sources: docs/sim.md, "Public facts")."""

from __future__ import annotations

import math

import pytest

from mart.trial_runner.sim import base_config, load_scenario
from mart.trial_runner.sim.facts import entropy_curve, measure_facts, step_phases
from mart.trial_runner.sim.learning import final_score_noise_free, learning_trajectory

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
FACTS = {f.name: f for f in measure_facts()}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_public_fact_within_band(name: str) -> None:
    fact = FACTS[name]
    assert fact.ok, f"{name}: sim {fact.value:.4g} outside [{fact.low:.4g}, {fact.high:.4g}] (public: {fact.public})"


def test_memory_share_helps_when_kv_bound_and_not_otherwise() -> None:
    sc = load_scenario("qwen3-0.6b-1x8")
    cfg = {**base_config(sc), R + "max_num_seqs": 1024}
    low, high = step_phases(cfg, sc), step_phases({**cfg, R + "gpu_memory_utilization": 0.8}, sc)
    assert high["throughput"] > 1.03 * low["throughput"]
    # the 256-sequence cap leaves the pool unused: a bigger pool buys nothing (what vLLM would do)
    cfg256 = base_config(sc)
    a, b = step_phases(cfg256, sc), step_phases({**cfg256, R + "gpu_memory_utilization": 0.8}, sc)
    assert abs(b["throughput"] / a["throughput"] - 1) < 0.02


def test_cuda_graphs_matter_more_for_the_small_model() -> None:
    big, small = load_scenario("qwen3-8b-1x8"), load_scenario("qwen3-0.6b-1x8")

    def eager_cost(sc) -> float:
        cfg = base_config(sc)
        return step_phases({**cfg, R + "enforce_eager": True}, sc)["t_gen"] / step_phases(cfg, sc)["t_gen"] - 1

    assert eager_cost(small) > eager_cost(big) > 0.15


def test_qwen2_7b_h20_log_is_update_dominated() -> None:
    sc = load_scenario("qwen2-7b-gsm8k-h20")
    p = step_phases(base_config(sc), sc)
    assert p["t_update"] > p["t_gen"] and p["t_update"] > p["t_old"]
    assert 0.6 < p["mfu"] < 0.9  # verl reports 0.76-0.79


def test_no_checkpointing_costs_far_more_memory_than_checkpointing() -> None:
    sc = load_scenario("qwen2-7b-gsm8k-h20")
    cfg = base_config(sc)
    off = step_phases(cfg, sc)["mem_update"]
    on = step_phases({**cfg, "actor_rollout_ref.model.enable_gradient_checkpointing": True}, sc)["mem_update"]
    assert off > 2.5 * on


def test_long_tail_step_is_near_hardware_independent_and_rollout_bound() -> None:
    h200, a100 = load_scenario("r1-distill-1.5b-8k-h200"), load_scenario("r1-distill-1.5b-8k-a100")
    ph, pa = step_phases(base_config(h200), h200), step_phases(base_config(a100), a100)
    assert ph["t_gen"] > 0.6 * ph["t_step"]  # rllm #6: at >= 8k most of the time is sampling
    assert ph["t_step"] / pa["t_step"] > 0.75


def test_entropy_two_phases_and_bounded_exhaustion() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = base_config(sc)
    ent = entropy_curve(cfg, sc, 240)
    drop_early = 1 - ent[19] / ent[0]
    drop_late = 1 - ent[-1] / ent[19]
    assert drop_early > 0.55 and drop_late < drop_early  # fast early, slow later
    traj = learning_trajectory({**cfg, A + "optim.lr": 3e-6}, sc, 300, collapse_draw=math.inf)
    assert min(traj.score) >= 0 and min(traj.score) > sc.learning.score0 - sc.learning.headroom


def test_kl_and_clip_higher_hold_entropy_up() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = base_config(sc)
    plain = entropy_curve(cfg, sc, 120)[-1]
    kl = entropy_curve({**cfg, A + "use_kl_loss": True, A + "kl_loss_coef": 0.01}, sc, 120)[-1]
    ch = entropy_curve({**cfg, A + "clip_ratio_high": 0.28}, sc, 120)[-1]
    assert kl > 1.1 * plain and ch > 1.5 * plain


def test_large_entropy_bonus_explodes_boundedly_and_does_not_score_best() -> None:
    sc = load_scenario("qwen3-8b-1x8")
    cfg = base_config(sc)
    ent = entropy_curve({**cfg, A + "entropy_coeff": 0.01}, sc, 60)
    assert max(ent) > 1.5 * ent[0] and max(ent) < 0.5 * math.log(sc.model.vocab)
    scores = {c: final_score_noise_free({**cfg, A + "entropy_coeff": c}, sc, 30) for c in (0.0, 0.001, 0.01)}
    assert max(scores, key=scores.get) != 0.01
