"""The simulator's model: verl's documented tendencies, MART's reported direction, collapse regions, OOM."""

from __future__ import annotations

import math
import random

import pytest

from mart.state.metrics import StepRecord
from mart.state.objectives import learning_score, system_outcome
from mart.trial_runner.sim import (
    SCENARIOS,
    base_config,
    expected_throughput,
    get_scenario,
    ground_truth,
    simulate,
)
from mart.trial_runner.sim.learning import final_score_noise_free, learning_trajectory
from mart.trial_runner.verl.space import SEARCH_SPACE

R = "actor_rollout_ref.rollout."
A = "actor_rollout_ref.actor."
SMALL, BIG = "qwen3-0.6b-1x8", "qwen3-8b-1x8"


def records(result) -> list[StepRecord]:
    return [StepRecord(e.step, e.data) for e in result.events]


def test_scenarios_and_unknown_name() -> None:
    assert {"qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"} <= set(SCENARIOS)
    with pytest.raises(ValueError, match="qwen3-8b-1x8"):
        get_scenario("llama-70b")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_baseline_is_verl_defaults_plus_shape(name: str) -> None:
    sc = get_scenario(name)
    cfg = base_config(name)
    for key, value in SEARCH_SPACE.defaults("system").items():
        assert cfg[key] == value
    assert cfg["trainer.nnodes"] == sc.nnodes and cfg["trainer.n_gpus_per_node"] == sc.gpus_per_node
    assert cfg["data.train_batch_size"] == sc.train_batch_size and cfg[R + "n"] == sc.rollout_n
    assert SEARCH_SPACE.check_constraints(cfg) == []
    result = simulate(cfg, name, 6, seed=0)
    assert result.status == "completed", result.reason


def test_metric_stream_speaks_verl() -> None:
    result = simulate(base_config(BIG), BIG, 6, seed=0)
    steps = [e.step for e in result.events]
    assert steps == list(range(7))
    assert any(k.startswith("val-core/") for k in result.events[0].data)  # step-0 validation
    need = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/step", "perf/total_num_tokens",
            "perf/throughput", "perf/max_memory_allocated_gb", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac",
            "actor/grad_norm", "critic/score/mean", "response_length/mean", "response_length/max",
            "response_length/clip_ratio"]
    for key in need:
        assert key in result.events[3].data, key
    d = result.events[3].data
    assert d["perf/throughput"] == pytest.approx(d["perf/total_num_tokens"] / (d["timing_s/step"] * 8))
    assert any(k.startswith("val-core/") for k in result.events[5].data)  # test_freq = 5
    assert any(k.startswith("val-core/") for k in result.events[6].data)  # and the last step
    with_kl = simulate({**base_config(BIG), A + "use_kl_loss": True}, BIG, 3, seed=0)
    assert "actor/kl_loss" in with_kl.events[2].data and "timing_s/ref" in with_kl.events[2].data
    assert [e.t for e in result.events] == sorted(e.t for e in result.events)


def test_deterministic_per_seed() -> None:
    cfg = base_config(SMALL)
    a, b, c = simulate(cfg, SMALL, 6, seed=3), simulate(cfg, SMALL, 6, seed=3), simulate(cfg, SMALL, 6, seed=4)
    assert [e.data for e in a.events] == [e.data for e in b.events]
    assert [e.data for e in a.events] != [e.data for e in c.events]


def test_measurements_are_noisy_around_the_expected_value() -> None:
    cfg = base_config(SMALL)
    expected, _ = expected_throughput(cfg, SMALL)
    measured = [system_outcome(records(simulate(cfg, SMALL, 6, seed=s)), 6, None).throughput for s in range(8)]
    assert len({round(m) for m in measured}) > 1
    assert abs(sum(measured) / len(measured) / expected - 1) < 0.03


def test_smaller_rollout_tp_and_higher_memory_share_help_the_small_model() -> None:
    cfg = base_config(SMALL)
    thr = {tp: expected_throughput({**cfg, R + "tensor_model_parallel_size": tp}, SMALL)[0] for tp in (1, 2, 4)}
    assert thr[1] > thr[2] > thr[4]
    tuned = {**cfg, **ground_truth(SMALL)["overrides"]}
    util = tuned[R + "gpu_memory_utilization"]
    assert util > cfg[R + "gpu_memory_utilization"]  # the optimum raises verl's 0.5
    lower = expected_throughput({**tuned, R + "gpu_memory_utilization": 0.5}, SMALL)[0]
    best = expected_throughput(tuned, SMALL)[0]
    assert best > lower * 1.03  # more rollout memory, more speed
    gen_mem = [simulate({**tuned, R + "gpu_memory_utilization": u}, SMALL, 3).events[2].data["sim/memory/gen_gb"]
               for u in (0.5, util)]
    assert gen_mem[1] > gen_mem[0] + 5
    assert expected_throughput({**tuned, R + "tensor_model_parallel_size": 2}, SMALL)[0] < best


def test_micro_batch_trades_memory_for_speed_until_oom() -> None:
    cfg = base_config(BIG)
    points = [expected_throughput({**cfg, A + "ppo_micro_batch_size_per_gpu": m}, BIG) for m in (2, 4, 8, 16, 32)]
    thr = [p[0] for p in points]
    peak = [p[1] for p in points]
    assert thr == sorted(thr) and thr[-1] > thr[0] * 1.1
    assert peak == sorted(peak) and peak[-1] > peak[0]
    oom = simulate({**cfg, A + "ppo_micro_batch_size_per_gpu": 64}, BIG, 6, seed=0)
    assert oom.status == "oom" and oom.last_step == 0 and "out of memory" in oom.reason
    assert [e.step for e in oom.events] == [0]  # the step-0 validation, then the OOM in step 1


def test_tuned_gain_over_defaults_is_larger_for_the_small_model() -> None:
    gains = {name: ground_truth(name)["gain_pct"] for name in ("qwen3-8b-1x8", "qwen3-0.6b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-2x8")}
    assert 5 < gains["qwen3-8b-1x8"] < 40 and 5 < gains["qwen3-8b-2x8"] < 40
    assert gains["qwen3-0.6b-1x8"] > 1.5 * gains["qwen3-8b-1x8"]
    assert gains["qwen3-0.6b-2x8"] > 1.5 * gains["qwen3-8b-2x8"]


def test_ground_truth_is_not_beaten_by_random_configs() -> None:
    gt = ground_truth(SMALL)
    cfg = base_config(SMALL)
    rng = random.Random(0)
    best_random, tried = 0.0, 0
    while tried < 40:
        over = {}
        for p in SEARCH_SPACE.stage_params("system"):
            if p.kind == "bool":
                over[p.key] = rng.random() < 0.5
            elif p.kind == "categorical":
                over[p.key] = rng.choice(p.choices)
            elif p.kind == "int":
                over[p.key] = round(math.exp(rng.uniform(math.log(p.low), math.log(p.high))))
            else:
                over[p.key] = rng.uniform(p.low, p.high)
        full = {**cfg, **over}
        if SEARCH_SPACE.check_constraints(full):
            continue
        tried += 1
        thr, peak = expected_throughput(full, SMALL)
        if peak <= gt["limit_gb"]:
            best_random = max(best_random, thr)
    assert best_random < gt["throughput"] * 1.01
    thr, peak = expected_throughput({**cfg, **gt["overrides"]}, SMALL)
    assert thr == pytest.approx(gt["throughput"], rel=1e-6) and peak <= gt["limit_gb"]


def test_lr_x100_collapses() -> None:
    cfg = base_config(SMALL)
    bad = simulate({**cfg, A + "optim.lr": cfg[A + "optim.lr"] * 100}, SMALL, 20, seed=0,
                   memory_capacity_gb=1000)  # no OOM: watch the learning signals
    good = simulate(cfg, SMALL, 20, seed=0, memory_capacity_gb=1000)
    rb, rg = records(bad), records(good)
    assert learning_score(rb) < 0.6 * learning_score(rg)
    gn = [r.get("actor/grad_norm") for r in rb if r.step > 0]
    assert max(gn[-5:]) > 10 * min(gn[:1] + [r.get("actor/grad_norm") for r in rg if r.step > 0][:3])
    assert rb[-1].get("response_length/clip_ratio") > 0.3 > rg[-1].get("response_length/clip_ratio")
    assert bad.info["collapse_step"] is not None and bad.info["collapse_step"] <= 3


def test_no_kl_with_high_lr_collapses_where_a_kl_loss_holds() -> None:
    sc = get_scenario(BIG)
    cfg = {**base_config(BIG), A + "optim.lr": 6e-6}  # 6x verl's default
    no_kl = final_score_noise_free(cfg, sc, 30)
    kl = final_score_noise_free({**cfg, A + "use_kl_loss": True, A + "kl_loss_coef": 0.01}, sc, 30)
    default = final_score_noise_free(base_config(BIG), sc, 30)
    assert no_kl < default - 0.1  # collapses in most draws
    assert kl > no_kl + 0.1  # the KL loss mostly holds it


def test_low_temperature_collapses_entropy_and_costs_score() -> None:
    sc = get_scenario(SMALL)
    cfg = base_config(SMALL)
    cold = learning_trajectory({**cfg, R + "temperature": 0.4, A + "optim.lr": 4e-6}, sc, 30, math.inf)
    warm = learning_trajectory({**cfg, A + "optim.lr": 4e-6}, sc, 30, math.inf)
    assert cold.entropy[-1] < 0.15 * cold.entropy[0] and cold.collapse_kind == "entropy"
    # both drop fast early (Cui et al.: -73% in the first twelfth); only the cold one falls to exhaustion
    assert warm.entropy[-1] > 0.15 * warm.entropy[0] and warm.entropy[-1] > 2 * cold.entropy[-1]
    assert cold.score[-1] < warm.score[-1]


def test_learning_gains_have_mart_sizes() -> None:
    from mart.trial_runner.sim import ground_truth_learning

    big, small = ground_truth_learning(BIG, 30), ground_truth_learning(SMALL, 30)
    assert 0.01 < big["gain"] < 0.04  # MART: +1.98..2.51 points for Qwen3-8B
    assert 0.004 < small["gain"] < 0.015  # +0.74..0.81 for Qwen3-0.6B-Base
    assert big["gain"] > small["gain"]


def test_mid_training_oom_when_responses_grow() -> None:
    cfg = {**base_config(SMALL), A + "optim.lr": 6e-6}
    free = simulate(cfg, SMALL, 30, seed=1, memory_capacity_gb=1000)  # watch the log-prob pass's memory
    peaks = [e.data["sim/memory/old_log_prob_gb"] for e in free.events if e.step > 0]
    assert peaks[-1] > peaks[0] + 5  # responses grow, so does a static micro batch's memory
    capacity = (max(peaks[:3]) + peaks[-1]) / 2
    run = simulate(cfg, SMALL, 30, seed=1, memory_capacity_gb=capacity)
    assert run.status == "oom" and 3 <= run.last_step < 30, (run.status, run.last_step)


def test_invalid_config_fails_like_verl() -> None:
    cfg = {**base_config(BIG), A + "ppo_micro_batch_size_per_gpu": 48}  # does not divide the per-GPU mini batch
    result = simulate(cfg, BIG, 6)
    assert result.status == "failed" and "micro_divides_mini" in result.reason and not result.events


def test_kv_cache_failure_when_vllm_gets_too_little_memory() -> None:
    cfg = {**base_config(BIG), R + "gpu_memory_utilization": 0.2, R + "tensor_model_parallel_size": 1}
    result = simulate(cfg, BIG, 6)
    assert result.status == "oom" and "KV cache" in result.reason
